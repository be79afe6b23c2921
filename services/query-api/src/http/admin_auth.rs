//! The admin token check, and what it does about peers that keep failing it.
//!
//! Every request under `/admin/v1` passes `require_token`. A wrong or missing token is
//! answered 401, counted in `rebate_admin_auth_failures_total{reason}` and logged with the
//! peer's address (never the token, nor any part of it: the failure table is never handed it).
//! After `admin.auth_throttle.max_failures` wrong tokens from one peer, each less than
//! `window_secs` after the one before, every admin request from that peer is answered
//! `429 rate_limited` with `Retry-After` for `penalty_secs`, **without a look at its token**: a
//! right token sent during the penalty is refused too, so guessing cannot go on, and the
//! decision depends only on the count of earlier failures, never on how much of a token
//! matched (the compare itself is constant-time, `AdminToken::matches`). `/healthz`,
//! `/readyz`, `/metrics` and the dashboard are outside `/admin/v1` and never throttled.
//!
//! A peer is an IPv4 address, or an IPv6 address's /64 (a host commonly holds a whole /64, and
//! counting per address would let it rotate for free). The table of peers is bounded
//! (`tracked_peers`; when full, the peer seen least recently is forgotten), so an attacker with
//! many addresses cannot grow it; such an attacker gets `max_failures` guesses per address per
//! window, which the 128-bit token makes worthless. Behind a proxy every failure would count
//! against the proxy's address: keep the admin listener off proxies (and off the internet).
//!
//! Log lines are rate-limited twice: at most one per peer per [`LOG_INTERVAL`] (the next one
//! says how many were `suppressed` meanwhile), and at most [`MAX_LINES_PER_INTERVAL`] over all
//! peers; the throttling of a peer is always worth its line within the second budget. The
//! counter is exact whatever the log drops.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

use super::error::ApiError;
use crate::admin_token::AdminToken;
use crate::config::AuthThrottleSettings;

/// At most one log line per peer per this long.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// At most this many log lines per [`LOG_INTERVAL`] over all peers.
pub const MAX_LINES_PER_INTERVAL: u32 = 20;

/// `[admin.auth_throttle]`, as durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleConfig {
    pub max_failures: u32,
    pub window: Duration,
    pub penalty: Duration,
    pub tracked_peers: usize,
}

impl ThrottleConfig {
    pub fn from_settings(settings: &AuthThrottleSettings) -> Self {
        Self {
            max_failures: settings.max_failures,
            window: Duration::from_secs(settings.window_secs),
            penalty: Duration::from_secs(settings.penalty_secs),
            tracked_peers: settings.tracked_peers,
        }
    }
}

/// The token and the failures table, shared by every route behind the token.
#[derive(Debug, Clone)]
pub struct AdminAuth {
    token: AdminToken,
    failures: Arc<AuthFailures>,
}

impl AdminAuth {
    pub fn new(token: AdminToken, failures: Arc<AuthFailures>) -> Self {
        Self { token, failures }
    }
}

/// Why an admin request was refused: the `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// No `Authorization: Bearer` header (or not a readable one).
    Missing,
    /// A token that is not the admin token.
    Invalid,
    /// Refused unread: the peer is throttled.
    Throttled,
}

impl Reason {
    pub const ALL: [Reason; 3] = [Reason::Missing, Reason::Invalid, Reason::Throttled];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Missing => "missing",
            Reason::Invalid => "invalid",
            Reason::Throttled => "throttled",
        }
    }
}

/// Whom failures are counted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum PeerKey {
    V4(Ipv4Addr),
    /// The address's first 64 bits.
    V6Prefix(u64),
    /// No peer address reached the handler (never on a listener; only a test's `oneshot`).
    Unknown,
}

impl PeerKey {
    fn of(peer: Option<IpAddr>) -> Self {
        match peer.map(|address| address.to_canonical()) {
            Some(IpAddr::V4(address)) => PeerKey::V4(address),
            Some(IpAddr::V6(address)) => PeerKey::V6Prefix((address.to_bits() >> 64) as u64),
            None => PeerKey::Unknown,
        }
    }
}

/// The per-peer failure table and the failure counters. One per admin listener.
#[derive(Debug)]
pub struct AuthFailures {
    config: ThrottleConfig,
    table: Mutex<Table>,
    /// Indexed by `Reason as usize`.
    counts: [AtomicU64; Reason::ALL.len()],
}

/// What [`AuthFailures::stats`] reads for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthFailureStats {
    /// Refused admin requests by reason, in [`Reason::ALL`]'s order.
    pub by_reason: [u64; Reason::ALL.len()],
    /// Peers in the table now.
    pub tracked_peers: usize,
}

#[derive(Debug)]
struct Table {
    entries: HashMap<PeerKey, Entry>,
    /// Each entry's key by the tick it was last seen at: the first is the least recently seen.
    recency: BTreeMap<u64, PeerKey>,
    next_tick: u64,
    lines: LineBudget,
}

#[derive(Debug)]
struct Entry {
    /// Its key in `Table::recency`.
    tick: u64,
    /// Wrong tokens counted towards the throttle.
    failures: u32,
    last_failure: Option<Instant>,
    throttled_until: Option<Instant>,
    last_line: Option<Instant>,
    /// Lines not written for this peer since its last one.
    suppressed: u64,
}

/// The lines written over all peers in the current [`LOG_INTERVAL`].
#[derive(Debug, Default)]
struct LineBudget {
    interval_start: Option<Instant>,
    written: u32,
}

impl LineBudget {
    fn take(&mut self, now: Instant) -> bool {
        if self
            .interval_start
            .is_none_or(|start| now.duration_since(start) >= LOG_INTERVAL)
        {
            self.interval_start = Some(now);
            self.written = 0;
        }
        if self.written >= MAX_LINES_PER_INTERVAL {
            return false;
        }
        self.written += 1;
        true
    }
}

/// One log line, decided under the lock and written after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Line {
    peer: Option<IpAddr>,
    reason: Reason,
    /// Wrong tokens counted for the peer (`max_failures` when this line throttles it).
    failures: u32,
    /// Set when this failure throttled the peer.
    throttled_for: Option<Duration>,
    /// For a throttled request: how long until the peer is let through again.
    retry_after: Option<Duration>,
    suppressed: u64,
}

impl AuthFailures {
    pub fn new(config: ThrottleConfig) -> Arc<Self> {
        Arc::new(Self {
            config,
            table: Mutex::new(Table {
                entries: HashMap::new(),
                recency: BTreeMap::new(),
                next_tick: 0,
                lines: LineBudget::default(),
            }),
            counts: Default::default(),
        })
    }

    pub fn stats(&self) -> AuthFailureStats {
        let table = self.lock();
        AuthFailureStats {
            by_reason: self
                .counts
                .each_ref()
                .map(|count| count.load(Ordering::Relaxed)),
            tracked_peers: table.entries.len(),
        }
    }

    /// `Err(remaining penalty)` while `peer` is throttled (counted and maybe logged as a
    /// throttled refusal), else `Ok`. Called before the token is looked at.
    fn admit(&self, peer: Option<IpAddr>, now: Instant) -> Result<(), Duration> {
        let key = PeerKey::of(peer);
        let mut table = self.lock();
        let remaining = table
            .entries
            .get(&key)
            .and_then(|entry| entry.throttled_until)
            .and_then(|until| until.checked_duration_since(now))
            .filter(|remaining| !remaining.is_zero());
        let Some(remaining) = remaining else {
            return Ok(());
        };
        self.counts[Reason::Throttled as usize].fetch_add(1, Ordering::Relaxed);
        let line = table.line(key, peer, Reason::Throttled, now, false, self.config);
        drop(table);
        if let Some(mut line) = line {
            line.retry_after = Some(remaining);
            line.write();
        }
        Err(remaining)
    }

    /// Counts a refused token check from `peer`; a wrong token counts towards the throttle.
    fn record_failure(&self, peer: Option<IpAddr>, reason: Reason, now: Instant) {
        debug_assert_ne!(reason, Reason::Throttled, "throttled refusals are admit's");
        self.counts[reason as usize].fetch_add(1, Ordering::Relaxed);
        let key = PeerKey::of(peer);
        let config = self.config;
        let mut table = self.lock();
        let mut throttles = false;
        if reason == Reason::Invalid {
            let entry = table.touch(key, config.tracked_peers);
            let forgiven = entry
                .last_failure
                .is_none_or(|last| now.duration_since(last) >= config.window);
            if forgiven {
                entry.failures = 0;
            }
            entry.failures += 1;
            entry.last_failure = Some(now);
            if entry.failures >= config.max_failures {
                entry.throttled_until = Some(now + config.penalty);
                throttles = true;
            }
        }
        let line = table.line(key, peer, reason, now, throttles, config);
        if throttles && let Some(entry) = table.entries.get_mut(&key) {
            // The penalty starts the count again: after it, max_failures more guesses at most.
            entry.failures = 0;
        }
        drop(table);
        if let Some(line) = line {
            line.write();
        }
    }

    /// The right token: the peer's earlier failures are forgiven.
    fn record_success(&self, peer: Option<IpAddr>) {
        let key = PeerKey::of(peer);
        let mut table = self.lock();
        if let Some(entry) = table.entries.remove(&key) {
            table.recency.remove(&entry.tick);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // Every update leaves the table consistent: a panic elsewhere cannot have broken it.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Table {
    /// The peer's entry, made the most recently seen; a new one (forgetting the least recently
    /// seen peer when the table is full) if it had none.
    fn touch(&mut self, key: PeerKey, capacity: usize) -> &mut Entry {
        let tick = self.next_tick;
        self.next_tick += 1;
        if !self.entries.contains_key(&key)
            && self.entries.len() >= capacity
            && let Some((_, oldest)) = self.recency.pop_first()
        {
            self.entries.remove(&oldest);
        }
        let entry = self.entries.entry(key).or_insert(Entry {
            tick,
            failures: 0,
            last_failure: None,
            throttled_until: None,
            last_line: None,
            suppressed: 0,
        });
        self.recency.remove(&entry.tick);
        entry.tick = tick;
        self.recency.insert(tick, key);
        debug_assert!(self.entries.len() <= capacity.max(1));
        debug_assert_eq!(self.entries.len(), self.recency.len());
        self.entries
            .get_mut(&key)
            .expect("the entry was just inserted")
    }

    /// Whether this refusal gets a log line (and touches the peer's entry either way).
    fn line(
        &mut self,
        key: PeerKey,
        peer: Option<IpAddr>,
        reason: Reason,
        now: Instant,
        throttles: bool,
        config: ThrottleConfig,
    ) -> Option<Line> {
        let entry = self.touch(key, config.tracked_peers);
        let peer_due = entry
            .last_line
            .is_none_or(|last| now.duration_since(last) >= LOG_INTERVAL);
        let failures = entry.failures;
        if !(peer_due || throttles) || !self.lines.take(now) {
            if let Some(entry) = self.entries.get_mut(&key) {
                entry.suppressed += 1;
            }
            return None;
        }
        let entry = self.entries.get_mut(&key)?;
        entry.last_line = Some(now);
        let suppressed = std::mem::take(&mut entry.suppressed);
        Some(Line {
            peer,
            reason,
            failures,
            throttled_for: throttles.then_some(config.penalty),
            retry_after: None,
            suppressed,
        })
    }
}

impl Line {
    /// The line itself: the peer, the reason and counts; there is no token to write.
    fn write(self) {
        let peer = self.peer.map(|peer| peer.to_string());
        let peer = peer.as_deref().unwrap_or("unknown");
        if let Some(penalty) = self.throttled_for {
            tracing::warn!(
                peer,
                failures = self.failures,
                penalty_secs = penalty.as_secs(),
                suppressed = self.suppressed,
                "admin authentication throttled: too many wrong tokens from this peer"
            );
            return;
        }
        match self.reason {
            Reason::Missing => tracing::info!(
                peer,
                reason = self.reason.as_str(),
                suppressed = self.suppressed,
                "admin authentication failed: no bearer token"
            ),
            Reason::Invalid => tracing::warn!(
                peer,
                reason = self.reason.as_str(),
                failures = self.failures,
                suppressed = self.suppressed,
                "admin authentication failed: wrong token"
            ),
            Reason::Throttled => tracing::warn!(
                peer,
                reason = self.reason.as_str(),
                retry_after_secs = self.retry_after.map_or(0, retry_after_secs),
                suppressed = self.suppressed,
                "admin request refused: the peer is throttled"
            ),
        }
    }
}

/// Whole seconds, rounded up (a client told 0 would retry at once).
fn retry_after_secs(remaining: Duration) -> u32 {
    let seconds = remaining.as_secs() + u64::from(remaining.subsec_nanos() > 0);
    u32::try_from(seconds.max(1)).unwrap_or(u32::MAX)
}

/// The gate of every route under `/admin/v1`: a throttled peer is refused before its token is
/// read; otherwise the token is compared in constant time, and a refusal counted.
pub(super) async fn require_token(
    State(auth): State<AdminAuth>,
    request: Request,
    next: Next,
) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| peer.ip());
    let now = Instant::now();
    if let Err(remaining) = auth.failures.admit(peer, now) {
        return ApiError::RateLimited {
            retry_after_secs: retry_after_secs(remaining),
        }
        .into_response();
    }
    let offered = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|value| bearer_token(value.as_bytes()));
    let reason = match offered {
        Some(Some(offered)) if auth.token.matches(offered) => {
            auth.failures.record_success(peer);
            return next.run(request).await;
        }
        Some(Some(_)) => Reason::Invalid,
        // A header that is no bearer token guesses nothing.
        Some(None) | None => Reason::Missing,
    };
    auth.failures.record_failure(peer, reason, now);
    ApiError::Unauthorized {
        token_offered: offered.is_some(),
    }
    .into_response()
}

/// The token of an `Authorization: Bearer <token>` value. The scheme is case-insensitive
/// (RFC 9110 §11.1); one or more spaces separate it from the token, which must not be empty.
fn bearer_token(value: &[u8]) -> Option<&str> {
    let value = std::str::from_utf8(value).ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use axum::Router;
    use axum::body::Body;
    use axum::http::StatusCode;
    use axum::routing::get;
    use rebate_domain::ErrorCode;
    use tower::ServiceExt;

    use super::*;
    use crate::http::ErrorBody;
    use crate::test_log::CapturedLines;

    const TOKEN: &str = "the-admin-token-0123456789abcdef";

    fn config(max_failures: u32) -> ThrottleConfig {
        ThrottleConfig {
            max_failures,
            window: Duration::from_secs(60),
            penalty: Duration::from_secs(60),
            tracked_peers: 64,
        }
    }

    /// A route behind the token, as `/admin/v1`'s are.
    fn app(failures: &Arc<AuthFailures>) -> Router {
        let auth = AdminAuth::new(AdminToken::new(TOKEN), Arc::clone(failures));
        Router::new()
            .route("/admin/v1/status", get(|| async { "ok" }))
            .layer(axum::middleware::from_fn_with_state(auth, require_token))
    }

    async fn call(app: &Router, peer: &str, token: Option<&str>) -> Response {
        let mut request = Request::builder().uri("/admin/v1/status");
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let mut request = request.body(Body::empty()).expect("a request");
        let address: IpAddr = peer.parse().expect("an address");
        request
            .extensions_mut()
            .insert(ConnectInfo(SocketAddr::new(address, 40_000)));
        app.clone().oneshot(request).await.expect("infallible")
    }

    async fn status(app: &Router, peer: &str, token: Option<&str>) -> StatusCode {
        call(app, peer, token).await.status()
    }

    fn retry_after(response: &Response) -> Option<&str> {
        response
            .headers()
            .get(header::RETRY_AFTER)
            .map(|value| value.to_str().expect("ascii"))
    }

    fn counts(failures: &AuthFailures) -> [u64; 3] {
        failures.stats().by_reason
    }

    #[tokio::test(start_paused = true)]
    async fn wrong_tokens_are_refused_then_the_peer_is_throttled_even_with_the_right_one() {
        let failures = AuthFailures::new(config(3));
        let app = app(&failures);
        for _ in 0..3 {
            assert_eq!(
                status(&app, "192.0.2.1", Some("guess")).await,
                StatusCode::UNAUTHORIZED
            );
        }
        let throttled = call(&app, "192.0.2.1", Some(TOKEN)).await;
        assert_eq!(throttled.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry_after(&throttled), Some("60"));
        let body = throttled
            .extensions()
            .get::<ErrorBody>()
            .expect("an error body");
        assert_eq!(body.code, ErrorCode::RateLimited);
        // A missing token from the throttled peer is refused unread too.
        assert_eq!(
            status(&app, "192.0.2.1", None).await,
            StatusCode::TOO_MANY_REQUESTS
        );
        // Another peer is not.
        assert_eq!(status(&app, "192.0.2.2", Some(TOKEN)).await, StatusCode::OK);
        // missing, invalid, throttled
        assert_eq!(counts(&failures), [0, 3, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_counts_down_and_the_penalty_ends() {
        let failures = AuthFailures::new(config(1));
        let app = app(&failures);
        assert_eq!(
            status(&app, "192.0.2.1", Some("guess")).await,
            StatusCode::UNAUTHORIZED
        );
        tokio::time::advance(Duration::from_millis(59_500)).await;
        let throttled = call(&app, "192.0.2.1", Some(TOKEN)).await;
        assert_eq!(throttled.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry_after(&throttled), Some("1"), "rounded up, never 0");
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(status(&app, "192.0.2.1", Some(TOKEN)).await, StatusCode::OK);
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_stops_failing_is_forgiven_after_the_window() {
        let failures = AuthFailures::new(config(3));
        let app = app(&failures);
        for peer in ["192.0.2.1", "192.0.2.9"] {
            for _ in 0..2 {
                status(&app, peer, Some("guess")).await;
            }
        }
        // A failure within the window of the one before counts on: the third throttles.
        tokio::time::advance(Duration::from_secs(59)).await;
        status(&app, "192.0.2.9", Some("guess")).await;
        assert_eq!(
            status(&app, "192.0.2.9", Some(TOKEN)).await,
            StatusCode::TOO_MANY_REQUESTS
        );
        // A window after its last failure, 192.0.2.1 starts again: two more are not enough.
        tokio::time::advance(Duration::from_secs(1)).await;
        for _ in 0..2 {
            assert_eq!(
                status(&app, "192.0.2.1", Some("guess")).await,
                StatusCode::UNAUTHORIZED
            );
        }
        assert_eq!(status(&app, "192.0.2.1", Some(TOKEN)).await, StatusCode::OK);
    }

    #[tokio::test(start_paused = true)]
    async fn the_right_token_forgives_earlier_failures() {
        let failures = AuthFailures::new(config(3));
        let app = app(&failures);
        for _ in 0..2 {
            status(&app, "192.0.2.1", Some("guess")).await;
        }
        assert_eq!(status(&app, "192.0.2.1", Some(TOKEN)).await, StatusCode::OK);
        for _ in 0..2 {
            status(&app, "192.0.2.1", Some("guess")).await;
        }
        assert_eq!(status(&app, "192.0.2.1", Some(TOKEN)).await, StatusCode::OK);
        assert_eq!(
            failures.stats().tracked_peers,
            0,
            "forgiven peers are forgotten"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn missing_tokens_are_counted_but_guess_nothing_and_never_throttle() {
        let failures = AuthFailures::new(config(2));
        let app = app(&failures);
        for _ in 0..10 {
            assert_eq!(
                status(&app, "192.0.2.1", None).await,
                StatusCode::UNAUTHORIZED
            );
        }
        assert_eq!(status(&app, "192.0.2.1", Some(TOKEN)).await, StatusCode::OK);
        assert_eq!(counts(&failures), [10, 0, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_ipv6_peer_is_its_64_and_mapped_ipv4_is_ipv4() {
        let failures = AuthFailures::new(config(2));
        let app = app(&failures);
        status(&app, "2001:db8:1:2::1", Some("guess")).await;
        status(&app, "2001:db8:1:2:ffff::7", Some("guess")).await;
        assert_eq!(
            status(&app, "2001:db8:1:2::99", Some(TOKEN)).await,
            StatusCode::TOO_MANY_REQUESTS,
            "the same /64"
        );
        assert_eq!(
            status(&app, "2001:db8:1:3::1", Some(TOKEN)).await,
            StatusCode::OK,
            "another /64"
        );
        status(&app, "192.0.2.5", Some("guess")).await;
        status(&app, "::ffff:192.0.2.5", Some("guess")).await;
        assert_eq!(
            status(&app, "192.0.2.5", Some(TOKEN)).await,
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            PeerKey::of(Some(IpAddr::V6(Ipv6Addr::LOCALHOST))),
            PeerKey::V6Prefix(0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_stays_bounded_under_many_peers_and_keeps_the_active_ones() {
        let failures = AuthFailures::new(ThrottleConfig {
            tracked_peers: 16,
            ..config(2)
        });
        let app = app(&failures);
        // An attacker throttled on one address...
        for _ in 0..2 {
            status(&app, "198.51.100.1", Some("guess")).await;
        }
        // ... keeps trying while 10,000 other addresses fail once each.
        for index in 0..10_000u32 {
            let peer = Ipv4Addr::from(0x0a00_0000 + index).to_string();
            status(&app, &peer, Some("guess")).await;
            assert!(failures.stats().tracked_peers <= 16);
            if index % 8 == 0 {
                assert_eq!(
                    status(&app, "198.51.100.1", Some(TOKEN)).await,
                    StatusCode::TOO_MANY_REQUESTS,
                    "after {index} other peers"
                );
            }
        }
        assert_eq!(failures.stats().tracked_peers, 16);
        let table = failures.lock();
        assert_eq!(table.entries.len(), table.recency.len());
    }

    #[tokio::test(start_paused = true)]
    async fn log_lines_name_the_peer_never_the_token_and_are_rate_limited_per_peer() {
        let (captured, _guard) = CapturedLines::start();
        let failures = AuthFailures::new(config(1_000));
        let app = app(&failures);
        let guess = "s3cret-guess-FEDCBA9876543210";
        for _ in 0..5 {
            status(&app, "192.0.2.77", Some(guess)).await;
        }
        let lines = captured.containing("admin authentication failed");
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("peer=192.0.2.77"), "{lines:?}");
        assert!(lines[0].contains("reason=invalid"), "{lines:?}");
        assert!(lines[0].contains("suppressed=0"), "{lines:?}");

        tokio::time::advance(LOG_INTERVAL).await;
        status(&app, "192.0.2.77", Some(guess)).await;
        let lines = captured.containing("admin authentication failed");
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[1].contains("suppressed=4"), "{lines:?}");
        assert!(lines[1].contains("failures=6"), "{lines:?}");

        for line in captured.lines() {
            for secret in [guess, &guess[..8], TOKEN, &TOKEN[..8]] {
                assert!(!line.contains(secret), "{secret:?} in {line:?}");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn throttling_is_logged_and_the_lines_of_all_peers_are_capped() {
        let (captured, _guard) = CapturedLines::start();
        let failures = AuthFailures::new(config(2));
        let app = app(&failures);
        status(&app, "192.0.2.1", Some("guess")).await;
        // Within the peer's interval, but the throttling has its line.
        status(&app, "192.0.2.1", Some("guess")).await;
        let throttled = captured.containing("admin authentication throttled");
        assert_eq!(throttled.len(), 1, "{:?}", captured.lines());
        assert!(throttled[0].contains("peer=192.0.2.1"), "{throttled:?}");
        assert!(throttled[0].contains("penalty_secs=60"), "{throttled:?}");
        // Its refusals are logged once per interval of the peer's: none right after the
        // throttling's line, then one saying how many were not.
        for _ in 0..3 {
            status(&app, "192.0.2.1", Some(TOKEN)).await;
        }
        assert!(captured.containing("the peer is throttled").is_empty());
        tokio::time::advance(LOG_INTERVAL).await;
        for _ in 0..3 {
            status(&app, "192.0.2.1", Some(TOKEN)).await;
        }
        let refused = captured.containing("the peer is throttled");
        assert_eq!(refused.len(), 1, "{:?}", captured.lines());
        assert!(refused[0].contains("retry_after_secs=50"), "{refused:?}");
        assert!(refused[0].contains("suppressed=3"), "{refused:?}");
        assert_eq!(counts(&failures)[Reason::Throttled as usize], 6);

        tokio::time::advance(LOG_INTERVAL).await;
        let before = captured.lines().len();
        for index in 0..50u32 {
            let peer = Ipv4Addr::from(0x0a00_0000 + index).to_string();
            status(&app, &peer, Some("guess")).await;
        }
        assert_eq!(
            captured.lines().len() - before,
            MAX_LINES_PER_INTERVAL as usize
        );
        assert_eq!(counts(&failures)[Reason::Invalid as usize], 52);
    }
}
