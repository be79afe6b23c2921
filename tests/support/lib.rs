//! Test support: start the real [`Application`] on port 0 with its own SQLite file, the embedded
//! upstream simulator and a manual clock, and talk to it over real HTTP.
//!
//! Each test gets its own database file in its own temporary directory, so tests run in
//! parallel without sharing anything.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use query_api::{AppState, Application, Settings};
use rebate_cache::ManualClock;
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use upstream_sim::{Endpoint, SimState};

/// A running service and the handles a test needs to steer and observe it.
#[derive(Debug)]
pub struct TestApp {
    pub address: SocketAddr,
    pub base_url: String,
    pub client: reqwest::Client,
    pub clock: ManualClock,
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
    let directory = tempfile::tempdir().expect("temporary directory");
    let database_path = directory.path().join("catalogue.sqlite");
    let mut settings = Settings::defaults().expect("embedded defaults are valid");
    settings.http.listen = "127.0.0.1:0".parse().unwrap();
    settings.http.shutdown_drain_ms = 2_000;
    settings.store.sqlite.path = database_path.clone();
    settings.upstreams.simulate = true;
    customise(&mut settings);

    let clock = ManualClock::starting_now();
    let application = Application::build_with_clock(settings, Arc::new(clock.clone()))
        .await
        .expect("application builds");
    let address = application.local_addr();
    let simulator = application
        .simulator()
        .expect("the embedded simulator runs")
        .state()
        .clone();
    let state = application.state().clone();
    let shutdown = application.shutdown_token();
    let server = tokio::spawn(async move {
        application
            .run_until_stopped()
            .await
            .map_err(|error| format!("{error:#}"))
    });
    TestApp {
        address,
        base_url: format!("http://{address}"),
        client: reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("http client"),
        clock,
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

impl TestApp {
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
