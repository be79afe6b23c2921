//! The cross-instance rebuild lease on the production profile (MariaDB, Redis): a lease loser
//! holding a servable copy answers with it at once and takes the winner's value when it comes,
//! however long the winner's load is stuck.

use std::time::Duration;

use query_api::Settings;
use rebate_cache::{Clock as _, SharedTier, TierKey};
use rebate_domain::{ItemKey, PartKind};
use rebate_redis_tier::{RedisTarget, RedisTier, RedisTierConfig};
use rebate_store::CatalogRepository;
use rebate_tests::{ProductionEnv, TestApp, event_for, wait_until, wait_until_true};
use serde_json::{Value, json};
use upstream_sim::Endpoint;

/// Past the coupons' longest fresh window in both tiers (L1 60 s + 10 %, L2 180 s + 60 s), inside
/// their stale windows (600 s), and short of every other part's fresh window (300 s − 10 %).
const COUPONS_EXPIRED: Duration = Duration::from_secs(250);

/// Cold loads on two cores in a debug build, beside other tests, may outlast the tiers' 250 ms
/// and 500 ms: every tier gets 5 s, so that the warm-up's answers are complete.
fn roomy_tiers(settings: &mut Settings) {
    settings.http.request_deadline_ms = 5_000;
    settings.http.request_timeout_ms = 6_000;
    settings.timeouts.core_ms = 5_000;
    settings.timeouts.normal_ms = 5_000;
    settings.timeouts.edge_ms = 5_000;
}

/// Instance A's coupon quota: one call, then none, since nothing moves A's ticker (the quota's
/// clock) until the test releases it.
fn one_coupon_call(settings: &mut Settings) {
    roomy_tiers(settings);
    settings.resilience.coupons.quota_per_sec = Some(1.0);
    settings.resilience.coupons.quota_burst = Some(1);
    // A load waits in its batch for a token up to half its attempt time and its request's
    // deadline less that half: 30 s here, so that A holds the lease for the whole test. The
    // lease lives longer than that.
    settings.timeouts.normal_ms = 60_000;
    settings.http.request_deadline_ms = 60_000;
    settings.http.request_timeout_ms = 60_000;
    settings.redis.lease_ttl_ms = 60_000;
}

/// Instance B follows a lease winner for up to 30 s after answering with its stale copy, so that
/// no count below depends on how fast the test runs: the follower ends with A's value, when the
/// test lets A's load through.
fn long_follow(settings: &mut Settings) {
    roomy_tiers(settings);
    settings.redis.lease_ttl_ms = 60_000;
    settings.redis.lease_wait_ms = 30_000;
}

/// A's coupon load for an item is stuck waiting for a quota token and holds the item's coupons
/// lease in Redis; on B the item's coupons have expired in L1 and L2. B answers at once with its
/// stale coupons (the lease stage says "lost; served stale"), and, after a rate change and its
/// event, with the new rate and the same stale coupons without asking Redis for the lease again.
/// When A's load gets its token, B takes A's value into L1 and answers complete, never having
/// called the coupon API itself. Counted exactly in B's metrics: one stale answer for the lease,
/// one winner's value, no wait given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_change_is_served_at_once_while_another_instance_holds_the_coupons_lease() {
    let env = ProductionEnv::new("lease_stale").await;
    let a = env.spawn_instance(one_coupon_call).await;
    let b = env.spawn_instance(long_follow).await;
    let key = ItemKey::parse("pdd", "100777").unwrap();
    let (platform, item_id) = (key.platform.as_str(), key.item_id.as_str());

    // B loads the item and writes every part to L2; A then reads them all from L2.
    let warm = json_of(b.get_item(platform, item_id).await).await;
    assert_eq!(warm["degraded"], false, "{warm}");
    let coupons_fetched_at = b.clock.now().to_rfc3339();
    let tier = connect_tier(&env).await;
    let tier_keys = PartKind::ALL.map(|part| TierKey { item: key, part });
    wait_until_true("B wrote every part of the item to L2", || async {
        let entries = tier.get_many(&tier_keys).await.unwrap();
        entries.iter().all(Option::is_some)
    })
    .await;
    let on_a = json_of(a.get_item(platform, item_id).await).await;
    assert_eq!(on_a["degraded"], false, "{on_a}");
    assert_eq!(a.upstream_calls(Endpoint::Coupons), 0, "A read L2");

    // A spends its one coupon call on another item.
    assert_eq!(a.get_item("pdd", "100778").await.status(), 200);
    assert_eq!(a.upstream_calls(Endpoint::Coupons), 1);
    let quota = a.state.protection.coupons.snapshot().quota.unwrap();
    assert_eq!((quota.burst, quota.granted), (1, 1), "{quota:?}");

    // The coupons expire on both instances; A's next read starts their reload, which wins the
    // lease and then waits for a token that does not come. That reader waits for its own load:
    // it runs on beside the test.
    for app in [&a, &b] {
        app.clock.advance(COUPONS_EXPIRED);
    }
    let a_won = a.state.engine.parts().coupons.stats().leases_won;
    let a_reader = {
        let (client, url) = (a.client.clone(), a.item_url(platform, item_id));
        tokio::spawn(async move { client.get(url).send().await })
    };
    let lease = format!("{}:v1:{key}:coupons:lease", env.prefix);
    let redis = redis::Client::open(env.redis_url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // The lease is in Redis as soon as A's script ran; A counts it when the answer is back: wait
    // for both, or a look between the two would see the lease and not yet A's count.
    wait_until_true("A holds the coupons lease", || {
        let mut redis = redis.clone();
        let lease = lease.clone();
        let won = a.state.engine.parts().coupons.stats().leases_won;
        async move {
            won == a_won + 1
                && redis::cmd("EXISTS")
                    .arg(lease)
                    .query_async::<u64>(&mut redis)
                    .await
                    .unwrap()
                    == 1
        }
    })
    .await;
    assert_eq!(a.state.engine.parts().coupons.stats().leases_won, a_won + 1);
    assert_eq!(
        a.upstream_calls(Endpoint::Coupons),
        1,
        "A's load is waiting"
    );

    let b_calls = b.upstream_calls(Endpoint::Coupons);
    let before = LeaseCounts::scrape(&b).await;
    let expected_degraded = json!([{"part": "coupons", "reason": "timeout", "served": "stale",
                                    "as_of": coupons_fetched_at}]);

    // B loses the lease and answers with its stale coupons, without waiting for A.
    let first = b.get_item(platform, item_id).await;
    let first_trace = trace_id_of(&first);
    let first = json_of(first).await;
    assert_eq!(first["degraded_parts"], expected_degraded, "{first}");
    let record = json_of(
        b.admin_get(&format!("/admin/v1/slow-requests/{first_trace}"))
            .await,
    )
    .await;
    let lease_stages: Vec<&Value> = record["stages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|stage| stage["kind"] == "lease")
        .collect();
    assert_eq!(lease_stages.len(), 1, "{record}");
    assert_eq!(lease_stages[0]["name"], "coupons", "{record}");
    assert_eq!(lease_stages[0]["outcome"], "lost; served stale", "{record}");
    let b_lost = b.state.engine.parts().coupons.stats().leases_lost;

    // The rate changes; B applies the event (and re-warms the item: its coupons join the load
    // that follows A's lease).
    let store = env.store().await;
    let row = store.rate(key).await.unwrap().unwrap();
    let new_rate: u64 = if row.value.rate_bps.get() == 1_234 {
        1_235
    } else {
        1_234
    };
    store
        .upsert_rate(
            key,
            &rebate_store::Versioned {
                value: rebate_domain::RebateRate {
                    rate_bps: rebate_domain::RateBps::try_from(new_rate).unwrap(),
                },
                version: row.version + 1,
                updated_at: rebate_domain::Timestamp::now(),
            },
        )
        .await
        .unwrap();
    store.close().await;
    let processed = b.state.events.stats().processed;
    b.state
        .events
        .publisher()
        .publish(&event_for(
            rebate_events::EventKind::RateChanged,
            key,
            row.version + 1,
        ))
        .await
        .unwrap();
    // Broadcast and shared delivery (the in-process bus makes B both).
    wait_until("B applied the rate change", || {
        b.state.events.stats().processed >= processed + 2
    })
    .await;

    // The new rate at once, with the coupons B holds: no second lease attempt, no wait.
    let changed = b.get_item(platform, item_id).await;
    let changed_trace = trace_id_of(&changed);
    let changed = json_of(changed).await;
    assert_eq!(changed["rebate"]["rate_bps"], new_rate, "{changed}");
    assert_eq!(changed["rebate"]["source"], "live", "{changed}");
    assert_eq!(changed["degraded_parts"], expected_degraded, "{changed}");
    assert_eq!(changed["coupons"], warm["coupons"], "{changed}");
    let record = json_of(
        b.admin_get(&format!("/admin/v1/slow-requests/{changed_trace}"))
            .await,
    )
    .await;
    assert!(
        record["stages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|stage| stage["kind"] != "lease"),
        "{record}"
    );
    assert_eq!(b.state.engine.parts().coupons.stats().leases_lost, b_lost);
    let answered = LeaseCounts::scrape(&b).await;
    assert_eq!(
        answered.minus(&before),
        LeaseCounts {
            stale_answers: 1,
            winner_values: 0,
            gave_up: 0
        }
    );

    // A's quota refills: its load makes the call and writes L2; B takes that value into L1.
    let b_served = b.state.engine.parts().coupons.stats().lease_waits_served;
    a.ticker.advance(Duration::from_secs(1));
    wait_until("B took A's coupons from L2", || {
        b.state.engine.parts().coupons.stats().lease_waits_served > b_served
    })
    .await;
    assert_eq!(a.upstream_calls(Endpoint::Coupons), 2);
    let on_a = json_of(a_reader.await.unwrap().unwrap()).await;
    assert_eq!(on_a["degraded"], false, "A's reader got A's load: {on_a}");
    let complete = json_of(b.get_item(platform, item_id).await).await;
    assert_eq!(complete["degraded"], false, "{complete}");
    assert_eq!(complete["rebate"]["rate_bps"], new_rate, "{complete}");
    assert_eq!(
        b.upstream_calls(Endpoint::Coupons),
        b_calls,
        "B never called"
    );
    let after = LeaseCounts::scrape(&b).await;
    assert_eq!(
        after.minus(&before),
        LeaseCounts {
            stale_answers: 1,
            winner_values: 1,
            gave_up: 0
        }
    );

    a.stop().await;
    b.stop().await;
    env.clean_up().await;
}

/// B's coupons lease counters, from its `/metrics`.
#[derive(Debug, PartialEq, Eq)]
struct LeaseCounts {
    stale_answers: u64,
    winner_values: u64,
    gave_up: u64,
}

impl LeaseCounts {
    async fn scrape(app: &TestApp) -> Self {
        let metrics = app.metrics_text().await;
        Self {
            stale_answers: sample(
                &metrics,
                r#"rebate_cache_lease_stale_answers_total{part="coupons"}"#,
            ),
            winner_values: sample(
                &metrics,
                r#"rebate_cache_lease_waits_total{part="coupons",outcome="winner_value"}"#,
            ),
            gave_up: sample(
                &metrics,
                r#"rebate_cache_lease_waits_total{part="coupons",outcome="gave_up"}"#,
            ),
        }
    }

    fn minus(&self, earlier: &Self) -> Self {
        Self {
            stale_answers: self.stale_answers - earlier.stale_answers,
            winner_values: self.winner_values - earlier.winner_values,
            gave_up: self.gave_up - earlier.gave_up,
        }
    }
}

/// The value of one series of the exposition; the series must be there.
fn sample(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} missing from:\n{metrics}"))
        .parse()
        .unwrap()
}

async fn json_of(response: reqwest::Response) -> Value {
    assert_eq!(response.status(), 200);
    response.json().await.expect("a JSON body")
}

fn trace_id_of(response: &reqwest::Response) -> String {
    response.headers()["x-trace-id"]
        .to_str()
        .unwrap()
        .to_owned()
}

async fn connect_tier(env: &ProductionEnv) -> RedisTier {
    let mut settings = RedisTierConfig::new(RedisTarget::Single(env.redis_url.clone()));
    settings.prefix = env.prefix.clone();
    settings.command_timeout = Duration::from_secs(2);
    RedisTier::connect(settings).await.unwrap()
}
