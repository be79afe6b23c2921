//! The edge's protection: the per-client limit (429) and the load shedder's admission, which
//! stamps every request with the level it is served at.
//!
//! A request of a class that may wait (`[resilience.admission_wait]`) is not refused while the
//! service is over its limit — its class refused at the shed level, or in-flight at the
//! concurrency limit — but waits in its class's bounded [`AdmissionQueue`] for at most its
//! class's wait, and is admitted in class order as capacity frees: every admitted request's end
//! notifies the queue. A full queue or a spent wait is the same 503 `overloaded`, with a
//! jittered `Retry-After`, as a shed request. Page requests never consult the queue, so they
//! never wait behind deferrable ones.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use rebate_resilience::{
    Admission, AdmissionQueue, AdmissionTicket, KeyedLimiter, LoadShedder, RequestClass, ShedLevel,
    WaitOutcome,
};

use super::error::ApiError;
use super::routes::BATCH_ROUTE;
use crate::protection::Protection;

/// Who the client says it is: a per-app or per-device id. Without it, the peer address is used.
pub const CLIENT_ID_HEADER: HeaderName = HeaderName::from_static("x-client-id");
const FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// Set on responses served while shedding (level ≥ 1), so clients and load tests can see it.
pub const SHED_LEVEL_HEADER: HeaderName = HeaderName::from_static("x-shed-level");
/// W3C Server Timing: on a request that queued for admission, `admission;desc=OUTCOME;dur=MS`.
pub const SERVER_TIMING_HEADER: HeaderName = HeaderName::from_static("server-timing");
/// Lowers a request's class (`page`, `list`, `prefetch`): what gives way first when shedding.
pub const REQUEST_CLASS_HEADER: HeaderName = HeaderName::from_static("x-request-class");

const MAX_CLIENT_ID_LEN: usize = 64;

/// The peer's address, from the connection (absent for an in-process call).
pub(super) fn peer_of(request: &Request) -> Option<IpAddr> {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| peer.ip())
}

/// One token bucket per client: `Err` with the 429 (and `Retry-After`) when over the limit, or
/// the 400 for a malformed client id.
pub(super) async fn limit_client(
    protection: &Protection,
    headers: &HeaderMap,
    peer: Option<IpAddr>,
) -> Result<(), Response> {
    let Some(clients) = &protection.clients else {
        return Ok(());
    };
    let key = client_key(headers, peer, clients.trusted_proxy_hops)
        .map_err(IntoResponse::into_response)?;
    clients
        .limiter
        .try_acquire(key.as_str())
        .await
        .map_err(rate_limited)
}

/// [`limit_client`] without a future, on this instance's buckets ([`ClientBuckets::instance`]).
///
/// [`ClientBuckets::instance`]: crate::protection::ClientBuckets::instance
pub(super) fn limit_client_now(
    limiter: &KeyedLimiter,
    trusted_proxy_hops: u32,
    headers: &HeaderMap,
    peer: Option<IpAddr>,
) -> Result<(), ApiError> {
    let key = client_key(headers, peer, trusted_proxy_hops)?;
    limiter
        .try_acquire(key.as_str())
        .map_err(|exceeded| rate_limited_error(exceeded.retry_after))
}

/// The 429 for a client that may try again after `retry_after`.
fn rate_limited(retry_after: Duration) -> Response {
    rate_limited_error(retry_after).into_response()
}

fn rate_limited_error(retry_after: Duration) -> ApiError {
    // Whole seconds, rounded up: a client that waits Retry-After finds a token.
    let nanos = retry_after.as_nanos();
    let retry_after_secs = u32::try_from(nanos.div_ceil(1_000_000_000))
        .unwrap_or(u32::MAX)
        .max(1);
    ApiError::RateLimited { retry_after_secs }
}

/// The limiter key: `id:<x-client-id>` when the header is present, else `ip:<address>` (from
/// `X-Forwarded-For` only behind `trusted_hops` trusted proxies).
fn client_key(
    headers: &HeaderMap,
    peer: Option<IpAddr>,
    trusted_hops: u32,
) -> Result<ClientKey, ApiError> {
    if let Some(value) = headers.get(CLIENT_ID_HEADER) {
        // Checked as bytes: the allowed characters are ASCII, so no separate UTF-8 check.
        let id = value.as_bytes();
        if !valid_client_id(id) {
            return Err(ApiError::InvalidClientId(format!(
                "x-client-id must be 1–{MAX_CLIENT_ID_LEN} characters of letters, digits, '.', '_', ':' or '-'"
            )));
        }
        return Ok(ClientKey::new(b"id:", |rest| {
            rest[..id.len()].copy_from_slice(id);
            id.len()
        }));
    }
    let address = forwarded_client(headers, trusted_hops).or(peer);
    Ok(ClientKey::new(b"ip:", |rest| {
        let capacity = rest.len();
        let mut cursor = &mut rest[..];
        // An address is at most 39 characters (IPv6); the buffer holds 64.
        let written = match address {
            Some(address) => std::io::Write::write_fmt(&mut cursor, format_args!("{address}")),
            // No connection info (an in-process call): everyone shares one bucket.
            None => std::io::Write::write_all(&mut cursor, b"unknown"),
        };
        debug_assert!(written.is_ok());
        capacity - cursor.len()
    }))
}

/// A limiter key on the stack (every request builds one): a three-byte prefix and at most
/// [`MAX_CLIENT_ID_LEN`] bytes of ASCII.
struct ClientKey {
    bytes: [u8; 3 + MAX_CLIENT_ID_LEN],
    len: usize,
}

impl ClientKey {
    /// `prefix`, then what `fill` writes into the rest of the buffer (it returns how much).
    fn new(prefix: &[u8; 3], fill: impl FnOnce(&mut [u8]) -> usize) -> Self {
        let mut bytes = [0u8; 3 + MAX_CLIENT_ID_LEN];
        bytes[..3].copy_from_slice(prefix);
        let len = 3 + fill(&mut bytes[3..]);
        Self { bytes, len }
    }

    fn as_str(&self) -> &str {
        // Only ASCII is written: a prefix, a validated id or an address.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or("ip:unknown")
    }
}

impl std::fmt::Debug for ClientKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

impl PartialEq<&str> for ClientKey {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

fn valid_client_id(id: &[u8]) -> bool {
    (1..=MAX_CLIENT_ID_LEN).contains(&id.len())
        && id
            .iter()
            .all(|&byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b':' | b'-'))
}

/// The address `trusted_hops` places from the right of `X-Forwarded-For`: each trusted proxy
/// appends the address it received the request from, so entries further left are the client's
/// own claims and cannot be trusted.
fn forwarded_client(headers: &HeaderMap, trusted_hops: u32) -> Option<IpAddr> {
    if trusted_hops == 0 {
        return None;
    }
    let hops = usize::try_from(trusted_hops).ok()?;
    let mut entries: Vec<&str> = Vec::new();
    for value in headers.get_all(FORWARDED_FOR) {
        entries.extend(value.to_str().ok()?.split(',').map(str::trim));
    }
    let index = entries.len().checked_sub(hops)?;
    entries.get(index)?.parse().ok()
}

/// Admits the request through the load shedder and records the level it is served at (an
/// extension for the handlers, `x-shed-level` on the response when shedding). The level is its
/// class's at the measured level ([`RequestClass::served_at`]): lower classes are served as if
/// the load were higher, and a prefetch is refused (503 `overloaded`) from level 2. The class
/// goes on the response for the trace layer and the metrics. A class that may wait waits
/// ([`admit_or_wait`]) instead of being refused while the service is over its limit.
pub(super) async fn admit<Run, Answer>(
    protection: &Protection,
    mut request: Request,
    run: Run,
) -> Response
where
    Run: FnOnce(Request) -> Answer,
    Answer: Future<Output = Response>,
{
    let class = match request_class(request.uri().path(), request.headers()) {
        Ok(class) => class,
        Err(error) => return error.into_response(),
    };
    let admitted = if may_wait(protection, class) {
        admit_or_wait(protection, class).await
    } else {
        Admitted::begin(protection, class)
    };
    let mut response = match admitted {
        Ok(admitted) => {
            request.extensions_mut().insert(admitted.level);
            let response = run(request).await;
            admitted.finish(response)
        }
        Err(refused) => refused.into_response(),
    };
    response.extensions_mut().insert(class);
    response
}

/// Whether a request of `class` would wait for its admission now rather than be admitted (or
/// refused) at once: its class waits, and someone of its class or a higher one already waits or
/// the service is over its limit for it. The hot path hands such a request to the general path,
/// which waits; for a class that does not wait this is one branch.
pub(super) fn would_wait(protection: &Protection, class: RequestClass) -> bool {
    let (Some(queue), Some(shedder)) = (&protection.admission_queue, &protection.shedder) else {
        return false;
    };
    // The level as it stands: no evaluation here, the hot path's checks have no effect.
    queue.may_wait(class) && (queue.ahead(class) || !within_limit(shedder.level(), shedder, class))
}

fn may_wait(protection: &Protection, class: RequestClass) -> bool {
    protection
        .admission_queue
        .as_ref()
        .is_some_and(|queue| queue.may_wait(class))
}

/// A request of `class` is within the limit: its class is served at the level (re-evaluated
/// when due, so a service whose only traffic waits still sees its level fall) and fewer
/// requests are in flight than the concurrency limit allows. Checked before admitting, so that
/// a waiter's failed tries do not count as requests served.
fn admissible_now(shedder: &LoadShedder, class: RequestClass) -> bool {
    within_limit(shedder.evaluated_level(), shedder, class)
}

fn within_limit(level: ShedLevel, shedder: &LoadShedder, class: RequestClass) -> bool {
    class.served_at(level).is_some() && shedder.has_room()
}

/// How a request that queued for admission left the queue, and after how long: the
/// `Server-Timing` of its response, so a client (and the load harness) sees its wait.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Queued {
    outcome: WaitOutcome,
    waited: Duration,
}

impl Queued {
    /// `admission;desc=admitted;dur=12.345` (milliseconds, three decimals).
    fn header(self) -> HeaderValue {
        let value = format!(
            "admission;desc={};dur={:.3}",
            self.outcome.as_str(),
            self.waited.as_secs_f64() * 1e3
        );
        HeaderValue::try_from(value).expect("an outcome name and a number are a header value")
    }
}

/// `Server-Timing` on the response of a request that queued for admission.
fn stamp_queued(queued: Option<Queued>, mut response: Response) -> Response {
    if let Some(queued) = queued {
        response
            .headers_mut()
            .append(SERVER_TIMING_HEADER, queued.header());
    }
    response
}

/// The admission of a request whose class may wait: admitted at once when nobody of its class
/// or above waits and it is within the limit; otherwise it joins its class's queue and, each
/// time it is its turn (the head of the queue, capacity possibly freed), tries again — until it
/// is admitted, or its class's wait runs out (503). A full queue is a 503 at once. Dropping the
/// future (the client went away) leaves the queue and counts as cancelled. The wait, when there
/// was one, is a stage of the request's timeline (`admission`, with its outcome).
async fn admit_or_wait(
    protection: &Protection,
    class: RequestClass,
) -> Result<Admitted<'_>, Refused> {
    let (Some(queue), Some(shedder)) = (&protection.admission_queue, &protection.shedder) else {
        return Admitted::begin(protection, class);
    };
    if !queue.ahead(class)
        && let Some(admitted) = try_admit(protection, shedder, class)
    {
        return Ok(admitted);
    }
    let started = tokio::time::Instant::now();
    let mut waiter = match queue.join(class) {
        Ok(waiter) => waiter,
        Err(full) => {
            tracing::debug!(%full, "admission queue full");
            rebate_telemetry::record_stage("admission", class.as_str(), "full", started, None);
            return Err(refusal(
                protection,
                shedder,
                WaitOutcome::Full,
                Duration::ZERO,
            ));
        }
    };
    let admitted = {
        let turns = async {
            loop {
                waiter.turn().await;
                if let Some(admitted) = try_admit(protection, shedder, class) {
                    return admitted;
                }
            }
        };
        tokio::time::timeout(queue.max_wait(class), turns).await
    };
    match admitted {
        Ok(mut admitted) => {
            let waited = waiter.admitted();
            rebate_telemetry::record_stage("admission", class.as_str(), "waited", started, None);
            admitted.queued = Some(Queued {
                outcome: WaitOutcome::Admitted,
                waited,
            });
            Ok(admitted)
        }
        Err(_elapsed) => {
            let waited = waiter.timed_out();
            rebate_telemetry::record_stage("admission", class.as_str(), "timed_out", started, None);
            Err(refusal(protection, shedder, WaitOutcome::TimedOut, waited))
        }
    }
}

/// Admits a request of a class that may wait when it is within the limit ([`admissible_now`]).
fn try_admit<'a>(
    protection: &'a Protection,
    shedder: &'a LoadShedder,
    class: RequestClass,
) -> Option<Admitted<'a>> {
    if !admissible_now(shedder, class) {
        return None;
    }
    let admission = shedder.admit();
    // The level may have risen since the check (this admission evaluated it): refused after
    // all, the admission is undone and the waiter keeps its place for its next turn.
    let level = class.served_at(admission.level())?;
    Some(Admitted {
        level,
        admission: Some(admission),
        waiters: Waiters(protection.admission_queue.as_ref()),
        queued: None,
    })
}

/// The 503 for a request whose queue was full or whose wait ran out.
fn refusal(
    protection: &Protection,
    shedder: &LoadShedder,
    outcome: WaitOutcome,
    waited: Duration,
) -> Refused {
    Refused {
        measured: shedder.level(),
        retry_after_secs: protection.shed_retry_after(),
        queued: Some(Queued { outcome, waited }),
    }
}

/// A request the shedder let in, until its response: [`admit`] in two halves, for callers that
/// answer without a future (the edge's hot path) as well.
pub(super) struct Admitted<'a> {
    /// The level the request is served at.
    pub(super) level: ShedLevel,
    /// Counts the request in flight until dropped (`None` when shedding is off).
    admission: Option<Admission<'a>>,
    /// Told when the request ends (after `admission`, which it follows in drop order).
    waiters: Waiters<'a>,
    /// How its wait went, when it queued (only [`admit_or_wait`] sets it).
    queued: Option<Queued>,
}

/// Notifies the admission queue, if any, when dropped: the request that held it is no longer
/// in flight, so a waiter may take its place.
struct Waiters<'a>(Option<&'a AdmissionQueue>);

impl Drop for Waiters<'_> {
    fn drop(&mut self) {
        if let Some(queue) = self.0 {
            queue.notify();
        }
    }
}

impl<'a> Admitted<'a> {
    /// The shedder's answer for a request of `class`: admitted at a level, or refused when its
    /// class is not served now.
    pub(super) fn begin(protection: &'a Protection, class: RequestClass) -> Result<Self, Refused> {
        let admission = protection.shedder.as_ref().map(LoadShedder::admit);
        let measured = admission
            .as_ref()
            .map_or(ShedLevel::Normal, Admission::level);
        match class.served_at(measured) {
            Some(level) => Ok(Self {
                level,
                admission,
                waiters: Waiters(protection.admission_queue.as_ref()),
                queued: None,
            }),
            None => {
                drop(admission);
                protection.count_refused(class);
                Err(Refused {
                    measured,
                    retry_after_secs: protection.shed_retry_after(),
                    queued: None,
                })
            }
        }
    }

    /// The response with the level it was served at, when shedding, and its wait, when it
    /// queued; the request is no longer in flight.
    pub(super) fn finish(self, response: Response) -> Response {
        let Self {
            level,
            admission,
            waiters,
            queued,
        } = self;
        let response = stamp_queued(queued, stamp_level(level, response));
        drop(admission);
        drop(waiters);
        response
    }

    /// The same admission, owning its shedder's handle, for work that continues in a future of
    /// its own.
    pub(super) fn into_owned(self, protection: Arc<Protection>) -> OwnedAdmitted {
        let Self {
            level,
            admission,
            mut waiters,
            queued,
        } = self;
        debug_assert!(
            queued.is_none(),
            "the hot path takes no request that would wait"
        );
        // Still in flight: the owned admission notifies when it ends.
        waiters.0 = None;
        OwnedAdmitted {
            level,
            ticket: admission.map(Admission::into_ticket),
            protection,
        }
    }
}

/// A request the shedder refused: the 503 (with `Retry-After` and the measured level).
#[derive(Debug)]
pub(super) struct Refused {
    measured: ShedLevel,
    retry_after_secs: u32,
    /// How its wait went, when it queued.
    queued: Option<Queued>,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let mut response = ApiError::Overloaded {
            retry_after_secs: self.retry_after_secs,
        }
        .into_response();
        response.headers_mut().insert(
            SHED_LEVEL_HEADER,
            HeaderValue::from(u16::from(self.measured.as_u8())),
        );
        stamp_queued(self.queued, response)
    }
}

/// An [`Admitted`] that owns its handle on the shedder: still in flight until finished or
/// dropped (a request whose client went away ends here too).
pub(super) struct OwnedAdmitted {
    pub(super) level: ShedLevel,
    ticket: Option<AdmissionTicket>,
    protection: Arc<Protection>,
}

impl OwnedAdmitted {
    /// As [`Admitted::finish`].
    pub(super) fn finish(self, response: Response) -> Response {
        stamp_level(self.level, response)
    }
}

impl Drop for OwnedAdmitted {
    fn drop(&mut self) {
        if let (Some(ticket), Some(shedder)) = (self.ticket.take(), &self.protection.shedder) {
            shedder.complete(ticket);
            self.protection.notify_waiters();
        }
    }
}

/// `x-shed-level` on a response served while shedding.
fn stamp_level(level: ShedLevel, mut response: Response) -> Response {
    if level != ShedLevel::Normal {
        response.headers_mut().insert(
            SHED_LEVEL_HEADER,
            HeaderValue::from(u16::from(level.as_u8())),
        );
    }
    response
}

/// The request's class: its route's (the batch route serves a list page, every other route an
/// item page), lowered by an `x-request-class` header — never raised: a client cannot buy
/// priority by claiming it.
pub(super) fn request_class(path: &str, headers: &HeaderMap) -> Result<RequestClass, ApiError> {
    let route = if path == BATCH_ROUTE {
        RequestClass::List
    } else {
        RequestClass::Page
    };
    let Some(value) = headers.get(REQUEST_CLASS_HEADER) else {
        return Ok(route);
    };
    let claimed = value
        .to_str()
        .ok()
        .and_then(RequestClass::parse)
        .ok_or_else(|| {
            ApiError::InvalidRequestClass(
                "x-request-class must be one of page, list or prefetch".to_owned(),
            )
        })?;
    Ok(claimed.min(route))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        headers
    }

    const PEER: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 9)));

    #[test]
    fn the_client_id_wins_over_the_address() {
        let key = client_key(&headers(&[("x-client-id", "app-ios:7.2")]), PEER, 0).unwrap();
        assert_eq!(key, "id:app-ios:7.2");
        assert_eq!(client_key(&headers(&[]), PEER, 0).unwrap(), "ip:10.0.0.9");
    }

    #[test]
    fn malformed_client_ids_are_refused() {
        for bad in ["", "has space", "汉字", &"x".repeat(65)] {
            let mut map = HeaderMap::new();
            if let Ok(value) = HeaderValue::from_str(bad) {
                map.insert(CLIENT_ID_HEADER, value);
                assert!(
                    matches!(client_key(&map, PEER, 0), Err(ApiError::InvalidClientId(_))),
                    "{bad:?}"
                );
            }
        }
    }

    #[test]
    fn forwarded_for_is_read_only_behind_trusted_proxies() {
        let map = headers(&[("x-forwarded-for", "1.1.1.1, 203.0.113.7")]);
        // Not trusted: a client could write anything there.
        assert_eq!(client_key(&map, PEER, 0).unwrap(), "ip:10.0.0.9");
        // One trusted proxy appended the address it saw: the rightmost entry.
        assert_eq!(client_key(&map, PEER, 1).unwrap(), "ip:203.0.113.7");
        assert_eq!(client_key(&map, PEER, 2).unwrap(), "ip:1.1.1.1");
        // More hops than entries, or garbage: fall back to the peer.
        assert_eq!(client_key(&map, PEER, 3).unwrap(), "ip:10.0.0.9");
        let garbage = headers(&[("x-forwarded-for", "not-an-ip")]);
        assert_eq!(client_key(&garbage, PEER, 1).unwrap(), "ip:10.0.0.9");
    }
}

#[cfg(test)]
mod wait_tests {
    use std::pin::pin;
    use std::task::Poll;
    use std::time::Duration;

    use futures::FutureExt;
    use rebate_resilience::{ClassQueueSnapshot, ManualTicker};

    use super::*;
    use crate::protection::DependencyTimeouts;

    /// A protection whose concurrency limit is one request, with prefetches waiting (at most
    /// two, for at most 250 ms) and lists not.
    fn one_slot() -> Arc<Protection> {
        let mut settings = crate::Settings::defaults().expect("embedded defaults");
        let shedding = &mut settings.resilience.shedding;
        (
            shedding.max_in_flight,
            shedding.min_in_flight,
            shedding.adaptive,
        ) = (1, 1, false);
        let wait = &mut settings.resilience.admission_wait;
        (wait.prefetch_max_waiters, wait.prefetch_max_wait_ms) = (2, 250);
        wait.list_max_waiters = 0;
        settings.validate().unwrap();
        let second = Duration::from_secs(1);
        Arc::new(Protection::new(
            &settings.resilience,
            DependencyTimeouts {
                mysql: second,
                coupons: second,
                extras: second,
            },
            Arc::new(ManualTicker::new()),
            None,
            None,
        ))
    }

    /// Polls `future` once: its output if ready.
    async fn poll_immediately<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
        match futures::poll!(future) {
            Poll::Ready(output) => Some(output),
            Poll::Pending => None,
        }
    }

    fn prefetch_queue(protection: &Protection) -> ClassQueueSnapshot {
        let queue = protection.admission_queue.as_ref().unwrap();
        queue.snapshot().classes[0].clone()
    }

    /// `admit_or_wait`'s result as a level, so the future owns nothing borrowed.
    async fn admitted_level(protection: Arc<Protection>, class: RequestClass) -> Option<ShedLevel> {
        admit_or_wait(&protection, class)
            .await
            .map(|admitted| admitted.level)
            .ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_prefetch_waits_for_the_slot_and_takes_it_when_the_holder_ends() {
        let protection = one_slot();
        let page = Admitted::begin(&protection, RequestClass::Page).unwrap();
        assert!(would_wait(&protection, RequestClass::Prefetch));
        assert!(!would_wait(&protection, RequestClass::Page));
        let mut waiting = pin!(admitted_level(
            Arc::clone(&protection),
            RequestClass::Prefetch
        ));
        assert_eq!(poll_immediately(&mut waiting).await, None, "it waits");
        assert_eq!(prefetch_queue(&protection).waiting, 1);

        // A page request neither waits nor queues behind it, over the limit as it is.
        let second_page = Admitted::begin(&protection, RequestClass::Page).unwrap();
        drop(second_page.finish(Response::default()));
        // That page's end woke the prefetch, but the first page still holds the slot.
        assert_eq!(poll_immediately(&mut waiting).await, None);

        drop(page.finish(Response::default()));
        assert_eq!(waiting.await, Some(ShedLevel::Normal));
        let queue = prefetch_queue(&protection);
        assert_eq!((queue.waiting, queue.admitted, queue.timed_out), (0, 1, 0));
        assert_eq!(protection.shedder.as_ref().unwrap().snapshot().in_flight, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_at_once_and_a_spent_wait_refuses_after_it() {
        let protection = one_slot();
        let page = Admitted::begin(&protection, RequestClass::Page).unwrap();
        let first = tokio::spawn(admitted_level(
            Arc::clone(&protection),
            RequestClass::Prefetch,
        ));
        let second = tokio::spawn(admitted_level(
            Arc::clone(&protection),
            RequestClass::Prefetch,
        ));
        tokio::task::yield_now().await;
        assert_eq!(prefetch_queue(&protection).waiting, 2);
        let third = admit_or_wait(&protection, RequestClass::Prefetch)
            .now_or_never()
            .expect("a full queue answers without waiting");
        assert!(third.is_err());

        tokio::time::sleep(Duration::from_millis(251)).await;
        assert_eq!(first.await.unwrap(), None, "its wait ran out");
        assert_eq!(second.await.unwrap(), None);
        let queue = prefetch_queue(&protection);
        assert_eq!(
            (queue.waiting, queue.refused_full, queue.timed_out),
            (0, 1, 2)
        );
        assert_eq!(queue.waits, 2);
        drop(page);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_whose_client_goes_away_frees_its_place_and_its_turn() {
        let protection = one_slot();
        let page = Admitted::begin(&protection, RequestClass::Page).unwrap();
        let mut gone = Box::pin(admitted_level(
            Arc::clone(&protection),
            RequestClass::Prefetch,
        ));
        assert!(matches!(futures::poll!(&mut gone), Poll::Pending));
        let mut next = pin!(admitted_level(
            Arc::clone(&protection),
            RequestClass::Prefetch
        ));
        assert_eq!(poll_immediately(&mut next).await, None);
        // The head's capacity frees and its client disconnects before it runs: the turn passes.
        drop(page.finish(Response::default()));
        drop(gone);
        assert_eq!(next.await, Some(ShedLevel::Normal));
        let queue = prefetch_queue(&protection);
        assert_eq!((queue.waiting, queue.cancelled, queue.admitted), (0, 1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_prefetch_refused_by_the_level_waits_for_the_level_to_fall() {
        let protection = one_slot();
        let shedder = protection.shedder.as_ref().unwrap();
        shedder.force(Some(ShedLevel::ShortTimeouts));
        let mut waiting = pin!(admitted_level(
            Arc::clone(&protection),
            RequestClass::Prefetch
        ));
        assert_eq!(poll_immediately(&mut waiting).await, None);
        // The level drops as an operator's override ends; the admin route notifies as here.
        shedder.force(None);
        protection.notify_waiters();
        assert_eq!(waiting.await, Some(ShedLevel::Normal));
        // A class that does not wait is answered at once, as before.
        shedder.force(Some(ShedLevel::ShortTimeouts));
        assert!(!would_wait(&protection, RequestClass::List));
        let list = admit(&protection, Request::default(), |_| async {
            Response::default()
        })
        .now_or_never()
        .expect("no wait for a list");
        assert_eq!(list.status(), 200);
    }
}
