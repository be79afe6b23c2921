//! Test support: start the real [`Application`] on port 0 with its own SQLite file, the embedded
//! upstream simulator and a manual clock, and talk to it over real HTTP.
//!
//! Each test gets its own database file in its own temporary directory, so tests run in
//! parallel without sharing anything.
#![allow(
    clippy::disallowed_methods,
    reason = "black-box tests against real servers wait and measure on the wall clock"
)]

pub use rebate_testkit::{unique_suffix, wait_until, wait_until_true};

pub mod amqp;
pub mod binlog_server;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use query_api::{AppState, Application, Settings};
use rebate_cache::ManualClock;
use rebate_resilience::ManualTicker;
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use upstream_sim::{Endpoint, Fault, RunningSimulator, SimState};

/// A running service and the handles a test needs to steer and observe it.
#[derive(Debug)]
pub struct TestApp {
    pub address: SocketAddr,
    pub base_url: String,
    /// The admin listener, and its token (generated into the test's directory).
    pub admin_url: String,
    pub admin_token: String,
    pub client: reqwest::Client,
    pub clock: ManualClock,
    /// The monotonic time of breakers, quotas and the load shedder; moves only when told to.
    pub ticker: ManualTicker,
    /// The upstream simulator this instance calls: its own embedded one, or the one a
    /// [`ProductionEnv`] shares between its instances.
    pub simulator: SimState,
    pub state: AppState,
    pub database_path: std::path::PathBuf,
    pub shutdown: CancellationToken,
    /// The serving task; yields the error text if the service failed.
    pub server: JoinHandle<Result<(), String>>,
    _directory: TempDir,
}

/// Starts an application with the embedded defaults adjusted for tests; `customise` may change
/// any setting before the build.
pub async fn spawn_app_with(customise: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_app_calling(None, customise).await
}

/// [`spawn_app_with`], calling `shared` (a simulator of the test's own, already running) instead
/// of an embedded one when given.
async fn spawn_app_calling(
    shared: Option<&RunningSimulator>,
    customise: impl FnOnce(&mut Settings),
) -> TestApp {
    let directory = tempfile::tempdir().expect("temporary directory");
    let database_path = directory.path().join("catalogue.sqlite");
    let mut settings = Settings::defaults().expect("embedded defaults are valid");
    settings.http.listen = "127.0.0.1:0".parse().unwrap();
    settings.admin.listen = "127.0.0.1:0".parse().unwrap();
    settings.admin.token_file = directory.path().join("admin-token");
    settings.http.shutdown_drain_ms = 2_000;
    settings.store.sqlite.path = database_path.clone();
    settings.upstreams.simulate = true;
    // Background loads would make store and upstream counts depend on timing; tests that are
    // about them switch them on.
    settings.warmup.enabled = false;
    settings.bloom.enabled = false;
    // Likewise the warm-job consumer: its polls are Redis round trips that tests count.
    settings.warm_jobs.consume = false;
    // Likewise the consistency observer's drift sampler: its store reads are queries that tests
    // count. The observer's tests switch it on.
    settings.events.observer.drift_keys_per_sec = 0;
    // Every test client comes from 127.0.0.1; tests of the limit switch it on.
    settings.resilience.client_limit.enabled = false;
    // Token buckets refill on the ticker, which tests do not move: outbound quotas, and each
    // item's own limit on loads (hot items), would run dry after one burst. Tests of quotas and
    // hot items set their own.
    for upstream in [
        &mut settings.resilience.coupons,
        &mut settings.resilience.extras,
    ] {
        upstream.quota_per_sec = None;
        upstream.quota_burst = None;
        upstream.hot_item_per_sec = Some(0.0);
    }
    if let Some(shared) = shared {
        settings.upstreams.simulate = false;
        settings.upstreams.coupons_url = shared.base_url();
        settings.upstreams.extras_url = shared.base_url();
    }
    customise(&mut settings);

    let clock = ManualClock::starting_now();
    let ticker = ManualTicker::new();
    let application =
        Application::build_with_clocks(settings, Arc::new(clock.clone()), Arc::new(ticker.clone()))
            .await
            .expect("application builds");
    let address = application.local_addr();
    let admin_url = format!("http://{}", application.admin_addr());
    let simulator = shared
        .or(application.simulator())
        .expect("tests run with the embedded simulator or a shared one")
        .state()
        .clone();
    let state = application.state().clone();
    let shutdown = application.shutdown_token();
    let admin_token = std::fs::read_to_string(directory.path().join("admin-token"))
        .expect("the generated admin token is written to admin.token_file");
    let server = tokio::spawn(async move {
        application
            .run_until_stopped()
            .await
            .map_err(|error| format!("{error:#}"))
    });
    TestApp {
        address,
        base_url: format!("http://{address}"),
        admin_url,
        admin_token,
        client: reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("http client"),
        clock,
        ticker,
        simulator,
        state,
        database_path,
        shutdown,
        server,
        _directory: directory,
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// The shared back ends of a production-profile test: a fresh MySQL database seeded with the
/// demo catalogue, and a Redis key prefix of its own. Instances started with
/// [`ProductionEnv::spawn_instance`] share both, like a fleet behind a load balancer.
#[derive(Debug)]
pub struct ProductionEnv {
    pub database_url: String,
    pub redis_url: String,
    pub prefix: String,
    database: Option<rebate_store::testing::TestDatabase>,
    /// One upstream simulator for every instance, as the fleet shares the real APIs (see
    /// [`ProductionEnv::share_simulator`]); else each instance embeds its own.
    simulator: Option<(RunningSimulator, CancellationToken)>,
}

/// The Redis server integration tests use (`TEST_REDIS_URL`, default the local one).
pub fn test_redis_url() -> String {
    std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

impl ProductionEnv {
    pub async fn new(name: &str) -> Self {
        Self::with_redis(name, test_redis_url()).await
    }

    pub async fn with_redis(name: &str, redis_url: String) -> Self {
        Self::with_servers(name, &rebate_store::testing::test_mysql_url(), redis_url).await
    }

    /// On the MySQL server `mysql_url` names (a database of the test's own is made there) and
    /// the Redis server at `redis_url`.
    pub async fn with_servers(name: &str, mysql_url: &str, redis_url: String) -> Self {
        let (database_url, database) = rebate_store::testing::fresh_mysql_database(mysql_url, name)
            .await
            .expect("a fresh MySQL database");
        let store = rebate_store::MySqlStore::connect(&rebate_store::MySqlConfig::new(
            database_url.clone(),
        ))
        .await
        .expect("MySQL reachable");
        store.seed_demo().await.expect("demo catalogue seeded");
        store.close().await;
        let prefix = format!("test-{name}-{}-{:08x}", std::process::id(), unique_suffix());
        Self {
            database_url,
            redis_url,
            prefix,
            database: Some(database),
            simulator: None,
        }
    }

    /// Makes every instance started from now on call one simulator, so that its counters are
    /// the fleet's calls (an external API's contract counts them all).
    pub async fn share_simulator(&mut self) -> SimState {
        let token = CancellationToken::new();
        let simulator = RunningSimulator::start("127.0.0.1:0".parse().unwrap(), token.clone())
            .await
            .expect("the shared simulator binds");
        let state = simulator.state().clone();
        self.simulator = Some((simulator, token));
        state
    }

    /// An instance on these back ends; `customise` may change any setting before the build.
    pub async fn spawn_instance(&self, customise: impl FnOnce(&mut Settings)) -> TestApp {
        let database_url = self.database_url.clone();
        let redis_url = self.redis_url.clone();
        let prefix = self.prefix.clone();
        let shared = self.simulator.as_ref().map(|(simulator, _)| simulator);
        spawn_app_calling(shared, move |settings| {
            settings.store.backend = query_api::config::StoreBackend::Mysql;
            settings.store.seed_demo = false;
            settings.store.mysql.url = query_api::config::Secret::new(database_url);
            settings.redis.enabled = true;
            settings.redis.url = query_api::config::Secret::new(redis_url);
            settings.redis.prefix = prefix;
            // Several instances and tests share two cores in a debug build: Redis answers well
            // within 100 ms in production, not always here.
            settings.redis.command_timeout_ms = 1_000;
            settings.bloom.enabled = true;
            customise(settings);
        })
        .await
    }

    /// A connection of the test's own to the environment's database (close it when done).
    pub async fn store(&self) -> rebate_store::MySqlStore {
        rebate_store::MySqlStore::connect(&rebate_store::MySqlConfig::new(
            self.database_url.clone(),
        ))
        .await
        .expect("MySQL reachable")
    }

    /// Drops the database and the prefix's Redis keys.
    pub async fn clean_up(mut self) {
        if let Some((simulator, token)) = self.simulator.take() {
            token.cancel();
            simulator.stopped().await;
        }
        if let Some(database) = self.database.take() {
            database
                .drop_database()
                .await
                .expect("test database dropped");
        }
        delete_redis_prefix(&self.redis_url, &self.prefix).await;
    }
}

/// Deletes every key under `prefix`, hash-tagged ones (`{prefix:hot}:…`, `{prefix:warm}:…`)
/// included (best effort: a dead server has nothing to clean).
pub async fn delete_redis_prefix(redis_url: &str, prefix: &str) {
    let Ok(client) = redis::Client::open(redis_url) else {
        return;
    };
    let Ok(mut connection) = client.get_multiplexed_async_connection().await else {
        return;
    };
    for pattern in [format!("{prefix}:*"), format!("{{{prefix}:*")] {
        delete_matching(&mut connection, &pattern).await;
    }
}

async fn delete_matching(connection: &mut redis::aio::MultiplexedConnection, pattern: &str) {
    let mut cursor: u64 = 0;
    loop {
        let Ok((next, keys)): redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(connection)
            .await
        else {
            return;
        };
        if !keys.is_empty() {
            let _: redis::RedisResult<u64> =
                redis::cmd("DEL").arg(&keys).query_async(connection).await;
        }
        if next == 0 {
            return;
        }
        cursor = next;
    }
}

impl TestApp {
    /// Writes `rate_bps` for `key` into the embedded catalogue, as an operator would, at
    /// `version` (default: one past the stored row's); the version written. The cache is not
    /// told: publish the change event for that.
    pub async fn write_rate(
        &self,
        key: rebate_domain::ItemKey,
        rate_bps: u64,
        version: Option<u64>,
    ) -> u64 {
        use rebate_store::CatalogRepository as _;
        let store = rebate_store::SqliteStore::open(&rebate_store::SqliteConfig {
            path: self.database_path.clone(),
            max_connections: 1,
            acquire_timeout: Duration::from_secs(5),
        })
        .await
        .expect("the app's catalogue opens");
        let version = match version {
            Some(version) => version,
            None => store.rate(key).await.unwrap().map_or(0, |row| row.version) + 1,
        };
        let rate = rebate_domain::RebateRate {
            rate_bps: rebate_domain::RateBps::try_from(rate_bps).expect("a valid rate"),
        };
        store
            .upsert_rate(
                key,
                &rebate_store::Versioned {
                    value: rate,
                    version,
                    updated_at: rebate_domain::Timestamp::now(),
                },
            )
            .await
            .expect("the rate is written");
        store.close().await;
        version
    }

    pub fn item_url(&self, platform: &str, item_id: &str) -> String {
        format!("{}/api/v1/items/{platform}/{item_id}/rebate", self.base_url)
    }

    pub async fn get_item(&self, platform: &str, item_id: &str) -> reqwest::Response {
        self.client
            .get(self.item_url(platform, item_id))
            .send()
            .await
            .expect("request reaches the service")
    }

    pub async fn post_batch(&self, body: &serde_json::Value) -> reqwest::Response {
        self.client
            .post(format!("{}/api/v1/items:batch", self.base_url))
            .json(body)
            .send()
            .await
            .expect("request reaches the service")
    }

    /// `GET /readyz` (no token): the status code and the JSON body.
    pub async fn readyz(&self) -> (u16, serde_json::Value) {
        let response = self
            .client
            .get(format!("{}/readyz", self.admin_url))
            .send()
            .await
            .expect("the admin listener answers");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON body"))
    }

    /// `GET` on the admin listener with the bearer token.
    pub async fn admin_get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(format!("{}{path}", self.admin_url))
            .bearer_auth(&self.admin_token)
            .send()
            .await
            .expect("request reaches the admin listener")
    }

    /// The admin listener's `/metrics` exposition (served without a token).
    pub async fn metrics_text(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.admin_url))
            .send()
            .await
            .expect("request reaches the admin listener")
            .text()
            .await
            .expect("the exposition is text")
    }

    /// `POST` of a JSON body on the admin listener with the bearer token.
    pub async fn admin_post(&self, path: &str, body: &serde_json::Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.admin_url))
            .bearer_auth(&self.admin_token)
            .json(body)
            .send()
            .await
            .expect("request reaches the admin listener")
    }

    /// `PUT` of a JSON body on the admin listener with the bearer token.
    pub async fn admin_put(&self, path: &str, body: &serde_json::Value) -> reqwest::Response {
        self.client
            .put(format!("{}{path}", self.admin_url))
            .bearer_auth(&self.admin_token)
            .json(body)
            .send()
            .await
            .expect("request reaches the admin listener")
    }

    /// Makes one simulated API fail every call (5xx) until its fault is set again.
    pub fn break_upstream(&self, endpoint: Endpoint) {
        self.set_upstream_fault(
            endpoint,
            Fault {
                outage: true,
                ..Fault::default()
            },
        );
    }

    /// Makes one simulated API answer every call after `latency_ms`.
    pub fn slow_upstream(&self, endpoint: Endpoint, latency_ms: u64) {
        self.set_upstream_fault(
            endpoint,
            Fault {
                latency_ms,
                ..Fault::default()
            },
        );
    }

    pub fn set_upstream_fault(&self, endpoint: Endpoint, fault: Fault) {
        self.simulator
            .set_fault(endpoint, fault)
            .expect("a valid simulator fault");
    }

    /// Calls the simulator has received on one endpoint.
    pub fn upstream_calls(&self, endpoint: Endpoint) -> u64 {
        self.simulator.counters(endpoint).calls
    }

    pub fn product_loads(&self) -> u64 {
        self.state.store.counters().product_loads()
    }

    pub fn rate_loads(&self) -> u64 {
        self.state.store.counters().rate_loads()
    }

    /// Moves the service's clock past every fresh window (the longest is 300 s + 10 %).
    pub fn expire_fresh_windows(&self) {
        self.clock.advance(Duration::from_secs(331));
    }

    /// Stops the service and waits for it to finish draining.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let finished = tokio::time::timeout(Duration::from_secs(10), self.server)
            .await
            .expect("service stops within its drain time")
            .expect("server task did not panic");
        finished.expect("service stopped cleanly");
    }
}

/// A `kind` event about `key` at `version`, occurring now, with a fresh id.
pub fn event_for(
    kind: rebate_events::EventKind,
    key: rebate_domain::ItemKey,
    version: u64,
) -> rebate_events::InvalidationEvent {
    rebate_events::InvalidationEvent::new(
        rebate_events::EventId::generate(),
        kind,
        key.platform,
        vec![key.item_id],
        version,
        rebate_domain::Timestamp::now(),
    )
    .expect("a valid event")
}

/// Moves every instance's service clock (cache lifetimes) and ticker (quotas, breakers, the
/// shedder) with the wall clock, every millisecond, until `stop`: the harness's clocks move only
/// when a test moves them. The clocks first catch up with the wall clock, so that the instances
/// agree on the time as a fleet's hosts do.
pub fn follow_the_wall_clock(
    instances: &[TestApp],
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    use rebate_cache::Clock as _;

    let clocks: Vec<(rebate_cache::ManualClock, rebate_resilience::ManualTicker)> = instances
        .iter()
        .map(|app| (app.clock.clone(), app.ticker.clone()))
        .collect();
    for (clock, _) in &clocks {
        let behind = rebate_domain::Timestamp::now().as_millis() - clock.now().as_millis();
        clock.advance(Duration::from_millis(u64::try_from(behind).unwrap_or(0)));
    }
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        let mut moved = Duration::ZERO;
        let mut ticks = tokio::time::interval(Duration::from_millis(1));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = ticks.tick() => {}
            }
            // Whole milliseconds, the service clock's unit.
            let step = Duration::from_millis(
                u64::try_from((started.elapsed() - moved).as_millis()).unwrap_or(0),
            );
            if step.is_zero() {
                continue;
            }
            for (clock, ticker) in &clocks {
                clock.advance(step);
                ticker.advance(step);
            }
            moved += step;
        }
    })
}

/// A loopback port nobody listens on (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A throw-away redis-server on a port of the test's own, keeping nothing on disk, killed when
/// dropped (so a failing test leaks no server). Without a runnable `redis-server` the test fails,
/// naming it, under CI or not: a helper that returns a server cannot skip its caller.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
}

impl RedisServer {
    pub fn start(port: u16) -> Self {
        rebate_testkit::require_programs("a private redis-server", &["redis-server"]);
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed");
        let server = Self { child };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server did not start on port {port}");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
