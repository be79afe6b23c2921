//! Serving a router on a TCP listener with the bounds an internet-facing listener needs.
//!
//! Contract: [`serve`] accepts HTTP/1.1 connections until its token is cancelled, then drains
//! for at most the drain time and closes what is left. Nothing a client does on a connection can
//! hold server resources without a bound:
//! - **connections**: at most `max_connections` on the listener and `max_connections_per_peer`
//!   from one address; one more is answered `503 too_many_connections` (JSON, with a trace id)
//!   and closed without reading it (beyond 1,024 refusals being answered at once, closed
//!   without an answer: refusing must not hold sockets without a bound either);
//! - **the request head** must arrive within `header_read_timeout` of its first byte (of the
//!   accept, for a connection's first request), in at most `max_header_bytes` × 2 bytes and
//!   [`HARD_MAX_HEADERS`] headers (the edge middleware answers the configured caps with JSON;
//!   these are the parser's backstop, past which hyper answers a bare 431 and closes);
//! - **idle keep-alive** connections are closed after `idle_timeout` without a new request;
//! - **a stalled write** (a client that stops reading its response) ends the connection after
//!   `idle_timeout`.
//!
//! The body's own timeout and size cap are the edge middleware's (`http::edge`), which reads the
//! body before the request is admitted, so a body that trickles in is never counted as load.
//!
//! HTTP/2 is not served here: clients reach the service through a load balancer or gateway that
//! speaks HTTP/2 to them and HTTP/1.1 to the instances.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future as _;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::extract::Request;
use axum::response::Response;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceExt};

/// The parser's hard cap on the number of headers (hyper's default, parsed on the stack); the
/// configured `http.max_headers` (at most this) is enforced by the edge middleware with a JSON
/// answer.
pub const HARD_MAX_HEADERS: usize = 100;

/// The bounds of one listener's connections.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// A request head must be complete this long after its first byte (after the accept, for a
    /// connection's first request).
    pub header_read_timeout: Duration,
    /// A keep-alive connection without a new request for this long is closed; so is one whose
    /// response cannot be written for this long.
    pub idle_timeout: Duration,
    /// The configured header size cap; the parser refuses at twice this (see the module docs).
    pub max_header_bytes: usize,
    /// Connections open at once on this listener.
    pub max_connections: usize,
    /// Connections open at once from one peer address; 0 = no per-peer cap (behind a load
    /// balancer every connection comes from a few addresses).
    pub max_connections_per_peer: usize,
}

impl ConnectionLimits {
    /// The parser's buffer: twice the configured header cap, and never below hyper's minimum.
    fn parser_buffer_bytes(&self) -> usize {
        (self.max_header_bytes.saturating_mul(2)).max(8192)
    }
}

/// How often connections were accepted and refused, by reason, and the listener's accept queue
/// as the load shedder's probe last read it, for the status page and the metrics.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    open: AtomicU64,
    accepted: AtomicU64,
    refused_listener_full: AtomicU64,
    refused_peer_full: AtomicU64,
    /// Set once the probe has read the accept queue (Linux); the three below mean nothing before.
    listen_queue_read: AtomicBool,
    listen_queued: AtomicU64,
    listen_backlog: AtomicU64,
    listen_dropped: AtomicU64,
    listen_wait_micros: AtomicU64,
}

/// A copy of [`ConnectionStats`].
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ConnectionSnapshot {
    pub open: u64,
    pub accepted: u64,
    pub refused_listener_full: u64,
    pub refused_peer_full: u64,
    /// The kernel's accept queue; `None` where it cannot be read (not Linux) or no probe runs.
    pub listen_queue: Option<ListenQueueSnapshot>,
}

/// The accept queue at the probe's last reading.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ListenQueueSnapshot {
    /// Connections whose handshake completed, not yet accepted.
    pub queued: u64,
    /// The most the kernel queues before it drops new handshakes.
    pub backlog: u64,
    /// Handshakes the kernel dropped at a full queue since the probe started.
    pub dropped: u64,
    /// The time a connection waits there, estimated from the queue and the accept rate.
    pub wait_ms: f64,
}

impl ConnectionStats {
    pub fn snapshot(&self) -> ConnectionSnapshot {
        ConnectionSnapshot {
            open: self.open.load(Ordering::Relaxed),
            accepted: self.accepted.load(Ordering::Relaxed),
            refused_listener_full: self.refused_listener_full.load(Ordering::Relaxed),
            refused_peer_full: self.refused_peer_full.load(Ordering::Relaxed),
            listen_queue: self.listen_queue_read.load(Ordering::Relaxed).then(|| {
                ListenQueueSnapshot {
                    queued: self.listen_queued.load(Ordering::Relaxed),
                    backlog: self.listen_backlog.load(Ordering::Relaxed),
                    dropped: self.listen_dropped.load(Ordering::Relaxed),
                    wait_ms: self.listen_wait_micros.load(Ordering::Relaxed) as f64 / 1e3,
                }
            }),
        }
    }

    /// Connections taken off the accept queue so far: accepted, or accepted to be refused.
    pub fn dequeued(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
            + self.refused_listener_full.load(Ordering::Relaxed)
            + self.refused_peer_full.load(Ordering::Relaxed)
    }

    /// Records a reading of the accept queue, the drops counted so far and the wait estimated
    /// from them.
    pub fn record_listen_queue(&self, queued: u32, backlog: u32, dropped: u64, wait: Duration) {
        self.listen_dropped.store(dropped, Ordering::Relaxed);
        self.listen_queued
            .store(u64::from(queued), Ordering::Relaxed);
        self.listen_backlog
            .store(u64::from(backlog), Ordering::Relaxed);
        self.listen_wait_micros.store(
            u64::try_from(wait.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.listen_queue_read.store(true, Ordering::Relaxed);
    }
}

/// Binds a listener whose kernel accept queue holds `backlog` connections (tokio's and std's
/// `bind` ask for 128). Past the backlog the kernel drops new connections and their clients
/// retry a second later, so a flash crowd's connections would wait where nothing measures them.
pub fn bind(address: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = match address {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    // As tokio's `bind` does: a restarted instance can take its port back at once.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(backlog)
}

/// A service a listener serves, told each request's peer address.
///
/// The default passes it on as axum's `ConnectInfo` request extension, where extractors find it;
/// a service that reads the peer itself (the public edge's hot path) takes it as an argument and
/// saves the extension map every request would otherwise allocate.
pub trait PeerService: Service<Request, Response = Response, Error = Infallible> {
    /// Calls the service with `request`, received from `peer`. Called only once the service is
    /// ready, as [`Service::call`] is.
    fn call_from(&mut self, peer: SocketAddr, mut request: Request) -> Self::Future {
        request.extensions_mut().insert(ConnectInfo(peer));
        self.call(request)
    }
}

impl PeerService for axum::Router {}

/// Serves `router` on `listener` until `shutdown` is cancelled; then stops accepting, asks every
/// connection to finish its current request, waits at most `drain`, and closes the rest.
pub async fn serve<S>(
    listener: TcpListener,
    router: S,
    limits: ConnectionLimits,
    stats: Arc<ConnectionStats>,
    shutdown: CancellationToken,
    drain: Duration,
) where
    S: PeerService + Clone + Send + 'static,
    S::Future: Send,
{
    let limits = Arc::new(limits);
    let peers = Arc::new(PeerCounts::default());
    // Refusals answered at once; a flood beyond this many is closed without an answer, so
    // refusing cannot itself hold an unbounded number of sockets.
    let refusing = Arc::new(AtomicU64::new(0));
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors or a connection reset before accept: back off a
                // little instead of spinning on the error.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let open = stats.open.load(Ordering::Relaxed);
        if open >= limits.max_connections as u64 {
            stats.refused_listener_full.fetch_add(1, Ordering::Relaxed);
            refuse_bounded(
                &mut connections,
                &refusing,
                stream,
                "this listener holds its maximum of connections",
            );
            continue;
        }
        let Some(peer_slot) = peers.try_take(peer.ip(), limits.max_connections_per_peer) else {
            stats.refused_peer_full.fetch_add(1, Ordering::Relaxed);
            refuse_bounded(
                &mut connections,
                &refusing,
                stream,
                "this address holds its maximum of connections",
            );
            continue;
        };
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        let open_slot = OpenSlot::take(Arc::clone(&stats));
        connections.spawn(serve_connection(
            stream,
            peer,
            router.clone(),
            Arc::clone(&limits),
            shutdown.clone(),
            (open_slot, peer_slot),
        ));
    }
    drop(listener);
    let drained = tokio::time::timeout(drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            remaining = connections.len(),
            "drain time over; closing the remaining connections"
        );
        connections.shutdown().await;
    }
}

async fn serve_connection<S>(
    stream: TcpStream,
    peer: SocketAddr,
    router: S,
    limits: Arc<ConnectionLimits>,
    shutdown: CancellationToken,
    _slots: (OpenSlot, PeerSlot),
) where
    S: PeerService + Clone + Send + 'static,
    S::Future: Send,
{
    // Small answers: do not wait for the peer's ACK before sending the next segment.
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "cannot set TCP_NODELAY");
    }
    let activity = Arc::new(Activity::default());
    let io = TokioIo::new(BoundedIo::new(stream, &limits, Arc::clone(&activity)));
    let service = {
        let activity = Arc::clone(&activity);
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            activity.request_started();
            let mut router = router.clone();
            let activity = Arc::clone(&activity);
            async move {
                let response = match router.ready().await {
                    Ok(router) => router.call_from(peer, request.map(axum::body::Body::new)),
                    Err(never) => match never {},
                }
                .await
                .unwrap_or_else(|never: Infallible| match never {});
                activity.response_ready();
                Ok::<_, Infallible>(response)
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // Ours are the header and idle timeouts (see `BoundedIo`); hyper's own one would start
        // when the connection goes idle and close keep-alive connections at the header timeout.
        .header_read_timeout(None)
        .max_buf_size(limits.parser_buffer_bytes())
        .keep_alive(true);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => log_connection_end(result),
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            log_connection_end(connection.await);
        }
    }
}

fn log_connection_end(result: Result<(), hyper::Error>) {
    if let Err(error) = result {
        // Timeouts, resets and malformed requests: the client's doing, not ours.
        tracing::debug!(%error, "connection ended with an error");
    }
}

/// Refusals being answered at once at most; past them a refused connection is just closed.
const MAX_REFUSALS_IN_FLIGHT: u64 = 1024;

/// Answers a refused connection in a task of its own, unless [`MAX_REFUSALS_IN_FLIGHT`] are
/// being answered already: then it is dropped (closed) here.
fn refuse_bounded(
    connections: &mut JoinSet<()>,
    refusing: &Arc<AtomicU64>,
    stream: TcpStream,
    message: &'static str,
) {
    if refusing.fetch_add(1, Ordering::Relaxed) >= MAX_REFUSALS_IN_FLIGHT {
        refusing.fetch_sub(1, Ordering::Relaxed);
        return;
    }
    let refusing = Arc::clone(refusing);
    connections.spawn(async move {
        refuse(stream, message).await;
        refusing.fetch_sub(1, Ordering::Relaxed);
    });
}

/// Answers a connection over a cap with a 503 and closes it, bounded in time.
async fn refuse(mut stream: TcpStream, message: &'static str) {
    let trace_id = rebate_telemetry::TraceId::generate();
    let body = serde_json::json!({
        "error": {"code": rebate_domain::ErrorCode::TooManyConnections, "message": message},
        "trace_id": trace_id,
    })
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nx-trace-id: {trace_id}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}

/// One open connection, counted in [`ConnectionStats::open`] until dropped.
#[derive(Debug)]
struct OpenSlot(Arc<ConnectionStats>);

impl OpenSlot {
    fn take(stats: Arc<ConnectionStats>) -> Self {
        stats.open.fetch_add(1, Ordering::Relaxed);
        Self(stats)
    }
}

impl Drop for OpenSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Open connections per peer address. Bounded by the listener's cap: an entry exists only while
/// one of its connections is open.
#[derive(Debug, Default)]
struct PeerCounts {
    counts: Mutex<HashMap<IpAddr, usize>>,
}

impl PeerCounts {
    /// A slot for one more connection from `peer`, or `None` when it holds `max` already
    /// (`max` 0 = no cap, nothing counted).
    fn try_take(self: &Arc<Self>, peer: IpAddr, max: usize) -> Option<PeerSlot> {
        if max == 0 {
            return Some(PeerSlot { peers: None, peer });
        }
        let mut counts = self
            .counts
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let count = counts.entry(peer).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            peers: Some(Arc::clone(self)),
            peer,
        })
    }
}

#[derive(Debug)]
struct PeerSlot {
    peers: Option<Arc<PeerCounts>>,
    peer: IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let Some(peers) = &self.peers else { return };
        let mut counts = peers
            .counts
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if let Some(count) = counts.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.peer);
            }
        }
    }
}

/// Whether the connection is between requests: the service counts heads it was handed and
/// responses it produced; when the two are equal, the connection waits for a new request.
#[derive(Debug, Default)]
struct Activity {
    started: AtomicU64,
    answered: AtomicU64,
}

impl Activity {
    fn request_started(&self) {
        self.started.fetch_add(1, Ordering::Relaxed);
    }

    fn response_ready(&self) {
        self.answered.fetch_add(1, Ordering::Relaxed);
    }

    fn between_requests(&self) -> bool {
        self.started.load(Ordering::Relaxed) == self.answered.load(Ordering::Relaxed)
    }
}

/// What the read timer of a [`BoundedIo`] is counting down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadWait {
    /// A request is being served; reads (its body, a pipelined head) are not timed here.
    Serving,
    /// Between requests, no byte of the next one yet: the idle timeout runs.
    Idle,
    /// Part of a request head has arrived (or the connection is new): the header timeout runs.
    Head,
}

/// A TCP stream whose reads and writes end in `TimedOut` when the client stalls: the header
/// timeout from the first byte of a head (from the accept for the first request), the idle
/// timeout between requests and for a write that cannot progress.
struct BoundedIo {
    stream: TcpStream,
    activity: Arc<Activity>,
    header_timeout: Duration,
    idle_timeout: Duration,
    wait: ReadWait,
    /// When the current `wait` (idle or head) runs out.
    read_deadline: Instant,
    /// Armed at `read_deadline` or earlier, and moved only when a read must actually wait: a
    /// timer fired early is re-armed at the real deadline. Moving it on every change of `wait`
    /// took the runtime's timer wheel twice per keep-alive request for a wait that a pipelining
    /// or busy client never makes.
    read_timer: Pin<Box<Sleep>>,
    write_timer: Pin<Box<Sleep>>,
    write_stalled: bool,
}

impl BoundedIo {
    fn new(stream: TcpStream, limits: &ConnectionLimits, activity: Arc<Activity>) -> Self {
        let now = Instant::now();
        Self {
            stream,
            activity,
            header_timeout: limits.header_read_timeout,
            idle_timeout: limits.idle_timeout,
            wait: ReadWait::Head,
            read_deadline: now + limits.header_read_timeout,
            read_timer: Box::pin(tokio::time::sleep_until(now + limits.header_read_timeout)),
            write_timer: Box::pin(tokio::time::sleep_until(now + limits.idle_timeout)),
            write_stalled: false,
        }
    }

    /// Whether `read_deadline` has passed; if not, the read timer is armed to wake `cx` by then
    /// (at the deadline itself, or earlier and re-armed when it fires).
    fn read_timed_out(&mut self, cx: &mut Context<'_>) -> bool {
        if self.read_timer.deadline() > self.read_deadline {
            self.read_timer.as_mut().reset(self.read_deadline);
        }
        for _ in 0..2 {
            if self.read_timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            if Instant::now() >= self.read_deadline {
                return true;
            }
            // Fired at an earlier deadline (of an earlier wait): on to this one.
            self.read_timer.as_mut().reset(self.read_deadline);
        }
        // A timer that fires again at once before its deadline: look again soon rather than
        // wait unwatched.
        cx.waker().wake_by_ref();
        false
    }

    /// Moves the read state on from what the service reports, setting the deadline of each wait.
    fn track_requests(&mut self) {
        let between = self.activity.between_requests();
        match (self.wait, between) {
            (ReadWait::Serving, true) => {
                self.wait = ReadWait::Idle;
                self.read_deadline = Instant::now() + self.idle_timeout;
            }
            (ReadWait::Idle | ReadWait::Head, false) => self.wait = ReadWait::Serving,
            _ => {}
        }
    }
}

fn timed_out(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what)
}

impl AsyncRead for BoundedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.track_requests();
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if this.wait == ReadWait::Idle && buf.filled().len() > before {
                    // The first byte of the next head: from now on it must arrive in time.
                    this.wait = ReadWait::Head;
                    this.read_deadline = Instant::now() + this.header_timeout;
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                if this.wait == ReadWait::Serving {
                    // Untimed while the request is served; its response's first write starts
                    // the idle wait (`start_idle_wait`).
                    return Poll::Pending;
                }
                if this.read_timed_out(cx) {
                    return Poll::Ready(Err(timed_out(match this.wait {
                        ReadWait::Head => "the request head did not arrive in time",
                        _ => "the connection was idle for too long",
                    })));
                }
                Poll::Pending
            }
        }
    }
}

impl BoundedIo {
    /// Once the service has answered, the response's first write starts the idle wait and arms
    /// the read timer for it, in this task: hyper reads again only when the socket is readable,
    /// so a connection whose read was left pending while the request was served would otherwise
    /// never time out. (Waking the task from the service instead cost every request a second
    /// poll of its connection and, through the scheduler, often a parked sibling worker's
    /// wake-up: a context switch per few requests.)
    fn start_idle_wait(&mut self, cx: &mut Context<'_>) {
        if self.wait == ReadWait::Serving && self.activity.between_requests() {
            self.track_requests();
            if self.read_timed_out(cx) {
                // Over as it began (an idle timeout of zero): the next read says so.
                cx.waker().wake_by_ref();
            }
        }
    }

    /// Runs a write, failing it once it has made no progress for the idle timeout.
    fn poll_timed<T>(
        &mut self,
        cx: &mut Context<'_>,
        write: impl FnOnce(Pin<&mut TcpStream>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        self.start_idle_wait(cx);
        match write(Pin::new(&mut self.stream), cx) {
            Poll::Ready(result) => {
                self.write_stalled = false;
                Poll::Ready(result)
            }
            Poll::Pending => {
                if !self.write_stalled {
                    self.write_stalled = true;
                    self.write_timer
                        .as_mut()
                        .reset(Instant::now() + self.idle_timeout);
                }
                ready!(self.write_timer.as_mut().poll(cx));
                Poll::Ready(Err(timed_out("the client stopped reading its response")))
            }
        }
    }
}

impl AsyncWrite for BoundedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_timed(cx, |stream, cx| stream.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_timed(cx, |stream, cx| stream.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut()
            .poll_timed(cx, |stream, cx| stream.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut()
            .poll_timed(cx, |stream, cx| stream.poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel queues up to the backlog asked for: 250 connections to a listener that
    /// accepts none all complete their handshakes (with the 128 of tokio's `bind`, the SYNs
    /// past the queue are dropped and those connects hang).
    #[tokio::test]
    async fn the_listener_queues_the_configured_backlog() {
        let listener = bind("127.0.0.1:0".parse().unwrap(), 300).unwrap();
        let address = listener.local_addr().unwrap();
        let connects: Vec<_> = (0..250)
            .map(|_| tokio::spawn(TcpStream::connect(address)))
            .collect();
        let connected = tokio::time::timeout(Duration::from_secs(10), async {
            let mut streams = Vec::new();
            for connect in connects {
                streams.push(connect.await.unwrap().unwrap());
            }
            streams
        })
        .await
        .expect("every handshake completed without an accept");
        assert_eq!(connected.len(), 250);
        drop(listener);
    }
    use tokio::io::AsyncReadExt;

    fn limits() -> ConnectionLimits {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(60),
            max_header_bytes: 8192,
            max_connections: 4,
            max_connections_per_peer: 2,
        }
    }

    async fn start(
        limits: ConnectionLimits,
    ) -> (SocketAddr, Arc<ConnectionStats>, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let router = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let stats = Arc::new(ConnectionStats::default());
        let shutdown = CancellationToken::new();
        tokio::spawn(serve(
            listener,
            router,
            limits,
            Arc::clone(&stats),
            shutdown.clone(),
            Duration::from_secs(1),
        ));
        (address, stats, shutdown)
    }

    /// Reads until the server closes the connection; the bytes it sent.
    async fn read_to_close(stream: &mut TcpStream) -> String {
        let mut bytes = Vec::new();
        let _ = stream.read_to_end(&mut bytes).await;
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// One keep-alive request on `stream`, answered 200.
    async fn keep_alive_request(stream: &mut TcpStream) {
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut response = [0u8; 512];
        let read = stream.read(&mut response).await.unwrap();
        assert!(String::from_utf8_lossy(&response[..read]).starts_with("HTTP/1.1 200"));
    }

    /// Sends part of a head on `stream`: the server closes it, unanswered, 5 s (the header
    /// timeout) later.
    async fn head_is_cut_at_the_header_timeout(stream: &mut TcpStream) {
        let started = Instant::now();
        stream.write_all(b"GET / HTTP/1.1\r\nho").await.unwrap();
        let closed = read_to_close(stream).await;
        assert!(!closed.contains("200"), "{closed}");
        let elapsed = started.elapsed();
        assert!(
            (Duration::from_secs(5)..Duration::from_secs(6)).contains(&elapsed),
            "{elapsed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_that_trickles_is_cut_at_the_header_timeout() {
        let (address, _, _shutdown) = start(limits()).await;
        let mut stream = TcpStream::connect(address).await.unwrap();
        head_is_cut_at_the_header_timeout(&mut stream).await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_keep_alive_connection_is_closed_at_the_idle_timeout_not_before() {
        let (address, stats, _shutdown) = start(limits()).await;
        let mut stream = TcpStream::connect(address).await.unwrap();
        keep_alive_request(&mut stream).await;
        let answered = Instant::now();
        // Idle past the header timeout: still open, and the next request is served.
        tokio::time::sleep(Duration::from_secs(30)).await;
        keep_alive_request(&mut stream).await;
        let answered_again = Instant::now();
        assert!(answered_again - answered >= Duration::from_secs(30));
        read_to_close(&mut stream).await;
        let idle = answered_again.elapsed();
        assert!(
            (Duration::from_secs(60)..Duration::from_secs(61)).contains(&idle),
            "{idle:?}"
        );
        tokio::task::yield_now().await;
        assert_eq!(stats.snapshot().open, 0);
    }

    /// The read timer moves only when a read waits: after a keep-alive request and an idle
    /// spell (the timer armed for the idle timeout), a trickling head still gets the header
    /// timeout from its first byte, not the later idle deadline.
    #[tokio::test(start_paused = true)]
    async fn a_head_trickling_after_an_idle_spell_is_cut_at_the_header_timeout() {
        let (address, _, _shutdown) = start(limits()).await;
        let mut stream = TcpStream::connect(address).await.unwrap();
        keep_alive_request(&mut stream).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        head_is_cut_at_the_header_timeout(&mut stream).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_connection_that_sends_nothing_gets_the_header_timeout() {
        let (address, _, _shutdown) = start(limits()).await;
        let mut stream = TcpStream::connect(address).await.unwrap();
        let started = Instant::now();
        read_to_close(&mut stream).await;
        let elapsed = started.elapsed();
        assert!(
            (Duration::from_secs(5)..Duration::from_secs(6)).contains(&elapsed),
            "{elapsed:?}"
        );
    }

    #[tokio::test]
    async fn connections_over_the_peer_and_listener_caps_are_refused_with_json() {
        let (address, stats, _shutdown) = start(limits()).await;
        let mut held = Vec::new();
        for _ in 0..2 {
            held.push(TcpStream::connect(address).await.unwrap());
        }
        let mut third = TcpStream::connect(address).await.unwrap();
        let refused = read_to_close(&mut third).await;
        assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
        assert!(
            refused.contains(r#""code":"too_many_connections""#),
            "{refused}"
        );
        assert!(refused.contains("x-trace-id: "), "{refused}");
        let snapshot = stats.snapshot();
        assert_eq!((snapshot.open, snapshot.refused_peer_full), (2, 1));

        drop(held);
        // The slots come back once the server sees the close.
        for _ in 0..100 {
            if stats.snapshot().open == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(stats.snapshot().open, 0);
        let mut again = TcpStream::connect(address).await.unwrap();
        again
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        assert!(read_to_close(&mut again).await.starts_with("HTTP/1.1 200"));
    }

    #[test]
    fn peer_counts_forget_addresses_without_connections() {
        let peers = Arc::new(PeerCounts::default());
        let address: IpAddr = "10.0.0.1".parse().unwrap();
        let first = peers.try_take(address, 2).unwrap();
        let second = peers.try_take(address, 2).unwrap();
        assert!(peers.try_take(address, 2).is_none());
        drop(first);
        let third = peers.try_take(address, 2).unwrap();
        drop((second, third));
        assert!(peers.counts.lock().unwrap().is_empty());
        assert!(peers.try_take(address, 0).is_some(), "0 = no cap");
        assert!(peers.counts.lock().unwrap().is_empty());
    }
}
