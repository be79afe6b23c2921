//! The run's report: one JSON document (one object per scenario) and the same figures as
//! Markdown tables. Every scenario carries its reference series from the same run and the
//! ratios between them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::client::RequestClass;
use crate::generator::DispatchHealth;
use crate::generator_bound::{self, Evidence, LoopKind, RunCpu};
use crate::recorder::{Recorded, StatsSummary};
use crate::service::{QueueReading, Readings, ShedSample};

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub tool: &'static str,
    pub version: &'static str,
    pub started_at: String,
    /// The exact command line.
    pub command: String,
    pub machine: Machine,
    pub quick: bool,
    /// The capacity the load levels were derived from, and where it came from.
    pub capacity: Option<Capacity>,
    pub service_binary: String,
    pub scenarios: Vec<ScenarioReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub os: String,
    /// `/proc/loadavg` when the run started: other work on the machine skews every figure.
    pub loadavg_at_start: String,
    /// Worker threads of the generator's runtime, and of the ceiling's.
    pub generator_threads: usize,
    pub ceiling_threads: usize,
}

impl Machine {
    pub fn detect(generator_threads: usize, ceiling_threads: usize) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|line| line.strip_prefix("model name"))
            .map(|rest| rest.trim_start_matches([' ', '\t', ':']).trim().to_owned())
            .unwrap_or_else(|| "unknown".to_owned());
        let os = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|release| format!("{} {}", std::env::consts::OS, release.trim()))
            .unwrap_or_else(|_| std::env::consts::OS.to_owned());
        Self {
            nproc: std::thread::available_parallelism().map_or(1, usize::from),
            cpu_model,
            os,
            loadavg_at_start: std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            generator_threads,
            ceiling_threads,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Capacity {
    pub rps: f64,
    pub source: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScenarioStatus {
    Ok,
    Skipped,
    Failed,
}

/// The headline figures of one series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figures {
    pub label: String,
    pub offered_rps: Option<f64>,
    pub achieved_rps: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub p999_ms: Option<f64>,
    /// Latency of the attempts the service did the work for, each from its own due time
    /// (see [`StatsSummary::admitted_attempts`]).
    pub admitted_p50_ms: Option<f64>,
    pub admitted_p99_ms: Option<f64>,
    /// Attempts answered 5xx other than 503.
    pub server_errors_non_503: u64,
    pub http_success_rate: Option<f64>,
    pub business_success_rate: Option<f64>,
    pub upstream_calls_per_request: Option<f64>,
    pub upstream_items_per_request: Option<f64>,
    pub store_loads_per_request: Option<f64>,
    pub client_overflow: u64,
    pub total_sent: u64,
    #[serde(flatten)]
    pub generator: GeneratorFigures,
}

/// What the generator did during the run a row comes from: whether the row measured the target
/// or the harness. A phase or request class of a run has its run's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GeneratorFigures {
    /// Cores the harness's threads but the in-process ceiling's kept busy over the run.
    pub generator_cores: Option<f64>,
    /// `generator_cores` ÷ the machine's cores.
    pub generator_machine_share: Option<f64>,
    /// Cores the target (the service's process, or the ceiling's threads) used meanwhile.
    pub target_cores: Option<f64>,
    /// The open loop's dispatcher lateness (`None` for a closed loop).
    pub dispatch_lag_p99_ms: Option<f64>,
    pub dispatch_lag_max_ms: Option<f64>,
    /// The generator, not the target, was the limit ([`generator_bound::judge`]).
    pub generator_bound: bool,
}

/// One scenario: headline figures, the reference beside them, ratios, every series measured.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    pub name: String,
    pub description: String,
    pub status: ScenarioStatus,
    pub notes: Vec<String>,
    pub figures: Option<Figures>,
    pub reference: Option<Figures>,
    /// Named ratios of figures to their reference (e.g. `throughput_vs_ceiling`).
    pub ratios: BTreeMap<String, Option<f64>>,
    /// Other named figures of the scenario (e.g. `max_rps_ceiling`).
    pub headline: BTreeMap<String, Option<f64>>,
    pub series: Vec<Series>,
    pub charts: Vec<String>,
    /// Markdown tables of the scenario's own (e.g. two kinds of client side by side).
    pub tables: Vec<String>,
}

impl ScenarioReport {
    pub fn new(name: &str, description: &str) -> Self {
        Self {
            name: name.to_owned(),
            description: description.to_owned(),
            status: ScenarioStatus::Ok,
            notes: Vec::new(),
            figures: None,
            reference: None,
            ratios: BTreeMap::new(),
            headline: BTreeMap::new(),
            series: Vec::new(),
            charts: Vec::new(),
            tables: Vec::new(),
        }
    }

    pub fn skipped(name: &str, description: &str, why: String) -> Self {
        let mut report = Self::new(name, description);
        report.status = ScenarioStatus::Skipped;
        report.notes.push(why);
        report
    }

    pub fn series(&self, label: &str) -> Option<&Series> {
        self.series.iter().find(|series| series.label == label)
    }
}

/// Everything measured for one target under one load.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub label: String,
    /// `service`, `ceiling` or `naive-profile`.
    pub target: String,
    /// `open-loop` or `closed-loop`.
    pub mode: String,
    pub behaviour: String,
    /// Mean offered rate (open loop); `None` for a closed-loop probe.
    pub offered_rps: Option<f64>,
    pub peak_offered_rps: Option<f64>,
    pub concurrency: Option<usize>,
    pub duration_s: f64,
    pub elapsed_s: f64,
    /// HTTP answers (any status) to the requests scheduled in the run, per second of schedule.
    pub achieved_rps: f64,
    /// 2xx answers per second of schedule.
    pub goodput_rps: f64,
    #[serde(flatten)]
    pub stats: StatsSummary,
    /// HTTP requests sent, retries included.
    pub total_sent: u64,
    pub unfinished: u64,
    pub not_sent: u64,
    /// Share of key draws that fell in the top 10 % of keys (the Zipf check).
    pub hot_key_share: Option<f64>,
    /// Simulator calls (coupons + extras) ÷ logical requests.
    pub upstream_calls_per_request: Option<f64>,
    /// Item ids those calls carried ÷ logical requests (÷ calls: the batch factor).
    pub upstream_items_per_request: Option<f64>,
    /// Product + rate loads that reached the store (`source_loads`) ÷ logical requests.
    pub store_loads_per_request: Option<f64>,
    /// L1 misses of the four parts ÷ logical requests.
    pub part_misses_per_request: Option<f64>,
    /// Product + rate `loads_started` (cache loads begun) ÷ logical requests.
    pub loads_started_per_request: Option<f64>,
    /// The service's `resilience.shedding.capacity_rps` and whether shedding was on.
    pub service_shedding: Option<String>,
    pub dispatch: Option<DispatchHealth>,
    /// The generator's CPU over the measured run, and the target's
    /// ([`generator_bound::RunCpu`]).
    pub generator_cpu: Option<RunCpu>,
    /// Whether the generator, not the target, was the limit of this run; the reasons say why
    /// in words (empty when it was not).
    pub generator_bound: bool,
    pub generator_bound_reasons: Vec<String>,
    pub phases: Vec<PhaseReport>,
    /// Per request class (`page`, `list`, `prefetch`: [`RequestClass::as_str`]), every class
    /// present when more than one is; empty otherwise (the series' own figures are the class's).
    pub kinds: BTreeMap<String, StatsSummary>,
    /// The request classes present in the series ([`RequestClass::as_str`]).
    pub classes: Vec<String>,
    /// The service's admission queues over the run, by class (service targets whose classes
    /// may wait): outcomes between the readings before and after, the bound and the peak.
    pub admission_queues: BTreeMap<String, QueueReading>,
    pub windows: Vec<WindowReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PhaseReport {
    pub name: String,
    pub start_s: f64,
    pub duration_s: f64,
    /// HTTP answers to requests scheduled in this phase, per second of the phase.
    pub achieved_rps: f64,
    #[serde(flatten)]
    pub stats: StatsSummary,
    /// Per request class, as [`Series::kinds`]: every class of the series present in this
    /// phase when the series has more than one; empty otherwise.
    pub kinds: BTreeMap<String, StatsSummary>,
}

/// One window (1 s by scheduled time) of a series: the charts' data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowReport {
    pub t_s: f64,
    pub logical_requests: u64,
    pub ok_2xx: u64,
    pub business_ok: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Admitted attempts of the requests scheduled in this second, and their latency.
    pub admitted_attempts: u64,
    pub admitted_p50_ms: Option<f64>,
    pub admitted_p99_ms: Option<f64>,
    pub received_503: u64,
    pub server_errors_non_503: u64,
    /// The service's shed level: the status page sampled in this second, or the highest
    /// `x-shed-level` header seen on a `page` request (lists and prefetches are served above
    /// the measured level), whichever is higher.
    pub shed_level: Option<u8>,
    /// The shedder's load signal, concurrency limit and throughput as sampled in this second.
    pub shed_load: Option<f64>,
    pub shed_concurrency_limit: Option<f64>,
    pub shed_throughput_rps: Option<f64>,
}

/// What a series needs beyond the recorder's contents.
#[derive(Debug, Clone, Default)]
pub struct SeriesInput {
    pub label: String,
    pub target: String,
    pub mode: String,
    pub behaviour: String,
    pub offered_rps: Option<f64>,
    pub peak_offered_rps: Option<f64>,
    pub concurrency: Option<usize>,
    pub duration_s: f64,
    pub elapsed_s: f64,
    pub total_sent: u64,
    pub unfinished: u64,
    pub not_sent: u64,
    pub key_draws: u64,
    pub hot_key_draws: u64,
    pub dispatch: Option<DispatchHealth>,
    /// The generator's CPU over the measured run.
    pub cpu: Option<RunCpu>,
    /// Counters before and after (service targets only).
    pub readings: Option<(Readings, Readings)>,
    /// The status page's shedding section, sampled once per second.
    pub shed_samples: Vec<ShedSample>,
}

impl Series {
    pub fn build(input: SeriesInput, recorded: &Recorded) -> Self {
        let stats = recorded.total.summary();
        let responded: u64 = stats.by_status.values().sum();
        // Answers to the requests scheduled in the run ÷ the run's scheduled length: retries
        // and slow answers that end after the schedule still count for the run they belong to.
        let elapsed = input.duration_s.max(1e-9);
        let per_request = |delta: u64| {
            (stats.logical_requests > 0).then(|| delta as f64 / stats.logical_requests as f64)
        };
        let admission_queues = input
            .readings
            .map(|(before, after)| {
                RequestClass::ALL
                    .into_iter()
                    .filter_map(|class| {
                        let after = after.admission_queues[class.index()]?;
                        let before = before.admission_queues[class.index()].unwrap_or_default();
                        Some((class.as_str().to_owned(), before.until(&after)))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let (upstream, items, misses, store, started, shedding) = match input.readings {
            Some((before, after)) => (
                per_request(after.upstream_calls.saturating_sub(before.upstream_calls)),
                per_request(after.upstream_items.saturating_sub(before.upstream_items)),
                per_request(after.part_misses.saturating_sub(before.part_misses)),
                per_request(after.source_loads.saturating_sub(before.source_loads)),
                per_request(after.store_loads.saturating_sub(before.store_loads)),
                Some(match (after.shedding_enabled, after.capacity_rps) {
                    (Some(false), _) => "disabled".to_owned(),
                    (_, Some(capacity)) => format!("enabled, capacity_rps {capacity}"),
                    _ => "unknown".to_owned(),
                }),
            ),
            None => (None, None, None, None, None, None),
        };
        let window_s = recorded.window.as_secs_f64();
        let window_count = recorded.windows.len().max(input.shed_samples.len());
        let windows = (0..window_count)
            .map(|index| {
                let window = recorded.windows.get(index);
                let summary = window.map(|stats| stats.summary());
                let header = summary
                    .as_ref()
                    .and_then(|summary| summary.max_shed_level_seen);
                let sample = input.shed_samples.get(index).copied().unwrap_or_default();
                WindowReport {
                    t_s: index as f64 * window_s,
                    logical_requests: summary.as_ref().map_or(0, |s| s.logical_requests),
                    ok_2xx: summary.as_ref().map_or(0, |s| s.ok_2xx),
                    business_ok: summary.as_ref().map_or(0, |s| s.business_ok),
                    p50_ms: summary.as_ref().and_then(|s| s.p50_ms),
                    p99_ms: summary.as_ref().and_then(|s| s.p99_ms),
                    admitted_attempts: summary.as_ref().map_or(0, |s| s.admitted_attempts),
                    admitted_p50_ms: summary.as_ref().and_then(|s| s.admitted_p50_ms),
                    admitted_p99_ms: summary.as_ref().and_then(|s| s.admitted_p99_ms),
                    received_503: summary.as_ref().map_or(0, |s| s.received_503),
                    server_errors_non_503: summary.as_ref().map_or(0, |s| s.server_errors_non_503),
                    shed_level: header.max(sample.level),
                    shed_load: sample.load,
                    shed_concurrency_limit: sample.concurrency_limit,
                    shed_throughput_rps: sample.throughput_rps,
                }
            })
            .collect();
        let present: Vec<RequestClass> = RequestClass::ALL
            .into_iter()
            .filter(|class| recorded.class(*class).logical() > 0)
            .collect();
        let reasons = generator_bound::judge(&Evidence {
            kind: if input.mode == "closed-loop" {
                LoopKind::Closed
            } else {
                LoopKind::Open
            },
            cpu: input.cpu.as_ref(),
            dispatch: input.dispatch,
            client_overflow: stats.client_overflow,
            not_sent: input.not_sent,
        });
        let kinds = if present.len() > 1 {
            present
                .iter()
                .map(|class| (class.as_str().to_owned(), recorded.class(*class).summary()))
                .collect()
        } else {
            BTreeMap::new()
        };
        Self {
            label: input.label,
            target: input.target,
            mode: input.mode,
            behaviour: input.behaviour,
            offered_rps: input.offered_rps,
            peak_offered_rps: input.peak_offered_rps,
            concurrency: input.concurrency,
            duration_s: input.duration_s,
            elapsed_s: input.elapsed_s,
            achieved_rps: responded as f64 / elapsed,
            goodput_rps: stats.ok_2xx as f64 / elapsed,
            total_sent: input.total_sent,
            unfinished: input.unfinished,
            not_sent: input.not_sent,
            hot_key_share: (input.key_draws > 0)
                .then(|| input.hot_key_draws as f64 / input.key_draws as f64),
            upstream_calls_per_request: upstream,
            upstream_items_per_request: items,
            store_loads_per_request: store,
            part_misses_per_request: misses,
            loads_started_per_request: started,
            service_shedding: shedding,
            dispatch: input.dispatch,
            generator_cpu: input.cpu,
            generator_bound: !reasons.is_empty(),
            generator_bound_reasons: reasons.iter().map(ToString::to_string).collect(),
            phases: recorded
                .phases
                .iter()
                .enumerate()
                .filter(|(_, (_, stats))| stats.logical() > 0)
                .map(|(index, (phase, stats))| {
                    let start_s = phase.start.as_secs_f64();
                    let end_s = recorded
                        .phases
                        .get(index + 1)
                        .map_or(input.duration_s, |(next, _)| next.start.as_secs_f64());
                    let duration_s = (end_s - start_s).max(1e-9);
                    let summary = stats.summary();
                    let responded: u64 = summary.by_status.values().sum();
                    let kinds = if present.len() > 1 {
                        present
                            .iter()
                            .filter_map(|class| {
                                let stats = recorded.phase_class(index, *class)?;
                                (stats.logical() > 0)
                                    .then(|| (class.as_str().to_owned(), stats.summary()))
                            })
                            .collect()
                    } else {
                        BTreeMap::new()
                    };
                    PhaseReport {
                        name: phase.name.clone(),
                        start_s,
                        duration_s,
                        achieved_rps: responded as f64 / duration_s,
                        stats: summary,
                        kinds,
                    }
                })
                .collect(),
            kinds,
            classes: present
                .iter()
                .map(|class| class.as_str().to_owned())
                .collect(),
            admission_queues,
            windows,
            stats,
        }
    }

    pub fn figures(&self) -> Figures {
        Figures {
            label: self.label.clone(),
            offered_rps: self.offered_rps,
            achieved_rps: self.achieved_rps,
            p50_ms: self.stats.p50_ms,
            p99_ms: self.stats.p99_ms,
            p999_ms: self.stats.p999_ms,
            admitted_p50_ms: self.stats.admitted_p50_ms,
            admitted_p99_ms: self.stats.admitted_p99_ms,
            server_errors_non_503: self.stats.server_errors_non_503,
            http_success_rate: self.stats.http_success_rate,
            business_success_rate: self.stats.business_success_rate,
            upstream_calls_per_request: self.upstream_calls_per_request,
            upstream_items_per_request: self.upstream_items_per_request,
            store_loads_per_request: self.store_loads_per_request,
            client_overflow: self.stats.client_overflow,
            total_sent: self.total_sent,
            generator: self.generator_figures(),
        }
    }

    /// The generator's figures of this run, for its rows.
    pub fn generator_figures(&self) -> GeneratorFigures {
        let cpu = self.generator_cpu.as_ref();
        GeneratorFigures {
            generator_cores: cpu.map(|cpu| cpu.generator_cores),
            generator_machine_share: cpu.map(|cpu| cpu.generator_machine_share),
            target_cores: cpu.and_then(|cpu| cpu.target_cores),
            dispatch_lag_p99_ms: self.dispatch.map(|dispatch| dispatch.lag_p99_ms),
            dispatch_lag_max_ms: self.dispatch.map(|dispatch| dispatch.lag_max_ms),
            generator_bound: self.generator_bound,
        }
    }

    /// The figures of one request class of a series that has more than one.
    pub fn class_figures(&self, class: RequestClass) -> Option<Figures> {
        let stats = self.kinds.get(class.as_str())?;
        let seconds = self.elapsed_s.max(self.duration_s);
        Some(self.stats_figures(
            format!("{} / {} requests", self.label, class.as_str()),
            stats,
            seconds,
        ))
    }

    /// The figures of one request class in one phase; in a series of one class, that class's
    /// are the phase's own.
    pub fn phase_class_figures(&self, phase: &str, class: RequestClass) -> Option<Figures> {
        let phase = self
            .phases
            .iter()
            .find(|candidate| candidate.name == phase)?;
        let stats = match phase.kinds.get(class.as_str()) {
            Some(stats) => stats,
            None if self.classes == [class.as_str()] => &phase.stats,
            None => return None,
        };
        Some(self.stats_figures(
            format!(
                "{} / {} / {} requests",
                self.label,
                phase.name,
                class.as_str()
            ),
            stats,
            phase.duration_s,
        ))
    }

    /// `stats` (a slice of this series `seconds` long) as a row of figures.
    fn stats_figures(&self, label: String, stats: &StatsSummary, seconds: f64) -> Figures {
        Figures {
            label,
            offered_rps: None,
            achieved_rps: stats.logical_requests as f64 / seconds.max(1e-9),
            p50_ms: stats.p50_ms,
            p99_ms: stats.p99_ms,
            p999_ms: stats.p999_ms,
            admitted_p50_ms: stats.admitted_p50_ms,
            admitted_p99_ms: stats.admitted_p99_ms,
            server_errors_non_503: stats.server_errors_non_503,
            http_success_rate: stats.http_success_rate,
            business_success_rate: stats.business_success_rate,
            upstream_calls_per_request: None,
            upstream_items_per_request: None,
            store_loads_per_request: None,
            client_overflow: stats.client_overflow,
            total_sent: 0,
            generator: self.generator_figures(),
        }
    }

    /// The figures of one phase of this series (same counters, phase-local latencies).
    pub fn phase_figures(&self, phase: &str) -> Option<Figures> {
        let phase = self
            .phases
            .iter()
            .find(|candidate| candidate.name == phase)?;
        Some(Figures {
            label: format!("{} / {}", self.label, phase.name),
            offered_rps: self.offered_rps,
            achieved_rps: phase.achieved_rps,
            p50_ms: phase.stats.p50_ms,
            p99_ms: phase.stats.p99_ms,
            p999_ms: phase.stats.p999_ms,
            admitted_p50_ms: phase.stats.admitted_p50_ms,
            admitted_p99_ms: phase.stats.admitted_p99_ms,
            server_errors_non_503: phase.stats.server_errors_non_503,
            http_success_rate: phase.stats.http_success_rate,
            business_success_rate: phase.stats.business_success_rate,
            upstream_calls_per_request: None,
            upstream_items_per_request: None,
            store_loads_per_request: None,
            client_overflow: phase.stats.client_overflow,
            total_sent: self.total_sent,
            generator: self.generator_figures(),
        })
    }
}

/// `numerator ÷ denominator` when both exist and the denominator is not 0.
pub fn ratio(numerator: Option<f64>, denominator: Option<f64>) -> Option<f64> {
    match (numerator, denominator) {
        (Some(top), Some(bottom)) if bottom != 0.0 => Some(top / bottom),
        _ => None,
    }
}

/// Writes `report.json` and `report.md` into `dir`.
pub fn write(report: &RunReport, dir: &Path) -> anyhow::Result<()> {
    write_files(report, &markdown(report), dir)
}

/// Writes any report as `report.json` and its Markdown rendering as `report.md` into `dir`
/// (the run, chaos and soak reports alike).
pub fn write_files(
    report: &impl serde::Serialize,
    markdown: &str,
    dir: &Path,
) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(report)?;
    std::fs::write(dir.join("report.json"), json)
        .with_context(|| format!("writing {}", dir.join("report.json").display()))?;
    std::fs::write(dir.join("report.md"), markdown)
        .with_context(|| format!("writing {}", dir.join("report.md").display()))?;
    Ok(())
}

fn number(value: Option<f64>, decimals: usize) -> String {
    match value {
        Some(value) if value.is_finite() => format!("{value:.decimals$}"),
        _ => "–".to_owned(),
    }
}

fn percent(value: Option<f64>) -> String {
    match value {
        Some(value) if value.is_finite() => format!("{:.1} %", value * 100.0),
        _ => "–".to_owned(),
    }
}

/// Cores and their share of the machine: `0.62 (31.0 %)`.
fn cores_cell(cores: Option<f64>, machine_share: Option<f64>) -> String {
    match (cores, machine_share) {
        (Some(cores), Some(share)) => format!("{cores:.2} ({})", percent(Some(share))),
        (cores, _) => number(cores, 2),
    }
}

/// `P99 / max` of the dispatcher's lateness, `–` for a closed loop.
fn lag_cell(p99_ms: Option<f64>, max_ms: Option<f64>) -> String {
    match (p99_ms, max_ms) {
        (Some(p99), Some(max)) => format!("{p99:.2} / {max:.2}"),
        _ => "–".to_owned(),
    }
}

/// The generator's cores with its workers' in brackets, busiest first: `1.21 (0.63, 0.55)`.
fn generator_cores_cell(cpu: Option<&RunCpu>) -> String {
    let Some(cpu) = cpu else {
        return "–".to_owned();
    };
    if cpu.worker_cores_each.is_empty() {
        return format!("{:.2}", cpu.generator_cores);
    }
    let each: Vec<String> = cpu
        .worker_cores_each
        .iter()
        .map(|cores| format!("{cores:.2}"))
        .collect();
    format!("{:.2} ({})", cpu.generator_cores, each.join(", "))
}

/// `generator-bound`, `no`, or `–` when nothing about the generator was measured.
fn bound_cell(figures: &GeneratorFigures) -> &'static str {
    if figures.generator_bound {
        "generator-bound"
    } else if figures.generator_cores.is_some() || figures.dispatch_lag_p99_ms.is_some() {
        "no"
    } else {
        "–"
    }
}

fn figures_row(scenario: &str, figures: &Figures, role: &str) -> String {
    let generator = &figures.generator;
    format!(
        "| {scenario} | {} ({role}) | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
        figures.label,
        number(figures.offered_rps, 0),
        number(Some(figures.achieved_rps), 0),
        number(figures.p50_ms, 2),
        number(figures.p99_ms, 2),
        number(figures.p999_ms, 2),
        number(figures.admitted_p99_ms, 2),
        figures.server_errors_non_503,
        percent(figures.http_success_rate),
        percent(figures.business_success_rate),
        number(figures.upstream_calls_per_request, 3),
        number(figures.upstream_items_per_request, 3),
        number(figures.store_loads_per_request, 3),
        figures.client_overflow,
        figures.total_sent,
        cores_cell(generator.generator_cores, generator.generator_machine_share),
        number(generator.target_cores, 2),
        lag_cell(generator.dispatch_lag_p99_ms, generator.dispatch_lag_max_ms),
        bound_cell(generator),
    )
}

const FIGURES_HEADER: &str = "| scenario | series | offered rps | achieved rps | P50 ms | P99 ms | P99.9 ms | admitted P99 ms | 5xx ≠ 503 | HTTP ok | business ok | upstream calls/req | upstream items/req | store loads/req | client overflow | sent (incl. retries) | generator cores (of machine) | target cores | dispatch lag P99 / max ms | generator-bound? |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n";

/// Under the summary: what the generator columns mean and when a row is generator-bound.
fn generator_legend() -> String {
    format!(
        "Generator cores: CPU seconds of the harness's threads but the in-process ceiling's ÷ \
         the run's wall seconds (1.00 = one core busy), and as a share of the machine; target \
         cores: the same for the service's process or the ceiling's threads. A row is \
         **generator-bound** when the generator's worker threads used ≥ {:.0} % of the cores \
         they may use (one each, at most the machine's), when a closed loop's generator used \
         more CPU than its target while the two kept ≥ {:.0} % of the machine busy, or when an \
         open loop's dispatcher ran more than {} ms late at P99, hit --max-in-flight (client \
         overflow) or left requests unsent: its figures are then the harness's, not the \
         target's. A phase or request-class row has its whole run's generator figures.\n",
        generator_bound::SATURATED_SHARE * 100.0,
        generator_bound::BUSY_MACHINE_SHARE * 100.0,
        generator_bound::DISPATCH_LAG_P99_LIMIT_MS,
    )
}

/// The report as Markdown.
pub fn markdown(report: &RunReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# rebate-loadgen report\n");
    let _ = writeln!(out, "- started: {}", report.started_at);
    let _ = writeln!(
        out,
        "- machine: {} CPUs (`nproc`), {}, {}; load average at start: {}",
        report.machine.nproc,
        report.machine.cpu_model,
        report.machine.os,
        report.machine.loadavg_at_start
    );
    let _ = writeln!(
        out,
        "- generator runtime: {} worker thread(s) (`{}`; the open loop's dispatcher runs on the main thread); ceiling runtime: {} worker thread(s) (`{}`, in the harness's process); the service runs as its own process",
        report.machine.generator_threads,
        crate::generator::GENERATOR_WORKER_THREAD,
        report.machine.ceiling_threads,
        crate::ceiling::CEILING_THREAD
    );
    let _ = writeln!(out, "- service binary: `{}`", report.service_binary);
    match &report.capacity {
        Some(capacity) => {
            let _ = writeln!(
                out,
                "- capacity: {:.0} rps ({})",
                capacity.rps, capacity.source
            );
        }
        None => {
            let _ = writeln!(out, "- capacity: not needed by these scenarios");
        }
    }
    let _ = writeln!(out, "- quick: {}", report.quick);
    let _ = writeln!(out, "\nCommand:\n\n```sh\n{}\n```\n", report.command);

    let _ = writeln!(out, "## Summary\n");
    out.push_str(FIGURES_HEADER);
    for scenario in &report.scenarios {
        match (&scenario.figures, scenario.status) {
            (Some(figures), _) => {
                out.push_str(&figures_row(&scenario.name, figures, "measured"));
                if let Some(reference) = &scenario.reference {
                    out.push_str(&figures_row(&scenario.name, reference, "reference"));
                }
            }
            (None, status) => {
                let _ = writeln!(
                    out,
                    "| {} | {:?}: {} | | | | | | | | | | | | | | | | | |",
                    scenario.name,
                    status,
                    scenario
                        .notes
                        .first()
                        .map_or("", String::as_str)
                        .replace('|', "/")
                );
            }
        }
    }

    let _ = write!(out, "\n{}", generator_legend());

    for scenario in &report.scenarios {
        let _ = writeln!(out, "\n## {}\n", scenario.name);
        let _ = writeln!(out, "{}\n", scenario.description);
        if scenario.status != ScenarioStatus::Ok {
            let _ = writeln!(out, "**{:?}**\n", scenario.status);
        }
        for note in &scenario.notes {
            let _ = writeln!(out, "- {note}");
        }
        if !scenario.notes.is_empty() {
            out.push('\n');
        }
        for table in &scenario.tables {
            let _ = writeln!(out, "{table}");
        }
        if !scenario.headline.is_empty() || !scenario.ratios.is_empty() {
            let _ = writeln!(out, "| figure | value |\n| --- | ---: |");
            for (name, value) in &scenario.headline {
                let _ = writeln!(out, "| {name} | {} |", number(*value, 2));
            }
            for (name, value) in &scenario.ratios {
                let _ = writeln!(out, "| ratio: {name} | {} |", number(*value, 3));
            }
            out.push('\n');
        }
        if !scenario.series.is_empty() {
            let _ = writeln!(
                out,
                "| series | mode | offered rps | achieved rps | logical | P50 ms | P99 ms | P99.9 ms | max ms | admitted | admitted P50 ms | admitted P99 ms | 503 received | 5xx ≠ 503 | HTTP ok | business ok | upstream/req | upstream items/req | store/req | L1 misses/req | overflow | unfinished | sent | hot-key share | dispatch lag P99 ms | dispatch lag max ms | generator cores (workers) | generator of machine | target cores | generator-bound? | shedding |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"
            );
            for series in &scenario.series {
                let mode = match series.concurrency {
                    Some(concurrency) => format!("{} ×{concurrency}", series.mode),
                    None => format!("{}, {}", series.mode, series.behaviour),
                };
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    series.label,
                    mode,
                    number(series.offered_rps, 0),
                    number(Some(series.achieved_rps), 0),
                    series.stats.logical_requests,
                    number(series.stats.p50_ms, 2),
                    number(series.stats.p99_ms, 2),
                    number(series.stats.p999_ms, 2),
                    number(series.stats.max_ms, 1),
                    series.stats.admitted_attempts,
                    number(series.stats.admitted_p50_ms, 2),
                    number(series.stats.admitted_p99_ms, 2),
                    series.stats.received_503,
                    series.stats.server_errors_non_503,
                    percent(series.stats.http_success_rate),
                    percent(series.stats.business_success_rate),
                    number(series.upstream_calls_per_request, 3),
                    number(series.upstream_items_per_request, 3),
                    number(series.store_loads_per_request, 3),
                    number(series.part_misses_per_request, 4),
                    series.stats.client_overflow,
                    series.unfinished,
                    series.total_sent,
                    percent(series.hot_key_share),
                    number(series.dispatch.map(|dispatch| dispatch.lag_p99_ms), 2),
                    number(series.dispatch.map(|dispatch| dispatch.lag_max_ms), 2),
                    generator_cores_cell(series.generator_cpu.as_ref()),
                    percent(
                        series
                            .generator_cpu
                            .as_ref()
                            .map(|cpu| cpu.generator_machine_share)
                    ),
                    number(
                        series
                            .generator_cpu
                            .as_ref()
                            .and_then(|cpu| cpu.target_cores),
                        2
                    ),
                    bound_cell(&series.generator_figures()),
                    series.service_shedding.as_deref().unwrap_or("–"),
                );
            }
            out.push('\n');
        }
        let phased: Vec<&Series> = scenario
            .series
            .iter()
            .filter(|series| series.phases.len() > 1)
            .collect();
        if !phased.is_empty() {
            let _ = writeln!(
                out,
                "| series | phase | from s | logical | P50 ms | P99 ms | max ms | admitted P50 ms | admitted P99 ms | sent | 503 received | 5xx ≠ 503 | HTTP ok | business ok | final statuses |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
            );
            for series in phased {
                for phase in &series.phases {
                    let statuses: Vec<String> = phase
                        .stats
                        .by_status
                        .iter()
                        .map(|(status, count)| format!("{status}×{count}"))
                        .collect();
                    let _ = writeln!(
                        out,
                        "| {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                        series.label,
                        phase.name,
                        phase.start_s,
                        phase.stats.logical_requests,
                        number(phase.stats.p50_ms, 2),
                        number(phase.stats.p99_ms, 2),
                        number(phase.stats.max_ms, 1),
                        number(phase.stats.admitted_p50_ms, 2),
                        number(phase.stats.admitted_p99_ms, 2),
                        phase.stats.attempts,
                        phase.stats.received_503,
                        phase.stats.server_errors_non_503,
                        percent(phase.stats.http_success_rate),
                        percent(phase.stats.business_success_rate),
                        statuses.join(" "),
                    );
                }
            }
            out.push('\n');
        }
        for series in &scenario.series {
            if series.kinds.is_empty() {
                continue;
            }
            let _ = writeln!(out, "{} by request class:\n", series.label);
            let _ = writeln!(
                out,
                "| class | phase | logical | items | HTTP ok | business ok | 503 received | P50 ms | P99 ms | admitted P99 ms | max x-shed-level |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
            );
            for (phase, class, stats) in class_rows(series) {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    class.as_str(),
                    phase,
                    stats.logical_requests,
                    stats.items,
                    percent(stats.http_success_rate),
                    percent(stats.business_success_rate),
                    stats.received_503,
                    number(stats.p50_ms, 2),
                    number(stats.p99_ms, 2),
                    number(stats.admitted_p99_ms, 2),
                    stats
                        .max_shed_level_seen
                        .map_or("–".to_owned(), |level| level.to_string()),
                );
            }
            out.push('\n');
            admission_table(&mut out, series);
        }
        for chart in &scenario.charts {
            let _ = writeln!(out, "![{chart}]({chart})");
        }
    }
    out
}

/// The per-class rows of a series with more than one class: each class over the whole run,
/// then (when the series has phases) each class in each phase.
fn class_rows(series: &Series) -> Vec<(&str, RequestClass, &StatsSummary)> {
    let mut slices = vec![("whole run", &series.kinds)];
    if series.phases.len() > 1 {
        slices.extend(
            series
                .phases
                .iter()
                .map(|phase| (phase.name.as_str(), &phase.kinds)),
        );
    }
    slices
        .into_iter()
        .flat_map(|(phase, kinds)| {
            RequestClass::ALL.into_iter().filter_map(move |class| {
                kinds.get(class.as_str()).map(|stats| (phase, class, stats))
            })
        })
        .collect()
}

/// The admission wait of a series with more than one class, when anything queued or a class
/// may wait: per class (and phase), how many succeeded after waiting, how the queued attempts'
/// waits ended and how long they were (the service's `Server-Timing`), the 503s and how many
/// carried `Retry-After`; and the service's queue over the run (its peak against its bound,
/// its outcome counters).
fn admission_table(out: &mut String, series: &Series) {
    let queued = series
        .kinds
        .values()
        .any(|stats| stats.queued_admitted + stats.queued_timed_out + stats.queued_full > 0);
    if !queued && series.admission_queues.is_empty() {
        return;
    }
    let _ = writeln!(out, "{} admission wait by class:\n", series.label);
    let _ = writeln!(
        out,
        "| class | phase | logical | HTTP ok | ok after waiting | queued: admitted / timed out / full | wait P50 / P90 / P99 / max ms | 503 (with Retry-After) |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for (phase, class, stats) in class_rows(series) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} / {} / {} | {} / {} / {} / {} | {} ({}) |",
            class.as_str(),
            phase,
            stats.logical_requests,
            percent(stats.http_success_rate),
            stats.ok_after_wait,
            stats.queued_admitted,
            stats.queued_timed_out,
            stats.queued_full,
            number(stats.queue_wait_p50_ms, 1),
            number(stats.queue_wait_p90_ms, 1),
            number(stats.queue_wait_p99_ms, 1),
            number(stats.queue_wait_max_ms, 1),
            stats.received_503,
            stats.received_503_with_retry_after,
        );
    }
    out.push('\n');
    if series.admission_queues.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "{}: the service's admission queues over the run (status page, before and after):\n\n| class | peak waiting / bound | admitted | timed out | full | cancelled |\n| --- | ---: | ---: | ---: | ---: | ---: |",
        series.label
    );
    for (class, queue) in &series.admission_queues {
        let _ = writeln!(
            out,
            "| {class} | {} / {} | {} | {} | {} | {} |",
            queue.peak_waiting,
            queue.max_waiters,
            queue.admitted,
            queue.timed_out,
            queue.refused_full,
            queue.cancelled
        );
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::client::AttemptRecord;
    use crate::recorder::{Final, Phase, Recorder};

    fn sample_series(label: &str, latency_ms: u64) -> Series {
        sample_series_with(label, latency_ms, |_| {})
    }

    /// As [`sample_series`], its input changed by `adjust` first.
    fn sample_series_with(
        label: &str,
        latency_ms: u64,
        adjust: impl FnOnce(&mut SeriesInput),
    ) -> Series {
        let recorder = Recorder::new(
            Duration::from_secs(1),
            vec![Phase {
                name: "all".into(),
                start: Duration::ZERO,
            }],
        );
        for index in 0..100_u64 {
            recorder.record(
                Duration::from_millis(index * 20),
                Duration::from_millis(latency_ms),
                Final::Response {
                    status: 200,
                    business_ok: index % 10 != 0,
                    shed_level: None,
                },
                RequestClass::Page,
                1,
                &[AttemptRecord {
                    status: Ok(200),
                    latency: Duration::from_millis(latency_ms),
                    refusal: None,
                    retry_after: false,
                    queued: None,
                }],
            );
        }
        let before = Readings {
            upstream_calls: 10,
            upstream_items: 10,
            part_misses: 0,
            store_loads: 4,
            source_loads: 4,
            shed_level: Some(0),
            capacity_rps: Some(5000),
            shedding_enabled: Some(true),
            admission_queues: [None; 3],
        };
        let after = Readings {
            upstream_calls: 60,
            upstream_items: 110,
            source_loads: 24,
            store_loads: 24,
            ..before
        };
        let mut input = SeriesInput {
            label: label.into(),
            target: "service".into(),
            mode: "open-loop".into(),
            behaviour: "well-behaved".into(),
            offered_rps: Some(50.0),
            peak_offered_rps: Some(50.0),
            duration_s: 2.0,
            elapsed_s: 2.0,
            total_sent: 100,
            key_draws: 100,
            hot_key_draws: 90,
            readings: Some((before, after)),
            shed_samples: [0, 1, 1]
                .map(|level| ShedSample {
                    level: Some(level),
                    ..ShedSample::default()
                })
                .to_vec(),
            ..SeriesInput::default()
        };
        adjust(&mut input);
        Series::build(input, &recorder.snapshot())
    }

    /// A run's CPU as [`generator_bound::RunCpu::between`] gives it, on a 2-core machine.
    fn run_cpu(workers: &[f64], generator: f64, target: f64) -> RunCpu {
        RunCpu {
            wall_s: 10.0,
            generator_cpu_s: generator * 10.0,
            generator_cores: generator,
            generator_machine_share: generator / 2.0,
            generator_workers: workers.len(),
            worker_cores: Some(workers.iter().sum()),
            worker_cores_each: workers.to_vec(),
            target_cores: Some(target),
            machine_cores: 2,
        }
    }

    #[test]
    fn every_row_says_what_the_generator_used_and_whether_it_was_the_limit() {
        // A closed loop on one saturated worker against the ceiling: generator-bound.
        let ceiling_max = sample_series_with("ceiling max", 1, |input| {
            input.target = "ceiling".into();
            input.mode = "closed-loop".into();
            input.concurrency = Some(64);
            input.offered_rps = None;
            input.cpu = Some(run_cpu(&[0.95], 0.98, 0.9));
        });
        // An open loop on two workers, on time, the service taking most of the machine.
        let service_half = sample_series_with("service @50%", 2, |input| {
            input.dispatch = Some(DispatchHealth {
                lag_p99_ms: 0.12,
                lag_max_ms: 0.5,
            });
            input.cpu = Some(run_cpu(&[0.22, 0.18], 0.45, 1.1));
        });
        // The same open loop, its dispatcher 2.4 ms late at P99.
        let service_late = sample_series_with("service late", 2, |input| {
            input.dispatch = Some(DispatchHealth {
                lag_p99_ms: 2.4,
                lag_max_ms: 9.0,
            });
            input.cpu = Some(run_cpu(&[0.22, 0.18], 0.45, 1.1));
        });
        // Nothing about the generator measured.
        let unmeasured = sample_series("unmeasured", 2);
        assert!(ceiling_max.generator_bound);
        assert!(!service_half.generator_bound && service_half.generator_bound_reasons.is_empty());
        assert!(service_late.generator_bound);
        assert!(!unmeasured.generator_bound);

        let mut hot_path = ScenarioReport::new("hot-path", "Closed loop, then open loop.");
        hot_path.figures = Some(service_half.figures());
        hot_path.reference = Some(ceiling_max.figures());
        hot_path.series = vec![ceiling_max, service_half, service_late, unmeasured];
        let report = run_report(vec![hot_path]);
        let text = markdown(&report);
        assert!(text.contains(
            "| generator cores (of machine) | target cores | dispatch lag P99 / max ms | generator-bound? |"
        ));
        let summary_row = |series: &str| {
            text.lines()
                .find(|line| line.starts_with(&format!("| hot-path | {series}")))
                .unwrap_or_else(|| panic!("no summary row for {series}:\n{text}"))
        };
        assert!(
            summary_row("service @50% (measured)")
                .ends_with("| 0.45 (22.5 %) | 1.10 | 0.12 / 0.50 | no |"),
            "{text}"
        );
        assert!(
            summary_row("ceiling max (reference)")
                .ends_with("| 0.98 (49.0 %) | 0.90 | – | generator-bound |"),
            "{text}"
        );
        assert!(text.contains("A row is **generator-bound** when"));
        // The series table: dispatch lag max, the workers one by one, the verdict.
        let series_row = |label: &str| {
            text.lines()
                .find(|line| line.starts_with(&format!("| {label} | ")))
                .unwrap_or_else(|| panic!("no series row for {label}:\n{text}"))
        };
        assert!(
            series_row("service @50%")
                .contains("| 0.12 | 0.50 | 0.45 (0.22, 0.18) | 22.5 % | 1.10 | no |"),
            "{text}"
        );
        assert!(
            series_row("ceiling max")
                .contains("| – | – | 0.98 (0.95) | 49.0 % | 0.90 | generator-bound |"),
            "{text}"
        );
        assert!(
            series_row("unmeasured").contains("| – | – | – | – | – | – |"),
            "{text}"
        );
        // The reasons, in the series' JSON; the verdict and the figures in every row's.
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        let scenario = &json["scenarios"][0];
        assert_eq!(scenario["reference"]["generator_bound"], true);
        assert_eq!(scenario["reference"]["generator_cores"], 0.98);
        assert_eq!(scenario["reference"]["target_cores"], 0.9);
        assert_eq!(
            scenario["reference"]["dispatch_lag_p99_ms"],
            serde_json::Value::Null
        );
        assert_eq!(scenario["figures"]["generator_bound"], false);
        assert_eq!(scenario["figures"]["generator_machine_share"], 0.225);
        assert_eq!(scenario["figures"]["dispatch_lag_max_ms"], 0.5);
        let ceiling = &scenario["series"][0];
        assert_eq!(ceiling["generator_cpu"]["worker_cores_each"][0], 0.95);
        let reasons = ceiling["generator_bound_reasons"].as_array().unwrap();
        assert_eq!(reasons.len(), 2, "{reasons:?}");
        assert!(
            reasons[0]
                .as_str()
                .unwrap()
                .contains("0.95 of the 1 core(s)")
        );
        assert!(
            reasons[1]
                .as_str()
                .unwrap()
                .contains("more CPU than its target")
        );
        let late = &scenario["series"][2];
        assert!(
            late["generator_bound_reasons"][0]
                .as_str()
                .unwrap()
                .contains("P99 2.40 ms, max 9.00 ms")
        );
        assert_eq!(
            scenario["series"][3]["generator_cpu"],
            serde_json::Value::Null
        );
    }

    #[test]
    fn a_phase_or_class_row_has_its_whole_runs_generator_figures() {
        let series = sample_series_with("service", 2, |input| {
            input.dispatch = Some(DispatchHealth {
                lag_p99_ms: 3.0,
                lag_max_ms: 7.0,
            });
            input.cpu = Some(run_cpu(&[0.3], 0.4, 1.2));
        });
        let whole = series.figures().generator;
        assert!(whole.generator_bound);
        assert_eq!(series.phase_figures("all").unwrap().generator, whole);
        let mixed = three_class_series();
        assert_eq!(
            mixed.class_figures(RequestClass::Page).unwrap().generator,
            mixed.figures().generator
        );
    }

    #[test]
    fn series_derives_rates_and_per_request_figures() {
        let series = sample_series("service", 4);
        assert_eq!(series.stats.logical_requests, 100);
        assert_eq!(series.achieved_rps, 50.0);
        assert_eq!(series.stats.business_success_rate, Some(0.9));
        assert_eq!(series.upstream_calls_per_request, Some(0.5));
        assert_eq!(series.store_loads_per_request, Some(0.2));
        assert_eq!(series.hot_key_share, Some(0.9));
        assert_eq!(
            series.windows.len(),
            3,
            "a sampled second without requests still shows"
        );
        assert_eq!(series.windows[1].shed_level, Some(1));
        assert!(series.kinds.is_empty(), "one class: no per-class figures");
        assert_eq!(
            series.service_shedding.as_deref(),
            Some("enabled, capacity_rps 5000")
        );
    }

    fn run_report(scenarios: Vec<ScenarioReport>) -> RunReport {
        RunReport {
            tool: "rebate-loadgen",
            version: "0.1.0",
            started_at: "2026-12-01T00:00:00Z".into(),
            command: "rebate-loadgen run --scenario steady --quick".into(),
            machine: Machine {
                nproc: 2,
                cpu_model: "Test CPU".into(),
                os: "linux".into(),
                loadavg_at_start: "0.00".into(),
                generator_threads: 1,
                ceiling_threads: 2,
            },
            quick: true,
            capacity: Some(Capacity {
                rps: 1000.0,
                source: "--capacity".into(),
            }),
            service_binary: "target/release/rebate-query".into(),
            scenarios,
        }
    }

    #[test]
    fn markdown_has_the_summary_table_with_reference_and_ratios() {
        let measured = sample_series("service", 2);
        let reference = sample_series("ceiling", 1);
        let mut scenario = ScenarioReport::new("steady", "80 % of capacity.");
        scenario.figures = Some(measured.figures());
        scenario.reference = Some(reference.figures());
        scenario.ratios.insert(
            "p99_vs_ceiling".into(),
            ratio(measured.stats.p99_ms, reference.stats.p99_ms),
        );
        scenario.series = vec![measured, reference];
        scenario.charts.push("steady-latency.svg".into());
        let report = run_report(vec![
            scenario,
            ScenarioReport::skipped("redis-outage", "…", "redis-server not found".into()),
        ]);
        let text = markdown(&report);
        assert!(text.contains("2 CPUs (`nproc`), Test CPU"));
        assert!(text.contains(
            "- generator runtime: 1 worker thread(s) (`loadgen-worker`; the open loop's dispatcher runs on the main thread); ceiling runtime: 2 worker thread(s) (`loadgen-ceiling`, in the harness's process)"
        ));
        assert!(text.contains("rebate-loadgen run --scenario steady --quick"));
        assert!(text.contains(
            "| steady | service (measured) | 50 | 50 | 2.00 | 2.00 | 2.00 | 2.00 | 0 | 100.0 % | 90.0 % | 0.500 | 1.000 | 0.200 | 0 | 100 |"
        ));
        assert!(text.contains("| steady | ceiling (reference) |"));
        assert!(text.contains(
            "| admitted | admitted P50 ms | admitted P99 ms | 503 received | 5xx ≠ 503 |"
        ));
        assert!(text.contains("| 2.0 | 100 | 2.00 | 2.00 | 0 | 0 | 100.0 % |"));
        assert!(text.contains("| ratio: p99_vs_ceiling | 2.000 |"));
        assert!(text.contains("| redis-outage | Skipped: redis-server not found |"));
        assert!(text.contains("![steady-latency.svg](steady-latency.svg)"));

        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        let steady = &json["scenarios"][0];
        assert_eq!(steady["status"], "ok");
        assert_eq!(steady["figures"]["p99_ms"], 2.0);
        assert_eq!(steady["reference"]["label"], "ceiling");
        assert_eq!(steady["ratios"]["p99_vs_ceiling"], 2.0);
        assert_eq!(steady["series"][0]["business_success_rate"], 0.9);
        assert_eq!(steady["figures"]["admitted_p99_ms"], 2.0);
        assert_eq!(steady["series"][0]["admitted_attempts"], 100);
        assert_eq!(steady["series"][0]["admitted_p50_ms"], 2.0);
        assert_eq!(steady["series"][0]["admitted_p99_ms"], 2.0);
        assert_eq!(steady["series"][0]["server_errors_non_503"], 0);
        assert_eq!(steady["series"][0]["windows"][0]["admitted_p99_ms"], 2.0);
        assert_eq!(json["scenarios"][1]["status"], "skipped");
    }

    /// Pages served at level 1; lists at 2, the slowest; prefetches at 3, half of them
    /// refused.
    fn three_class_series() -> Series {
        let recorder = Recorder::new(
            Duration::from_secs(1),
            vec![Phase {
                name: "all".into(),
                start: Duration::ZERO,
            }],
        );
        for index in 0..120_u64 {
            let (class, items, latency_ms, shed_level) = match index % 3 {
                0 => (RequestClass::Page, 1, 2, 1),
                1 => (RequestClass::List, 10, 8, 2),
                _ => (RequestClass::Prefetch, 1, 1, 3),
            };
            let refused = class == RequestClass::Prefetch && index % 2 == 0;
            let status = if refused { 503 } else { 200 };
            recorder.record(
                Duration::from_millis(index * 10),
                Duration::from_millis(latency_ms),
                Final::Response {
                    status,
                    business_ok: !refused,
                    shed_level: Some(shed_level),
                },
                class,
                items,
                &[AttemptRecord {
                    status: Ok(status),
                    latency: Duration::from_millis(latency_ms),
                    refusal: None,
                    retry_after: false,
                    queued: None,
                }],
            );
        }
        Series::build(
            SeriesInput {
                label: "service".into(),
                duration_s: 1.2,
                ..SeriesInput::default()
            },
            &recorder.snapshot(),
        )
    }

    #[test]
    fn every_class_of_a_mixed_series_is_reported_apart() {
        let series = three_class_series();
        assert_eq!(
            series.kinds.keys().collect::<Vec<_>>(),
            ["list", "page", "prefetch"]
        );
        let page = &series.kinds["page"];
        let prefetch = &series.kinds["prefetch"];
        assert_eq!((page.logical_requests, page.received_503), (40, 0));
        assert_eq!((prefetch.logical_requests, prefetch.received_503), (40, 20));
        assert_eq!(prefetch.http_success_rate, Some(0.5));
        assert_eq!(series.kinds["list"].items, 400);
        assert_eq!(
            ["page", "list", "prefetch"].map(|class| series.kinds[class].max_shed_level_seen),
            [Some(1), Some(2), Some(3)]
        );
        assert_eq!(series.windows[0].shed_level, Some(1), "pages only");
        // What `mixed` compares: lists against pages.
        let pages = series.class_figures(RequestClass::Page).unwrap();
        let lists = series.class_figures(RequestClass::List).unwrap();
        assert_eq!(pages.label, "service / page requests");
        let lists_vs_pages = ratio(lists.p99_ms, pages.p99_ms).unwrap();
        assert!((lists_vs_pages - 4.0).abs() < 0.01, "{lists_vs_pages}");

        let mut scenario = ScenarioReport::new("mixed", "Singles and batches.");
        scenario.figures = Some(series.figures());
        scenario.series = vec![series];
        let report = run_report(vec![scenario]);
        let text = markdown(&report);
        assert!(text.contains(
            "service by request class:\n\n| class | phase | logical | items | HTTP ok | business ok | 503 received | P50 ms | P99 ms | admitted P99 ms | max x-shed-level |"
        ));
        let rows: Vec<&str> = text
            .lines()
            .filter(|line| {
                line.starts_with("| page |")
                    || line.starts_with("| list |")
                    || line.starts_with("| prefetch |")
            })
            .collect();
        assert_eq!(
            rows,
            [
                "| page | whole run | 40 | 40 | 100.0 % | 100.0 % | 0 | 2.00 | 2.00 | 2.00 | 1 |",
                "| list | whole run | 40 | 400 | 100.0 % | 100.0 % | 0 | 8.00 | 8.00 | 8.00 | 2 |",
                "| prefetch | whole run | 40 | 40 | 50.0 % | 50.0 % | 20 | 1.00 | 1.00 | 1.00 | 3 |",
            ]
        );
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        let kinds = &json["scenarios"][0]["series"][0]["kinds"];
        assert_eq!(kinds["prefetch"]["received_503"], 20);
        assert_eq!(kinds["list"]["max_shed_level_seen"], 2);
        assert_eq!(kinds["page"]["logical_requests"], 40);
    }
}
