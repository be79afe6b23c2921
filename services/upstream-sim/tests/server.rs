//! `RunningSimulator` over real HTTP on a loopback port 0: serving, and prompt shutdown.

use rebate_testkit::wait_until;
use std::net::SocketAddr;
use std::time::Duration;

use rebate_domain::ItemKey;
use rebate_domain::Timestamp;
use tokio_util::sync::CancellationToken;
use upstream_sim::{
    BatchRequest, BatchResponse, CouponsResponse, Endpoint, ExtrasResponse, Fault, RunningSimulator,
};

const LOOPBACK_ANY_PORT: &str = "127.0.0.1:0";

async fn start() -> (RunningSimulator, CancellationToken) {
    let shutdown = CancellationToken::new();
    let listen: SocketAddr = LOOPBACK_ANY_PORT.parse().unwrap();
    let simulator = RunningSimulator::start(listen, shutdown.clone())
        .await
        .unwrap();
    (simulator, shutdown)
}

#[tokio::test]
async fn serves_over_real_http_and_stops_on_cancel() {
    let (simulator, shutdown) = start().await;
    assert_ne!(simulator.addr().port(), 0);
    assert_eq!(
        simulator.base_url(),
        format!("http://127.0.0.1:{}", simulator.addr().port())
    );
    let client = reqwest::Client::new();
    let base = simulator.base_url();

    let health = client.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().await.unwrap(), "ok");

    let coupons: CouponsResponse = client
        .get(format!("{base}/v1/coupons/taobao/100001"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(coupons.item_id.as_str(), "100001");
    assert!(
        coupons
            .coupons
            .iter()
            .all(|coupon| coupon.expires_at > Timestamp::now())
    );

    // Faults set over HTTP are visible in-process, and the reverse.
    let stored: Fault = client
        .put(format!("{base}/_sim/faults/extras"))
        .json(&Fault {
            rate_limited: true,
            ..Fault::NONE
        })
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(stored.rate_limited);
    assert!(simulator.state().fault(Endpoint::Extras).rate_limited);
    let limited = client
        .get(format!("{base}/v1/extras/jd/1"))
        .send()
        .await
        .unwrap();
    assert_eq!(limited.status(), 429);
    assert_eq!(limited.headers()["retry-after"], "1");
    assert_eq!(simulator.state().counters(Endpoint::Coupons).ok, 1);

    let addr = simulator.addr();
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), simulator.stopped())
        .await
        .expect("stops promptly once cancelled");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "nothing listens after shutdown"
    );
}

#[tokio::test]
async fn shutdown_completes_with_a_hung_request_in_flight() {
    let (simulator, shutdown) = start().await;
    simulator
        .state()
        .set_fault(
            Endpoint::Coupons,
            Fault {
                hang_rate: 1.0,
                ..Fault::NONE
            },
        )
        .unwrap();
    let url = format!("{}/v1/coupons/jd/100001", simulator.base_url());
    let hung = tokio::spawn(async move { reqwest::get(url).await });

    let state = simulator.state().clone();
    wait_until("the simulator counts the call", || {
        state.counters(Endpoint::Coupons).hung == 1
    })
    .await;
    assert!(
        !hung.is_finished(),
        "a hung request does not answer on its own"
    );

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), simulator.stopped())
        .await
        .expect("graceful shutdown does not wait on hung requests");
    let response = tokio::time::timeout(Duration::from_secs(5), hung)
        .await
        .expect("the hung client is released")
        .unwrap()
        .expect("released calls are answered");
    assert_eq!(response.status(), 503);
    assert_eq!(state.counters(Endpoint::Coupons).ok, 0);
}

#[tokio::test]
async fn shutdown_cuts_long_latency_short() {
    let (simulator, shutdown) = start().await;
    simulator
        .state()
        .set_fault(
            Endpoint::Extras,
            Fault {
                latency_ms: 600_000,
                ..Fault::NONE
            },
        )
        .unwrap();
    let url = format!("{}/v1/extras/jd/100001", simulator.base_url());
    let slow = tokio::spawn(async move { reqwest::get(url).await });
    let state = simulator.state().clone();
    wait_until("the simulator counts the call", || {
        state.counters(Endpoint::Extras).calls == 1
    })
    .await;

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), simulator.stopped())
        .await
        .expect("graceful shutdown does not wait out the latency");
    let response = slow.await.unwrap().expect("released calls are answered");
    assert_eq!(response.status(), 503);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "shutting_down");
}

#[tokio::test]
async fn batch_routes_answer_over_real_http() {
    let (simulator, shutdown) = start().await;
    let client = reqwest::Client::new();
    let base = simulator.base_url();
    let keys = [
        ItemKey::parse("pdd", "100003").unwrap(),
        ItemKey::parse("taobao", "100001").unwrap(),
    ];

    // The literal colon survives a real client's URL handling and reaches the batch route.
    let coupons: BatchResponse<CouponsResponse> = client
        .post(format!("{base}/v1/coupons:batch"))
        .json(&BatchRequest::new(keys))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let extras: BatchResponse<ExtrasResponse> = client
        .post(format!("{base}/v1/extras:batch"))
        .json(&BatchRequest::new(keys))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for (index, key) in keys.iter().enumerate() {
        assert_eq!(coupons.items[index].platform, key.platform);
        assert_eq!(coupons.items[index].item_id, key.item_id);
        assert_eq!(extras.items[index].item_id, key.item_id);
        assert_eq!(
            extras.items[index].extras,
            upstream_sim::catalog::extras(*key)
        );
    }
    let counters = simulator.state().counters(Endpoint::Coupons);
    assert_eq!(
        (counters.calls, counters.items, counters.batch_calls),
        (1, 2, 1)
    );

    shutdown.cancel();
    simulator.stopped().await;
}
