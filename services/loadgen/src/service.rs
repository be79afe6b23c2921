//! The processes a run starts and talks to: the service under test (a child process of the
//! release binary, killed on drop), its admin listener and embedded simulator, and for the
//! production profile a private `redis-server` and a fresh MariaDB database.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::client::{RequestClass, Target};
use crate::procfs::CpuSource;

/// How long a started service may take to answer `/readyz` 200 (seeding the demo catalogue
/// takes ~0.3 s; the production profile builds its Bloom filter from MySQL).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a rule set may take to reach the instance that stored it (it announces it on its
/// own bus at once, and polls the store every 2 s).
const RULES_APPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Environment variables of the harness's own shell that must not leak into the child.
const SCRUBBED_PREFIXES: [&str; 1] = ["REBATE__"];
const SCRUBBED_VARS: [&str; 6] = [
    "DATABASE_URL",
    "REDIS_URL",
    "AMQP_URL",
    "RUST_LOG",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "REBATE_ADMIN_TOKEN",
];

/// A loopback port free right now (another process could take it before we bind it again; the
/// service then fails to start, which the readiness wait reports).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Env overrides of the "before" system: no cache, parts one after another, long timeouts, no
/// breakers (min_calls out of reach), no shedding, no per-client limit, no per-item limit on
/// upstream loads (the APIs' quotas stay: they are the providers' contracts).
pub fn naive_profile_env() -> Vec<(String, String)> {
    [
        ("REBATE__ENGINE__MODE", "naive"),
        ("REBATE__RESILIENCE__SHEDDING__ENABLED", "false"),
        ("REBATE__RESILIENCE__CLIENT_LIMIT__ENABLED", "false"),
        ("REBATE__TIMEOUTS__CORE_MS", "5000"),
        ("REBATE__TIMEOUTS__NORMAL_MS", "5000"),
        ("REBATE__TIMEOUTS__EDGE_MS", "5000"),
        ("REBATE__HTTP__REQUEST_DEADLINE_MS", "20000"),
        ("REBATE__HTTP__REQUEST_TIMEOUT_MS", "30000"),
        ("REBATE__RESILIENCE__BREAKER__MIN_CALLS", "1000000"),
        ("REBATE__RESILIENCE__COUPONS__HOT_ITEM_PER_SEC", "0"),
        ("REBATE__RESILIENCE__EXTRAS__HOT_ITEM_PER_SEC", "0"),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value.to_owned()))
    .collect()
}

/// Finds the service binary, building it first unless told not to.
pub fn prepare_binary(explicit: Option<&Path>, build: bool) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        if !path.is_file() {
            bail!("--service-bin {} does not exist", path.display());
        }
        return Ok(path.to_owned());
    }
    let workspace = workspace_root();
    let path = workspace.join("target/release/rebate-query");
    if build {
        eprintln!("building the service: cargo build --release -p query-api --bin rebate-query");
        let status = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
            .args([
                "build",
                "--release",
                "-p",
                "query-api",
                "--bin",
                "rebate-query",
            ])
            .current_dir(&workspace)
            .status();
        match status {
            Ok(status) if status.success() => {}
            Ok(_) | Err(_) if path.is_file() => {
                eprintln!(
                    "warning: the build failed; using the existing {}",
                    path.display()
                );
            }
            Ok(status) => bail!("building the service failed ({status})"),
            Err(error) => return Err(error).context("running cargo to build the service"),
        }
    }
    if !path.is_file() {
        bail!(
            "{} is missing: build it with `cargo build --release -p query-api`",
            path.display()
        );
    }
    Ok(path)
}

/// The workspace root: the current directory when it holds the workspace, else the one this
/// crate was compiled in.
pub fn workspace_root() -> PathBuf {
    let current = std::env::current_dir().unwrap_or_default();
    if current.join("services/loadgen").is_dir() {
        return current;
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A running `rebate-query`, killed when dropped.
#[derive(Debug)]
pub struct ServiceProcess {
    child: Child,
    pub api: Target,
    pub admin_base: String,
    pub simulator_base: String,
    token: String,
    control: reqwest::Client,
    pub log_path: PathBuf,
    /// Holds the SQLite catalogue and the child's working directory; removed on drop.
    _workdir: tempfile::TempDir,
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        // SIGKILL; the tempdir goes after it.
        let _ = self.child.start_kill();
    }
}

/// A short-timeout client for admin and simulator calls (never the load's client).
pub fn control_client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()?)
}

fn scrubbed_command(binary: &Path) -> Command {
    let mut command = Command::new(binary);
    for (key, _) in std::env::vars_os() {
        let name = key.to_string_lossy();
        if SCRUBBED_PREFIXES
            .iter()
            .any(|prefix| name.starts_with(prefix))
            || SCRUBBED_VARS.contains(&name.as_ref())
        {
            command.env_remove(&key);
        }
    }
    command
}

impl ServiceProcess {
    /// Starts the service on free loopback ports with `extra_env` on top of the harness's
    /// overrides, and waits (bounded) for `/readyz` 200.
    pub async fn start(
        binary: &Path,
        extra_env: &[(String, String)],
        log_path: &Path,
    ) -> anyhow::Result<Self> {
        let workdir = tempfile::Builder::new()
            .prefix("rebate-loadgen-")
            .tempdir()
            .context("creating the service's temp dir")?;
        let (http_port, admin_port, simulator_port) = (free_port()?, free_port()?, free_port()?);
        let token = format!("loadgen-{:032x}", rand::random::<u128>());
        let log = std::fs::File::create(log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let mut command = scrubbed_command(binary);
        command
            .current_dir(workdir.path())
            .env("REBATE__HTTP__LISTEN", format!("127.0.0.1:{http_port}"))
            .env("REBATE__ADMIN__LISTEN", format!("127.0.0.1:{admin_port}"))
            .env("REBATE__ADMIN__TOKEN", &token)
            .env(
                "REBATE__STORE__SQLITE__PATH",
                workdir.path().join("catalogue.sqlite"),
            )
            .env(
                "REBATE__UPSTREAMS__SIMULATOR_LISTEN",
                format!("127.0.0.1:{simulator_port}"),
            )
            .env("REBATE__RESILIENCE__CLIENT_LIMIT__ENABLED", "false")
            // Every simulated client connects from 127.0.0.1, standing in for a population
            // behind a load balancer: the per-address connection cap would refuse the harness.
            .env("REBATE__HTTP__MAX_CONNECTIONS_PER_PEER", "0")
            .env("REBATE__LOG__FILTER", "warn")
            .envs(extra_env.iter().map(|(key, value)| (key, value)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let cpu = child.id().map_or(CpuSource::Unmeasured, CpuSource::Process);
        let mut service = Self {
            child,
            api: Target::parse(&format!("http://127.0.0.1:{http_port}"))?.with_cpu_source(cpu),
            admin_base: format!("http://127.0.0.1:{admin_port}"),
            simulator_base: format!("http://127.0.0.1:{simulator_port}"),
            token,
            control: control_client()?,
            log_path: log_path.to_owned(),
            _workdir: workdir,
        };
        service.wait_ready().await?;
        Ok(service)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let url = format!("{}/readyz", self.admin_base);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "the service exited during start-up ({status}); last log lines:\n{}",
                    log_tail(&self.log_path)
                );
            }
            if let Ok(response) = self.control.get(&url).send().await
                && response.status().is_success()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!(
            "the service was not ready within {READY_TIMEOUT:?}; last log lines:\n{}",
            log_tail(&self.log_path)
        )
    }

    /// `GET /admin/v1/status`.
    pub async fn status(&self) -> anyhow::Result<Value> {
        let response = self
            .control
            .get(format!("{}/admin/v1/status", self.admin_base))
            .bearer_auth(&self.token)
            .send()
            .await?
            .error_for_status()?;
        Ok(response.json().await?)
    }

    /// `PUT /admin/v1/shedding`: `Some("cache_only")` pins a level, `None` releases it.
    pub async fn force_shedding(&self, level: Option<&str>) -> anyhow::Result<()> {
        self.control
            .put(format!("{}/admin/v1/shedding", self.admin_base))
            .bearer_auth(&self.token)
            .json(&serde_json::json!({ "level": level }))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// `POST /admin/v1/rules`: `document` becomes the active rule set; then waits (bounded)
    /// until this instance runs it, and returns how long that took.
    pub async fn apply_rules(&self, document: &Value, reason: &str) -> anyhow::Result<Duration> {
        let posted = Instant::now();
        let created: Value = self
            .control
            .post(format!("{}/admin/v1/rules", self.admin_base))
            .bearer_auth(&self.token)
            .json(&serde_json::json!({
                "author": "rebate-loadgen",
                "reason": reason,
                "document": document,
            }))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let version = created["version"]
            .as_u64()
            .context("POST /admin/v1/rules answered without a version")?;
        let deadline = posted + RULES_APPLY_TIMEOUT;
        loop {
            let overview: Value = self
                .control
                .get(format!("{}/admin/v1/rules", self.admin_base))
                .bearer_auth(&self.token)
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            if overview["this_instance"]["applied_version"].as_u64() == Some(version) {
                return Ok(posted.elapsed());
            }
            if Instant::now() >= deadline {
                bail!("rule set {version} was not applied within {RULES_APPLY_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `PUT /_sim/faults/{endpoint}` on the embedded simulator.
    pub async fn set_fault(&self, endpoint: &str, fault: &Value) -> anyhow::Result<()> {
        self.control
            .put(format!("{}/_sim/faults/{endpoint}", self.simulator_base))
            .json(fault)
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    pub async fn clear_faults(&self) -> anyhow::Result<()> {
        self.control
            .delete(format!("{}/_sim/faults", self.simulator_base))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// The simulator's counter `field` (`calls`, or `items`: the item ids those calls carried)
    /// over coupons and extras.
    pub async fn upstream_counter(&self, field: &str) -> anyhow::Result<u64> {
        let counters: Value = self
            .control
            .get(format!("{}/_sim/counters", self.simulator_base))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(["coupons", "extras"]
            .iter()
            .filter_map(|endpoint| counters[endpoint][field].as_u64())
            .sum())
    }

    /// Counters sampled before and after a run.
    pub async fn readings(&self) -> anyhow::Result<Readings> {
        let status = self.status().await?;
        Ok(Readings {
            upstream_calls: self.upstream_counter("calls").await?,
            upstream_items: self.upstream_counter("items").await?,
            store_loads: store_loads(&status),
            source_loads: ["product", "rate"]
                .iter()
                .filter_map(|part| status["caches"][part]["source_loads"].as_u64())
                .sum(),
            part_misses: ["product", "rate", "coupons", "extras"]
                .iter()
                .filter_map(|part| status["caches"][part]["misses"].as_u64())
                .sum(),
            shed_level: shed_level(&status),
            capacity_rps: status["protection"]["shedding_thresholds"]["capacity_rps"].as_u64(),
            shedding_enabled: status["protection"]["shedding_thresholds"]["enabled"].as_bool(),
            admission_queues: admission_queues(&status),
        })
    }

    /// One real quote: its bytes and content type (the ceiling answers with the same).
    pub async fn sample_quote(&self) -> anyhow::Result<(Vec<u8>, String)> {
        crate::ceiling::fetch_body(&format!(
            "{}/api/v1/items/jd/100002/rebate",
            self.api.base()
        ))
        .await
        .context("fetching a sample quote")
    }

    /// The child's process id (for `/proc/<pid>/status` and `/proc/<pid>/stat`).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The exit status if the service has exited (crashed: the harness never stops it before
    /// it is done with it).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// `GET /readyz`: the status code and the body (`None` when nothing answered).
    pub async fn readyz(&self) -> Option<(u16, Value)> {
        let response = self
            .control
            .get(format!("{}/readyz", self.admin_base))
            .send()
            .await
            .ok()?;
        let status = response.status().as_u16();
        Some((status, response.json().await.unwrap_or(Value::Null)))
    }

    /// `GET /metrics` (Prometheus text).
    pub async fn metrics_text(&self) -> anyhow::Result<String> {
        Ok(self
            .control
            .get(format!("{}/metrics", self.admin_base))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?)
    }

    /// `POST /admin/v1/events`: the HTTP status of the publish (202 when the bus took it).
    pub async fn publish_event(&self, event: &Value) -> anyhow::Result<u16> {
        Ok(self
            .control
            .post(format!("{}/admin/v1/events", self.admin_base))
            .bearer_auth(&self.token)
            .json(event)
            .send()
            .await?
            .status()
            .as_u16())
    }

    /// The API listener's socket address.
    pub fn api_address(&self) -> anyhow::Result<SocketAddr> {
        let url = reqwest::Url::parse(self.api.base())?;
        let port = url.port().context("the API URL has no port")?;
        Ok(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// Stops the service now.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Product + rate `loads_started`: loads of the catalogue parts from the store.
pub fn store_loads(status: &Value) -> u64 {
    ["product", "rate"]
        .iter()
        .filter_map(|part| status["caches"][part]["loads_started"].as_u64())
        .sum()
}

/// The shed level 0–3 from the status page (a name or a number).
pub fn shed_level(status: &Value) -> Option<u8> {
    let level = &status["shed_level"];
    if let Some(number) = level.as_u64() {
        return u8::try_from(number).ok();
    }
    match level.as_str()? {
        "normal" => Some(0),
        "drop_extras" => Some(1),
        "short_timeouts" => Some(2),
        "cache_only" => Some(3),
        _ => None,
    }
}

/// The shedder's view in one status sample: the level and why.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct ShedSample {
    pub level: Option<u8>,
    /// max(queue delay ÷ target, standing in-flight ÷ concurrency limit[, throughput ÷ capacity_rps]).
    pub load: Option<f64>,
    pub concurrency_limit: Option<f64>,
    pub throughput_rps: Option<f64>,
}

impl ShedSample {
    pub fn from_status(status: &Value) -> Self {
        let shedding = &status["protection"]["shedding"];
        Self {
            level: shed_level(status),
            load: shedding["load"].as_f64(),
            concurrency_limit: shedding["concurrency_limit"].as_f64(),
            throughput_rps: shedding["throughput_rps"].as_f64(),
        }
    }
}

/// Service and simulator counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Readings {
    pub upstream_calls: u64,
    /// Item ids those calls carried: items ÷ calls is the batch factor.
    pub upstream_items: u64,
    pub store_loads: u64,
    pub source_loads: u64,
    /// L1 misses over the four parts: reads that found no fresh entry (a refresh ahead of the
    /// expiry is not one).
    pub part_misses: u64,
    pub shed_level: Option<u8>,
    pub capacity_rps: Option<u64>,
    pub shedding_enabled: Option<bool>,
    /// The admission queue of each class that may wait, by [`RequestClass::index`].
    pub admission_queues: [Option<QueueReading>; RequestClass::ALL.len()],
}

/// One class's admission queue (`protection.admission_wait.classes[]` of the status page):
/// its bound, the most that waited at once since start, and its outcome counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueReading {
    pub max_waiters: u64,
    pub peak_waiting: u64,
    pub admitted: u64,
    pub timed_out: u64,
    pub refused_full: u64,
    pub cancelled: u64,
}

impl QueueReading {
    /// What happened between `self` (earlier) and `after`: the outcomes in between, and the
    /// bound and peak as `after` has them (the peak is since the service started).
    pub fn until(&self, after: &Self) -> Self {
        Self {
            max_waiters: after.max_waiters,
            peak_waiting: after.peak_waiting,
            admitted: after.admitted.saturating_sub(self.admitted),
            timed_out: after.timed_out.saturating_sub(self.timed_out),
            refused_full: after.refused_full.saturating_sub(self.refused_full),
            cancelled: after.cancelled.saturating_sub(self.cancelled),
        }
    }
}

/// The status page's admission queues by class (none when shedding is off or no class waits).
fn admission_queues(status: &Value) -> [Option<QueueReading>; RequestClass::ALL.len()] {
    let mut queues = [None; RequestClass::ALL.len()];
    let listed = status["protection"]["admission_wait"]["classes"].as_array();
    for queue in listed.into_iter().flatten() {
        let Some(class) = RequestClass::ALL
            .into_iter()
            .find(|class| queue["class"] == class.as_str())
        else {
            continue;
        };
        let count = |field: &str| queue[field].as_u64().unwrap_or(0);
        queues[class.index()] = Some(QueueReading {
            max_waiters: count("max_waiters"),
            peak_waiting: count("peak_waiting"),
            admitted: count("admitted"),
            timed_out: count("timed_out"),
            refused_full: count("refused_full"),
            cancelled: count("cancelled"),
        });
    }
    queues
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Runs `rebate-query seed` with `env` (production profile) and waits for it, bounded.
pub async fn seed(binary: &Path, env: &[(String, String)], log_path: &Path) -> anyhow::Result<()> {
    let log = std::fs::File::create(log_path)?;
    let workdir = tempfile::tempdir()?;
    let mut child = scrubbed_command(binary)
        .arg("seed")
        .current_dir(workdir.path())
        .env("REBATE__LOG__FILTER", "warn")
        .envs(env.iter().map(|(key, value)| (key, value)))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("starting rebate-query seed")?;
    let status = tokio::time::timeout(Duration::from_secs(300), child.wait())
        .await
        .context("rebate-query seed took over 300 s")??;
    if !status.success() {
        bail!(
            "rebate-query seed failed ({status}):\n{}",
            log_tail(log_path)
        );
    }
    Ok(())
}

/// A private `redis-server` on a free port, no persistence; killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
}

impl RedisServer {
    pub async fn start() -> anyhow::Result<Self> {
        let port = free_port()?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting redis-server (is it installed?)")?;
        let server = Self {
            child: Some(child),
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if ping_redis(port).await {
                return Ok(server);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("redis-server on port {port} did not answer PING within 10 s")
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// SIGKILL: the outage.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// The running server's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// SIGSTOP: the server keeps its connections open and answers nothing (a stalled host).
    pub async fn pause(&self) -> anyhow::Result<()> {
        signal(self.pid().context("redis-server is not running")?, "-STOP").await
    }

    /// SIGCONT after [`RedisServer::pause`].
    pub async fn resume(&self) -> anyhow::Result<()> {
        signal(self.pid().context("redis-server is not running")?, "-CONT").await
    }

    /// Starts a new, empty `redis-server` on the same port after [`RedisServer::kill`] and
    /// waits (bounded) for PING.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill().await;
        let port = self.port;
        let deadline = Instant::now() + Duration::from_secs(10);
        // The old socket may linger a moment; retry the start until the port is ours.
        while Instant::now() < deadline {
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .context("restarting redis-server")?;
            self.child = Some(child);
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(2) {
                if ping_redis(port).await {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            self.kill().await;
        }
        bail!("redis-server did not come back on port {port} within 10 s")
    }
}

/// `kill <flag> <pid>` for a process this harness started.
async fn signal(pid: u32, flag: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args([flag, &pid.to_string()])
        .status()
        .await
        .context("running kill")?;
    if !status.success() {
        bail!("kill {flag} {pid} failed ({status})");
    }
    Ok(())
}

async fn ping_redis(port: u16) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(b"PING\r\n").await?;
        let mut reply = [0_u8; 7];
        stream.read_exact(&mut reply).await?;
        Ok::<_, std::io::Error>(&reply == b"+PONG\r\n")
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), attempt).await,
        Ok(Ok(true))
    )
}

/// True when something accepts TCP connections at `address` within 1 s.
pub async fn reachable(address: SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(
            Duration::from_secs(1),
            tokio::net::TcpStream::connect(address)
        )
        .await,
        Ok(Ok(_))
    )
}

/// A fresh MariaDB database for one run, dropped by [`MySqlDatabase::drop_database`].
#[derive(Debug)]
pub struct MySqlDatabase {
    server_url: String,
    pub name: String,
}

impl MySqlDatabase {
    pub async fn create(server_url: &str) -> anyhow::Result<Self> {
        use sqlx::Connection;
        let name = format!(
            "rebate_loadgen_{}_{}",
            chrono::Utc::now().format("%Y%m%d%H%M%S"),
            std::process::id()
        );
        let mut connection = tokio::time::timeout(
            Duration::from_secs(5),
            sqlx::MySqlConnection::connect(server_url),
        )
        .await
        .context("connecting to MariaDB timed out")??;
        sqlx::query(&format!("CREATE DATABASE `{name}`"))
            .execute(&mut connection)
            .await?;
        connection.close().await?;
        Ok(Self {
            server_url: server_url.to_owned(),
            name,
        })
    }

    pub fn url(&self) -> String {
        format!("{}/{}", self.server_url.trim_end_matches('/'), self.name)
    }

    /// A connection to this database (for seeding extra rows and locking tables).
    pub async fn connect(&self) -> anyhow::Result<sqlx::MySqlConnection> {
        use sqlx::Connection;
        tokio::time::timeout(
            Duration::from_secs(5),
            sqlx::MySqlConnection::connect(&self.url()),
        )
        .await
        .context("connecting to the run's database timed out")?
        .context("connecting to the run's database")
    }

    /// Inserts an on-sale product and a rate for every id in `ids` on every platform, in
    /// multi-row INSERTs of 2,000 rows (run after `rebate-query seed` created the tables).
    /// Returns the rows written per table.
    pub async fn seed_items(&self, ids: std::ops::RangeInclusive<u32>) -> anyhow::Result<u64> {
        const ROWS_PER_STATEMENT: usize = 2_000;
        let mut connection = self.connect().await?;
        let now_ms = chrono::Utc::now().timestamp_millis();
        let keys: Vec<(&str, u32)> = ids
            .flat_map(|id| {
                crate::keys::PLATFORMS
                    .iter()
                    .map(move |platform| (*platform, id))
            })
            .collect();
        for chunk in keys.chunks(ROWS_PER_STATEMENT) {
            let mut products = String::with_capacity(chunk.len() * 160);
            products.push_str(
                "INSERT INTO products (platform, item_id, title, price_cents, image_url, \
                 shop_name, status, version, updated_at_ms) VALUES ",
            );
            let mut rates = String::with_capacity(chunk.len() * 48);
            rates.push_str(
                "INSERT INTO rebate_rates (platform, item_id, rate_bps, version, updated_at_ms) \
                 VALUES ",
            );
            for (index, (platform, id)) in chunk.iter().enumerate() {
                if index > 0 {
                    products.push(',');
                    rates.push(',');
                }
                let price = 1_000 + u64::from(*id % 199_000);
                let rate = 100 + id % 2_000;
                products.push_str(&format!(
                    "('{platform}','{id}','Loadgen item {id}',{price},\
                     'https://img.example.com/{platform}/{id}.jpg','Loadgen shop','on_sale',1,{now_ms})"
                ));
                rates.push_str(&format!("('{platform}','{id}',{rate},1,{now_ms})"));
            }
            sqlx::query(&products).execute(&mut connection).await?;
            sqlx::query(&rates).execute(&mut connection).await?;
        }
        use sqlx::Connection;
        connection.close().await?;
        Ok(keys.len() as u64)
    }

    pub async fn drop_database(self) -> anyhow::Result<()> {
        use sqlx::Connection;
        let mut connection = sqlx::MySqlConnection::connect(&self.server_url).await?;
        sqlx::query(&format!("DROP DATABASE IF EXISTS `{}`", self.name))
            .execute(&mut connection)
            .await?;
        connection.close().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shed_level_reads_names_and_numbers() {
        assert_eq!(
            shed_level(&serde_json::json!({"shed_level": "cache_only"})),
            Some(3)
        );
        assert_eq!(
            shed_level(&serde_json::json!({"shed_level": "normal"})),
            Some(0)
        );
        assert_eq!(shed_level(&serde_json::json!({"shed_level": 2})), Some(2));
        assert_eq!(shed_level(&serde_json::json!({})), None);
    }

    #[test]
    fn store_loads_add_product_and_rate() {
        let status = serde_json::json!({"caches": {
            "product": {"loads_started": 5}, "rate": {"loads_started": 7},
            "coupons": {"loads_started": 100}}});
        assert_eq!(store_loads(&status), 12);
    }

    #[test]
    fn naive_profile_turns_off_every_protection() {
        let env = naive_profile_env();
        let get = |key: &str| {
            env.iter()
                .find(|(name, _)| name == key)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("REBATE__ENGINE__MODE"), Some("naive"));
        assert_eq!(get("REBATE__RESILIENCE__SHEDDING__ENABLED"), Some("false"));
        assert_eq!(
            get("REBATE__RESILIENCE__BREAKER__MIN_CALLS"),
            Some("1000000")
        );
        assert_eq!(
            get("REBATE__RESILIENCE__COUPONS__HOT_ITEM_PER_SEC"),
            Some("0")
        );
        assert_eq!(
            get("REBATE__RESILIENCE__EXTRAS__HOT_ITEM_PER_SEC"),
            Some("0")
        );
    }
}
