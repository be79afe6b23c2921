//! Scale-out as it runs: a fleet of three separate `rebate-query` processes on MariaDB (a fresh
//! database seeded with the demo catalogue), RabbitMQ (a topology of the test's own) and a Redis
//! Cluster of three masters with one replica each that the test starts on free ports, calling one
//! upstream simulator in the test's process, rides out a master failover under load. It proves:
//!
//! - **No errors through a failover**: warm keys, asked round-robin of the three instances while
//!   `CLUSTER FAILOVER` hands a master's slots to its replica, get no 5xx other than (counted)
//!   503s, and a 200 nearly always.
//! - **Leases**: every cold key, asked of all three instances at the same moment, is loaded from
//!   MySQL once in the whole fleet (the product part's `source_loads`, summed over the instances),
//!   failover included.
//! - **Batches**: concurrent cold coupon loads go out as batch calls (items per call above 1).
//! - **The fleet-wide quota**: the simulator never sees more coupon or extras calls within any one
//!   second than the quota's burst + rate, from the three instances together.
//! - **Fences**: a rate changed in MySQL and announced by a `rate_changed` event (admin API, then
//!   RabbitMQ) is served by every instance within seconds, right after the failover.
//!
//! The suite runs the short mode (a 10 s load phase; under a minute in all on two cores, cluster
//! start included). By hand:
//!
//! ```sh
//! cargo test -p query-api --test fleet_cluster -- --nocapture                 # short mode
//! REBATE_FLEET_TEST_SECS=120 cargo test -p query-api --test fleet_cluster -- --nocapture
//! ```
//!
//! `REBATE_FLEET_TEST_SECS` sets the load phase in seconds (at least 4; cold keys scale with it,
//! the failover stays in its middle); the one-line summary goes to stderr. Needs `redis-server` and
//! `redis-cli` 7.0 or later (`--cluster-port`; without them the test fails under CI and skips
//! itself elsewhere), MariaDB (`TEST_MYSQL_URL`, default `mysql://root@127.0.0.1:3306`) and
//! RabbitMQ (`AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use futures::future::join_all;
use rebate_domain::{ItemId, ItemKey, Platform, RateBps, RebateRate, Timestamp};
use rebate_store::demo::demo_item;
use rebate_store::{MySqlConfig, MySqlStore, Versioned};
use rebate_testkit::redis_server::{REDIS_PROGRAMS, RedisCluster};
use rebate_testkit::{free_ports, programs_available, unique_suffix, wait_until_true};
use serde_json::{Value, json};
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use upstream_sim::{Endpoint, RunningSimulator};

const BINARY: &str = env!("CARGO_BIN_EXE_rebate-query");
/// The load phase in seconds, for a longer run by hand.
const LOAD_SECS_VAR: &str = "REBATE_FLEET_TEST_SECS";
const SHORT_LOAD_SECS: u64 = 10;
const INSTANCES: usize = 3;

/// Warm keys: `taobao` 100001 ..= 100200, loaded before the load phase.
const WARM_KEYS: u64 = 200;
const FIRST_WARM_ID: u64 = 100_001;
/// Clients asking warm keys, each one request at a time and at most one per `WARM_PACE`: about
/// 200 requests a second in all, a load the fleet serves calmly in a debug build on two cores, so
/// that what goes wrong is the failover's doing, not the machine's.
const WARM_CLIENTS: usize = 4;
const WARM_PACE: Duration = Duration::from_millis(20);
/// Warm-up: passes over the warm keys, `WARM_CONCURRENCY` at a time, until every instance
/// answers each of them complete (see `Fleet::warm`).
const WARM_CONCURRENCY: usize = 8;
const WARM_PASS_EVERY: Duration = Duration::from_millis(250);
const WARM_LIMIT: Duration = Duration::from_secs(30);

/// Cold keys: `jd` 105001 upward, never asked before the load phase, a group of
/// `COLD_GROUP_SIZE` every second, each key of a group asked of all three instances at once.
const FIRST_COLD_ID: u64 = 105_001;
const COLD_GROUP_SIZE: usize = 6;
const COLD_GROUP_EVERY: Duration = Duration::from_secs(1);

/// The coupon and extras quotas, fleet-wide: at most `QUOTA_BURST + QUOTA_PER_SEC` calls in any
/// second from the three instances together.
const QUOTA_PER_SEC: u64 = 10;
const QUOTA_BURST: u64 = 2;
const QUOTA_LIMIT: u64 = QUOTA_BURST + QUOTA_PER_SEC;

/// The key prefix in Redis (the cluster is the test's own; named to find the quota's bucket).
const REDIS_PREFIX: &str = "fleet";
/// The warm key whose rate the test changes (the fence).
const FENCED_ID: u64 = 100_007;
/// How long a started instance may take to answer `/readyz` 200 with nothing degraded (it
/// builds its Bloom filter from MySQL and connects to Redis and RabbitMQ first).
const READY_LIMIT: Duration = Duration::from_secs(60);
/// Any one request of the test; one that takes longer counts as unanswered.
const REQUEST_LIMIT: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_processes_rides_out_a_master_failover_under_load() {
    if !programs_available("the fleet cluster test", &REDIS_PROGRAMS) {
        return;
    }
    let started = Instant::now();
    let plan = Plan::from_env();
    let scratch = tempfile::tempdir().expect("a scratch directory");

    let cluster = RedisCluster::start(3, 1).await;
    let (database_url, database) = rebate_store::testing::fresh_mysql_database(
        &rebate_store::testing::test_mysql_url(),
        "fleet_cluster",
    )
    .await
    .expect("a fresh MySQL database");
    let store = MySqlStore::connect(&MySqlConfig::new(database_url.clone()))
        .await
        .expect("MySQL reachable");
    store.seed_demo().await.expect("demo catalogue seeded");
    let topology = AmqpTopology::new();
    let simulator_shutdown = CancellationToken::new();
    let simulator =
        RunningSimulator::start("127.0.0.1:0".parse().unwrap(), simulator_shutdown.clone())
            .await
            .expect("the simulator binds");
    let backends = Backends {
        database_url,
        redis_nodes: cluster.urls(),
        topology: &topology,
        upstream_url: simulator.base_url(),
        admin_token: format!("fleet-cluster-token-{:08x}", unique_suffix()),
    };
    let fleet = Fleet::start(&backends, scratch.path()).await;
    let ready_after = started.elapsed();

    // Warm-up: every instance answers every warm key complete, from L1 from now on.
    let warm_keys: Vec<ItemKey> = (0..WARM_KEYS)
        .map(|offset| key(Platform::Taobao, FIRST_WARM_ID + offset))
        .collect();
    fleet.warm(&warm_keys).await;
    let warm_after = started.elapsed();

    let target = FailoverTarget::pick(&cluster, &warm_keys).await;

    // The load phase: warm clients and cold groups from its start, the failover and the fence
    // in its middle.
    let cold_keys = plan.cold_keys();
    let loads_before = fleet.product_loads().await;
    let coupons_before = simulator.state().counters(Endpoint::Coupons);
    let load = Arc::new(Load::new(&fleet, warm_keys));
    let phase_start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..WARM_CLIENTS {
        tasks.spawn(Arc::clone(&load).ask_warm_keys(phase_start + plan.load));
    }
    tasks.spawn(Arc::clone(&load).ask_cold_keys(cold_keys.clone(), phase_start));
    tokio::time::sleep_until(phase_start + plan.load / 2).await;
    let failover = cluster.fail_over(target.replica).await;
    let fence = fleet
        .change_rate_everywhere(&store, key(Platform::Taobao, FENCED_ID), 0)
        .await;
    while let Some(finished) = tasks.join_next().await {
        finished.expect("a load task panicked");
    }

    let coupons = simulator.state().counters(Endpoint::Coupons);
    let figures = Figures {
        ready_after,
        warm_after,
        phase: phase_start.elapsed(),
        warm: load.warm.counts(),
        lowest_warm_key_share: load.lowest_warm_key_share(),
        cold: load.cold.counts(),
        cold_keys: cold_keys.len(),
        cold_keys_in_catalogue: cold_keys
            .iter()
            .filter(|cold_key| demo_item(cold_key.platform, id_number(**cold_key)).is_some())
            .count() as u64,
        product: fleet.product_loads().await.since(loads_before),
        coupon_calls: coupons.calls - coupons_before.calls,
        coupon_items: coupons.items - coupons_before.items,
        peak_coupon_calls: coupons.peak_calls_per_sec,
        peak_extras_calls: simulator
            .state()
            .counters(Endpoint::Extras)
            .peak_calls_per_sec,
        target,
        failover,
        fence,
        wall: started.elapsed(),
    };
    eprintln!("fleet_cluster: {figures}");

    let (warm, cold) = (figures.warm, figures.cold);
    assert_eq!(
        (warm.server_errors, warm.unanswered),
        (0, 0),
        "warm keys: 5xx other than 503, or no answer: {:?}",
        load.warm.examples()
    );
    assert!(
        warm.share_ok() >= 0.95,
        "warm keys answered 200 only {:.2} % of the time",
        warm.share_ok() * 100.0
    );
    assert!(
        figures.lowest_warm_key_share > 0.5,
        "a warm key answered 200 only {:.0} % of the time",
        figures.lowest_warm_key_share * 100.0
    );
    assert_eq!(
        (cold.server_errors, cold.unanswered),
        (0, 0),
        "cold keys: 5xx other than 503, or no answer: {:?}",
        load.cold.examples()
    );
    assert_eq!(
        figures.product.source_loads, figures.cold_keys_in_catalogue,
        "one product load from MySQL per cold key in the whole fleet; more leases won than keys \
         means an instance won a key's lease after another had rebuilt the key completely \
         (lease, load, L2 write, release) since its own L2 read"
    );
    assert!(
        figures.coupon_calls > 0 && figures.batch_factor() > 1.0,
        "cold coupon loads went out one item per call: {} items in {} calls",
        figures.coupon_items,
        figures.coupon_calls
    );
    assert!(
        figures.peak_coupon_calls <= QUOTA_LIMIT && figures.peak_extras_calls <= QUOTA_LIMIT,
        "the fleet called an API more than {QUOTA_LIMIT} times within a second: coupons {}, \
         extras {}",
        figures.peak_coupon_calls,
        figures.peak_extras_calls
    );

    drop(fleet);
    store.close().await;
    topology.delete().await;
    database
        .drop_database()
        .await
        .expect("test database dropped");
    simulator_shutdown.cancel();
    simulator.stopped().await;
}

/// How long the load phase runs: the suite's short mode, or `REBATE_FLEET_TEST_SECS`.
#[derive(Debug, Clone, Copy)]
struct Plan {
    load: Duration,
}

impl Plan {
    fn from_env() -> Self {
        let secs = match std::env::var(LOAD_SECS_VAR) {
            Ok(text) => text.trim().parse().unwrap_or_else(|_| {
                panic!("{LOAD_SECS_VAR}={text:?} is not a whole number of seconds")
            }),
            Err(_) => SHORT_LOAD_SECS,
        };
        assert!(
            secs >= 4,
            "{LOAD_SECS_VAR} must be at least 4 (seconds of load)"
        );
        Self {
            load: Duration::from_secs(secs),
        }
    }

    /// A group of `COLD_GROUP_SIZE` cold keys for every `COLD_GROUP_EVERY` of the load phase.
    fn cold_keys(&self) -> Vec<ItemKey> {
        let groups = self.load.as_secs() / COLD_GROUP_EVERY.as_secs();
        (0..groups * COLD_GROUP_SIZE as u64)
            .map(|offset| key(Platform::Jd, FIRST_COLD_ID + offset))
            .collect()
    }
}

fn key(platform: Platform, id: u64) -> ItemKey {
    ItemKey::new(platform, ItemId::from_u64(id))
}

fn id_number(key: ItemKey) -> u64 {
    key.item_id.as_str().parse().expect("test keys are numbers")
}

/// The L2 key of one part of an item (`{prefix}:v1:{platform}:{item_id}:{part}`).
fn l2_key(key: ItemKey, part: &str) -> String {
    format!(
        "{REDIS_PREFIX}:v1:{}:{}:{part}",
        key.platform.as_str(),
        key.item_id.as_str()
    )
}

/// The master the test fails over, the replica it promotes, and a warm key the master serves.
#[derive(Debug, Clone, Copy)]
struct FailoverTarget {
    master: usize,
    replica: usize,
    warm_key: ItemKey,
}

impl FailoverTarget {
    /// The master serving the coupon quota's bucket, so that the fleet-wide quota lives through
    /// the failover too. Keys have no hash tags, so every master also serves warm keys: the
    /// first of them is named in the summary.
    async fn pick(cluster: &RedisCluster, warm_keys: &[ItemKey]) -> Self {
        let master = cluster
            .owner_of(&format!("{REDIS_PREFIX}:quota:coupons"))
            .await;
        let replica = *cluster
            .replicas_of(master)
            .await
            .first()
            .expect("every master has a replica");
        for &warm_key in warm_keys {
            if cluster.owner_of(&l2_key(warm_key, "product")).await == master {
                return Self {
                    master,
                    replica,
                    warm_key,
                };
            }
        }
        panic!("node {master} serves no warm key");
    }
}

/// What the run measured, for the summary line and the assertions.
#[derive(Debug)]
struct Figures {
    ready_after: Duration,
    warm_after: Duration,
    phase: Duration,
    warm: TallyCounts,
    lowest_warm_key_share: f64,
    cold: TallyCounts,
    cold_keys: usize,
    cold_keys_in_catalogue: u64,
    /// The product part's counters over the load phase, summed over the instances.
    product: ProductLoads,
    /// Coupon calls and the items they carried during the load phase: the cold keys' (warm keys
    /// answer from L1 for longer than the short mode lasts).
    coupon_calls: u64,
    coupon_items: u64,
    peak_coupon_calls: u64,
    peak_extras_calls: u64,
    target: FailoverTarget,
    failover: Duration,
    fence: Duration,
    wall: Duration,
}

impl Figures {
    /// Items per coupon call during the load phase.
    fn batch_factor(&self) -> f64 {
        self.coupon_items as f64 / self.coupon_calls.max(1) as f64
    }
}

impl std::fmt::Display for Figures {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (warm, cold, product) = (&self.warm, &self.cold, &self.product);
        write!(
            formatter,
            "{INSTANCES} processes ready after {:.1} s, warm after {:.1} s; load phase {:.1} s: \
             warm {} answers, {:.2} % 200 (lowest per key {:.0} %), {} 503, {} other 5xx, {} \
             unanswered; cold {} keys ({} in the catalogue; {} answers, {} 503, {} other 5xx, \
             {} unanswered); product source loads {} (leases won {}, lost {}, waits served \
             {}, L2 errors {}); coupons batch factor {:.2} ({} items / {} calls); peak calls/s \
             coupons {}, extras {} (limit {QUOTA_LIMIT}); failover of node {} to node {} (warm \
             key {} among its keys) {} ms; fence everywhere {} ms; wall {:.1} s",
            self.ready_after.as_secs_f64(),
            self.warm_after.as_secs_f64(),
            self.phase.as_secs_f64(),
            warm.answers,
            warm.share_ok() * 100.0,
            self.lowest_warm_key_share * 100.0,
            warm.unavailable,
            warm.server_errors,
            warm.unanswered,
            self.cold_keys,
            self.cold_keys_in_catalogue,
            cold.answers,
            cold.unavailable,
            cold.server_errors,
            cold.unanswered,
            product.source_loads,
            product.leases_won,
            product.leases_lost,
            product.lease_waits_served,
            product.l2_errors,
            self.batch_factor(),
            self.coupon_items,
            self.coupon_calls,
            self.peak_coupon_calls,
            self.peak_extras_calls,
            self.target.master,
            self.target.replica,
            self.target.warm_key,
            self.failover.as_millis(),
            self.fence.as_millis(),
            self.wall.as_secs_f64(),
        )
    }
}

/// What every instance of the fleet shares.
struct Backends<'a> {
    database_url: String,
    redis_nodes: Vec<String>,
    topology: &'a AmqpTopology,
    upstream_url: String,
    admin_token: String,
}

impl Backends<'_> {
    /// The environment of instance `index`: the production profile's mechanisms, on the test's
    /// back ends, with small quotas and warm-up off (the test warms what it measures).
    fn environment(&self, index: usize) -> Vec<(String, String)> {
        let nodes: Vec<String> = self
            .redis_nodes
            .iter()
            .map(|url| format!("\"{url}\""))
            .collect();
        let quota_per_sec = format!("{QUOTA_PER_SEC}.0");
        let quota_burst = QUOTA_BURST.to_string();
        let mut environment: Vec<(&str, String)> = vec![
            ("ADMIN__TOKEN", self.admin_token.clone()),
            ("STORE__BACKEND", "mysql".into()),
            ("STORE__SEED_DEMO", "false".into()),
            ("STORE__MYSQL__URL", self.database_url.clone()),
            // Three instances share the test's MariaDB with the rest of the suite.
            ("STORE__MYSQL__MAX_CONNECTIONS", "8".into()),
            ("REDIS__ENABLED", "true".into()),
            ("REDIS__CLUSTER_NODES", format!("[{}]", nodes.join(","))),
            ("REDIS__PREFIX", REDIS_PREFIX.into()),
            // Three debug builds, six Redis nodes and the test share two cores: Redis answers
            // well within 100 ms in production, not always here (as in tests/support).
            ("REDIS__COMMAND_TIMEOUT_MS", "1000".into()),
            ("EVENTS__BACKEND", "amqp".into()),
            ("UPSTREAMS__SIMULATE", "false".into()),
            ("UPSTREAMS__COUPONS_URL", self.upstream_url.clone()),
            ("UPSTREAMS__EXTRAS_URL", self.upstream_url.clone()),
            ("RESILIENCE__FLEET__QUOTAS", "true".into()),
            ("RESILIENCE__COUPONS__QUOTA_PER_SEC", quota_per_sec.clone()),
            ("RESILIENCE__COUPONS__QUOTA_BURST", quota_burst.clone()),
            ("RESILIENCE__EXTRAS__QUOTA_PER_SEC", quota_per_sec),
            ("RESILIENCE__EXTRAS__QUOTA_BURST", quota_burst),
            // Every client of the test is 127.0.0.1.
            ("RESILIENCE__CLIENT_LIMIT__ENABLED", "false".into()),
            ("OBSERVABILITY__INSTANCE_ID", format!("fleet-{index}")),
            ("WARMUP__ENABLED", "false".into()),
            ("LOG__FILTER", "warn".into()),
        ];
        environment.extend(self.topology.environment(index));
        environment
            .into_iter()
            .map(|(name, value)| (format!("REBATE__{name}"), value))
            .collect()
    }
}

/// The three `rebate-query` processes; killed when dropped, their logs' last lines printed
/// when the test fails.
struct Fleet {
    instances: Vec<Instance>,
    client: reqwest::Client,
    admin_token: String,
}

impl Fleet {
    /// Starts every instance at once and waits (bounded) until each is ready.
    async fn start(backends: &Backends<'_>, dir: &Path) -> Self {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(REQUEST_LIMIT)
            .build()
            .expect("an HTTP client");
        let instances =
            join_all((0..INSTANCES).map(|index| Instance::start(index, backends, dir, &client)))
                .await;
        Self {
            instances,
            client,
            admin_token: backends.admin_token.clone(),
        }
    }

    /// Asks every warm key of every instance until each answers it complete (200, nothing
    /// degraded), `WARM_CONCURRENCY` at a time. The small quota refuses the coupon and extras
    /// calls past it at once, so keys still degraded are asked again in the next pass, one pass
    /// at most every `WARM_PASS_EVERY`, for at most `WARM_LIMIT` in all. The first instance loads
    /// from the sources, the others mostly from L2.
    async fn warm(&self, keys: &[ItemKey]) {
        let give_up = Instant::now() + WARM_LIMIT;
        for instance in &self.instances {
            let mut pending = keys.to_vec();
            let mut passes = tokio::time::interval(WARM_PASS_EVERY);
            while !pending.is_empty() && Instant::now() < give_up {
                passes.tick().await;
                let answers: Vec<(ItemKey, bool)> = futures::stream::iter(pending)
                    .map(|warm_key| async move {
                        let complete = match self.quote(instance, warm_key).await {
                            Ok((200, body)) => body["degraded"] == json!(false),
                            Ok(_) | Err(_) => false,
                        };
                        (warm_key, complete)
                    })
                    .buffer_unordered(WARM_CONCURRENCY)
                    .collect()
                    .await;
                pending = answers
                    .into_iter()
                    .filter_map(|(warm_key, complete)| (!complete).then_some(warm_key))
                    .collect();
            }
            assert!(
                pending.is_empty(),
                "instance {}: {} warm keys still not complete after {WARM_LIMIT:?}, e.g. {}",
                instance.index,
                pending.len(),
                pending[0]
            );
        }
    }

    /// `GET` of one quote: the status and the JSON body (`Null` when it is not JSON).
    async fn quote(&self, instance: &Instance, key: ItemKey) -> Result<(u16, Value), String> {
        let response = self
            .client
            .get(instance.quote_url(key))
            .send()
            .await
            .map_err(|error| error.to_string())?;
        let status = response.status().as_u16();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }

    /// The product part's lease and load counters, summed over the instances.
    async fn product_loads(&self) -> ProductLoads {
        let mut sum = ProductLoads::default();
        for instance in &self.instances {
            let status: Value = self
                .client
                .get(format!("{}/admin/v1/status", instance.admin))
                .bearer_auth(&self.admin_token)
                .send()
                .await
                .expect("the admin listener answers")
                .json()
                .await
                .expect("a JSON status");
            let product = &status["caches"]["product"];
            let counter = |name: &str| {
                product[name]
                    .as_u64()
                    .unwrap_or_else(|| panic!("caches.product.{name} in the status: {product}"))
            };
            sum.source_loads += counter("source_loads");
            sum.leases_won += counter("leases_won");
            sum.leases_lost += counter("leases_lost");
            sum.lease_waits_served += counter("lease_waits_served");
            sum.l2_errors += counter("l2_errors");
        }
        sum
    }

    /// The fence: changes `key`'s rate row in MySQL (a new rate at the next version), announces
    /// it with a `rate_changed` event through instance `publisher`'s admin API, and waits
    /// (bounded) until every instance serves the new rate. Returns how long that took.
    async fn change_rate_everywhere(
        &self,
        store: &MySqlStore,
        key: ItemKey,
        publisher: usize,
    ) -> Duration {
        let seeded = demo_item(key.platform, id_number(key))
            .expect("a demo item")
            .rate;
        let version = seeded.version + 1;
        let rate_bps: u64 = if seeded.value.rate_bps.get() == 4321 {
            4322
        } else {
            4321
        };
        let changed = Versioned {
            value: RebateRate {
                rate_bps: RateBps::try_from(rate_bps).expect("a valid rate"),
            },
            version,
            updated_at: Timestamp::now(),
        };
        store
            .upsert_rate(key, &changed)
            .await
            .expect("the rate row is written");
        let started = Instant::now();
        let published = self
            .client
            .post(format!(
                "{}/admin/v1/events",
                self.instances[publisher].admin
            ))
            .bearer_auth(&self.admin_token)
            .json(&json!({
                "kind": "rate_changed",
                "platform": key.platform.as_str(),
                "item_ids": [key.item_id.as_str()],
                "version": version,
            }))
            .send()
            .await
            .expect("the admin listener answers");
        assert_eq!(published.status(), 202, "the event is published");
        wait_until_true("every instance serves the changed rate", || async {
            for instance in &self.instances {
                let served = match self.quote(instance, key).await {
                    Ok((200, body)) => body["rebate"]["rate_bps"].as_u64(),
                    Ok(_) | Err(_) => None,
                };
                if served != Some(rate_bps) {
                    return false;
                }
            }
            true
        })
        .await;
        started.elapsed()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for instance in &self.instances {
                eprintln!(
                    "--- instance {} ({}), last log lines:\n{}",
                    instance.index,
                    instance.log.display(),
                    log_tail(&instance.log)
                );
            }
        }
    }
}

/// The product part's counters (`GET /admin/v1/status` → `caches.product`).
#[derive(Debug, Default, Clone, Copy)]
struct ProductLoads {
    source_loads: u64,
    leases_won: u64,
    leases_lost: u64,
    lease_waits_served: u64,
    l2_errors: u64,
}

impl ProductLoads {
    /// What the counters grew by since `before`.
    fn since(self, before: Self) -> Self {
        Self {
            source_loads: self.source_loads - before.source_loads,
            leases_won: self.leases_won - before.leases_won,
            leases_lost: self.leases_lost - before.leases_lost,
            lease_waits_served: self.lease_waits_served - before.lease_waits_served,
            l2_errors: self.l2_errors - before.l2_errors,
        }
    }
}

/// One `rebate-query` child process, killed when dropped.
struct Instance {
    index: usize,
    api: String,
    admin: String,
    log: PathBuf,
    child: Child,
}

impl Instance {
    /// Starts instance `index` on free ports with its log in `dir`, and waits (bounded) until
    /// `/readyz` answers 200 with nothing degraded (store, Redis and the broker all up). A port
    /// taken meanwhile fails the start: then once more on other ports.
    async fn start(
        index: usize,
        backends: &Backends<'_>,
        dir: &Path,
        client: &reqwest::Client,
    ) -> Self {
        let mut failures = Vec::new();
        for attempt in 0..2 {
            let [http_port, admin_port] = free_ports();
            let log = dir.join(format!("instance-{index}-{attempt}.log"));
            let log_file = std::fs::File::create(&log).expect("a log file");
            let mut command = Command::new(BINARY);
            for (name, _) in std::env::vars_os() {
                let inherited = name.to_string_lossy();
                if inherited.starts_with("REBATE__") || SCRUBBED_VARS.contains(&inherited.as_ref())
                {
                    command.env_remove(&name);
                }
            }
            let child = command
                .current_dir(dir)
                .envs(backends.environment(index))
                .env("REBATE__HTTP__LISTEN", format!("127.0.0.1:{http_port}"))
                .env("REBATE__ADMIN__LISTEN", format!("127.0.0.1:{admin_port}"))
                .env(
                    "REBATE__ADMIN__TOKEN_FILE",
                    dir.join(format!("admin-token-{index}")),
                )
                .stdin(Stdio::null())
                .stdout(log_file.try_clone().expect("a log file handle"))
                .stderr(log_file)
                .kill_on_drop(true)
                .spawn()
                .expect("rebate-query starts");
            let mut instance = Self {
                index,
                api: format!("http://127.0.0.1:{http_port}"),
                admin: format!("http://127.0.0.1:{admin_port}"),
                log,
                child,
            };
            match instance.wait_until_ready(client).await {
                Ok(()) => return instance,
                Err(reason) => failures.push(format!(
                    "{reason}; last log lines:\n{}",
                    log_tail(&instance.log)
                )),
            }
        }
        panic!(
            "instance {index} did not start:\n{}",
            failures.join("\n---\n")
        );
    }

    async fn wait_until_ready(&mut self, client: &reqwest::Client) -> Result<(), String> {
        let give_up = Instant::now() + READY_LIMIT;
        let mut last = String::from("no answer");
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited during start-up ({status})"));
            }
            if let Ok(response) = client.get(format!("{}/readyz", self.admin)).send().await {
                let status = response.status().as_u16();
                let body: Value = response.json().await.unwrap_or(Value::Null);
                if status == 200 && body["degraded"] == json!([]) {
                    return Ok(());
                }
                last = format!("{status} {body}");
            }
            if Instant::now() >= give_up {
                return Err(format!(
                    "not ready within {READY_LIMIT:?}; last /readyz: {last}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn quote_url(&self, key: ItemKey) -> String {
        quote_url(&self.api, key)
    }
}

/// `GET /api/v1/items/{platform}/{item_id}/rebate` on the API at `api`.
fn quote_url(api: &str, key: ItemKey) -> String {
    format!(
        "{api}/api/v1/items/{}/{}/rebate",
        key.platform.as_str(),
        key.item_id.as_str()
    )
}

/// Variables of the test's own environment that would change the instances' configuration.
const SCRUBBED_VARS: [&str; 6] = [
    "DATABASE_URL",
    "REDIS_URL",
    "AMQP_URL",
    "RUST_LOG",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "REBATE_ADMIN_TOKEN",
];

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// What the load's tasks share: the instances' addresses, one HTTP client and the tallies.
struct Load {
    client: reqwest::Client,
    /// Each instance's API base URL.
    apis: Vec<String>,
    warm_keys: Vec<ItemKey>,
    /// Requests of warm keys so far: the next one's key and instance.
    next: AtomicU64,
    warm: Tally,
    cold: Tally,
    /// Per warm key: its 200s and its answers.
    per_warm_key: Vec<(AtomicU64, AtomicU64)>,
}

impl Load {
    fn new(fleet: &Fleet, warm_keys: Vec<ItemKey>) -> Self {
        Self {
            client: fleet.client.clone(),
            apis: fleet
                .instances
                .iter()
                .map(|instance| instance.api.clone())
                .collect(),
            per_warm_key: warm_keys
                .iter()
                .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                .collect(),
            warm_keys,
            next: AtomicU64::new(0),
            warm: Tally::default(),
            cold: Tally::default(),
        }
    }

    /// One client: warm keys round-robin over the instances, at most one request per
    /// `WARM_PACE`, until `until`.
    async fn ask_warm_keys(self: Arc<Self>, until: Instant) {
        let most = (until - Instant::now()).as_millis() / WARM_PACE.as_millis() + 1;
        let mut pace = tokio::time::interval(WARM_PACE);
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for _ in 0..most {
            pace.tick().await;
            if Instant::now() >= until {
                break;
            }
            let request = self.next.fetch_add(1, Ordering::Relaxed) as usize;
            let key_index = request % self.warm_keys.len();
            let url = quote_url(&self.apis[request % INSTANCES], self.warm_keys[key_index]);
            let answer = ask(&self.client, &url).await;
            self.warm.record(&url, &answer);
            let (ok, answers) = &self.per_warm_key[key_index];
            answers.fetch_add(1, Ordering::Relaxed);
            if matches!(answer, Ok((200, _))) {
                ok.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Cold keys in groups of `COLD_GROUP_SIZE`, one group every `COLD_GROUP_EVERY` from
    /// `start`: every key of a group asked of every instance at the same moment.
    async fn ask_cold_keys(self: Arc<Self>, keys: Vec<ItemKey>, start: Instant) {
        for (group_index, group) in keys.chunks(COLD_GROUP_SIZE).enumerate() {
            let due = start + COLD_GROUP_EVERY * u32::try_from(group_index).unwrap_or(u32::MAX);
            tokio::time::sleep_until(due).await;
            let urls: Vec<String> = group
                .iter()
                .flat_map(|&cold_key| self.apis.iter().map(move |api| quote_url(api, cold_key)))
                .collect();
            let answers = join_all(urls.iter().map(|url| ask(&self.client, url))).await;
            for (url, answer) in urls.iter().zip(&answers) {
                self.cold.record(url, answer);
            }
        }
    }

    /// The smallest share of 200s among the warm keys' answers.
    fn lowest_warm_key_share(&self) -> f64 {
        self.per_warm_key
            .iter()
            .map(|(ok, answers)| {
                ok.load(Ordering::Relaxed) as f64 / answers.load(Ordering::Relaxed).max(1) as f64
            })
            .fold(1.0, f64::min)
    }
}

/// One `GET`: the status and body, or why nothing came back in time.
async fn ask(client: &reqwest::Client, url: &str) -> Result<(u16, String), String> {
    let response = client
        .get(url)
        .send()
        .await
        .map_err(|error| error.to_string())?;
    let status = response.status().as_u16();
    let body = response.text().await.map_err(|error| error.to_string())?;
    Ok((status, body))
}

/// The answers to one class of keys, by outcome.
#[derive(Debug, Default)]
struct Tally {
    answers: AtomicU64,
    ok: AtomicU64,
    unavailable: AtomicU64,
    server_errors: AtomicU64,
    unanswered: AtomicU64,
    /// The first few server errors and unanswered requests, for the failure message.
    examples: Mutex<Vec<String>>,
}

/// A [`Tally`] read at one moment.
#[derive(Debug, Clone, Copy)]
struct TallyCounts {
    answers: u64,
    ok: u64,
    /// 503s: allowed (the service sheds or has nothing to serve), counted.
    unavailable: u64,
    /// Every other 5xx: never allowed.
    server_errors: u64,
    /// No answer within `REQUEST_LIMIT`, or a broken connection: never allowed.
    unanswered: u64,
}

impl TallyCounts {
    fn share_ok(&self) -> f64 {
        self.ok as f64 / self.answers.max(1) as f64
    }
}

impl Tally {
    const MAX_EXAMPLES: usize = 5;

    fn record(&self, url: &str, answer: &Result<(u16, String), String>) {
        self.answers.fetch_add(1, Ordering::Relaxed);
        let example = match answer {
            Ok((200, _)) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
                None
            }
            Ok((503, _)) => {
                self.unavailable.fetch_add(1, Ordering::Relaxed);
                None
            }
            Ok((status @ 500..=599, body)) => {
                self.server_errors.fetch_add(1, Ordering::Relaxed);
                Some(format!("{url}: {status} {body}"))
            }
            Ok(_) => None,
            Err(error) => {
                self.unanswered.fetch_add(1, Ordering::Relaxed);
                Some(format!("{url}: {error}"))
            }
        };
        if let Some(example) = example {
            let mut examples = self.examples.lock().unwrap_or_else(PoisonError::into_inner);
            if examples.len() < Self::MAX_EXAMPLES {
                examples.push(example);
            }
        }
    }

    fn counts(&self) -> TallyCounts {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        TallyCounts {
            answers: read(&self.answers),
            ok: read(&self.ok),
            unavailable: read(&self.unavailable),
            server_errors: read(&self.server_errors),
            unanswered: read(&self.unanswered),
        }
    }

    fn examples(&self) -> Vec<String> {
        self.examples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// A RabbitMQ topology of the test's own (exchange, queues, dead letters); deleted at the end,
/// or on drop when the test fails first.
struct AmqpTopology {
    url: String,
    names: String,
    deleted: bool,
}

impl AmqpTopology {
    fn new() -> Self {
        Self {
            url: std::env::var("AMQP_URL")
                .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned()),
            names: format!(
                "test.fleet_cluster.{}.{:08x}",
                std::process::id(),
                unique_suffix()
            ),
            deleted: false,
        }
    }

    /// Instance `index`'s `events` settings (names relative to `REBATE__`).
    fn environment(&self, index: usize) -> Vec<(&'static str, String)> {
        let names = &self.names;
        vec![
            ("EVENTS__AMQP__URL", self.url.clone()),
            ("EVENTS__AMQP__EXCHANGE", format!("{names}.events")),
            ("EVENTS__AMQP__SHARED_QUEUE", format!("{names}.shared")),
            (
                "EVENTS__AMQP__BROADCAST_QUEUE_PREFIX",
                format!("{names}.instance."),
            ),
            ("EVENTS__AMQP__DEAD_LETTER_EXCHANGE", format!("{names}.dlx")),
            ("EVENTS__AMQP__DEAD_LETTER_QUEUE", format!("{names}.dead")),
            ("EVENTS__AMQP__INSTANCE_ID", format!("i{index}")),
        ]
    }

    async fn delete(mut self) {
        self.deleted = true;
        delete_amqp_topology(self.url.clone(), self.names.clone()).await;
    }
}

impl Drop for AmqpTopology {
    /// The path of a test that failed first: async code cannot run in `Drop`, so a helper
    /// thread with a runtime of its own deletes the topology (as `TestDatabase` drops its
    /// database).
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        let (url, names) = (self.url.clone(), self.names.clone());
        let cleanup = std::thread::spawn(move || {
            if let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                runtime.block_on(delete_amqp_topology(url, names));
            }
        });
        let _ = cleanup.join();
    }
}

/// Deletes the queues (the instances' broadcast queues too, which the broker would otherwise
/// keep for their catch-up window) and exchanges; best effort, bounded.
async fn delete_amqp_topology(url: String, names: String) {
    use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
    let deletion = async {
        let connection =
            lapin::Connection::connect(&url, lapin::ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        let queues = [format!("{names}.shared"), format!("{names}.dead")]
            .into_iter()
            .chain((0..INSTANCES).map(|index| format!("{names}.instance.i{index}")));
        for queue in queues {
            channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await?;
        }
        for exchange in [format!("{names}.events"), format!("{names}.dlx")] {
            channel
                .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
                .await?;
        }
        connection.close(200, "cleanup".into()).await
    };
    if let Ok(Err(error)) = tokio::time::timeout(Duration::from_secs(10), deletion).await {
        eprintln!("the test's RabbitMQ topology {names} was not deleted: {error}");
    }
}
