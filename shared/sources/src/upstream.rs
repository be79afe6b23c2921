//! Clients of the external coupon and extras APIs (HTTP/JSON).
//!
//! Wire format (served for real by `upstream-sim`):
//! - `GET {base}/v1/coupons/{platform}/{item_id}` → `{"version": 1, "coupons": [Coupon, …]}`
//! - `GET {base}/v1/extras/{platform}/{item_id}` → `{"sales_30d": 1234, "popular_searches": […]}`
//!
//! A 404 means the API knows nothing of the item: no coupons, no extras. Any other non-2xx
//! answer, a transport error or an undecodable body is a failure: 5xx answers and transport
//! errors are transient (retried within budget), a 429 is the provider's quota (never retried),
//! the rest are permanent. Every call goes through the API's [`DependencyGuard`] guard.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rebate_cache::{FailureKind, LoadFailure, Loaded, Loader};
use rebate_domain::{Coupon, Extras, ItemKey, Timestamp};
use serde::Deserialize;

use rebate_telemetry::Timeline;

use rebate_guard::{AttemptFailure, DependencyGuard};

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

#[derive(Debug, Clone)]
struct Endpoint {
    name: &'static str,
    client: reqwest::Client,
    /// Base url with the path prefix, without a trailing slash.
    base: String,
    guard: Arc<DependencyGuard>,
}

impl Endpoint {
    fn new(
        name: &'static str,
        client: reqwest::Client,
        base_url: &str,
        path: &str,
        guard: Arc<DependencyGuard>,
    ) -> Result<Self, UpstreamError> {
        let url = parse_base_url(base_url)?;
        let base = format!("{}/{path}", url.as_str().trim_end_matches('/'));
        Ok(Self {
            name,
            client,
            base,
            guard,
        })
    }

    /// GETs the item's document through the guard; `Ok(None)` on 404.
    async fn fetch<T: for<'de> Deserialize<'de>>(
        &self,
        key: ItemKey,
    ) -> Result<Option<T>, LoadFailure> {
        let url = format!("{}/{}/{}", self.base, key.platform, key.item_id);
        self.guard.call(|| self.fetch_once(&url)).await
    }

    async fn fetch_once<T: for<'de> Deserialize<'de>>(
        &self,
        url: &str,
    ) -> Result<Option<T>, AttemptFailure> {
        let mut request = self.client.get(url);
        // The call joins the request's trace: its span when exporting, else our trace id.
        let trace_id = Timeline::current().map(|timeline| timeline.trace_id());
        if let Some(traceparent) = rebate_telemetry::otel::outgoing_traceparent(trace_id) {
            request = request.header("traceparent", traceparent);
        }
        let response = request
            .send()
            .await
            .map_err(|error| self.failure(error, "request failed"))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Err(AttemptFailure::permanent(LoadFailure::new(
                FailureKind::Quota,
                format!("{} api answered 429: over its quota", self.name),
            )));
        }
        if !status.is_success() {
            let failure = LoadFailure::error(format!("{} api answered {status}", self.name));
            return Err(if status.is_server_error() {
                AttemptFailure::transient(failure)
            } else {
                AttemptFailure::permanent(failure)
            });
        }
        let document = response
            .json::<T>()
            .await
            .map_err(|error| self.failure(error, "undecodable body"))?;
        Ok(Some(document))
    }

    fn failure(&self, error: reqwest::Error, what: &str) -> AttemptFailure {
        let detail = format!("{} api {what}: {error}", self.name);
        if error.is_timeout() {
            AttemptFailure::permanent(LoadFailure::timeout(detail))
        } else if error.is_decode() {
            AttemptFailure::permanent(LoadFailure::error(detail))
        } else {
            // Refused or reset connections and the like: another attempt may well succeed.
            AttemptFailure::transient(LoadFailure::error(detail))
        }
    }
}

#[derive(Debug, Deserialize)]
struct CouponDocument {
    #[serde(default)]
    version: u64,
    coupons: Vec<Coupon>,
}

/// The coupon API. Coupons are a *normal*-tier part: a quote without them is degraded, not failed.
#[derive(Debug, Clone)]
pub struct CouponClient {
    endpoint: Endpoint,
}

impl CouponClient {
    pub fn new(
        client: reqwest::Client,
        base_url: &str,
        guard: Arc<DependencyGuard>,
    ) -> Result<Self, UpstreamError> {
        Ok(Self {
            endpoint: Endpoint::new("coupon", client, base_url, "v1/coupons", guard)?,
        })
    }
}

#[async_trait]
impl Loader<Vec<Coupon>> for CouponClient {
    async fn load(&self, key: ItemKey) -> Result<Loaded<Vec<Coupon>>, LoadFailure> {
        let document = self.endpoint.fetch::<CouponDocument>(key).await?;
        Ok(match document {
            Some(document) => Loaded {
                value: Some(document.coupons),
                version: document.version,
            },
            None => Loaded {
                value: Some(Vec::new()),
                version: 0,
            },
        })
    }

    fn ready(&self) -> bool {
        self.endpoint.guard.ready()
    }
}

/// The extras API (30-day sales, popular searches). An *edge*-tier part: optional.
#[derive(Debug, Clone)]
pub struct ExtrasClient {
    endpoint: Endpoint,
}

impl ExtrasClient {
    pub fn new(
        client: reqwest::Client,
        base_url: &str,
        guard: Arc<DependencyGuard>,
    ) -> Result<Self, UpstreamError> {
        Ok(Self {
            endpoint: Endpoint::new("extras", client, base_url, "v1/extras", guard)?,
        })
    }
}

#[async_trait]
impl Loader<Extras> for ExtrasClient {
    /// The extras API has no versions: an answer's version is the time its fetch began, in
    /// milliseconds since the Unix epoch, so a fence set at a moment (`item_created`) refuses
    /// exactly what was fetched before it.
    async fn load(&self, key: ItemKey) -> Result<Loaded<Extras>, LoadFailure> {
        let fetched_at = u64::try_from(Timestamp::now().as_millis()).unwrap_or(0);
        let document = self.endpoint.fetch::<Extras>(key).await?;
        Ok(Loaded {
            value: document,
            version: fetched_at,
        })
    }

    fn ready(&self) -> bool {
        self.endpoint.guard.ready()
    }
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
                retry: None,
                timeout: None,
            },
            Arc::new(rebate_resilience::MonotonicTicker::new()),
        ));
        assert!(CouponClient::new(client.clone(), "not a url", guard.clone()).is_err());
        assert!(CouponClient::new(client.clone(), "ftp://example.com", guard.clone()).is_err());
        let coupons = CouponClient::new(client, "http://127.0.0.1:9/api/", guard).unwrap();
        assert_eq!(coupons.endpoint.base, "http://127.0.0.1:9/api/v1/coupons");
    }
}
