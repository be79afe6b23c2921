//! The scenarios: each starts what it needs (a fresh service, the ceiling, Redis, a database),
//! runs bounded load against it next to a reference measured in the same run, and returns one
//! [`ScenarioReport`]. Failures of one scenario are reported and do not stop the others.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::json;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::ceiling::CeilingServer;
use crate::chart;
use crate::client::{Attempt, Behaviour, LoadClient, RequestClass, RequestKind, Target};
use crate::generator::{
    OpenLoop, ProbeOutput, RunOutput, Workload, closed_loop_probe, run_open_loop,
};
use crate::keys::{ItemKey, KeyPicker};
use crate::recorder::Phase;
use crate::report::{Capacity, ScenarioReport, ScenarioStatus, Series, SeriesInput, ratio};
use crate::schedule::{Schedule, Segment};
mod clients;

use crate::service::{
    MySqlDatabase, RedisServer, ServiceProcess, ShedSample, naive_profile_env, reachable, seed,
};

/// The scenarios, in the order `all` runs them (hot-path first: it measures the capacity the
/// others are scaled to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScenarioName {
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

impl ScenarioName {
    pub const ALL: [Self; 10] = [
        Self::HotPath,
        Self::Burst,
        Self::Steady,
        Self::Mixed,
        Self::Deferrable,
        Self::CouponFault,
        Self::RedisOutage,
        Self::RetryStorm,
        Self::ClientContract,
        Self::Baseline,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::HotPath => "hot-path",
            Self::Burst => "burst",
            Self::Steady => "steady",
            Self::Mixed => "mixed",
            Self::Deferrable => "deferrable",
            Self::CouponFault => "coupon-fault",
            Self::RedisOutage => "redis-outage",
            Self::RetryStorm => "retry-storm",
            Self::ClientContract => "client-contract",
            Self::Baseline => "baseline",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Self::HotPath => {
                "All cache hits (the service's 300-key hot list, warmed first). Maximum throughput \
                 by a closed-loop saturation probe of the service and of the ceiling (a bare axum \
                 handler returning the same bytes), then P99 of both at 50 % of the service's \
                 maximum in open loop."
            }
            Self::Burst => {
                "Open loop over the whole catalogue (Zipf): 0 → 150 % of capacity (the lesser of \
                 the measured capacity and the service's shedding capacity_rps) over the ramp, \
                 held, then back to 80 %. Reference: the ceiling under the same schedule."
            }
            Self::Steady => {
                "Open loop over the whole catalogue (Zipf) at 80 % of capacity (as for burst). \
                 Reference: the ceiling under the same schedule."
            }
            Self::Mixed => {
                "Singles and 20 % batches (1–50 keys) over the whole catalogue, at a request rate \
                 whose item rate is the moderate rate (50 % of the lesser of capacity and the \
                 service's shedding capacity_rps). Reference: the pages (singles not marked \
                 prefetch) within the same run."
            }
            Self::Deferrable => {
                "80 % fast requests (item pages) and 20 % deferrable ones (marked \
                 `x-request-class: prefetch`, which wait for admission over the limit) at the \
                 burst profile (0 → 150 % of capacity, held, then 80 %) and the steady one \
                 (80 %), against two runs without deferrable traffic at each: fast only (the \
                 deferrable requests removed: 80 % of the load) and all fast (replaced by fast \
                 ones: the whole load). Every run on a fresh service. Figures: the fast class \
                 at 150 % (the burst's overload phase) with deferrable traffic; reference: the \
                 fast-only run's. Per class: success, waits (the service's `Server-Timing`), \
                 503s with `Retry-After`, latency; the admission queue's peak against its bound."
            }
            Self::CouponFault => {
                "Open loop at the moderate rate (50 % of the lesser of capacity and the service's \
                 shedding capacity_rps); the simulated coupon API goes from 5 ms to 800 ms with \
                 20 % hangs for the middle third, then back. Figures: the fault phase; \
                 reference: the phase before it."
            }
            Self::RedisOutage => {
                "Production profile (MariaDB + a private Redis as L2) at the moderate rate; Redis \
                 is killed a third of the way in. Figures: after the kill; reference: before it."
            }
            Self::RetryStorm => {
                "The moderate rate over the whole catalogue with only the 300 hottest keys \
                 cached: shedding is forced to level 3 (cache only: misses get 503 with \
                 Retry-After 1–5 s) from the end of the warm-up until a few seconds into the \
                 run (3 s; 1.5 s quick), then released while the load goes on. Well-behaved \
                 clients (honour Retry-After, ≤ 2 retries) against naive ones (500 ms, 3 \
                 retries) at the same offered load, each on a fresh service: success, HTTP \
                 attempts sent and 503s received per kind."
            }
            Self::ClientContract => {
                "A population of users (5,000; 500 quick), each tapping on an open loop over a \
                 few items of their own with a client of its own: the client contract \
                 (docs/CLIENTS.md: back-off with jitter, Retry-After for every call, the \
                 adaptive throttle, the last good answer, cancellation) against a client that \
                 retries at once, each on a fresh service, under the same spike: every client's \
                 limit lowered to 0.1/s by a live rule set for a minute (5 s quick). Requests \
                 and retries per user per minute, what users were shown, the service's load, \
                 and the time to recover, side by side."
            }
            Self::Baseline => {
                "The steady load (80 % of capacity, as for burst) against the naive profile (no cache, parts \
                 one after another, long timeouts, no breakers, no shedding) and the real \
                 service, each freshly started."
            }
        }
    }
}

/// Everything the scenarios are configured by (from the command line).
#[derive(Debug, Clone)]
pub struct Options {
    pub quick: bool,
    pub out_dir: PathBuf,
    pub capacity: Option<f64>,
    pub duration: Option<f64>,
    pub service_binary: PathBuf,
    pub max_in_flight: usize,
    pub client_timeout: Duration,
    pub probe_concurrency: usize,
    pub batch_ratio: f64,
    pub batch_min: usize,
    pub batch_max: usize,
    /// Share of single-item requests marked `x-request-class: prefetch` in burst, steady and
    /// mixed (the scenarios that show shedding by class); in deferrable, the deferrable share
    /// of its mixed runs when above 0.
    pub prefetch_ratio: f64,
    pub app_share: f64,
    pub clients_per_kind: u32,
    pub service_capacity_rps: Option<u32>,
    pub mysql_url: String,
    pub seed: u64,
    pub ceiling_threads: usize,
    /// client-contract: users per run (default 5,000; 500 with `quick`).
    pub users: Option<usize>,
}

/// Durations of the pieces of a scenario; `--quick` divides them by about ten.
#[derive(Debug, Clone, Copy)]
struct Timing {
    main: Duration,
    probe: Duration,
    probe_warmup: Duration,
    half: Duration,
    ramp: Duration,
    hold: Duration,
    recover: Duration,
    drain: Duration,
    warmup_budget: Duration,
    /// retry-storm: how long the forced cache-only window lasts into the measured run. Fixed,
    /// not scaled with the run: the clients' retry delays (Retry-After 1–5 s; 0.5 s) are not.
    storm: Duration,
    /// Unrecorded lead-in of constant-rate runs at the same rate (connections, caches).
    lead_in: Duration,
}

impl Timing {
    fn new(quick: bool, main_override: Option<f64>) -> Self {
        let secs = Duration::from_secs_f64;
        let mut timing = if quick {
            Self {
                main: secs(3.0),
                probe: secs(2.0),
                probe_warmup: secs(0.5),
                half: secs(2.0),
                ramp: secs(1.0),
                hold: secs(1.0),
                recover: secs(1.0),
                drain: secs(3.0),
                warmup_budget: secs(15.0),
                storm: secs(1.5),
                lead_in: secs(0.5),
            }
        } else {
            Self {
                main: secs(30.0),
                probe: secs(10.0),
                probe_warmup: secs(1.0),
                half: secs(20.0),
                ramp: secs(5.0),
                hold: secs(10.0),
                recover: secs(10.0),
                drain: secs(15.0),
                warmup_budget: secs(30.0),
                storm: secs(3.0),
                lead_in: secs(2.0),
            }
        };
        if let Some(main) = main_override.filter(|main| *main > 0.0) {
            timing.main = secs(main);
        }
        timing
    }
}

/// The capacity the catalogue scenarios scale with, and where it came from.
#[derive(Debug, Clone, Copy)]
struct SizedCapacity {
    rps: f64,
    measured: f64,
    configured: Option<f64>,
}

impl SizedCapacity {
    fn describe(&self) -> String {
        format!(
            "{:.0} rps = min(measured capacity {:.0}, the service's shedding capacity_rps {})",
            self.rps,
            self.measured,
            self.configured
                .map_or("unset".to_owned(), |value| format!("{value:.0}"))
        )
    }
}

/// Runs scenarios and keeps what one measures for the next (the capacity).
#[derive(Debug)]
pub struct Harness {
    options: Options,
    timing: Timing,
    client: LoadClient,
    capacity: Option<Capacity>,
}

/// A scenario's warm-up: how many keys answer undegraded, after how long.
#[derive(Debug, Clone)]
struct Warmed {
    note: String,
}

impl Harness {
    pub fn new(options: Options) -> anyhow::Result<Self> {
        let timing = Timing::new(options.quick, options.duration);
        let client = LoadClient::new(options.client_timeout)?;
        let capacity = options.capacity.map(|rps| Capacity {
            rps,
            source: "--capacity".to_owned(),
        });
        Ok(Self {
            options,
            timing,
            client,
            capacity,
        })
    }

    pub fn capacity(&self) -> Option<&Capacity> {
        self.capacity.as_ref()
    }

    /// Runs one scenario; an error becomes a `failed` report with the error chain.
    pub async fn run(&mut self, name: ScenarioName) -> ScenarioReport {
        eprintln!("== {}", name.as_str());
        let started = std::time::Instant::now();
        let result = match name {
            ScenarioName::HotPath => self.hot_path().await,
            ScenarioName::Burst => self.burst().await,
            ScenarioName::Steady => self.steady().await,
            ScenarioName::Mixed => self.mixed().await,
            ScenarioName::Deferrable => self.deferrable().await,
            ScenarioName::CouponFault => self.coupon_fault().await,
            ScenarioName::RedisOutage => self.redis_outage().await,
            ScenarioName::RetryStorm => self.retry_storm().await,
            ScenarioName::ClientContract => self.client_contract().await,
            ScenarioName::Baseline => self.baseline().await,
        };
        let mut report = match result {
            Ok(report) => report,
            Err(error) => {
                let mut report = ScenarioReport::new(name.as_str(), name.description());
                report.status = ScenarioStatus::Failed;
                report.notes.push(format!("{error:#}"));
                report
            }
        };
        report.notes.extend(self.health_notes(&report));
        report.notes.push(format!(
            "wall time {:.1} s",
            started.elapsed().as_secs_f64()
        ));
        if let Err(error) = self.draw_charts(&mut report) {
            report.notes.push(format!("charts not drawn: {error:#}"));
        }
        eprintln!("   {:?}: {}", report.status, one_line(&report));
        report
    }

    /// Warnings a reader needs next to the figures.
    fn health_notes(&self, report: &ScenarioReport) -> Vec<String> {
        let mut notes = generator_bound_notes(&report.series);
        for series in &report.series {
            if series.unfinished > 0 || series.not_sent > 0 {
                notes.push(format!(
                    "{}: {} requests still in flight at the drain bound, {} never sent",
                    series.label, series.unfinished, series.not_sent
                ));
            }
        }
        let configured = report
            .series
            .iter()
            .filter_map(|series| series.service_shedding.as_deref())
            .find_map(|text| text.strip_prefix("enabled, capacity_rps "))
            .and_then(|capacity| capacity.parse::<f64>().ok());
        if let (Some(configured), Some(capacity)) = (configured, &self.capacity)
            && configured > 0.0
            && capacity.rps > configured
        {
            notes.push(format!(
                "the service's resilience.shedding.capacity_rps ({configured:.0}) is below the \
                 measured capacity ({:.0} rps): it sheds from {:.0} rps on; pass \
                 --service-capacity-rps to size it",
                capacity.rps,
                configured * 0.7
            ));
        }
        notes
    }

    fn draw_charts(&self, report: &mut ScenarioReport) -> anyhow::Result<()> {
        let open_loop: Vec<&Series> = report
            .series
            .iter()
            .filter(|series| series.mode == "open-loop")
            .collect();
        if open_loop.is_empty() {
            return Ok(());
        }
        let latency_file = format!("{}-latency.svg", report.name);
        chart::draw(
            &self.options.out_dir.join(&latency_file),
            &format!(
                "{}: latency per second (P50 dashed, P99 solid)",
                report.name
            ),
            "latency ms",
            &chart::latency_lines(&open_loop),
            1.0,
        )?;
        let shed_file = format!("{}-shed-level.svg", report.name);
        chart::draw(
            &self.options.out_dir.join(&shed_file),
            &format!("{}: service shed level per second", report.name),
            "shed level (0-3)",
            &chart::shed_lines(&open_loop),
            3.0,
        )?;
        report.charts.push(latency_file);
        report.charts.push(shed_file);
        Ok(())
    }

    fn workload(&self, keys: Arc<KeyPicker>, behaviour: Behaviour) -> Workload {
        Workload {
            keys,
            batch_ratio: 0.0,
            batch_min: self.options.batch_min,
            batch_max: self.options.batch_max,
            prefetch_ratio: 0.0,
            app_share: self.options.app_share,
            clients_per_kind: self.options.clients_per_kind,
            behaviour,
        }
    }

    fn catalogue(&self) -> anyhow::Result<Arc<KeyPicker>> {
        Ok(Arc::new(KeyPicker::catalogue(self.options.seed)?))
    }

    fn hot_list(&self) -> anyhow::Result<Arc<KeyPicker>> {
        Ok(Arc::new(KeyPicker::service_hot_list(self.options.seed)?))
    }

    /// A run of `schedule` recorded from its start (e.g. a ramp from 0).
    fn plan(&self, schedule: Schedule, phases: Vec<Phase>, seed_offset: u64) -> OpenLoop {
        OpenLoop {
            schedule,
            measure_from: Duration::ZERO,
            phases,
            max_in_flight: self.options.max_in_flight,
            drain_timeout: self.timing.drain,
            window: Duration::from_secs(1),
            seed: self.options.seed.wrapping_add(seed_offset),
        }
    }

    /// `rps` for `duration`, after an unrecorded lead-in at the same rate.
    fn constant_plan(
        &self,
        rps: f64,
        duration: Duration,
        phases: Vec<Phase>,
        seed_offset: u64,
    ) -> anyhow::Result<OpenLoop> {
        let schedule = Schedule::new(vec![
            Segment::constant(rps, self.timing.lead_in),
            Segment::constant(rps, duration),
        ])?;
        let mut plan = self.plan(schedule, phases, seed_offset);
        plan.measure_from = self.timing.lead_in;
        Ok(plan)
    }

    fn thirds(&self, names: [&str; 3]) -> Vec<Phase> {
        let third = self.timing.main / 3;
        vec![
            phase(names[0], Duration::ZERO),
            phase(names[1], third),
            phase(names[2], third * 2),
        ]
    }

    fn service_env(&self) -> Vec<(String, String)> {
        self.options
            .service_capacity_rps
            .map(|capacity| {
                (
                    "REBATE__RESILIENCE__SHEDDING__CAPACITY_RPS".to_owned(),
                    capacity.to_string(),
                )
            })
            .into_iter()
            .collect()
    }

    async fn start_service(
        &self,
        scenario: &str,
        label: &str,
        extra_env: &[(String, String)],
    ) -> anyhow::Result<ServiceProcess> {
        let logs = self.options.out_dir.join("logs");
        std::fs::create_dir_all(&logs)?;
        let mut env = self.service_env();
        env.extend(extra_env.iter().cloned());
        ServiceProcess::start(
            &self.options.service_binary,
            &env,
            &logs.join(format!("{scenario}-{label}.log")),
        )
        .await
        .with_context(|| format!("starting the service for {scenario} ({label})"))
    }

    /// Asks for every key until each answers undegraded, bounded by the warm-up budget.
    /// The first pass goes fast (cached keys answer at once); later passes ask for what is
    /// still degraded one key every 25 ms, under the coupon/extras quotas (45/s with bursts of
    /// 5), so the warm-up is not itself refused by them.
    async fn warm(&self, service: &ServiceProcess, keys: &[ItemKey]) -> Warmed {
        const FIRST_PASS_CONCURRENCY: usize = 16;
        const PACE: Duration = Duration::from_millis(25);
        let started = Instant::now();
        let deadline = started + self.timing.warmup_budget;
        self.settle(service, deadline).await;
        let mut pending: Vec<ItemKey> = keys.to_vec();
        let mut passes = 0;
        while !pending.is_empty() && Instant::now() < deadline {
            passes += 1;
            let mut requests = JoinSet::new();
            let mut still_pending = Vec::new();
            for (index, key) in pending.iter().enumerate() {
                if Instant::now() >= deadline {
                    still_pending.push(*key);
                    continue;
                }
                if passes == 1 {
                    while requests.len() >= FIRST_PASS_CONCURRENCY {
                        collect_degraded(requests.join_next().await, &mut still_pending);
                    }
                } else if index > 0 {
                    tokio::time::sleep(PACE).await;
                }
                let (client, target, key) = (self.client.clone(), service.api.clone(), *key);
                requests.spawn(async move {
                    let attempt = client
                        .attempt(&target, &RequestKind::Single(key), "loadgen-warmup")
                        .await;
                    (
                        key,
                        matches!(&attempt, Attempt::Response(r) if r.business_ok),
                    )
                });
            }
            while let Some(joined) = requests.join_next().await {
                collect_degraded(Some(joined), &mut still_pending);
            }
            pending = still_pending;
        }
        let live = keys.len() - pending.len();
        Warmed {
            note: format!(
                "warm-up: {live} of {} keys answered undegraded after {passes} pass(es) in {:.1} s",
                keys.len(),
                started.elapsed().as_secs_f64()
            ),
        }
    }

    /// Waits (bounded) until the service is back at shed level 0: after a saturation probe it
    /// steps down one level per dwell time, and a run started before would measure that.
    async fn settle(&self, service: &ServiceProcess, deadline: Instant) {
        while Instant::now() < deadline {
            match service.status().await {
                Ok(status) if crate::service::shed_level(&status).unwrap_or(0) > 0 => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                _ => return,
            }
        }
    }

    /// A fresh service for a catalogue scenario, started with `env`; the capacity (probed if
    /// this run has none yet) and the catalogue, its hottest keys warmed (noted in `report`).
    async fn start_catalogue_service(
        &mut self,
        name: ScenarioName,
        env: &[(String, String)],
        report: &mut ScenarioReport,
    ) -> anyhow::Result<(ServiceProcess, f64, Arc<KeyPicker>)> {
        let (service, capacity, keys, warmed) = self
            .start_labelled_service(name, "service", env, &mut report.notes)
            .await?;
        report.notes.push(warmed);
        Ok((service, capacity, keys))
    }

    /// As [`Harness::start_catalogue_service`], its log named `<scenario>-<label>.log`, and the
    /// warm-up's note returned rather than added.
    async fn start_labelled_service(
        &mut self,
        name: ScenarioName,
        label: &str,
        env: &[(String, String)],
        notes: &mut Vec<String>,
    ) -> anyhow::Result<(ServiceProcess, f64, Arc<KeyPicker>, String)> {
        let service = self.start_service(name.as_str(), label, env).await?;
        let capacity = self.ensure_capacity(name.as_str(), notes).await?;
        let keys = self.catalogue()?;
        let warmed = self.warm(&service, keys.hottest(WARMED_KEYS)).await.note;
        Ok((service, capacity, keys, warmed))
    }

    /// Half the sized capacity (see [`Harness::sized_capacity`]): fault scenarios should show the
    /// fault, not load shedding.
    async fn moderate_rate(
        &self,
        service: &ServiceProcess,
        capacity: f64,
        notes: &mut Vec<String>,
    ) -> anyhow::Result<f64> {
        let sized = self.sized_capacity(service, capacity).await?;
        let rate = (sized.rps * 0.5).max(1.0);
        notes.push(format!(
            "offered {rate:.0} rps = 50 % of {}",
            sized.describe()
        ));
        Ok(rate)
    }

    /// What "100 %" means in the catalogue scenarios: the lesser of the measured capacity and
    /// the service's shedding `capacity_rps`, so that the harness and the shedder agree on it.
    /// (The hot-path maximum is a closed-loop figure for L1 hits; an open loop over the whole
    /// catalogue at that rate overloads the generator itself on a small machine, the ceiling
    /// included.)
    async fn sized_capacity(
        &self,
        service: &ServiceProcess,
        capacity: f64,
    ) -> anyhow::Result<SizedCapacity> {
        let readings = service.readings().await?;
        let configured = match (readings.shedding_enabled, readings.capacity_rps) {
            (Some(true), Some(configured)) if configured > 0 => Some(configured as f64),
            _ => None,
        };
        Ok(SizedCapacity {
            rps: configured.map_or(capacity, |configured| configured.min(capacity)),
            measured: capacity,
            configured,
        })
    }

    /// The capacity the load levels scale with: `--capacity`, the hot-path measurement of this
    /// run, or a saturation probe of `service` now (hot list, warmed first).
    /// The probe runs on a service of its own, stopped afterwards: a saturated service keeps
    /// shedding (and its adaptive limits) for a while, which must not leak into the scenario.
    async fn ensure_capacity(
        &mut self,
        scenario: &str,
        notes: &mut Vec<String>,
    ) -> anyhow::Result<f64> {
        if let Some(capacity) = &self.capacity {
            return Ok(capacity.rps);
        }
        eprintln!("   no capacity yet: probing a fresh service");
        let service = self.start_service(scenario, "capacity-probe", &[]).await?;
        let keys = self.hot_list()?;
        let warmed = self.warm(&service, keys.hottest(keys.len())).await;
        let workload = self.workload(keys, Behaviour::WellBehaved);
        let probe = closed_loop_probe(
            &self.client,
            &service.api,
            &workload,
            self.options.probe_concurrency,
            self.timing.probe_warmup,
            self.timing.probe,
            self.options.seed,
        )
        .await;
        service.stop().await;
        if probe.ok_rps < 1.0 {
            bail!("the capacity probe got no successful answers");
        }
        let source = format!(
            "probed in this run: closed loop ×{} on the hot list for {:.1} s ({})",
            self.options.probe_concurrency,
            self.timing.probe.as_secs_f64(),
            warmed.note
        );
        notes.push(format!("capacity {:.0} rps, {source}", probe.ok_rps));
        self.capacity = Some(Capacity {
            rps: probe.ok_rps,
            source,
        });
        Ok(probe.ok_rps)
    }

    /// One open-loop run against the service, sampling its shed level once a second and
    /// reading its counters before and after; `actions` runs alongside (faults, kills).
    async fn measure_service<F, Fut>(
        &self,
        service: &ServiceProcess,
        label: &str,
        target_kind: &str,
        workload: &Workload,
        plan: &OpenLoop,
        actions: F,
    ) -> anyhow::Result<Series>
    where
        F: FnOnce(Instant) -> Fut,
        Fut: Future<Output = anyhow::Result<()>>,
    {
        let start = Instant::now() + Duration::from_millis(50);
        let measured_start = start + plan.measure_from;
        let measured = plan.schedule.duration().saturating_sub(plan.measure_from);
        let seconds = measured.as_secs_f64().ceil() as u32;
        let (output, sampled, action_result) = tokio::join!(
            run_open_loop(&self.client, &service.api, workload, plan, start),
            async {
                tokio::time::sleep_until(measured_start).await;
                let before = service.readings().await;
                (
                    before,
                    sample_shed_levels(service, measured_start, seconds).await,
                )
            },
            actions(measured_start),
        );
        action_result.context("a timed action of the scenario failed")?;
        let (before, samples) = sampled;
        let before = before?;
        let after = service.readings().await?;
        Ok(Series::build(
            open_loop_input(
                label,
                target_kind,
                workload,
                &output,
                Some((before, after)),
                samples,
            ),
            &output.recorded,
        ))
    }

    async fn measure_ceiling(
        &self,
        ceiling: &CeilingServer,
        workload: &Workload,
        plan: &OpenLoop,
    ) -> anyhow::Result<Series> {
        let target = ceiling.target()?;
        let start = Instant::now() + Duration::from_millis(50);
        let output = run_open_loop(&self.client, &target, workload, plan, start).await;
        Ok(Series::build(
            open_loop_input("ceiling", "ceiling", workload, &output, None, Vec::new()),
            &output.recorded,
        ))
    }

    async fn probe(
        &self,
        target: &Target,
        label: &str,
        target_kind: &str,
        workload: &Workload,
        service: Option<&ServiceProcess>,
    ) -> anyhow::Result<Series> {
        let before = match service {
            Some(service) => Some(service.readings().await?),
            None => None,
        };
        let output = closed_loop_probe(
            &self.client,
            target,
            workload,
            self.options.probe_concurrency,
            self.timing.probe_warmup,
            self.timing.probe,
            self.options.seed,
        )
        .await;
        let readings = match (service, before) {
            (Some(service), Some(before)) => Some((before, service.readings().await?)),
            _ => None,
        };
        Ok(Series::build(
            probe_input(label, target_kind, &output, readings),
            &output.recorded,
        ))
    }

    async fn start_ceiling(&self, service: &ServiceProcess) -> anyhow::Result<CeilingServer> {
        let (body, content_type) = service.sample_quote().await?;
        CeilingServer::start(body, content_type, self.options.ceiling_threads)
    }

    async fn hot_path(&mut self) -> anyhow::Result<ScenarioReport> {
        let name = ScenarioName::HotPath;
        let mut report = ScenarioReport::new(name.as_str(), name.description());
        let keys = self.hot_list()?;
        let workload = self.workload(keys.clone(), Behaviour::WellBehaved);
        let service = self.start_service(name.as_str(), "service", &[]).await?;
        let all_keys = keys.hottest(keys.len()).to_vec();
        report.notes.push(self.warm(&service, &all_keys).await.note);
        let ceiling = self.start_ceiling(&service).await?;
        let ceiling_target = ceiling.target()?;

        eprintln!("   saturation probe: ceiling, then service");
        let ceiling_max = self
            .probe(&ceiling_target, "ceiling max", "ceiling", &workload, None)
            .await?;
        self.warm(&service, &all_keys).await;
        let service_max = self
            .probe(
                &service.api,
                "service max",
                "service",
                &workload,
                Some(&service),
            )
            .await?;
        let max_rps = service_max.goodput_rps;
        if max_rps < 1.0 {
            bail!("the service answered no request successfully in the saturation probe");
        }

        service.stop().await;
        let half = max_rps / 2.0;
        eprintln!("   open loop at 50 % of the service's maximum: {half:.0} rps");
        let plan = self.constant_plan(
            half,
            self.timing.half,
            vec![phase("all", Duration::ZERO)],
            1,
        )?;
        let mut ceiling_half = self.measure_ceiling(&ceiling, &workload, &plan).await?;
        ceiling_half.label = "ceiling @50%".to_owned();
        // A fresh service: the saturated one keeps shedding and its adaptive limit for a while.
        let service = self
            .start_service(name.as_str(), "service-half", &[])
            .await?;
        report.notes.push(format!(
            "service @50% (fresh instance): {}",
            self.warm(&service, &all_keys).await.note
        ));
        let service_half = self
            .measure_service(
                &service,
                "service @50%",
                "service",
                &workload,
                &plan,
                no_actions,
            )
            .await?;

        report.figures = Some(service_max.figures());
        report.reference = Some(ceiling_max.figures());
        let throughput_ratio = ratio(Some(max_rps), Some(ceiling_max.goodput_rps));
        report
            .ratios
            .insert("throughput_vs_ceiling".into(), throughput_ratio);
        report.ratios.insert(
            "p99_at_half_vs_ceiling".into(),
            ratio(service_half.stats.p99_ms, ceiling_half.stats.p99_ms),
        );
        report
            .headline
            .insert("max_rps_service".into(), Some(max_rps));
        report
            .headline
            .insert("max_rps_ceiling".into(), Some(ceiling_max.goodput_rps));
        report.headline.insert("half_rate_rps".into(), Some(half));
        report
            .headline
            .insert("p99_ms_at_half_service".into(), service_half.stats.p99_ms);
        report
            .headline
            .insert("p99_ms_at_half_ceiling".into(), ceiling_half.stats.p99_ms);
        if throughput_ratio.is_some_and(|ratio| ratio >= 0.95) {
            report.notes.push(
                "the service is within 5 % of the ceiling: the generator or the machine, not \
                 the service, may be the limit"
                    .into(),
            );
        }
        if service_max
            .stats
            .business_success_rate
            .is_some_and(|rate| rate < 0.99)
        {
            report.notes.push(
                "under 99 % business success in the probe: not every answer came from the cache"
                    .into(),
            );
        }
        report.series = vec![service_max, ceiling_max, service_half, ceiling_half];
        if self.capacity.is_none() {
            self.capacity = Some(Capacity {
                rps: max_rps,
                source: format!(
                    "hot-path in this run: closed loop ×{} for {:.1} s",
                    self.options.probe_concurrency,
                    self.timing.probe.as_secs_f64()
                ),
            });
        }
        service.stop().await;
        Ok(report)
    }

    /// burst and steady: the same schedule against the service and against the ceiling.
    async fn against_ceiling(
        &mut self,
        name: ScenarioName,
        schedule: impl FnOnce(f64, &Timing) -> anyhow::Result<(Schedule, Duration, Vec<Phase>)>,
    ) -> anyhow::Result<ScenarioReport> {
        let mut report = ScenarioReport::new(name.as_str(), name.description());
        let (service, capacity, keys) =
            self.start_catalogue_service(name, &[], &mut report).await?;
        let sized = self.sized_capacity(&service, capacity).await?;
        report
            .notes
            .push(format!("load levels are fractions of {}", sized.describe()));
        let capacity = sized.rps;
        let mut workload = self.workload(keys, Behaviour::WellBehaved);
        workload.prefetch_ratio = self.options.prefetch_ratio;
        if workload.prefetch_ratio > 0.0 {
            report.notes.push(format!(
                "{:.0} % of the requests (all single-item) marked `x-request-class: prefetch`",
                workload.prefetch_ratio * 100.0
            ));
        }
        let (schedule, measure_from, phases) = schedule(capacity, &self.timing)?;
        let mut plan = self.plan(schedule, phases, 2);
        plan.measure_from = measure_from;
        eprintln!(
            "   {:.0} requests, mean {:.0} rps, peak {:.0} rps (capacity {capacity:.0})",
            plan.schedule.total_requests(),
            plan.schedule.mean_rps(),
            plan.schedule.peak_rps()
        );
        let ceiling = self.start_ceiling(&service).await?;
        let ceiling_series = self.measure_ceiling(&ceiling, &workload, &plan).await?;
        drop(ceiling);
        let service_series = self
            .measure_service(&service, "service", "service", &workload, &plan, no_actions)
            .await?;
        report
            .headline
            .insert("capacity_rps".into(), Some(capacity));
        report
            .headline
            .insert("peak_offered_rps".into(), Some(plan.schedule.peak_rps()));
        report.headline.insert(
            "max_shed_level".into(),
            service_series
                .windows
                .iter()
                .filter_map(|window| window.shed_level)
                .max()
                .map(f64::from),
        );
        admitted_headline(&mut report, &service_series, &ceiling_series);
        if name == ScenarioName::Burst {
            report.notes.push(burst_target_note(&service_series));
        }
        report.ratios.insert(
            "p99_vs_ceiling".into(),
            ratio(service_series.stats.p99_ms, ceiling_series.stats.p99_ms),
        );
        report.ratios.insert(
            "goodput_vs_ceiling".into(),
            ratio(
                Some(service_series.goodput_rps),
                Some(ceiling_series.goodput_rps),
            ),
        );
        report.figures = Some(service_series.figures());
        report.reference = Some(ceiling_series.figures());
        report.series = vec![service_series, ceiling_series];
        service.stop().await;
        Ok(report)
    }

    async fn burst(&mut self) -> anyhow::Result<ScenarioReport> {
        self.against_ceiling(ScenarioName::Burst, |capacity, timing| {
            Profile::Burst.schedule(capacity, timing)
        })
        .await
    }

    async fn steady(&mut self) -> anyhow::Result<ScenarioReport> {
        self.against_ceiling(ScenarioName::Steady, |capacity, timing| {
            Profile::Steady.schedule(capacity, timing)
        })
        .await
    }

    async fn mixed(&mut self) -> anyhow::Result<ScenarioReport> {
        let name = ScenarioName::Mixed;
        let mut report = ScenarioReport::new(name.as_str(), name.description());
        let (service, capacity, keys) =
            self.start_catalogue_service(name, &[], &mut report).await?;
        let mut workload = self.workload(keys, Behaviour::WellBehaved);
        workload.batch_ratio = self.options.batch_ratio;
        workload.prefetch_ratio = self.options.prefetch_ratio;
        let items_rate = self
            .moderate_rate(&service, capacity, &mut report.notes)
            .await?;
        let rate = (items_rate / workload.mean_items()).max(1.0);
        let plan = self.constant_plan(
            rate,
            self.timing.main,
            vec![phase("all", Duration::ZERO)],
            3,
        )?;
        let series = self
            .measure_service(&service, "service", "service", &workload, &plan, no_actions)
            .await?;
        report.notes.push(format!(
            "{:.0} % batches of {}–{} keys, {:.0} % of the singles marked prefetch; {rate:.0} \
             requests/s ≈ {:.0} items/s",
            workload.batch_ratio * 100.0,
            workload.batch_min,
            workload.batch_max,
            workload.prefetch_ratio * 100.0,
            rate * workload.mean_items()
        ));
        report.headline.insert(
            "items_per_second".into(),
            Some(series.stats.items as f64 / series.elapsed_s.max(series.duration_s)),
        );
        report.figures = Some(series.figures());
        // Batches against the pages (singles not marked prefetch); the name predates classes.
        report.reference = series.class_figures(RequestClass::Page);
        let batch = series.class_figures(RequestClass::List);
        report.ratios.insert(
            "batch_p99_vs_single_p99".into(),
            ratio(
                batch.as_ref().and_then(|figures| figures.p99_ms),
                report.reference.as_ref().and_then(|figures| figures.p99_ms),
            ),
        );
        report.series = vec![series];
        service.stop().await;
        Ok(report)
    }

    /// The mixed run with a deferrable share at the burst and steady profiles, next to runs
    /// without deferrable traffic (see [`ScenarioName::Deferrable`]).
    async fn deferrable(&mut self) -> anyhow::Result<ScenarioReport> {
        let name = ScenarioName::Deferrable;
        let mut report = ScenarioReport::new(name.as_str(), name.description());
        let share = if self.options.prefetch_ratio > 0.0 {
            self.options.prefetch_ratio
        } else {
            DEFERRABLE_SHARE
        };
        for profile in Profile::ALL {
            let mut runs = Vec::new();
            for mix in Mix::ALL {
                let label = format!("{}: {}", profile.as_str(), mix.label(share));
                let log = format!("{}-{}", profile.as_str(), mix.log_label());
                let (service, capacity, keys, warmed) = self
                    .start_labelled_service(name, &log, &[], &mut report.notes)
                    .await?;
                report.notes.push(format!("{label}: {warmed}"));
                let sized = self.sized_capacity(&service, capacity).await?;
                let scale = mix.load_scale(share);
                let (schedule, measure_from, phases) =
                    profile.schedule(sized.rps * scale, &self.timing)?;
                let mut workload = self.workload(keys, Behaviour::WellBehaved);
                workload.prefetch_ratio = mix.deferrable_share(share);
                let mut plan = self.plan(schedule, phases, 5);
                plan.measure_from = measure_from;
                plan.max_in_flight = plan.max_in_flight.max(DEFERRABLE_MAX_IN_FLIGHT);
                eprintln!(
                    "   {label}: peak {:.0} rps ({:.0} % of {})",
                    plan.schedule.peak_rps(),
                    plan.schedule.peak_rps() / sized.rps * 100.0,
                    sized.describe()
                );
                let series = self
                    .measure_service(&service, &label, "service", &workload, &plan, no_actions)
                    .await;
                service.stop().await;
                runs.push(series?);
            }
            deferrable_figures(&mut report, profile, &runs);
            report.series.extend(runs);
        }
        report.notes.push(format!(
            "{:.0} % of the requests marked `x-request-class: prefetch` in the mixed runs; \
             well-behaved clients (a 503 is retried after its Retry-After, at most twice): a \
             request's latency includes its retries, the wait columns are the service's own \
             per attempt; at most {} logical requests in flight (a refused request waiting for \
             its retry is one)",
            share * 100.0,
            self.options.max_in_flight.max(DEFERRABLE_MAX_IN_FLIGHT)
        ));
        Ok(report)
    }

    async fn coupon_fault(&mut self) -> anyhow::Result<ScenarioReport> {
        let name = ScenarioName::CouponFault;
        let mut report = ScenarioReport::new(name.as_str(), name.description());
        let (service, capacity, keys) =
            self.start_catalogue_service(name, &[], &mut report).await?;
        let workload = self.workload(keys, Behaviour::WellBehaved);
        let healthy = json!({"latency_ms": 5});
        let faulty = json!({"latency_ms": 800, "hang_rate": 0.2});
        service.set_fault("coupons", &healthy).await?;
        let phases = self.thirds(["before", "fault", "after"]);
        let (fault_at, heal_at) = (phases[1].start, phases[2].start);
        let rate = self
            .moderate_rate(&service, capacity, &mut report.notes)
            .await?;
        let plan = self.constant_plan(rate, self.timing.main, phases, 4)?;
        let series = self
            .measure_service(&service, "service", "service", &workload, &plan, |start| {
                let (service, healthy, faulty) = (&service, &healthy, &faulty);
                async move {
                    tokio::time::sleep_until(start + fault_at).await;
                    service.set_fault("coupons", faulty).await?;
                    tokio::time::sleep_until(start + heal_at).await;
                    service.set_fault("coupons", healthy).await
                }
            })
            .await?;
        service.clear_faults().await?;
        report.notes.push(format!(
            "coupons: {healthy} until {:.1} s, {faulty} until {:.1} s, then {healthy}",
            fault_at.as_secs_f64(),
            heal_at.as_secs_f64()
        ));
        phase_comparison(&mut report, &series, "fault", "before");
        report.series = vec![series];
        service.stop().await;
        Ok(report)
    }

    async fn redis_outage(&mut self) -> anyhow::Result<ScenarioReport> {
        let name = ScenarioName::RedisOutage;
        let mysql_address = loopback_socket(&self.options.mysql_url)?;
        if !reachable(mysql_address).await {
            return Ok(ScenarioReport::skipped(
                name.as_str(),
                name.description(),
                format!("skipped: no MariaDB/MySQL answering at {mysql_address}"),
            ));
        }
        let redis_available = tokio::process::Command::new("redis-server")
            .arg("--version")
            .output()
            .await
            .is_ok_and(|output| output.status.success());
        if !redis_available {
            return Ok(ScenarioReport::skipped(
                name.as_str(),
                name.description(),
                "skipped: redis-server is not installed".into(),
            ));
        }
        let database = MySqlDatabase::create(&self.options.mysql_url)
            .await
            .context("creating a fresh database")?;
        let result = self.redis_outage_with(&database).await;
        if let Err(error) = database.drop_database().await {
            eprintln!("   warning: could not drop the scenario's database: {error:#}");
        }
        result
    }

    async fn redis_outage_with(
        &mut self,
        database: &MySqlDatabase,
    ) -> anyhow::Result<ScenarioReport> {
        let name = ScenarioName::RedisOutage;
        let mut report = ScenarioReport::new(name.as_str(), name.description());
        let mut redis = RedisServer::start().await?;
        let env: Vec<(String, String)> = [
            ("REBATE__STORE__BACKEND", "mysql".to_owned()),
            ("DATABASE_URL", database.url()),
            ("REBATE__REDIS__ENABLED", "true".to_owned()),
            ("REDIS_URL", redis.url()),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .collect();
        seed(
            &self.options.service_binary,
            &env,
            &self.options.out_dir.join("logs/redis-outage-seed.log"),
        )
        .await?;
        let (service, capacity, keys) = self
            .start_catalogue_service(name, &env, &mut report)
            .await?;
        let workload = self.workload(keys, Behaviour::WellBehaved);
        let third = self.timing.main / 3;
        let phases = vec![phase("before", Duration::ZERO), phase("outage", third)];
        let rate = self
            .moderate_rate(&service, capacity, &mut report.notes)
            .await?;
        let plan = self.constant_plan(rate, self.timing.main, phases, 5)?;
        let series = self
            .measure_service(&service, "service", "service", &workload, &plan, |start| {
                let redis = &mut redis;
                async move {
                    tokio::time::sleep_until(start + third).await;
                    redis.kill().await;
                    Ok(())
                }
            })
            .await?;
        report.notes.push(format!(
            "database {} on {}; redis-server killed (SIGKILL) at {:.1} s",
            database.name,
            loopback_socket(&self.options.mysql_url)?,
            third.as_secs_f64()
        ));
        phase_comparison(&mut report, &series, "outage", "before");
        report.series = vec![series];
        service.stop().await;
        Ok(report)
    }

    async fn retry_storm(&mut self) -> anyhow::Result<ScenarioReport> {
        let name = ScenarioName::RetryStorm;
        let mut report = ScenarioReport::new(name.as_str(), name.description());
        let keys = self.catalogue()?;
        let window = self.timing.storm.min(self.timing.main);
        let mut results = Vec::new();
        // The same offered load (rate, seed, so the same requests) for both behaviours.
        let mut shared_rate = None;
        for behaviour in [Behaviour::WellBehaved, Behaviour::Naive] {
            let label = format!("{} clients", behaviour.as_str());
            let service = self
                .start_service(name.as_str(), behaviour.as_str(), &[])
                .await?;
            let capacity = self
                .ensure_capacity(name.as_str(), &mut report.notes)
                .await?;
            let warmed = self.warm(&service, keys.hottest(WARMED_KEYS)).await;
            report.notes.push(format!("{label}: {}", warmed.note));
            let workload = self.workload(keys.clone(), behaviour);
            let phases = vec![
                phase("cache_only forced", Duration::ZERO),
                phase("released", window),
            ];
            let offered = match shared_rate {
                Some(rate) => rate,
                None => {
                    self.moderate_rate(&service, capacity, &mut report.notes)
                        .await?
                }
            };
            shared_rate = Some(offered);
            let mut plan = self.constant_plan(offered, self.timing.main, phases, 6)?;
            plan.drain_timeout = storm_drain(self.timing.drain, self.timing.main, window);
            // Shedding from the start of the measured run: forced right after the warm-up, so
            // the unrecorded lead-in (connection set-up) is shed too and caches nothing more.
            service.force_shedding(Some("cache_only")).await?;
            let series = self
                .measure_service(&service, &label, "service", &workload, &plan, |start| {
                    let service = &service;
                    async move {
                        tokio::time::sleep_until(start + window).await;
                        service.force_shedding(None).await
                    }
                })
                .await?;
            service.stop().await;
            results.push((series, plan.drain_timeout));
        }
        let [(well_behaved, drain), (naive, _)]: [(Series, Duration); 2] = results
            .try_into()
            .map_err(|_| anyhow::anyhow!("expected two series"))?;
        report.notes.push(format!(
            "shed level forced to cache_only (PUT /admin/v1/shedding) right after the warm-up, \
             through the {:.1} s unrecorded lead-in, until {:.1} s into the measured run, then \
             released; the load goes on to {:.1} s and retries may run until {:.1} s. Level-3 \
             misses are answered 503 with Retry-After {}–{} s (the service's default range)",
            self.timing.lead_in.as_secs_f64(),
            window.as_secs_f64(),
            self.timing.main.as_secs_f64(),
            (self.timing.main + drain).as_secs_f64(),
            SHED_RETRY_AFTER.0.as_secs(),
            SHED_RETRY_AFTER.1.as_secs(),
        ));
        storm_figures(&mut report, &well_behaved, &naive);
        for (kind, series) in [("well_behaved", &well_behaved), ("naive", &naive)] {
            // The level the service itself went to once the forced level was released.
            let after = series
                .windows
                .iter()
                .filter(|w| w.t_s >= window.as_secs_f64())
                .filter_map(|w| w.shed_level)
                .max();
            report.headline.insert(
                format!("max_shed_level_after_release_{kind}"),
                after.map(f64::from),
            );
        }
        report.notes.extend(storm_verdict(&well_behaved, &naive));
        for series in [&well_behaved, &naive] {
            if series.stats.client_overflow > 0 {
                report.notes.push(format!(
                    "{}: {} requests were not sent because --max-in-flight ({}) was reached \
                     (requests waiting to retry hold their slot); they count as failures",
                    series.label, series.stats.client_overflow, self.options.max_in_flight
                ));
            }
        }
        report.figures = Some(well_behaved.figures());
        report.reference = Some(naive.figures());
        report.series = vec![well_behaved, naive];
        Ok(report)
    }

    async fn baseline(&mut self) -> anyhow::Result<ScenarioReport> {
        let name = ScenarioName::Baseline;
        let mut report = ScenarioReport::new(name.as_str(), name.description());
        let keys = self.catalogue()?;
        let workload = self.workload(keys.clone(), Behaviour::WellBehaved);

        let service = self.start_service(name.as_str(), "service", &[]).await?;
        let capacity = self
            .ensure_capacity(name.as_str(), &mut report.notes)
            .await?;
        let sized = self.sized_capacity(&service, capacity).await?;
        report
            .notes
            .push(format!("load is 80 % of {}", sized.describe()));
        let capacity = sized.rps;
        report.notes.push(format!(
            "service: {}",
            self.warm(&service, keys.hottest(WARMED_KEYS)).await.note
        ));
        let plan = self.constant_plan(
            capacity * 0.8,
            self.timing.main,
            vec![phase("all", Duration::ZERO)],
            7,
        )?;
        let service_series = self
            .measure_service(&service, "service", "service", &workload, &plan, no_actions)
            .await?;
        service.stop().await;

        let naive_service = self
            .start_service(name.as_str(), "naive-profile", &naive_profile_env())
            .await
            .context(
                "the naive profile did not start (does this build accept REBATE__ENGINE__MODE=naive?)",
            )?;
        let naive_series = self
            .measure_service(
                &naive_service,
                "naive profile",
                "naive-profile",
                &workload,
                &plan,
                no_actions,
            )
            .await?;
        naive_service.stop().await;
        report.notes.push(format!(
            "naive profile env: {}",
            naive_profile_env()
                .iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect::<Vec<_>>()
                .join(" ")
        ));
        if naive_series
            .loads_started_per_request
            .is_some_and(|loads| loads > 0.0)
        {
            report.notes.push(
                "the naive profile still started cache loads: this build may not have \
                 REBATE__ENGINE__MODE=naive (check the naive-profile log)"
                    .into(),
            );
        }
        report.ratios.insert(
            "p99_service_vs_naive".into(),
            ratio(service_series.stats.p99_ms, naive_series.stats.p99_ms),
        );
        report.ratios.insert(
            "goodput_service_vs_naive".into(),
            ratio(
                Some(service_series.goodput_rps),
                Some(naive_series.goodput_rps),
            ),
        );
        report.ratios.insert(
            "upstream_calls_service_vs_naive".into(),
            ratio(
                service_series.upstream_calls_per_request,
                naive_series.upstream_calls_per_request,
            ),
        );
        report.ratios.insert(
            "store_loads_service_vs_naive".into(),
            ratio(
                service_series.store_loads_per_request,
                naive_series.store_loads_per_request,
            ),
        );
        report.figures = Some(service_series.figures());
        report.reference = Some(naive_series.figures());
        report.series = vec![service_series, naive_series];
        Ok(report)
    }
}

/// The burst target: no 5xx except deliberate 503s, P99 of admitted requests ≤ 50 ms.
/// How many of the catalogue's hottest keys a catalogue scenario warms before it measures.
const WARMED_KEYS: usize = 300;

const ADMITTED_P99_TARGET_MS: f64 = 50.0;

/// Admitted-attempt latency and non-503 5xx of the service (whole run and per phase) and of
/// the ceiling, as named figures.
fn admitted_headline(report: &mut ScenarioReport, service: &Series, ceiling: &Series) {
    let headline = &mut report.headline;
    headline.insert(
        "admitted_p50_ms_service".into(),
        service.stats.admitted_p50_ms,
    );
    headline.insert(
        "admitted_p99_ms_service".into(),
        service.stats.admitted_p99_ms,
    );
    headline.insert(
        "admitted_p99_ms_ceiling".into(),
        ceiling.stats.admitted_p99_ms,
    );
    headline.insert(
        "server_errors_non_503_service".into(),
        Some(service.stats.server_errors_non_503 as f64),
    );
    headline.insert(
        "received_503_service".into(),
        Some(service.stats.received_503 as f64),
    );
    if service.phases.len() > 1 {
        for phase in &service.phases {
            headline.insert(
                format!("admitted_p99_ms_service_{}", phase.name.replace(' ', "_")),
                phase.stats.admitted_p99_ms,
            );
        }
    }
}

/// Whether the service met the burst target, read off the figures.
fn burst_target_note(service: &Series) -> String {
    let errors = service.stats.server_errors_non_503;
    let p99 = service.stats.admitted_p99_ms;
    let met = errors == 0 && p99.is_some_and(|p99| p99 <= ADMITTED_P99_TARGET_MS);
    format!(
        "burst target (no 5xx but deliberate 503s, P99 of admitted attempts ≤ \
         {ADMITTED_P99_TARGET_MS:.0} ms): {} — {errors} 5xx other than 503, {} 503s, admitted \
         P99 {} ms over {} admitted attempts (logical P99 {} ms includes Retry-After waits)",
        if met { "met" } else { "not met" },
        service.stats.received_503,
        p99.map_or("–".to_owned(), |p99| format!("{p99:.2}")),
        service.stats.admitted_attempts,
        service
            .stats
            .p99_ms
            .map_or("–".to_owned(), |p99| format!("{p99:.2}")),
    )
}

/// The service's default level-3 `Retry-After` range (`resilience.shedding.retry_after_*_secs`).
const SHED_RETRY_AFTER: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(5));

/// retry-storm's drain: long enough that a well-behaved retry of a request shed at the end of
/// the window (after the longest Retry-After, its jitter and a second to be answered) is still
/// sent, so that neither kind loses a retry to the run's bound.
fn storm_drain(drain: Duration, main: Duration, window: Duration) -> Duration {
    let last_retry = window + SHED_RETRY_AFTER.1 + Duration::from_millis(100);
    drain.max((last_retry + Duration::from_secs(1)).saturating_sub(main))
}

/// retry-storm's named figures: success, attempts, 503s and admitted latency per kind.
fn storm_figures(report: &mut ScenarioReport, well_behaved: &Series, naive: &Series) {
    let sent_per_request = |series: &Series| {
        ratio(
            Some(series.total_sent as f64),
            Some(series.stats.logical_requests as f64),
        )
    };
    for (kind, series) in [("well_behaved", well_behaved), ("naive", naive)] {
        let headline = &mut report.headline;
        headline.insert(format!("success_{kind}"), series.stats.http_success_rate);
        headline.insert(
            format!("business_success_{kind}"),
            series.stats.business_success_rate,
        );
        headline.insert(format!("total_sent_{kind}"), Some(series.total_sent as f64));
        headline.insert(format!("sent_per_request_{kind}"), sent_per_request(series));
        headline.insert(
            format!("received_503_{kind}"),
            Some(series.stats.received_503 as f64),
        );
        headline.insert(
            format!("admitted_p99_ms_{kind}"),
            series.stats.admitted_p99_ms,
        );
        headline.insert(
            format!("server_errors_non_503_{kind}"),
            Some(series.stats.server_errors_non_503 as f64),
        );
    }
    report.ratios.insert(
        "total_sent_naive_vs_well_behaved".into(),
        ratio(
            Some(naive.total_sent as f64),
            Some(well_behaved.total_sent as f64),
        ),
    );
    report.ratios.insert(
        "received_503_naive_vs_well_behaved".into(),
        ratio(
            Some(naive.stats.received_503 as f64),
            Some(well_behaved.stats.received_503 as f64),
        ),
    );
    report.ratios.insert(
        "http_success_well_behaved_vs_naive".into(),
        ratio(
            well_behaved.stats.http_success_rate,
            naive.stats.http_success_rate,
        ),
    );
}

/// One note per generator-bound series, with every reason: the row says "generator-bound",
/// the note says why.
fn generator_bound_notes(series: &[Series]) -> Vec<String> {
    series
        .iter()
        .filter(|series| series.generator_bound)
        .map(|series| {
            format!(
                "{}: generator-bound — {}; its figures are the harness's limit, not the target's",
                series.label,
                series.generator_bound_reasons.join("; ")
            )
        })
        .collect()
}

/// Below this gap in HTTP success (points) and this ratio of attempts sent, the naive clients
/// are not said to have done worse.
const STORM_SUCCESS_GAP: f64 = 0.02;
const STORM_SENT_RATIO: f64 = 1.2;

/// What the retry storm showed, in words, whichever way it went.
fn storm_verdict(well_behaved: &Series, naive: &Series) -> Vec<String> {
    let percent =
        |rate: Option<f64>| rate.map_or("–".to_owned(), |rate| format!("{:.1} %", rate * 100.0));
    let (good, bad) = (
        well_behaved.stats.http_success_rate.unwrap_or(0.0),
        naive.stats.http_success_rate.unwrap_or(0.0),
    );
    let sent = ratio(
        Some(naive.total_sent as f64),
        Some(well_behaved.total_sent as f64),
    )
    .unwrap_or(f64::NAN);
    let worse_success = good - bad >= STORM_SUCCESS_GAP;
    let more_sent = sent >= STORM_SENT_RATIO;
    let mut notes = vec![format!(
        "per kind: HTTP success {} (well-behaved) vs {} (naive), business success {} vs {}; \
         HTTP attempts {} vs {} ({sent:.2}×); 503s received {} vs {}; logical P99 {} vs {} ms, \
         admitted-attempt P99 {} vs {} ms",
        percent(well_behaved.stats.http_success_rate),
        percent(naive.stats.http_success_rate),
        percent(well_behaved.stats.business_success_rate),
        percent(naive.stats.business_success_rate),
        well_behaved.total_sent,
        naive.total_sent,
        well_behaved.stats.received_503,
        naive.stats.received_503,
        number_or_dash(well_behaved.stats.p99_ms),
        number_or_dash(naive.stats.p99_ms),
        number_or_dash(well_behaved.stats.admitted_p99_ms),
        number_or_dash(naive.stats.admitted_p99_ms),
    )];
    notes.push(match (worse_success, more_sent) {
        (true, true) => format!(
            "the naive clients did worse: {:.1} points less HTTP success while sending {sent:.2}× \
             the attempts",
            (good - bad) * 100.0
        ),
        (true, false) => format!(
            "the naive clients got {:.1} points less HTTP success, but did not send clearly more \
             (attempts {sent:.2}×, threshold {STORM_SENT_RATIO}×)",
            (good - bad) * 100.0
        ),
        (false, true) => format!(
            "the naive clients sent {sent:.2}× the attempts but did not do clearly worse on \
             success (gap {:+.1} points, threshold {:.0}): the extra load is their cost here",
            (good - bad) * 100.0,
            STORM_SUCCESS_GAP * 100.0
        ),
        (false, false) => format!(
            "the naive clients did NOT do clearly worse in this run: HTTP success gap {:+.1} \
             points (threshold {:.0}), attempts {sent:.2}× (threshold {STORM_SENT_RATIO}×); \
             the forced window did not turn their retries into a storm",
            (good - bad) * 100.0,
            STORM_SUCCESS_GAP * 100.0
        ),
    });
    notes.push(
        "well-behaved clients pay for honouring Retry-After in logical latency (their wait is \
         in it); the admitted-attempt latency shows how fast the service answered what it took"
            .into(),
    );
    notes
}

fn number_or_dash(value: Option<f64>) -> String {
    value.map_or("–".to_owned(), |value| format!("{value:.2}"))
}

fn collect_degraded(
    joined: Option<Result<(ItemKey, bool), tokio::task::JoinError>>,
    pending: &mut Vec<ItemKey>,
) {
    if let Some(Ok((key, false))) = joined {
        pending.push(key);
    }
}

async fn no_actions(_start: Instant) -> anyhow::Result<()> {
    Ok(())
}

/// Share of deferrable requests in the deferrable scenario's mixed runs (unless
/// `--prefetch-ratio` gives one).
const DEFERRABLE_SHARE: f64 = 0.2;

/// The deferrable scenario's least bound on logical requests in flight: at 150 % with the
/// service at level 3, every refused request waits 1–5 s for each of its two retries, and with
/// the default bound (10,000) the waiting retries of one class took the room of the other's new
/// requests (client overflow: the harness's limit, not the service's). A request waiting for
/// its retry holds no connection; those on the wire are bounded by the client.
const DEFERRABLE_MAX_IN_FLIGHT: usize = 100_000;

/// The load profiles of the burst and steady scenarios, which the deferrable scenario runs too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Profile {
    Burst,
    Steady,
}

impl Profile {
    const ALL: [Self; 2] = [Self::Burst, Self::Steady];

    fn as_str(self) -> &'static str {
        match self {
            Self::Burst => "burst",
            Self::Steady => "steady",
        }
    }

    /// The phase whose figures are compared: the burst's 150 %, the steady run's whole.
    fn measured_phase(self) -> &'static str {
        match self {
            Self::Burst => "overload",
            Self::Steady => "all",
        }
    }

    /// The schedule at `capacity` (what 100 % is), where recording starts, and the phases.
    fn schedule(
        self,
        capacity: f64,
        timing: &Timing,
    ) -> anyhow::Result<(Schedule, Duration, Vec<Phase>)> {
        Ok(match self {
            Self::Burst => (
                Schedule::new(vec![
                    Segment::ramp(0.0, capacity * 1.5, timing.ramp),
                    Segment::constant(capacity * 1.5, timing.hold),
                    Segment::constant(capacity * 0.8, timing.recover),
                ])?,
                Duration::ZERO,
                vec![
                    phase("ramp", Duration::ZERO),
                    phase("overload", timing.ramp),
                    phase("recovery", timing.ramp + timing.hold),
                ],
            ),
            Self::Steady => (
                Schedule::new(vec![
                    Segment::constant(capacity * 0.8, timing.lead_in),
                    Segment::constant(capacity * 0.8, timing.main),
                ])?,
                timing.lead_in,
                vec![phase("all", Duration::ZERO)],
            ),
        })
    }
}

/// The traffic of one run of the deferrable scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mix {
    /// Only the fast requests of the mixed run: the deferrable ones removed.
    FastOnly,
    /// The mixed run's load, every request fast: the deferrable ones replaced.
    AllFast,
    /// Fast and deferrable requests.
    Mixed,
}

impl Mix {
    const ALL: [Self; 3] = [Self::FastOnly, Self::AllFast, Self::Mixed];

    /// The part of its service's log name (`deferrable-burst-mixed.log`).
    fn log_label(self) -> &'static str {
        match self {
            Self::FastOnly => "fast-only",
            Self::AllFast => "all-fast",
            Self::Mixed => "mixed",
        }
    }

    fn label(self, share: f64) -> String {
        let fast = (1.0 - share) * 100.0;
        match self {
            Self::FastOnly => format!("fast only ({fast:.0} % of the load)"),
            Self::AllFast => "all fast".to_owned(),
            Self::Mixed => format!("{fast:.0} % fast + {:.0} % deferrable", share * 100.0),
        }
    }

    /// The run's load as a share of the profile's.
    fn load_scale(self, share: f64) -> f64 {
        match self {
            Self::FastOnly => 1.0 - share,
            Self::AllFast | Self::Mixed => 1.0,
        }
    }

    fn deferrable_share(self, share: f64) -> f64 {
        match self {
            Self::FastOnly | Self::AllFast => 0.0,
            Self::Mixed => share,
        }
    }
}

/// The deferrable scenario's figures for one profile's three runs (in [`Mix::ALL`] order): the
/// fast class's P99 in the measured phase against both runs without deferrable traffic, and
/// the deferrable class's success, waits and refusals; the burst's are the report's rows.
fn deferrable_figures(report: &mut ScenarioReport, profile: Profile, runs: &[Series]) {
    let [fast_only, all_fast, mixed] = runs else {
        return;
    };
    let measured = profile.measured_phase();
    let key = |name: &str| format!("{}_{measured}_{name}", profile.as_str());
    let fast = mixed.phase_class_figures(measured, RequestClass::Page);
    let fast_only_figures = fast_only.phase_class_figures(measured, RequestClass::Page);
    let all_fast_figures = all_fast.phase_class_figures(measured, RequestClass::Page);
    // Logical P99 (retries and their Retry-After waits included: the client's experience) and
    // admitted P99 (the attempts the service did the work for: its own latency).
    type Pick = fn(&crate::report::Figures) -> Option<f64>;
    let figures: [(&str, Pick); 2] = [
        ("p99", |figures| figures.p99_ms),
        ("admitted_p99", |figures| figures.admitted_p99_ms),
    ];
    for (name, pick) in figures {
        let get = |figures: &Option<crate::report::Figures>| figures.as_ref().and_then(pick);
        let headline = &mut report.headline;
        headline.insert(key(&format!("fast_{name}_ms_mixed")), get(&fast));
        headline.insert(
            key(&format!("fast_{name}_ms_fast_only")),
            get(&fast_only_figures),
        );
        headline.insert(
            key(&format!("fast_{name}_ms_all_fast")),
            get(&all_fast_figures),
        );
        report.ratios.insert(
            key(&format!("fast_{name}_mixed_vs_fast_only")),
            ratio(get(&fast), get(&fast_only_figures)),
        );
        report.ratios.insert(
            key(&format!("fast_{name}_mixed_vs_all_fast")),
            ratio(get(&fast), get(&all_fast_figures)),
        );
    }
    let deferrable = mixed
        .phases
        .iter()
        .find(|phase| phase.name == measured)
        .and_then(|phase| phase.kinds.get(RequestClass::Prefetch.as_str()));
    if let Some(stats) = deferrable {
        let share = |count: u64| {
            (stats.logical_requests > 0).then(|| count as f64 / stats.logical_requests as f64)
        };
        let headline = &mut report.headline;
        headline.insert(key("deferrable_ok_share"), stats.http_success_rate);
        headline.insert(
            key("deferrable_ok_after_wait_share"),
            share(stats.ok_after_wait),
        );
        headline.insert(key("deferrable_wait_p50_ms"), stats.queue_wait_p50_ms);
        headline.insert(key("deferrable_wait_p99_ms"), stats.queue_wait_p99_ms);
        headline.insert(key("deferrable_wait_max_ms"), stats.queue_wait_max_ms);
        headline.insert(key("deferrable_p99_ms"), stats.p99_ms);
        headline.insert(
            key("deferrable_503_with_retry_after_share"),
            (stats.received_503 > 0)
                .then(|| stats.received_503_with_retry_after as f64 / stats.received_503 as f64),
        );
    }
    if let Some(queue) = mixed.admission_queues.get(RequestClass::Prefetch.as_str()) {
        let name = |field: &str| format!("{}_prefetch_queue_{field}", profile.as_str());
        report
            .headline
            .insert(name("peak"), Some(queue.peak_waiting as f64));
        report
            .headline
            .insert(name("bound"), Some(queue.max_waiters as f64));
        if queue.peak_waiting > queue.max_waiters {
            report.status = ScenarioStatus::Failed;
            report.notes.push(format!(
                "{}: the prefetch queue held {} waiters, past its bound of {}",
                profile.as_str(),
                queue.peak_waiting,
                queue.max_waiters
            ));
        }
    } else {
        report.notes.push(format!(
            "{}: the service's status showed no prefetch admission queue (shedding off, or \
             resilience.admission_wait.prefetch_max_waiters = 0)",
            profile.as_str()
        ));
    }
    if profile == Profile::Burst {
        report.figures = fast;
        report.reference = fast_only_figures;
    }
}

fn phase(name: &str, start: Duration) -> Phase {
    Phase {
        name: name.to_owned(),
        start,
    }
}

/// Figures = the `measured` phase, reference = the `reference` phase of the same series.
fn phase_comparison(report: &mut ScenarioReport, series: &Series, measured: &str, reference: &str) {
    let mut figures = series.phase_figures(measured);
    let mut baseline = series.phase_figures(reference);
    // Counters exist for the whole run only; show them on the measured row.
    if let Some(figures) = figures.as_mut() {
        figures.upstream_calls_per_request = series.upstream_calls_per_request;
        figures.upstream_items_per_request = series.upstream_items_per_request;
        figures.store_loads_per_request = series.store_loads_per_request;
    }
    if let Some(baseline) = baseline.as_mut() {
        baseline.total_sent = 0;
    }
    let pick = |figures: &Option<crate::report::Figures>,
                get: fn(&crate::report::Figures) -> Option<f64>| {
        figures.as_ref().and_then(get)
    };
    report.ratios.insert(
        format!("p99_{measured}_vs_{reference}").replace(' ', "_"),
        ratio(pick(&figures, |f| f.p99_ms), pick(&baseline, |f| f.p99_ms)),
    );
    report.ratios.insert(
        format!("business_success_{measured}_vs_{reference}").replace(' ', "_"),
        ratio(
            pick(&figures, |f| f.business_success_rate),
            pick(&baseline, |f| f.business_success_rate),
        ),
    );
    report.ratios.insert(
        format!("http_success_{measured}_vs_{reference}").replace(' ', "_"),
        ratio(
            pick(&figures, |f| f.http_success_rate),
            pick(&baseline, |f| f.http_success_rate),
        ),
    );
    report.figures = figures;
    report.reference = baseline;
}

/// Samples the service's shed level once per second (mid-window), `seconds` times.
async fn sample_shed_levels(
    service: &ServiceProcess,
    start: Instant,
    seconds: u32,
) -> Vec<ShedSample> {
    let mut samples = Vec::with_capacity(seconds as usize);
    for second in 0..seconds {
        let at = start + Duration::from_millis(u64::from(second) * 1000 + 500);
        tokio::time::sleep_until(at).await;
        let sample = tokio::time::timeout(Duration::from_millis(500), service.status())
            .await
            .ok()
            .and_then(Result::ok)
            .map(|status| ShedSample::from_status(&status))
            .unwrap_or_default();
        samples.push(sample);
    }
    samples
}

fn open_loop_input(
    label: &str,
    target_kind: &str,
    workload: &Workload,
    output: &RunOutput,
    readings: Option<(crate::service::Readings, crate::service::Readings)>,
    shed_samples: Vec<ShedSample>,
) -> SeriesInput {
    SeriesInput {
        label: label.to_owned(),
        target: target_kind.to_owned(),
        mode: "open-loop".to_owned(),
        behaviour: workload.behaviour.as_str().to_owned(),
        offered_rps: Some(output.offered_rps),
        peak_offered_rps: Some(output.peak_offered_rps),
        concurrency: None,
        duration_s: output.schedule_duration.as_secs_f64(),
        elapsed_s: output.elapsed.as_secs_f64(),
        total_sent: output.total_sent,
        unfinished: output.unfinished,
        not_sent: output.not_sent,
        key_draws: output.key_draws,
        hot_key_draws: output.hot_key_draws,
        dispatch: Some(output.dispatch),
        cpu: output.cpu.clone(),
        readings,
        shed_samples,
    }
}

fn probe_input(
    label: &str,
    target_kind: &str,
    output: &ProbeOutput,
    readings: Option<(crate::service::Readings, crate::service::Readings)>,
) -> SeriesInput {
    SeriesInput {
        label: label.to_owned(),
        target: target_kind.to_owned(),
        mode: "closed-loop".to_owned(),
        behaviour: "no retries".to_owned(),
        offered_rps: None,
        peak_offered_rps: None,
        concurrency: Some(output.concurrency),
        duration_s: output.measured.as_secs_f64(),
        elapsed_s: output.measured.as_secs_f64(),
        total_sent: output.total_sent,
        cpu: output.cpu.clone(),
        readings,
        ..SeriesInput::default()
    }
}

/// The host:port of a `mysql://` URL, refused unless it is loopback.
pub fn loopback_socket(url: &str) -> anyhow::Result<std::net::SocketAddr> {
    let parsed = reqwest::Url::parse(url).with_context(|| format!("malformed URL {url:?}"))?;
    let host = parsed.host_str().unwrap_or_default();
    let port = parsed.port().unwrap_or(3306);
    let address: std::net::IpAddr = if host.eq_ignore_ascii_case("localhost") {
        std::net::Ipv4Addr::LOCALHOST.into()
    } else {
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .with_context(|| format!("{url:?}: use an IP address or localhost"))?
    };
    if !address.is_loopback() {
        bail!("{url:?} is not on this machine's loopback; rebate-loadgen only uses local servers");
    }
    Ok((address, port).into())
}

fn one_line(report: &ScenarioReport) -> String {
    match &report.figures {
        Some(figures) => format!(
            "{} achieved {:.0} rps, P99 {} ms (admitted {} ms), HTTP ok {}, business ok {}",
            figures.label,
            figures.achieved_rps,
            figures.p99_ms.map_or("–".into(), |p99| format!("{p99:.2}")),
            figures
                .admitted_p99_ms
                .map_or("–".into(), |p99| format!("{p99:.2}")),
            figures
                .http_success_rate
                .map_or("–".into(), |rate| format!("{:.1} %", rate * 100.0)),
            figures
                .business_success_rate
                .map_or("–".into(), |rate| format!("{:.1} %", rate * 100.0)),
        ),
        None => report.notes.first().cloned().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_timing_is_about_a_tenth() {
        let full = Timing::new(false, None);
        let quick = Timing::new(true, None);
        assert_eq!(
            full.ramp,
            Duration::from_secs(5),
            "the burst ramps over 5 s"
        );
        assert!(quick.main * 8 <= full.main && quick.main * 12 >= full.main);
        assert_eq!(
            Timing::new(true, Some(7.5)).main,
            Duration::from_millis(7500)
        );
    }

    #[test]
    fn database_urls_must_be_loopback() {
        assert_eq!(
            loopback_socket("mysql://root@127.0.0.1:3306").unwrap(),
            "127.0.0.1:3306".parse().unwrap()
        );
        assert_eq!(
            loopback_socket("mysql://root@localhost").unwrap(),
            "127.0.0.1:3306".parse().unwrap()
        );
        assert!(loopback_socket("mysql://root@10.1.2.3:3306").is_err());
        assert!(loopback_socket("mysql://root@db.example.com:3306").is_err());
    }

    #[test]
    fn the_storm_window_sorts_well_behaved_from_naive_retries_and_the_drain_fits_them() {
        for (quick, window) in [(false, 3.0), (true, 1.5)] {
            let timing = Timing::new(quick, None);
            assert_eq!(timing.storm, Duration::from_secs_f64(window));
            // Naive retries at +0.5 and +1.0 s can land inside it; the load goes on after it for
            // at least as long as it lasted.
            assert!(timing.storm > Duration::from_secs(1), "{quick}");
            assert!(timing.storm <= timing.main / 2, "{quick}");
            // The latest well-behaved retry of a request shed in the window still fits the run.
            let drain = storm_drain(timing.drain, timing.main, timing.storm);
            assert!(drain >= timing.drain);
            assert!(
                timing.main + drain
                    > timing.storm + SHED_RETRY_AFTER.1 + Duration::from_millis(100),
                "{quick}: {drain:?}"
            );
        }
    }

    fn storm_series(label: &str, successes: u64, attempts_each: usize) -> Series {
        use crate::client::AttemptRecord;
        use crate::recorder::{Final, Recorder};
        let recorder = Recorder::new(Duration::from_secs(1), vec![phase("all", Duration::ZERO)]);
        for index in 0..100 {
            let status = if index < successes { 200 } else { 503 };
            let mut attempts = vec![
                AttemptRecord {
                    status: Ok(503),
                    latency: Duration::from_millis(1),
                    refusal: None,
                    retry_after: false,
                    queued: None,
                };
                attempts_each - 1
            ];
            attempts.push(AttemptRecord {
                status: Ok(status),
                latency: Duration::from_millis(2),
                refusal: None,
                retry_after: false,
                queued: None,
            });
            recorder.record(
                Duration::from_millis(index * 10),
                Duration::from_millis(1500),
                Final::Response {
                    status,
                    business_ok: status == 200,
                    shed_level: Some(3),
                },
                RequestClass::Page,
                1,
                &attempts,
            );
        }
        Series::build(
            SeriesInput {
                label: label.into(),
                duration_s: 1.0,
                total_sent: 100 * attempts_each as u64,
                ..SeriesInput::default()
            },
            &recorder.snapshot(),
        )
    }

    #[test]
    fn the_storm_report_says_plainly_when_naive_clients_do_not_do_worse() {
        let mut report = ScenarioReport::new("retry-storm", "…");
        let (well_behaved, naive) = (storm_series("wb", 99, 2), storm_series("naive", 99, 2));
        storm_figures(&mut report, &well_behaved, &naive);
        assert_eq!(report.headline["success_well_behaved"], Some(0.99));
        assert_eq!(report.headline["success_naive"], Some(0.99));
        assert_eq!(report.headline["received_503_naive"], Some(101.0));
        assert_eq!(report.ratios["total_sent_naive_vs_well_behaved"], Some(1.0));
        let verdict = storm_verdict(&well_behaved, &naive).join("\n");
        assert!(verdict.contains("did NOT do clearly worse"), "{verdict}");

        let naive = storm_series("naive", 80, 4);
        let verdict = storm_verdict(&well_behaved, &naive).join("\n");
        assert!(verdict.contains("the naive clients did worse"), "{verdict}");
        assert!(verdict.contains("2.00×"), "{verdict}");
    }

    #[test]
    fn a_generator_bound_series_gets_a_note_with_its_reasons_and_a_sound_one_none() {
        let overflowing = {
            use crate::client::AttemptRecord;
            use crate::recorder::{Final, Recorder};
            let recorder =
                Recorder::new(Duration::from_secs(1), vec![phase("all", Duration::ZERO)]);
            for index in 0..10 {
                let overflow = index < 4;
                recorder.record(
                    Duration::from_millis(index * 10),
                    Duration::from_millis(2),
                    if overflow {
                        Final::ClientOverflow
                    } else {
                        Final::Response {
                            status: 200,
                            business_ok: true,
                            shed_level: None,
                        }
                    },
                    RequestClass::Page,
                    1,
                    &(if overflow {
                        Vec::new()
                    } else {
                        vec![AttemptRecord {
                            status: Ok(200),
                            latency: Duration::from_millis(2),
                            refusal: None,
                            retry_after: false,
                            queued: None,
                        }]
                    }),
                );
            }
            Series::build(
                SeriesInput {
                    label: "service".into(),
                    mode: "open-loop".into(),
                    duration_s: 1.0,
                    dispatch: Some(crate::generator::DispatchHealth {
                        lag_p99_ms: 1.8,
                        lag_max_ms: 4.0,
                    }),
                    ..SeriesInput::default()
                },
                &recorder.snapshot(),
            )
        };
        let sound = storm_series("ceiling", 100, 1);
        assert!(!sound.generator_bound);
        let notes = generator_bound_notes(&[sound, overflowing]);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with("service: generator-bound — the dispatcher ran late (P99 1.80 ms"),
            "{notes:?}"
        );
        assert!(
            notes[0].contains("; 4 request(s) not sent because --max-in-flight was reached"),
            "{notes:?}"
        );
    }

    /// A burst-shaped series: in each of its three phases, `pages` page requests answered in
    /// `page_ms` and `prefetches` prefetches that queued 40 ms and were admitted (or, for every
    /// third, timed out: a 503 with Retry-After); the service's prefetch queue reached `peak`.
    fn deferrable_series(
        label: &str,
        pages: u64,
        page_ms: u64,
        prefetches: u64,
        peak: u64,
    ) -> Series {
        use crate::client::{AttemptRecord, QueueOutcome, Queued};
        use crate::recorder::{Final, Recorder};
        use crate::service::{QueueReading, Readings};
        let phases = vec![
            phase("ramp", Duration::ZERO),
            phase("overload", Duration::from_secs(1)),
            phase("recovery", Duration::from_secs(2)),
        ];
        let recorder = Recorder::new(Duration::from_secs(1), phases);
        for second in 0..3_u64 {
            let at = Duration::from_secs(second);
            for _ in 0..pages {
                let attempt = AttemptRecord {
                    status: Ok(200),
                    latency: Duration::from_millis(page_ms),
                    refusal: None,
                    retry_after: false,
                    queued: None,
                };
                let served = Final::Response {
                    status: 200,
                    business_ok: true,
                    shed_level: None,
                };
                let latency = Duration::from_millis(page_ms);
                recorder.record(at, latency, served, RequestClass::Page, 1, &[attempt]);
            }
            for index in 0..prefetches {
                let (status, outcome) = if index % 3 == 2 {
                    (503, QueueOutcome::TimedOut)
                } else {
                    (200, QueueOutcome::Admitted)
                };
                let attempt = AttemptRecord {
                    status: Ok(status),
                    latency: Duration::from_millis(42),
                    refusal: None,
                    retry_after: status == 503,
                    queued: Some(Queued {
                        outcome,
                        wait: Duration::from_millis(40),
                    }),
                };
                let answered = Final::Response {
                    status,
                    business_ok: status == 200,
                    shed_level: Some(3),
                };
                let latency = Duration::from_millis(42);
                recorder.record(at, latency, answered, RequestClass::Prefetch, 1, &[attempt]);
            }
        }
        let queue = |peak_waiting| {
            let mut queues = [None; 3];
            queues[RequestClass::Prefetch.index()] = Some(QueueReading {
                max_waiters: 256,
                peak_waiting,
                ..QueueReading::default()
            });
            Readings {
                admission_queues: queues,
                ..Readings::default()
            }
        };
        Series::build(
            SeriesInput {
                label: label.into(),
                duration_s: 3.0,
                readings: (prefetches > 0).then(|| (queue(0), queue(peak))),
                ..SeriesInput::default()
            },
            &recorder.snapshot(),
        )
    }

    #[test]
    fn the_deferrable_figures_compare_the_fast_class_at_the_peak_and_describe_the_waits() {
        let runs = [
            deferrable_series("fast only", 80, 10, 0, 0),
            deferrable_series("all fast", 100, 20, 0, 0),
            deferrable_series("mixed", 80, 11, 30, 200),
        ];
        let mut report = ScenarioReport::new("deferrable", "");
        deferrable_figures(&mut report, Profile::Burst, &runs);
        let figure = |name: &str| report.headline[name].unwrap();
        let near = |value: f64, expected: f64| (value - expected).abs() <= expected * 1e-2;
        assert!(near(figure("burst_overload_fast_p99_ms_mixed"), 11.0));
        assert!(near(figure("burst_overload_fast_p99_ms_fast_only"), 10.0));
        let vs_fast_only = report.ratios["burst_overload_fast_p99_mixed_vs_fast_only"].unwrap();
        let vs_all_fast = report.ratios["burst_overload_fast_p99_mixed_vs_all_fast"].unwrap();
        assert!(
            near(vs_fast_only, 1.1) && near(vs_all_fast, 0.55),
            "{report:?}"
        );
        // Two prefetches in three waited and were let in; every refusal carried Retry-After.
        assert!(near(
            figure("burst_overload_deferrable_ok_after_wait_share"),
            2.0 / 3.0
        ));
        assert!(near(figure("burst_overload_deferrable_wait_p99_ms"), 40.0));
        assert_eq!(
            figure("burst_overload_deferrable_503_with_retry_after_share"),
            1.0
        );
        assert_eq!(
            (
                figure("burst_prefetch_queue_peak"),
                figure("burst_prefetch_queue_bound")
            ),
            (200.0, 256.0)
        );
        assert_eq!(report.status, ScenarioStatus::Ok);
        let measured = report.figures.as_ref().unwrap();
        assert!(
            measured.label.ends_with("overload / page requests"),
            "{}",
            measured.label
        );

        // A queue past its bound fails the scenario (the service must never let that happen).
        let runs = [
            runs[0].clone(),
            runs[1].clone(),
            deferrable_series("mixed", 80, 11, 30, 300),
        ];
        let mut report = ScenarioReport::new("deferrable", "");
        deferrable_figures(&mut report, Profile::Burst, &runs);
        assert_eq!(report.status, ScenarioStatus::Failed);
        assert!(
            report
                .notes
                .iter()
                .any(|note| note.contains("past its bound of 256"))
        );
    }

    #[test]
    fn the_deferrable_runs_remove_replace_or_mix_the_deferrable_share() {
        let share = 0.2;
        let loads: Vec<(f64, f64)> = Mix::ALL
            .iter()
            .map(|mix| (mix.load_scale(share), mix.deferrable_share(share)))
            .collect();
        assert_eq!(loads, [(0.8, 0.0), (1.0, 0.0), (1.0, 0.2)]);
        let timing = Timing::new(false, None);
        let (schedule, _, phases) = Profile::Burst.schedule(1000.0, &timing).unwrap();
        assert_eq!(schedule.peak_rps(), 1500.0);
        assert!(
            phases
                .iter()
                .any(|phase| phase.name == Profile::Burst.measured_phase())
        );
        let (schedule, from, phases) = Profile::Steady.schedule(1000.0, &timing).unwrap();
        assert_eq!((schedule.peak_rps(), from), (800.0, timing.lead_in));
        assert_eq!(phases[0].name, Profile::Steady.measured_phase());
    }

    #[test]
    fn every_scenario_has_a_name_and_description() {
        for name in ScenarioName::ALL {
            assert!(!name.as_str().is_empty());
            assert!(name.description().len() > 40);
        }
    }
}
