//! The production data path against the real MariaDB and Redis on this machine: two instances
//! sharing one database and one Redis prefix, with a Bloom filter, leases and version fences.
//! Every test has its own database and key prefix, so tests run in parallel.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use rebate_cache::{Envelope, SharedTier, TierEntry, TierKey};
use rebate_domain::{ItemKey, PartKind, Product, Timestamp};
use rebate_redis_tier::{RedisTarget, RedisTier, RedisTierConfig};
use rebate_store::CatalogRepository;
use rebate_tests::amqp::{AmqpFleet, CuttableProxy};
use rebate_tests::{
    ProductionEnv, RedisServer, TestApp, event_for, follow_the_wall_clock, free_port, wait_until,
    wait_until_true,
};
use serde_json::{Value, json};
use upstream_sim::Endpoint;

/// The properties under test here are single flight and round trips, not speed: a burst on two
/// cores in a debug build may outlast the edge tier, so every tier gets room. The whole burst
/// comes from one address, so the per-address connection cap (256) is off: a slow moment would
/// otherwise open more connections than it allows and have them refused. Leases are patient too.
fn patient(settings: &mut query_api::Settings) {
    settings.http.max_connections_per_peer = 0;
    // A lease loser waits for the winner's write rather than loading itself after 300 ms.
    settings.redis.lease_ttl_ms = 10_000;
    settings.redis.lease_wait_ms = 5_000;
    settings.http.request_deadline_ms = 5_000;
    settings.http.request_timeout_ms = 6_000;
    settings.timeouts.core_ms = 5_000;
    settings.timeouts.normal_ms = 5_000;
    settings.timeouts.edge_ms = 5_000;
}

fn product_loads(apps: &[&TestApp]) -> u64 {
    apps.iter().map(|app| app.product_loads()).sum()
}

fn rate_loads(apps: &[&TestApp]) -> u64 {
    apps.iter().map(|app| app.rate_loads()).sum()
}

fn upstream_calls(apps: &[&TestApp], endpoint: Endpoint) -> u64 {
    apps.iter().map(|app| app.upstream_calls(endpoint)).sum()
}

fn redis_round_trips(app: &TestApp) -> u64 {
    app.state
        .tier
        .as_ref()
        .expect("production instances have a Redis tier")
        .stats()
        .round_trips
}

/// 1,000 concurrent requests for one cold item, spread over two instances: exactly one MySQL
/// query per part and one upstream call per API across the fleet, every answer identical.
#[tokio::test]
async fn one_cold_item_is_rebuilt_once_across_two_instances() {
    let env = ProductionEnv::new("single_flight").await;
    let first = env.spawn_instance(patient).await;
    let second = env.spawn_instance(patient).await;
    let requests = (0..1_000).map(|index| {
        let app = if index % 2 == 0 { &first } else { &second };
        app.get_item("taobao", "100777")
    });
    let responses = join_all(requests).await;
    let mut bodies = Vec::new();
    for response in responses {
        assert_eq!(response.status(), 200);
        let mut body: Value = response.json().await.unwrap();
        body.as_object_mut().unwrap().remove("trace_id");
        bodies.push(body);
    }
    let first_body = &bodies[0];
    if let Some(other) = bodies.iter().find(|body| *body != first_body) {
        panic!("answers differ:\n{first_body}\n{other}");
    }
    assert_eq!(first_body["degraded"], false, "{first_body}");
    let apps = [&first, &second];
    assert_eq!(product_loads(&apps), 1);
    assert_eq!(rate_loads(&apps), 1);
    assert_eq!(upstream_calls(&apps, Endpoint::Coupons), 1);
    assert_eq!(upstream_calls(&apps, Endpoint::Extras), 1);
    first.stop().await;
    second.stop().await;
    env.clean_up().await;
}

/// 10,000 random unknown ids: only the filter's false positives reach MySQL, and each is then
/// cached as not-found, so a second pass costs no query at all.
#[tokio::test]
async fn unknown_ids_stop_at_the_bloom_filter() {
    let env = ProductionEnv::new("bloom").await;
    let app = env.spawn_instance(|_| {}).await;
    let filter = app
        .state
        .engine
        .item_filter()
        .expect("bloom enabled")
        .clone();
    wait_until("the bloom filter is built", || filter.is_ready()).await;
    let ids: Vec<String> = (0..10_000u64)
        .map(|index| (900_000_000_000 + index * 7_919).to_string())
        .collect();

    let first_pass = query_all(&app, &ids).await;
    assert!(first_pass.iter().all(|status| *status == 404));
    let passed = 10_000 - filter.stats().rejections;
    // Only false positives reach the store: about 0.1 %, i.e. ~10 of 10,000.
    assert!(passed < 60, "{passed} ids passed the filter");
    assert_eq!(app.product_loads(), passed);

    let loads_before = (app.product_loads(), app.rate_loads());
    let second_pass = query_all(&app, &ids).await;
    assert!(second_pass.iter().all(|status| *status == 404));
    assert_eq!((app.product_loads(), app.rate_loads()), loads_before);
    app.stop().await;
    env.clean_up().await;
}

/// Queries every id on jd in 50-key batches, 8 batches at a time; returns per-item statuses.
async fn query_all(app: &TestApp, ids: &[String]) -> Vec<u64> {
    let mut statuses = Vec::with_capacity(ids.len());
    for group in ids.chunks(400) {
        let batches = group.chunks(50).map(|chunk| {
            let items: Vec<Value> = chunk
                .iter()
                .map(|id| json!({"platform": "jd", "item_id": id}))
                .collect();
            async move { app.post_batch(&json!({ "items": items })).await }
        });
        for response in join_all(batches).await {
            assert_eq!(response.status(), 200);
            let body: Value = response.json().await.unwrap();
            statuses.extend(
                body["results"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|result| result["status"].as_u64().unwrap()),
            );
        }
    }
    statuses
}

/// A 50-key batch on an instance whose L1 is cold but whose L2 is warm costs one Redis round
/// trip and no MySQL query.
#[tokio::test]
async fn a_batch_reads_l2_in_one_round_trip() {
    let env = ProductionEnv::new("batch_l2").await;
    let warm = env.spawn_instance(patient).await;
    let items: Vec<Value> = (100_101..100_151u64)
        .map(|id| json!({"platform": "pdd", "item_id": id.to_string()}))
        .collect();
    let batch = json!({ "items": items });
    assert_eq!(warm.post_batch(&batch).await.status(), 200);
    // The L2 writes happen off the request path; wait until all 200 have landed.
    let tier = connect_tier(&env).await;
    let keys: Vec<TierKey> = (100_101..100_151u64)
        .flat_map(|id| {
            PartKind::ALL.map(|part| TierKey {
                item: ItemKey::parse("pdd", &id.to_string()).unwrap(),
                part,
            })
        })
        .collect();
    let mut all_written = false;
    for _ in 0..500 {
        let entries = tier.get_many(&keys).await.unwrap();
        if entries.iter().all(Option::is_some) {
            all_written = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        all_written,
        "the warm instance did not write all 200 entries to L2"
    );

    let cold = env.spawn_instance(patient).await;
    let before = redis_round_trips(&cold);
    let response = cold.post_batch(&batch).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 50);
    assert!(results.iter().all(|result| result["status"] == 200));
    assert!(
        results
            .iter()
            .all(|result| result["quote"]["degraded"] == false)
    );
    assert_eq!(redis_round_trips(&cold) - before, 1);
    assert_eq!(cold.product_loads() + cold.rate_loads(), 0);
    assert_eq!(cold.upstream_calls(Endpoint::Coupons), 0);
    warm.stop().await;
    cold.stop().await;
    env.clean_up().await;
}

async fn connect_tier(env: &ProductionEnv) -> RedisTier {
    let mut settings = RedisTierConfig::new(RedisTarget::Single(env.redis_url.clone()));
    settings.prefix = env.prefix.clone();
    settings.command_timeout = Duration::from_secs(2);
    RedisTier::connect(settings).await.unwrap()
}

/// A rebuild carrying an older data version never replaces a newer one in L2: the fence holds
/// although the rebuild itself succeeds and its caller is answered.
#[tokio::test]
async fn an_older_rebuild_cannot_overwrite_a_newer_l2_entry() {
    let env = ProductionEnv::new("fence").await;
    let tier = connect_tier(&env).await;
    let key = ItemKey::parse("taobao", "100321").unwrap();
    let tier_key = TierKey {
        item: key,
        part: PartKind::Product,
    };
    // An entry at version 1000, past its fresh window but inside its stale window.
    let now = Timestamp::now();
    let newer: Envelope<Product> = Envelope {
        value: None,
        version: 1_000,
        fetched_at: Timestamp::from_millis(now.as_millis() - 60_000),
        fresh_until: Timestamp::from_millis(now.as_millis() - 1_000),
        stale_until: now.saturating_add_millis(600_000),
        tombstone: false,
    };
    let entry = TierEntry {
        version: 1_000,
        bytes: newer.encode().unwrap(),
    };
    tier.put_fenced(tier_key, &entry, Duration::from_secs(600))
        .await
        .unwrap();

    let app = env.spawn_instance(|_| {}).await;
    // The instance rebuilds from MySQL (versions 1–3) and answers with that row...
    assert_eq!(app.get_item("taobao", "100321").await.status(), 200);
    assert_eq!(app.product_loads(), 1);
    // ...but its write-back is refused: L2 still holds version 1000.
    let cache = &app.state.engine.parts().product;
    wait_until("the fenced write was refused", || {
        cache.stats().fenced_writes_refused == 1
    })
    .await;
    let stored = tier.get_many(&[tier_key]).await.unwrap();
    assert_eq!(stored[0].as_ref().map(|entry| entry.version), Some(1_000));
    app.stop().await;
    env.clean_up().await;
}

/// Warm-up loads the hottest items into L1 at start: asking for one then costs no MySQL query.
#[tokio::test]
async fn warm_up_loads_the_hot_items() {
    let env = ProductionEnv::new("warmup").await;
    let app = env
        .spawn_instance(|settings| {
            settings.warmup.enabled = true;
            settings.warmup.hot_items_limit = 30;
            settings.warmup.items = vec!["jd:105555".to_owned()];
            settings.warmup.rate_per_sec = 1_000;
        })
        .await;
    let product = &app.state.engine.parts().product;
    let hot = ItemKey::parse("taobao", "100001").unwrap();
    let configured = ItemKey::parse("jd", "105555").unwrap();
    wait_until("warm-up reached the hot items", || {
        product.peek(&hot).is_some() && product.peek(&configured).is_some()
    })
    .await;
    wait_until("warm-up finished", || app.product_loads() == 31).await;
    let loads = app.product_loads();
    assert_eq!(app.get_item("taobao", "100001").await.status(), 200);
    assert_eq!(app.get_item("jd", "105555").await.status(), 200);
    assert_eq!(app.product_loads(), loads);
    app.stop().await;
    env.clean_up().await;
}

/// A Redis of the test's own, killed mid-test and restarted: warm items keep answering from L1,
/// cold ones load from MySQL under the concurrency bound, the Redis breaker opens so that misses
/// stop paying command timeouts, and L2 is used again once Redis is back.
#[tokio::test]
async fn redis_outage_never_fails_a_request() {
    let port = free_port();
    let redis = RedisServer::start(port);
    let env = ProductionEnv::with_redis("redis_outage", format!("redis://127.0.0.1:{port}")).await;
    let app = env
        .spawn_instance(|settings| {
            settings.store.max_concurrent_loads = 4;
            settings.redis.command_timeout_ms = 50;
            // The recovery loop below drops the product's L1 copy to force reads through L2; a
            // kept rendering would answer without asking L1 at all.
            settings.engine.rendered_max_bytes = 0;
        })
        .await;
    for id in 100_201..100_221u64 {
        assert_eq!(app.get_item("jd", &id.to_string()).await.status(), 200);
    }

    drop(redis);
    // Warm items: L1 hits. Cold items: Redis errors are skipped, MySQL answers.
    let statuses: Vec<u16> = join_all((100_201..100_221u64).chain(100_301..100_401).map(|id| {
        let app = &app;
        async move { app.get_item("jd", &id.to_string()).await.status().as_u16() }
    }))
    .await;
    assert!(statuses.iter().all(|status| *status == 200), "{statuses:?}");
    assert!(app.state.load_limiter.max_in_flight() <= 4);
    let cache = &app.state.engine.parts().product;
    assert!(cache.stats().l2_errors > 0);
    // The Redis breaker opened: later misses skipped L2 at once instead of paying a timeout.
    let redis_guard = app.state.protection.redis.snapshot();
    assert!(redis_guard.breaker.trips >= 1, "{redis_guard:?}");
    for id in 100_401..100_411u64 {
        assert_eq!(app.get_item("jd", &id.to_string()).await.status(), 200);
    }
    let redis_guard = app.state.protection.redis.snapshot();
    assert!(redis_guard.rejected_breaker > 0, "{redis_guard:?}");

    // Redis returns (empty, as after a restart): after the breaker's cool-down its probes find
    // the tier answering again, and it is written again.
    let redis = RedisServer::start(port);
    let tier = connect_tier(&env).await;
    let key = ItemKey::parse("jd", "100500").unwrap();
    let tier_key = TierKey {
        item: key,
        part: PartKind::Product,
    };
    let mut recovered = false;
    for _ in 0..100 {
        assert_eq!(app.get_item("jd", "100500").await.status(), 200);
        if tier.get_many(&[tier_key]).await.unwrap()[0].is_some() {
            recovered = true;
            break;
        }
        // Make the next request miss L1 again so that it goes through L2; give the client time
        // to reconnect, and the breaker (whose probes may meet a tier still reconnecting) its
        // longest cool-down.
        cache.invalidate(&key);
        tokio::time::sleep(Duration::from_millis(50)).await;
        app.ticker.advance(Duration::from_secs(61));
    }
    assert!(
        recovered,
        "the L2 tier was not written after Redis came back"
    );
    app.stop().await;
    env.clean_up().await;
    drop(redis);
}

/// Instances on RabbitMQ serve a rate; the row changes and an event is published → every
/// instance serves the new rate. Repeated round after round, each time through the next
/// instance's publisher, it reports the propagation latency (event published → every instance
/// answers with the new rate; the instances are polled while the publisher waits for the
/// broker's confirm, whose time is reported beside) for docs/BENCHMARKS.md.
///
/// Knobs for the measurement (run it with `cargo test --release`; docs/BENCHMARKS.md):
/// - `PROPAGATION_INSTANCES` (default 3) and `PROPAGATION_ROUNDS` (default 200);
/// - `PROPAGATION_LOAD_RPS` (default 0): an open-loop load of that many requests a second over
///   1,000 demo items, spread over the instances, from its own runtime (two threads) and HTTP
///   client; `half` first measures what the fleet answers
///   at most under that load (offered far more than it answers, for 5 s) and offers half of it;
/// - `PROPAGATION_ROUND_EVERY_MS` (default 0): the least time from one round's start to the
///   next, so that a run of rounds outlasts the parts' fresh windows.
///
/// Under a load the fleet runs as in production, not as the suite's other tests: one upstream
/// simulator for the fleet, fleet-wide quotas and the production profile's store and connection
/// settings, the default quotas, per-item limits and Redis command timeout that the suite's
/// harness changes, and service clocks that follow the wall clock, so that entries expire on
/// their default lifetimes (coupons fresh 60 s in L1 and 180–240 s in L2, extras 300 s in L1).
/// The coupons' and extras' cache counters before and after the rounds show what reloaded
/// during them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_changes_propagate_to_three_instances_over_rabbitmq() {
    let instance_count: usize = propagation_knob("PROPAGATION_INSTANCES").unwrap_or(3);
    let rounds: u64 = propagation_knob("PROPAGATION_ROUNDS").unwrap_or(200);
    let round_every =
        Duration::from_millis(propagation_knob("PROPAGATION_ROUND_EVERY_MS").unwrap_or(0));
    let offered = match std::env::var("PROPAGATION_LOAD_RPS").ok().as_deref() {
        None | Some("" | "0") => OfferedLoad::None,
        Some("half") => OfferedLoad::HalfOfCapacity,
        Some(rps) => OfferedLoad::Fixed(
            rps.parse()
                .expect("PROPAGATION_LOAD_RPS is requests a second or `half`"),
        ),
    };
    let loaded = offered != OfferedLoad::None;
    let mut env = ProductionEnv::new("propagation").await;
    let simulator = if loaded {
        Some(env.share_simulator().await)
    } else {
        None
    };
    let fleet = AmqpFleet::spawn(&env, "propagation", instance_count, |_, settings| {
        if loaded {
            as_in_production(settings);
        }
    })
    .await;
    let instances = &fleet.instances;
    let clocks_stop = tokio_util::sync::CancellationToken::new();
    let clocks = loaded.then(|| follow_the_wall_clock(instances, clocks_stop.clone()));
    let (_, ready) = instances[0].readyz().await;
    assert_eq!(
        ready,
        json!({"ready": true, "phase": "serving", "store": "ok", "redis": "ok",
               "events": "connected", "degraded": []})
    );
    let urls: Arc<Vec<Vec<String>>> = Arc::new(
        instances
            .iter()
            .map(|app| {
                (0..1_000)
                    .map(|index| app.item_url("jd", &(100_001 + index).to_string()))
                    .collect()
            })
            .collect(),
    );
    // The load runs on its own runtime with its own client: in production clients are other
    // processes, and a generator on the instances' runtime queued their tasks (the event
    // deliveries and the rounds' polls among them) behind hundreds of its own.
    let generator = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("propagation-load")
        .enable_all()
        .build()
        .expect("the load's runtime");
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("http client");
    let load_rps = match offered {
        OfferedLoad::None => 0,
        OfferedLoad::Fixed(rps) => rps,
        OfferedLoad::HalfOfCapacity => {
            let capacity = {
                let (client, urls) = (client.clone(), Arc::clone(&urls));
                generator
                    .spawn(async move { capacity(&client, &urls).await })
                    .await
                    .unwrap()
            };
            eprintln!(
                "propagation: {} instances answered {capacity:.0} requests a second at most \
                 (the load offered {SATURATING_RPS} a second for 5 s, after one pass over the \
                 1,000 items)",
                instances.len()
            );
            (capacity / 2.0).round() as u64
        }
    };
    let load_stop = tokio_util::sync::CancellationToken::new();
    let load = (load_rps > 0).then(|| {
        let _on_its_runtime = generator.enter();
        open_loop(
            client.clone(),
            Arc::clone(&urls),
            load_rps,
            load_stop.clone(),
        )
    });

    let store = env.store().await;
    let key = ItemKey::parse("pdd", "100888").unwrap();
    let mut version = store.rate(key).await.unwrap().unwrap().version;
    // Under load the caches start cold: the first answers may degrade until they fill.
    for app in instances {
        wait_until_true("the rate is served", || async {
            rate_of(app, key).await.is_some()
        })
        .await;
    }
    if load.is_some() {
        // The rounds measure propagation, not the cold start: in the first seconds every
        // instance is loading the load's 1,000 items and one poll took 100–280 ms.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }

    let load_average_before = load_average();
    let reloads_before = PartReloads::of(instances);
    let calls_before = simulator.as_ref().map(upstream_call_counts);
    // Per round: when every instance served the new rate; when the publisher had the broker's
    // confirm; and the later of the two (the measure before polls overlapped the confirm).
    let mut latencies = Vec::new();
    let mut confirms = Vec::new();
    let mut with_confirms = Vec::new();
    // Where the slowest round spent its time, to explain the tail, and every round over 50 ms.
    let mut slowest: Option<(Duration, String)> = None;
    let mut over_target: Vec<String> = Vec::new();
    // Rounds that ended with an instance shedding load: the fleet was not at half its capacity.
    let mut shedding_rounds = 0u64;
    let mut next_round = std::time::Instant::now();
    for round in 0..rounds {
        let pause = next_round.saturating_duration_since(std::time::Instant::now());
        tokio::time::sleep(pause).await;
        next_round = std::time::Instant::now() + round_every;
        version += 1;
        let rate_bps = 1_000 + round % 5_000;
        write_rate(&store, key, version, rate_bps).await;
        let event = event_for(rebate_events::EventKind::RateChanged, key, version);
        let through = (round % instances.len() as u64) as usize;
        let processed: Vec<u64> = instances
            .iter()
            .map(|app| app.state.events.stats().processed)
            .collect();
        let leases_before: Vec<[rebate_cache::CacheStatsSnapshot; 2]> =
            instances.iter().map(rate_and_coupons).collect();
        // Per instance: when its event count moved (the event applied), when it served the new
        // rate, and its slowest poll with that answer's trace id.
        let mut applied: Vec<Option<Duration>> = vec![None; instances.len()];
        let mut served: Vec<Option<Duration>> = vec![None; instances.len()];
        let mut slowest_poll: Vec<(Duration, Option<String>)> =
            vec![(Duration::ZERO, None); instances.len()];
        let started = std::time::Instant::now();
        // The instances are polled while the publisher waits for the broker's confirm: the
        // broker delivers to the queues before it confirms a persistent message (it confirms
        // once the message is on disk), and the answers are what clients meet. The confirm's
        // time is kept and reported beside the rounds.
        let publisher = instances[through].state.events.publisher();
        let publish = async {
            publisher.publish(&event).await.unwrap();
            started.elapsed()
        };
        let poll = async {
            while served.iter().any(Option::is_none) {
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "round {round}: the new rate did not reach every instance"
                );
                for (index, app) in instances.iter().enumerate() {
                    if served[index].is_some() {
                        continue;
                    }
                    if applied[index].is_none()
                        && app.state.events.stats().processed > processed[index]
                    {
                        applied[index] = Some(started.elapsed());
                    }
                    let polled = std::time::Instant::now();
                    let (answer, trace_id) = traced_rate_of(app, key).await;
                    let took = polled.elapsed();
                    if took > slowest_poll[index].0 {
                        slowest_poll[index] = (took, trace_id);
                    }
                    if answer == Some(rate_bps) {
                        served[index] = Some(started.elapsed());
                    }
                }
                if served.iter().any(Option::is_none) {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            started.elapsed()
        };
        let (confirmed, took) = tokio::join!(publish, poll);
        latencies.push(took);
        confirms.push(confirmed);
        with_confirms.push(took.max(confirmed));
        if instances
            .iter()
            .any(|app| app.state.protection.level() as u8 > 0)
        {
            shedding_rounds += 1;
        }
        let slowest_so_far = slowest.as_ref().is_none_or(|(longest, _)| took > *longest);
        if slowest_so_far || took > PROPAGATION_TARGET {
            let mut stages = Vec::new();
            for (index, app) in instances.iter().enumerate() {
                let [rate, coupons] = rate_and_coupons(app);
                let [rate_before, coupons_before] = leases_before[index];
                let (poll, trace_id) = &slowest_poll[index];
                // Only a poll that took a while has a record worth reading (and the slow log
                // keeps only those, and degraded answers).
                let record = match trace_id {
                    Some(trace_id) if *poll > Duration::from_millis(10) => {
                        slow_request_summary(app, trace_id).await
                    }
                    _ => String::new(),
                };
                stages.push(format!(
                    "instance {index}: applied {:?}, served {:?}, slowest poll {poll:?}{record}, \
                     rate leases lost {}, coupons leases lost {} (served stale {}, gave up {})",
                    applied[index],
                    served[index],
                    rate.leases_lost - rate_before.leases_lost,
                    coupons.leases_lost - coupons_before.leases_lost,
                    coupons.lease_losses_served_stale - coupons_before.lease_losses_served_stale,
                    coupons.lease_waits_given_up - coupons_before.lease_waits_given_up,
                ));
            }
            let breakdown = format!(
                "round {round} through instance {through}: publish confirmed {confirmed:?}; {}",
                stages.join("; ")
            );
            if took > PROPAGATION_TARGET {
                over_target.push(format!("{took:?}: {breakdown}"));
            }
            if slowest_so_far {
                slowest = Some((took, breakdown));
            }
        }
    }
    let reloads = PartReloads::of(instances).since(&reloads_before);
    let calls = simulator
        .as_ref()
        .zip(calls_before)
        .map(|(simulator, before)| {
            let after = upstream_call_counts(simulator);
            (after.0 - before.0, after.1 - before.1)
        });
    let load_average_after = load_average();
    load_stop.cancel();
    let load = match load {
        Some(load) => {
            let LoadTally {
                sent,
                skipped,
                answered: [ok, shed, other],
            } = load.await.unwrap();
            format!(
                "under {load_rps} rps offered ({sent} sent: {ok} answered 200, {shed} shed 503, \
                 {other} other; {skipped} skipped at {LOAD_IN_FLIGHT} in flight)"
            )
        }
        None => "idle".to_owned(),
    };
    generator.shutdown_background();
    clocks_stop.cancel();
    if let Some(clocks) = clocks {
        clocks.await.unwrap();
    }
    let summary = |times: &mut Vec<Duration>| {
        times.sort();
        let percentile = |p: usize| times[(times.len() * p / 100).min(times.len() - 1)];
        format!(
            "p50 {:?}, p99 {:?}, max {:?}",
            percentile(50),
            percentile(99),
            times[times.len() - 1]
        )
    };
    eprintln!(
        "propagation over {rounds} events to {} instances, {load}: {}",
        instances.len(),
        summary(&mut latencies)
    );
    eprintln!(
        "propagation: the publisher's confirm {}; the later of the confirm and the last new \
         answer {}",
        summary(&mut confirms),
        summary(&mut with_confirms)
    );
    eprintln!(
        "propagation: {shedding_rounds} rounds ended with an instance shedding; the machine's \
         load average {load_average_before} before the rounds, {load_average_after} after"
    );
    eprintln!("propagation: during the rounds, summed over the instances: {reloads}");
    if let Some((coupons, extras)) = calls {
        eprintln!(
            "propagation: upstream calls during the rounds: coupons {coupons}, extras {extras}"
        );
    }
    if let Some((took, breakdown)) = slowest {
        eprintln!("propagation: the slowest round ({took:?}): {breakdown}");
    }
    eprintln!(
        "propagation: {} rounds over {PROPAGATION_TARGET:?}",
        over_target.len()
    );
    for round in over_target.iter().take(10) {
        eprintln!("propagation: over {PROPAGATION_TARGET:?}: {round}");
    }

    store.close().await;
    fleet.stop().await;
    env.clean_up().await;
}

/// The most requests the load has in flight: a tick that finds them all out is skipped.
const LOAD_IN_FLIGHT: u64 = 512;

/// The bound on a round's propagation at the 99th percentile: rounds above it are
/// printed with their breakdown.
const PROPAGATION_TARGET: Duration = Duration::from_millis(50);

/// The machine's 1, 5 and 15 minute load averages (`/proc/loadavg`): whatever else ran beside
/// the measurement shows there.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "unknown".to_owned(),
        |text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        },
    )
}

/// A number from the environment, for the propagation measurement's knobs.
fn propagation_knob<T: std::str::FromStr>(name: &str) -> Option<T> {
    let text = std::env::var(name).ok()?;
    Some(
        text.parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a number")),
    )
}

/// The load the propagation measurement runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OfferedLoad {
    None,
    Fixed(u64),
    /// Half of what the fleet answers at most, measured first.
    HalfOfCapacity,
}

/// What config/production.toml sets that bears on propagation, and the defaults that the
/// suite's harness changes for determinism (quotas, per-item limits, the Redis command timeout).
fn as_in_production(settings: &mut query_api::Settings) {
    let defaults = query_api::Settings::defaults().expect("the embedded defaults are valid");
    for (upstream, default) in [
        (
            &mut settings.resilience.coupons,
            &defaults.resilience.coupons,
        ),
        (&mut settings.resilience.extras, &defaults.resilience.extras),
    ] {
        upstream.quota_per_sec = default.quota_per_sec;
        upstream.quota_burst = default.quota_burst;
        upstream.hot_item_per_sec = default.hot_item_per_sec;
    }
    settings.redis.command_timeout_ms = defaults.redis.command_timeout_ms;
    settings.resilience.fleet.quotas = true;
    settings.store.max_concurrent_loads = 32;
    settings.http.max_connections_per_peer = 0;
    // A poll slower than the bound is kept in the slow-request log with its stages, so that
    // the slowest rounds can be explained by their trace ids.
    settings.observability.slow_request_ms = 20;
}

/// What the fleet answers at most under the load's own generator: one pass over the 1,000
/// items on every instance (so that the caches are warm), then the load offered
/// [`SATURATING_RPS`] for 5 s; answers (200) a second. Not a closed loop: on this machine one
/// answered more than twice what this open loop keeps up with, and half of it saturated the
/// fleet.
async fn capacity(client: &reqwest::Client, urls: &Arc<Vec<Vec<String>>>) -> f64 {
    let all: Vec<String> = urls.iter().flatten().cloned().collect();
    for chunk in all.chunks(64) {
        join_all(chunk.iter().map(|url| client.get(url).send())).await;
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let started = std::time::Instant::now();
    let load = open_loop(
        client.clone(),
        Arc::clone(urls),
        SATURATING_RPS,
        stop.clone(),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.cancel();
    let tally = load.await.unwrap();
    tally.answered[0] as f64 / started.elapsed().as_secs_f64()
}

/// More than the fleet answers on this machine: the load offered this much has
/// [`LOAD_IN_FLIGHT`] requests out at all times.
const SATURATING_RPS: u64 = 200_000;

/// What an open-loop load sent.
#[derive(Debug)]
struct LoadTally {
    sent: u64,
    /// Ticks that found [`LOAD_IN_FLIGHT`] requests out.
    skipped: u64,
    /// Answered 200, refused by the shedder (503), anything else (other statuses, errors).
    answered: [u64; 3],
}

/// Offers `rps` GETs a second over the 1,000 items, spread over the instances, until `stop`;
/// at most [`LOAD_IN_FLIGHT`] out at once (a tick that finds them all out is skipped).
fn open_loop(
    client: reqwest::Client,
    urls: Arc<Vec<Vec<String>>>,
    rps: u64,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<LoadTally> {
    tokio::spawn(async move {
        let every = Duration::from_secs_f64(1.0 / rps as f64);
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let in_flight = Arc::new(tokio::sync::Semaphore::new(LOAD_IN_FLIGHT as usize));
        let (mut sent, mut skipped) = (0u64, 0u64);
        let answers: Arc<[std::sync::atomic::AtomicU64; 3]> = Arc::default();
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = ticks.tick() => {}
            }
            let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
                skipped += 1;
                continue;
            };
            let instance = (sent % urls.len() as u64) as usize;
            let url = urls[instance][(sent * 7919 % 1_000) as usize].clone();
            let client = client.clone();
            // Many clients, as in production: each stays well under the per-client limit.
            let client_id = format!("load-{}", sent % 1_000);
            let answers = Arc::clone(&answers);
            tokio::spawn(async move {
                let status = client
                    .get(url)
                    .header("x-client-id", client_id)
                    .send()
                    .await
                    .map(|response| response.status().as_u16());
                let class = match status {
                    Ok(200) => 0,
                    Ok(503) => 1,
                    _ => 2,
                };
                answers[class].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                drop(permit);
            });
            sent += 1;
        }
        // The requests still out are not waited for: their answers are not counted.
        let answered = answers
            .as_ref()
            .each_ref()
            .map(|count| count.load(std::sync::atomic::Ordering::Relaxed));
        LoadTally {
            sent,
            skipped,
            answered,
        }
    })
}

/// The rate and coupons caches' counters of `app`.
fn rate_and_coupons(app: &TestApp) -> [rebate_cache::CacheStatsSnapshot; 2] {
    let parts = app.state.engine.parts();
    [parts.rate.stats(), parts.coupons.stats()]
}

/// The coupons' and extras' load and lease counters, summed over instances.
#[derive(Debug, Clone, Copy, Default)]
struct PartReloads {
    coupons: ReloadCounts,
    extras: ReloadCounts,
}

#[derive(Debug, Clone, Copy, Default)]
struct ReloadCounts {
    loads_started: u64,
    refreshes: u64,
    l2_hits: u64,
    source_loads: u64,
    leases_won: u64,
    leases_lost: u64,
    lease_losses_served_stale: u64,
    lease_waits_served: u64,
    lease_waits_given_up: u64,
    stale_served: u64,
}

impl ReloadCounts {
    fn add(&mut self, stats: &rebate_cache::CacheStatsSnapshot) {
        self.loads_started += stats.loads_started;
        self.refreshes += stats.refreshes;
        self.l2_hits += stats.l2_hits;
        self.source_loads += stats.source_loads;
        self.leases_won += stats.leases_won;
        self.leases_lost += stats.leases_lost;
        self.lease_losses_served_stale += stats.lease_losses_served_stale;
        self.lease_waits_served += stats.lease_waits_served;
        self.lease_waits_given_up += stats.lease_waits_given_up;
        self.stale_served += stats.stale_served;
    }

    fn since(&self, before: &Self) -> Self {
        Self {
            loads_started: self.loads_started - before.loads_started,
            refreshes: self.refreshes - before.refreshes,
            l2_hits: self.l2_hits - before.l2_hits,
            source_loads: self.source_loads - before.source_loads,
            leases_won: self.leases_won - before.leases_won,
            leases_lost: self.leases_lost - before.leases_lost,
            lease_losses_served_stale: self.lease_losses_served_stale
                - before.lease_losses_served_stale,
            lease_waits_served: self.lease_waits_served - before.lease_waits_served,
            lease_waits_given_up: self.lease_waits_given_up - before.lease_waits_given_up,
            stale_served: self.stale_served - before.stale_served,
        }
    }
}

impl std::fmt::Display for ReloadCounts {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "loads {} (refreshes {}), L2 hits {}, source loads {}, leases won {} / lost {} \
             (lost and served stale {}, waits with the winner's value {}, given up {}), stale \
             answers {}",
            self.loads_started,
            self.refreshes,
            self.l2_hits,
            self.source_loads,
            self.leases_won,
            self.leases_lost,
            self.lease_losses_served_stale,
            self.lease_waits_served,
            self.lease_waits_given_up,
            self.stale_served
        )
    }
}

impl PartReloads {
    fn of(instances: &[TestApp]) -> Self {
        let mut sum = Self::default();
        for app in instances {
            let parts = app.state.engine.parts();
            sum.coupons.add(&parts.coupons.stats());
            sum.extras.add(&parts.extras.stats());
        }
        sum
    }

    fn since(&self, before: &Self) -> Self {
        Self {
            coupons: self.coupons.since(&before.coupons),
            extras: self.extras.since(&before.extras),
        }
    }
}

impl std::fmt::Display for PartReloads {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "coupons: {}; extras: {}",
            self.coupons, self.extras
        )
    }
}

/// The shared simulator's coupon and extras calls.
fn upstream_call_counts(simulator: &upstream_sim::SimState) -> (u64, u64) {
    (
        simulator.counters(Endpoint::Coupons).calls,
        simulator.counters(Endpoint::Extras).calls,
    )
}

/// The rate `app` answers for `key`, and the answer's trace id.
async fn traced_rate_of(app: &TestApp, key: ItemKey) -> (Option<u64>, Option<String>) {
    let Ok(response) = app
        .client
        .get(app.item_url(key.platform.as_str(), key.item_id.as_str()))
        .send()
        .await
    else {
        return (None, None);
    };
    let trace_id = response
        .headers()
        .get("x-trace-id")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let body: Option<Value> = response.json().await.ok();
    let rate = body.and_then(|body| body["rebate"]["rate_bps"].as_u64());
    (rate, trace_id)
}

/// The stages of a request the slow-request log kept, as ` [kind name outcome elapsed, …]`;
/// empty when it kept none.
async fn slow_request_summary(app: &TestApp, trace_id: &str) -> String {
    let response = app
        .admin_get(&format!("/admin/v1/slow-requests/{trace_id}"))
        .await;
    if response.status() != 200 {
        return String::new();
    }
    let Ok(record) = response.json::<Value>().await else {
        return String::new();
    };
    let stages: Vec<String> = record["stages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|stage| {
            format!(
                "{} {} {} at {} ms for {} ms",
                stage["kind"].as_str().unwrap_or("?"),
                stage["name"].as_str().unwrap_or("?"),
                stage["outcome"].as_str().unwrap_or("?"),
                stage["started_ms"],
                stage["elapsed_ms"]
            )
        })
        .collect();
    format!(" [{}]", stages.join(", "))
}

/// `item_created` fences past the not-found answers every instance cached before the row
/// existed, in L1 and in L2: the new item answers 200 everywhere within a second.
#[tokio::test]
async fn a_created_item_answers_on_every_instance_despite_cached_not_found_markers() {
    let env = ProductionEnv::new("creation").await;
    // Without the Bloom filter an unknown id reaches the caches, which keep its not-found
    // markers (the case of a Bloom false positive).
    let fleet = AmqpFleet::spawn(&env, "creation", 2, |_, settings| {
        settings.bloom.enabled = false;
    })
    .await;
    let key = ItemKey::parse("jd", "777001").unwrap();
    for app in &fleet.instances {
        assert_eq!(app.get_item("jd", "777001").await.status(), 404);
        assert_eq!(app.get_item("jd", "777001").await.status(), 404);
    }
    let tier = connect_tier(&env).await;
    let product_key = TierKey {
        item: key,
        part: PartKind::Product,
    };
    wait_until_true("L2 holds the product's not-found marker", || async {
        tier.get_many(&[product_key]).await.unwrap()[0].is_some()
    })
    .await;

    let store = env.store().await;
    let now = Timestamp::now();
    store
        .upsert_product(&rebate_store::Versioned {
            value: Product {
                platform: key.platform,
                item_id: key.item_id,
                title: "A brand-new item".to_owned(),
                price_cents: rebate_domain::Cents::new(12_900),
                image_url: "https://img.example/777001.jpg".to_owned(),
                shop_name: "New shop".to_owned(),
                status: rebate_domain::ProductStatus::OnSale,
            },
            version: 1,
            updated_at: now,
        })
        .await
        .unwrap();
    write_rate(&store, key, 1, 800u64).await;
    let event = event_for(rebate_events::EventKind::ItemCreated, key, 1);
    let started = std::time::Instant::now();
    fleet.instances[0]
        .state
        .events
        .publisher()
        .publish(&event)
        .await
        .unwrap();
    for app in &fleet.instances {
        loop {
            if rate_of(app, key).await == Some(800) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "the created item still does not answer with its rate after 1 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    eprintln!(
        "created item answered on both instances {:?} after the event",
        started.elapsed()
    );
    store.close().await;
    fleet.stop().await;
    env.clean_up().await;
}

/// An event that runs ahead of the store (published before the row's write commits), on the
/// production profile: the fence refuses the old row in L1 and L2 meanwhile, and once the row is
/// written the next query serves it, on both instances, through L2 and the kept renderings.
#[tokio::test]
async fn an_event_ahead_of_the_store_leaves_nothing_old_in_l1_l2_or_a_rendering() {
    let env = ProductionEnv::new("ahead").await;
    let fleet = AmqpFleet::spawn(&env, "ahead", 2, |_, _| {}).await;
    let key = ItemKey::parse("pdd", "100031").unwrap();
    let store = env.store().await;
    let current = store.rate(key).await.unwrap().unwrap();
    for app in &fleet.instances {
        assert_eq!(
            rate_of(app, key).await,
            Some(u64::from(current.value.rate_bps.get()))
        );
    }
    let ahead = current.version + 5;
    let event = event_for(rebate_events::EventKind::RateChanged, key, ahead);
    fleet.instances[0]
        .state
        .events
        .publisher()
        .publish(&event)
        .await
        .unwrap();
    let tier = connect_tier(&env).await;
    let tier_key = TierKey {
        item: key,
        part: PartKind::Rate,
    };
    wait_until_true("L2 holds the fence", || async {
        tier.get_many(&[tier_key]).await.unwrap()[0]
            .as_ref()
            .is_some_and(|entry| entry.version == ahead)
    })
    .await;
    // Queries in between get the store's (old) row: it is all there is.
    for app in &fleet.instances {
        wait_until_true("the instance applied the fence", || async {
            app.state
                .engine
                .parts()
                .rate
                .peek(&key)
                .is_some_and(|envelope| envelope.version == ahead)
        })
        .await;
        assert_eq!(
            rate_of(app, key).await,
            Some(u64::from(current.value.rate_bps.get()))
        );
    }
    write_rate(&store, key, ahead, 1_234u64).await;
    for app in &fleet.instances {
        assert_eq!(rate_of(app, key).await, Some(1_234));
        assert_eq!(
            rate_of(app, key).await,
            Some(1_234),
            "and from what it kept"
        );
    }
    store.close().await;
    fleet.stop().await;
    env.clean_up().await;
}

/// One instance loses the broker while 50 rates change and their events go out through the
/// other. Reconnecting within `catch_up_window_ms`, it finds them waiting in its broadcast queue
/// (`replayed`); reconnecting after the window, its queue is gone and it drops its L1
/// (`dropped_l1`). Either way it serves every new rate within 2 s of reconnecting.
/// `CATCH_UP_CUT_SECS` (default 3) sets how long the replayed case is cut off.
#[tokio::test]
async fn an_instance_cut_off_from_the_broker_catches_up_or_drops_its_l1() {
    let replayed_cut = std::env::var("CATCH_UP_CUT_SECS")
        .ok()
        .and_then(|secs| secs.parse().ok())
        .map_or(Duration::from_secs(3), Duration::from_secs);
    for (window_ms, cut_for, outcome) in [
        (300_000, replayed_cut, "replayed"),
        (1_000, Duration::from_secs(4), "dropped_l1"),
    ] {
        cut_off_and_back(window_ms, cut_for, outcome).await;
    }
}

async fn cut_off_and_back(window_ms: u64, cut_for: Duration, outcome: &str) {
    let env = ProductionEnv::new("catch_up").await;
    let proxy = CuttableProxy::start("127.0.0.1:5672".parse().unwrap()).await;
    let proxied = proxy.url();
    let fleet = AmqpFleet::spawn(&env, "catch_up", 2, |index, settings| {
        let amqp = &mut settings.events.amqp;
        amqp.reconnect_min_ms = 50;
        amqp.reconnect_max_ms = 200;
        amqp.catch_up_window_ms = window_ms;
        if index == 1 {
            amqp.url = proxied.clone();
        }
    })
    .await;
    let (publisher, cut_off) = (&fleet.instances[0], &fleet.instances[1]);
    let store = env.store().await;
    let keys: Vec<ItemKey> = (0..50)
        .map(|index| ItemKey::parse("jd", &(100_100 + index).to_string()).unwrap())
        .collect();
    for key in &keys {
        assert!(rate_of(cut_off, *key).await.is_some(), "{key} cached first");
    }

    proxy.cut();
    wait_until("the instance sees the broker gone", || {
        !cut_off.state.events.is_ready()
    })
    .await;
    for (index, key) in keys.iter().enumerate() {
        let current = store.rate(*key).await.unwrap().unwrap();
        let version = current.version + 1;
        write_rate(&store, *key, version, 2_000 + index as u64).await;
        let event = event_for(rebate_events::EventKind::RateChanged, *key, version);
        publisher
            .state
            .events
            .publisher()
            .publish(&event)
            .await
            .unwrap();
    }
    tokio::time::sleep(cut_for).await;
    proxy.restore();
    wait_until("the instance is back on the broker", || {
        cut_off.state.events.is_ready()
    })
    .await;
    let back = std::time::Instant::now();
    for (index, key) in keys.iter().enumerate() {
        let wanted = 2_000 + index as u64;
        while rate_of(cut_off, *key).await != Some(wanted) {
            assert!(
                back.elapsed() < Duration::from_secs(2),
                "{key}: the new rate was not served within 2 s of reconnecting ({outcome})"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let (_, ready) = cut_off.readyz().await;
    assert_eq!(ready["events_catch_up"], outcome, "{ready}");
    eprintln!(
        "{outcome} after {cut_for:?} cut off: every new rate served {:?} after reconnecting",
        back.elapsed()
    );
    store.close().await;
    fleet.stop().await;
    env.clean_up().await;
}

/// The consistency observer on one production instance, windows 3 s and 6 s (room for a loaded
/// CI machine to finish the re-warm and the forced write before the first look): a rate
/// change that holds is counted consistent at both; an old copy written into L2 behind the
/// fence's back after the event is counted inconsistent at both, and nothing else moves.
#[tokio::test]
async fn the_consistency_observer_counts_exactly_the_inconsistency_forced_on_it() {
    let env = ProductionEnv::new("observer").await;
    let app = env
        .spawn_instance(|settings| {
            settings.events.observer.windows_ms = vec![3_000, 6_000];
        })
        .await;
    let store = env.store().await;
    let tier = connect_tier(&env).await;
    let change_rate = |key: ItemKey, rate_bps: u64| {
        let store = &store;
        let app = &app;
        async move {
            let current = store.rate(key).await.unwrap().unwrap();
            let version = current.version + 1;
            write_rate(store, key, version, rate_bps).await;
            let event = event_for(rebate_events::EventKind::RateChanged, key, version);
            app.state.events.publisher().publish(&event).await.unwrap();
            app.state.events.in_process().unwrap().settled().await;
            (current, version)
        }
    };
    let counts = |app: &TestApp| {
        app.state
            .consistency
            .report()
            .windows
            .iter()
            .map(|window| (window.consistent, window.inconsistent, window.unknown))
            .collect::<Vec<_>>()
    };

    // A change that holds.
    let held = ItemKey::parse("jd", "100201").unwrap();
    assert!(rate_of(&app, held).await.is_some());
    change_rate(held, 1_501).await;
    wait_until_true("both windows checked the change", || async {
        counts(&app)
            .iter()
            .all(|(consistent, _, _)| *consistent == 1)
    })
    .await;
    assert_eq!(counts(&app), [(1, 0, 0), (1, 0, 0)]);

    // A change, then the old copy put back into L2 behind the fence's back.
    let broken = ItemKey::parse("jd", "100202").unwrap();
    assert!(rate_of(&app, broken).await.is_some());
    let tier_key = TierKey {
        item: broken,
        part: PartKind::Rate,
    };
    let (old, version) = change_rate(broken, 1_502).await;
    wait_until_true("the re-warm wrote the new rate to L2", || async {
        tier.get_many(&[tier_key]).await.unwrap()[0]
            .as_ref()
            .is_some_and(|entry| entry.version == version)
    })
    .await;
    // A second rebuild of the key may still write v-new after the first (seen under load):
    // let the writes settle before putting the old copy back.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let now = Timestamp::now();
    let stale = Envelope {
        value: Some(old.value),
        version: old.version,
        fetched_at: now,
        fresh_until: now.saturating_add_millis(600_000),
        stale_until: now.saturating_add_millis(600_000),
        tombstone: false,
    };
    let mut stored = old.version.to_string().into_bytes();
    stored.push(b':');
    stored.extend(stale.encode().unwrap());
    let mut redis = redis::Client::open(env.redis_url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("{}:v1:{broken}:rate", env.prefix))
        .arg(stored)
        .query_async(&mut redis)
        .await
        .unwrap();
    // Nothing rebuilds the key now (L1 holds v-new), so the old copy stays for the windows.
    assert_eq!(
        tier.get_many(&[tier_key]).await.unwrap()[0]
            .as_ref()
            .map(|entry| entry.version),
        Some(old.version)
    );
    wait_until_true("both windows checked the broken change", || async {
        counts(&app)
            .iter()
            .all(|(consistent, inconsistent, _)| consistent + inconsistent == 2)
    })
    .await;
    assert_eq!(counts(&app), [(1, 1, 0), (1, 1, 0)]);
    let metrics = app
        .client
        .get(format!("{}/metrics", app.admin_url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for window in ["3s", "6s"] {
        for outcome in ["consistent", "inconsistent"] {
            let line = format!(
                "rebate_consistency_checks_total{{source=\"event\",window=\"{window}\",outcome=\"{outcome}\"}} 1"
            );
            assert!(metrics.contains(&line), "{line} missing from:\n{metrics}");
        }
    }
    store.close().await;
    app.stop().await;
    env.clean_up().await;
}

/// Hunts stale reads: three instances on MariaDB, Redis and RabbitMQ; a seeded writer changes
/// rates and publishes their events through random instances (with duplicates, late older
/// events and a second write right behind the first), concurrent readers query random keys on
/// random instances, every instance's MariaDB replies are held up to 60 ms (so rebuilds read a
/// row and finish after the next event), and one instance loses the broker in the middle. Every rate encodes its row version (`rate_bps = 1000 + version`).
///
/// Checks: a read never returns a version older than what that instance's L1 held for the key
/// when the read started (an applied event leaves a fence at its version, so "applied v, then
/// served older" shows up here); every key converges on every instance; the consistency
/// observer finds nothing inconsistent at its 10 s window. Prints the counts and how many
/// versions behind the latest committed one the reads were, and how many rebuilds a fence
/// refused (at least one, or the interleaving did not happen). `INTERLEAVING_SECS` (default 15)
/// sets how long the writer runs.
#[tokio::test]
async fn interleaved_writes_reads_and_an_outage_never_serve_what_an_instance_has_fenced() {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let run_for = Duration::from_secs(
        std::env::var("INTERLEAVING_SECS")
            .ok()
            .and_then(|secs| secs.parse().ok())
            .unwrap_or(15),
    );
    let env = ProductionEnv::new("interleaving").await;
    let proxy = CuttableProxy::start("127.0.0.1:5672".parse().unwrap()).await;
    let proxied = proxy.url();
    // Every instance reads MariaDB through replies held up to 60 ms: a rebuild that read a row
    // may finish after the next write's event reached its instance.
    let (database, _) = authority(&env.database_url);
    let late_store = CuttableProxy::with_late_replies(
        database
            .parse()
            .expect("the test database is at an IP address"),
        Duration::from_millis(60),
    )
    .await;
    let late_store_url = authority(&env.database_url).1(late_store.address);
    let fleet = AmqpFleet::spawn(&env, "interleaving", 3, |index, settings| {
        patient(settings);
        settings.store.mysql.url = query_api::config::Secret::new(late_store_url.clone());
        settings.events.observer.windows_ms = vec![1_000, 10_000];
        let amqp = &mut settings.events.amqp;
        amqp.reconnect_min_ms = 50;
        amqp.reconnect_max_ms = 200;
        if index == 2 {
            amqp.url = proxied.clone();
        }
    })
    .await;
    let store = env.store().await;
    let keys: Vec<ItemKey> = (0..20)
        .map(|index| ItemKey::parse("taobao", &(100_400 + index).to_string()).unwrap())
        .collect();
    // Every key starts at a version of our own so that the rate names it.
    let committed: Arc<Vec<AtomicU64>> = Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect());
    let write = |key: ItemKey, version: u64| {
        let store = &store;
        async move {
            write_rate(store, key, version, 1_000 + version).await;
        }
    };
    let event =
        |key: ItemKey, version: u64| event_for(rebate_events::EventKind::RateChanged, key, version);
    for (index, key) in keys.iter().enumerate() {
        write(*key, 10).await;
        committed[index].store(10, Ordering::SeqCst);
        fleet.instances[0]
            .state
            .events
            .publisher()
            .publish(&event(*key, 10))
            .await
            .unwrap();
    }

    let stop = Arc::new(AtomicBool::new(false));
    let fleet = Arc::new(fleet);
    let keys = Arc::new(keys);
    let mut readers = Vec::new();
    for reader in 0..6u64 {
        let (fleet, keys, committed, stop) = (
            Arc::clone(&fleet),
            Arc::clone(&keys),
            Arc::clone(&committed),
            Arc::clone(&stop),
        );
        readers.push(tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(0x5eed + reader);
            let (mut reads, mut violations) = (0u64, Vec::new());
            let mut behind: HashMap<u64, u64> = HashMap::new();
            while !stop.load(Ordering::SeqCst) {
                let index = rng.random_range(0..keys.len());
                let (key, instance) = (keys[index], rng.random_range(0..fleet.instances.len()));
                let app = &fleet.instances[instance];
                let floor = app
                    .state
                    .engine
                    .parts()
                    .rate
                    .peek(&key)
                    .map_or(0, |envelope| envelope.version);
                let latest = committed[index].load(Ordering::SeqCst);
                let Some(rate_bps) = rate_of(app, key).await else {
                    continue;
                };
                let version = rate_bps.saturating_sub(1_000);
                reads += 1;
                *behind.entry(latest.saturating_sub(version)).or_default() += 1;
                if version < floor {
                    violations.push(format!(
                        "instance {instance} {key}: served v{version} after its L1 held v{floor}"
                    ));
                }
            }
            (reads, violations, behind)
        }));
    }

    let mut rng = SmallRng::seed_from_u64(0x5eed);
    let started = std::time::Instant::now();
    let (mut events, mut duplicates, mut late) = (0u64, 0u64, 0u64);
    let mut cut = false;
    while started.elapsed() < run_for {
        if !cut && started.elapsed() >= run_for / 3 {
            proxy.cut();
            cut = true;
        }
        if cut && started.elapsed() >= run_for / 2 {
            proxy.restore();
        }
        let index = rng.random_range(0..keys.len());
        let key = keys[index];
        let version = committed[index].load(Ordering::SeqCst) + 1;
        write(key, version).await;
        committed[index].store(version, Ordering::SeqCst);
        let through = &fleet.instances[rng.random_range(0..2)];
        let publisher = through.state.events.publisher();
        let changed = event(key, version);
        publisher.publish(&changed).await.unwrap();
        events += 1;
        if rng.random_bool(0.2) {
            // A second write right behind the first: rebuilds started by the first event are
            // still waiting for their rows.
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await;
            let version = version + 1;
            write(key, version).await;
            committed[index].store(version, Ordering::SeqCst);
            publisher.publish(&event(key, version)).await.unwrap();
            events += 1;
        }
        if rng.random_bool(0.1) {
            publisher.publish(&changed).await.unwrap();
            duplicates += 1;
        }
        if version > 11 && rng.random_bool(0.1) {
            publisher.publish(&event(key, version - 1)).await.unwrap();
            late += 1;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..40))).await;
    }
    proxy.restore();
    stop.store(true, Ordering::SeqCst);
    let (mut reads, mut violations) = (0u64, Vec::new());
    let mut behind: HashMap<u64, u64> = HashMap::new();
    for reader in readers {
        let (count, found, distribution) = reader.await.unwrap();
        reads += count;
        violations.extend(found);
        for (versions, count) in distribution {
            *behind.entry(versions).or_default() += count;
        }
    }

    // Every key converges on every instance.
    wait_until("the cut-off instance is back on the broker", || {
        fleet.instances[2].state.events.is_ready()
    })
    .await;
    let converge_by = std::time::Instant::now() + Duration::from_secs(5);
    for (index, key) in keys.iter().enumerate() {
        let wanted = 1_000 + committed[index].load(Ordering::SeqCst);
        for (instance, app) in fleet.instances.iter().enumerate() {
            while rate_of(app, *key).await != Some(wanted) {
                assert!(
                    std::time::Instant::now() < converge_by,
                    "instance {instance} {key} did not converge on {wanted}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    // The observer's 10 s window, for every event.
    let observed_by = std::time::Instant::now() + Duration::from_secs(20);
    while !fleet
        .instances
        .iter()
        .all(|app| app.state.consistency.report().pending == 0)
    {
        assert!(
            std::time::Instant::now() < observed_by,
            "the observer did not finish its windows"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut distribution: Vec<(u64, u64)> = behind.into_iter().collect();
    distribution.sort();
    let refused: u64 = fleet
        .instances
        .iter()
        .map(|app| app.state.engine.parts().rate.stats().fenced_writes_refused)
        .sum();
    eprintln!(
        "interleaving: {events} events (+{duplicates} duplicates, {late} late), {reads} reads, \
         {refused} rate rebuilds that finished behind a fence; versions behind the latest \
         committed at the read's start: {distribution:?}"
    );
    for (instance, app) in fleet.instances.iter().enumerate() {
        let report = app.state.consistency.report();
        eprintln!(
            "interleaving: instance {instance} observer {:?}",
            report.windows
        );
        let ten_seconds = &report.windows[1];
        assert_eq!(
            ten_seconds.inconsistent, 0,
            "instance {instance}: inconsistent at 10 s: {report:?}"
        );
        assert!(
            ten_seconds.consistent > 0,
            "instance {instance}: {report:?}"
        );
    }
    assert!(violations.is_empty(), "{violations:#?}");
    assert!(reads > 100, "only {reads} reads");
    assert!(
        refused > 0,
        "no rebuild finished behind a fence: the late replies did not interleave"
    );

    store.close().await;
    let fleet = Arc::try_unwrap(fleet).unwrap_or_else(|_| panic!("readers are done"));
    fleet.stop().await;
    env.clean_up().await;
}

/// The `host:port` of a URL such as `mysql://root@127.0.0.1:3306/db`, and a function giving
/// the same URL with another address in its place.
fn authority(url: &str) -> (String, impl Fn(std::net::SocketAddr) -> String + '_) {
    let start = url
        .find('@')
        .or_else(|| url.find("://").map(|at| at + 2))
        .unwrap()
        + 1;
    let end = url[start..].find('/').map_or(url.len(), |at| start + at);
    let replace =
        move |address: std::net::SocketAddr| format!("{}{address}{}", &url[..start], &url[end..]);
    (url[start..end].to_owned(), replace)
}

/// Writes `key`'s rate row: `rate_bps` at `version`.
async fn write_rate(store: &rebate_store::MySqlStore, key: ItemKey, version: u64, rate_bps: u64) {
    store
        .upsert_rate(
            key,
            &rebate_store::Versioned {
                value: rebate_domain::RebateRate {
                    rate_bps: rebate_domain::RateBps::try_from(rate_bps).unwrap(),
                },
                version,
                updated_at: Timestamp::now(),
            },
        )
        .await
        .unwrap();
}

async fn rate_of(app: &TestApp, key: ItemKey) -> Option<u64> {
    let body: Value = app
        .get_item(key.platform.as_str(), key.item_id.as_str())
        .await
        .json()
        .await
        .ok()?;
    body["rebate"]["rate_bps"].as_u64()
}
