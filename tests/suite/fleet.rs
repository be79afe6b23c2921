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

/// How far apart the steps of a cold load are.
const STEP: Duration = Duration::from_millis(50);

/// How each instance's ticker (the clock of its quota's local state and of its shedder) moves
/// during a cold load.
#[derive(Debug, Clone, Copy)]
enum TickerPace {
    /// With the wall clock, to the time elapsed at each step's start: the fleet's bucket refills
    /// on Redis's clock, and an instance told "empty for 120 ms" remembers it on its ticker, so
    /// the two must agree or a slow step makes the instance sit out tokens that are there.
    Wall,
    /// One `STEP` a step whatever the wall clock does: each instance's share is a bucket on its
    /// own ticker, so what it grants depends on the step count alone.
    Steps,
}

/// What a cold load was answered.
#[derive(Debug)]
struct ColdLoad {
    /// Answers that were 200 or 404.
    answered: usize,
    /// Every other answer, by status and error code (or the transport error).
    others: std::collections::BTreeMap<String, usize>,
    /// Wall time from the first step's start to the last step's start: the time the fleet was
    /// offered calls over.
    span: Duration,
}

/// One cold item asked of every instance at each of `steps` steps, each step `STEP` after the
/// last on the wall clock (later if the last step's answers took longer: every step waits for
/// its answers, so a slow machine stretches the load instead of piling requests up). The
/// instances' tickers move at `pace`. One call offered per instance per step is 20 a second per
/// instance: four times what the whole fleet's quota allows, so the quota is the bottleneck.
async fn cold_load(instances: &[TestApp], first_id: u64, steps: u32, pace: TickerPace) -> ColdLoad {
    let mut others = std::collections::BTreeMap::<String, usize>::new();
    let mut answered = 0;
    let mut next_id = first_id;
    let started = tokio::time::Instant::now();
    let mut schedule = tokio::time::interval_at(started, STEP);
    schedule.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_step = started;
    let mut ticker_moved = Duration::ZERO;
    for step in 0..steps {
        schedule.tick().await;
        last_step = tokio::time::Instant::now();
        let moved = match pace {
            TickerPace::Wall => last_step.duration_since(started),
            TickerPace::Steps => STEP * step,
        };
        // The service clocks move with the tickers: a share's turns are cut on them (the hosts'
        // wall clocks), and the instances' clocks agree (see `align_clocks`).
        for instance in instances {
            instance.ticker.advance(moved - ticker_moved);
            instance.clock.advance(moved - ticker_moved);
        }
        ticker_moved = moved;
        let requests = instances.iter().map(|instance| {
            let url = instance.item_url("jd", &next_id.to_string());
            next_id += 1;
            instance.client.get(url).send()
        });
        for outcome in futures::future::join_all(requests).await {
            let response = match outcome {
                Ok(response) => response,
                Err(error) => {
                    *others.entry(error.to_string()).or_default() += 1;
                    continue;
                }
            };
            let status = response.status().as_u16();
            // Read to the end, so that the connection is kept for the next step.
            let body: Value = response.json().await.unwrap_or_default();
            if matches!(status, 200 | 404) {
                answered += 1;
            } else {
                let code = &body["error"]["code"];
                *others.entry(format!("{status} {code}")).or_default() += 1;
            }
        }
    }
    let span = last_step.duration_since(started);
    if !others.is_empty() {
        // What the misses were, and what each instance's shedder saw, for the failure message.
        eprintln!("cold load: {answered} answered, others {others:?}");
        for instance in instances {
            let status = admin_status(instance).await;
            eprintln!(
                "shedding {} connections {} coupons {}",
                status["protection"]["shedding"],
                status["connections"],
                status["protection"]["dependencies"]
            );
        }
    }
    ColdLoad {
        answered,
        others,
        span,
    }
}

/// Moves every instance's service clock to the latest of them, so that they agree on the time
/// as a fleet's hosts do (each started its own at its start).
fn align_clocks(instances: &[TestApp]) {
    use rebate_cache::Clock as _;

    let latest = instances
        .iter()
        .map(|instance| instance.clock.now().as_millis())
        .max()
        .unwrap_or(0);
    for instance in instances {
        let behind = latest - instance.clock.now().as_millis();
        instance
            .clock
            .advance(Duration::from_millis(u64::try_from(behind).unwrap_or(0)));
    }
}

async fn admin_status(instance: &TestApp) -> Value {
    instance
        .admin_get("/admin/v1/status")
        .await
        .json()
        .await
        .unwrap()
}

async fn coupon_quota(instance: &TestApp) -> Value {
    let status = admin_status(instance).await;
    status["protection"]["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|dependency| dependency["name"] == "coupons")
        .unwrap()["quota"]
        .clone()
}

/// Three instances behind one contract, shedding on as in production: together they spend the
/// quota and never call the API more than it allows in any one-second window, and with Redis
/// gone each keeps to its third.
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
                // As in production: the quota is reached through the shedder.
                settings.resilience.shedding.enabled = true;
                // Once Redis is gone (the second half), every request's reads of it wait this
                // long: short, so that answers stay within their deadline. The private server
                // answers well within it while it runs.
                settings.redis.command_timeout_ms = 200;
                // The pool's first connections are made within the acquire timeout: with both
                // cores busy they can take longer than production's 500 ms. Nothing here waits
                // for a pool slot.
                settings.store.mysql.acquire_timeout_ms = 5_000;
            })
            .await,
        );
    }
    // Every instance has beaten and sees the other two.
    for instance in &instances {
        rebate_tests::wait_until_true("every instance sees three live instances", || async {
            coupon_quota(instance).await["fleet"]["live_instances"] == 3
        })
        .await;
        assert_eq!(coupon_quota(instance).await["scope"], "fleet");
    }
    // Every instance answers a cold item once, so that the load's first requests find their
    // connections (HTTP, MySQL, Redis) open and the grant script loaded, like its last ones.
    // Then the bucket refills (it is full 400 ms after its last grant) and the instances' own
    // memory of it (an empty bucket, a pooled token) lapses on their tickers.
    let warm_up = cold_load(&instances, 100_901, 1, TickerPace::Wall).await;
    assert_eq!(warm_up.answered, 3, "others: {:?}", warm_up.others);
    tokio::time::sleep(Duration::from_millis(500)).await;
    for instance in &instances {
        instance.ticker.advance(Duration::from_millis(500));
    }
    simulator.reset_counters();

    // 41 steps of one cold item per instance: 60 calls a second offered against 2 + 5 a second.
    let load = cold_load(&instances, 100_001, 41, TickerPace::Wall).await;
    assert_eq!(load.answered, 123, "others: {:?}", load.others);
    let calls = simulator.counters(Endpoint::Coupons);
    eprintln!(
        "fleet-wide, Redis up: {calls:?} over {:?} (the bucket's allowance for it: {})",
        load.span,
        2 + (5.0 * load.span.as_secs_f64()).floor() as u64
    );
    // Every grant came from the fleet's bucket: a share's calls would add to the bucket's.
    for instance in &instances {
        let quota = coupon_quota(instance).await;
        assert_eq!(quota["fleet"]["granted_from_share"], 0, "{quota}");
    }
    // Never above the contract in any second, and the quota spent: the bucket starts full (2)
    // and refills one every 200 ms on Redis's clock, so over the load's span (at least 40 steps
    // of 50 ms, 2 s) it holds at least 2 + 10 tokens. Each is taken by the first step after it
    // is there: every step offers every instance a call, and each instance's ticker keeps up
    // with the wall clock, so none waits past the bucket's own retry-after. A slower run only
    // lengthens the span and adds tokens. One token of slack: the tenth refill is due 2 s after
    // the first grant, just as the last step asks, and the first step's requests may take a
    // little longer to reach the bucket than the last step's.
    assert!(
        calls.peak_calls_per_sec <= 7 && calls.calls >= 11,
        "fleet-wide: {calls:?} over {:?}",
        load.span
    );

    // Redis stops. The instances' memory of the bucket (known empty until its next token)
    // lapses first, so that the first step finds the bucket gone rather than known empty.
    drop(redis);
    align_clocks(&instances);
    for instance in &instances {
        instance.ticker.advance(Duration::from_millis(500));
        instance.clock.advance(Duration::from_millis(500));
    }
    simulator.reset_counters();
    // Each instance falls back to its share, counted by its own guard (none before: see
    // above): the fleet's turns of 200 ms (5 a second) dealt round robin over the three, each
    // instance's one turn in three; of the burst of 2, the turn under way and one turn kept
    // by the first rank. The clocks move 50 ms a step, so the 40 steps span 1.95 s: the turn
    // they start in and the 9 or 10 that start after, plus the kept turn.
    let load = cold_load(&instances, 101_001, 40, TickerPace::Steps).await;
    assert_eq!(load.answered, 120, "others: {:?}", load.others);
    let mut from_shares = 0;
    for instance in &instances {
        let quota = coupon_quota(instance).await;
        let from_share = quota["fleet"]["granted_from_share"].as_u64().unwrap();
        eprintln!(
            "one instance, Redis down: {from_share} calls from its share over {:?}",
            load.span
        );
        // Its turns: every 600 ms over 1.95 s, 3 or 4, and perhaps one kept turn.
        assert!((3..=5).contains(&from_share), "{quota}");
        assert_eq!(quota["fleet"]["reachable"], false, "{quota}");
        from_shares += from_share;
    }
    assert!(
        (11..=12).contains(&from_shares),
        "the fleet's 10 or 11 turns and the kept one: {from_shares}"
    );
    // Every call came from a share, and never more in a second than the contract (5 + 2) that
    // the fleet's bucket keeps: the shares are cut so that their sum is the bucket.
    let calls = simulator.counters(Endpoint::Coupons);
    assert!(
        calls.calls == from_shares && calls.peak_calls_per_sec <= 7,
        "{calls:?}"
    );

    for instance in instances {
        instance.stop().await;
    }
    env.clean_up().await;
}

/// Two instances answer one Zipf stream between them; the fleet's list of hot keys (each
/// instance's published list, summed in Redis) holds at least 90 of the stream's top 100, and
/// each instance's own list shows what it answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleets_hot_keys_follow_the_traffic_of_every_instance() {
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    let env = ProductionEnv::new("hot_keys").await;
    let learning = |settings: &mut Settings| {
        settings.hot_keys.publish_interval_secs = 1;
        // Every answered item counted: 6,000 requests are too few to sample.
        settings.hot_keys.sample_every = 1;
    };
    let instances = [
        env.spawn_instance(learning).await,
        env.spawn_instance(learning).await,
    ];
    // Zipf (exponent 1.1) over 2,000 items by inverse transform on the cumulative weights.
    let items = 2_000usize;
    let mut cumulative = Vec::with_capacity(items);
    let mut total = 0.0;
    for rank in 1..=items {
        total += 1.0 / (rank as f64).powf(1.1);
        cumulative.push(total);
    }
    let mut random = rand::rngs::StdRng::seed_from_u64(7);
    let stream: Vec<u64> = (0..6_000)
        .map(|_| {
            let draw = random.random::<f64>() * total;
            let rank = cumulative.partition_point(|&weight| weight < draw);
            100_001 + rank as u64
        })
        .collect();
    let mut truth: HashMap<u64, u64> = HashMap::new();
    for chunk in stream.chunks(64) {
        let requests: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(index, id)| {
                let instance = &instances[index % 2];
                instance
                    .client
                    .get(instance.item_url("jd", &id.to_string()))
                    .send()
            })
            .collect();
        for (id, response) in chunk.iter().zip(futures::future::join_all(requests).await) {
            // Answered items are counted; the few ids the demo catalogue lacks are not.
            if response.unwrap().status() == 200 {
                *truth.entry(*id).or_default() += 1;
            }
        }
    }
    let mut ranked: Vec<u64> = truth.values().copied().collect();
    ranked.sort_unstable_by(|left, right| right.cmp(left));
    // Ties at the 100th count: any key counted that often is in a true top 100.
    let hundredth = ranked[99];

    // Both instances publish within a second.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let listed: Value = instances[0]
        .admin_get("/admin/v1/hot-keys?limit=100")
        .await
        .json()
        .await
        .unwrap();
    let fleet = listed["fleet"].as_array().expect("the fleet's list");
    assert_eq!(fleet.len(), 100, "{listed}");
    let in_top = fleet
        .iter()
        .filter(|entry| {
            let key = entry["key"].as_str().unwrap();
            let id: u64 = key.strip_prefix("jd:").unwrap().parse().unwrap();
            truth.get(&id).is_some_and(|count| *count >= hundredth)
        })
        .count();
    eprintln!("hot keys: {in_top} of the fleet's top 100 are in the stream's top 100");
    assert!(in_top >= 90, "{in_top} of 100: {listed}");
    // The hottest key's fleet count is the sum of both instances' counts.
    let hottest = &fleet[0];
    let id: u64 = hottest["key"].as_str().unwrap()[3..].parse().unwrap();
    assert_eq!(hottest["count"].as_u64().unwrap(), truth[&id], "{hottest}");
    let own = listed["instance"].as_array().unwrap();
    assert!(
        own[0]["count"].as_u64().unwrap() < truth[&id],
        "half the stream each"
    );
    for instance in instances {
        instance.stop().await;
    }
    env.clean_up().await;
}

/// A new instance warms what the fleet is busy with before it has seen any traffic of its own:
/// the learned hot keys come before the store's `hot_items` seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_instance_warms_the_keys_the_fleet_is_hot_on() {
    let env = ProductionEnv::new("learned_warmup").await;
    let busy = env
        .spawn_instance(|settings| {
            settings.hot_keys.publish_interval_secs = 1;
            settings.hot_keys.sample_every = 1;
        })
        .await;
    let hot: Vec<String> = (107_001..107_011).map(|id: u64| id.to_string()).collect();
    for round in 0..5 {
        for id in &hot[..10 - round] {
            assert_eq!(busy.get_item("pdd", id).await.status(), 200);
        }
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let joining = env
        .spawn_instance(|settings| {
            settings.warmup.enabled = true;
            settings.warmup.hot_items_limit = 10;
            settings.warmup.rate_per_sec = 1_000;
        })
        .await;
    let product = &joining.state.engine.parts().product;
    let keys: Vec<rebate_domain::ItemKey> = hot
        .iter()
        .map(|id| rebate_domain::ItemKey::parse("pdd", id).unwrap())
        .collect();
    rebate_tests::wait_until("the joining instance warmed the fleet's hot keys", || {
        keys.iter().all(|key| product.peek(key).is_some())
    })
    .await;
    // The seed (the store's hot_items, taobao:100001 first) was not needed to fill the list.
    let seed = rebate_domain::ItemKey::parse("taobao", "100001").unwrap();
    assert!(product.peek(&seed).is_none());
    let loads = joining.product_loads();
    for id in &hot {
        assert_eq!(joining.get_item("pdd", id).await.status(), 200);
    }
    assert_eq!(
        joining.product_loads(),
        loads,
        "answered from what warm-up loaded"
    );
    busy.stop().await;
    joining.stop().await;
    env.clean_up().await;
}

/// A client's limit holds for the fleet when its bucket lives in Redis: two instances together
/// answer one client no more than its burst and rate, where per-instance buckets would each
/// grant the whole limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_limit_holds_across_instances_with_its_bucket_in_redis() {
    use query_api::config::resilience::LimitScope;

    let env = ProductionEnv::new("client_limit").await;
    let limited = |settings: &mut Settings| {
        let client = &mut settings.resilience.client_limit;
        client.enabled = true;
        client.scope = LimitScope::Fleet;
        client.per_sec = 2.0;
        client.burst = 5;
        client.lease_ahead = 2;
    };
    let instances = [
        env.spawn_instance(limited).await,
        env.spawn_instance(limited).await,
    ];
    let started = std::time::Instant::now();
    let mut answered = 0;
    let mut refused = 0;
    for round in 0..20 {
        let instance = &instances[round % 2];
        let response = instance
            .client
            .get(instance.item_url("jd", "100001"))
            .header("x-client-id", "app-ios-42")
            .send()
            .await
            .unwrap();
        match response.status().as_u16() {
            200 => answered += 1,
            429 => {
                assert!(response.headers().contains_key("retry-after"));
                refused += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!(
        "client limit across two instances: {answered} answered, {refused} refused in {elapsed:.2} s"
    );
    // The burst and whatever the rate refilled meanwhile, across both instances.
    let most = 5 + (2.0 * elapsed).ceil() as u64;
    assert!(
        (5..=most).contains(&answered),
        "{answered} answered, at most {most}"
    );
    // Another client has its own bucket.
    let other = instances[1]
        .client
        .get(instances[1].item_url("jd", "100001"))
        .header("x-client-id", "app-ios-43")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 200);
    let status: Value = instances[0]
        .admin_get("/admin/v1/status")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        status["protection"]["client_limit"]["scope"], "fleet",
        "{status}"
    );
    for instance in instances {
        instance.stop().await;
    }
    env.clean_up().await;
}
