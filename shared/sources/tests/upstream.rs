//! The HTTP clients against the real simulator over loopback: decoding, and how each kind of
//! upstream failure is classified.

use std::sync::Arc;
use std::time::Duration;

use rebate_cache::{FailureKind, LoadContext, Loader};
use rebate_domain::ItemKey;
use rebate_guard::{DependencyConfig, DependencyGuard};
use rebate_resilience::{BreakerConfig, MonotonicTicker, RetryConfig};
use rebate_sources::{BatchConfig, CouponClient, ExtrasClient, http_client};
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
        guard_config(retry),
        Arc::new(MonotonicTicker::new()),
    ))
}

fn guard_config(retry: Option<RetryConfig>) -> DependencyConfig {
    DependencyConfig {
        breaker: BreakerConfig {
            min_calls: 1_000_000,
            ..BreakerConfig::default()
        },
        max_concurrent: 1_000,
        quota: None,
        fleet_quota: None,
        retry,
        timeout: Some(Duration::from_secs(2)),
    }
}

const SINGLE: BatchConfig = BatchConfig::SINGLE;

fn key() -> ItemKey {
    ItemKey::parse("jd", "100002").unwrap()
}

#[tokio::test]
async fn decodes_coupons_and_extras_with_versions() {
    let (simulator, token) = simulator().await;
    let client = http_client(Duration::from_secs(1)).unwrap();
    let coupons =
        CouponClient::new(client.clone(), &simulator.base_url(), guard(None), SINGLE).unwrap();
    let extras = ExtrasClient::new(client, &simulator.base_url(), guard(None), SINGLE).unwrap();

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
    let coupons = CouponClient::new(client, &simulator.base_url(), guard(None), SINGLE).unwrap();
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
    let coupons = CouponClient::new(
        client,
        &format!("http://127.0.0.1:{port}"),
        guard(None),
        SINGLE,
    )
    .unwrap();
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
        SINGLE,
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

fn keys(count: u64) -> Vec<ItemKey> {
    (100_001..100_001 + count)
        .map(|id| ItemKey::parse("taobao", &id.to_string()).unwrap())
        .collect()
}

/// Loads every key at once, each in its own task (as the part caches' loads run).
async fn load_concurrently<L, T>(loader: &Arc<L>, keys: &[ItemKey]) -> Vec<rebate_cache::Loaded<T>>
where
    L: Loader<T>,
    T: Send + 'static,
{
    let loads: Vec<_> = keys
        .iter()
        .map(|key| {
            let loader = Arc::clone(loader);
            let key = *key;
            tokio::spawn(async move { loader.load(key).await })
        })
        .collect();
    let mut loaded = Vec::new();
    for load in loads {
        loaded.push(load.await.unwrap().unwrap());
    }
    loaded
}

#[tokio::test]
async fn concurrent_loads_go_out_as_one_batch_call_with_one_quota_token() {
    let (simulator, token) = simulator().await;
    let client = http_client(Duration::from_secs(1)).unwrap();
    // One call a second: without batching, nineteen of the twenty loads would be refused.
    let quota_guard = Arc::new(DependencyGuard::new(
        "coupons",
        DependencyConfig {
            quota: Some(rebate_resilience::RateConfig {
                per_second: 1.0,
                burst: 1,
            }),
            fleet_quota: None,
            ..guard_config(None)
        },
        Arc::new(MonotonicTicker::new()),
    ));
    let batch = BatchConfig {
        max_items: 40,
        window: Duration::from_millis(50),
    };
    let coupons = Arc::new(
        CouponClient::new(
            client.clone(),
            &simulator.base_url(),
            Arc::clone(&quota_guard),
            batch,
        )
        .unwrap(),
    );
    let extras =
        Arc::new(ExtrasClient::new(client, &simulator.base_url(), guard(None), batch).unwrap());

    let keys = keys(20);
    let now = rebate_domain::Timestamp::now();
    for (key, loaded) in keys.iter().zip(load_concurrently(&coupons, &keys).await) {
        assert_eq!(loaded.version, 1);
        assert_eq!(
            loaded.value.unwrap(),
            upstream_sim::catalog::coupons(*key, 1, now)
        );
    }
    for (key, loaded) in keys.iter().zip(load_concurrently(&extras, &keys).await) {
        assert_eq!(loaded.value.unwrap(), upstream_sim::catalog::extras(*key));
    }
    let counters = simulator.state().counters(Endpoint::Coupons);
    assert_eq!(
        (counters.calls, counters.items, counters.batch_calls),
        (1, 20, 1)
    );
    assert_eq!(quota_guard.snapshot().quota.unwrap().granted, 1);
    assert_eq!(simulator.state().counters(Endpoint::Extras).calls, 1);
    let stats = coupons.batch_stats().unwrap();
    assert_eq!((stats.calls, stats.items), (1, 20));
    token.cancel();
    simulator.stopped().await;
}

/// Each item of a batch spends its own bucket of the per-item limit, before it joins the batch:
/// items whose bucket is empty are refused at once (no place in the call, no quota token, no
/// breaker outcome) while new items in the same moment go out in one call, and a second later
/// the refused items load again.
#[tokio::test]
async fn a_batch_spends_each_items_own_bucket_and_hot_items_are_refused_before_joining() {
    let (simulator, token) = simulator().await;
    let client = http_client(Duration::from_secs(1)).unwrap();
    let ticker = rebate_resilience::ManualTicker::new();
    let guard = Arc::new(
        DependencyGuard::new(
            "coupons",
            DependencyConfig {
                quota: Some(rebate_resilience::RateConfig {
                    per_second: 10.0,
                    burst: 5,
                }),
                ..guard_config(None)
            },
            Arc::new(ticker.clone()),
        )
        .with_hot_items(rebate_guard::HotItemConfig {
            rate: rebate_resilience::RateConfig {
                per_second: 1.0,
                burst: 1,
            },
            max_items: 1_000,
        }),
    );
    let batch = BatchConfig {
        max_items: 40,
        window: Duration::from_millis(20),
    };
    let coupons = Arc::new(
        CouponClient::new(client, &simulator.base_url(), Arc::clone(&guard), batch).unwrap(),
    );
    let first = keys(20);
    assert_eq!(load_concurrently(&coupons, &first).await.len(), 20);

    // The same twenty again with five new items, all at once.
    let new: Vec<ItemKey> = (200_001..200_006)
        .map(|id| ItemKey::parse("taobao", &id.to_string()).unwrap())
        .collect();
    assert!(first.iter().all(|key| !coupons.ready_for(*key)));
    assert!(new.iter().all(|key| coupons.ready_for(*key)));
    let loads: Vec<_> = first
        .iter()
        .chain(&new)
        .map(|key| {
            let coupons = Arc::clone(&coupons);
            let key = *key;
            tokio::spawn(async move { coupons.load(key).await })
        })
        .collect();
    let mut refused = 0;
    for load in loads {
        match load.await.unwrap() {
            Ok(_) => {}
            Err(failure) => {
                assert_eq!(failure.kind, FailureKind::HotItem, "{failure}");
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 20);
    let counters = simulator.state().counters(Endpoint::Coupons);
    assert_eq!(
        (counters.calls, counters.items),
        (2, 25),
        "one call each time, the hot items in none of the second"
    );
    let snapshot = guard.snapshot();
    assert_eq!(snapshot.rejected_hot_item, 20);
    assert_eq!(snapshot.quota.as_ref().unwrap().granted, 2);
    assert_eq!(
        (snapshot.failures, snapshot.breaker.state),
        (0, rebate_resilience::BreakerState::Closed),
        "refusals are not the API's failures"
    );
    let hot = snapshot.hot_items.unwrap();
    assert_eq!((hot.items_tracked, hot.refused), (25, 20));

    // A second later every item has a token again.
    ticker.advance(Duration::from_secs(1));
    assert_eq!(load_concurrently(&coupons, &first).await.len(), 20);
    assert_eq!(simulator.state().counters(Endpoint::Coupons).items, 45);
    token.cancel();
    simulator.stopped().await;
}

#[tokio::test]
async fn a_batch_is_never_larger_than_the_api_takes_and_fails_as_a_whole() {
    let (simulator, token) = simulator().await;
    let client = http_client(Duration::from_secs(1)).unwrap();
    let batch = BatchConfig {
        max_items: 40,
        window: Duration::from_millis(50),
    };
    let coupons =
        Arc::new(CouponClient::new(client, &simulator.base_url(), guard(None), batch).unwrap());
    let keys = keys(50);
    assert_eq!(load_concurrently(&coupons, &keys).await.len(), 50);
    let counters = simulator.state().counters(Endpoint::Coupons);
    assert_eq!((counters.calls, counters.items), (2, 50));
    assert_eq!(coupons.batch_stats().unwrap().sent_full, 1);

    simulator
        .state()
        .set_fault(
            Endpoint::Coupons,
            Fault {
                outage: true,
                ..Fault::default()
            },
        )
        .unwrap();
    let loads: Vec<_> = keys[..5]
        .iter()
        .map(|key| {
            let coupons = Arc::clone(&coupons);
            let key = *key;
            tokio::spawn(async move { coupons.load(key).await })
        })
        .collect();
    for load in loads {
        assert_eq!(load.await.unwrap().unwrap_err().kind, FailureKind::Error);
    }
    assert_eq!(simulator.state().counters(Endpoint::Coupons).calls, 3);
    token.cancel();
    simulator.stopped().await;
}
