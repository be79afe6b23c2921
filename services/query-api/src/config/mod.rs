//! Typed, validated configuration: the embedded `config/default.toml`, then an optional file,
//! then `REBATE__SECTION__KEY` environment variables, each overriding the one before.

pub mod change_capture;
pub mod reference;
pub mod resilience;

pub use resilience::{
    BreakerDefaults, ClientLimitSettings, DependencySettings, ResilienceSettings, RetrySettings,
    SheddingSettings,
};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use rebate_cache::{Jitter, TtlPolicy};
use rebate_domain::{ItemKey, PerPart};
use rebate_engine::{ClassTimeouts, PartTimeouts, TimeoutClass};
use rebate_telemetry::LogFormat;
use serde::Deserialize;

/// The defaults every instance starts from; a config file only names what it changes.
pub const DEFAULT_CONFIG: &str = include_str!("../../../../config/default.toml");

/// Prefix of environment overrides: `REBATE__HTTP__LISTEN` sets `http.listen`.
pub const ENV_PREFIX: &str = "REBATE__";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {0} does not exist")]
    MissingFile(PathBuf),
    #[error("invalid configuration: {0}")]
    Parse(#[from] Box<figment::Error>),
    #[error("invalid configuration: {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .filter(|value| !value.trim().is_empty())
}

/// An `http(s)://host[:port][/path]` URL, checked without a URL crate's full rules.
fn reqwest_free_url_check(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{url:?} must start with http:// or https://"))?;
    if rest.is_empty() || rest.starts_with('/') || rest.contains(char::is_whitespace) {
        return Err(format!("{url:?} has no host"));
    }
    Ok(())
}

pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// `value` must lie in `range`; the error names the key and the bounds ("70000 is outside
/// 1..=60000").
pub(crate) fn ensure_in<T>(
    field: &'static str,
    value: T,
    range: std::ops::RangeInclusive<T>,
) -> Result<(), ConfigError>
where
    T: PartialOrd + std::fmt::Display,
{
    if range.contains(&value) {
        return Ok(());
    }
    Err(invalid(
        field,
        format!("{value} is outside {}..={}", range.start(), range.end()),
    ))
}

/// Why `upstreams.simulate = true` is refused by a build without the embedded simulator.
pub(crate) const NO_SIMULATOR: &str = "this build has no embedded simulator (built without the \
    `simulator` feature): set it to false and point upstreams.coupons_url and extras_url at the APIs";

/// Environment variables that carry connection strings, by convention; they win over the files.
pub const DATABASE_URL_ENV: &str = "DATABASE_URL";
pub const REDIS_URL_ENV: &str = "REDIS_URL";
pub const AMQP_URL_ENV: &str = "AMQP_URL";

/// A value that must never reach a log: connection strings with passwords.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(if self.0.is_empty() {
            "Secret(<unset>)"
        } else {
            "Secret(***)"
        })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub http: HttpSettings,
    pub admin: AdminSettings,
    pub store: StoreSettings,
    pub redis: RedisSettings,
    pub bloom: BloomSettings,
    pub warmup: WarmupSettings,
    pub warm_jobs: WarmJobSettings,
    pub hot_keys: HotKeySettings,
    pub events: EventSettings,
    pub upstreams: UpstreamSettings,
    pub timeouts: TimeoutSettings,
    pub parts: PartsSettings,
    pub resilience: ResilienceSettings,
    pub observability: ObservabilitySettings,
    pub engine: EngineSettings,
    pub log: LogSettings,
    pub rules: RulesSettings,
    pub change_capture: change_capture::ChangeCaptureSettings,
}

/// `[rules]`: live rule sets (`crate::rules`): how often an instance looks for a new version,
/// how large a document may be, how a canary is judged, and the file's hard ceilings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RulesSettings {
    /// How often every instance reads the active version and reports its own (the bus's
    /// announcement is the fast path; this heals a missed one).
    pub poll_interval_ms: u64,
    /// The largest document, as JSON.
    pub max_document_bytes: usize,
    pub canary: CanarySettings,
    /// Numeric live keys an operator may not raise above these values at runtime, e.g.
    /// `"resilience.coupons.quota_per_sec" = 45.0` (the provider's contract).
    #[serde(default)]
    pub ceilings: std::collections::BTreeMap<String, f64>,
}

/// `[rules.canary]`: the margins within which a canary is promoted.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct CanarySettings {
    /// The observation window when a rollout names none, and its bounds.
    pub observe_secs: u64,
    pub max_observe_secs: u64,
    /// Requests the canary instances must have answered in the window for a verdict on figures;
    /// fewer, and the window is extended once, then the canary is promoted on no evidence of
    /// harm only if `promote_without_traffic`.
    pub min_requests: u64,
    pub promote_without_traffic: bool,
    /// The canary's business success ratio may fall at most this far below the baseline's.
    pub max_success_drop: f64,
    /// The canary's p99 may be at most this many times the baseline's, plus `p99_slack_ms`.
    pub max_p99_ratio: f64,
    pub p99_slack_ms: u64,
    /// Breaker trips per canary instance beyond the baseline's, per instance.
    pub max_extra_trips: f64,
    /// How many levels the canary's highest shed level may stand above the baseline's.
    pub max_shed_level_rise: u8,
}

impl RulesSettings {
    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.poll_interval_ms)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        ensure_in(
            "rules.poll_interval_ms",
            self.poll_interval_ms,
            100..=60_000,
        )?;
        ensure_in(
            "rules.max_document_bytes",
            self.max_document_bytes,
            1024..=1_048_576,
        )?;
        let canary = &self.canary;
        // A verdict compares a window with as long a span before it: both must fit in the
        // seconds the request window keeps.
        ensure_in(
            "rules.canary.max_observe_secs",
            canary.max_observe_secs,
            1..=(crate::rules::window::KEPT_SECONDS as u64 / 2),
        )?;
        ensure_in(
            "rules.canary.observe_secs",
            canary.observe_secs,
            1..=canary.max_observe_secs,
        )?;
        ensure_in(
            "rules.canary.min_requests",
            canary.min_requests,
            0..=10_000_000,
        )?;
        ensure_in(
            "rules.canary.max_success_drop",
            canary.max_success_drop,
            0.0..=1.0,
        )?;
        ensure_in(
            "rules.canary.max_p99_ratio",
            canary.max_p99_ratio,
            1.0..=100.0,
        )?;
        ensure_in("rules.canary.p99_slack_ms", canary.p99_slack_ms, 0..=60_000)?;
        ensure_in(
            "rules.canary.max_extra_trips",
            canary.max_extra_trips,
            0.0..=1000.0,
        )?;
        ensure_in(
            "rules.canary.max_shed_level_rise",
            canary.max_shed_level_rise,
            0..=3,
        )
    }
}

/// `[engine]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSettings {
    /// `aggregated` (the service) or `naive` (the load harness's "before" baseline: no cache,
    /// parts fetched one after another). Never run `naive` in production.
    pub mode: rebate_engine::EngineMode,
    /// Bytes of complete quotes kept as rendered JSON (the hot path's one lookup); 0 turns the
    /// rendering cache off and every request assembles and serialises its quote.
    pub rendered_max_bytes: u64,
    /// At shed level 3 (cache only), keys whose parts L1 lacks may still load, this many at a
    /// time, so that a cold instance under load warms up; 0 refuses every miss at level 3.
    pub cache_only_loads: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    pub listen: SocketAddr,
    pub request_deadline_ms: u64,
    pub request_timeout_ms: u64,
    pub body_limit_bytes: usize,
    pub max_batch_items: usize,
    pub shutdown_drain_ms: u64,
    /// A request head must be complete this long after its first byte.
    pub header_read_timeout_ms: u64,
    /// A keep-alive connection without a new request for this long is closed.
    pub idle_timeout_ms: u64,
    /// Past this share of `max_connections` open, the idle timeout shrinks (1.0: never) …
    pub idle_shrink_from: f64,
    /// … in a straight line to this at a full listener.
    pub idle_timeout_floor_ms: u64,
    /// A request body must be complete this long after its head; it is read before the request
    /// counts as load.
    pub body_read_timeout_ms: u64,
    /// Largest request head (names, values and their separators), answered 431 above it.
    pub max_header_bytes: usize,
    /// Most headers in one request, answered 431 above it.
    pub max_headers: usize,
    /// Longest request target (path and query), answered 414 above it.
    pub max_uri_bytes: usize,
    /// Connections open at once on the API listener.
    pub max_connections: usize,
    /// Connections open at once from one peer address (0: no cap; use 0 behind a load balancer).
    pub max_connections_per_peer: usize,
    /// Length of the kernel's queue of connections waiting to be accepted (`listen(2)`'s
    /// backlog; the kernel caps it at `net.core.somaxconn`).
    pub listen_backlog: u32,
    /// Cross-origin access for H5 pages.
    pub cors: CorsSettings,
    /// Compression of large answers.
    pub compression: CompressionSettings,
}

/// Compression of large answers (`[http.compression]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompressionSettings {
    pub enabled: bool,
    /// Answers at least this large are compressed for clients that accept it.
    pub min_bytes: usize,
    /// 1 (fastest) to 9.
    pub gzip_level: u32,
    /// 0 (fastest) to 11.
    pub brotli_quality: u32,
}

/// Which browser origins may call the public API (`[http.cors]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorsSettings {
    /// `scheme://host[:port]` each, or the one entry `*`; empty: CORS off.
    pub allowed_origins: Vec<String>,
    /// How long a browser may cache a preflight's answer (at most a day).
    pub max_age_secs: u64,
    /// Whether credentialed requests (cookies, HTTP authentication) are allowed.
    pub allow_credentials: bool,
}

impl CorsSettings {
    /// The most origins listed (each preflight compares against every one).
    pub const MAX_ORIGINS: usize = 100;

    fn validate(&self) -> Result<(), ConfigError> {
        const FIELD: &str = "http.cors.allowed_origins";
        if self.allowed_origins.len() > Self::MAX_ORIGINS {
            return Err(invalid(
                FIELD,
                format!(
                    "{} origins listed; at most {}",
                    self.allowed_origins.len(),
                    Self::MAX_ORIGINS
                ),
            ));
        }
        let any = self.allowed_origins.iter().any(|origin| origin == "*");
        if any && self.allowed_origins.len() > 1 {
            return Err(invalid(FIELD, "\"*\" must be the only entry"));
        }
        if any && self.allow_credentials {
            return Err(invalid(
                FIELD,
                "\"*\" cannot be combined with http.cors.allow_credentials = true (browsers refuse it)",
            ));
        }
        for origin in self.allowed_origins.iter().filter(|origin| *origin != "*") {
            check_origin(origin).map_err(|reason| invalid(FIELD, reason))?;
        }
        ensure_in("http.cors.max_age_secs", self.max_age_secs, 0..=86_400)
    }
}

/// An origin as browsers send it: `http(s)://host[:port]`, lower case, nothing after the port.
fn check_origin(origin: &str) -> Result<(), String> {
    let rest = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .ok_or_else(|| format!("{origin:?} must start with http:// or https://"))?;
    let (host, port) = if rest.starts_with('[') {
        // An IPv6 literal: `[…]`, then an optional `:port`.
        let end = rest.find(']').map_or(rest.len(), |end| end + 1);
        let (host, after) = rest.split_at(end);
        match after {
            "" => (host, None),
            after => (host, Some(after.strip_prefix(':').unwrap_or(after))),
        }
    } else {
        match rest.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        }
    };
    let host_ok = !host.is_empty()
        && host.bytes().all(|byte| {
            byte.is_ascii_lowercase()
                || byte.is_ascii_digit()
                || matches!(byte, b'.' | b'-' | b'[' | b']' | b':')
        });
    if !host_ok {
        return Err(format!(
            "{origin:?}: the host must be a lower-case name or address, with no path, query or trailing slash"
        ));
    }
    if let Some(port) = port
        && port.parse::<u16>().map_or(true, |port| port == 0)
    {
        return Err(format!("{origin:?}: the port must be 1–65535"));
    }
    Ok(())
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSettings {
    pub listen: SocketAddr,
    pub token: Secret,
    pub token_file: PathBuf,
    /// Hard stop for one admin request (status, inspection, publishing, warm-up).
    pub request_timeout_ms: u64,
    /// Connections open at once on the admin listener.
    pub max_connections: usize,
    /// Connections beyond `max_connections` kept for `/healthz` and `/readyz`, one request each.
    pub probe_connections: usize,
    /// How failed authentications are slowed per peer (`crate::http::admin_auth`).
    pub auth_throttle: AuthThrottleSettings,
}

/// `[admin.auth_throttle]`: a peer that keeps offering wrong tokens is answered 429 for a while.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthThrottleSettings {
    /// Failed authentications before the peer is throttled (1–1000).
    pub max_failures: u32,
    /// A peer that has not failed for this long is forgiven: its count starts again.
    pub window_secs: u64,
    /// How long a throttled peer's admin requests are refused without a look at the token.
    pub penalty_secs: u64,
    /// Peers remembered at once; the one seen least recently is forgotten first.
    pub tracked_peers: usize,
}

impl AuthThrottleSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        ensure_in(
            "admin.auth_throttle.max_failures",
            self.max_failures,
            1..=1_000,
        )?;
        ensure_in(
            "admin.auth_throttle.window_secs",
            self.window_secs,
            1..=86_400,
        )?;
        ensure_in(
            "admin.auth_throttle.penalty_secs",
            self.penalty_secs,
            1..=86_400,
        )?;
        ensure_in(
            "admin.auth_throttle.tracked_peers",
            self.tracked_peers,
            16..=1_000_000,
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreBackend {
    Sqlite,
    Mysql,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSettings {
    pub backend: StoreBackend,
    pub seed_demo: bool,
    pub max_concurrent_loads: usize,
    pub sqlite: SqliteSettings,
    pub mysql: MySqlSettings,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MySqlSettings {
    /// Overridden by `DATABASE_URL`.
    pub url: Secret,
    pub max_connections: u32,
    pub min_connections: u32,
    pub acquire_timeout_ms: u64,
    pub statement_timeout_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    pub enabled: bool,
    /// Overridden by `REDIS_URL`.
    pub url: Secret,
    /// Seed nodes of a Redis Cluster; when non-empty, cluster mode is used and `url` ignored.
    pub cluster_nodes: Vec<Secret>,
    pub prefix: String,
    pub command_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    pub lease_ttl_ms: u64,
    pub lease_wait_ms: u64,
    pub lease_poll_ms: u64,
    pub tls: RedisTlsSettings,
}

/// `[redis.tls]`: files read at start, PEM. Paths only: what they hold is never logged.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisTlsSettings {
    /// The CA that signed the servers' certificates; empty: the system's roots.
    pub ca_file: String,
    /// A client certificate and its key, for servers that ask for one (both or neither).
    pub client_cert_file: String,
    pub client_key_file: String,
}

impl RedisTlsSettings {
    /// The files' contents for the tier; `Err` names the key whose file cannot be read.
    pub fn load(&self) -> Result<rebate_redis_tier::RedisTls, ConfigError> {
        let read = |field: &'static str, path: &str| -> Result<Option<Vec<u8>>, ConfigError> {
            if path.is_empty() {
                return Ok(None);
            }
            let bytes = std::fs::read(path)
                .map_err(|error| invalid(field, format!("cannot read {path}: {error}")))?;
            if !bytes.windows(11).any(|window| window == b"-----BEGIN ") {
                return Err(invalid(field, format!("{path} holds no PEM block")));
            }
            Ok(Some(bytes))
        };
        Ok(rebate_redis_tier::RedisTls {
            ca_pem: read("redis.tls.ca_file", &self.ca_file)?,
            client_cert_pem: read("redis.tls.client_cert_file", &self.client_cert_file)?,
            client_key_pem: read("redis.tls.client_key_file", &self.client_key_file)?,
        })
    }

    fn is_set(&self) -> bool {
        !(self.ca_file.is_empty()
            && self.client_cert_file.is_empty()
            && self.client_key_file.is_empty())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BloomSettings {
    pub enabled: bool,
    pub false_positive_rate: f64,
    pub expected_items: u64,
    pub rebuild_interval_secs: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventBackend {
    /// In-process bus: the embedded profile, or a single instance.
    InProcess,
    /// RabbitMQ: every instance of a fleet.
    Amqp,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSettings {
    pub backend: EventBackend,
    pub fence_secs: u64,
    /// An event more versions than this ahead of the store's row is taken for an operator's
    /// mistake (`crate::consistency`, and the caches' fences).
    pub max_version_gap: u64,
    pub signing_key: Secret,
    pub require_signature: bool,
    pub max_age_secs: u64,
    /// Broker and topology; `url` is overridden by `AMQP_URL`.
    #[serde(default)]
    pub amqp: rebate_amqp_bus::AmqpSettings,
    /// The consistency observer (`crate::consistency`).
    #[serde(default)]
    pub observer: ObserverSettings,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ObserverSettings {
    pub enabled: bool,
    /// Share of applied events checked, 0–1.
    pub sample_ratio: f64,
    /// When to look after each event, ascending, 1 to 8 windows of 1 ms to 1 h.
    pub windows_ms: Vec<u64>,
    /// Events under observation at once (1–1,000,000); the drift sampler follows at most as
    /// many keys.
    pub max_pending: u64,
    /// Keys the drift sampler draws each second from what this instance holds, 0–10,000; 0
    /// turns it off (`crate::consistency`).
    pub drift_keys_per_sec: u32,
}

impl Default for ObserverSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            sample_ratio: 1.0,
            windows_ms: vec![1_000, 10_000, 60_000],
            max_pending: 10_000,
            drift_keys_per_sec: 20,
        }
    }
}

impl ObserverSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        ensure_in("events.observer.sample_ratio", self.sample_ratio, 0.0..=1.0)?;
        let ascending = self.windows_ms.windows(2).all(|pair| pair[0] < pair[1]);
        if !(1..=8).contains(&self.windows_ms.len())
            || !ascending
            || self
                .windows_ms
                .iter()
                .any(|window| !(1..=3_600_000).contains(window))
        {
            return Err(invalid(
                "events.observer.windows_ms",
                format!(
                    "{:?}: want 1 to 8 strictly ascending windows of 1..=3600000 ms",
                    self.windows_ms
                ),
            ));
        }
        ensure_in(
            "events.observer.max_pending",
            self.max_pending,
            1..=1_000_000,
        )?;
        ensure_in(
            "events.observer.drift_keys_per_sec",
            self.drift_keys_per_sec,
            0..=10_000,
        )?;
        Ok(())
    }
}

impl EventSettings {
    /// The consistency observer's settings: `[events.observer]`, and the fence time and version
    /// gap it judges an event ahead of the store by.
    pub fn observer_settings(&self) -> crate::consistency::ObserverConfig {
        let observer = &self.observer;
        crate::consistency::ObserverConfig {
            enabled: observer.enabled,
            sample_ratio: observer.sample_ratio,
            windows: observer
                .windows_ms
                .iter()
                .map(|window| Duration::from_millis(*window))
                .collect(),
            max_pending: observer.max_pending,
            fence_for: Duration::from_secs(self.fence_secs),
            max_version_gap: self.max_version_gap,
            drift_keys_per_sec: observer.drift_keys_per_sec,
        }
    }
}

/// `[warm_jobs]`: operators' warm jobs (`crate::warm_jobs`): chunks on a Redis stream that
/// every instance works through, or an in-process queue without Redis.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WarmJobSettings {
    /// Whether this instance works through warm chunks (submission and progress work anyway).
    pub consume: bool,
    /// The most keys one job may name.
    pub max_keys: usize,
    /// The body limit of `POST /admin/v1/warm-jobs` alone (every other route keeps
    /// `http.body_limit_bytes`).
    pub body_limit_bytes: usize,
    /// Keys per chunk: the unit one instance takes, acknowledges and another may claim.
    pub chunk_keys: usize,
    /// Chunks waiting at most, all jobs together; a job that would exceed it is refused.
    pub max_queued_chunks: u64,
    /// Keys this instance loads per second at most, and how many at once.
    pub rate_per_sec: u32,
    pub concurrency: usize,
    /// How often an idle consumer asks for a chunk.
    pub poll_interval_ms: u64,
    /// A chunk untouched this long is claimed by another instance (its consumer died).
    pub claim_idle_ms: u64,
    /// How long a job's progress stays queryable after its last change.
    pub job_ttl_secs: u64,
}

impl WarmJobSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        ensure_in("warm_jobs.max_keys", self.max_keys, 1..=1_000_000)?;
        ensure_in(
            "warm_jobs.body_limit_bytes",
            self.body_limit_bytes,
            1024..=64 * 1024 * 1024,
        )?;
        ensure_in("warm_jobs.chunk_keys", self.chunk_keys, 1..=5_000)?;
        ensure_in(
            "warm_jobs.max_queued_chunks",
            self.max_queued_chunks,
            1..=1_000_000,
        )?;
        ensure_in("warm_jobs.rate_per_sec", self.rate_per_sec, 1..=100_000)?;
        ensure_in("warm_jobs.concurrency", self.concurrency, 1..=200)?;
        ensure_in(
            "warm_jobs.poll_interval_ms",
            self.poll_interval_ms,
            10..=60_000,
        )?;
        ensure_in(
            "warm_jobs.claim_idle_ms",
            self.claim_idle_ms,
            100..=3_600_000,
        )?;
        ensure_in("warm_jobs.job_ttl_secs", self.job_ttl_secs, 60..=604_800)
    }
}

/// `[hot_keys]`: the hot items learned from traffic (`crate::hot_keys`).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HotKeySettings {
    pub enabled: bool,
    /// Keys the sketch counts at most (Space-Saving counters).
    pub capacity: usize,
    /// One answered item in this many (at random) is counted, each for this many: the sketch
    /// costs the hot path a fraction of its 80–240 ns a request, and a hot item is hot in any
    /// sample.
    pub sample_every: u32,
    /// Counts halve over this long, so the list follows what is hot now.
    pub half_life_secs: u64,
    /// How often the counts decay and, with Redis, this instance's list is published.
    pub publish_interval_secs: u64,
    /// How many of its hottest keys an instance publishes.
    pub publish_top: usize,
}

impl HotKeySettings {
    pub fn half_life(&self) -> Duration {
        Duration::from_secs(self.half_life_secs)
    }

    pub fn publish_interval(&self) -> Duration {
        Duration::from_secs(self.publish_interval_secs)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        ensure_in("hot_keys.capacity", self.capacity, 16..=1_000_000)?;
        ensure_in("hot_keys.sample_every", self.sample_every, 1..=1_000)?;
        ensure_in("hot_keys.half_life_secs", self.half_life_secs, 10..=86_400)?;
        ensure_in(
            "hot_keys.publish_interval_secs",
            self.publish_interval_secs,
            1..=3_600,
        )?;
        ensure_in("hot_keys.publish_top", self.publish_top, 1..=10_000)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmupSettings {
    pub enabled: bool,
    pub hot_items_limit: u32,
    /// `platform:item_id` strings, validated at start.
    pub items: Vec<String>,
    pub rate_per_sec: u32,
    pub interval_secs: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqliteSettings {
    pub path: PathBuf,
    pub max_connections: u32,
    pub acquire_timeout_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSettings {
    pub simulate: bool,
    pub simulator_listen: SocketAddr,
    pub coupons_url: String,
    pub extras_url: String,
    pub connect_timeout_ms: u64,
    /// The most item ids in one batch call of each API (its own limit); 1 sends one call per
    /// item (an API without a batch route).
    pub coupons_batch_max_items: u32,
    pub extras_batch_max_items: u32,
    /// How long a batch waits for concurrent loads to join it (never past a caller's budget).
    pub batch_window_ms: u64,
}

impl UpstreamSettings {
    /// The most item ids one call may carry.
    pub const MAX_BATCH_ITEMS: u32 = 1_000;
    /// The longest a batch may wait for loads to join: batching is for concurrent loads, and
    /// a longer wait would only add to every cold answer.
    pub const MAX_BATCH_WINDOW_MS: u64 = 100;

    /// How the loads of the API whose batches carry at most `max_items` ids are coalesced.
    pub fn batch(&self, max_items: u32) -> rebate_sources::BatchConfig {
        rebate_sources::BatchConfig {
            max_items: max_items as usize,
            window: std::time::Duration::from_millis(self.batch_window_ms),
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.simulate && !cfg!(feature = "simulator") {
            return Err(invalid("upstreams.simulate", NO_SIMULATOR));
        }
        ensure_in(
            "upstreams.connect_timeout_ms",
            self.connect_timeout_ms,
            1..=60_000,
        )?;
        ensure_in(
            "upstreams.coupons_batch_max_items",
            self.coupons_batch_max_items,
            1..=Self::MAX_BATCH_ITEMS,
        )?;
        ensure_in(
            "upstreams.extras_batch_max_items",
            self.extras_batch_max_items,
            1..=Self::MAX_BATCH_ITEMS,
        )?;
        ensure_in(
            "upstreams.batch_window_ms",
            self.batch_window_ms,
            0..=Self::MAX_BATCH_WINDOW_MS,
        )
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutSettings {
    pub core_ms: u64,
    pub normal_ms: u64,
    pub edge_ms: u64,
}

/// `[parts.product]`, `[parts.rate]`, `[parts.coupons]`, `[parts.extras]`.
pub type PartsSettings = PerPart<PartSettings>;

/// Each part's section, as errors name it.
const PART_SECTIONS: PerPart<&str> = PerPart {
    product: "parts.product",
    rate: "parts.rate",
    coupons: "parts.coupons",
    extras: "parts.extras",
};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartSettings {
    /// `core`, `normal` or `edge`: which of `[timeouts]` applies (formerly `tier`).
    pub timeout_class: TimeoutClass,
    /// Overrides the tier's timeout for this part only.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    pub l1_max_entries: u64,
    pub fresh_secs: u64,
    /// Refresh ahead: a read this long before an entry stops being fresh reloads it in the
    /// background with probability 1/e (less when further), so hot keys never wait for their
    /// reload. 0 turns it off.
    pub refresh_ahead_ms: u64,
    pub jitter_ratio: f64,
    pub stale_secs: u64,
    pub not_found_secs: u64,
    pub l2_fresh_secs: u64,
    pub l2_jitter_secs: u64,
    pub l2_stale_secs: u64,
    pub l2_not_found_secs: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    pub format: LogFormat,
    pub filter: String,
}

/// `[observability]`: the slow-request log and OTLP trace export.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObservabilitySettings {
    /// Names this instance in slow-request records and exported traces; empty: host name and
    /// process id.
    pub instance_id: String,
    /// A request at least this slow is recorded (and, when exporting, always kept).
    pub slow_request_ms: u64,
    /// How many slow, failed or degraded requests the in-process log keeps.
    pub slow_log_size: usize,
    /// At most this many of them a second also write a log line (0: none); the rest are counted
    /// in the next line's `suppressed_since_last_line`.
    pub slow_log_lines_per_sec: u32,
    /// OTLP/HTTP collector base URL (`OTEL_EXPORTER_OTLP_ENDPOINT` wins); empty: no export.
    pub otlp_endpoint: String,
    pub otlp_sample_ratio: f64,
    pub otlp_queue_size: usize,
    pub otlp_timeout_ms: u64,
    pub service_name: String,
}

/// The standard OpenTelemetry variable for the collector's address.
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

impl Settings {
    /// Defaults, then `file` if given, then the environment; validated.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Toml::string(DEFAULT_CONFIG));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::MissingFile(path.to_owned()));
            }
            figment = figment.merge(Toml::file(path));
        }
        figment = figment.merge(Env::prefixed(ENV_PREFIX).split("__"));
        let mut settings: Settings = figment.extract().map_err(Box::new)?;
        if let Some(url) = non_empty_env(DATABASE_URL_ENV) {
            settings.store.mysql.url = Secret::new(url);
        }
        if let Some(url) = non_empty_env(REDIS_URL_ENV) {
            settings.redis.url = Secret::new(url);
        }
        if let Some(url) = non_empty_env(AMQP_URL_ENV) {
            settings.events.amqp.url = url;
        }
        if let Some(url) = non_empty_env(OTLP_ENDPOINT_ENV) {
            settings.observability.otlp_endpoint = url;
        }
        settings.validate()?;
        Ok(settings)
    }

    /// The embedded defaults alone (tests start from these and change fields).
    pub fn defaults() -> Result<Self, ConfigError> {
        Self::from_figment(Figment::from(Toml::string(DEFAULT_CONFIG)))
    }

    fn from_figment(figment: Figment) -> Result<Self, ConfigError> {
        let settings: Settings = figment.extract().map_err(Box::new)?;
        settings.validate()?;
        Ok(settings)
    }

    /// The warm-up keys named in the config, parsed (validated at load, so this cannot fail
    /// on loaded settings).
    pub fn warmup_items(&self) -> Result<Vec<ItemKey>, ConfigError> {
        self.warmup
            .items
            .iter()
            .map(|text| {
                let (platform, item_id) = text.split_once(':').ok_or_else(|| {
                    invalid("warmup.items", format!("{text:?} is not platform:item_id"))
                })?;
                ItemKey::parse(platform, item_id)
                    .map_err(|error| invalid("warmup.items", format!("{text:?}: {error}")))
            })
            .collect()
    }

    /// Explains the first thing that is wrong, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let http = &self.http;
        ensure_in(
            "http.request_deadline_ms",
            http.request_deadline_ms,
            50..=60_000,
        )?;
        if http.request_timeout_ms < http.request_deadline_ms {
            return Err(invalid(
                "http.request_timeout_ms",
                format!(
                    "{} is below http.request_deadline_ms ({}); the hard timeout must leave the deadline room",
                    http.request_timeout_ms, http.request_deadline_ms
                ),
            ));
        }
        let wait = &self.resilience.admission_wait;
        for (field, waiters, wait_ms) in [
            (
                "resilience.admission_wait.prefetch_max_wait_ms",
                wait.prefetch_max_waiters,
                wait.prefetch_max_wait_ms,
            ),
            (
                "resilience.admission_wait.list_max_wait_ms",
                wait.list_max_waiters,
                wait.list_max_wait_ms,
            ),
        ] {
            // A wait is capped by the request's deadline: one that could use it all would
            // admit a request with nothing left to answer it in.
            if waiters > 0 && wait_ms >= http.request_deadline_ms {
                return Err(invalid(
                    field,
                    format!(
                        "{wait_ms} is not below http.request_deadline_ms ({}): a wait is capped by the request's deadline",
                        http.request_deadline_ms
                    ),
                ));
            }
        }
        ensure_in(
            "http.body_limit_bytes",
            http.body_limit_bytes,
            1024..=16 * 1024 * 1024,
        )?;
        let rendered = self.engine.rendered_max_bytes;
        if rendered != 0 && !(65_536..=(64u64 << 30)).contains(&rendered) {
            return Err(invalid(
                "engine.rendered_max_bytes",
                format!(
                    "{rendered} is neither 0 (off) nor within 65536..=68719476736 (a size in bytes, e.g. 33554432 for 32 MiB)"
                ),
            ));
        }
        if self.engine.cache_only_loads > 1024 {
            return Err(invalid(
                "engine.cache_only_loads",
                format!(
                    "{} is above 1024 (loads at a time at shed level 3; 0 is strict cache-only)",
                    self.engine.cache_only_loads
                ),
            ));
        }
        ensure_in("http.max_batch_items", http.max_batch_items, 1..=200)?;
        if http.shutdown_drain_ms > 300_000 {
            return Err(invalid(
                "http.shutdown_drain_ms",
                format!("{} is above 300000", http.shutdown_drain_ms),
            ));
        }
        self.validate_connections()?;
        self.http.cors.validate()?;
        let compression = &self.http.compression;
        ensure_in(
            "http.compression.min_bytes",
            compression.min_bytes,
            64..=16_777_216,
        )?;
        ensure_in("http.compression.gzip_level", compression.gzip_level, 1..=9)?;
        ensure_in(
            "http.compression.brotli_quality",
            compression.brotli_quality,
            0..=11,
        )?;
        if !self.admin.token.is_empty() && self.admin.token.expose().len() < 16 {
            return Err(invalid("admin.token", "must be at least 16 characters"));
        }
        if self.admin.token.is_empty() && self.admin.token_file.as_os_str().is_empty() {
            return Err(invalid(
                "admin.token_file",
                "must be set when admin.token is empty (the generated token is written there)",
            ));
        }
        self.admin.auth_throttle.validate()?;
        let sqlite = &self.store.sqlite;
        if sqlite.path.as_os_str().is_empty() {
            return Err(invalid("store.sqlite.path", "must not be empty"));
        }
        ensure_in(
            "store.sqlite.max_connections",
            sqlite.max_connections,
            1..=256,
        )?;
        ensure_in(
            "store.sqlite.acquire_timeout_ms",
            sqlite.acquire_timeout_ms,
            1..=60_000,
        )?;
        self.upstreams.validate()?;
        self.hot_keys.validate()?;
        self.warm_jobs.validate()?;
        for (field, value) in [
            ("timeouts.core_ms", self.timeouts.core_ms),
            ("timeouts.normal_ms", self.timeouts.normal_ms),
            ("timeouts.edge_ms", self.timeouts.edge_ms),
        ] {
            ensure_in(field, value, 1..=60_000)?;
        }
        for (kind, part) in self.parts.iter() {
            part.validate(PART_SECTIONS[kind])?;
        }
        self.resilience.validate()?;
        self.rules.validate()?;
        self.validate_change_capture()?;
        crate::rules::check_ceilings(self, &self.rules.ceilings)
            .map_err(|error| invalid("rules.ceilings", error.to_string()))?;
        self.validate_observability()?;
        self.validate_store_and_tiers()
    }

    /// `[change_capture]`, and what it needs of the other sections when enabled.
    fn validate_change_capture(&self) -> Result<(), ConfigError> {
        let capture = &self.change_capture;
        capture.validate()?;
        if !capture.enabled {
            return Ok(());
        }
        if self.store.backend != StoreBackend::Mysql {
            return Err(invalid(
                "change_capture.enabled",
                "needs store.backend = \"mysql\": the binlog is MariaDB's or MySQL's",
            ));
        }
        if !self.redis.enabled {
            return Err(invalid(
                "change_capture.enabled",
                "needs redis.enabled: one reader for the fleet holds a lease in Redis",
            ));
        }
        Ok(())
    }

    fn validate_connections(&self) -> Result<(), ConfigError> {
        let http = &self.http;
        let ranges: [(&'static str, u64, std::ops::RangeInclusive<u64>); 4] = [
            (
                "http.header_read_timeout_ms",
                http.header_read_timeout_ms,
                100..=120_000,
            ),
            (
                "http.idle_timeout_ms",
                http.idle_timeout_ms,
                100..=3_600_000,
            ),
            (
                "http.body_read_timeout_ms",
                http.body_read_timeout_ms,
                100..=120_000,
            ),
            (
                "admin.request_timeout_ms",
                self.admin.request_timeout_ms,
                100..=600_000,
            ),
        ];
        for (field, value, range) in ranges {
            ensure_in(field, value, range)?;
        }
        ensure_in(
            "http.max_header_bytes",
            http.max_header_bytes,
            1024..=65_536,
        )?;
        ensure_in(
            "http.max_headers",
            http.max_headers,
            8..=crate::server::HARD_MAX_HEADERS,
        )?;
        if !(256..=http.max_header_bytes).contains(&http.max_uri_bytes) {
            return Err(invalid(
                "http.max_uri_bytes",
                format!(
                    "{} is outside 256..=http.max_header_bytes ({}): the target is part of the head",
                    http.max_uri_bytes, http.max_header_bytes
                ),
            ));
        }
        ensure_in("http.max_connections", http.max_connections, 1..=1_000_000)?;
        if http.max_connections_per_peer > http.max_connections {
            return Err(invalid(
                "http.max_connections_per_peer",
                format!(
                    "{} is above http.max_connections ({}); 0 turns the per-peer cap off",
                    http.max_connections_per_peer, http.max_connections
                ),
            ));
        }
        ensure_in("http.listen_backlog", http.listen_backlog, 16..=65_535)?;
        ensure_in("http.idle_shrink_from", http.idle_shrink_from, 0.0..=1.0)?;
        if !(100..=http.idle_timeout_ms).contains(&http.idle_timeout_floor_ms) {
            return Err(invalid(
                "http.idle_timeout_floor_ms",
                format!(
                    "{} is outside 100..=http.idle_timeout_ms ({}): the floor the idle timeout \
                     shrinks to under pressure",
                    http.idle_timeout_floor_ms, http.idle_timeout_ms
                ),
            ));
        }
        ensure_in(
            "admin.max_connections",
            self.admin.max_connections,
            1..=10_000,
        )?;
        ensure_in(
            "admin.probe_connections",
            self.admin.probe_connections,
            0..=64,
        )?;
        Ok(())
    }

    /// The API listener's connection bounds.
    pub fn api_connection_limits(&self) -> crate::server::ConnectionLimits {
        let http = &self.http;
        crate::server::ConnectionLimits {
            header_read_timeout: Duration::from_millis(http.header_read_timeout_ms),
            idle_timeout: Duration::from_millis(http.idle_timeout_ms),
            max_header_bytes: http.max_header_bytes,
            max_connections: http.max_connections,
            max_connections_per_peer: http.max_connections_per_peer,
            body_limit_bytes: http.body_limit_bytes,
            idle_shrink_from: http.idle_shrink_from,
            idle_timeout_floor: Duration::from_millis(http.idle_timeout_floor_ms),
            body_read_timeout: Duration::from_millis(http.body_read_timeout_ms),
            probe_slots: 0,
            probe_paths: &[],
        }
    }

    /// The admin listener's: the API's timeouts and header cap, its own connection cap, and the
    /// warm-job submission's body limit when it is the larger.
    pub fn admin_connection_limits(&self) -> crate::server::ConnectionLimits {
        crate::server::ConnectionLimits {
            max_connections: self.admin.max_connections,
            max_connections_per_peer: 0,
            probe_slots: self.admin.probe_connections,
            // The admin router's health probes (`http::admin`): Kubernetes' liveness and
            // readiness probes must be answered whatever holds the other connections.
            probe_paths: &["/healthz", "/readyz"],
            body_limit_bytes: self
                .http
                .body_limit_bytes
                .max(self.warm_jobs.body_limit_bytes),
            ..self.api_connection_limits()
        }
    }

    fn validate_observability(&self) -> Result<(), ConfigError> {
        let observability = &self.observability;
        ensure_in(
            "observability.slow_request_ms",
            observability.slow_request_ms,
            1..=600_000,
        )?;
        if observability.slow_log_lines_per_sec > 10_000 {
            return Err(invalid(
                "observability.slow_log_lines_per_sec",
                format!(
                    "{} is above 10000 (0 writes no lines; the slow-request log still records)",
                    observability.slow_log_lines_per_sec
                ),
            ));
        }
        ensure_in(
            "observability.slow_log_size",
            observability.slow_log_size,
            1..=100_000,
        )?;
        let endpoint = observability.otlp_endpoint.trim();
        if !endpoint.is_empty() {
            let url = reqwest_free_url_check(endpoint);
            if let Err(reason) = url {
                return Err(invalid("observability.otlp_endpoint", reason));
            }
        }
        ensure_in(
            "observability.otlp_sample_ratio",
            observability.otlp_sample_ratio,
            0.0..=1.0,
        )?;
        ensure_in(
            "observability.otlp_queue_size",
            observability.otlp_queue_size,
            64..=1_000_000,
        )?;
        ensure_in(
            "observability.otlp_timeout_ms",
            observability.otlp_timeout_ms,
            1..=60_000,
        )?;
        if observability.service_name.trim().is_empty() {
            return Err(invalid("observability.service_name", "must not be empty"));
        }
        Ok(())
    }

    /// This instance's name: the configured one, else `host-pid`.
    pub fn instance_id(&self) -> String {
        let configured = self.observability.instance_id.trim();
        if !configured.is_empty() {
            return configured.to_owned();
        }
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|host| !host.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|host| host.trim().to_owned())
            })
            .unwrap_or_else(|| "localhost".to_owned());
        format!("{host}-{}", std::process::id())
    }

    /// The OTLP export settings, when an endpoint is configured.
    pub fn otlp(&self) -> Option<rebate_telemetry::OtlpConfig> {
        let observability = &self.observability;
        let endpoint = observability.otlp_endpoint.trim();
        (!endpoint.is_empty()).then(|| rebate_telemetry::OtlpConfig {
            endpoint: endpoint.to_owned(),
            service_name: observability.service_name.clone(),
            instance: self.instance_id(),
            sample_ratio: observability.otlp_sample_ratio,
            slow: Duration::from_millis(observability.slow_request_ms),
            max_queue: observability.otlp_queue_size,
            export_timeout: Duration::from_millis(observability.otlp_timeout_ms),
        })
    }

    fn validate_store_and_tiers(&self) -> Result<(), ConfigError> {
        ensure_in(
            "store.max_concurrent_loads",
            self.store.max_concurrent_loads,
            1..=4096,
        )?;
        let mysql = &self.store.mysql;
        if self.store.backend == StoreBackend::Mysql && mysql.url.is_empty() {
            return Err(invalid(
                "store.mysql.url",
                format!(
                    "backend is mysql but neither {DATABASE_URL_ENV} nor store.mysql.url is set"
                ),
            ));
        }
        if !(1..=1024).contains(&mysql.max_connections)
            || mysql.min_connections > mysql.max_connections
        {
            return Err(invalid(
                "store.mysql.max_connections",
                format!(
                    "max {} must be within 1..=1024 and at least min_connections {}",
                    mysql.max_connections, mysql.min_connections
                ),
            ));
        }
        for (field, value) in [
            ("store.mysql.acquire_timeout_ms", mysql.acquire_timeout_ms),
            (
                "store.mysql.statement_timeout_ms",
                mysql.statement_timeout_ms,
            ),
            ("redis.command_timeout_ms", self.redis.command_timeout_ms),
            ("redis.connect_timeout_ms", self.redis.connect_timeout_ms),
            ("redis.lease_ttl_ms", self.redis.lease_ttl_ms),
            ("redis.lease_poll_ms", self.redis.lease_poll_ms),
        ] {
            ensure_in(field, value, 1..=60_000)?;
        }
        let redis = &self.redis;
        if redis.enabled && redis.url.is_empty() && redis.cluster_nodes.is_empty() {
            return Err(invalid(
                "redis.url",
                format!(
                    "redis is enabled but neither {REDIS_URL_ENV}, redis.url nor redis.cluster_nodes is set"
                ),
            ));
        }
        if redis.enabled && redis.tls.is_set() {
            if redis.tls.client_cert_file.is_empty() != redis.tls.client_key_file.is_empty() {
                return Err(invalid(
                    "redis.tls.client_key_file",
                    "a client certificate needs its key, and a key its certificate",
                ));
            }
            let plain = if redis.cluster_nodes.is_empty() {
                (!redis.url.expose().starts_with("rediss://")).then_some("redis.url")
            } else {
                redis
                    .cluster_nodes
                    .iter()
                    .any(|node| !node.expose().starts_with("rediss://"))
                    .then_some("redis.cluster_nodes")
            };
            if let Some(field) = plain {
                return Err(invalid(
                    field,
                    "redis.tls is set, so every Redis URL must be rediss:// (TLS)",
                ));
            }
            redis.tls.load()?;
        }
        if self.resilience.fleet.quotas && !redis.enabled {
            return Err(invalid(
                "resilience.fleet.quotas",
                "fleet-wide quotas keep their tokens in Redis: set redis.enabled too",
            ));
        }
        if self.resilience.client_limit.scope == resilience::LimitScope::Fleet && !redis.enabled {
            return Err(invalid(
                "resilience.client_limit.scope",
                "a fleet-wide client limit keeps its buckets in Redis: set redis.enabled too",
            ));
        }
        if redis.prefix.is_empty() || redis.prefix.contains(char::is_whitespace) {
            return Err(invalid("redis.prefix", "must be non-empty without spaces"));
        }
        if redis.lease_wait_ms >= redis.lease_ttl_ms {
            return Err(invalid(
                "redis.lease_wait_ms",
                format!(
                    "{} must be below redis.lease_ttl_ms ({})",
                    redis.lease_wait_ms, redis.lease_ttl_ms
                ),
            ));
        }
        let bloom = &self.bloom;
        ensure_in(
            "bloom.false_positive_rate",
            bloom.false_positive_rate,
            0.000_001..=0.1,
        )?;
        ensure_in(
            "bloom.expected_items",
            bloom.expected_items,
            1..=1_000_000_000,
        )?;
        if bloom.rebuild_interval_secs < 10 {
            return Err(invalid(
                "bloom.rebuild_interval_secs",
                "must be at least 10",
            ));
        }
        let warmup = &self.warmup;
        ensure_in("warmup.rate_per_sec", warmup.rate_per_sec, 1..=100_000)?;
        if warmup.interval_secs < 10 {
            return Err(invalid("warmup.interval_secs", "must be at least 10"));
        }
        ensure_in("events.fence_secs", self.events.fence_secs, 1..=86_400)?;
        ensure_in(
            "events.max_version_gap",
            self.events.max_version_gap,
            1..=u64::MAX,
        )?;
        let events = &self.events;
        if events.require_signature && events.signing_key.expose().len() < 16 {
            return Err(invalid(
                "events.signing_key",
                "require_signature is on but the key is missing or shorter than 16 bytes",
            ));
        }
        if !events.signing_key.is_empty() && events.signing_key.expose().len() < 16 {
            return Err(invalid("events.signing_key", "must be at least 16 bytes"));
        }
        if events.backend == EventBackend::Amqp
            && let Err(error) = events.amqp.validate()
        {
            return Err(invalid("events.amqp", error.to_string()));
        }
        events.observer.validate()?;
        if events.backend == EventBackend::Amqp
            && events.max_age_secs > 0
            && events.amqp.catch_up_window_ms > events.max_age_secs.saturating_mul(1_000)
        {
            // A replayed event older than max_age would be refused as stale, and its change lost.
            return Err(invalid(
                "events.amqp.catch_up_window_ms",
                format!(
                    "{} ms is longer than events.max_age_secs = {} s: events replayed after a \
                     reconnect would be refused as too old",
                    events.amqp.catch_up_window_ms, events.max_age_secs
                ),
            ));
        }
        self.warmup_items().map(|_| ())
    }

    pub fn request_deadline(&self) -> Duration {
        Duration::from_millis(self.http.request_deadline_ms)
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.http.request_timeout_ms)
    }

    pub fn shutdown_drain(&self) -> Duration {
        Duration::from_millis(self.http.shutdown_drain_ms)
    }

    pub fn class_timeouts(&self) -> ClassTimeouts {
        ClassTimeouts {
            core: Duration::from_millis(self.timeouts.core_ms),
            normal: Duration::from_millis(self.timeouts.normal_ms),
            edge: Duration::from_millis(self.timeouts.edge_ms),
        }
    }

    /// What a request may spend: the parts' timeouts, level 2's shortened ones and the
    /// retries (the engine's budget, at start and from every rule set).
    pub fn request_budget(&self) -> rebate_engine::RequestBudget {
        let timeouts = self.part_timeouts();
        let shedding = &self.resilience.shedding;
        rebate_engine::RequestBudget {
            timeouts,
            short_timeouts: rebate_engine::scale_timeouts(
                &timeouts,
                shedding.core_timeout_factor,
                shedding.normal_timeout_factor,
                shedding.edge_timeout_factor,
            ),
            retries_per_request: self.resilience.retry.max_per_request,
        }
    }

    /// The kept renderings' refresh lead: the longest of the parts'.
    pub fn rendering_lead(&self) -> Duration {
        self.parts
            .iter()
            .map(|(_, part)| Duration::from_millis(part.refresh_ahead_ms))
            .max()
            .unwrap_or_default()
    }

    /// Each part's timeout: its own override, else its tier's.
    pub fn part_timeouts(&self) -> PartTimeouts {
        let classes = self.class_timeouts();
        let resolve = |part: &PartSettings| {
            part.timeout_ms
                .map(Duration::from_millis)
                .unwrap_or_else(|| classes.timeout(part.timeout_class))
        };
        self.parts.map(|_, part| resolve(part))
    }
}

impl PartSettings {
    /// L1 lifetimes: fresh ± `jitter_ratio`.
    pub fn ttl_policy(&self) -> TtlPolicy {
        TtlPolicy {
            fresh: Duration::from_secs(self.fresh_secs),
            jitter: Jitter::Ratio(self.jitter_ratio),
            stale: Duration::from_secs(self.stale_secs),
            not_found: Duration::from_secs(self.not_found_secs),
        }
    }

    /// L2 lifetimes: fresh + uniform `0..=l2_jitter_secs`.
    pub fn l2_ttl_policy(&self) -> TtlPolicy {
        TtlPolicy {
            fresh: Duration::from_secs(self.l2_fresh_secs),
            jitter: Jitter::UpTo(Duration::from_secs(self.l2_jitter_secs)),
            stale: Duration::from_secs(self.l2_stale_secs),
            not_found: Duration::from_secs(self.l2_not_found_secs),
        }
    }

    fn validate(&self, name: &'static str) -> Result<(), ConfigError> {
        if let Some(timeout) = self.timeout_ms
            && !(1..=60_000).contains(&timeout)
        {
            return Err(invalid(
                name,
                format!("timeout_ms {timeout} is outside 1..=60000"),
            ));
        }
        if self.l1_max_entries == 0 {
            return Err(invalid(name, "l1_max_entries must be at least 1"));
        }
        // A read refreshes only within ten leads of the expiry; a lead past a tenth of the
        // lifetime would reload nearly every entry on its first reads.
        if self.refresh_ahead_ms > self.fresh_secs.saturating_mul(100) {
            return Err(invalid(
                name,
                format!(
                    "refresh_ahead_ms {} is more than a tenth of fresh_secs ({} ms)",
                    self.refresh_ahead_ms,
                    self.fresh_secs.saturating_mul(100)
                ),
            ));
        }
        if self.fresh_secs > 86_400 || self.stale_secs > 7 * 86_400 || self.not_found_secs > 86_400
        {
            return Err(invalid(
                name,
                "fresh_secs and not_found_secs must be at most 86400, stale_secs at most 604800",
            ));
        }
        if self.l2_fresh_secs > 86_400
            || self.l2_stale_secs > 7 * 86_400
            || self.l2_not_found_secs > 86_400
        {
            return Err(invalid(
                name,
                "l2_fresh_secs and l2_not_found_secs must be at most 86400, l2_stale_secs at most 604800",
            ));
        }
        self.ttl_policy()
            .validate()
            .and_then(|()| self.l2_ttl_policy().validate())
            .map_err(|error| invalid(name, error.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn embedded_defaults_are_valid() {
        let settings = Settings::defaults().unwrap();
        assert_eq!(settings.http.listen.port(), 8080);
        let timeouts = settings.part_timeouts();
        assert_eq!(timeouts.product, Duration::from_millis(1000));
        assert_eq!(timeouts.coupons, Duration::from_millis(500));
        assert_eq!(timeouts.extras, Duration::from_millis(250));
    }

    #[test]
    fn cors_origins_are_checked_as_browsers_send_them() {
        let with = |origins: &[&str], credentials: bool| {
            let mut settings = Settings::defaults().unwrap();
            settings.http.cors.allowed_origins = origins.iter().map(|o| (*o).to_owned()).collect();
            settings.http.cors.allow_credentials = credentials;
            settings.validate()
        };
        for good in [
            &["https://h5.example.com"][..],
            &["http://localhost:3000", "https://a.b-c.example"],
            &["http://[::1]:8080", "http://127.0.0.1"],
            &["*"],
            &[],
        ] {
            assert!(with(good, false).is_ok(), "{good:?}");
        }
        for bad in [
            &["https://h5.example.com/"][..],
            &["https://H5.example.com"],
            &["h5.example.com"],
            &["https://h5.example.com/page"],
            &["https://h5.example.com:0"],
            &["https://h5.example.com:99999"],
            &["https://"],
            &["*", "https://a.example"],
        ] {
            let error = with(bad, false).unwrap_err().to_string();
            assert!(
                error.contains("http.cors.allowed_origins"),
                "{bad:?}: {error}"
            );
        }
        assert!(with(&["*"], true).is_err());
        assert!(with(&["https://a.example"], true).is_ok());
        let mut settings = Settings::defaults().unwrap();
        settings.http.cors.max_age_secs = 86_401;
        assert!(settings.validate().is_err());
    }

    fn load_file(contents: &str) -> Result<Settings, ConfigError> {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(contents.as_bytes()).unwrap();
        Settings::load(Some(file.path()))
    }

    #[test]
    fn redis_tls_needs_rediss_urls_readable_pem_files_and_whole_client_pairs() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let with = |url: &str, ca_file: &str, client_cert: &str| {
            let mut settings = Settings::defaults().unwrap();
            settings.redis.enabled = true;
            settings.redis.url = Secret::new(url.to_owned());
            settings.redis.tls.ca_file = ca_file.to_owned();
            settings.redis.tls.client_cert_file = client_cert.to_owned();
            settings.validate().map_err(|error| error.to_string())
        };
        let ca = ca.to_str().unwrap();
        assert!(with("rediss://cache:6380", ca, "").is_ok());
        let error = with("redis://cache:6379", ca, "").unwrap_err();
        assert!(
            error.contains("redis.url") && error.contains("rediss://"),
            "{error}"
        );
        let error = with("rediss://cache:6380", "/nowhere/ca.pem", "").unwrap_err();
        assert!(
            error.contains("redis.tls.ca_file") && error.contains("cannot read"),
            "{error}"
        );
        let error = with("rediss://cache:6380", ca, ca).unwrap_err();
        assert!(error.contains("redis.tls.client_key_file"), "{error}");
        // Without TLS files a rediss:// URL is fine: the system's roots check the server.
        assert!(with("rediss://cache:6380", "", "").is_ok());
    }

    #[test]
    fn a_file_overrides_only_what_it_names() {
        let settings =
            load_file("[timeouts]\nnormal_ms = 300\n[parts.extras]\ntimeout_ms = 100\n").unwrap();
        assert_eq!(settings.timeouts.normal_ms, 300);
        assert_eq!(settings.timeouts.core_ms, 1000);
        assert_eq!(settings.part_timeouts().coupons, Duration::from_millis(300));
        assert_eq!(settings.part_timeouts().extras, Duration::from_millis(100));
    }

    #[test]
    fn a_part_s_timeout_class_picks_its_timeout_and_the_former_key_is_refused_by_name() {
        let settings = load_file("[parts.coupons]\ntimeout_class = \"edge\"\n").unwrap();
        assert_eq!(settings.parts.coupons.timeout_class, TimeoutClass::Edge);
        assert_eq!(settings.part_timeouts().coupons, Duration::from_millis(250));
        let error = load_file("[parts.coupons]\ntier = \"edge\"\n").unwrap_err();
        let message = format!("{error:#}");
        assert!(
            message.contains("tier") && message.contains("timeout_class"),
            "{message}"
        );
    }

    #[test]
    fn the_version_gap_and_the_admin_throttle_are_checked_by_name() {
        let settings = Settings::defaults().unwrap();
        assert_eq!(settings.events.max_version_gap, 1_000_000);
        let observer = settings.events.observer_settings();
        assert_eq!(observer.max_version_gap, 1_000_000);
        assert_eq!(observer.fence_for, Duration::from_secs(60));
        let throttle =
            crate::http::admin_auth::ThrottleConfig::from_settings(&settings.admin.auth_throttle);
        assert_eq!(
            (throttle.max_failures, throttle.window, throttle.penalty),
            (10, Duration::from_secs(60), Duration::from_secs(60))
        );
        assert_eq!(throttle.tracked_peers, 4_096);
        for (file, field) in [
            ("[events]\nmax_version_gap = 0\n", "events.max_version_gap"),
            (
                "[admin.auth_throttle]\nmax_failures = 0\n",
                "admin.auth_throttle.max_failures",
            ),
            (
                "[admin.auth_throttle]\nwindow_secs = 0\n",
                "admin.auth_throttle.window_secs",
            ),
            (
                "[admin.auth_throttle]\npenalty_secs = 0\n",
                "admin.auth_throttle.penalty_secs",
            ),
            (
                "[admin.auth_throttle]\ntracked_peers = 2\n",
                "admin.auth_throttle.tracked_peers",
            ),
        ] {
            let error = load_file(file).unwrap_err().to_string();
            assert!(error.contains(field), "{file}: {error}");
        }
        let settings = load_file("[events]\nmax_version_gap = 1\n").unwrap();
        assert_eq!(settings.events.max_version_gap, 1);
    }

    #[test]
    fn the_drift_sampler_rate_is_bounded_and_zero_turns_it_off() {
        let defaults = Settings::defaults().unwrap();
        assert_eq!(defaults.events.observer_settings().drift_keys_per_sec, 20);
        let off = load_file("[events.observer]\ndrift_keys_per_sec = 0\n").unwrap();
        assert_eq!(off.events.observer_settings().drift_keys_per_sec, 0);
        let error = load_file("[events.observer]\ndrift_keys_per_sec = 10001\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("events.observer.drift_keys_per_sec")
                && error.contains("10001 is outside 0..=10000"),
            "{error}"
        );
    }

    #[test]
    fn unknown_keys_are_refused_with_their_name() {
        let error = load_file("[http]\nlisten_port = 1\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("listen_port"), "{error}");
    }

    #[test]
    fn bad_values_are_explained() {
        let error = load_file("[parts.coupons]\njitter_ratio = 0.9\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("parts.coupons") && error.contains("0.9"),
            "{error}"
        );
        let error = load_file("[http]\nrequest_timeout_ms = 100\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("http.request_timeout_ms"), "{error}");
        let error = load_file("[http]\nlisten_backlog = 8\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("http.listen_backlog") && error.contains("16..=65535"),
            "{error}"
        );
        let error = load_file("[parts.rate]\ntimeout_class = \"fast\"\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("fast"), "{error}");
        let error = load_file(
            "[events]\nbackend = \"amqp\"\nmax_age_secs = 60\n[events.amqp]\ncatch_up_window_ms = 120000\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("events.amqp.catch_up_window_ms") && error.contains("max_age_secs = 60"),
            "{error}"
        );
    }

    #[test]
    fn the_idle_timeout_s_shrinking_and_the_probe_slots_are_checked_by_name() {
        let error = load_file("[http]\nidle_shrink_from = 1.5\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("http.idle_shrink_from"), "{error}");
        let error = load_file("[http]\nidle_timeout_ms = 10000\nidle_timeout_floor_ms = 20000\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("http.idle_timeout_floor_ms") && error.contains("http.idle_timeout_ms"),
            "{error}"
        );
        let error = load_file("[admin]\nprobe_connections = 65\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("admin.probe_connections"), "{error}");
        let settings = load_file("[admin]\nprobe_connections = 2\n").unwrap();
        let admin = settings.admin_connection_limits();
        assert_eq!(admin.probe_slots, 2);
        assert_eq!(admin.probe_paths, ["/healthz", "/readyz"]);
        assert_eq!(settings.api_connection_limits().probe_slots, 0);
    }

    #[test]
    fn warmup_items_and_tier_settings_are_validated() {
        let settings = load_file("[warmup]\nitems = [\"jd:100001\", \"pdd:7\"]\n").unwrap();
        assert_eq!(settings.warmup_items().unwrap().len(), 2);
        let error = load_file("[warmup]\nitems = [\"jd-100001\"]\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("warmup.items") && error.contains("jd-100001"),
            "{error}"
        );
        let error = load_file("[warmup]\nitems = [\"ebay:1\"]\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("ebay"), "{error}");
        let error = load_file("[redis]\nlease_wait_ms = 5000\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("redis.lease_wait_ms"), "{error}");
        let error = load_file("[bloom]\nfalse_positive_rate = 0.5\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("bloom.false_positive_rate"), "{error}");
        let error = load_file("[parts.rate]\nl2_jitter_secs = 100000\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("parts.rate"), "{error}");
    }

    #[test]
    fn secrets_never_print() {
        let secret = Secret::new("mysql://root:hunter2@db/rebate");
        assert!(!format!("{secret:?}").contains("hunter2"));
        let mut settings = Settings::defaults().unwrap();
        settings.store.mysql.url = secret;
        assert!(!format!("{settings:?}").contains("hunter2"));
    }

    #[test]
    fn the_production_profile_needs_its_connection_strings() {
        let production = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/production.toml");
        let figment = Figment::from(Toml::string(DEFAULT_CONFIG)).merge(Toml::file(production));
        let error = Settings::from_figment(figment).unwrap_err().to_string();
        assert!(error.contains("DATABASE_URL"), "{error}");
    }

    #[test]
    fn a_missing_file_is_named() {
        let error = Settings::load(Some(Path::new("/nonexistent/rebate.toml")))
            .unwrap_err()
            .to_string();
        assert!(error.contains("/nonexistent/rebate.toml"), "{error}");
    }
}
