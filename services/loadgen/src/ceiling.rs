//! The ceiling: a bare axum handler that answers every request with the same bytes as a real
//! quote, on a loopback port, on its own runtime and thread (two workers, like the service's
//! runtime on this 2-core machine). Whatever the harness and loopback TCP cost, they cost it
//! here too; the service's figures are read against this one.
//!
//! Its threads are all named [`CEILING_THREAD`], so that the harness, which shares a process
//! with it, can tell the ceiling's CPU from the generator's in `/proc/self/task`.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::body::Bytes;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::any;
use tokio::sync::oneshot;

use crate::client::Target;
use crate::procfs::CpuSource;

/// The name of every thread of the ceiling (its runtime's workers and blocking threads, and
/// the thread that accepts): distinct from the generator's, so its CPU is counted as the
/// ceiling's, never as the generator's.
pub const CEILING_THREAD: &str = "loadgen-ceiling";
// Linux keeps 15 bytes of a thread's name (`comm`); a longer one would not be found again.
const _: () = assert!(CEILING_THREAD.len() <= 15);

/// A running ceiling server; stopped and joined on drop.
#[derive(Debug)]
pub struct CeilingServer {
    address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The fixed-body router (also used by tests): any method on any path; a request's body is read
/// in full first, as a server that used it would (a batch's keys).
pub fn router(body: Bytes, content_type: String) -> Router {
    let response = Arc::new((body, content_type));
    Router::new().fallback(any(move |_request_body: Bytes| {
        let response = response.clone();
        async move {
            (
                [(header::CONTENT_TYPE, response.1.clone())],
                response.0.clone(),
            )
                .into_response()
        }
    }))
}

impl CeilingServer {
    pub fn start(body: Vec<u8>, content_type: String, workers: usize) -> anyhow::Result<Self> {
        Self::start_on(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            body,
            content_type,
            workers,
        )
    }

    /// As [`CeilingServer::start`], on `address`.
    pub fn start_on(
        address: SocketAddr,
        body: Vec<u8>,
        content_type: String,
        workers: usize,
    ) -> anyhow::Result<Self> {
        let listener = std::net::TcpListener::bind(address)
            .with_context(|| format!("binding the ceiling to {address}"))?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let app = router(Bytes::from(body), content_type);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers.max(1))
            .thread_name(CEILING_THREAD)
            .enable_all()
            .build()
            .context("building the ceiling's runtime")?;
        let thread = std::thread::Builder::new()
            .name(CEILING_THREAD.to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        return;
                    };
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(async {
                            let _ = stopped.await;
                        })
                        .await;
                });
            })?;
        Ok(Self {
            address,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// The ceiling as a load's target, its CPU read from its threads.
    pub fn target(&self) -> anyhow::Result<Target> {
        Ok(Target::parse(&self.base_url())?.with_cpu_source(CpuSource::OwnThreads(CEILING_THREAD)))
    }
}

/// The body and content type of the quote at `url` (a `GET` that must answer 2xx), for a
/// ceiling that answers the same bytes.
pub async fn fetch_body(url: &str) -> anyhow::Result<(Vec<u8>, String)> {
    fetch_answer(url, None).await
}

/// The body and content type of the answer at `url` to a `GET`, or to a `POST` of the JSON
/// `post_body` (a batch); it must answer 2xx.
pub async fn fetch_answer(
    url: &str,
    post_body: Option<Vec<u8>>,
) -> anyhow::Result<(Vec<u8>, String)> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(std::time::Duration::from_secs(5))
        .build()?;
    let request = match post_body {
        Some(body) => client
            .post(url)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body),
        None => client.get(url),
    };
    let response = request
        .send()
        .await
        .with_context(|| format!("fetching {url}"))?
        .error_for_status()
        .with_context(|| format!("fetching {url}"))?;
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("application/json")
        .to_owned();
    Ok((response.bytes().await?.to_vec(), content_type))
}

impl Drop for CeilingServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Graceful shutdown waits for open keep-alive connections to go idle; the harness's
        // client pool may hold some, so do not block on the thread here.
        drop(self.thread.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_any_path_with_the_sample_bytes() {
        let server = CeilingServer::start(
            b"{\"degraded\":false}".to_vec(),
            "application/json".to_owned(),
            1,
        )
        .unwrap();
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let response = client
            .get(format!(
                "{}/api/v1/items/jd/100002/rebate",
                server.base_url()
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "application/json");
        assert_eq!(
            response.bytes().await.unwrap().as_ref(),
            b"{\"degraded\":false}"
        );
        // A batch's POST, its body read, on a connection kept alive for the next request.
        for _ in 0..2 {
            let response = client
                .post(format!("{}/api/v1/items:batch", server.base_url()))
                .body(vec![b'x'; 64 * 1024])
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            assert_eq!(
                response.bytes().await.unwrap().as_ref(),
                b"{\"degraded\":false}"
            );
        }
        // The reference answer fetched the way the ceiling's command does, with a POST.
        let (body, content_type) = fetch_answer(
            &format!("{}/api/v1/items:batch", server.base_url()),
            Some(b"{}".to_vec()),
        )
        .await
        .unwrap();
        assert_eq!(
            (body.as_slice(), content_type.as_str()),
            (&b"{\"degraded\":false}"[..], "application/json")
        );
    }
}
