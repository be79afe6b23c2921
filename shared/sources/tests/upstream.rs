//! The HTTP clients against the real simulator over loopback: decoding, and how each kind of
//! upstream failure is classified.

use std::sync::Arc;
use std::time::Duration;

use rebate_cache::{FailureKind, LoadContext, Loader};
use rebate_domain::ItemKey;
use rebate_guard::{DependencyConfig, DependencyGuard};
use rebate_resilience::{BreakerConfig, MonotonicTicker, RetryConfig};
use rebate_sources::{CouponClient, ExtrasClient, http_client};
use tokio_util::sync::CancellationToken;
use upstream_sim::{Endpoint, Fault, RunningSimulator};

async fn simulator() -> (RunningSimulator, CancellationToken) {
    let token = CancellationToken::new();
    let simulator = RunningSimulator::start("127.0.0.1:0".parse().unwrap(), token.clone())
        .await
        .unwrap();
    (simulator, token)
}

/// A guard that never trips, with retries as given: these tests are about the clients.
fn guard(retry: Option<RetryConfig>) -> Arc<DependencyGuard> {
    Arc::new(DependencyGuard::new(
        "coupons",
        DependencyConfig {
            breaker: BreakerConfig {
                min_calls: 1_000_000,
                ..BreakerConfig::default()
            },
            max_concurrent: 1_000,
            quota: None,
            retry,
            timeout: Some(Duration::from_secs(2)),
        },
        Arc::new(MonotonicTicker::new()),
    ))
}

fn key() -> ItemKey {
    ItemKey::parse("jd", "100002").unwrap()
}

#[tokio::test]
async fn decodes_coupons_and_extras_with_versions() {
    let (simulator, token) = simulator().await;
    let client = http_client(Duration::from_secs(1)).unwrap();
    let coupons = CouponClient::new(client.clone(), &simulator.base_url(), guard(None)).unwrap();
    let extras = ExtrasClient::new(client, &simulator.base_url(), guard(None)).unwrap();

    let loaded = coupons.load(key()).await.unwrap();
    assert_eq!(loaded.version, simulator.state().coupon_version(key()));
    assert_eq!(
        loaded.value.unwrap(),
        upstream_sim::catalog::coupons(key(), loaded.version, rebate_domain::Timestamp::now())
    );
    let loaded = extras.load(key()).await.unwrap();
    assert_eq!(loaded.value.unwrap(), upstream_sim::catalog::extras(key()));
    token.cancel();
    simulator.stopped().await;
}

#[tokio::test]
async fn upstream_failures_are_errors_not_values() {
    let (simulator, token) = simulator().await;
    let client = http_client(Duration::from_secs(1)).unwrap();
    let coupons = CouponClient::new(client, &simulator.base_url(), guard(None)).unwrap();
    for (fault, kind) in [
        (
            Fault {
                outage: true,
                ..Fault::default()
            },
            FailureKind::Error,
        ),
        (
            Fault {
                rate_limited: true,
                ..Fault::default()
            },
            FailureKind::Quota,
        ),
        (
            Fault {
                error_rate: 1.0,
                ..Fault::default()
            },
            FailureKind::Error,
        ),
    ] {
        simulator
            .state()
            .set_fault(Endpoint::Coupons, fault)
            .unwrap();
        let failure = coupons.load(key()).await.unwrap_err();
        assert_eq!(failure.kind, kind, "{fault:?}");
    }
    assert_eq!(simulator.state().counters(Endpoint::Coupons).calls, 3);
    token.cancel();
    simulator.stopped().await;
}

#[tokio::test]
async fn an_unreachable_api_is_an_error() {
    // Bind and drop a listener to get a loopback port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = http_client(Duration::from_millis(200)).unwrap();
    let coupons =
        CouponClient::new(client, &format!("http://127.0.0.1:{port}"), guard(None)).unwrap();
    let failure = coupons.load(key()).await.unwrap_err();
    assert_eq!(failure.kind, FailureKind::Error);
}

#[tokio::test]
async fn a_failing_api_is_retried_at_most_twice_per_request_and_a_tenth_overall() {
    let (simulator, token) = simulator().await;
    simulator
        .state()
        .set_fault(
            Endpoint::Coupons,
            Fault {
                error_rate: 1.0,
                ..Fault::default()
            },
        )
        .unwrap();
    let client = http_client(Duration::from_secs(1)).unwrap();
    let coupons = CouponClient::new(
        client,
        &simulator.base_url(),
        guard(Some(RetryConfig {
            base_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(2),
            ..RetryConfig::default()
        })),
    )
    .unwrap();
    let requests = 200u64;
    let mut most_calls_for_one_request = 0;
    for _ in 0..requests {
        let before = simulator.state().counters(Endpoint::Coupons).calls;
        let request = LoadContext::new(None, 2);
        let failure = request.scope(coupons.load(key())).await.unwrap_err();
        assert_eq!(failure.kind, FailureKind::Error);
        let calls = simulator.state().counters(Endpoint::Coupons).calls - before;
        most_calls_for_one_request = most_calls_for_one_request.max(calls);
    }
    let calls = simulator.state().counters(Endpoint::Coupons).calls;
    assert!(
        most_calls_for_one_request <= 3,
        "{most_calls_for_one_request} attempts"
    );
    assert!(
        calls as f64 <= 1.1 * requests as f64,
        "{calls} calls for {requests} requests"
    );
    // The budget is spent, not unused: the 10 % share was retried.
    assert!(calls >= requests + requests / 10 - 1, "{calls} calls");
    token.cancel();
    simulator.stopped().await;
}
