//! Clients of the external coupon and extras APIs (HTTP/JSON).
//!
//! Wire format (served for real by `upstream-sim`):
//! - `GET {base}/v1/coupons/{platform}/{item_id}` → `{"version": 1, "coupons": [Coupon, …]}`
//! - `GET {base}/v1/extras/{platform}/{item_id}` → `{"sales_30d": 1234, "popular_searches": […]}`
//! - `POST {base}/v1/coupons:batch`, `POST {base}/v1/extras:batch` with
//!   `{"items": [{"platform": …, "item_id": …}, …]}` → `{"items": [document + its key, …]}`:
//!   the same documents, each with `platform` and `item_id`, for the keys the API knows.
//!
//! A 404 means the API knows nothing of the item: no coupons, no extras; an item missing from a
//! batch answer is a failure for that item (never cached), not "nothing known": an API that
//! drops items is not taken at its silence. Any other non-2xx
//! answer, a transport error or an undecodable body is a failure: 5xx answers and transport
//! errors are transient (retried within budget), a 429 is the provider's quota (never retried),
//! the rest are permanent. Every call, single or batch, goes through the API's [`DependencyGuard`]
//! guard: a batch call takes one quota token, one breaker permit and one bulkhead slot. With a
//! per-item limit on the guard, each load first takes a token of its own item's bucket, before
//! it joins a call: a hot item refused there makes no call and costs the quota nothing.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rebate_cache::{FailureKind, LoadFailure, Loaded, Loader};
use rebate_domain::{Coupon, Extras, ItemId, ItemKey, Platform, Timestamp};
use rebate_guard::{AttemptFailure, DependencyGuard};
use rebate_telemetry::Timeline;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::batch::{BatchConfig, BatchFetch, BatchStats, Coalescer};

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("invalid upstream base url {url:?}: {reason}")]
    InvalidBaseUrl { url: String, reason: String },
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// One HTTP client for all upstreams: connection pooling, keep-alive, no proxies from the
/// environment (upstream calls must go where the config says), a connect timeout. Per-call
/// timeouts come from the cache's budgets.
pub fn http_client(connect_timeout: Duration) -> Result<reqwest::Client, UpstreamError> {
    Ok(reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(64)
        .tcp_nodelay(true)
        .no_proxy()
        .user_agent(concat!("rebate-query/", env!("CARGO_PKG_VERSION")))
        .build()?)
}

fn parse_base_url(base_url: &str) -> Result<reqwest::Url, UpstreamError> {
    let url = reqwest::Url::parse(base_url).map_err(|error| UpstreamError::InvalidBaseUrl {
        url: base_url.to_owned(),
        reason: error.to_string(),
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(UpstreamError::InvalidBaseUrl {
            url: base_url.to_owned(),
            reason: "scheme must be http or https".to_owned(),
        });
    }
    Ok(url)
}

/// What differs between the coupon and the extras API: where it lives, the document it answers
/// per item and how that maps onto a loaded value.
pub trait UpstreamApi: Send + Sync + fmt::Debug + 'static {
    type Value: Clone + Send + Sync + 'static;
    /// One item's document, as the single-item route answers it and as each element of the
    /// batch route's `items` (which adds `platform` and `item_id`).
    type Document: DeserializeOwned + Send + 'static;
    /// For messages: `coupon`, `extras`.
    const NAME: &'static str;
    /// The route below the base url: `v1/coupons`, `v1/extras`.
    const PATH: &'static str;

    /// The loaded value for an item's document (`None`: the API knows nothing of the item), for
    /// a call that began at `started_ms` (ms since the Unix epoch).
    fn loaded(document: Option<Self::Document>, started_ms: u64) -> Loaded<Self::Value>;
}

/// The coupon API. Coupons are a *normal*-tier part: a quote without them is degraded, not failed.
#[derive(Debug, Clone, Copy)]
pub struct CouponApi;

#[derive(Debug, Deserialize)]
pub struct CouponDocument {
    #[serde(default)]
    version: u64,
    coupons: Vec<Coupon>,
}

impl UpstreamApi for CouponApi {
    type Value = Vec<Coupon>;
    type Document = CouponDocument;
    const NAME: &'static str = "coupon";
    const PATH: &'static str = "v1/coupons";

    fn loaded(document: Option<CouponDocument>, _started_ms: u64) -> Loaded<Vec<Coupon>> {
        match document {
            Some(document) => Loaded {
                value: Some(document.coupons),
                version: document.version,
            },
            None => Loaded {
                value: Some(Vec::new()),
                version: 0,
            },
        }
    }
}

/// The extras API (30-day sales, popular searches). An *edge*-tier part: optional.
#[derive(Debug, Clone, Copy)]
pub struct ExtrasApi;

impl UpstreamApi for ExtrasApi {
    type Value = Extras;
    type Document = Extras;
    const NAME: &'static str = "extras";
    const PATH: &'static str = "v1/extras";

    /// The extras API has no versions: an answer's version is the time its call began, in
    /// milliseconds since the Unix epoch, so a fence set at a moment (`item_created`) refuses
    /// exactly what was fetched before it.
    fn loaded(document: Option<Extras>, started_ms: u64) -> Loaded<Extras> {
        Loaded {
            value: document,
            version: started_ms,
        }
    }
}

pub type CouponClient = UpstreamClient<CouponApi>;
pub type ExtrasClient = UpstreamClient<ExtrasApi>;

/// A client of one external API: a [`Loader`] whose loads go out one item per call, or, with a
/// [`BatchConfig`] of more than one item, coalesced into the API's batch calls.
#[derive(Debug)]
pub struct UpstreamClient<A: UpstreamApi> {
    calls: Arc<Calls<A>>,
    /// `None` when batching is off.
    batches: Option<Arc<Coalescer<Arc<Calls<A>>>>>,
}

/// The HTTP calls of one API, through its guard.
#[derive(Debug)]
struct Calls<A> {
    client: reqwest::Client,
    /// Base url with the route, without a trailing slash.
    base: String,
    /// `{base}:batch`.
    batch_url: String,
    guard: Arc<DependencyGuard>,
    api: PhantomData<A>,
}

impl<A: UpstreamApi> UpstreamClient<A> {
    pub fn new(
        client: reqwest::Client,
        base_url: &str,
        guard: Arc<DependencyGuard>,
        batch: BatchConfig,
    ) -> Result<Self, UpstreamError> {
        let url = parse_base_url(base_url)?;
        let base = format!("{}/{}", url.as_str().trim_end_matches('/'), A::PATH);
        let calls = Arc::new(Calls {
            client,
            batch_url: format!("{base}:batch"),
            base,
            guard,
            api: PhantomData,
        });
        let batches = batch
            .is_batching()
            .then(|| Arc::new(Coalescer::new(Arc::clone(&calls), batch)));
        Ok(Self { calls, batches })
    }

    /// Batch calls and items sent; `None` when batching is off.
    pub fn batch_stats(&self) -> Option<BatchStats> {
        self.batches.as_ref().map(|batches| batches.stats())
    }
}

#[async_trait]
impl<A: UpstreamApi> Loader<A::Value> for UpstreamClient<A> {
    /// The item's own share of loads is taken first (when the guard limits hot items), per
    /// load and before it joins a batch: a batch of many items spends each item's own bucket
    /// once, a refused item never takes a place in a batch nor delays its call, and the call's
    /// one quota token is shared by items that were all admitted.
    async fn load(&self, key: ItemKey) -> Result<Loaded<A::Value>, LoadFailure> {
        self.calls.guard.admit_item(key)?;
        match &self.batches {
            Some(batches) => batches.load(key).await,
            None => self.calls.fetch_one(key).await,
        }
    }

    /// Batched loads wait in their batch for a quota token (within their budget): only an open
    /// breaker makes them refuse at once. A single call needs a token now.
    fn ready(&self) -> bool {
        match &self.batches {
            Some(_) => self.calls.guard.breaker_allows(),
            None => self.calls.guard.ready(),
        }
    }

    fn ready_for(&self, key: ItemKey) -> bool {
        self.calls.guard.item_ready(key) && self.ready()
    }
}

/// The body of a batch call.
#[derive(Debug, Serialize)]
struct BatchRequest<'a> {
    items: &'a [ItemKey],
}

/// The answer of a batch call: one document per item it knows, each with its key.
#[derive(Debug, Deserialize)]
#[serde(bound = "D: DeserializeOwned")]
struct BatchResponse<D> {
    items: Vec<BatchItem<D>>,
}

#[derive(Debug, Deserialize)]
#[serde(bound = "D: DeserializeOwned")]
struct BatchItem<D> {
    platform: Platform,
    item_id: ItemId,
    #[serde(flatten)]
    document: D,
}

impl<A: UpstreamApi> Calls<A> {
    /// GETs one item's document through the guard; a 404 is "nothing known".
    async fn fetch_one(&self, key: ItemKey) -> Result<Loaded<A::Value>, LoadFailure> {
        let started_ms = now_ms();
        let url = format!("{}/{}/{}", self.base, key.platform, key.item_id);
        let document = self
            .guard
            .call(|| async {
                let request = self.client.get(&url);
                match self.send(request).await? {
                    Some(response) => Ok(Some(self.decode::<A::Document>(response).await?)),
                    None => Ok(None),
                }
            })
            .await?;
        Ok(A::loaded(document, started_ms))
    }

    /// POSTs the keys to the batch route through the guard: one call, one quota token.
    async fn fetch_batch(
        &self,
        keys: &[ItemKey],
    ) -> Result<Vec<(ItemKey, Loaded<A::Value>)>, LoadFailure> {
        let started_ms = now_ms();
        let body = BatchRequest { items: keys };
        let answer = self
            .guard
            .call(|| async {
                let request = self.client.post(&self.batch_url).json(&body);
                match self.send(request).await? {
                    Some(response) => self.decode::<BatchResponse<A::Document>>(response).await,
                    // The route itself is missing: the API has no batch call.
                    None => Err(AttemptFailure::permanent(LoadFailure::error(format!(
                        "{} api has no batch route (404)",
                        A::NAME
                    )))),
                }
            })
            .await?;
        Ok(answer
            .items
            .into_iter()
            .map(|item| {
                let key = ItemKey {
                    platform: item.platform,
                    item_id: item.item_id,
                };
                (key, A::loaded(Some(item.document), started_ms))
            })
            .collect())
    }

    /// Sends `request` with the trace's `traceparent`; `Ok(None)` on 404, a failure for any
    /// other non-2xx answer.
    async fn send(
        &self,
        mut request: reqwest::RequestBuilder,
    ) -> Result<Option<reqwest::Response>, AttemptFailure> {
        // The call joins the request's trace: its span when exporting, else our trace id.
        let trace_id = Timeline::current().map(|timeline| timeline.trace_id());
        if let Some(traceparent) = rebate_telemetry::otel::outgoing_traceparent(trace_id) {
            request = request.header("traceparent", traceparent);
        }
        let response = request
            .send()
            .await
            .map_err(|error| failure::<A>(error, "request failed"))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Err(AttemptFailure::permanent(LoadFailure::new(
                FailureKind::Quota,
                format!("{} api answered 429: over its quota", A::NAME),
            )));
        }
        if !status.is_success() {
            let failure = LoadFailure::error(format!("{} api answered {status}", A::NAME));
            return Err(if status.is_server_error() {
                AttemptFailure::transient(failure)
            } else {
                AttemptFailure::permanent(failure)
            });
        }
        Ok(Some(response))
    }

    async fn decode<T: DeserializeOwned>(
        &self,
        response: reqwest::Response,
    ) -> Result<T, AttemptFailure> {
        response
            .json::<T>()
            .await
            .map_err(|error| failure::<A>(error, "undecodable body"))
    }
}

#[async_trait]
impl<A: UpstreamApi> BatchFetch for Arc<Calls<A>> {
    type Value = A::Value;

    fn name(&self) -> &'static str {
        A::NAME
    }

    fn wait_for_token(&self) -> Duration {
        self.guard.wait_for_quota()
    }

    async fn fetch_many(
        &self,
        keys: &[ItemKey],
    ) -> Result<Vec<(ItemKey, Loaded<A::Value>)>, LoadFailure> {
        self.fetch_batch(keys).await
    }
}

fn failure<A: UpstreamApi>(error: reqwest::Error, what: &str) -> AttemptFailure {
    let detail = format!("{} api {what}: {error}", A::NAME);
    if error.is_timeout() {
        AttemptFailure::permanent(LoadFailure::timeout(detail))
    } else if error.is_decode() {
        AttemptFailure::permanent(LoadFailure::error(detail))
    } else {
        // Refused or reset connections and the like: another attempt may well succeed.
        AttemptFailure::transient(LoadFailure::error(detail))
    }
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    u64::try_from(Timestamp::now().as_millis()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_validated() {
        let client = http_client(Duration::from_secs(1)).unwrap();
        let guard = Arc::new(DependencyGuard::new(
            "coupons",
            rebate_guard::DependencyConfig {
                breaker: rebate_resilience::BreakerConfig::default(),
                max_concurrent: 8,
                quota: None,
                fleet_quota: None,
                retry: None,
                timeout: None,
            },
            Arc::new(rebate_resilience::MonotonicTicker::new()),
        ));
        let single = BatchConfig::SINGLE;
        assert!(CouponClient::new(client.clone(), "not a url", guard.clone(), single).is_err());
        assert!(
            CouponClient::new(client.clone(), "ftp://example.com", guard.clone(), single).is_err()
        );
        let coupons = CouponClient::new(client, "http://127.0.0.1:9/api/", guard, single).unwrap();
        assert_eq!(coupons.calls.base, "http://127.0.0.1:9/api/v1/coupons");
        assert_eq!(
            coupons.calls.batch_url,
            "http://127.0.0.1:9/api/v1/coupons:batch"
        );
        assert!(coupons.batch_stats().is_none());
    }
}
