//! The edge's protection: the per-client limit (429) and the load shedder's admission, which
//! stamps every request with the level it is served at.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use rebate_resilience::{
    Admission, AdmissionTicket, KeyedLimiter, LoadShedder, RequestClass, ShedLevel,
};

use super::error::ApiError;
use super::routes::BATCH_ROUTE;
use crate::protection::Protection;

/// Who the client says it is: a per-app or per-device id. Without it, the peer address is used.
pub const CLIENT_ID_HEADER: HeaderName = HeaderName::from_static("x-client-id");
const FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// Set on responses served while shedding (level ≥ 1), so clients and load tests can see it.
pub const SHED_LEVEL_HEADER: HeaderName = HeaderName::from_static("x-shed-level");
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
fn rate_limited(retry_after: std::time::Duration) -> Response {
    rate_limited_error(retry_after).into_response()
}

fn rate_limited_error(retry_after: std::time::Duration) -> ApiError {
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
/// goes on the response for the trace layer and the metrics.
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
    let mut response = match Admitted::begin(protection, class) {
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

/// A request the shedder let in, until its response: [`admit`] in two halves, for callers that
/// answer without a future (the edge's hot path) as well.
pub(super) struct Admitted<'a> {
    /// The level the request is served at.
    pub(super) level: ShedLevel,
    /// Counts the request in flight until dropped (`None` when shedding is off).
    admission: Option<Admission<'a>>,
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
            Some(level) => Ok(Self { level, admission }),
            None => {
                drop(admission);
                protection.count_refused(class);
                Err(Refused {
                    measured,
                    retry_after_secs: protection.shed_retry_after(),
                })
            }
        }
    }

    /// The response with the level it was served at, when shedding; the request is no longer
    /// in flight.
    pub(super) fn finish(self, response: Response) -> Response {
        let response = stamp_level(self.level, response);
        drop(self.admission);
        response
    }

    /// The same admission, owning its shedder's handle, for work that continues in a future of
    /// its own.
    pub(super) fn into_owned(self, protection: Arc<Protection>) -> OwnedAdmitted {
        OwnedAdmitted {
            level: self.level,
            ticket: self.admission.map(Admission::into_ticket),
            protection,
        }
    }
}

/// A request the shedder refused: the 503 (with `Retry-After` and the measured level).
pub(super) struct Refused {
    measured: ShedLevel,
    retry_after_secs: u32,
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
        response
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
