//! One logical request to the service: build it, send it, retry it the way a client behaviour
//! says, and classify how it ended.
//!
//! Every HTTP attempt is counted (`attempts`); the logical request ends with the last attempt's
//! outcome. The logical latency is measured by the caller from the *scheduled* time; each
//! attempt's own latency ([`AttemptRecord`]) is measured here from the time that attempt was due
//! (the request's due time for the first, the end of the retry wait for a retry).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use rebate_resilience::{Backoff, Jitter};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::keys::ItemKey;
use crate::procfs::CpuSource;
use crate::wire;
pub use crate::wire::{QueueOutcome, Queued, TransportError};

/// How a simulated client reacts to 429 / 503 and failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Honours `Retry-After` on 429/503, else exponential back-off with jitter; at most 2
    /// retries; does not retry timeouts (the service already spent its time on them).
    WellBehaved,
    /// Retries any 429, 5xx or transport failure after a fixed 500 ms, 3 times, ignoring
    /// `Retry-After`: the client that turns an overload into a retry storm.
    Naive,
}

/// Back-off of the well-behaved client: first retry waits 100–200 ms, then 200–400 ms, …
const BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(200),
    max: Duration::from_secs(5),
    jitter: Jitter::Equal,
};
/// How far a retry that honours `Retry-After` is spread past it.
const RETRY_AFTER_SPREAD: Duration = Duration::from_millis(100);
/// A `Retry-After` longer than this is capped: the run is bounded.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(30);
const NAIVE_DELAY: Duration = Duration::from_millis(500);

impl Behaviour {
    pub fn max_retries(self) -> u32 {
        match self {
            Self::WellBehaved => 2,
            Self::Naive => 3,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::WellBehaved => "well-behaved",
            Self::Naive => "naive",
        }
    }

    /// How long to wait before retry number `retries_done + 1`, or `None` to stop here.
    /// `jitter` is uniform in [0, 1).
    pub fn retry_delay(
        self,
        retries_done: u32,
        attempt: &Attempt,
        jitter: f64,
    ) -> Option<Duration> {
        if retries_done >= self.max_retries() {
            return None;
        }
        match self {
            Self::WellBehaved => {
                let retry_after = match attempt {
                    Attempt::Response(response) if matches!(response.status, 429 | 503) => {
                        response.retry_after
                    }
                    Attempt::Transport(TransportError::Connect) => None,
                    _ => return None,
                };
                Some(match retry_after {
                    // Honour the server, spread a little so retries do not arrive in lockstep.
                    Some(after) => after.min(RETRY_AFTER_CAP) + RETRY_AFTER_SPREAD.mul_f64(jitter),
                    None => BACKOFF.delay_for(retries_done + 1, jitter),
                })
            }
            Self::Naive => {
                let failed = match attempt {
                    Attempt::Response(response) => response.status == 429 || response.status >= 500,
                    // Never sent (the harness's own bound): nothing the target did to retry.
                    Attempt::Transport(TransportError::Overflow) => false,
                    Attempt::Transport(_) => true,
                };
                failed.then_some(NAIVE_DELAY)
            }
        }
    }
}

/// What one HTTP response said, read cheaply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseSummary {
    pub status: u16,
    pub retry_after: Option<Duration>,
    /// `x-shed-level` (1–3) when the service was shedding.
    pub shed_level: Option<u8>,
    /// 200 and every quote in it has `"degraded":false`.
    pub business_ok: bool,
    /// For a 503: the error code the body gave.
    pub refusal: Option<Refusal>,
    /// The request queued for admission: how that ended and how long it waited.
    pub queued: Option<Queued>,
}

/// Why the service answered 503, from the `code` of its error body: the shedder refused the
/// request (`overloaded`), a part it needed had nothing to serve (`unavailable`), the request
/// ran into its hard timeout (`timeout`), or a connection cap refused the connection
/// (`too_many_connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refusal {
    Overloaded,
    Unavailable,
    Timeout,
    TooManyConnections,
    Other,
}

impl Refusal {
    /// Scans for `"code":"…"` instead of parsing: 503s come by the thousand in a burst.
    pub fn of_body(body: &[u8]) -> Self {
        let Some(at) = memchr::memmem::find(body, b"\"code\":\"") else {
            return Self::Other;
        };
        let code = &body[at + 8..];
        let code = &code[..memchr::memchr(b'"', code).unwrap_or(code.len())];
        match code {
            b"overloaded" => Self::Overloaded,
            b"unavailable" => Self::Unavailable,
            b"timeout" => Self::Timeout,
            b"too_many_connections" => Self::TooManyConnections,
            _ => Self::Other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Overloaded => "overloaded",
            Self::Unavailable => "unavailable",
            Self::Timeout => "timeout",
            Self::TooManyConnections => "too_many_connections",
            Self::Other => "other",
        }
    }
}

/// How one HTTP attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    Response(ResponseSummary),
    Transport(TransportError),
}

/// What the generator asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestKind {
    Single(ItemKey),
    /// The single-item GET marked `x-request-class: prefetch`: a page loaded ahead of a click,
    /// which the service may refuse first.
    Prefetch(ItemKey),
    /// Distinct keys, 1–50.
    Batch(Vec<ItemKey>),
}

impl RequestKind {
    pub fn items(&self) -> usize {
        match self {
            Self::Single(_) | Self::Prefetch(_) => 1,
            Self::Batch(keys) => keys.len(),
        }
    }

    /// The class the service gives this request.
    pub fn class(&self) -> RequestClass {
        match self {
            Self::Single(_) => RequestClass::Page,
            Self::Prefetch(_) => RequestClass::Prefetch,
            Self::Batch(_) => RequestClass::List,
        }
    }

    /// The `x-request-class` value to send: only a request below its route's own class needs
    /// one (the route already makes a GET a page and a batch a list).
    pub fn class_header(&self) -> Option<&'static str> {
        match self {
            Self::Prefetch(_) => Some(RequestClass::Prefetch.as_str()),
            Self::Single(_) | Self::Batch(_) => None,
        }
    }
}

/// The service's request class (README, "Request classes"): its route's (`page` for the
/// single-item GET, `list` for the batch POST), lowered by `x-request-class`. Under shedding a
/// list is served one level above the measured one and a prefetch two (refused from level 2),
/// so the report gives each class its own figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestClass {
    Page,
    List,
    Prefetch,
}

impl RequestClass {
    /// Every class, in the order the report lists them (and [`RequestClass::index`] counts).
    pub const ALL: [Self; 3] = [Self::Page, Self::List, Self::Prefetch];

    /// The service's name for it (the `x-request-class` value and the report's).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Page => "page",
            Self::List => "list",
            Self::Prefetch => "prefetch",
        }
    }

    /// Its position in [`RequestClass::ALL`], for per-class arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The batch body `{"items":[{"platform":…,"item_id":…},…]}`, written directly.
pub fn batch_body(keys: &[ItemKey]) -> String {
    let mut body = String::with_capacity(16 + keys.len() * 44);
    body.push_str("{\"items\":[");
    for (index, key) in keys.iter().enumerate() {
        if index > 0 {
            body.push(',');
        }
        body.push_str("{\"platform\":\"");
        body.push_str(key.platform);
        body.push_str("\",\"item_id\":\"");
        body.push_str(&key.item_id.to_string());
        body.push_str("\"}");
    }
    body.push_str("]}");
    body
}

/// True when `body` (an answer with status 200) holds `expected_quotes` quotes, none degraded.
/// Scans bytes instead of parsing: at thousands of responses a second a full parse would cost
/// the generator more CPU than the service spends answering.
pub fn business_ok(body: &[u8], expected_quotes: usize) -> bool {
    let not_degraded = memchr::memmem::find_iter(body, b"\"degraded\":false").count();
    not_degraded == expected_quotes && memchr::memmem::find(body, b"\"degraded\":true").is_none()
}

/// The harness refuses any target that is not this machine's loopback.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TargetError {
    #[error("target {0:?} is not an http:// URL with a host")]
    Malformed(String),
    #[error(
        "target {0:?} is not on this machine's loopback: rebate-loadgen only sends load to \
         127.0.0.0/8, [::1] or localhost"
    )]
    NotLoopback(String),
}

/// A base URL (`http://127.0.0.1:8080`) known to be loopback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    base: String,
    /// Where the load connects (`localhost` is 127.0.0.1).
    address: SocketAddr,
    /// The `host` header: the URL's host and port as written.
    authority: String,
    /// Where the CPU of whatever answers here is read, so that each run reports it beside the
    /// generator's ([`Target::with_cpu_source`]; unmeasured after [`Target::parse`]).
    cpu: CpuSource,
}

impl Target {
    pub fn parse(url: &str) -> Result<Self, TargetError> {
        let malformed = || TargetError::Malformed(url.to_owned());
        let parsed = reqwest::Url::parse(url).map_err(|_| malformed())?;
        if parsed.scheme() != "http" {
            return Err(malformed());
        }
        let host = parsed.host_str().ok_or_else(malformed)?;
        let bare_host = host.trim_start_matches('[').trim_end_matches(']');
        let ip = if host.eq_ignore_ascii_case("localhost") {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            match bare_host.parse::<IpAddr>() {
                Ok(ip) if ip.is_loopback() => ip,
                _ => return Err(TargetError::NotLoopback(url.to_owned())),
            }
        };
        let port = parsed.port_or_known_default().ok_or_else(malformed)?;
        let authority = match parsed.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_owned(),
        };
        Ok(Self {
            base: url.trim_end_matches('/').to_owned(),
            address: SocketAddr::new(ip, port),
            authority,
            cpu: CpuSource::Unmeasured,
        })
    }

    /// The same target, its CPU read from `source` (the service's process, the ceiling's
    /// threads).
    pub fn with_cpu_source(mut self, source: CpuSource) -> Self {
        self.cpu = source;
        self
    }

    pub fn cpu_source(&self) -> CpuSource {
        self.cpu
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn single_path(&self, key: &ItemKey) -> String {
        format!("/api/v1/items/{}/{}/rebate", key.platform, key.item_id)
    }
}

/// One HTTP attempt of a logical request, as the recorder counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptRecord {
    /// The HTTP status, or the failure below HTTP.
    pub status: Result<u16, TransportError>,
    /// From the moment this attempt was due to its answer: for the first attempt the request's
    /// scheduled time (so a late dispatcher stays in), for a retry the end of its wait.
    pub latency: Duration,
    /// For a 503: why.
    pub refusal: Option<Refusal>,
    /// The answer carried `Retry-After`.
    pub retry_after: bool,
    /// It queued for admission (the service's `Server-Timing`).
    pub queued: Option<Queued>,
}

impl AttemptRecord {
    /// The service did the work: any HTTP answer but 429/503 (which refuse it up front), or a
    /// timeout (no answer in time; kept so that a slow service cannot hide behind its
    /// timeouts). Refused connections and other transport failures are not admitted.
    pub fn admitted(&self) -> bool {
        match self.status {
            Ok(status) => !matches!(status, 429 | 503),
            Err(TransportError::Timeout) => true,
            Err(TransportError::Connect | TransportError::Other | TransportError::Overflow) => {
                false
            }
        }
    }
}

impl Attempt {
    /// The HTTP status, or the failure below HTTP.
    pub fn status(&self) -> Result<u16, TransportError> {
        match self {
            Self::Response(response) => Ok(response.status),
            Self::Transport(error) => Err(*error),
        }
    }

    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Self::Response(response) => response.refusal,
            Self::Transport(_) => None,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Response(response) => response.retry_after,
            Self::Transport(_) => None,
        }
    }

    pub fn queued(&self) -> Option<Queued> {
        match self {
            Self::Response(response) => response.queued,
            Self::Transport(_) => None,
        }
    }
}

/// When a logical request was due (its schedule) and when its retries must stop (the run's
/// bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTimes {
    pub due: Instant,
    pub give_up_at: Instant,
}

impl RequestTimes {
    /// Due now, bounded `bound` from now.
    pub fn from_now(bound: Duration) -> Self {
        let now = Instant::now();
        Self {
            due: now,
            give_up_at: now + bound,
        }
    }
}

/// How a logical request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicalOutcome {
    /// The last attempt's outcome.
    pub last: Attempt,
    /// HTTP attempts sent, retries included (≥ 1).
    pub attempts: u32,
    /// Highest `x-shed-level` seen on any attempt.
    pub shed_level: Option<u8>,
    /// Every attempt, in order (`attempts` of them).
    pub log: Vec<AttemptRecord>,
}

/// The shared HTTP client of one run: keep-alive HTTP/1.1 connections ([`wire::Pool`]), one
/// pool per source address with [`LoadClient::from_sources`].
#[derive(Debug, Clone)]
pub struct LoadClient {
    /// One pool per source address, or one with the system's choice of address.
    pools: Arc<Vec<wire::Pool>>,
    /// The bound on one attempt, connection included.
    attempt_timeout: Duration,
    /// Permits for attempts on the wire: each holds a connection, busy or pooled afterwards,
    /// and past the open-files limit the process could open nothing at all (status sampling
    /// and the service's logs included). None left: the attempt is `Overflow`, not sent.
    on_wire: Arc<Semaphore>,
}

/// How long a connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Files the harness keeps for itself beside its load's connections: the service's pipes and
/// logs, status sampling, the in-process ceiling's listener, the runtime.
const FILES_HEADROOM: u64 = 2_000;
/// The bound on attempts on the wire where the open-files limit cannot be read.
const DEFAULT_MAX_ON_WIRE: usize = 30_000;

/// How many attempts may be on the wire at once: the open-files limit less
/// [`FILES_HEADROOM`]. A new connection is opened only by an attempt that holds a permit and
/// found none idle in its pool, so the connections open exceed this only by idle ones of other
/// source addresses' pools, which close after their idle time.
fn max_on_wire() -> usize {
    crate::procfs::open_files_limit().map_or(DEFAULT_MAX_ON_WIRE, |limit| {
        usize::try_from(limit.saturating_sub(FILES_HEADROOM).max(1)).unwrap_or(usize::MAX)
    })
}
const BATCH_PATH: &str = "/api/v1/items:batch";

impl LoadClient {
    /// Idle pooled connections are kept 30 s.
    pub fn new(attempt_timeout: Duration) -> anyhow::Result<Self> {
        Self::with_pool_idle(attempt_timeout, Duration::from_secs(30))
    }

    /// One pool per loopback source address in `sources` (each must be on this machine's
    /// loopback, e.g. 127.0.1.1), idle connections dropped after `pool_idle`; a request's
    /// client id picks the address, so one simulated client always uses the same one.
    pub fn from_sources(
        attempt_timeout: Duration,
        pool_idle: Duration,
        sources: &[IpAddr],
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(!sources.is_empty(), "no source address given");
        let mut pools = Vec::with_capacity(sources.len());
        for source in sources {
            anyhow::ensure!(source.is_loopback(), "{source} is not a loopback address");
            pools.push(wire::Pool::new(Some(*source), CONNECT_TIMEOUT, pool_idle));
        }
        Ok(Self {
            pools: Arc::new(pools),
            attempt_timeout,
            on_wire: Arc::new(Semaphore::new(max_on_wire())),
        })
    }

    /// As [`LoadClient::new`], but idle pooled connections are dropped after `pool_idle`: keep
    /// it below the server's idle timeout, or a request may pick a connection the server is
    /// closing at that moment (the chaos suite shortens the server's idle timeout).
    pub fn with_pool_idle(attempt_timeout: Duration, pool_idle: Duration) -> anyhow::Result<Self> {
        Ok(Self {
            pools: Arc::new(vec![wire::Pool::new(None, CONNECT_TIMEOUT, pool_idle)]),
            attempt_timeout,
            on_wire: Arc::new(Semaphore::new(max_on_wire())),
        })
    }

    /// The pool for `client_id`: by a hash of it over the source addresses.
    fn pool_for(&self, client_id: &str) -> &wire::Pool {
        // FNV-1a: cheap, and the same id always lands on the same address.
        let hash = client_id
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
            });
        &self.pools[(hash % self.pools.len() as u64) as usize]
    }

    /// One HTTP attempt.
    pub async fn attempt(
        &self,
        target: &Target,
        request: &RequestKind,
        client_id: &str,
    ) -> Attempt {
        let pool = self.pool_for(client_id);
        let (path, body) = match request {
            RequestKind::Single(key) | RequestKind::Prefetch(key) => {
                (target.single_path(key), String::new())
            }
            RequestKind::Batch(keys) => (BATCH_PATH.to_owned(), batch_body(keys)),
        };
        let wire_request = wire::Request {
            post: matches!(request, RequestKind::Batch(_)),
            path: &path,
            client_id,
            class: request.class_header(),
            body: body.as_bytes(),
        };
        let Ok(_on_wire) = self.on_wire.try_acquire() else {
            return Attempt::Transport(TransportError::Overflow);
        };
        let sent = pool.send(target.address, &target.authority, wire_request);
        let response = match tokio::time::timeout(self.attempt_timeout, sent).await {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => return Attempt::Transport(error),
            Err(_) => return Attempt::Transport(TransportError::Timeout),
        };
        let status = response.status;
        Attempt::Response(ResponseSummary {
            status,
            retry_after: response.retry_after_secs.map(Duration::from_secs),
            shed_level: response.shed_level,
            business_ok: status == 200 && business_ok(&response.body, request.items()),
            refusal: (status == 503).then(|| Refusal::of_body(&response.body)),
            queued: response.queued,
        })
    }

    /// A logical request: attempts and retries per `behaviour`, the first timed from
    /// `times.due`, never sleeping past `times.give_up_at` (the run's bound).
    pub async fn logical(
        &self,
        target: &Target,
        request: &RequestKind,
        client_id: &str,
        behaviour: Behaviour,
        times: RequestTimes,
        on_attempt: &(dyn Fn() + Sync),
    ) -> LogicalOutcome {
        let mut attempts = 0;
        let mut shed_level = None;
        let mut log = Vec::with_capacity(behaviour.max_retries() as usize + 1);
        let RequestTimes { due, give_up_at } = times;
        let mut attempt_due = due;
        loop {
            on_attempt();
            attempts += 1;
            let attempt = self.attempt(target, request, client_id).await;
            let answered = Instant::now();
            log.push(AttemptRecord {
                status: attempt.status(),
                latency: answered.saturating_duration_since(attempt_due),
                refusal: attempt.refusal(),
                retry_after: attempt.retry_after().is_some(),
                queued: attempt.queued(),
            });
            if let Attempt::Response(response) = &attempt {
                shed_level = shed_level.max(response.shed_level);
            }
            let jitter = rand::rng().random::<f64>();
            let delay = behaviour.retry_delay(attempts - 1, &attempt, jitter);
            match delay {
                Some(delay) if answered + delay < give_up_at => {
                    // The retry is due when its wait ends; a late wake-up counts against it.
                    attempt_due = answered + delay;
                    tokio::time::sleep_until(attempt_due).await;
                }
                _ => {
                    return LogicalOutcome {
                        last: attempt,
                        attempts,
                        shed_level,
                        log,
                    };
                }
            }
        }
    }
}

/// A tiny axum server for the tests of this crate.
#[cfg(test)]
pub(crate) mod test_server {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use axum::Router;
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use axum::routing::get;

    use super::Target;

    /// Answers its first `refusals` calls 503 with `Retry-After: 1` (like the service's level 3),
    /// every later one 200 with an undegraded quote at once; counts calls.
    pub(crate) async fn overloaded_for(refusals: u32) -> (Target, Arc<AtomicU32>) {
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let app = Router::new().fallback(get(move || {
            let counter = counter.clone();
            async move {
                if counter.fetch_add(1, Ordering::Relaxed) < refusals {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [("retry-after", "1")],
                        "{}",
                    )
                        .into_response()
                } else {
                    (StatusCode::OK, "{\"degraded\":false}").into_response()
                }
            }
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (Target::parse(&format!("http://{address}")).unwrap(), calls)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test]
    async fn a_client_id_always_uses_the_same_source_address() {
        let sources: Vec<IpAddr> = ["127.0.1.1", "127.0.1.2", "127.0.1.3"]
            .iter()
            .map(|address| address.parse().unwrap())
            .collect();
        let second = Duration::from_secs(1);
        let client = LoadClient::from_sources(second, second, &sources).unwrap();
        let pool = |id: &str| client.pool_for(id) as *const wire::Pool;
        assert_eq!(pool("app-ios-7"), pool("app-ios-7"));
        let used: std::collections::HashSet<_> = (0..100)
            .map(|index| pool(&format!("h5-web-{index}")))
            .collect();
        assert_eq!(used.len(), 3, "ids spread over every address");
        assert!(LoadClient::from_sources(second, second, &["10.1.2.3".parse().unwrap()]).is_err());
        // The bound source addresses do reach a loopback server.
        let (target, calls) = test_server::overloaded_for(0).await;
        for index in 0..6 {
            let attempt = client
                .attempt(
                    &target,
                    &RequestKind::Single(ItemKey {
                        platform: "jd",
                        item_id: 100_002,
                    }),
                    &format!("app-ios-{index}"),
                )
                .await;
            assert!(
                matches!(attempt, Attempt::Response(ref r) if r.status == 200),
                "{attempt:?}"
            );
        }
        assert_eq!(calls.load(Ordering::Relaxed), 6);
    }

    fn response(status: u16, retry_after: Option<u64>) -> Attempt {
        Attempt::Response(ResponseSummary {
            status,
            retry_after: retry_after.map(Duration::from_secs),
            shed_level: None,
            business_ok: false,
            refusal: None,
            queued: None,
        })
    }

    #[test]
    fn well_behaved_honours_retry_after_and_stops_after_two_retries() {
        let behaviour = Behaviour::WellBehaved;
        let delay = behaviour
            .retry_delay(0, &response(503, Some(3)), 0.5)
            .unwrap();
        assert!(delay >= Duration::from_secs(3) && delay < Duration::from_millis(3100));
        let delay = behaviour
            .retry_delay(1, &response(429, Some(1)), 0.0)
            .unwrap();
        assert_eq!(delay, Duration::from_secs(1));
        assert_eq!(behaviour.retry_delay(2, &response(503, Some(1)), 0.5), None);
    }

    #[test]
    fn well_behaved_backs_off_exponentially_with_jitter_without_retry_after() {
        let behaviour = Behaviour::WellBehaved;
        let first_low = behaviour.retry_delay(0, &response(503, None), 0.0).unwrap();
        let first_high = behaviour
            .retry_delay(0, &response(503, None), 0.999)
            .unwrap();
        let second_low = behaviour.retry_delay(1, &response(503, None), 0.0).unwrap();
        assert_eq!(first_low, Duration::from_millis(100));
        assert!(
            first_high > Duration::from_millis(195) && first_high <= Duration::from_millis(200)
        );
        assert_eq!(second_low, Duration::from_millis(200));
        assert!(
            behaviour
                .retry_delay(0, &Attempt::Transport(TransportError::Connect), 0.0)
                .is_some()
        );
    }

    #[test]
    fn well_behaved_does_not_retry_what_a_retry_cannot_fix() {
        let behaviour = Behaviour::WellBehaved;
        for status in [200, 400, 404, 500] {
            assert_eq!(
                behaviour.retry_delay(0, &response(status, Some(1)), 0.5),
                None
            );
        }
        assert_eq!(
            behaviour.retry_delay(0, &Attempt::Transport(TransportError::Timeout), 0.5),
            None
        );
    }

    #[test]
    fn naive_retries_every_failure_after_500_ms_ignoring_retry_after() {
        let behaviour = Behaviour::Naive;
        for retries_done in 0..3 {
            assert_eq!(
                behaviour.retry_delay(retries_done, &response(503, Some(5)), 0.3),
                Some(Duration::from_millis(500))
            );
        }
        assert_eq!(behaviour.retry_delay(3, &response(503, Some(5)), 0.3), None);
        assert_eq!(
            behaviour.retry_delay(0, &Attempt::Transport(TransportError::Timeout), 0.3),
            Some(Duration::from_millis(500))
        );
        assert_eq!(behaviour.retry_delay(0, &response(404, None), 0.3), None);
    }

    #[test]
    fn only_a_prefetch_names_its_class_in_a_header() {
        let key = ItemKey {
            platform: "jd",
            item_id: 100_002,
        };
        let cases = [
            (RequestKind::Single(key), RequestClass::Page, None),
            (RequestKind::Batch(vec![key]), RequestClass::List, None),
            (
                RequestKind::Prefetch(key),
                RequestClass::Prefetch,
                Some("prefetch"),
            ),
        ];
        for (request, class, header) in cases {
            assert_eq!(request.class(), class, "{request:?}");
            assert_eq!(request.class_header(), header, "{request:?}");
            assert_eq!(request.items(), 1);
        }
        for (index, class) in RequestClass::ALL.into_iter().enumerate() {
            assert_eq!(class.index(), index);
        }
    }

    #[test]
    fn batch_body_is_the_service_format() {
        let keys = [
            ItemKey {
                platform: "jd",
                item_id: 100_002,
            },
            ItemKey {
                platform: "pdd",
                item_id: 100_003,
            },
        ];
        let body: serde_json::Value = serde_json::from_str(&batch_body(&keys)).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"items": [
                {"platform": "jd", "item_id": "100002"},
                {"platform": "pdd", "item_id": "100003"}]})
        );
    }

    #[test]
    fn business_success_needs_every_quote_live() {
        let single = br#"{"item":{},"degraded":false,"degraded_parts":[],"trace_id":"x"}"#;
        assert!(business_ok(single, 1));
        let degraded = br#"{"degraded":true,"degraded_parts":[{"part":"coupons"}]}"#;
        assert!(!business_ok(degraded, 1));
        let batch = br#"{"results":[{"status":200,"quote":{"degraded":false}},
            {"status":404,"error":{"code":"item_not_found"}}]}"#;
        assert!(
            !business_ok(batch, 2),
            "an item error is not a business success"
        );
        assert!(business_ok(batch, 1));
    }

    #[test]
    fn only_loopback_targets_are_accepted() {
        for ok in [
            "http://127.0.0.1:8080",
            "http://localhost:1/",
            "http://[::1]:80",
            "http://127.3.4.5",
        ] {
            assert!(Target::parse(ok).is_ok(), "{ok}");
        }
        for refused in [
            "http://10.0.0.1:8080",
            "http://example.com",
            "http://192.168.1.2",
        ] {
            assert_eq!(
                Target::parse(refused),
                Err(TargetError::NotLoopback(refused.to_owned()))
            );
        }
        assert!(matches!(
            Target::parse("ftp://127.0.0.1"),
            Err(TargetError::Malformed(_))
        ));
        assert!(matches!(
            Target::parse("nonsense"),
            Err(TargetError::Malformed(_))
        ));
        assert_eq!(
            Target::parse("http://127.0.0.1:9/").unwrap().base(),
            "http://127.0.0.1:9"
        );
    }

    async fn always_overloaded() -> (Target, Arc<AtomicU32>) {
        test_server::overloaded_for(u32::MAX).await
    }

    async fn run_against_overloaded(behaviour: Behaviour) -> (LogicalOutcome, u32, Duration, u32) {
        let (target, calls) = always_overloaded().await;
        let client = LoadClient::new(Duration::from_secs(2)).unwrap();
        let counted = AtomicU32::new(0);
        let started = Instant::now();
        let outcome = client
            .logical(
                &target,
                &RequestKind::Single(ItemKey {
                    platform: "jd",
                    item_id: 100_002,
                }),
                "app-ios-1",
                behaviour,
                RequestTimes::from_now(Duration::from_secs(8)),
                &|| {
                    counted.fetch_add(1, Ordering::Relaxed);
                },
            )
            .await;
        (
            outcome,
            calls.load(Ordering::Relaxed),
            started.elapsed(),
            counted.into_inner(),
        )
    }

    #[tokio::test]
    async fn an_attempt_over_the_wire_bound_is_not_sent_nor_retried() {
        let (target, calls) = test_server::overloaded_for(0).await;
        let mut client = LoadClient::new(Duration::from_secs(2)).unwrap();
        let key = RequestKind::Single(ItemKey {
            platform: "jd",
            item_id: 100_002,
        });
        client.on_wire = Arc::new(Semaphore::new(1));
        let held = client.on_wire.clone().try_acquire_owned().unwrap();
        for behaviour in [Behaviour::WellBehaved, Behaviour::Naive] {
            let outcome = client
                .logical(
                    &target,
                    &key,
                    "app-ios-1",
                    behaviour,
                    RequestTimes::from_now(Duration::from_secs(8)),
                    &|| {},
                )
                .await;
            assert_eq!(outcome.attempts, 1, "{behaviour:?}");
            assert_eq!(
                outcome.last.status(),
                Err(TransportError::Overflow),
                "{behaviour:?}"
            );
        }
        assert_eq!(
            calls.load(Ordering::Relaxed),
            0,
            "nothing reached the server"
        );
        drop(held);
        let sent = client.attempt(&target, &key, "app-ios-1").await;
        assert_eq!(sent.status(), Ok(200));
        assert_eq!(client.on_wire.available_permits(), 1, "the permit is back");
    }

    #[tokio::test]
    async fn well_behaved_client_waits_retry_after_twice_then_gives_up() {
        let (outcome, calls, elapsed, counted) =
            run_against_overloaded(Behaviour::WellBehaved).await;
        assert_eq!(outcome.attempts, 3);
        assert_eq!((calls, counted), (3, 3));
        assert!(
            elapsed >= Duration::from_secs(2),
            "honoured Retry-After: {elapsed:?}"
        );
        assert!(matches!(
            outcome.last,
            Attempt::Response(ResponseSummary { status: 503, .. })
        ));
    }

    #[tokio::test]
    async fn naive_client_retries_three_times_every_500_ms() {
        let (outcome, calls, elapsed, counted) = run_against_overloaded(Behaviour::Naive).await;
        assert_eq!(outcome.attempts, 4);
        assert_eq!((calls, counted), (4, 4));
        assert!(
            elapsed >= Duration::from_millis(1500) && elapsed < Duration::from_millis(2000),
            "ignored Retry-After: {elapsed:?}"
        );
    }

    #[tokio::test]
    async fn retries_stop_at_the_run_bound() {
        let (target, calls) = always_overloaded().await;
        let client = LoadClient::new(Duration::from_secs(2)).unwrap();
        let outcome = client
            .logical(
                &target,
                &RequestKind::Single(ItemKey {
                    platform: "jd",
                    item_id: 100_002,
                }),
                "h5-web-1",
                Behaviour::WellBehaved,
                RequestTimes::from_now(Duration::from_millis(300)),
                &|| {},
            )
            .await;
        assert_eq!(
            outcome.attempts, 1,
            "a 1 s Retry-After does not fit a 300 ms bound"
        );
        assert_eq!(calls.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn retry_after_wait_is_in_the_logical_latency_not_in_the_admitted_attempt() {
        let (target, calls) = test_server::overloaded_for(1).await;
        let client = LoadClient::new(Duration::from_secs(2)).unwrap();
        let times = RequestTimes::from_now(Duration::from_secs(8));
        let outcome = client
            .logical(
                &target,
                &RequestKind::Single(ItemKey {
                    platform: "jd",
                    item_id: 100_002,
                }),
                "app-ios-1",
                Behaviour::WellBehaved,
                times,
                &|| {},
            )
            .await;
        let logical = times.due.elapsed();
        assert_eq!((outcome.attempts, calls.load(Ordering::Relaxed)), (2, 2));
        assert!(matches!(
            outcome.last,
            Attempt::Response(ResponseSummary {
                status: 200,
                business_ok: true,
                refusal: None,
                ..
            })
        ));
        let [refused, admitted] = outcome.log.as_slice() else {
            panic!("two attempts expected: {:?}", outcome.log)
        };
        assert_eq!(refused.status, Ok(503));
        assert!(!refused.admitted());
        assert_eq!(admitted.status, Ok(200));
        assert!(admitted.admitted());
        assert!(logical >= Duration::from_secs(1), "{logical:?}");
        assert!(
            admitted.latency < Duration::from_millis(100),
            "the admitted attempt is timed from the end of its wait: {:?}",
            admitted.latency
        );
    }

    #[test]
    fn a_refusal_is_read_from_the_error_code() {
        let body = |code: &str| {
            format!(r#"{{"error":{{"code":"{code}","message":"m"}},"trace_id":"t"}}"#).into_bytes()
        };
        assert_eq!(Refusal::of_body(&body("overloaded")), Refusal::Overloaded);
        assert_eq!(Refusal::of_body(&body("unavailable")), Refusal::Unavailable);
        assert_eq!(Refusal::of_body(&body("timeout")), Refusal::Timeout);
        assert_eq!(
            Refusal::of_body(&body("too_many_connections")),
            Refusal::TooManyConnections
        );
        assert_eq!(Refusal::of_body(&body("broker")), Refusal::Other);
        assert_eq!(Refusal::of_body(b"not json"), Refusal::Other);
    }

    #[test]
    fn admitted_means_the_service_did_the_work() {
        let record = |status| AttemptRecord {
            status,
            latency: Duration::from_millis(1),
            refusal: None,
            retry_after: false,
            queued: None,
        };
        for status in [200, 404, 500, 502, 504] {
            assert!(record(Ok(status)).admitted(), "{status}");
        }
        assert!(!record(Ok(503)).admitted());
        assert!(!record(Ok(429)).admitted());
        assert!(record(Err(TransportError::Timeout)).admitted());
        assert!(!record(Err(TransportError::Connect)).admitted());
        assert!(!record(Err(TransportError::Other)).admitted());
    }
}
