//! `rebate-loadgen run --scenario <name|all> [--quick] [--out DIR] [--capacity RPS] …`
//! `rebate-loadgen chaos [--quick] [--only NAME…] [--with-rabbitmq]` (faults under load)
//! `rebate-loadgen soak [--minutes N] [--keys N]` (RSS over a million keys)

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use loadgen::report::{self, Machine, RunReport};
use loadgen::scenario::{Harness, Options, ScenarioName};
use loadgen::service;

#[derive(Debug, Parser)]
#[command(
    name = "rebate-loadgen",
    version,
    about = "Open-loop load harness for rebate-query (loopback only)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one scenario or all of them and write the report.
    Run(RunArgs),
    /// Faults under steady load on the production profile (docs/RELIABILITY.md).
    Chaos(ChaosArgs),
    /// A long run over a million distinct keys with the service's RSS sampled.
    Soak(SoakArgs),
    /// Serve the ceiling (a bare axum handler answering every request with one quote's bytes)
    /// on a loopback address for an outside generator such as `wrk`, for a bounded time.
    Ceiling(CeilingArgs),
}

#[derive(Debug, clap::Args)]
struct CeilingArgs {
    /// Loopback address to serve on (port 0: any free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
    /// URL of a quote on a running service: its body and content type are what the ceiling
    /// answers with.
    #[arg(long, value_name = "URL")]
    like: String,
    /// Worker threads of the ceiling's runtime (the service's runtime uses one per core).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Fetch the reference answer with a `POST` of this file's JSON (a batch) instead of a `GET`.
    #[arg(long, value_name = "FILE")]
    post_body: Option<PathBuf>,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 600)]
    seconds: u64,
}

#[derive(Debug, clap::Args)]
struct ChaosArgs {
    /// Short windows (about 2 minutes in all), no RabbitMQ: for CI.
    #[arg(long)]
    quick: bool,
    /// Only these phases (e.g. `--only slowloris,mysql-lock`).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    only: Vec<String>,
    /// Also stop and start the shared RabbitMQ broker (`rabbitmqctl stop_app`), last.
    #[arg(long)]
    with_rabbitmq: bool,
    /// Capacity in requests/s, instead of a closed-loop probe of the production profile.
    #[arg(long, value_name = "RPS", alias = "rate")]
    capacity: Option<f64>,
    /// Requests/s of the cold stream (keys never asked for before).
    #[arg(long, default_value_t = 50.0)]
    cold_rate: f64,
    /// Length of the steady-80 phase in seconds (default 300, 10 with --quick).
    #[arg(long, value_name = "S")]
    steady_seconds: Option<f64>,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, clap::Args)]
struct SoakArgs {
    /// Length of the measured run in minutes.
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Distinct keys to seed and ask for.
    #[arg(long, default_value_t = 1_000_000)]
    keys: u32,
    /// Requests/s (default: enough to ask for every key in 90 % of the run).
    #[arg(long, value_name = "RPS")]
    rate: Option<f64>,
    /// Share of requests that revisit a key already asked for.
    #[arg(long, default_value_t = 0.5)]
    revisit_share: f64,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, clap::Args)]
struct CommonArgs {
    /// Report directory (default target/loadgen/TIMESTAMP-COMMAND/).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The service binary (default target/release/rebate-query, built first).
    #[arg(long, value_name = "PATH")]
    service_bin: Option<PathBuf>,
    /// Do not run `cargo build --release -p query-api` before the run.
    #[arg(long)]
    no_build: bool,
    /// MariaDB server (a fresh database is created and dropped).
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306")]
    mysql_url: String,
    /// RabbitMQ for the rabbitmq phase (a private vhost is appended).
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672")]
    amqp_url: String,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[arg(long, default_value_t = 10_000)]
    max_in_flight: usize,
    #[arg(long, default_value_t = 10_000)]
    client_timeout_ms: u64,
    #[arg(long, default_value_t = 64)]
    probe_concurrency: usize,
    /// Worker threads of the generator's runtime. One here (two for `run`): the chaos suite
    /// and the soak are open loops at a fixed rate against the service, and with two workers
    /// the generator took the service's CPU in the burst (docs/RELIABILITY.md).
    #[arg(long, default_value_t = 1)]
    generator_threads: usize,
}

impl CommonArgs {
    fn out_dir(&self, command: &str) -> anyhow::Result<PathBuf> {
        let dir = self.out.clone().unwrap_or_else(|| {
            service::workspace_root()
                .join("target/loadgen")
                .join(format!(
                    "{}-{command}",
                    chrono::Utc::now().format("%Y%m%dT%H%M%SZ")
                ))
        });
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(dir)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Choice {
    All,
    HotPath,
    Burst,
    Steady,
    Mixed,
    Deferrable,
    CouponFault,
    RedisOutage,
    RetryStorm,
    ClientContract,
    Baseline,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Scenario to run, or `all` (hot-path first: it measures the capacity the rest use).
    #[arg(long, value_enum)]
    scenario: Choice,
    /// Shrink every duration about ten times (2–3 s per run), for CI.
    #[arg(long)]
    quick: bool,
    /// Report directory (default target/loadgen/TIMESTAMP/).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Capacity in requests/s to scale loads to, instead of measuring it in this run.
    #[arg(long, value_name = "RPS")]
    capacity: Option<f64>,
    /// Main duration of each open-loop run in seconds (default 30, or 3 with --quick).
    #[arg(long, value_name = "S")]
    duration: Option<f64>,
    /// The service binary (default target/release/rebate-query, built first).
    #[arg(long, value_name = "PATH")]
    service_bin: Option<PathBuf>,
    /// Do not run `cargo build --release -p query-api` before the run.
    #[arg(long)]
    no_build: bool,
    /// Most logical requests in flight; beyond it requests count as client_overflow.
    #[arg(long, default_value_t = 10_000)]
    max_in_flight: usize,
    /// Per-attempt HTTP timeout of the simulated clients, in ms.
    #[arg(long, default_value_t = 10_000)]
    client_timeout_ms: u64,
    /// Connections of the closed-loop saturation probe.
    #[arg(long, default_value_t = 64)]
    probe_concurrency: usize,
    /// Share of batch requests in the mixed scenario (0–1).
    #[arg(long, default_value_t = 0.2)]
    batch_ratio: f64,
    /// Smallest and largest batch (1–50).
    #[arg(long, default_value_t = 1)]
    batch_min: usize,
    #[arg(long, default_value_t = 50)]
    batch_max: usize,
    /// Share of single-item requests marked `x-request-class: prefetch` in burst, steady and
    /// mixed (0–1; a share of the singles, so any value fits any --batch-ratio), and the
    /// deferrable share of the deferrable scenario's mixed runs (0: its own 0.2).
    #[arg(long, default_value_t = 0.0)]
    prefetch_ratio: f64,
    /// Share of requests from App clients (`x-client-id: app-ios-N`); the rest are H5.
    #[arg(long, default_value_t = 0.7)]
    app_share: f64,
    /// Distinct client ids of each kind.
    #[arg(long, default_value_t = 1000)]
    clients: u32,
    /// Pass REBATE__RESILIENCE__SHEDDING__CAPACITY_RPS to the service (default: its config).
    #[arg(long, value_name = "RPS")]
    service_capacity_rps: Option<u32>,
    /// MariaDB server for redis-outage (a fresh database is created and dropped).
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306")]
    mysql_url: String,
    /// Seed of the key ranking and the generator's random choices.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Worker threads of the generator's runtime. Two, one per core of the 2-core machine this
    /// was sized on: a closed loop on one worker cannot use more than one core, and against
    /// the ceiling that is the limit before the ceiling is (docs/LOADGEN.md, "Threads").
    #[arg(long, default_value_t = 2)]
    generator_threads: usize,
    /// Worker threads of the ceiling server's runtime (the service's runtime uses one per core).
    #[arg(long, default_value_t = 2)]
    ceiling_threads: usize,
    /// Users of the client-contract scenario (default 5,000, or 500 with --quick).
    #[arg(long, value_name = "N")]
    users: Option<usize>,
}

fn main() -> anyhow::Result<()> {
    let args = match Cli::parse().command {
        Command::Run(args) => args,
        Command::Chaos(args) => return chaos_main(args),
        Command::Soak(args) => return soak_main(args),
        Command::Ceiling(args) => return ceiling_main(args),
    };
    anyhow::ensure!(
        [args.batch_ratio, args.prefetch_ratio, args.app_share]
            .iter()
            .all(|share| (0.0..=1.0).contains(share)),
        "--batch-ratio, --prefetch-ratio and --app-share are shares between 0 and 1"
    );
    anyhow::ensure!(
        1 <= args.batch_min && args.batch_min <= args.batch_max && args.batch_max <= 50,
        "batches hold 1 to 50 keys: need 1 ≤ --batch-min ≤ --batch-max ≤ 50"
    );
    anyhow::ensure!(args.max_in_flight > 0, "--max-in-flight must be at least 1");
    anyhow::ensure!(
        args.capacity.is_none_or(|capacity| capacity >= 1.0),
        "--capacity must be at least 1 rps"
    );
    let runtime = runtime(args.generator_threads)?;
    runtime.block_on(async {
        tokio::select! {
            result = run(args) => result,
            _ = tokio::signal::ctrl_c() => {
                // Dropping the run kills every child process it started.
                anyhow::bail!("interrupted; no report written")
            }
        }
    })
}

/// The generator's runtime: `threads` workers, named so that the report can tell their CPU
/// from the dispatcher's (this thread, which drives the run in `block_on`) and the in-process
/// ceiling's.
fn runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name(loadgen::generator::GENERATOR_WORKER_THREAD)
        .enable_all()
        .build()?)
}

fn chaos_main(args: ChaosArgs) -> anyhow::Result<()> {
    let mut only = Vec::new();
    for name in &args.only {
        let phase = loadgen::chaos::PhaseName::parse(name).with_context(|| {
            let names: Vec<&str> = loadgen::chaos::PhaseName::ALL
                .iter()
                .map(|phase| phase.as_str())
                .collect();
            format!("unknown phase {name:?}; phases: {}", names.join(", "))
        })?;
        only.push(phase);
    }
    loadgen::scenario::loopback_socket(&args.common.mysql_url)?;
    loadgen::scenario::loopback_socket(&args.common.amqp_url)?;
    let out_dir = args.common.out_dir("chaos")?;
    let binary =
        service::prepare_binary(args.common.service_bin.as_deref(), !args.common.no_build)?;
    let options = loadgen::chaos::ChaosOptions {
        quick: args.quick,
        only,
        with_rabbitmq: args.with_rabbitmq,
        out_dir: out_dir.clone(),
        service_binary: binary,
        mysql_url: args.common.mysql_url.clone(),
        amqp_url: args.common.amqp_url.clone(),
        capacity: args.capacity.filter(|capacity| *capacity >= 1.0),
        cold_rate: args.cold_rate.max(1.0),
        seed: args.common.seed,
        client_timeout: Duration::from_millis(args.common.client_timeout_ms.max(1)),
        max_in_flight: args.common.max_in_flight.max(1),
        probe_concurrency: args.common.probe_concurrency.max(1),
        steady_seconds: args.steady_seconds,
        command: command_line(),
    };
    let report = runtime(args.common.generator_threads)?.block_on(async {
        tokio::select! {
            result = loadgen::chaos::run(options) => result,
            _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted; no report written"),
        }
    })?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(loadgen::chaos::markdown(&report).as_bytes())?;
    writeln!(stdout, "\nreport: {}", out_dir.join("report.md").display())?;
    if !report.violations.is_empty() {
        anyhow::bail!("clear violations: {}", report.violations.join("; "));
    }
    Ok(())
}

fn ceiling_main(args: CeilingArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.listen.ip().is_loopback(),
        "--listen must be a loopback address (load tests stay on this machine)"
    );
    anyhow::ensure!(
        (1..=86_400).contains(&args.seconds),
        "--seconds must be between 1 and 86400"
    );
    anyhow::ensure!(
        (1..=256).contains(&args.threads),
        "--threads must be between 1 and 256"
    );
    let post_body = match &args.post_body {
        Some(path) => {
            Some(std::fs::read(path).with_context(|| format!("reading {}", path.display()))?)
        }
        None => None,
    };
    anyhow::ensure!(
        post_body.as_ref().is_none_or(|body| body.len() <= 1 << 20),
        "--post-body: at most 1 MiB"
    );
    let (body, content_type) =
        runtime(1)?.block_on(loadgen::ceiling::fetch_answer(&args.like, post_body))?;
    let ceiling = loadgen::ceiling::CeilingServer::start_on(
        args.listen,
        body.clone(),
        content_type.clone(),
        args.threads,
    )?;
    eprintln!(
        "ceiling: {} answers {} bytes of {content_type} for {} s",
        ceiling.base_url(),
        body.len(),
        args.seconds
    );
    std::thread::sleep(Duration::from_secs(args.seconds));
    Ok(())
}

fn soak_main(args: SoakArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.minutes > 0.0, "--minutes must be positive");
    anyhow::ensure!(args.keys >= 3, "--keys must be at least 3");
    anyhow::ensure!(
        (0.0..1.0).contains(&args.revisit_share),
        "--revisit-share is a share below 1"
    );
    loadgen::scenario::loopback_socket(&args.common.mysql_url)?;
    let out_dir = args.common.out_dir("soak")?;
    let binary =
        service::prepare_binary(args.common.service_bin.as_deref(), !args.common.no_build)?;
    let options = loadgen::soak::SoakOptions {
        minutes: args.minutes,
        keys: args.keys,
        rate: args.rate.filter(|rate| *rate >= 1.0),
        revisit_share: args.revisit_share,
        out_dir: out_dir.clone(),
        service_binary: binary,
        mysql_url: args.common.mysql_url.clone(),
        seed: args.common.seed,
        client_timeout: Duration::from_millis(args.common.client_timeout_ms.max(1)),
        max_in_flight: args.common.max_in_flight.max(1),
        command: command_line(),
    };
    let report = runtime(args.common.generator_threads)?.block_on(async {
        tokio::select! {
            result = loadgen::soak::run(options) => result,
            _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted; no report written"),
        }
    })?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(loadgen::soak::markdown(&report).as_bytes())?;
    writeln!(stdout, "\nreport: {}", out_dir.join("report.md").display())?;
    Ok(())
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let scenarios: Vec<ScenarioName> = match args.scenario {
        Choice::All => ScenarioName::ALL.to_vec(),
        Choice::HotPath => vec![ScenarioName::HotPath],
        Choice::Burst => vec![ScenarioName::Burst],
        Choice::Steady => vec![ScenarioName::Steady],
        Choice::Mixed => vec![ScenarioName::Mixed],
        Choice::Deferrable => vec![ScenarioName::Deferrable],
        Choice::CouponFault => vec![ScenarioName::CouponFault],
        Choice::RedisOutage => vec![ScenarioName::RedisOutage],
        Choice::RetryStorm => vec![ScenarioName::RetryStorm],
        Choice::ClientContract => vec![ScenarioName::ClientContract],
        Choice::Baseline => vec![ScenarioName::Baseline],
    };
    // Refuse a non-loopback database before anything starts.
    loadgen::scenario::loopback_socket(&args.mysql_url)?;
    let started_at = chrono::Utc::now();
    let out_dir = args.out.clone().unwrap_or_else(|| {
        service::workspace_root()
            .join("target/loadgen")
            .join(started_at.format("%Y%m%dT%H%M%SZ").to_string())
    });
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let machine = Machine::detect(args.generator_threads.max(1), args.ceiling_threads);
    let binary = service::prepare_binary(args.service_bin.as_deref(), !args.no_build)?;
    let options = Options {
        quick: args.quick,
        out_dir: out_dir.clone(),
        capacity: args.capacity,
        duration: args.duration,
        service_binary: binary.clone(),
        max_in_flight: args.max_in_flight,
        client_timeout: Duration::from_millis(args.client_timeout_ms.max(1)),
        probe_concurrency: args.probe_concurrency.max(1),
        batch_ratio: args.batch_ratio,
        batch_min: args.batch_min,
        batch_max: args.batch_max,
        prefetch_ratio: args.prefetch_ratio,
        app_share: args.app_share,
        clients_per_kind: args.clients.max(1),
        service_capacity_rps: args.service_capacity_rps,
        mysql_url: args.mysql_url.clone(),
        seed: args.seed,
        ceiling_threads: args.ceiling_threads.max(1),
        users: args.users,
    };
    let mut harness = Harness::new(options)?;
    let mut reports = Vec::new();
    for scenario in scenarios {
        reports.push(harness.run(scenario).await);
    }
    let run_report = RunReport {
        tool: "rebate-loadgen",
        version: env!("CARGO_PKG_VERSION"),
        started_at: started_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        command: command_line(),
        machine,
        quick: args.quick,
        capacity: harness.capacity().cloned(),
        service_binary: binary.display().to_string(),
        scenarios: reports,
    };
    report::write(&run_report, &out_dir)?;
    let markdown = report::markdown(&run_report);
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(markdown.as_bytes())?;
    writeln!(stdout, "\nreport: {}", out_dir.join("report.md").display())?;
    let failed: Vec<&str> = run_report
        .scenarios
        .iter()
        .filter(|scenario| scenario.status == report::ScenarioStatus::Failed)
        .map(|scenario| scenario.name.as_str())
        .collect();
    anyhow::ensure!(failed.is_empty(), "failed: {}", failed.join(", "));
    Ok(())
}

/// The command as typed, quoted for a POSIX shell where needed.
fn command_line() -> String {
    std::env::args()
        .map(|argument| {
            let plain = !argument.is_empty()
                && argument
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:@,".contains(c));
            if plain {
                argument
            } else {
                format!("'{}'", argument.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}
