//! Serving the simulator on a socket of its own, for embedding in other processes and tests.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::http::router;
use crate::state::SimState;

/// A simulator serving on its own listener until its shutdown token is cancelled.
///
/// Dropping it does not stop the server: cancel the token, then await [`RunningSimulator::stopped`].
#[derive(Debug)]
pub struct RunningSimulator {
    /// The bound address, with the real port when port 0 was asked for.
    addr: SocketAddr,
    /// Shared with the server, so the embedder can set faults and read counters in-process.
    state: SimState,
    server: JoinHandle<io::Result<()>>,
}

impl RunningSimulator {
    /// Binds `listen` (port 0 picks a free port) and serves a fresh [`SimState`] until `shutdown`
    /// is cancelled.
    pub async fn start(listen: SocketAddr, shutdown: CancellationToken) -> io::Result<Self> {
        Self::start_with_state(listen, SimState::new(), shutdown).await
    }

    /// Like [`RunningSimulator::start`], serving a state the caller prepared (faults already set).
    ///
    /// On cancellation the server stops accepting, releases hung and delayed calls (they answer
    /// 503 `shutting_down`) and finishes once in-flight responses are written, so shutdown is
    /// prompt even with `hang_rate` at 1.
    pub async fn start_with_state(
        listen: SocketAddr,
        state: SimState,
        shutdown: CancellationToken,
    ) -> io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let app = router(state.clone());
        let released_on_shutdown = state.clone();
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    shutdown.cancelled().await;
                    released_on_shutdown.release_hung_calls();
                })
                .await
        });
        tracing::debug!(%addr, "upstream simulator started");
        Ok(Self {
            addr,
            state,
            server,
        })
    }

    /// The address actually bound.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://IP:PORT` for clients; an unspecified bind address (`0.0.0.0`, `::`) becomes the
    /// loopback address, which is where a local client can reach it.
    pub fn base_url(&self) -> String {
        let ip = match self.addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        format!("http://{}", SocketAddr::new(ip, self.addr.port()))
    }

    /// The state the server uses: set faults and read counters without HTTP.
    pub fn state(&self) -> &SimState {
        &self.state
    }

    /// Waits until the server task has finished (after the shutdown token is cancelled). A server
    /// error or panic is logged here, once.
    pub async fn stopped(self) {
        match self.server.await {
            Ok(Ok(())) => tracing::debug!(addr = %self.addr, "upstream simulator stopped"),
            Ok(Err(error)) => {
                tracing::error!(addr = %self.addr, %error, "upstream simulator failed");
            }
            Err(error) => {
                tracing::error!(addr = %self.addr, %error, "upstream simulator task panicked");
            }
        }
    }
}
