//! `rebate-loadgen chaos`: faults injected into the production profile (MariaDB, a private
//! Redis as L2) under steady open-loop load, each phase with a baseline window, a fault window
//! and a recovery window, and per phase the figures the issue asks for: 5xx other than 503, the
//! answered share (HTTP 200 ÷ logical requests), P99 during and after the fault, the recovery
//! time, and the shed level and concurrency limit as the status page reported them every 250 ms.
//!
//! Two loads run side by side in every phase: the *main* load (Zipf over the demo catalogue,
//! mostly cache hits) at a share of the measured capacity, and a *cold* stream that sweeps a
//! range of extra items seeded into the run's database and never asked for before, so that its
//! every request misses the caches and loads from the store (the table-lock phase needs it; the
//! stalled-body target is about "ordinary cold GETs").
//!
//! Faults: Redis paused (SIGSTOP/SIGCONT) and stopped (SIGKILL, then a new server on the same
//! port); `LOCK TABLES products WRITE, rebate_rates WRITE` from a connection of the harness; the
//! coupon API slow, failing and hanging (the embedded simulator's fault API); raw-TCP attackers
//! from 127.0.0.3 ([`crate::attack`]: slowloris, stalled bodies with one and with rotating
//! `x-client-id`s, 1,000 large-header connections); a step to 150 % of capacity and back; a long
//! window at 80 %; an idle keep-alive connection timed in the background; and, opt-in because it
//! stops the shared broker, RabbitMQ stopped and started on a service using a private vhost.
//!
//! Each target is reported as met or not met with its figure. The process exits non-zero on a
//! violation: a 5xx other than 503, the service exiting, attacker connections the server never
//! closed, and a connection deadline missed by more than [`CLOSE_VIOLATION_MS`] (the target,
//! reported met or not, is [`CLOSE_MARGIN_MS`]) — a slow head, a
//! stalled body or a large head not closed within its timeout + 100 ms of its connect, the idle
//! probe not closed within the idle timeout + 100 ms of its answer (issue #40). The attackers and
//! the idle probe run on a thread of their own ([`attack::run_apart`]), so the load's runtime does
//! not make their measurements late.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::analysis::{
    LevelMoves, SecondPoint, StatusPoint, Tolerance, level_moves, limit_recovery, median_limit,
    recovery_time,
};
use crate::attack::{self, AttackOutcome, AttackSpec, AttackSummary};
use crate::client::{Attempt, LoadClient, RequestKind};
use crate::generator::{OpenLoop, RunOutput, Workload, closed_loop_probe, run_open_loop};
use crate::keys::{ItemKey, KeyPicker};
use crate::procfs::{self, CpuMeter, CpuShare};
use crate::recorder::{Phase, Recorded, StatsSummary};
use crate::report::Machine;
use crate::schedule::{Schedule, Segment};
use crate::service::{MySqlDatabase, RedisServer, ServiceProcess, reachable, seed, shed_level};

/// First id of the extra "cold" items seeded for the chaos run (every platform).
pub const COLD_FIRST_ID: u32 = 2_000_001;

/// The phases, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PhaseName {
    Steady80,
    Burst150,
    CouponSlow,
    Coupon5xx,
    CouponHang,
    RedisPause,
    RedisStop,
    MysqlLock,
    Slowloris,
    StalledBody,
    StalledBodyRotating,
    LargeHeaders,
    Rabbitmq,
}

impl Serialize for PhaseName {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl PhaseName {
    pub const ALL: [Self; 13] = [
        Self::Steady80,
        Self::Burst150,
        Self::CouponSlow,
        Self::Coupon5xx,
        Self::CouponHang,
        Self::RedisPause,
        Self::RedisStop,
        Self::MysqlLock,
        Self::Slowloris,
        Self::StalledBody,
        Self::StalledBodyRotating,
        Self::LargeHeaders,
        Self::Rabbitmq,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Steady80 => "steady-80",
            Self::Burst150 => "burst-150",
            Self::CouponSlow => "coupon-slow",
            Self::Coupon5xx => "coupon-5xx",
            Self::CouponHang => "coupon-hang",
            Self::RedisPause => "redis-pause",
            Self::RedisStop => "redis-stop",
            Self::MysqlLock => "mysql-lock",
            Self::Slowloris => "slowloris",
            Self::StalledBody => "stalled-body",
            Self::StalledBodyRotating => "stalled-body-rotating",
            Self::LargeHeaders => "large-headers",
            Self::Rabbitmq => "rabbitmq",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|phase| phase.as_str() == name)
    }

    fn fault(self) -> &'static str {
        match self {
            Self::Steady80 => "none: 80 % of capacity for the whole window",
            Self::Burst150 => {
                "the main load steps from 80 % to 150 % of capacity, then back to 80 %"
            }
            Self::CouponSlow => "coupon API: every call takes 800 ms",
            Self::Coupon5xx => "coupon API: every call answers 500",
            Self::CouponHang => "coupon API: every call hangs",
            Self::RedisPause => "redis-server SIGSTOP, SIGCONT at the end of the window",
            Self::RedisStop => {
                "redis-server SIGKILL, a new empty one on the same port at the end of the window"
            }
            Self::MysqlLock => {
                "LOCK TABLES products WRITE, rebate_rates WRITE from another connection, then UNLOCK"
            }
            Self::Slowloris => {
                "raw TCP from 127.0.0.3: a request head, then one header byte every 3 s"
            }
            Self::StalledBody => {
                "200 connections from 127.0.0.3: batch POST with content-length 1000, then 1 byte/s, one x-client-id"
            }
            Self::StalledBodyRotating => "as stalled-body, every connection its own x-client-id",
            Self::LargeHeaders => {
                "1,000 connections from 127.0.0.3, each 8–16 KiB of headers never ended, then held"
            }
            Self::Rabbitmq => "rabbitmqctl stop_app, start_app at the end of the window",
        }
    }

    /// Stops or disturbs something other runs share.
    fn disturbs_shared_services(self) -> bool {
        self == Self::Rabbitmq
    }
}

/// The command line of `chaos`.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    pub quick: bool,
    /// Phases to run; empty: all (RabbitMQ only with `with_rabbitmq`, never in quick mode).
    pub only: Vec<PhaseName>,
    pub with_rabbitmq: bool,
    pub out_dir: PathBuf,
    pub service_binary: PathBuf,
    pub mysql_url: String,
    pub amqp_url: String,
    pub capacity: Option<f64>,
    /// Rate of the cold stream, requests/s.
    pub cold_rate: f64,
    pub seed: u64,
    pub client_timeout: Duration,
    pub max_in_flight: usize,
    pub probe_concurrency: usize,
    /// Minutes of the steady-80 phase (default 5; 10 s quick).
    pub steady_seconds: Option<f64>,
    pub command: String,
}

/// Durations of the three windows of a phase.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Windows {
    pub baseline_s: f64,
    pub fault_s: f64,
    pub recovery_s: f64,
}

impl Windows {
    fn new(baseline: f64, fault: f64, recovery: f64) -> Self {
        Self {
            baseline_s: baseline,
            fault_s: fault,
            recovery_s: recovery,
        }
    }

    fn total(&self) -> f64 {
        self.baseline_s + self.fault_s + self.recovery_s
    }

    fn fault_end(&self) -> f64 {
        self.baseline_s + self.fault_s
    }

    /// The recorder's phase marks: baseline from the start, then fault, then recovery.
    fn phases(&self) -> Vec<Phase> {
        [
            ("baseline", 0.0),
            ("fault", self.baseline_s),
            ("recovery", self.fault_end()),
        ]
        .into_iter()
        .map(|(name, start_s)| Phase {
            name: name.into(),
            start: secs(start_s),
        })
        .collect()
    }
}

/// Edge timeouts in force, from what the harness passed (or the documented defaults).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct EdgeTimeouts {
    pub header_read_ms: u64,
    pub body_read_ms: u64,
    pub idle_ms: u64,
    /// Whether the binary accepted the `[http]` hardening keys (else it runs on its own
    /// defaults and the timeouts above are only what the issue specifies).
    pub keys_accepted: bool,
}

/// One target of the issue, met or not, with its figure.
#[derive(Debug, Clone, Serialize)]
pub struct TargetCheck {
    pub target: String,
    pub met: Option<bool>,
    pub figure: String,
}

fn check(target: &str, met: Option<bool>, figure: String) -> TargetCheck {
    TargetCheck {
        target: target.to_owned(),
        met,
        figure,
    }
}

/// Figures of one load (main or cold) in one phase.
#[derive(Debug, Clone, Serialize)]
pub struct LoadFigures {
    pub offered_rps: f64,
    pub baseline: StatsSummary,
    pub fault: StatsSummary,
    pub recovery: StatsSummary,
    pub non_503_5xx: u64,
    pub received_503: u64,
    /// The 503s by the `code` of their error bodies.
    pub received_503_by_code: BTreeMap<String, u64>,
    /// HTTP 200 ÷ logical requests, per window.
    pub answered_baseline: Option<f64>,
    pub answered_fault: Option<f64>,
    pub answered_recovery: Option<f64>,
    pub per_second: Vec<SecondPoint>,
    pub unfinished: u64,
    pub dispatch_lag_p99_ms: f64,
}

/// Everything one phase measured.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseResult {
    pub name: PhaseName,
    pub fault: String,
    pub windows: Windows,
    pub main: Option<LoadFigures>,
    pub cold: Option<LoadFigures>,
    /// Seconds from the end of the fault to the first of 3 seconds with the main load's P99 and
    /// answered share within [`Tolerance::DEFAULT`] of its baseline.
    pub recovery_s: Option<f64>,
    pub tolerance: Tolerance,
    pub status_timeline: Vec<StatusPoint>,
    pub level_moves: Option<LevelMoves>,
    pub attack: Option<AttackSummary>,
    pub attack_open_timeline: Vec<(f64, usize)>,
    pub figures: BTreeMap<String, Value>,
    pub targets: Vec<TargetCheck>,
    pub violations: Vec<String>,
    pub harness_cpu: Option<CpuShare>,
    pub service_cpu: Option<CpuShare>,
    pub notes: Vec<String>,
    pub wall_s: f64,
}

impl PhaseResult {
    fn new(name: PhaseName, windows: Windows) -> Self {
        Self {
            name,
            fault: name.fault().to_owned(),
            windows,
            main: None,
            cold: None,
            recovery_s: None,
            tolerance: Tolerance::DEFAULT,
            status_timeline: Vec::new(),
            level_moves: None,
            attack: None,
            attack_open_timeline: Vec::new(),
            figures: BTreeMap::new(),
            targets: Vec::new(),
            violations: Vec::new(),
            harness_cpu: None,
            service_cpu: None,
            notes: Vec::new(),
            wall_s: 0.0,
        }
    }

    fn max_level(&self, from_s: f64, to_s: f64) -> Option<u8> {
        self.status_timeline
            .iter()
            .filter(|point| point.at_s >= from_s && point.at_s < to_s)
            .filter_map(|point| point.level)
            .max()
    }
}

/// The idle keep-alive probe, run in the background through the phases.
#[derive(Debug, Clone, Serialize)]
pub struct IdleProbe {
    pub configured_idle_ms: u64,
    pub closed_after_idle_ms: Option<f64>,
    pub ending: Option<attack::Ending>,
    pub status: Option<u16>,
    pub targets: Vec<TargetCheck>,
    pub violations: Vec<String>,
}

/// The whole chaos run.
#[derive(Debug, Clone, Serialize)]
pub struct ChaosReport {
    pub tool: &'static str,
    pub started_at: String,
    pub command: String,
    pub machine: Machine,
    pub quick: bool,
    pub service_binary: String,
    pub capacity_rps: f64,
    pub capacity_source: String,
    /// The open-loop search behind `capacity_rps` (empty with `--capacity`).
    pub capacity_steps: Vec<CapacityStep>,
    pub main_rate_share: f64,
    pub cold_rate_rps: f64,
    pub service_env: Vec<(String, String)>,
    pub edge: EdgeTimeouts,
    pub shedding_thresholds: Value,
    pub phases: Vec<PhaseResult>,
    pub idle: Option<IdleProbe>,
    pub harness_cpu: Option<CpuShare>,
    pub service_cpu: Option<CpuShare>,
    pub notes: Vec<String>,
    pub violations: Vec<String>,
    pub wall_s: f64,
}

/// Share of capacity the main load runs at in the fault phases: faults should show the fault,
/// not load shedding.
const FAULT_PHASE_SHARE: f64 = 0.5;
const STATUS_EVERY: Duration = Duration::from_millis(250);
/// Loopback source addresses the ordinary load is spread over.
/// 40 × the service's 256 connections per address ≥ the default `--max-in-flight` (10,000):
/// however slow the service gets, the ordinary load never meets the per-address cap.
const LOAD_SOURCES: u8 = 40;
/// The large-header phase's RSS bound: RSS before + this.
const LARGE_HEADER_RSS_ALLOWANCE: u64 = 64 * 1024 * 1024;
/// How late past its timeout a connection the server must close may close: the service's
/// watchdog closes one at most 30 ms late (20 ms of grace for the connection's own task, a sweep
/// every 10 ms), however busy its runtime; the rest is for the wake-ups of that thread and of
/// the attack thread on two saturated cores (usually a few ms; up to ~70 ms seen on this 2-vCPU
/// machine with two busy loops beside the load). A close later than this is a deadline the
/// service did not keep: the target (issue #40's 5.1 s) is reported met or not met.
pub const CLOSE_MARGIN_MS: f64 = 100.0;

/// How late past its timeout a close fails the run (the exit code `.ci/run` gates on). Wider
/// than [`CLOSE_MARGIN_MS`] so that the gate holds on two saturated cores shared with other
/// work: the latest closes seen there were 111–186 ms past the timeout (busy loops and a second
/// benchmark beside the chaos load), against 640–1,925 ms and connections never closed before
/// the watchdog. A close later than this is a violation whatever the machine is doing.
pub const CLOSE_VIOLATION_MS: f64 = 250.0;

struct Timing {
    phase: Windows,
    mysql: Windows,
    burst: Windows,
    steady_s: f64,
    attack_baseline_s: f64,
    attack_margin_s: f64,
    attack_recovery_s: f64,
    lead_in_s: f64,
    drain: Duration,
    probe: Duration,
    /// Closed-loop warm-up of the probe before it counts: the catalogue's misses load first.
    probe_warmup: Duration,
    /// One step of the open-loop capacity search (after a lead-in of `lead_in_s`).
    search_step: Duration,
    settle: Duration,
}

impl Timing {
    fn new(quick: bool, steady_override: Option<f64>) -> Self {
        let mut timing = if quick {
            Self {
                phase: Windows::new(2.0, 2.0, 3.0),
                mysql: Windows::new(2.0, 5.0, 8.0),
                burst: Windows::new(2.0, 3.0, 5.0),
                steady_s: 8.0,
                attack_baseline_s: 2.0,
                attack_margin_s: 2.0,
                attack_recovery_s: 4.0,
                lead_in_s: 0.5,
                drain: Duration::from_secs(3),
                probe: Duration::from_secs(2),
                probe_warmup: Duration::from_secs(3),
                search_step: Duration::from_secs(2),
                settle: Duration::from_secs(6),
            }
        } else {
            Self {
                phase: Windows::new(10.0, 10.0, 20.0),
                mysql: Windows::new(10.0, 5.0, 65.0),
                burst: Windows::new(10.0, 10.0, 20.0),
                steady_s: 300.0,
                attack_baseline_s: 5.0,
                attack_margin_s: 10.0,
                attack_recovery_s: 10.0,
                lead_in_s: 1.0,
                drain: Duration::from_secs(12),
                probe: Duration::from_secs(8),
                probe_warmup: Duration::from_secs(10),
                search_step: Duration::from_secs(5),
                settle: Duration::from_secs(20),
            }
        };
        if let Some(seconds) = steady_override.filter(|seconds| *seconds > 0.0) {
            timing.steady_s = seconds;
        }
        timing
    }
}

/// One rate of the open-loop capacity search and whether the service served it.
#[derive(Debug, Clone, Serialize)]
pub struct CapacityStep {
    pub offered_rps: f64,
    pub ok_share: f64,
    /// The median latency: at a rate the service keeps up with it stays near the unloaded
    /// figure, while a queue that grows through the step lifts it with the rest.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub received_503: u64,
    /// The generator's dispatch lag: past 20 ms (`GENERATOR_LAG_MS`) the generator,
    /// not the service, was the limit and the search stops.
    pub dispatch_lag_p99_ms: f64,
    pub served: bool,
}

impl CapacityStep {
    /// A step is served when at least this share of its requests got a 2xx …
    const OK_SHARE: f64 = 0.995;
    /// … and the 99th percentile stayed under this (an open loop past capacity queues without
    /// bound: latency shows it before errors do).
    const P99_MS: f64 = 200.0;
    const SERVED_MEANS: &'static str = "≥ 99.5 % 2xx and p99 ≤ 200 ms";
    const GENERATOR_LAG_MS: f64 = 20.0;
    /// Each step up offers this much more; a refused first step is retried this much lower.
    const UP: f64 = 1.15;
    const DOWN: f64 = 0.85;
    const MAX_STEPS: usize = 10;
    /// Steps after the search that confirm its figure ([`CapacityStep::to_confirm`]).
    const MAX_CONFIRMATIONS: usize = 4;

    /// What the search does after a step. A refused step after a served one is run once more
    /// at the same rate before the search ends: on a shared machine one stall in a 5 s step
    /// (a P99 over the bound) would otherwise set the capacity a step too low, and a burst at
    /// "150 %" of it is then no overload.
    fn next(served: bool, any_served_before: bool, retried_this_rate: bool) -> SearchMove {
        match (served, any_served_before) {
            (true, _) => SearchMove::Up,
            (false, false) => SearchMove::Down,
            (false, true) if retried_this_rate => SearchMove::Stop,
            (false, true) => SearchMove::Again,
        }
    }

    /// How often `rate` was served and refused in `steps`. A refusal while the generator fell
    /// behind its schedule says nothing about the service and is not counted. A rate is
    /// compared by its exact value: every step at a rate repeats the same figure.
    fn tally(steps: &[CapacityStep], rate: f64) -> (usize, usize) {
        steps.iter().filter(|step| step.offered_rps == rate).fold(
            (0, 0),
            |(served, refused), step| {
                if step.served {
                    (served + 1, refused)
                } else if step.dispatch_lag_p99_ms > Self::GENERATOR_LAG_MS {
                    (served, refused)
                } else {
                    (served, refused + 1)
                }
            },
        )
    }

    /// The capacity a search's steps measured: the highest rate served in more of its steps
    /// than it was refused in (0 when none was).
    fn capacity_of(steps: &[CapacityStep]) -> f64 {
        steps
            .iter()
            .map(|step| step.offered_rps)
            .filter(|rate| {
                let (served, refused) = Self::tally(steps, *rate);
                served > refused
            })
            .fold(0.0, f64::max)
    }

    /// The rate the search must try before it ends, if any: a rate above the capacity its steps
    /// measured that was served as often as refused (a refusal then a served retry), for the
    /// tie's decider; else that capacity when it was tried only once; or, when every rate served
    /// lost its majority (a confirmation refused), the rate one step below the lowest tried. On
    /// a shared machine a 5 s step can be served in a lucky spell, as one can be refused in a
    /// stall (which [`CapacityStep::next`] retries): a capacity read high makes "80 %" an
    /// overload for the instance that must then serve it, one read low makes "150 %" none.
    fn to_confirm(steps: &[CapacityStep]) -> Option<f64> {
        let capacity = Self::capacity_of(steps);
        let tied = steps
            .iter()
            .map(|step| step.offered_rps)
            .filter(|rate| *rate > capacity)
            .filter(|rate| {
                let (served, refused) = Self::tally(steps, *rate);
                served > 0 && served == refused
            })
            .fold(0.0, f64::max);
        if tied > 0.0 {
            return Some(tied);
        }
        if capacity > 0.0 {
            let (served, refused) = Self::tally(steps, capacity);
            return (served + refused == 1).then_some(capacity);
        }
        if !steps.iter().any(|step| step.served) {
            return None;
        }
        let lowest = steps
            .iter()
            .map(|step| step.offered_rps)
            .fold(f64::INFINITY, f64::min);
        Some(lowest * Self::DOWN)
    }

    fn judge(offered_rps: f64, run: &RunOutput) -> Self {
        let total = &run.recorded.total;
        let ok_share = if total.logical() == 0 {
            0.0
        } else {
            total.ok_2xx() as f64 / total.logical() as f64
        };
        let p50_ms = total.quantile_ms(0.5);
        let p99_ms = total.quantile_ms(0.99);
        let served = ok_share >= Self::OK_SHARE && p99_ms.is_some_and(|p99| p99 <= Self::P99_MS);
        Self {
            offered_rps,
            ok_share,
            p50_ms,
            p99_ms,
            received_503: total.summary().received_503,
            dispatch_lag_p99_ms: run.dispatch.lag_p99_ms,
            served,
        }
    }
}

/// The capacity search's next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SearchMove {
    Up,
    Down,
    /// The same rate once more.
    Again,
    Stop,
}

/// Keys per batch request of the warm-up's pass over the whole catalogue (the API's maximum).
const WARM_BATCH: usize = 50;

/// What every phase needs.
struct Suite {
    options: ChaosOptions,
    timing: Timing,
    client: LoadClient,
    capacity: f64,
    catalogue: Arc<KeyPicker>,
    cold: Arc<KeyPicker>,
    edge: EdgeTimeouts,
    ticks_per_second: f64,
    env: Vec<(String, String)>,
}

/// The `[http]` keys being added by the hardening; passed when the binary accepts them.
fn edge_env(edge: &EdgeTimeouts) -> Vec<(String, String)> {
    [
        ("REBATE__HTTP__HEADER_READ_TIMEOUT_MS", edge.header_read_ms),
        ("REBATE__HTTP__BODY_READ_TIMEOUT_MS", edge.body_read_ms),
        ("REBATE__HTTP__IDLE_TIMEOUT_MS", edge.idle_ms),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value.to_string()))
    .collect()
}

/// Runs the suite and writes `report.json` and `report.md` into `options.out_dir`.
pub async fn run(options: ChaosOptions) -> anyhow::Result<ChaosReport> {
    let started = std::time::Instant::now();
    let started_at = chrono::Utc::now();
    let machine = Machine::detect(1, 0);
    let harness_meter = CpuMeter::start(None, procfs::clock_ticks_per_second());
    let mysql = crate::scenario::loopback_socket(&options.mysql_url)?;
    if !reachable(mysql).await {
        bail!("chaos needs MariaDB: nothing answers at {mysql}");
    }
    std::fs::create_dir_all(options.out_dir.join("logs"))?;
    let database = MySqlDatabase::create(&options.mysql_url)
        .await
        .context("creating the run's database")?;
    let result = run_with(&options, &database, started_at, machine).await;
    if let Err(error) = database.drop_database().await {
        eprintln!("warning: could not drop the run's database: {error:#}");
    }
    let mut report = result?;
    report.wall_s = started.elapsed().as_secs_f64();
    report.harness_cpu = harness_meter.read();
    crate::report::write_files(&report, &markdown(&report), &options.out_dir)?;
    Ok(report)
}

async fn run_with(
    options: &ChaosOptions,
    database: &MySqlDatabase,
    started_at: chrono::DateTime<chrono::Utc>,
    machine: Machine,
) -> anyhow::Result<ChaosReport> {
    let timing = Timing::new(options.quick, options.steady_seconds);
    let mut notes = Vec::new();
    let mut redis = RedisServer::start().await?;
    let env: Vec<(String, String)> = [
        ("REBATE__STORE__BACKEND", "mysql".to_owned()),
        ("DATABASE_URL", database.url()),
        ("REBATE__REDIS__ENABLED", "true".to_owned()),
        ("REDIS_URL", redis.url()),
        // Production: the per-client limit is on, and so is the per-address connection cap of
        // config/default.toml (ServiceProcess turns both off for the other scenarios); the load
        // is spread over LOAD_SOURCES addresses, the attackers have one.
        (
            "REBATE__RESILIENCE__CLIENT_LIMIT__ENABLED",
            "true".to_owned(),
        ),
        ("REBATE__HTTP__MAX_CONNECTIONS_PER_PEER", "256".to_owned()),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value))
    .collect();
    let logs = options.out_dir.join("logs");
    eprintln!("chaos: seeding database {}", database.name);
    seed(&options.service_binary, &env, &logs.join("chaos-seed.log")).await?;
    let cold_ids = if options.quick { 4_000 } else { 40_000 };
    let seeded_at = Instant::now();
    let rows = database
        .seed_items(COLD_FIRST_ID..=COLD_FIRST_ID + cold_ids - 1)
        .await
        .context("seeding the cold items")?;
    notes.push(format!(
        "database {}: the demo catalogue (rebate-query seed) plus {rows} cold items (ids \
         {COLD_FIRST_ID}–{} on 3 platforms) in {:.1} s",
        database.name,
        COLD_FIRST_ID + cold_ids - 1,
        seeded_at.elapsed().as_secs_f64()
    ));

    let mut edge = EdgeTimeouts {
        header_read_ms: 5_000,
        body_read_ms: 5_000,
        idle_ms: if options.quick { 10_000 } else { 60_000 },
        keys_accepted: true,
    };
    let ticks_per_second = procfs::clock_ticks_per_second();
    // Pooled connections of the load are dropped before the server's idle timeout would.
    let pool_idle = Duration::from_millis(edge.idle_ms / 2);
    // The simulated clients come from many loopback addresses (127.0.1.1–40), as real ones do:
    // the service caps connections per peer (256 by default), and a few addresses carrying the
    // whole load would hit that cap under any latency spike. Attackers use 127.0.0.3.
    let sources: Vec<std::net::IpAddr> = (1..=LOAD_SOURCES)
        .map(|last| std::net::Ipv4Addr::new(127, 0, 1, last).into())
        .collect();
    let client = LoadClient::from_sources(options.client_timeout, pool_idle, &sources)?;
    notes.push(format!(
        "the load comes from {LOAD_SOURCES} source addresses (127.0.1.1–127.0.1.{LOAD_SOURCES}), \
         chosen by client id; attackers from 127.0.0.3, the idle probe from 127.0.0.4"
    ));
    let catalogue = Arc::new(KeyPicker::catalogue(options.seed)?);
    let cold_keys: Vec<ItemKey> = crate::keys::PLATFORMS
        .iter()
        .flat_map(|platform| {
            (COLD_FIRST_ID..COLD_FIRST_ID + cold_ids)
                .map(move |item_id| ItemKey { platform, item_id })
        })
        .collect();
    let cold = Arc::new(KeyPicker::sweep(cold_keys, 0.0, options.seed)?);

    // Does the binary take the hardening keys? Start once with them; without them if refused.
    let mut service_env = env.clone();
    service_env.extend(edge_env(&edge));
    let probe_service = match ServiceProcess::start(
        &options.service_binary,
        &service_env,
        &logs.join("chaos-capacity-probe.log"),
    )
    .await
    {
        Ok(service) => service,
        Err(error) => {
            let text = format!("{error:#}");
            if !(text.contains("unknown") || text.contains("header_read_timeout")) {
                return Err(error);
            }
            edge.keys_accepted = false;
            notes.push(format!(
                "the binary refused the [http] hardening keys (header_read_timeout_ms, \
                 body_read_timeout_ms, idle_timeout_ms): started without them, so the edge runs \
                 on the binary's own behaviour; targets use the issue's values ({} / {} / {} ms)",
                edge.header_read_ms, edge.body_read_ms, edge.idle_ms
            ));
            service_env = env.clone();
            ServiceProcess::start(
                &options.service_binary,
                &service_env,
                &logs.join("chaos-capacity-probe.log"),
            )
            .await?
        }
    };

    let mut suite = Suite {
        options: options.clone(),
        timing,
        client,
        capacity: 0.0,
        catalogue,
        cold,
        edge,
        ticks_per_second,
        env: service_env.clone(),
    };
    let capacity_source;
    let mut capacity_steps = Vec::new();
    if let Some(capacity) = options.capacity {
        suite.capacity = capacity;
        capacity_source = "--capacity".to_owned();
        probe_service.stop().await;
    } else {
        let warmed = suite.warm(&probe_service).await;
        let workload = Workload::singles(suite.catalogue.clone());
        let probe = closed_loop_probe(
            &suite.client,
            &probe_service.api,
            &workload,
            options.probe_concurrency,
            suite.timing.probe_warmup,
            suite.timing.probe,
            options.seed,
        )
        .await;
        if probe.ok_rps < 1.0 {
            probe_service.stop().await;
            bail!("the capacity probe got no successful answers");
        }
        // A closed loop waits for each answer, so it offers less than an open loop can be
        // served at: it is the search's first step, not the figure.
        let steps = suite
            .search_capacity(&probe_service, &workload, probe.ok_rps)
            .await?;
        probe_service.stop().await;
        suite.capacity = CapacityStep::capacity_of(&steps);
        if suite.capacity < 1.0 {
            // Served, but never in most of a rate's tries within the confirmations: the lowest
            // rate served, rather than the closed-loop figure (which can be higher), said so.
            suite.capacity = steps
                .iter()
                .filter(|step| step.served)
                .map(|step| step.offered_rps)
                .reduce(f64::min)
                .unwrap_or(0.0);
            if suite.capacity >= 1.0 {
                notes.push(format!(
                    "no rate of the capacity search was served in most of its tries ({} steps): \
                     the capacity is the lowest rate served at all, {:.0} rps",
                    steps.len(),
                    suite.capacity
                ));
            }
        }
        capacity_source = if suite.capacity < 1.0 {
            // A machine too busy to serve even the lowest step: the closed-loop figure, said so.
            suite.capacity = probe.ok_rps;
            notes.push(format!(
                "no step of the open-loop capacity search was served ({} steps): the capacity \
                 is the closed-loop figure",
                steps.len()
            ));
            format!(
                "closed loop ×{} over the demo catalogue (Zipf) for {:.0} s after {:.0} s \
                 uncounted, on a separate instance of the same profile ({warmed}); no open-loop \
                 step was served",
                options.probe_concurrency,
                suite.timing.probe.as_secs_f64(),
                suite.timing.probe_warmup.as_secs_f64()
            )
        } else {
            format!(
                "the highest open-loop rate served ({}) in most of its tries, in a search from \
                 the closed-loop figure \
             ({:.0} 2xx/s, ×{} for {:.0} s after {:.0} s uncounted), {} steps of {:.0} s on a \
             separate instance of the same profile ({warmed})",
                CapacityStep::SERVED_MEANS,
                probe.ok_rps,
                options.probe_concurrency,
                suite.timing.probe.as_secs_f64(),
                suite.timing.probe_warmup.as_secs_f64(),
                steps.len(),
                suite.timing.search_step.as_secs_f64(),
            )
        };
        capacity_steps = steps;
    }
    eprintln!("chaos: capacity {:.0} rps", suite.capacity);

    let mut service = ServiceProcess::start(
        &options.service_binary,
        &service_env,
        &logs.join("chaos-service.log"),
    )
    .await?;
    let service_meter = CpuMeter::start(service.pid(), ticks_per_second);
    notes.push(format!("main service: {}", suite.warm(&service).await));
    notes.push(format!("main service: {}", suite.ramp_up(&service).await?));
    let thresholds = service
        .status()
        .await
        .map(|status| status["protection"]["shedding_thresholds"].clone())
        .unwrap_or(Value::Null);

    // The idle probe runs alongside everything else.
    let idle_hold = Duration::from_millis(suite.edge.idle_ms) + Duration::from_secs(15);
    let idle_spec = attack::idle_keep_alive(
        service.api_address()?,
        std::net::Ipv4Addr::new(127, 0, 0, 4).into(),
        idle_hold,
    );
    let idle_task = tokio::spawn(attack::run_apart(idle_spec));

    let selected: Vec<PhaseName> = PhaseName::ALL
        .into_iter()
        .filter(|phase| {
            if options.only.is_empty() {
                !phase.disturbs_shared_services() || options.with_rabbitmq
            } else {
                options.only.contains(phase)
            }
        })
        .filter(|phase| !(options.quick && phase.disturbs_shared_services()))
        .collect();
    let mut phases = Vec::new();
    let mut crashed = None;
    for name in selected {
        if name == PhaseName::Rabbitmq {
            // Runs on its own service (events over the broker); stop the main one first.
            continue;
        }
        let settled = suite.settle(&service).await;
        eprintln!("chaos: {} (settled in {settled:.1} s)", name.as_str());
        let started = std::time::Instant::now();
        let mut result = match suite.phase(name, &service, &mut redis, database).await {
            Ok(result) => result,
            Err(error) => {
                let mut result = PhaseResult::new(name, suite.timing.phase);
                result.notes.push(format!("the phase failed: {error:#}"));
                result
            }
        };
        result.wall_s = started.elapsed().as_secs_f64();
        result.notes.push(format!(
            "level back at 0 {settled:.1} s before the phase began"
        ));
        eprintln!("   {}", one_line(&result));
        phases.push(result);
        if let Some(status) = service.exited() {
            crashed = Some(format!(
                "the service exited during {} ({status})",
                name.as_str()
            ));
            break;
        }
    }
    let idle = match idle_task.await {
        Ok(Ok(outcome)) => Some(idle_verdict(&outcome, &suite.edge, idle_hold)),
        _ => None,
    };
    let service_cpu = service_meter.read();
    service.stop().await;

    let run_rabbit = crashed.is_none()
        && !options.quick
        && (options.with_rabbitmq || options.only.contains(&PhaseName::Rabbitmq));
    if run_rabbit {
        eprintln!("chaos: rabbitmq (a service on a private vhost)");
        let started = std::time::Instant::now();
        let mut result = match suite.rabbitmq().await {
            Ok(result) => result,
            Err(error) => {
                let mut result = PhaseResult::new(PhaseName::Rabbitmq, suite.timing.phase);
                result.notes.push(format!("the phase failed: {error:#}"));
                result
            }
        };
        result.wall_s = started.elapsed().as_secs_f64();
        eprintln!("   {}", one_line(&result));
        phases.push(result);
    } else if options.quick {
        notes.push("quick mode: rabbitmq skipped (it stops the shared broker)".into());
    } else if !options.with_rabbitmq {
        notes.push("rabbitmq not run: it stops the shared broker; pass --with-rabbitmq".into());
    }
    redis.kill().await;

    let mut violations: Vec<String> = phases
        .iter()
        .flat_map(|phase| {
            phase
                .violations
                .iter()
                .map(move |violation| format!("{}: {violation}", phase.name.as_str()))
        })
        .collect();
    if let Some(idle) = &idle {
        violations.extend(idle.violations.iter().map(|v| format!("idle: {v}")));
    }
    if let Some(crash) = crashed {
        violations.push(crash);
    }
    Ok(ChaosReport {
        tool: "rebate-loadgen chaos",
        started_at: started_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        command: options.command.clone(),
        machine,
        quick: options.quick,
        service_binary: options.service_binary.display().to_string(),
        capacity_rps: suite.capacity,
        capacity_source,
        capacity_steps,
        main_rate_share: FAULT_PHASE_SHARE,
        cold_rate_rps: options.cold_rate,
        service_env: service_env.clone(),
        edge: suite.edge,
        shedding_thresholds: thresholds,
        phases,
        idle,
        harness_cpu: None,
        service_cpu,
        notes,
        violations,
        wall_s: 0.0,
    })
}

fn idle_verdict(outcome: &AttackOutcome, edge: &EdgeTimeouts, hold: Duration) -> IdleProbe {
    let fate = outcome.fates.first().copied();
    let closed = fate.filter(|fate| {
        matches!(
            fate.ending,
            attack::Ending::ClosedByServer | attack::Ending::Reset
        )
    });
    let idle_ms = closed.and_then(|fate| fate.after_last_response_byte_ms);
    let configured = edge.idle_ms as f64;
    let mut targets = Vec::new();
    let mut violations = Vec::new();
    // Earlier is allowed: the idle timeout shrinks as the listener fills, and a full listener
    // closes its oldest idle connection for a new one.
    let met = idle_ms.map(|idle| idle <= configured + CLOSE_MARGIN_MS);
    targets.push(check(
        "an idle keep-alive connection is closed by the idle timeout + 100 ms",
        Some(met.unwrap_or(false)),
        match idle_ms {
            Some(idle) => {
                format!("closed {idle:.0} ms after the answer (idle timeout {configured:.0} ms)")
            }
            None => format!(
                "not closed by the server within {:.0} s (idle timeout {configured:.0} ms)",
                hold.as_secs_f64()
            ),
        },
    ));
    if let Some(idle) = idle_ms.filter(|idle| *idle > configured + CLOSE_VIOLATION_MS) {
        violations.push(format!(
            "the idle keep-alive connection was closed {idle:.0} ms after its answer, past the \
             idle timeout ({configured:.0} ms) + {CLOSE_VIOLATION_MS:.0} ms"
        ));
    }
    if closed.is_none() {
        violations.push(format!(
            "the idle keep-alive connection was never closed by the server ({:.0} s)",
            hold.as_secs_f64()
        ));
    }
    IdleProbe {
        configured_idle_ms: edge.idle_ms,
        closed_after_idle_ms: idle_ms,
        ending: fate.map(|fate| fate.ending),
        status: fate.and_then(|fate| fate.status),
        targets,
        violations,
    }
}

/// What a fault task does at the start and end of the fault window.
enum Fault<'a> {
    None,
    Coupons(Value),
    RedisPause(&'a RedisServer),
    RedisStop(&'a mut RedisServer),
    MysqlLock(&'a MySqlDatabase),
    Attack(AttackSpec),
}

/// What the fault task measured.
#[derive(Default)]
struct FaultOutcome {
    attack: Option<AttackOutcome>,
    figures: BTreeMap<String, Value>,
}

impl Suite {
    /// Finds the highest open-loop rate the service serves: steps of `search_step` from
    /// `start_rps` up by [`CapacityStep::UP`] while each is served, or down by
    /// [`CapacityStep::DOWN`] until one is; a step refused after a served one is tried once more
    /// before the search ends ([`CapacityStep::next`]); at most [`CapacityStep::MAX_STEPS`].
    /// Stops early when the generator falls behind its own schedule. Then the steps
    /// [`CapacityStep::to_confirm`] names are run (a tie above the figure decided, the figure
    /// confirmed when tried once), so the capacity ([`CapacityStep::capacity_of`]) is a rate
    /// served in most of its tries.
    async fn search_capacity(
        &self,
        service: &ServiceProcess,
        workload: &Workload,
        start_rps: f64,
    ) -> anyhow::Result<Vec<CapacityStep>> {
        let mut steps: Vec<CapacityStep> = Vec::new();
        let mut rate = start_rps;
        for index in 0..CapacityStep::MAX_STEPS {
            let step = self.capacity_step(service, workload, rate, index).await?;
            let (served, generator_bound) = (
                step.served,
                step.dispatch_lag_p99_ms > CapacityStep::GENERATOR_LAG_MS,
            );
            let any_served_before = steps.iter().any(|step| step.served);
            steps.push(step);
            // A generator behind its schedule cannot go higher; below, it may keep up.
            if generator_bound && (served || any_served_before) {
                eprintln!("chaos: capacity search stopped: the generator fell behind");
                break;
            }
            let retried = steps.len() >= 2 && steps[steps.len() - 2].offered_rps == rate;
            match CapacityStep::next(served, any_served_before, retried) {
                SearchMove::Up => rate *= CapacityStep::UP,
                SearchMove::Down => rate *= CapacityStep::DOWN,
                SearchMove::Again => eprintln!("chaos: capacity search: the same rate once more"),
                SearchMove::Stop => break,
            }
            // Let the queues of a step the service did not serve drain before the next.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        for index in 0..CapacityStep::MAX_CONFIRMATIONS {
            let Some(rate) = CapacityStep::to_confirm(&steps) else {
                break;
            };
            eprintln!("chaos: capacity search: confirming {rate:.0} rps");
            tokio::time::sleep(Duration::from_secs(1)).await;
            let step = self
                .capacity_step(service, workload, rate, CapacityStep::MAX_STEPS + index)
                .await?;
            steps.push(step);
        }
        Ok(steps)
    }

    /// One step of the capacity search: `rate` for `search_step` after a lead-in, from level 0.
    async fn capacity_step(
        &self,
        service: &ServiceProcess,
        workload: &Workload,
        rate: f64,
        index: usize,
    ) -> anyhow::Result<CapacityStep> {
        let lead_in = secs(self.timing.lead_in_s);
        // Each step from level 0: a step that starts on the last one's shedding measures its
        // hold, not the rate.
        self.settle(service).await;
        let plan = OpenLoop {
            schedule: Schedule::new(vec![
                Segment::constant(rate, lead_in),
                Segment::constant(rate, self.timing.search_step),
            ])?,
            measure_from: lead_in,
            phases: vec![Phase {
                name: "search".to_owned(),
                start: Duration::ZERO,
            }],
            max_in_flight: self.options.max_in_flight,
            drain_timeout: self.timing.drain,
            window: Duration::from_secs(1),
            seed: self.options.seed.wrapping_add(500 + index as u64),
        };
        let run = run_open_loop(
            &self.client,
            &service.api,
            workload,
            &plan,
            Instant::now() + Duration::from_millis(20),
        )
        .await;
        let step = CapacityStep::judge(rate, &run);
        eprintln!(
            "chaos: capacity search {rate:.0} rps: {:.2} % 2xx, p50 {:?} ms, p99 {:?} ms, {}",
            step.ok_share * 100.0,
            step.p50_ms,
            step.p99_ms,
            if step.served { "served" } else { "not served" }
        );
        Ok(step)
    }

    /// Brings a freshly started service to the phases' load the way a load balancer's slow
    /// start would: an open loop from 10 % to 80 % of capacity over `probe_warmup`, in the
    /// notes only. Its L1 fills from the catalogue's traffic, so the first phase measures the
    /// phase, not a cold start (the probe instance had the same warm-up, closed loop).
    async fn ramp_up(&self, service: &ServiceProcess) -> anyhow::Result<String> {
        let ramp = self.timing.probe_warmup;
        let plan = OpenLoop {
            schedule: Schedule::new(vec![Segment::ramp(
                self.capacity * 0.1,
                self.capacity * 0.8,
                ramp,
            )])?,
            measure_from: Duration::ZERO,
            phases: vec![Phase {
                name: "ramp-up".to_owned(),
                start: Duration::ZERO,
            }],
            max_in_flight: self.options.max_in_flight,
            drain_timeout: self.timing.drain,
            window: Duration::from_secs(1),
            seed: self.options.seed.wrapping_add(400),
        };
        let workload = Workload::singles(self.catalogue.clone());
        let run = run_open_loop(
            &self.client,
            &service.api,
            &workload,
            &plan,
            Instant::now() + Duration::from_millis(20),
        )
        .await;
        Ok(format!(
            "ramp-up: {} requests due from {:.0} to {:.0} rps over {:.0} s ({:.2} % answered \
             2xx)",
            plan.schedule.total_requests(),
            self.capacity * 0.1,
            self.capacity * 0.8,
            ramp.as_secs_f64(),
            run.recorded.total.ok_2xx() as f64 * 100.0 / run.recorded.total.logical().max(1) as f64
        ))
    }

    /// Asks for the 300 hottest catalogue keys (two passes, 16 at a time), then for the whole
    /// catalogue once in batches of [`WARM_BATCH`] (8 at a time), so that the phases start from
    /// a warm cache; returns a note.
    async fn warm(&self, service: &ServiceProcess) -> String {
        let keys = self.catalogue.hottest(300).to_vec();
        let started = Instant::now();
        // One client id per request: the per-client limit (on in production) would refuse a
        // single id asking 300 times at once.
        let singles = || {
            keys.iter()
                .enumerate()
                .map(|(index, key)| (RequestKind::Single(*key), format!("loadgen-warmup-{index}")))
        };
        self.count_answered(service, singles(), 16).await;
        let ok = self.count_answered(service, singles(), 16).await;
        // Then the whole catalogue once, in batches: the capacity search's instance has served
        // its long tail for a minute before its figure is taken, and an instance that meets the
        // phases' 80 % with the tail missing from L1 (an L2 read for each miss) is not the
        // instance that figure was measured on.
        let all = self.catalogue.hottest(self.catalogue.len());
        let batches = all.chunks(WARM_BATCH).enumerate().map(|(index, batch)| {
            (
                RequestKind::Batch(batch.to_vec()),
                format!("loadgen-warmup-batch-{index}"),
            )
        });
        let batches_ok = self.count_answered(service, batches, 8).await;
        format!(
            "warm-up: {ok} of {} hottest keys answered 200 on the second pass, then {batches_ok} \
             of {} batches of up to {WARM_BATCH} over the whole catalogue ({} keys), {:.1} s",
            keys.len(),
            all.len().div_ceil(WARM_BATCH),
            all.len(),
            started.elapsed().as_secs_f64()
        )
    }

    /// Sends `requests` (each with its client id), `concurrency` at a time; returns how many
    /// were answered 200.
    async fn count_answered(
        &self,
        service: &ServiceProcess,
        requests: impl Iterator<Item = (RequestKind, String)>,
        concurrency: usize,
    ) -> usize {
        let mut ok = 0;
        let mut tasks = JoinSet::new();
        for (request, client_id) in requests {
            while tasks.len() >= concurrency {
                if let Some(Ok(true)) = tasks.join_next().await {
                    ok += 1;
                }
            }
            let (client, target) = (self.client.clone(), service.api.clone());
            tasks.spawn(async move {
                let attempt = client.attempt(&target, &request, &client_id).await;
                matches!(attempt, Attempt::Response(response) if response.status == 200)
            });
        }
        while let Some(joined) = tasks.join_next().await {
            if let Ok(true) = joined {
                ok += 1;
            }
        }
        ok
    }

    /// Waits (bounded) for shed level 0; returns the seconds it took.
    async fn settle(&self, service: &ServiceProcess) -> f64 {
        let started = Instant::now();
        while started.elapsed() < self.timing.settle {
            match service.status().await {
                Ok(status) if shed_level(&status).unwrap_or(0) > 0 => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                _ => break,
            }
        }
        started.elapsed().as_secs_f64()
    }

    fn attack_windows(&self, timeout_ms: u64, ramp_s: f64) -> (Windows, Duration) {
        let hold = Duration::from_millis(timeout_ms)
            + Duration::from_secs_f64(self.timing.attack_margin_s);
        let fault = ramp_s + hold.as_secs_f64() + 0.5;
        (
            Windows::new(
                self.timing.attack_baseline_s,
                fault,
                self.timing.attack_recovery_s,
            ),
            hold,
        )
    }

    async fn phase(
        &self,
        name: PhaseName,
        service: &ServiceProcess,
        redis: &mut RedisServer,
        database: &MySqlDatabase,
    ) -> anyhow::Result<PhaseResult> {
        let capacity = self.capacity;
        let rate = capacity * FAULT_PHASE_SHARE;
        let address = service.api_address()?;
        let phase = self.timing.phase;
        match name {
            PhaseName::Steady80 => {
                let windows = Windows::new(self.timing.steady_s, 0.0, 0.0);
                let segments = vec![Segment::constant(capacity * 0.8, secs(windows.total()))];
                let mut result = self
                    .loaded_phase(name, service, windows, segments, Fault::None)
                    .await?;
                steady_verdict(&mut result);
                Ok(result)
            }
            PhaseName::Burst150 => {
                let windows = self.timing.burst;
                let segments = vec![
                    Segment::constant(capacity * 0.8, secs(windows.baseline_s)),
                    Segment::constant(capacity * 1.5, secs(windows.fault_s)),
                    Segment::constant(capacity * 0.8, secs(windows.recovery_s)),
                ];
                let mut result = self
                    .loaded_phase(name, service, windows, segments, Fault::None)
                    .await?;
                burst_verdict(&mut result);
                Ok(result)
            }
            PhaseName::CouponSlow | PhaseName::Coupon5xx | PhaseName::CouponHang => {
                let fault = match name {
                    PhaseName::CouponSlow => json!({"latency_ms": 800}),
                    PhaseName::Coupon5xx => json!({"error_rate": 1.0}),
                    _ => json!({"hang_rate": 1.0}),
                };
                let segments = vec![Segment::constant(rate, secs(phase.total()))];
                let mut result = self
                    .loaded_phase(
                        name,
                        service,
                        phase,
                        segments,
                        Fault::Coupons(fault.clone()),
                    )
                    .await?;
                result.figures.insert("coupon_fault".into(), fault);
                fault_verdict(&mut result);
                Ok(result)
            }
            PhaseName::RedisPause | PhaseName::RedisStop => {
                let segments = vec![Segment::constant(rate, secs(phase.total()))];
                let fault = if name == PhaseName::RedisPause {
                    Fault::RedisPause(&*redis)
                } else {
                    Fault::RedisStop(redis)
                };
                let mut result = self
                    .loaded_phase(name, service, phase, segments, fault)
                    .await?;
                fault_verdict(&mut result);
                Ok(result)
            }
            PhaseName::MysqlLock => {
                let windows = self.timing.mysql;
                let segments = vec![Segment::constant(rate, secs(windows.total()))];
                let mut result = self
                    .loaded_phase(name, service, windows, segments, Fault::MysqlLock(database))
                    .await?;
                fault_verdict(&mut result);
                mysql_verdict(&mut result);
                Ok(result)
            }
            PhaseName::Slowloris => {
                let connections = if self.options.quick { 50 } else { 200 };
                let ramp = 0.5;
                let (windows, hold) = self.attack_windows(self.edge.header_read_ms, ramp);
                let spec = attack::slowloris(
                    address,
                    connections,
                    Duration::from_secs(3),
                    secs(ramp),
                    hold,
                );
                let segments = vec![Segment::constant(rate, secs(windows.total()))];
                let mut result = self
                    .loaded_phase(name, service, windows, segments, Fault::Attack(spec))
                    .await?;
                fault_verdict(&mut result);
                attack_close_verdict(
                    &mut result,
                    "slow connections are dropped at the header timeout",
                    self.edge.header_read_ms,
                );
                Ok(result)
            }
            PhaseName::StalledBody | PhaseName::StalledBodyRotating => {
                let ramp = 0.5;
                let (windows, hold) = self.attack_windows(self.edge.body_read_ms, ramp);
                let spec = attack::stalled_body(
                    address,
                    200,
                    name == PhaseName::StalledBodyRotating,
                    Duration::from_secs(1),
                    secs(ramp),
                    hold,
                );
                let segments = vec![Segment::constant(rate, secs(windows.total()))];
                let mut result = self
                    .loaded_phase(name, service, windows, segments, Fault::Attack(spec))
                    .await?;
                fault_verdict(&mut result);
                stalled_verdict(&mut result);
                attack_close_verdict(
                    &mut result,
                    "the attacker's connections are closed by the body timeout",
                    self.edge.body_read_ms,
                );
                Ok(result)
            }
            PhaseName::LargeHeaders => {
                let ramp = 1.0;
                let (windows, hold) = self.attack_windows(self.edge.header_read_ms, ramp);
                let spec = attack::large_headers(address, 1_000, secs(ramp), hold);
                let segments = vec![Segment::constant(rate, secs(windows.total()))];
                let mut result = self
                    .loaded_phase(name, service, windows, segments, Fault::Attack(spec))
                    .await?;
                fault_verdict(&mut result);
                large_header_verdict(&mut result);
                attack_close_verdict(
                    &mut result,
                    "large-header connections are closed (431 or the header timeout)",
                    self.edge.header_read_ms,
                );
                Ok(result)
            }
            PhaseName::Rabbitmq => bail!("rabbitmq runs on its own service"),
        }
    }

    /// The main load (`segments`, Zipf over the catalogue) and the cold stream side by side,
    /// the status page sampled every 250 ms, and the fault applied at the end of the baseline
    /// window and removed at the end of the fault window.
    async fn loaded_phase(
        &self,
        name: PhaseName,
        service: &ServiceProcess,
        windows: Windows,
        segments: Vec<Segment>,
        fault: Fault<'_>,
    ) -> anyhow::Result<PhaseResult> {
        let mut result = PhaseResult::new(name, windows);
        let lead_in = secs(self.timing.lead_in_s);
        let first_rate = segments
            .first()
            .map_or(1.0, |segment| segment.from_rps.max(1.0));
        let mut main_segments = vec![Segment::constant(first_rate, lead_in)];
        main_segments.extend(segments);
        let phases = windows.phases();
        let main_plan = OpenLoop {
            schedule: Schedule::new(main_segments)?,
            measure_from: lead_in,
            phases: phases.clone(),
            max_in_flight: self.options.max_in_flight,
            drain_timeout: self.timing.drain,
            window: Duration::from_secs(1),
            seed: self.options.seed.wrapping_add(name as u64),
        };
        let cold_plan = OpenLoop {
            schedule: Schedule::new(vec![
                Segment::constant(self.options.cold_rate, lead_in),
                Segment::constant(self.options.cold_rate, secs(windows.total())),
            ])?,
            measure_from: lead_in,
            phases,
            max_in_flight: self.options.max_in_flight,
            drain_timeout: self.timing.drain,
            window: Duration::from_secs(1),
            seed: self.options.seed.wrapping_add(100 + name as u64),
        };
        let main_workload = Workload::singles(self.catalogue.clone());
        let cold_workload = Workload::singles(self.cold.clone());
        let harness_meter = CpuMeter::start(None, self.ticks_per_second);
        let service_meter = CpuMeter::start(service.pid(), self.ticks_per_second);
        let start = Instant::now() + Duration::from_millis(50);
        let measured_start = start + lead_in;
        let end = measured_start + secs(windows.total());
        let fault_at = measured_start + secs(windows.baseline_s);
        let heal_at = measured_start + secs(windows.fault_end());
        let (main, cold, timeline, fault_outcome) = tokio::join!(
            run_open_loop(
                &self.client,
                &service.api,
                &main_workload,
                &main_plan,
                start
            ),
            run_open_loop(
                &self.client,
                &service.api,
                &cold_workload,
                &cold_plan,
                start
            ),
            sample_status(service, measured_start, end, false),
            apply_fault(fault, service, fault_at, heal_at),
        );
        let fault_outcome = fault_outcome.context("the fault could not be applied")?;
        result.harness_cpu = harness_meter.read();
        result.service_cpu = service_meter.read();
        result.status_timeline = timeline.into_iter().map(|(point, _)| point).collect();
        note_unanswered_status(&mut result);
        result.figures.extend(fault_outcome.figures);
        if let Some(outcome) = fault_outcome.attack {
            result.attack = Some(outcome.summary());
            result.attack_open_timeline = outcome.open_timeline;
        }
        let main = load_figures(&main);
        let cold = load_figures(&cold);
        result.recovery_s = recovery_of(&main, &windows, &result.tolerance);
        for load in [&main, &cold] {
            if load.unfinished > 0 {
                result.notes.push(format!(
                    "{} requests still in flight at the drain bound",
                    load.unfinished
                ));
            }
        }
        if main.dispatch_lag_p99_ms > 1.0 {
            result.notes.push(format!(
                "the generator dispatched late (P99 {:.1} ms): the lag is inside the latencies",
                main.dispatch_lag_p99_ms
            ));
        }
        let non_503 = main.non_503_5xx + cold.non_503_5xx;
        if non_503 > 0 {
            result
                .violations
                .push(format!("{non_503} answers were 5xx other than 503"));
        }
        result.main = Some(main);
        result.cold = Some(cold);
        Ok(result)
    }

    /// RabbitMQ stopped and started under load, on a service of its own whose events go over
    /// the broker in a private vhost (deleted afterwards).
    async fn rabbitmq(&self) -> anyhow::Result<PhaseResult> {
        let vhost = format!("rebate-loadgen-{}", std::process::id());
        rabbitmqctl(&["add_vhost", &vhost]).await?;
        let result = self.rabbitmq_in(&vhost).await;
        // Whatever happened, the broker runs again and the vhost goes.
        let _ = rabbitmqctl(&["start_app"]).await;
        let _ = rabbitmqctl(&["delete_vhost", &vhost]).await;
        result
    }

    async fn rabbitmq_in(&self, vhost: &str) -> anyhow::Result<PhaseResult> {
        rabbitmqctl(&["set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"]).await?;
        let amqp_url = format!("{}/{vhost}", self.options.amqp_url.trim_end_matches('/'));
        let mut env = self.env.clone();
        env.push(("REBATE__EVENTS__BACKEND".into(), "amqp".into()));
        env.push(("AMQP_URL".into(), amqp_url));
        let logs = self.options.out_dir.join("logs");
        let service = ServiceProcess::start(
            &self.options.service_binary,
            &env,
            &logs.join("chaos-rabbitmq.log"),
        )
        .await?;
        self.warm(&service).await;
        let windows = self.timing.phase;
        let name = PhaseName::Rabbitmq;
        let mut result = PhaseResult::new(name, windows);
        let lead_in = secs(self.timing.lead_in_s);
        let rate = self.capacity * FAULT_PHASE_SHARE;
        let phases = windows.phases();
        let plan = OpenLoop {
            schedule: Schedule::new(vec![
                Segment::constant(rate, lead_in),
                Segment::constant(rate, secs(windows.total())),
            ])?,
            measure_from: lead_in,
            phases,
            max_in_flight: self.options.max_in_flight,
            drain_timeout: self.timing.drain,
            window: Duration::from_secs(1),
            seed: self.options.seed.wrapping_add(name as u64),
        };
        let workload = Workload::singles(self.catalogue.clone());
        let processed_before = events_processed(&service).await;
        let start = Instant::now() + Duration::from_millis(50);
        let measured_start = start + lead_in;
        let end = measured_start + secs(windows.total());
        let fault_at = measured_start + secs(windows.baseline_s);
        let heal_at = measured_start + secs(windows.fault_end());
        let harness_meter = CpuMeter::start(None, self.ticks_per_second);
        let (main, timeline, actions) = tokio::join!(
            run_open_loop(&self.client, &service.api, &workload, &plan, start),
            sample_status(&service, measured_start, end, true),
            async {
                let mut figures = BTreeMap::new();
                tokio::time::sleep_until(fault_at).await;
                rabbitmqctl(&["stop_app"]).await?;
                tokio::time::sleep(Duration::from_secs(1)).await;
                let during = service.publish_event(&rate_event(1)).await.ok();
                figures.insert("publish_status_during_outage".to_owned(), json!(during));
                tokio::time::sleep_until(heal_at).await;
                rabbitmqctl(&["start_app"]).await?;
                let restarted = Instant::now();
                // Reconnected: /readyz says events are connected again (bounded).
                let mut reconnected = None;
                while restarted.elapsed() < Duration::from_secs(60) {
                    if let Some((_, body)) = service.readyz().await
                        && body["events"] == "connected"
                    {
                        reconnected = Some(restarted.elapsed().as_secs_f64());
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                figures.insert(
                    "events_connected_after_start_app_s".to_owned(),
                    json!(reconnected),
                );
                let after = service.publish_event(&rate_event(2)).await.ok();
                figures.insert("publish_status_after_restart".to_owned(), json!(after));
                anyhow::Ok(figures)
            },
        );
        let figures = actions?;
        // The handler runs after the broker delivers: wait (bounded) for the counter to move.
        let mut processed_after = events_processed(&service).await;
        let waited = Instant::now();
        while processed_after <= processed_before && waited.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            processed_after = events_processed(&service).await;
        }
        result.harness_cpu = harness_meter.read();
        result.figures.extend(figures);
        result.figures.insert(
            "events_processed_before_after".into(),
            json!([processed_before, processed_after]),
        );
        let readyz: Vec<Value> = timeline
            .iter()
            .filter_map(|(point, ready)| {
                ready
                    .as_ref()
                    .map(|(status, body)| json!([point.at_s, status, body]))
            })
            .collect();
        // The outage shows when /readyz is not 200 or its body says events are not connected.
        let outage_samples: Vec<&(StatusPoint, Option<(u16, String)>)> = timeline
            .iter()
            .filter(|(point, _)| {
                point.at_s >= windows.baseline_s && point.at_s < windows.fault_end()
            })
            .collect();
        let shown = outage_samples
            .iter()
            .filter(|(_, ready)| match ready {
                Some((status, body)) => *status != 200 || !body.contains("events=\"connected\""),
                None => true,
            })
            .count();
        let not_200 = outage_samples
            .iter()
            .filter(|(_, ready)| !matches!(ready, Some((200, _))))
            .count();
        let outage_sample_count = outage_samples.len();
        result
            .figures
            .insert("readyz_timeline".into(), Value::Array(readyz));
        result.status_timeline = timeline.into_iter().map(|(point, _)| point).collect();
        let main = load_figures(&main);
        result.recovery_s = recovery_of(&main, &windows, &result.tolerance);
        if main.non_503_5xx > 0 {
            result.violations.push(format!(
                "{} answers were 5xx other than 503",
                main.non_503_5xx
            ));
        }
        result.main = Some(main);
        fault_verdict(&mut result);
        let resumed = match (processed_before, processed_after) {
            (Some(before), Some(after)) => Some(after > before),
            _ => None,
        };
        result.targets.push(check(
            "invalidation resumes after the broker is back",
            resumed,
            format!(
                "events processed before {processed_before:?}, after {processed_after:?}; publish after restart: {:?}",
                result.figures.get("publish_status_after_restart")
            ),
        ));
        result.targets.push(check(
            "/readyz reports the broker outage (status or body)",
            Some(shown > 0),
            format!(
                "{shown} of {} /readyz samples during the outage show it ({not_200} not 200)",
                outage_sample_count
            ),
        ));
        service.stop().await;
        Ok(result)
    }
}

fn rate_event(sequence: u64) -> Value {
    json!({
        "kind": "rate_changed",
        "platform": "jd",
        "item_ids": ["100002"],
        "version": chrono::Utc::now().timestamp_millis() as u64 * 10 + sequence,
    })
}

/// `rebate_events_total{result="processed"}` from the metrics page.
async fn events_processed(service: &ServiceProcess) -> Option<u64> {
    let text = service.metrics_text().await.ok()?;
    text.lines()
        .find(|line| line.starts_with("rebate_events_total{result=\"processed\"}"))
        .and_then(|line| line.split_whitespace().last())
        .and_then(|value| value.parse::<f64>().ok())
        .map(|value| value as u64)
}

async fn rabbitmqctl(arguments: &[&str]) -> anyhow::Result<()> {
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("rabbitmqctl")
            .args(arguments)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("rabbitmqctl took over 60 s")?
    .context("running rabbitmqctl")?;
    if !output.status.success() {
        bail!(
            "rabbitmqctl {} failed: {}",
            arguments.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// ` (overloaded 12, unavailable 3)`, or nothing without 503s.
fn by_code(codes: &BTreeMap<String, u64>) -> String {
    if codes.is_empty() {
        return String::new();
    }
    let codes: Vec<String> = codes
        .iter()
        .map(|(code, count)| format!("{code} {count}"))
        .collect();
    format!(" ({})", codes.join(", "))
}

fn secs(seconds: f64) -> Duration {
    Duration::from_secs_f64(seconds.max(0.0))
}

/// Applies `fault` at `fault_at` and removes it at `heal_at` (attacks run from `fault_at` to
/// their own bound).
async fn apply_fault(
    fault: Fault<'_>,
    service: &ServiceProcess,
    fault_at: Instant,
    heal_at: Instant,
) -> anyhow::Result<FaultOutcome> {
    let mut outcome = FaultOutcome::default();
    match fault {
        Fault::None => {}
        Fault::Coupons(fault) => {
            tokio::time::sleep_until(fault_at).await;
            service.set_fault("coupons", &fault).await?;
            tokio::time::sleep_until(heal_at).await;
            service.clear_faults().await?;
        }
        Fault::RedisPause(redis) => {
            tokio::time::sleep_until(fault_at).await;
            redis.pause().await?;
            tokio::time::sleep_until(heal_at).await;
            redis.resume().await?;
        }
        Fault::RedisStop(redis) => {
            tokio::time::sleep_until(fault_at).await;
            redis.kill().await;
            tokio::time::sleep_until(heal_at).await;
            let restarted = Instant::now();
            redis.restart().await?;
            outcome.figures.insert(
                "redis_restart_s".into(),
                json!(restarted.elapsed().as_secs_f64()),
            );
        }
        Fault::MysqlLock(database) => {
            use sqlx::Connection;
            let mut connection = database.connect().await?;
            tokio::time::sleep_until(fault_at).await;
            let locking = Instant::now();
            sqlx::query("LOCK TABLES products WRITE, rebate_rates WRITE")
                .execute(&mut connection)
                .await
                .context("LOCK TABLES")?;
            outcome.figures.insert(
                "lock_acquired_after_ms".into(),
                json!(locking.elapsed().as_secs_f64() * 1000.0),
            );
            tokio::time::sleep_until(heal_at).await;
            sqlx::query("UNLOCK TABLES")
                .execute(&mut connection)
                .await
                .context("UNLOCK TABLES")?;
            connection.close().await?;
        }
        Fault::Attack(spec) => {
            let rss_before = service.pid().and_then(procfs::rss_bytes);
            tokio::time::sleep_until(fault_at).await;
            let attack = attack::run_apart(spec)
                .await
                .context("running the attack")?;
            outcome
                .figures
                .insert("rss_before_attack_bytes".into(), json!(rss_before));
            outcome.attack = Some(attack);
        }
    }
    Ok(outcome)
}

/// The status page (and the service's RSS, and with `readyz` its `/readyz` status) every
/// 250 ms from `start` to `end`.
async fn sample_status(
    service: &ServiceProcess,
    start: Instant,
    end: Instant,
    readyz: bool,
) -> Vec<(StatusPoint, Option<(u16, String)>)> {
    let mut points = Vec::new();
    tokio::time::sleep_until(start).await;
    let mut tick = tokio::time::interval_at(start, STATUS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let bound =
        (end.saturating_duration_since(start).as_millis() / STATUS_EVERY.as_millis()) as usize + 2;
    for _ in 0..bound {
        let at = tick.tick().await;
        if at > end {
            break;
        }
        // The status page runs the readiness probe (bounded at 500 ms by the service).
        let status = tokio::time::timeout(Duration::from_millis(900), service.status())
            .await
            .ok()
            .and_then(Result::ok);
        let shedding = status
            .as_ref()
            .map(|status| status["protection"]["shedding"].clone())
            .unwrap_or(Value::Null);
        let listen_queue = status
            .as_ref()
            .map(|status| &status["connections"]["listen_queue"])
            .filter(|queue| queue.is_object());
        let point = StatusPoint {
            at_s: at.saturating_duration_since(start).as_secs_f64(),
            level: status.as_ref().and_then(shed_level),
            concurrency_limit: shedding["concurrency_limit"].as_f64(),
            in_flight: shedding["in_flight"]
                .as_f64()
                .or_else(|| shedding["peak_in_flight"].as_f64()),
            load: shedding["load"].as_f64(),
            standing_in_flight: shedding["standing_in_flight"].as_f64(),
            queue_delay_ms: shedding["queue_delay_ms"].as_f64(),
            accept_queued: listen_queue.and_then(|queue| queue["queued"].as_f64()),
            accept_wait_ms: listen_queue.and_then(|queue| queue["wait_ms"].as_f64()),
            worker_busy: shedding["worker_busy"].as_f64(),
            saturated_rps: shedding["saturated_rps"].as_f64(),
            served_rps: shedding["served_rps"].as_f64(),
            throughput_rps: shedding["throughput_rps"].as_f64(),
            mean_offered_rps: shedding["mean_offered_rps"].as_f64(),
            rss_bytes: service.pid().and_then(procfs::rss_bytes),
            redis_breaker: status
                .as_ref()
                .and_then(|status| breaker_of(status, "redis")),
            mysql_breaker: status
                .as_ref()
                .and_then(|status| breaker_of(status, "mysql")),
        };
        let ready = if readyz {
            tokio::time::timeout(Duration::from_millis(900), service.readyz())
                .await
                .ok()
                .flatten()
                .map(|(status, body)| {
                    (
                        status,
                        format!("events={} degraded={}", body["events"], body["degraded"]),
                    )
                })
        } else {
            None
        };
        points.push((point, ready));
    }
    points
}

/// The state of dependency `name`'s breaker on the status page.
fn breaker_of(status: &Value, name: &str) -> Option<&'static str> {
    status["protection"]["dependencies"]
        .as_array()?
        .iter()
        .find(|dependency| dependency["name"] == name)
        .and_then(|dependency| dependency["breaker"]["state"].as_str())
        .and_then(crate::analysis::breaker_state)
}

/// Status samples without an answer within 400 ms (the admin listener or the status handler
/// stuck): counted, and the window of them noted.
fn note_unanswered_status(result: &mut PhaseResult) {
    let missing: Vec<f64> = result
        .status_timeline
        .iter()
        .filter(|point| point.level.is_none())
        .map(|point| point.at_s)
        .collect();
    result
        .figures
        .insert("status_samples_unanswered".into(), json!(missing.len()));
    if let (Some(first), Some(last)) = (missing.first(), missing.last()) {
        result.notes.push(format!(
            "{} of {} status samples got no answer within 900 ms (between {first:.2} s and {last:.2} s)",
            missing.len(),
            result.status_timeline.len()
        ));
    }
}

fn answered(summary: &StatsSummary) -> Option<f64> {
    (summary.logical_requests > 0).then(|| {
        summary.by_status.get("200").copied().unwrap_or(0) as f64 / summary.logical_requests as f64
    })
}

fn load_figures(output: &RunOutput) -> LoadFigures {
    let recorded: &Recorded = &output.recorded;
    let phase = |name: &str| {
        recorded
            .phases
            .iter()
            .find(|(phase, _)| phase.name == name)
            .map(|(_, stats)| stats.summary())
            .unwrap_or_else(|| crate::recorder::Stats::default().summary())
    };
    let (baseline, fault, recovery) = (phase("baseline"), phase("fault"), phase("recovery"));
    let total = recorded.total.summary();
    let per_second = recorded
        .windows
        .iter()
        .enumerate()
        .map(|(index, stats)| {
            let summary = stats.summary();
            SecondPoint {
                at_s: index as f64,
                requests: summary.logical_requests,
                answered_share: answered(&summary),
                p99_ms: summary.p99_ms,
            }
        })
        .collect();
    LoadFigures {
        offered_rps: output.offered_rps,
        answered_baseline: answered(&baseline),
        answered_fault: answered(&fault),
        answered_recovery: answered(&recovery),
        non_503_5xx: total.server_errors_non_503,
        received_503: total.received_503,
        received_503_by_code: total.received_503_by_code.clone(),
        baseline,
        fault,
        recovery,
        per_second,
        unfinished: output.unfinished,
        dispatch_lag_p99_ms: output.dispatch.lag_p99_ms,
    }
}

fn recovery_of(main: &LoadFigures, windows: &Windows, tolerance: &Tolerance) -> Option<f64> {
    if windows.fault_s <= 0.0 {
        return None;
    }
    recovery_time(
        &main.per_second,
        windows.fault_end(),
        main.baseline.p99_ms?,
        main.answered_baseline?,
        tolerance,
    )
}

/// Targets every fault phase reports: no 5xx other than 503, recovery within the window.
fn fault_verdict(result: &mut PhaseResult) {
    let non_503: u64 = [&result.main, &result.cold]
        .iter()
        .filter_map(|load| load.as_ref().map(|load| load.non_503_5xx))
        .sum();
    result.targets.push(check(
        "no 5xx other than 503",
        Some(non_503 == 0),
        format!("{non_503} non-503 5xx (main + cold, all windows)"),
    ));
    let windows = result.windows;
    result.targets.push(check(
        "recovered within the recovery window",
        Some(result.recovery_s.is_some()),
        match result.recovery_s {
            Some(seconds) => format!("{seconds:.0} s after the fault was removed"),
            None => format!("not within {:.0} s", windows.recovery_s),
        },
    ));
    let level = result.max_level(windows.baseline_s, windows.fault_end());
    result
        .figures
        .insert("max_level_during_fault".into(), json!(level));
}

fn steady_verdict(result: &mut PhaseResult) {
    let levels: Vec<u8> = result
        .status_timeline
        .iter()
        .filter_map(|point| point.level)
        .collect();
    let max_level = levels.iter().max().copied();
    let at_zero = levels.iter().filter(|level| **level == 0).count();
    result.targets.push(check(
        "level 0 throughout",
        Some(max_level == Some(0)),
        format!(
            "max level {max_level:?}; {at_zero} of {} samples at 0",
            levels.len()
        ),
    ));
    let received_503: u64 = [&result.main, &result.cold]
        .iter()
        .filter_map(|load| load.as_ref().map(|load| load.received_503))
        .sum();
    result.targets.push(check(
        "zero 503s",
        Some(received_503 == 0),
        format!("{received_503} attempts answered 503 (main + cold)"),
    ));
    let non_503: u64 = [&result.main, &result.cold]
        .iter()
        .filter_map(|load| load.as_ref().map(|load| load.non_503_5xx))
        .sum();
    result.targets.push(check(
        "no 5xx other than 503",
        Some(non_503 == 0),
        format!("{non_503} non-503 5xx"),
    ));
}

fn burst_verdict(result: &mut PhaseResult) {
    let windows = result.windows;
    let moves = level_moves(
        &result.status_timeline,
        windows.baseline_s,
        windows.fault_end(),
    );
    result.targets.push(check(
        "level 0 at 80 % before the burst",
        Some(moves.max_before == Some(0)),
        format!("max level before: {:?}", moves.max_before),
    ));
    result.targets.push(check(
        "level 3 within 1 s at 150 %",
        Some(moves.to_level_3_s.is_some_and(|seconds| seconds <= 1.0)),
        match moves.to_level_3_s {
            Some(seconds) => format!("level 3 after {seconds:.2} s"),
            None => format!(
                "level 3 never sampled; max level during the burst {:?}",
                result.max_level(windows.baseline_s, windows.fault_end())
            ),
        },
    ));
    result.targets.push(check(
        "back to level 0 within 5 s after the load drops",
        Some(moves.to_level_0_s.is_some_and(|seconds| seconds <= 5.0)),
        match moves.to_level_0_s {
            Some(seconds) => format!("level 0 (and staying) {seconds:.2} s after the drop"),
            None => format!(
                "not back at 0 and staying within {:.0} s",
                windows.recovery_s
            ),
        },
    ));
    result.targets.push(check(
        "no flapping",
        Some(moves.rises_after_a_fall == 0),
        format!(
            "{} level changes from the burst on, {} rises after a fall",
            moves.changes, moves.rises_after_a_fall
        ),
    ));
    let non_503 = result.main.as_ref().map_or(0, |main| main.non_503_5xx)
        + result.cold.as_ref().map_or(0, |cold| cold.non_503_5xx);
    result.targets.push(check(
        "no 5xx other than 503",
        Some(non_503 == 0),
        format!("{non_503} non-503 5xx"),
    ));
    if let Some(main) = &result.main {
        result.figures.insert(
            "admitted_p99_ms_during_burst".into(),
            json!(main.fault.admitted_p99_ms),
        );
    }
    result.level_moves = Some(moves);
}

fn mysql_verdict(result: &mut PhaseResult) {
    let windows = result.windows;
    let before = median_limit(&result.status_timeline, 0.0, windows.baseline_s);
    let lowest = result
        .status_timeline
        .iter()
        .filter(|point| point.at_s >= windows.baseline_s)
        .filter_map(|point| point.concurrency_limit)
        .min_by(f64::total_cmp);
    let back = before.and_then(|before| {
        limit_recovery(
            &result.status_timeline,
            windows.fault_end(),
            before,
            0.2,
            3.0,
        )
    });
    result
        .figures
        .insert("concurrency_limit_before".into(), json!(before));
    result
        .figures
        .insert("concurrency_limit_lowest".into(), json!(lowest));
    result.targets.push(check(
        "concurrency limit back within 20 % of its pre-incident value within 60 s",
        before.map(|_| back.is_some_and(|seconds| seconds <= 60.0)),
        match (before, back) {
            (None, _) => "the status page reported no concurrency_limit".to_owned(),
            (Some(before), Some(seconds)) => format!(
                "before {before:.0}, lowest {}, within ±20 % (held 3 s) {seconds:.1} s after UNLOCK",
                lowest.map_or("–".into(), |l| format!("{l:.0}"))
            ),
            (Some(before), None) => format!(
                "before {before:.0}, lowest {}; not back within ±20 % in the {:.0} s window",
                lowest.map_or("–".into(), |l| format!("{l:.0}")),
                windows.recovery_s
            ),
        },
    ));
    if let Some(cold) = &result.cold {
        result.figures.insert(
            "cold_answered_during_lock".into(),
            json!(cold.answered_fault),
        );
        result
            .figures
            .insert("cold_p99_ms_during_lock".into(), json!(cold.fault.p99_ms));
    }
}

fn stalled_verdict(result: &mut PhaseResult) {
    let windows = result.windows;
    let (success, logical) = result.cold.as_ref().map_or((None, 0), |cold| {
        (cold.fault.http_success_rate, cold.fault.logical_requests)
    });
    result.targets.push(check(
        "ordinary cold GETs keep ≥ 99 % success",
        success.map(|rate| rate >= 0.99),
        format!(
            "{} HTTP 2xx of {logical} cold GETs during the attack",
            success.map_or("–".into(), |rate| format!("{:.2} %", rate * 100.0))
        ),
    ));
    let level = result.max_level(windows.baseline_s, windows.fault_end());
    result.targets.push(check(
        "level stays < 3",
        level.map(|level| level < 3),
        format!("max level during the attack {level:?}"),
    ));
}

fn large_header_verdict(result: &mut PhaseResult) {
    let windows = result.windows;
    let before = result
        .figures
        .get("rss_before_attack_bytes")
        .and_then(Value::as_u64);
    let during = result
        .status_timeline
        .iter()
        .filter(|point| point.at_s >= windows.baseline_s && point.at_s < windows.fault_end())
        .filter_map(|point| point.rss_bytes)
        .max();
    let after = result
        .status_timeline
        .iter()
        .rev()
        .find_map(|point| point.rss_bytes);
    result
        .figures
        .insert("rss_max_during_bytes".into(), json!(during));
    result
        .figures
        .insert("rss_after_bytes".into(), json!(after));
    let bound = before.map(|before| before + LARGE_HEADER_RSS_ALLOWANCE);
    result.targets.push(check(
        "1,000 large-header connections keep RSS under RSS before + 64 MiB",
        match (during, bound) {
            (Some(during), Some(bound)) => Some(during <= bound),
            _ => None,
        },
        format!(
            "RSS before {} MiB, max during {} MiB, after {} MiB",
            mib(before),
            mib(during),
            mib(after)
        ),
    ));
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("–".into(), |bytes| {
        format!("{:.1}", bytes as f64 / 1048576.0)
    })
}

/// The attack's connections: all ended by the server within the timeout + [`CLOSE_MARGIN_MS`]
/// of their connect (a violation if not).
fn attack_close_verdict(result: &mut PhaseResult, target: &str, timeout_ms: u64) {
    let Some(summary) = result.attack.clone() else {
        return;
    };
    let ended = summary.closed_by_server + summary.reset;
    let established = summary.connections - summary.connect_failed;
    let latest = summary.lifetime_max_ms;
    let close_by = timeout_ms as f64 + CLOSE_MARGIN_MS;
    let on_time = latest.is_some_and(|latest| latest <= close_by);
    result.targets.push(check(
        target,
        Some(summary.still_open_at_bound == 0 && on_time),
        format!(
            "{ended} of {established} connections ended by the server (P50 {} ms, max {} ms; \
             timeout {timeout_ms} ms), {} still open at the bound, {} never connected; \
             answers {:?}",
            summary
                .lifetime_p50_ms
                .map_or("–".into(), |v| format!("{v:.0}")),
            latest.map_or("–".into(), |v| format!("{v:.0}")),
            summary.still_open_at_bound,
            summary.connect_failed,
            summary.statuses
        ),
    ));
    if summary.still_open_at_bound > 0 {
        result.violations.push(format!(
            "{} attacker connections were never closed by the server",
            summary.still_open_at_bound
        ));
    }
    if let Some(late) = latest.filter(|latest| *latest > timeout_ms as f64 + CLOSE_VIOLATION_MS) {
        result.violations.push(format!(
            "attacker connections closed up to {late:.0} ms after their connect, past the \
             timeout ({timeout_ms} ms) + {CLOSE_VIOLATION_MS:.0} ms"
        ));
    }
}

fn one_line(result: &PhaseResult) -> String {
    let met = result
        .targets
        .iter()
        .filter(|t| t.met == Some(true))
        .count();
    let main = result.main.as_ref();
    format!(
        "answered {} during, P99 {} / {} / {} ms (base/during/after), recovery {}, targets met {met}/{}, violations {}",
        pct(main.and_then(|m| m.answered_fault.or(m.answered_baseline))),
        num(main.and_then(|m| m.baseline.p99_ms)),
        num(main.and_then(|m| m.fault.p99_ms)),
        num(main.and_then(|m| m.recovery.p99_ms)),
        result
            .recovery_s
            .map_or("–".into(), |seconds| format!("{seconds:.0} s")),
        result.targets.len(),
        result.violations.len()
    )
}

fn pct(value: Option<f64>) -> String {
    value.map_or("–".into(), |value| format!("{:.2} %", value * 100.0))
}

fn num(value: Option<f64>) -> String {
    value.map_or("–".into(), |value| format!("{value:.1}"))
}

fn met(value: Option<bool>) -> &'static str {
    match value {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "no figure",
    }
}

/// The report as Markdown.
pub fn markdown(report: &ChaosReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# rebate-loadgen chaos{}\n",
        if report.quick { " (quick)" } else { "" }
    );
    let _ = writeln!(
        out,
        "- started: {}; wall time {:.0} s",
        report.started_at, report.wall_s
    );
    let _ = writeln!(out, "- command: `{}`", report.command);
    let _ = writeln!(
        out,
        "- machine: {} cores, {}, {}, load average at start {}",
        report.machine.nproc,
        report.machine.cpu_model,
        report.machine.os,
        report.machine.loadavg_at_start
    );
    let _ = writeln!(out, "- binary: {}", report.service_binary);
    let _ = writeln!(
        out,
        "- capacity: {:.0} rps ({}); fault phases at {:.0} % of it, plus a cold stream of {:.0} rps",
        report.capacity_rps,
        report.capacity_source,
        report.main_rate_share * 100.0,
        report.cold_rate_rps
    );
    if !report.capacity_steps.is_empty() {
        let steps: Vec<String> = report
            .capacity_steps
            .iter()
            .map(|step| {
                format!(
                    "{:.0} rps → {:.2} % 2xx, p50 {} ms, p99 {} ms{}",
                    step.offered_rps,
                    step.ok_share * 100.0,
                    step.p50_ms
                        .map_or("–".to_owned(), |p50| format!("{p50:.1}")),
                    step.p99_ms
                        .map_or("–".to_owned(), |p99| format!("{p99:.0}")),
                    if step.served { "" } else { " (not served)" }
                )
            })
            .collect();
        let _ = writeln!(out, "- capacity search: {}", steps.join("; "));
    }
    let _ = writeln!(
        out,
        "- edge timeouts: header {} ms, body {} ms, idle {} ms ({})",
        report.edge.header_read_ms,
        report.edge.body_read_ms,
        report.edge.idle_ms,
        if report.edge.keys_accepted {
            "passed to the service"
        } else {
            "NOT accepted by this binary: targets only"
        }
    );
    if let Some(cpu) = report.harness_cpu {
        let _ = writeln!(
            out,
            "- harness CPU: {:.1} s over {:.0} s = {:.2} cores ({:.0} % of the machine)",
            cpu.cpu_seconds,
            cpu.wall_seconds,
            cpu.cores,
            cpu.machine_share * 100.0
        );
    }
    if let Some(cpu) = report.service_cpu {
        let _ = writeln!(
            out,
            "- service CPU (main instance): {:.2} cores ({:.0} % of the machine)",
            cpu.cores,
            cpu.machine_share * 100.0
        );
    }
    let _ = writeln!(
        out,
        "- shedding thresholds: `{}`",
        report.shedding_thresholds
    );
    for note in &report.notes {
        let _ = writeln!(out, "- {note}");
    }
    let _ = writeln!(
        out,
        "\n**Violations (exit code):** {}\n",
        if report.violations.is_empty() {
            "none".to_owned()
        } else {
            report.violations.join("; ")
        }
    );
    out.push_str("| phase | main rps | 5xx ≠ 503 | answered base / during / after | P99 ms base / during / after | cold answered during | recovery s | max level during | harness CPU | targets met |\n");
    out.push_str("| --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
    for phase in &report.phases {
        let main = phase.main.as_ref();
        let cold = phase.cold.as_ref();
        let non_503 = main.map_or(0, |m| m.non_503_5xx) + cold.map_or(0, |c| c.non_503_5xx);
        let met_count = phase.targets.iter().filter(|t| t.met == Some(true)).count();
        let _ = writeln!(
            out,
            "| {} | {} | {non_503} | {} / {} / {} | {} / {} / {} | {} | {} | {} | {} | {met_count}/{} |",
            phase.name.as_str(),
            main.map_or("–".into(), |m| format!("{:.0}", m.offered_rps)),
            pct(main.and_then(|m| m.answered_baseline)),
            pct(main.and_then(|m| m.answered_fault)),
            pct(main.and_then(|m| m.answered_recovery)),
            num(main.and_then(|m| m.baseline.p99_ms)),
            num(main.and_then(|m| m.fault.p99_ms)),
            num(main.and_then(|m| m.recovery.p99_ms)),
            pct(cold.and_then(|c| c.answered_fault)),
            phase.recovery_s.map_or("–".into(), |s| format!("{s:.0}")),
            phase_max_level(phase).map_or("–".into(), |l| l.to_string()),
            phase.harness_cpu.map_or("–".into(), |cpu| format!(
                "{:.0} %",
                cpu.machine_share * 100.0
            )),
            phase.targets.len()
        );
    }
    out.push_str(
        "\n*answered* = HTTP 200 ÷ logical requests (well-behaved clients, ≤ 2 retries of 429/503); \
         P99 from the scheduled time; *recovery* = seconds from the fault's removal to the first \
         of 3 consecutive seconds with P99 ≤ max(2 × baseline, baseline + 10 ms) and answered \
         share ≥ baseline − 1 point; *max level* over the fault window (steady: the whole run).\n",
    );
    if let Some(idle) = &report.idle {
        let _ = writeln!(out, "\n## idle keep-alive\n");
        for target in &idle.targets {
            let _ = writeln!(
                out,
                "- {} — **{}**: {}",
                target.target,
                met(target.met),
                target.figure
            );
        }
    }
    for phase in &report.phases {
        let _ = writeln!(out, "\n## {}\n", phase.name.as_str());
        let _ = writeln!(
            out,
            "Fault: {}. Windows: baseline {:.0} s, fault {:.1} s, recovery {:.0} s; wall {:.0} s.\n",
            phase.fault,
            phase.windows.baseline_s,
            phase.windows.fault_s,
            phase.windows.recovery_s,
            phase.wall_s
        );
        for target in &phase.targets {
            let _ = writeln!(
                out,
                "- {} — **{}**: {}",
                target.target,
                met(target.met),
                target.figure
            );
        }
        for (label, load) in [("main", &phase.main), ("cold", &phase.cold)] {
            if let Some(load) = load {
                let _ = writeln!(
                    out,
                    "- {label} load {:.0} rps: answered {} / {} / {}, P99 {} / {} / {} ms, admitted P99 during {} ms, 503 {}{}, 5xx ≠ 503 {}, business ok during {}",
                    load.offered_rps,
                    pct(load.answered_baseline),
                    pct(load.answered_fault),
                    pct(load.answered_recovery),
                    num(load.baseline.p99_ms),
                    num(load.fault.p99_ms),
                    num(load.recovery.p99_ms),
                    num(load.fault.admitted_p99_ms),
                    load.received_503,
                    by_code(&load.received_503_by_code),
                    load.non_503_5xx,
                    pct(load.fault.business_success_rate),
                );
            }
        }
        if !phase.figures.is_empty() {
            let figures: Vec<String> = phase
                .figures
                .iter()
                .filter(|(key, _)| key.as_str() != "readyz_timeline")
                .map(|(key, value)| format!("{key} = {value}"))
                .collect();
            let _ = writeln!(out, "- figures: {}", figures.join(", "));
        }
        let _ = writeln!(
            out,
            "- shed level / concurrency limit timeline (every 1 s): {}",
            timeline_text(&phase.status_timeline)
        );
        if let Some(cpu) = phase.harness_cpu {
            let _ = writeln!(
                out,
                "- harness CPU {:.2} cores, service CPU {}",
                cpu.cores,
                phase
                    .service_cpu
                    .map_or("–".into(), |cpu| format!("{:.2} cores", cpu.cores))
            );
        }
        for note in &phase.notes {
            let _ = writeln!(out, "- {note}");
        }
    }
    out
}

/// The highest level over the fault window (a phase without one: the whole run).
fn phase_max_level(phase: &PhaseResult) -> Option<u8> {
    let windows = phase.windows;
    if windows.fault_s > 0.0 {
        phase.max_level(windows.baseline_s, windows.fault_end())
    } else {
        phase.max_level(0.0, windows.total() + 1.0)
    }
}

/// `t:level/limit` once a second.
fn timeline_text(points: &[StatusPoint]) -> String {
    let mut parts = Vec::new();
    let mut next = 0.0;
    for point in points {
        if point.at_s + 1e-9 >= next {
            parts.push(format!(
                "{:.0}:{}/{}",
                point.at_s,
                point.level.map_or("?".into(), |l| l.to_string()),
                point
                    .concurrency_limit
                    .map_or("?".into(), |l| format!("{l:.0}"))
            ));
            next = point.at_s.floor() + 1.0;
        }
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_parses_back_and_only_rabbitmq_disturbs_shared_services() {
        for phase in PhaseName::ALL {
            assert_eq!(PhaseName::parse(phase.as_str()), Some(phase));
            assert_eq!(
                phase.disturbs_shared_services(),
                phase == PhaseName::Rabbitmq
            );
            assert!(phase.fault().len() > 10);
        }
        assert_eq!(PhaseName::parse("nope"), None);
    }

    #[test]
    fn quick_mode_fits_the_ci_budget() {
        let timing = Timing::new(true, None);
        // Attack windows: the 5 s timeout, the margin, the ramp (≤ 1 s) and 0.5 s.
        let attack = timing.attack_baseline_s
            + 5.0
            + timing.attack_margin_s
            + 1.5
            + timing.attack_recovery_s;
        let total = timing.steady_s
            + timing.burst.total()
            + 5.0 * timing.phase.total()
            + timing.mysql.total()
            + 4.0 * attack
            + 12.0 * timing.lead_in_s;
        // About 20 s of set-up (seed, two service starts, warm-ups, the probe) on top: the
        // whole quick run stays under 3 minutes.
        assert!(total < 140.0, "{total} s of phases");
        let full = Timing::new(false, None);
        assert!(full.steady_s >= 300.0 && full.mysql.recovery_s >= 60.0);
    }

    fn phase_with(windows: Windows, timeline: Vec<StatusPoint>) -> PhaseResult {
        let mut result = PhaseResult::new(PhaseName::Burst150, windows);
        result.status_timeline = timeline;
        result
    }

    #[test]
    fn a_refused_step_after_a_served_one_is_tried_once_more_before_the_search_ends() {
        use SearchMove::{Again, Down, Stop, Up};
        assert_eq!(CapacityStep::next(true, false, false), Up);
        assert_eq!(
            CapacityStep::next(true, true, true),
            Up,
            "the retry was served: go on"
        );
        assert_eq!(
            CapacityStep::next(false, false, false),
            Down,
            "nothing served yet"
        );
        assert_eq!(CapacityStep::next(false, true, false), Again);
        assert_eq!(CapacityStep::next(false, true, true), Stop);
    }

    #[test]
    fn the_capacity_is_a_rate_served_in_most_of_its_tries_and_a_tie_is_decided() {
        let step = |offered_rps: f64, served: bool| CapacityStep {
            offered_rps,
            ok_share: if served { 1.0 } else { 0.9 },
            p50_ms: Some(1.0),
            p99_ms: Some(10.0),
            received_503: 0,
            dispatch_lag_p99_ms: 1.0,
            served,
        };
        assert_eq!(CapacityStep::capacity_of(&[]), 0.0);
        assert_eq!(CapacityStep::to_confirm(&[]), None);
        let refused = [step(1000.0, false), step(850.0, false)];
        assert_eq!(CapacityStep::capacity_of(&refused), 0.0);
        assert_eq!(CapacityStep::to_confirm(&refused), None);

        // Up to 1322.5, refused twice at the next rate: 1322.5 was tried once.
        let mut search = vec![
            step(1000.0, true),
            step(1150.0, true),
            step(1322.5, true),
            step(1520.875, false),
            step(1520.875, false),
        ];
        assert_eq!(CapacityStep::capacity_of(&search), 1322.5);
        assert_eq!(CapacityStep::to_confirm(&search), Some(1322.5));
        // Served again: confirmed, nothing more to try.
        search.push(step(1322.5, true));
        assert_eq!(CapacityStep::capacity_of(&search), 1322.5);
        assert_eq!(CapacityStep::to_confirm(&search), None);
        // Refused on the second try instead: a tie is no majority, the rate below counts, and
        // a third try decides the tie; refused again, the rate below is confirmed in turn.
        search.pop();
        search.push(step(1322.5, false));
        assert_eq!(CapacityStep::capacity_of(&search), 1150.0);
        assert_eq!(CapacityStep::to_confirm(&search), Some(1322.5));
        search.push(step(1322.5, false));
        assert_eq!(CapacityStep::capacity_of(&search), 1150.0);
        assert_eq!(CapacityStep::to_confirm(&search), Some(1150.0));

        // No rate served in most of its tries: the tie at 850 is decided first; lost there
        // too, one step below the lowest tried.
        let mut lost = vec![
            step(1000.0, false),
            step(850.0, true),
            step(977.5, false),
            step(977.5, false),
            step(850.0, false),
        ];
        assert_eq!(CapacityStep::capacity_of(&lost), 0.0);
        assert_eq!(CapacityStep::to_confirm(&lost), Some(850.0));
        lost.push(step(850.0, false));
        assert_eq!(CapacityStep::to_confirm(&lost), Some(850.0 * 0.85));

        // Refused once and served on the retry, then the next rate refused twice: the search's
        // own steps leave 1150 tied above 1000, and a third try decides it.
        let mut retried = vec![
            step(1000.0, true),
            step(1150.0, false),
            step(1150.0, true),
            step(1322.5, false),
            step(1322.5, false),
        ];
        assert_eq!(CapacityStep::capacity_of(&retried), 1000.0);
        assert_eq!(CapacityStep::to_confirm(&retried), Some(1150.0));
        retried.push(step(1150.0, true));
        assert_eq!(CapacityStep::capacity_of(&retried), 1150.0);
        assert_eq!(CapacityStep::to_confirm(&retried), None);

        // A refusal while the generator fell behind is not the service's and does not count.
        let generator_bound = CapacityStep {
            dispatch_lag_p99_ms: CapacityStep::GENERATOR_LAG_MS * 2.0,
            ..step(1322.5, false)
        };
        let lagged = [step(1000.0, true), step(1322.5, true), generator_bound];
        assert_eq!(CapacityStep::capacity_of(&lagged), 1322.5);
        assert_eq!(CapacityStep::to_confirm(&lagged), Some(1322.5));
    }

    #[test]
    fn the_burst_verdict_reads_the_level_timeline() {
        let windows = Windows::new(10.0, 10.0, 20.0);
        let mut timeline = Vec::new();
        for tick in 0..160 {
            let at_s = tick as f64 * 0.25;
            let level = if at_s < 10.25 {
                0
            } else if at_s < 21.0 {
                3
            } else if at_s < 23.0 {
                1
            } else {
                0
            };
            timeline.push(StatusPoint {
                at_s,
                level: Some(level),
                concurrency_limit: Some(100.0),
                ..StatusPoint::default()
            });
        }
        let mut result = phase_with(windows, timeline.clone());
        burst_verdict(&mut result);
        let verdicts: Vec<Option<bool>> = result.targets.iter().map(|t| t.met).collect();
        assert_eq!(verdicts, vec![Some(true); 5], "{:?}", result.targets);

        // Level 3 only after 2 s and a late return to 0: those two are not met.
        for point in &mut timeline {
            if point.at_s >= 10.0 && point.at_s < 12.0 {
                point.level = Some(2);
            }
            if point.at_s >= 21.0 && point.at_s < 27.0 {
                point.level = Some(1);
            }
        }
        let mut result = phase_with(windows, timeline);
        burst_verdict(&mut result);
        let verdicts: Vec<Option<bool>> = result.targets.iter().map(|t| t.met).collect();
        assert_eq!(
            verdicts,
            vec![Some(true), Some(false), Some(false), Some(true), Some(true)]
        );
    }

    fn attack_closed(still_open: usize, latest_ms: f64) -> AttackSummary {
        AttackSummary {
            connections: 10,
            connect_failed: 0,
            closed_by_server: 10 - still_open,
            reset: 0,
            still_open_at_bound: still_open,
            lifetime_p50_ms: Some(5_001.0),
            lifetime_max_ms: Some(latest_ms),
            lifetime_min_ms: Some(5_000.0),
            statuses: BTreeMap::new(),
            max_open: 10,
        }
    }

    /// Issue #40: every attacker connection closed by the timeout + 100 ms of its connect is the
    /// target; left open, or closed past the timeout + 250 ms, is a violation (it was only a
    /// miss before).
    #[test]
    fn attackers_left_open_or_closed_late_are_violations() {
        let windows = Windows::new(2.0, 10.0, 2.0);
        let verdict = |summary: AttackSummary| {
            let mut result = phase_with(windows, Vec::new());
            result.attack = Some(summary);
            attack_close_verdict(&mut result, "closed", 5_000);
            (result.targets[0].met, result.violations.len())
        };
        assert_eq!(verdict(attack_closed(0, 5_100.0)), (Some(true), 0));
        assert_eq!(
            verdict(attack_closed(0, 5_101.0)),
            (Some(false), 0),
            "closed past the target, within the gate"
        );
        assert_eq!(verdict(attack_closed(0, 5_250.0)), (Some(false), 0));
        assert_eq!(
            verdict(attack_closed(0, 5_251.0)),
            (Some(false), 1),
            "closed, but late"
        );
        assert_eq!(verdict(attack_closed(2, 5_050.0)), (Some(false), 1));
        assert_eq!(verdict(attack_closed(2, 9_000.0)), (Some(false), 2));
    }

    #[test]
    fn the_idle_probe_must_close_by_the_idle_timeout_and_100_ms() {
        let edge = EdgeTimeouts {
            header_read_ms: 5_000,
            body_read_ms: 5_000,
            idle_ms: 10_000,
            keys_accepted: true,
        };
        let probe = |after_answer_ms: f64| {
            let outcome = AttackOutcome {
                fates: vec![attack::Fate {
                    ending: attack::Ending::ClosedByServer,
                    lifetime_ms: Some(after_answer_ms + 5.0),
                    after_last_response_byte_ms: Some(after_answer_ms),
                    status: Some(200),
                    bytes_written: 100,
                }],
                open_timeline: Vec::new(),
            };
            let verdict = idle_verdict(&outcome, &edge, Duration::from_secs(25));
            (verdict.targets[0].met, verdict.violations.len())
        };
        assert_eq!(probe(10_100.0), (Some(true), 0));
        assert_eq!(probe(6_000.0), (Some(true), 0), "shrunk under pressure");
        assert_eq!(probe(10_101.0), (Some(false), 0));
        assert_eq!(probe(10_251.0), (Some(false), 1));
    }

    #[test]
    fn breaker_states_are_read_by_dependency_name() {
        let status = json!({"protection": {"dependencies": [
            {"name": "mysql", "breaker": {"state": "closed"}},
            {"name": "redis", "breaker": {"state": "half_open"}},
        ]}});
        assert_eq!(breaker_of(&status, "redis"), Some("half_open"));
        assert_eq!(breaker_of(&status, "mysql"), Some("closed"));
        assert_eq!(breaker_of(&status, "coupons"), None);
        assert_eq!(breaker_of(&json!({}), "redis"), None);
    }

    #[test]
    fn the_steady_verdict_wants_level_0_and_no_503() {
        let windows = Windows::new(10.0, 0.0, 0.0);
        let timeline: Vec<StatusPoint> = (0..40)
            .map(|tick| StatusPoint {
                at_s: tick as f64 * 0.25,
                level: Some(u8::from(tick == 20)),
                ..StatusPoint::default()
            })
            .collect();
        let mut result = phase_with(windows, timeline);
        steady_verdict(&mut result);
        assert_eq!(result.targets[0].met, Some(false));
        assert!(result.targets[0].figure.contains("39 of 40"));
        assert_eq!(result.targets[1].met, Some(true));
    }

    #[test]
    fn the_markdown_names_every_phase_and_the_violations() {
        let report = ChaosReport {
            tool: "rebate-loadgen chaos",
            started_at: "2026-12-01T00:00:00Z".into(),
            command: "rebate-loadgen chaos --quick".into(),
            machine: Machine::detect(1, 0),
            quick: true,
            service_binary: "target/release/rebate-query".into(),
            capacity_rps: 1000.0,
            capacity_source: "--capacity".into(),
            capacity_steps: Vec::new(),
            main_rate_share: 0.5,
            cold_rate_rps: 50.0,
            service_env: Vec::new(),
            edge: EdgeTimeouts {
                header_read_ms: 5000,
                body_read_ms: 5000,
                idle_ms: 10000,
                keys_accepted: false,
            },
            shedding_thresholds: Value::Null,
            phases: vec![phase_with(Windows::new(2.0, 2.0, 3.0), Vec::new())],
            idle: None,
            harness_cpu: None,
            service_cpu: None,
            notes: vec!["a note".into()],
            violations: vec!["slowloris: 3 attacker connections were never closed".into()],
            wall_s: 1.0,
        };
        let text = markdown(&report);
        assert!(text.contains("| burst-150 |"));
        assert!(text.contains("never closed"));
        assert!(text.contains("NOT accepted"));
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["phases"][0]["name"], "burst-150");
    }
}
