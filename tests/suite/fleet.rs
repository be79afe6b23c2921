//! A fleet of instances on one Redis: what holds for all of them together rather than for each.

use std::time::Duration;

use query_api::Settings;
use rebate_tests::{ProductionEnv, RedisServer, TestApp, free_port};
use serde_json::Value;
use upstream_sim::{Endpoint, SimState};

/// 5 calls a second and a burst of 2 for the coupon API, fleet-wide; one call per item so that
/// every cold item costs one.
fn small_fleet_quota(settings: &mut Settings) {
    settings.resilience.fleet.quotas = true;
    settings.resilience.fleet.heartbeat_ms = 200;
    settings.resilience.coupons.quota_per_sec = Some(5.0);
    settings.resilience.coupons.quota_burst = Some(2);
    settings.upstreams.coupons_batch_max_items = 1;
}

/// Cold items asked of every instance for `steps` × 50 ms, each instance's ticker (its quota's
/// clock) moving with the wall clock. Returns how many answers were 200 or 404.
async fn cold_load(instances: &[TestApp], first_id: u64, steps: u64) -> usize {
    let mut requests = Vec::new();
    let mut next = first_id;
    for _ in 0..steps {
        for instance in instances {
            for _ in 0..3 {
                let url = instance.item_url("jd", &next.to_string());
                let client = instance.client.clone();
                next += 1;
                requests.push(tokio::spawn(async move {
                    client
                        .get(url)
                        .send()
                        .await
                        .map(|response| response.status().as_u16())
                }));
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        for instance in instances {
            instance.ticker.advance(Duration::from_millis(50));
        }
    }
    let mut answered = 0;
    for request in requests {
        if matches!(request.await.unwrap(), Ok(200 | 404)) {
            answered += 1;
        }
    }
    answered
}

async fn coupon_quota(instance: &TestApp) -> Value {
    let status: Value = instance
        .admin_get("/admin/v1/status")
        .await
        .json()
        .await
        .unwrap();
    status["protection"]["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|dependency| dependency["name"] == "coupons")
        .unwrap()["quota"]
        .clone()
}

/// Three instances behind one contract: together they never call the API more than the quota
/// allows in any one-second window, and with Redis gone each keeps to its third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_one_outbound_quota_and_fall_back_to_their_shares() {
    let port = free_port();
    let redis = RedisServer::start(port);
    let mut env =
        ProductionEnv::with_redis("fleet_quota", format!("redis://127.0.0.1:{port}")).await;
    let simulator: SimState = env.share_simulator().await;
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(
            env.spawn_instance(|settings| {
                small_fleet_quota(settings);
                settings.redis.command_timeout_ms = 200;
            })
            .await,
        );
    }
    // Every instance has beaten at least once: each sees the other two.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let quota = coupon_quota(&instances[0]).await;
    assert_eq!(quota["scope"], "fleet", "{quota}");
    assert_eq!(quota["fleet"]["live_instances"], 3, "{quota}");

    // 2 s of 180 cold items a second over the three: the contract is 2 + 5 calls a second.
    let answered = cold_load(&instances, 100_001, 40).await;
    assert_eq!(answered, 360);
    let calls = simulator.counters(Endpoint::Coupons);
    eprintln!("fleet-wide, Redis up: {calls:?}");
    assert!(
        calls.peak_calls_per_sec <= 7 && calls.calls >= 10,
        "fleet-wide: {calls:?}"
    );

    // Redis stops: each instance falls back to a third of the quota (a burst of 1, then 5/3 a
    // second), counted by its own guard.
    drop(redis);
    simulator.reset_counters();
    let before: Vec<u64> = {
        let mut granted = Vec::new();
        for instance in &instances {
            granted.push(
                coupon_quota(instance).await["fleet"]["granted_from_share"]
                    .as_u64()
                    .unwrap(),
            );
        }
        granted
    };
    cold_load(&instances, 101_001, 40).await;
    for (instance, before) in instances.iter().zip(before) {
        let quota = coupon_quota(instance).await;
        let from_share = quota["fleet"]["granted_from_share"].as_u64().unwrap() - before;
        eprintln!("one instance, Redis down: {from_share} calls from its share");
        // 1 + 5/3 × 2 s, rounded up.
        assert!(
            (1..=5).contains(&from_share),
            "{from_share} calls from the share: {quota}"
        );
        assert_eq!(quota["fleet"]["reachable"], false, "{quota}");
    }
    let calls = simulator.counters(Endpoint::Coupons);
    assert!(
        calls.calls <= 15 && calls.peak_calls_per_sec <= 9,
        "{calls:?}"
    );

    for instance in instances {
        instance.stop().await;
    }
    env.clean_up().await;
}
