//! The HTTP clients against the real simulator over loopback: decoding, and how each kind of
//! upstream failure is classified.

use std::time::Duration;

use rebate_cache::{FailureKind, Loader};
use rebate_domain::ItemKey;
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

fn key() -> ItemKey {
    ItemKey::parse("jd", "100002").unwrap()
}

#[tokio::test]
async fn decodes_coupons_and_extras_with_versions() {
    let (simulator, token) = simulator().await;
    let client = http_client(Duration::from_secs(1)).unwrap();
    let coupons = CouponClient::new(client.clone(), &simulator.base_url()).unwrap();
    let extras = ExtrasClient::new(client, &simulator.base_url()).unwrap();

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
    let coupons = CouponClient::new(client, &simulator.base_url()).unwrap();
    for fault in [
        Fault {
            outage: true,
            ..Fault::default()
        },
        Fault {
            rate_limited: true,
            ..Fault::default()
        },
        Fault {
            error_rate: 1.0,
            ..Fault::default()
        },
    ] {
        simulator
            .state()
            .set_fault(Endpoint::Coupons, fault)
            .unwrap();
        let failure = coupons.load(key()).await.unwrap_err();
        assert_eq!(failure.kind, FailureKind::Error, "{fault:?}");
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
    let coupons = CouponClient::new(client, &format!("http://127.0.0.1:{port}")).unwrap();
    let failure = coupons.load(key()).await.unwrap_err();
    assert_eq!(failure.kind, FailureKind::Error);
}
