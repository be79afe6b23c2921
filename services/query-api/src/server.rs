//! Serving a router on a TCP listener with the bounds an internet-facing listener needs.
//!
//! Contract: [`serve`] accepts HTTP/1.1 connections until its token is cancelled, then drains
//! for at most the drain time and closes what is left. Nothing a client does on a connection can
//! hold server resources without a bound:
//! - **connections**: at most `max_connections` on the listener and `max_connections_per_peer`
//!   from one address. At either cap the oldest *idle* keep-alive connection (of that address,
//!   at its cap) is closed to make room; with none idle, the new one is answered
//!   `503 too_many_connections` (JSON, with a trace id) and closed without reading it. Idle
//!   connections therefore cannot hold a listener shut: a connection is only refused when every
//!   slot holds one that is mid-request;
//! - **idle keep-alive** connections are closed after `idle_timeout` without a new request; once
//!   more than `idle_shrink_from` of `max_connections` are open, the timeout shrinks in a
//!   straight line to `idle_timeout_floor` at a full listener, for connections already idle too;
//! - **the request head** must arrive within `header_read_timeout` of its first byte (of the
//!   accept, for a connection's first request), in at most `max_header_bytes` × 2 bytes and
//!   [`HARD_MAX_HEADERS`] headers (the edge middleware answers the configured caps with JSON;
//!   these are the parser's backstop, past which hyper answers a bare 431 and closes);
//! - **the request body** must be complete within `body_read_timeout` of its head (the edge
//!   middleware answers 408; see below for when it cannot);
//! - **a stalled write** (a client that stops reading its response) ends the connection after
//!   `idle_timeout`;
//! - **probes** (`probe_slots` > 0, the admin listener): that many connections beyond
//!   `max_connections`, each answered for one request to a `probe_paths` path within a short
//!   head timeout, so health probes are answered whatever holds the other connections.
//!
//! # Deadlines under overload
//! Each connection's task enforces its own deadlines with its timers, and answers where an
//! answer is due (the edge's 408). A task woken by its timer, though, waits its turn in the
//! runtime's queues, and an instance far past its capacity has seconds of work queued there (in
//! issue #40 the 5 s deadlines fired at 5.7–6.1 s). The listener's *accept thread* (an OS
//! thread, outside the runtime) therefore accepts, admits or refuses at once, and every 10 ms
//! sweeps the connection table (`table`): a connection 20 ms past a deadline whose task has not
//! acted is closed by shutting its socket down (at a body deadline after the 408 the edge would
//! have answered, unless the task has begun an answer: one of the two writes, never both).
//! Deadlines start where the client's bytes did, not where the task got to them: the first
//! head's at the accept, a body's when its head became readable and a keep-alive head's when
//! its first byte did (as the runtime's I/O driver saw it, `shared_stream`). Every deadline thus
//! holds within 30 ms of its time, however busy the runtime.
//!
//! The body's own timeout and size cap are the edge middleware's (`http::edge`), which reads the
//! body before the request is admitted, so a body that trickles in is never counted as load.
//!
//! HTTP/2 is not served here: clients reach the service through a load balancer or gateway that
//! speaks HTTP/2 to them and HTTP/1.1 to the instances.
//!
//! # Layout
//! - here: [`serve`], a connection's task (`serve_connection`), `BoundedIo` (the stream's
//!   timeouts, and the connection's state in the table), and the request and answer bodies that
//!   tell it where an exchange ends;
//! - `accept`: the accept thread (admission, refusals, the sweep's clock);
//! - `table`: the connection table: admission and eviction, the idle timeout of the moment, the
//!   watchdog's sweep;
//! - `shared_stream`: the socket, shared by the connection's task and the watchdog.

mod accept;
mod shared_stream;
mod table;

use std::convert::Infallible;
use std::future::Future as _;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::extract::Request;
use axum::response::Response;
use hyper::body::Body as HttpBody;
use hyper_util::rt::{TokioIo, TokioTimer};
use rebate_resilience::{MonotonicTicker, Ticker};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::{Service, ServiceExt};

use self::accept::{
    AcceptControl, Acceptor, StopOnDrop, blocking_listener, too_many_connections_body,
};
use self::shared_stream::SharedStream;
use self::table::{ConnectionTable, Deadline, SlotGuard, SlotKind, TableLimits};

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
    /// Past this share of `max_connections` open, the idle timeout shrinks (1.0: never)…
    pub idle_shrink_from: f64,
    /// … in a straight line to this at a full listener.
    pub idle_timeout_floor: Duration,
    /// A request body must be complete this long after its head: the edge answers 408 at it,
    /// and the watchdog closes the connection shortly after if the edge's task was not run.
    pub body_read_timeout: Duration,
    /// Connections beyond `max_connections` kept for health probes (0: none).
    pub probe_slots: usize,
    /// The paths a connection on a probe slot is answered for (anything else: 503).
    pub probe_paths: &'static [&'static str],
    /// The largest request body any route of this listener takes: a chunk of a chunked body
    /// that announces more is refused at once ([`crate::chunked`]).
    pub body_limit_bytes: usize,
}

/// A connection on a probe slot must send its head within this (or the configured header
/// timeout, if shorter): a probe's head is one small packet, and a slot held longer is one the
/// next probe cannot have.
const PROBE_HEADER_TIMEOUT: Duration = Duration::from_secs(1);

impl ConnectionLimits {
    /// The parser's buffer: twice the configured header cap, and never below hyper's minimum.
    fn parser_buffer_bytes(&self) -> usize {
        (self.max_header_bytes.saturating_mul(2)).max(8192)
    }

    fn table_limits(&self) -> TableLimits {
        TableLimits {
            max_connections: self.max_connections,
            max_per_peer: self.max_connections_per_peer,
            probe_slots: self.probe_slots,
            header_timeout: self.header_read_timeout,
            probe_header_timeout: self.header_read_timeout.min(PROBE_HEADER_TIMEOUT),
            idle_timeout: self.idle_timeout,
            idle_timeout_floor: self.idle_timeout_floor,
            idle_shrink_from: self.idle_shrink_from,
            body_timeout: self.body_read_timeout,
        }
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
    /// Accepted connections whose task has begun: the rest wait in the runtime's queue.
    started: AtomicU64,
    /// Idle connections and the idle timeout of the moment, at the watchdog's last sweep.
    idle: AtomicU64,
    idle_timeout_ms: AtomicU64,
    evicted_for_new: AtomicU64,
    idle_timeout_closes: AtomicU64,
    /// Closes by the watchdog, by what was late: head, body, write, idle.
    watchdog_closes: [AtomicU64; 4],
    probe_accepted: AtomicU64,
    probe_refused: AtomicU64,
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
    /// Open connections waiting for a next request with their last answer sent (at the
    /// watchdog's last sweep, every 10 ms): the ones a new connection may replace.
    pub idle: u64,
    /// The idle timeout a connection gets now: the configured one, shrunk as the listener fills.
    pub idle_timeout_ms: u64,
    pub accepted: u64,
    pub refused_listener_full: u64,
    pub refused_peer_full: u64,
    /// Idle connections closed, by reason.
    pub idle_closes: IdleCloses,
    /// Connections the watchdog closed because their own task had not acted by the deadline
    /// (an overloaded runtime), by the deadline they missed.
    pub watchdog_closes: WatchdogCloses,
    /// Connections admitted on a probe slot, and requests refused there for not being a probe.
    pub probe_slots: ProbeSlots,
    /// The kernel's accept queue; `None` where it cannot be read (not Linux) or no probe runs.
    pub listen_queue: Option<ListenQueueSnapshot>,
}

/// Idle keep-alive connections closed, by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct IdleCloses {
    /// The oldest idle connection, closed to admit a new one at the listener's (or an address's)
    /// cap.
    pub evicted_for_new: u64,
    /// At the idle timeout (shrunk under pressure).
    pub idle_timeout: u64,
}

/// The watchdog's closes by the deadline the connection's own task missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct WatchdogCloses {
    /// The request head (from the accept, or from its first byte).
    pub head: u64,
    /// The request body (from its head).
    pub body: u64,
    /// A write that made no progress, or the close due once an answer that ends the
    /// connection (`connection: close`, a probe slot's) was out.
    pub write: u64,
    /// The idle timeout of the moment.
    pub idle: u64,
}

/// The probe slots' use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ProbeSlots {
    pub accepted: u64,
    pub refused_not_a_probe: u64,
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
        let watchdog = |deadline: usize| self.watchdog_closes[deadline].load(Ordering::Relaxed);
        ConnectionSnapshot {
            open: self.open.load(Ordering::Relaxed),
            idle: self.idle.load(Ordering::Relaxed),
            idle_timeout_ms: self.idle_timeout_ms.load(Ordering::Relaxed),
            accepted: self.accepted.load(Ordering::Relaxed),
            refused_listener_full: self.refused_listener_full.load(Ordering::Relaxed),
            refused_peer_full: self.refused_peer_full.load(Ordering::Relaxed),
            idle_closes: IdleCloses {
                evicted_for_new: self.evicted_for_new.load(Ordering::Relaxed),
                idle_timeout: self.idle_timeout_closes.load(Ordering::Relaxed),
            },
            watchdog_closes: WatchdogCloses {
                head: watchdog(Deadline::Head.index()),
                body: watchdog(Deadline::Body.index()),
                write: watchdog(Deadline::Write.index()),
                idle: watchdog(table::WATCHDOG_IDLE),
            },
            probe_slots: ProbeSlots {
                accepted: self.probe_accepted.load(Ordering::Relaxed),
                refused_not_a_probe: self.probe_refused.load(Ordering::Relaxed),
            },
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

    /// Accepted connections whose task has not begun yet, and those whose task has: the queue
    /// between the accept thread and the runtime, read beside the kernel's.
    pub fn awaiting_start(&self) -> (u64, u64) {
        let started = self.started.load(Ordering::Relaxed);
        let accepted = self.accepted.load(Ordering::Relaxed);
        (accepted.saturating_sub(started), started)
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
    let ticker: Arc<dyn Ticker> = Arc::new(MonotonicTicker::new());
    serve_with_ticker(listener, router, limits, stats, shutdown, drain, ticker).await;
}

/// [`serve`] with the table's clock injected (tests move it to make the watchdog act).
async fn serve_with_ticker<S>(
    listener: TcpListener,
    router: S,
    limits: ConnectionLimits,
    stats: Arc<ConnectionStats>,
    shutdown: CancellationToken,
    drain: Duration,
    ticker: Arc<dyn Ticker>,
) where
    S: PeerService + Clone + Send + 'static,
    S::Future: Send,
{
    let listener = match blocking_listener(listener) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, "cannot hand the listener to its accept thread; not serving");
            return;
        }
    };
    let table = Arc::new(ConnectionTable::new(
        limits.table_limits(),
        Arc::clone(&stats),
        ticker,
    ));
    let connections = TaskTracker::new();
    let force_close = CancellationToken::new();
    let control = Arc::new(AcceptControl::default());
    let (listener_closed, listener_closed_rx) = tokio::sync::oneshot::channel();
    let acceptor = Acceptor {
        table,
        limits: Arc::new(limits),
        stats,
        runtime: tokio::runtime::Handle::current(),
        connections: connections.clone(),
        shutdown: shutdown.clone(),
        force_close: force_close.clone(),
        router,
    };
    let thread_control = Arc::clone(&control);
    let spawned = std::thread::Builder::new()
        .name("rebate-accept".to_owned())
        .spawn(move || acceptor.run(listener, &thread_control, listener_closed));
    if let Err(error) = spawned {
        tracing::error!(%error, "cannot start the accept thread; not serving");
        return;
    }
    // However serve ends (or is dropped with its runtime), the thread stops with it.
    let _stop = StopOnDrop(Arc::clone(&control));
    shutdown.cancelled().await;
    control.set(AcceptControl::STOP_ACCEPTING);
    let _ = listener_closed_rx.await;
    connections.close();
    if tokio::time::timeout(drain, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            remaining = connections.len(),
            "drain time over; closing the remaining connections"
        );
        force_close.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(1), connections.wait()).await;
    }
}

/// A connection's place in the listener: its slot, its kind and the listener's stop signals.
struct Connection {
    shutdown: CancellationToken,
    /// Cancelled when the drain time is over: the connection ends where it is.
    force_close: CancellationToken,
    slot: SlotGuard,
    kind: SlotKind,
    /// When the accept thread took it, on the runtime's clock.
    accepted_at: Instant,
}

async fn serve_connection<S>(
    stream: Arc<TcpStream>,
    peer: SocketAddr,
    router: S,
    limits: Arc<ConnectionLimits>,
    connection: Connection,
) where
    S: PeerService + Clone + Send + 'static,
    S::Future: Send,
{
    let Connection {
        shutdown,
        force_close,
        slot,
        kind,
        accepted_at,
    } = connection;
    slot.started();
    let stream = SharedStream::new(stream, slot.ticker(), slot.accepted_at());
    let activity = Arc::new(Activity::new(slot, kind, limits.body_read_timeout));
    let io = TokioIo::new(BoundedIo::new(
        stream,
        &limits,
        Arc::clone(&activity),
        accepted_at,
    ));
    let chunked_requests = io.inner().chunks.requests();
    let probe_paths = limits.probe_paths;
    let service = {
        let activity = Arc::clone(&activity);
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            activity.request_started(request.headers(), !request.body().is_end_stream());
            chunked_requests.request_started(request.headers());
            let mut router = router.clone();
            let activity = Arc::clone(&activity);
            async move {
                if activity.kind == SlotKind::Probe && !probe_paths.contains(&request.uri().path())
                {
                    activity.slot.probe_refused();
                    let refusal = too_many_connections(
                        "this listener holds its maximum of connections; this one answers \
                         health probes only",
                    );
                    return Ok(Answer::wrap(refusal, activity));
                }
                let request = request.map(|body| activity.watch_body(body));
                let response = match router.ready().await {
                    Ok(router) => router.call_from(peer, request),
                    Err(never) => match never {},
                }
                .await
                .unwrap_or_else(|never: Infallible| match never {});
                activity.response_ready(&response);
                Ok::<_, Infallible>(Answer::wrap(response, activity))
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
        // A probe slot serves one request: the next probe needs it.
        .keep_alive(kind == SlotKind::Regular);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => log_connection_end(result),
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                result = connection.as_mut() => log_connection_end(result),
                () = force_close.cancelled() => {}
            }
        }
    }
}

fn log_connection_end(result: Result<(), hyper::Error>) {
    if let Err(error) = result {
        // Timeouts, resets and malformed requests: the client's doing, not ours.
        tracing::debug!(%error, "connection ended with an error");
    }
}

/// A `503 too_many_connections` answer that closes the connection.
fn too_many_connections(message: &'static str) -> Response {
    let (trace_id, body) = too_many_connections_body(message);
    let mut response = Response::new(axum::body::Body::from(body));
    *response.status_mut() = axum::http::StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    for (name, value) in [
        (axum::http::header::CONTENT_TYPE, "application/json"),
        (axum::http::header::RETRY_AFTER, "1"),
        (axum::http::header::CONNECTION, "close"),
    ] {
        headers.insert(name, axum::http::HeaderValue::from_static(value));
    }
    if let Ok(value) = axum::http::HeaderValue::from_str(&trace_id.to_string()) {
        headers.insert("x-trace-id", value);
    }
    response
}

/// A connection's requests as the service sees them, shared by the service and [`BoundedIo`]:
/// the heads handed to the service and the answers finished (hyper drops an answer's body once
/// it has written its last frame, or abandons it); when the two are equal, the connection waits
/// for a new request.
#[derive(Debug)]
struct Activity {
    started: AtomicU64,
    answered: AtomicU64,
    /// When the last bytes of the head being read became readable (ticker nanoseconds; 0: none
    /// yet): its body's time runs from there, not from when an overloaded runtime got to it.
    head_data_since: AtomicU64,
    /// The answer in progress ends the connection (it, or its request, says `connection:
    /// close`, or the connection is a probe's): once it is flushed nothing more is due.
    closing: AtomicBool,
    slot: SlotGuard,
    kind: SlotKind,
    body_timeout: Duration,
}

impl Activity {
    fn new(slot: SlotGuard, kind: SlotKind, body_timeout: Duration) -> Self {
        Self {
            started: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            head_data_since: AtomicU64::new(0),
            closing: AtomicBool::new(kind == SlotKind::Probe),
            slot,
            kind,
            body_timeout,
        }
    }

    /// A head was handed to the service: the connection is busy (a pipelined head parsed from
    /// hyper's buffer takes it out of the idle set here), and its body, if any, must arrive in
    /// time.
    fn request_started(&self, head: &axum::http::HeaderMap, has_body: bool) {
        self.slot.begin_request();
        self.started.fetch_add(1, Ordering::Relaxed);
        // Had the table claimed the connection in that very instant, its socket is closed and
        // this request goes unanswered, as one sent at the idle timeout would.
        let _ = self.slot.leave_idle();
        if says_close(head) {
            self.closing.store(true, Ordering::Relaxed);
        }
        let head_since = self.head_data_since.swap(0, Ordering::Relaxed);
        if !has_body {
            self.slot.set_deadline(None);
        } else {
            // From when the head was there to read, which an overloaded runtime reads late.
            let since = if head_since == 0 {
                self.slot.now()
            } else {
                head_since
            };
            self.slot
                .set_deadline_since(since, self.body_timeout, Deadline::Body);
        }
    }

    /// The service answered: the body was read, or never will be.
    fn response_ready(&self, response: &Response) {
        self.slot.clear_deadline(Deadline::Body);
        if says_close(response.headers()) {
            self.closing.store(true, Ordering::Relaxed);
        }
    }

    fn response_finished(&self) {
        self.answered.fetch_add(1, Ordering::Relaxed);
    }

    fn between_requests(&self) -> bool {
        self.started.load(Ordering::Relaxed) == self.answered.load(Ordering::Relaxed)
    }

    /// `body` as the router gets it; one with content clears the body deadline at its end.
    fn watch_body(self: &Arc<Self>, body: hyper::body::Incoming) -> axum::body::Body {
        if body.is_end_stream() {
            return axum::body::Body::new(body);
        }
        axum::body::Body::new(RequestBody {
            body,
            activity: Some(Arc::clone(self)),
        })
    }
}

/// Whether a head's `Connection` header asks to close the connection after this exchange.
fn says_close(head: &axum::http::HeaderMap) -> bool {
    head.get(axum::http::header::CONNECTION)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            value
                .split(',')
                .any(|option| option.trim().eq_ignore_ascii_case("close"))
        })
}

/// A request body whose end clears the connection's body deadline.
struct RequestBody {
    body: hyper::body::Incoming,
    activity: Option<Arc<Activity>>,
}

impl HttpBody for RequestBody {
    type Data = hyper::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.body).poll_frame(cx));
        if (frame.is_none() || this.body.is_end_stream())
            && let Some(activity) = this.activity.take()
        {
            activity.slot.clear_deadline(Deadline::Body);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// An answer's body that tells the connection when hyper is done with it (dropped after its last
/// frame, or abandoned): only then is the connection between requests, since a streamed
/// (compressed) answer is written over several polls.
struct Answer {
    body: axum::body::Body,
    activity: Option<Arc<Activity>>,
}

impl Answer {
    fn wrap(response: Response, activity: Arc<Activity>) -> hyper::Response<Self> {
        response.map(|body| Self {
            body,
            activity: Some(activity),
        })
    }
}

impl HttpBody for Answer {
    type Data = hyper::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(activity) = self.activity.take() {
            activity.response_finished();
        }
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
/// timeout between requests and for a write that cannot progress. It keeps the connection's
/// slot in the table up to date: its deadlines for the watchdog, and whether it is idle (its
/// answer flushed and no byte of a next request read), which makes it evictable.
struct BoundedIo {
    stream: SharedStream,
    activity: Arc<Activity>,
    header_timeout: Duration,
    /// The configured idle timeout: the bound of a stalled write. A connection going idle gets
    /// the table's idle timeout of the moment (shrunk under pressure).
    idle_timeout: Duration,
    /// Bytes were written since the last flush: the answer is not out yet.
    unflushed: bool,
    /// The request (by its number) whose answer this task has claimed the writing of.
    answering: u64,
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
    /// The chunk-size check over every byte read ([`crate::chunked`]).
    chunks: crate::chunked::ChunkGuard,
}

impl BoundedIo {
    fn new(
        stream: SharedStream,
        limits: &ConnectionLimits,
        activity: Arc<Activity>,
        accepted_at: Instant,
    ) -> Self {
        let header_timeout = match activity.kind {
            SlotKind::Regular => limits.header_read_timeout,
            SlotKind::Probe => limits.header_read_timeout.min(PROBE_HEADER_TIMEOUT),
        };
        let head_deadline = accepted_at + header_timeout;
        Self {
            stream,
            activity,
            header_timeout,
            idle_timeout: limits.idle_timeout,
            unflushed: false,
            answering: 0,
            wait: ReadWait::Head,
            read_deadline: head_deadline,
            read_timer: Box::pin(tokio::time::sleep_until(head_deadline)),
            write_timer: Box::pin(tokio::time::sleep_until(
                Instant::now() + limits.idle_timeout,
            )),
            write_stalled: false,
            chunks: crate::chunked::ChunkGuard::new(limits.body_limit_bytes),
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
                self.read_deadline = Instant::now() + self.activity.slot.idle_timeout_now();
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
        // A request that announced a chunk over the body limit fails its body now, rather than
        // wait for a chunk that may never come ([`crate::chunked`]).
        this.chunks.check()?;
        this.track_requests();
        if this.wait == ReadWait::Idle && this.activity.slot.is_closed() {
            // Closed by the table (to make room, or at the idle timeout): end of stream.
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if result.is_ok() {
                    this.chunks.inspect(&buf.filled()[before..])?;
                }
                if this.wait == ReadWait::Idle && buf.filled().len() > before {
                    if !this.activity.slot.leave_idle() {
                        // The table closed it to make room just before this byte came.
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::ConnectionAborted,
                            "the idle connection was closed to make room",
                        )));
                    }
                    // The first byte of the next head: from when it was there to read, the rest
                    // must arrive in time.
                    this.wait = ReadWait::Head;
                    let since = this.stream.data_since();
                    let waited =
                        Duration::from_nanos(this.activity.slot.now().saturating_sub(since));
                    this.read_deadline =
                        Instant::now() + this.header_timeout.saturating_sub(waited);
                    this.activity.slot.set_deadline_since(
                        since,
                        this.header_timeout,
                        Deadline::Head,
                    );
                }
                if this.wait == ReadWait::Head && buf.filled().len() > before {
                    this.activity
                        .head_data_since
                        .store(this.stream.data_since(), Ordering::Relaxed);
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
                    if this.wait == ReadWait::Idle {
                        this.activity.slot.claim_idle_timeout();
                    }
                    return Poll::Ready(Err(timed_out(match this.wait {
                        ReadWait::Head => "the request head did not arrive in time",
                        _ => "the connection was idle for too long",
                    })));
                }
                this.publish_if_idle();
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

    /// Claims the writing of the current request's answer: an error when the watchdog has
    /// answered it already (a 408 at its body deadline), so the two never interleave.
    fn claim_answer(&mut self) -> io::Result<()> {
        let request = self.activity.started.load(Ordering::Relaxed);
        if self.answering != request {
            if !self.activity.slot.claim_answer() {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the watchdog answered this request at its body deadline",
                ));
            }
            self.answering = request;
        }
        Ok(())
    }

    /// Tells the table the connection is idle once it is: between requests, its answer
    /// flushed out of hyper and into the socket, and waiting to read.
    fn publish_if_idle(&self) {
        if self.wait == ReadWait::Idle
            && !self.unflushed
            && !self.write_stalled
            && self.activity.between_requests()
            && !self.activity.closing.load(Ordering::Relaxed)
        {
            self.activity.slot.publish_idle();
        }
    }

    /// Runs a write, failing it once it has made no progress for the idle timeout.
    fn poll_timed<T>(
        &mut self,
        cx: &mut Context<'_>,
        write: impl FnOnce(Pin<&mut SharedStream>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        self.start_idle_wait(cx);
        match write(Pin::new(&mut self.stream), cx) {
            Poll::Ready(result) => {
                if self.write_stalled {
                    self.write_stalled = false;
                    self.activity.slot.clear_deadline(Deadline::Write);
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                if !self.write_stalled {
                    self.write_stalled = true;
                    self.write_timer
                        .as_mut()
                        .reset(Instant::now() + self.idle_timeout);
                    self.activity
                        .slot
                        .set_deadline(Some((self.idle_timeout, Deadline::Write)));
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
        let this = self.get_mut();
        this.claim_answer()?;
        this.unflushed = true;
        this.poll_timed(cx, |stream, cx| stream.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.claim_answer()?;
        this.unflushed = true;
        this.poll_timed(cx, |stream, cx| stream.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // hyper flushes once its buffer is written out: the answer so far is in the socket.
        let flushed = ready!(this.poll_timed(cx, |stream, cx| stream.poll_flush(cx)));
        if flushed.is_ok() {
            this.unflushed = false;
            if this.wait == ReadWait::Idle
                && this.activity.between_requests()
                && this.activity.closing.load(Ordering::Relaxed)
            {
                // The last answer is out: hyper closes the connection now, or the watchdog
                // does if this task is not run in time.
                this.activity
                    .slot
                    .set_deadline(Some((Duration::ZERO, Deadline::Write)));
            } else {
                this.publish_if_idle();
            }
        }
        Poll::Ready(flushed)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut()
            .poll_timed(cx, |stream, cx| stream.poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};

    use rebate_resilience::ManualTicker;
    use tokio::io::AsyncWriteExt as _;

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
            body_limit_bytes: 65_536,
            idle_shrink_from: 0.5,
            idle_timeout_floor: Duration::from_secs(2),
            body_read_timeout: Duration::from_secs(5),
            probe_slots: 0,
            probe_paths: &[],
        }
    }

    async fn start(
        limits: ConnectionLimits,
    ) -> (SocketAddr, Arc<ConnectionStats>, CancellationToken) {
        let server = start_with(limits, Arc::new(MonotonicTicker::new())).await;
        (server.address, server.stats, server.shutdown)
    }

    struct TestServer {
        address: SocketAddr,
        stats: Arc<ConnectionStats>,
        shutdown: CancellationToken,
        /// Answers the waiting `/slow` request.
        release: Arc<tokio::sync::Notify>,
        /// Notified when `/upload` begins to read its body.
        body_wanted: Arc<tokio::sync::Notify>,
    }

    /// A server whose table runs on `ticker`: `/` and `/readyz` answer at once, `/slow` once
    /// `release` is notified, `/upload` (a POST) reads its body without a timeout of its own.
    async fn start_with(limits: ConnectionLimits, ticker: Arc<dyn Ticker>) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let release = Arc::new(tokio::sync::Notify::new());
        let body_wanted = Arc::new(tokio::sync::Notify::new());
        let slow = {
            let release = Arc::clone(&release);
            move || async move {
                release.notified().await;
                "slow"
            }
        };
        let upload = {
            let body_wanted = Arc::clone(&body_wanted);
            move |request: Request| async move {
                body_wanted.notify_one();
                let body = axum::body::to_bytes(request.into_body(), 1024).await;
                body.map_or(0, |body| body.len()).to_string()
            }
        };
        let router = axum::Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .route("/readyz", axum::routing::get(|| async { "ready" }))
            .route("/slow", axum::routing::get(slow))
            .route("/upload", axum::routing::post(upload));
        let stats = Arc::new(ConnectionStats::default());
        let shutdown = CancellationToken::new();
        tokio::spawn(serve_with_ticker(
            listener,
            router,
            limits,
            Arc::clone(&stats),
            shutdown.clone(),
            Duration::from_secs(1),
            ticker,
        ));
        TestServer {
            address,
            stats,
            shutdown,
            release,
            body_wanted,
        }
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

    /// Connects, and waits until the accept thread has admitted (and spawned) or refused the
    /// connection. Meanwhile a blocking task is in flight, which holds the paused clock: the
    /// runtime, with nothing to run while the other thread works, would otherwise move the clock
    /// on to the next timer of the connections already open.
    async fn connect(address: SocketAddr, stats: &Arc<ConnectionStats>) -> TcpStream {
        let before = stats.dequeued();
        let stats = Arc::clone(stats);
        let taken = tokio::task::spawn_blocking(move || {
            for _ in 0..10_000 {
                if stats.dequeued() > before {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            false
        });
        let stream = TcpStream::connect(address).await.unwrap();
        assert!(taken.await.unwrap(), "the accept thread never took it");
        stream
    }

    /// Opens a connection and makes one keep-alive request on it: it is idle then.
    async fn idle_connection(address: SocketAddr, stats: &Arc<ConnectionStats>) -> TcpStream {
        let mut stream = connect(address, stats).await;
        keep_alive_request(&mut stream).await;
        stream
    }

    /// A new connection that has sent `bytes` (a whole request, or part of a head).
    async fn sending(address: SocketAddr, stats: &Arc<ConnectionStats>, bytes: &[u8]) -> TcpStream {
        let mut stream = connect(address, stats).await;
        stream.write_all(bytes).await.unwrap();
        stream
    }

    const TRICKLING_HEAD: &[u8] = b"GET / HTTP/1.1\r\nho";
    const SLOW_REQUEST: &[u8] = b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n";

    #[tokio::test(start_paused = true)]
    async fn a_full_listener_closes_its_oldest_idle_connection_for_a_new_one() {
        let limits = ConnectionLimits {
            max_connections_per_peer: 0,
            ..limits()
        };
        let (address, stats, _shutdown) = start(limits).await;
        let mut idle = Vec::new();
        for _ in 0..4 {
            idle.push(idle_connection(address, &stats).await);
        }
        let mut newcomer = connect(address, &stats).await;
        keep_alive_request(&mut newcomer).await;
        assert_eq!(
            read_to_close(&mut idle[0]).await,
            "",
            "the connection idle longest made room, closed without a word"
        );
        for stream in &mut idle[1..] {
            keep_alive_request(stream).await;
        }
        let snapshot = stats.snapshot();
        assert_eq!(
            (
                snapshot.open,
                snapshot.idle_closes.evicted_for_new,
                snapshot.refused_listener_full
            ),
            (4, 1, 0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_mid_request_is_never_closed_for_a_new_one() {
        let limits = ConnectionLimits {
            max_connections: 2,
            max_connections_per_peer: 0,
            ..limits()
        };
        let server = start_with(limits, Arc::new(MonotonicTicker::new())).await;
        let mut in_flight = sending(server.address, &server.stats, SLOW_REQUEST).await;
        let mut idle = idle_connection(server.address, &server.stats).await;
        // Full: the idle one makes room for a head that trickles in.
        let _trickling = sending(server.address, &server.stats, TRICKLING_HEAD).await;
        assert_eq!(read_to_close(&mut idle).await, "");
        // Full of connections mid-request: the next one is refused, nobody is closed for it.
        let mut refused = connect(server.address, &server.stats).await;
        let answer = read_to_close(&mut refused).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("too_many_connections"), "{answer}");
        server.release.notify_one();
        let mut response = [0_u8; 512];
        let read = in_flight.read(&mut response).await.unwrap();
        let response = String::from_utf8_lossy(&response[..read]);
        assert!(
            response.starts_with("HTTP/1.1 200") && response.ends_with("slow"),
            "{response}"
        );
        let snapshot = server.stats.snapshot();
        assert_eq!(
            (
                snapshot.idle_closes.evicted_for_new,
                snapshot.refused_listener_full
            ),
            (1, 1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_idle_timeout_shrinks_as_the_listener_fills() {
        // Four slots, shrinking past half of them from 60 s to a 2 s floor at four open.
        let limits = ConnectionLimits {
            max_connections_per_peer: 0,
            ..limits()
        };
        let (address, stats, _shutdown) = start(limits).await;
        let mut holding = Vec::new();
        for _ in 0..3 {
            holding.push(connect(address, &stats).await);
        }
        let mut stream = idle_connection(address, &stats).await;
        let idle_from = Instant::now();
        assert_eq!(read_to_close(&mut stream).await, "");
        let idled = idle_from.elapsed();
        assert!(
            (Duration::from_secs(2)..Duration::from_secs(3)).contains(&idled),
            "{idled:?}"
        );
        assert_eq!(stats.snapshot().idle_closes.idle_timeout, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn probes_are_answered_whatever_holds_the_other_connections() {
        let limits = ConnectionLimits {
            max_connections: 2,
            max_connections_per_peer: 0,
            probe_slots: 1,
            probe_paths: &["/readyz"],
            ..limits()
        };
        let server = start_with(limits, Arc::new(MonotonicTicker::new())).await;
        // Every slot held by a connection mid-request: a slow answer, a trickling head.
        let mut in_flight = sending(server.address, &server.stats, SLOW_REQUEST).await;
        let _trickling = sending(server.address, &server.stats, TRICKLING_HEAD).await;
        let probe = b"GET /readyz HTTP/1.1\r\nhost: x\r\n\r\n";
        let mut on_probe_slot = sending(server.address, &server.stats, probe).await;
        let answer = read_to_close(&mut on_probe_slot).await;
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("ready"),
            "{answer}"
        );
        // The probe slot answers probes only.
        let mut not_a_probe = sending(
            server.address,
            &server.stats,
            b"GET / HTTP/1.1\r\nhost: x\r\n\r\n",
        )
        .await;
        let refused = read_to_close(&mut not_a_probe).await;
        assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
        assert!(refused.contains("too_many_connections"), "{refused}");
        // One slot idle, one mid-request: the probe takes the idle one's place.
        server.release.notify_one();
        let mut response = [0_u8; 512];
        let read = in_flight.read(&mut response).await.unwrap();
        assert!(String::from_utf8_lossy(&response[..read]).starts_with("HTTP/1.1 200"));
        let mut probe_again = sending(server.address, &server.stats, probe).await;
        let mut response = [0_u8; 512];
        let read = probe_again.read(&mut response).await.unwrap();
        assert!(String::from_utf8_lossy(&response[..read]).starts_with("HTTP/1.1 200"));
        assert_eq!(
            read_to_close(&mut in_flight).await,
            "",
            "closed for the probe"
        );
        let snapshot = server.stats.snapshot();
        assert_eq!(
            (
                snapshot.probe_slots.accepted,
                snapshot.probe_slots.refused_not_a_probe,
                snapshot.idle_closes.evicted_for_new,
                snapshot.refused_listener_full
            ),
            (2, 1, 1, 0)
        );
    }

    /// Reads `stream` (blocking) until the server ends it: `true`, or `false` if it is still
    /// open after a bound far past anything the watchdog takes (a liveness bound, not a timing).
    fn closed_by_server(stream: &mut std::net::TcpStream) -> bool {
        answer_before_close(stream).is_some()
    }

    /// What the server sent on `stream` before it ended it (blocking, bounded as above).
    fn answer_before_close(stream: &mut std::net::TcpStream) -> Option<String> {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut answer = Vec::new();
        let mut buffer = [0_u8; 1024];
        loop {
            match stream.read(&mut buffer) {
                Ok(0) => return Some(String::from_utf8_lossy(&answer).into_owned()),
                Ok(read) => answer.extend_from_slice(&buffer[..read]),
                Err(error) if error.kind() == io::ErrorKind::ConnectionReset => {
                    return Some(String::from_utf8_lossy(&answer).into_owned());
                }
                Err(_) => return None,
            }
        }
    }

    /// Waits (blocking, bounded) until the accept thread has admitted `count` connections.
    fn admitted(stats: &ConnectionStats, count: u64) {
        for _ in 0..10_000 {
            if stats.snapshot().accepted >= count {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("the accept thread never admitted {count} connections");
    }

    /// The head and body deadlines hold when no task of the connection can run: the runtime's
    /// one worker blocked for the head, no timer of its own for the body (this router reads the
    /// body without one). The table's clock is moved past each deadline and its grace; the
    /// accept thread's watchdog closes the socket.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn deadlines_hold_while_the_connection_task_cannot_act() {
        let ticker = ManualTicker::new();
        let server = start_with(limits(), Arc::new(ticker.clone())).await;
        idle_connection(server.address, &server.stats).await;

        let (unblock, blocked) = std::sync::mpsc::channel::<()>();
        let (blocking, worker_blocked) = std::sync::mpsc::channel::<()>();
        tokio::spawn(async move {
            // The runtime's only worker waits here: no connection task runs.
            blocking.send(()).unwrap();
            let _ = blocked.recv();
        });
        worker_blocked.recv().unwrap();
        let mut silent = std::net::TcpStream::connect(server.address).unwrap();
        silent.write_all(b"GET / HTTP/1.1\r\nho").unwrap();
        admitted(&server.stats, 2);
        ticker.advance(Duration::from_secs(5) + table::GRACE + Duration::from_millis(1));
        assert!(closed_by_server(&mut silent), "the head deadline held");
        assert_eq!(server.stats.snapshot().watchdog_closes.head, 1);
        unblock.send(()).unwrap();

        let mut stalled = std::net::TcpStream::connect(server.address).unwrap();
        stalled
            .write_all(b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n12345")
            .unwrap();
        server.body_wanted.notified().await;
        ticker.advance(Duration::from_secs(5) + table::GRACE + Duration::from_millis(1));
        // The 408 the edge would have answered, then the close.
        let answer = answer_before_close(&mut stalled).expect("the body deadline held");
        assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
        assert!(answer.contains(r#""code":"request_timeout""#), "{answer}");
        assert!(answer.contains("within 5000 ms"), "{answer}");
        assert_eq!(
            server.stats.snapshot().watchdog_closes.body,
            1,
            "{:?}",
            server.stats.snapshot()
        );
    }

    /// A head already waiting when the connection's task first reads it came at some time since
    /// the accept: its body is timed from the accept, not from the late read (else a stalled
    /// body outlives its timeout by the runtime's delay).
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_body_whose_head_waited_for_the_task_is_timed_from_the_accept() {
        let ticker = ManualTicker::new();
        let limits = ConnectionLimits {
            body_read_timeout: Duration::from_secs(4),
            ..limits()
        };
        let server = start_with(limits, Arc::new(ticker.clone())).await;
        idle_connection(server.address, &server.stats).await;
        let (unblock, blocked) = std::sync::mpsc::channel::<()>();
        let (blocking, worker_blocked) = std::sync::mpsc::channel::<()>();
        tokio::spawn(async move {
            blocking.send(()).unwrap();
            let _ = blocked.recv();
        });
        worker_blocked.recv().unwrap();
        let mut stalled = std::net::TcpStream::connect(server.address).unwrap();
        stalled
            .write_all(b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n12345")
            .unwrap();
        admitted(&server.stats, 2);
        // The runtime takes 3 s to get to the connection.
        ticker.advance(Duration::from_secs(3));
        unblock.send(()).unwrap();
        server.body_wanted.notified().await;
        // 4 s after the accept, not after the head was read.
        ticker.advance(Duration::from_secs(1) + table::GRACE + Duration::from_millis(1));
        assert!(closed_by_server(&mut stalled), "the body deadline held");
        assert_eq!(server.stats.snapshot().watchdog_closes.body, 1);
    }
}
