//! `rebate-loadgen soak`: a long open-loop run over a key space larger than every cache budget,
//! with the service's RSS sampled every second, to show that memory is bounded by the
//! configured budgets and flat once the caches are full.
//!
//! The key space is real: a million items (by default) are seeded into the run's own MariaDB
//! database with multi-row INSERTs before the service starts, so the Bloom filter knows them and
//! every first request of a key goes the whole way — product and rate from the store, coupons
//! and extras from the simulator, four L1 entries and a rendered quote. The alternative, the
//! Bloom filter off so that unknown ids become cached not-found markers, would fill only the
//! product and rate L1 with tombstones and never the rendered-quote cache, and it is not how
//! production runs: it would not exercise `engine.rendered_max_bytes` at all. The simulator's
//! outbound quotas (45/s, a real provider's contract) are raised for the soak so that new keys
//! get complete (cacheable) quotes rather than degraded ones.
//!
//! The keys are swept ([`KeyPicker::sweep`]): each draw is a key never asked for, or (with the
//! revisit share) one asked for before, so the run touches `requests × (1 − revisit)` distinct
//! keys and the rate is chosen so that the sweep covers every key in 90 % of the run.
//!
//! Warm-up ends when every L1 part first holds 99 % of its `parts.*.l1_max_entries` (the caches
//! are full and evicting from then on), or at three quarters of the run, whichever is first. After
//! it, RSS should not grow: the report gives RSS at the end of the warm-up and at the end (each the
//! median of 30 one-second samples), the maximum, the least-squares slope after the warm-up, and
//! the service's live heap (jemalloc's `allocated`) beside it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;

use crate::analysis::slope_mib_per_minute;
use crate::client::LoadClient;
use crate::generator::{OpenLoop, Workload, run_open_loop};
use crate::keys::{ItemKey, KeyPicker, PLATFORMS};
use crate::procfs::{self, CpuMeter, CpuShare};
use crate::recorder::{Phase, StatsSummary};
use crate::report::Machine;
use crate::schedule::{Schedule, Segment};
use crate::service::{MySqlDatabase, RedisServer, ServiceProcess, reachable, seed, shed_level};

/// First id of the soak's items (every platform).
pub const SOAK_FIRST_ID: u32 = 10_000_001;

#[derive(Debug, Clone)]
pub struct SoakOptions {
    pub minutes: f64,
    /// Distinct keys to seed and sweep.
    pub keys: u32,
    /// Requests/s; default: enough to ask for every key in 90 % of the run.
    pub rate: Option<f64>,
    pub revisit_share: f64,
    pub out_dir: PathBuf,
    pub service_binary: PathBuf,
    pub mysql_url: String,
    pub seed: u64,
    pub client_timeout: Duration,
    pub max_in_flight: usize,
    pub command: String,
}

/// One second of the soak.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SoakSample {
    pub at_s: f64,
    pub rss_bytes: Option<u64>,
    /// The service's live heap (jemalloc's `allocated`, from the status page).
    pub heap_allocated_bytes: Option<u64>,
    /// Allocator pages resident (jemalloc's `resident`): RSS minus this is outside the heap.
    pub heap_resident_bytes: Option<u64>,
    pub product_entries: Option<u64>,
    pub rate_entries: Option<u64>,
    pub coupons_entries: Option<u64>,
    pub extras_entries: Option<u64>,
    pub rendered_entries: Option<u64>,
    pub rendered_bytes: Option<u64>,
    pub level: Option<u8>,
    /// Distinct keys the sweep had handed out.
    pub swept_keys: usize,
}

/// The budgets the service ran with (from `config/default.toml`; the soak overrides none).
#[derive(Debug, Clone, Serialize, Default)]
pub struct Budgets {
    pub l1_max_entries: Vec<(String, u64)>,
    pub rendered_max_bytes: Option<u64>,
    pub rendered_capacity_bytes_reported: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    pub tool: &'static str,
    pub started_at: String,
    pub command: String,
    pub machine: Machine,
    pub service_binary: String,
    pub minutes: f64,
    pub keys_seeded: u64,
    pub seeding_s: f64,
    pub rate_rps: f64,
    pub revisit_share: f64,
    pub distinct_keys_asked: usize,
    pub service_env: Vec<(String, String)>,
    pub budgets: Budgets,
    pub warmup_end_s: Option<f64>,
    pub warmup_criterion: String,
    pub rss_at_warmup_end_bytes: Option<u64>,
    pub rss_end_bytes: Option<u64>,
    pub rss_max_bytes: Option<u64>,
    pub rss_start_bytes: Option<u64>,
    pub rss_slope_after_warmup_mib_per_min: Option<f64>,
    /// RSS end − RSS at warm-up end, ÷ RSS at warm-up end (each the median of its 30 samples).
    pub growth_after_warmup: Option<f64>,
    pub flat: Option<bool>,
    /// The service's live heap (jemalloc's `allocated`) at warm-up end and at the end: when RSS
    /// grows and this does not, the growth is pages the allocator holds, not data.
    pub heap_allocated_at_warmup_end_bytes: Option<u64>,
    pub heap_allocated_end_bytes: Option<u64>,
    pub load: StatsSummary,
    pub unfinished: u64,
    pub dispatch_lag_p99_ms: f64,
    pub harness_cpu: Option<CpuShare>,
    pub service_cpu: Option<CpuShare>,
    pub final_status: Value,
    pub samples: Vec<SoakSample>,
    pub notes: Vec<String>,
    pub wall_s: f64,
}

/// RSS may grow at most this share of its warm-up-end value over the rest of the run.
pub const FLAT_GROWTH: f64 = 0.05;

/// Share of its `l1_max_entries` at which an L1 part counts as full (moka's entry count is an
/// estimate that hovers just under the budget once it evicts).
pub const FULL_SHARE: f64 = 0.99;

/// Samples each end of the after-warm-up stretch is the median of. One sample is a moment: a
/// burst of freed buffers that the allocator has not yet returned (it does so on a ~10 s decay)
/// shows as tens of MiB for a few seconds, and the load's last second closes every connection.
pub const END_WINDOW_SAMPLES: usize = 30;

/// Where the warm-up ends: the first sample at which every L1 part holds ≥ 99 % of its
/// `l1_max_entries` (every cache full and evicting from then on), else three quarters of the
/// run (then the caches never all filled, and the report says so).
pub fn warmup_end(samples: &[SoakSample], budgets: &[(String, u64)], run_s: f64) -> (f64, String) {
    let cap = run_s * 0.75;
    let entries = |sample: &SoakSample, part: &str| match part {
        "product" => sample.product_entries,
        "rate" => sample.rate_entries,
        "coupons" => sample.coupons_entries,
        "extras" => sample.extras_entries,
        _ => None,
    };
    if !budgets.is_empty() {
        let full = samples.iter().find(|sample| {
            budgets.iter().all(|(part, budget)| {
                entries(sample, part)
                    .is_some_and(|count| count as f64 >= *budget as f64 * FULL_SHARE)
            })
        });
        if let Some(sample) = full
            && sample.at_s <= cap
        {
            return (
                sample.at_s,
                format!(
                    "every L1 part at ≥ {:.0} % of its l1_max_entries",
                    FULL_SHARE * 100.0
                ),
            );
        }
    }
    (
        cap,
        "three quarters of the run (the L1 parts were not all full by then)".to_owned(),
    )
}

/// RSS after the warm-up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RssFigures {
    /// The median of the first [`END_WINDOW_SAMPLES`] samples from the warm-up's end.
    pub at_warmup_end: Option<u64>,
    /// The median of the last [`END_WINDOW_SAMPLES`] samples.
    pub end: Option<u64>,
    /// Over the whole run.
    pub max: Option<u64>,
    pub slope_mib_per_min: Option<f64>,
    /// (end − at warm-up end) ÷ at warm-up end.
    pub growth: Option<f64>,
}

/// RSS figures of the samples from `warmup_s` on (the maximum over all of them).
pub fn rss_figures(samples: &[SoakSample], warmup_s: f64) -> RssFigures {
    let after: Vec<(f64, u64)> = samples
        .iter()
        .filter(|sample| sample.at_s >= warmup_s)
        .filter_map(|sample| sample.rss_bytes.map(|rss| (sample.at_s, rss)))
        .collect();
    // Short stretches (tests, a run cut short) take a quarter of their samples at each end.
    let window = END_WINDOW_SAMPLES.min(after.len().div_ceil(4)).max(1);
    let median = |stretch: &[(f64, u64)]| {
        let mut values: Vec<u64> = stretch.iter().map(|(_, rss)| *rss).collect();
        values.sort_unstable();
        values.get(values.len() / 2).copied()
    };
    let at_warmup_end = median(&after[..window.min(after.len())]);
    let end = median(&after[after.len().saturating_sub(window)..]);
    let growth = match (at_warmup_end, end) {
        (Some(start), Some(end)) if start > 0 => Some((end as f64 - start as f64) / start as f64),
        _ => None,
    };
    RssFigures {
        at_warmup_end,
        end,
        max: samples.iter().filter_map(|sample| sample.rss_bytes).max(),
        slope_mib_per_min: slope_mib_per_minute(&after),
        growth,
    }
}

/// `[parts.*] l1_max_entries` and `[engine] rendered_max_bytes` from a TOML text (line-based:
/// the file is the service's own defaults, one key per line).
pub fn budgets_from_toml(text: &str) -> Budgets {
    let mut budgets = Budgets::default();
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if let Some(name) = line
            .strip_prefix('[')
            .and_then(|rest| rest.strip_suffix(']'))
        {
            section = name.to_owned();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim().replace('_', ""));
        if key == "l1_max_entries"
            && let Some(part) = section.strip_prefix("parts.")
            && let Ok(value) = value.parse()
        {
            budgets.l1_max_entries.push((part.to_owned(), value));
        }
        if section == "engine" && key == "rendered_max_bytes" {
            budgets.rendered_max_bytes = value.parse().ok();
        }
    }
    budgets
}

pub async fn run(options: SoakOptions) -> anyhow::Result<SoakReport> {
    let started = std::time::Instant::now();
    let started_at = chrono::Utc::now();
    let mysql = crate::scenario::loopback_socket(&options.mysql_url)?;
    if !reachable(mysql).await {
        bail!("the soak needs MariaDB: nothing answers at {mysql}");
    }
    std::fs::create_dir_all(options.out_dir.join("logs"))?;
    let database = MySqlDatabase::create(&options.mysql_url).await?;
    let result = run_with(&options, &database, started_at).await;
    if let Err(error) = database.drop_database().await {
        eprintln!("warning: could not drop the soak's database: {error:#}");
    }
    let mut report = result?;
    report.wall_s = started.elapsed().as_secs_f64();
    crate::report::write_files(&report, &markdown(&report), &options.out_dir)?;
    Ok(report)
}

async fn run_with(
    options: &SoakOptions,
    database: &MySqlDatabase,
    started_at: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<SoakReport> {
    let machine = Machine::detect(1, 0);
    let ticks = procfs::clock_ticks_per_second();
    let harness_meter = CpuMeter::start(None, ticks);
    let mut notes = Vec::new();
    let mut redis = RedisServer::start().await?;
    let mut env: Vec<(String, String)> = [
        ("REBATE__STORE__BACKEND", "mysql".to_owned()),
        ("DATABASE_URL", database.url()),
        ("REBATE__REDIS__ENABLED", "true".to_owned()),
        ("REDIS_URL", redis.url()),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value))
    .collect();
    let logs = options.out_dir.join("logs");
    seed(&options.service_binary, &env, &logs.join("soak-seed.log")).await?;
    let per_platform = options.keys.div_ceil(PLATFORMS.len() as u32).max(1);
    let last_id = SOAK_FIRST_ID + per_platform - 1;
    eprintln!("soak: seeding {} items", per_platform as u64 * 3);
    let seeding = Instant::now();
    let keys_seeded = database
        .seed_items(SOAK_FIRST_ID..=last_id)
        .await
        .context("seeding the soak's items")?;
    let seeding_s = seeding.elapsed().as_secs_f64();
    notes.push(format!(
        "seeded {keys_seeded} items (ids {SOAK_FIRST_ID}–{last_id} on 3 platforms) into {} in {seeding_s:.1} s, besides the demo catalogue",
        database.name
    ));
    // New keys must get complete quotes (cacheable renderings): the simulator's quotas up.
    for (key, value) in [
        ("REBATE__RESILIENCE__COUPONS__QUOTA_PER_SEC", "1000000"),
        ("REBATE__RESILIENCE__COUPONS__QUOTA_BURST", "10000"),
        ("REBATE__RESILIENCE__EXTRAS__QUOTA_PER_SEC", "1000000"),
        ("REBATE__RESILIENCE__EXTRAS__QUOTA_BURST", "10000"),
    ] {
        env.push((key.to_owned(), value.to_owned()));
    }
    let mut service = ServiceProcess::start(
        &options.service_binary,
        &env,
        &logs.join("soak-service.log"),
    )
    .await?;
    let service_meter = CpuMeter::start(service.pid(), ticks);
    let mut budgets = budgets_from_toml(
        &std::fs::read_to_string(crate::service::workspace_root().join("config/default.toml"))
            .unwrap_or_default(),
    );
    let keys: Vec<ItemKey> = PLATFORMS
        .iter()
        .flat_map(|platform| {
            (SOAK_FIRST_ID..=last_id).map(move |item_id| ItemKey { platform, item_id })
        })
        .collect();
    let total_keys = keys.len();
    let picker = Arc::new(KeyPicker::sweep(keys, options.revisit_share, options.seed)?);
    let run_s = (options.minutes * 60.0).max(10.0);
    let rate = options.rate.unwrap_or_else(|| {
        total_keys as f64 / ((1.0 - options.revisit_share).max(0.05) * run_s * 0.9)
    });
    eprintln!("soak: {rate:.0} rps for {run_s:.0} s over {total_keys} keys");
    let lead_in = Duration::from_secs(2);
    let plan = OpenLoop {
        schedule: Schedule::new(vec![
            Segment::constant(rate, lead_in),
            Segment::constant(rate, Duration::from_secs_f64(run_s)),
        ])?,
        measure_from: lead_in,
        phases: vec![Phase {
            name: "soak".into(),
            start: Duration::ZERO,
        }],
        max_in_flight: options.max_in_flight,
        drain_timeout: Duration::from_secs(15),
        // Whole-run windows: a per-second window over ten minutes costs the harness ~100 MB of
        // histograms and the soak reports totals only.
        window: Duration::from_secs(60),
        seed: options.seed,
    };
    let client = LoadClient::new(options.client_timeout)?;
    let workload = Workload::singles(picker.clone());
    let start = Instant::now() + Duration::from_millis(50);
    let measured_start = start + lead_in;
    let end = measured_start + Duration::from_secs_f64(run_s);
    let (output, samples) = tokio::join!(
        run_open_loop(&client, &service.api, &workload, &plan, start),
        sample_every_second(&service, &picker, start, end),
    );
    let final_status = service.status().await.unwrap_or(Value::Null);
    budgets.rendered_capacity_bytes_reported =
        final_status["rendered_quotes"]["capacity_bytes"].as_u64();
    let service_cpu = service_meter.read();
    if let Some(status) = service.exited() {
        notes.push(format!("the service EXITED during the soak ({status})"));
    }
    service.stop().await;
    redis.kill().await;
    let (warmup_end_s, warmup_criterion) = warmup_end(
        &samples,
        &budgets.l1_max_entries,
        run_s + lead_in.as_secs_f64(),
    );
    let rss = rss_figures(&samples, warmup_end_s);
    let heap_after: Vec<u64> = samples
        .iter()
        .filter(|sample| sample.at_s >= warmup_end_s)
        .filter_map(|sample| sample.heap_allocated_bytes)
        .collect();
    let load = output.recorded.total.summary();
    Ok(SoakReport {
        tool: "rebate-loadgen soak",
        started_at: started_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        command: options.command.clone(),
        machine,
        service_binary: options.service_binary.display().to_string(),
        minutes: run_s / 60.0,
        keys_seeded,
        seeding_s,
        rate_rps: rate,
        revisit_share: options.revisit_share,
        distinct_keys_asked: picker.swept(),
        service_env: env,
        budgets,
        warmup_end_s: Some(warmup_end_s),
        warmup_criterion,
        rss_at_warmup_end_bytes: rss.at_warmup_end,
        rss_end_bytes: rss.end,
        rss_max_bytes: rss.max,
        rss_start_bytes: samples.iter().find_map(|sample| sample.rss_bytes),
        rss_slope_after_warmup_mib_per_min: rss.slope_mib_per_min,
        growth_after_warmup: rss.growth,
        flat: rss.growth.map(|growth| growth <= FLAT_GROWTH),
        heap_allocated_at_warmup_end_bytes: heap_after.first().copied(),
        heap_allocated_end_bytes: heap_after.last().copied(),
        load,
        unfinished: output.unfinished,
        dispatch_lag_p99_ms: output.dispatch.lag_p99_ms,
        harness_cpu: harness_meter.read(),
        service_cpu,
        final_status,
        samples,
        notes,
        wall_s: 0.0,
    })
}

async fn sample_every_second(
    service: &ServiceProcess,
    picker: &KeyPicker,
    start: Instant,
    end: Instant,
) -> Vec<SoakSample> {
    let seconds = end.saturating_duration_since(start).as_secs() + 1;
    let mut samples = Vec::with_capacity(seconds as usize);
    for second in 0..=seconds {
        let at = start + Duration::from_secs(second);
        if at > end {
            break;
        }
        tokio::time::sleep_until(at).await;
        // The status page runs the readiness probe (bounded at 500 ms by the service).
        let status = tokio::time::timeout(Duration::from_millis(900), service.status())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(Value::Null);
        let entries = |part: &str| status["caches"][part]["entries"].as_u64();
        samples.push(SoakSample {
            at_s: second as f64,
            rss_bytes: service.pid().and_then(procfs::rss_bytes),
            heap_allocated_bytes: status["memory"]["allocated_bytes"].as_u64(),
            heap_resident_bytes: status["memory"]["resident_bytes"].as_u64(),
            product_entries: entries("product"),
            rate_entries: entries("rate"),
            coupons_entries: entries("coupons"),
            extras_entries: entries("extras"),
            rendered_entries: status["rendered_quotes"]["entries"].as_u64(),
            rendered_bytes: status["rendered_quotes"]["bytes"].as_u64(),
            level: shed_level(&status),
            swept_keys: picker.swept(),
        });
    }
    samples
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("–".into(), |bytes| {
        format!("{:.1} MiB", bytes as f64 / 1048576.0)
    })
}

pub fn markdown(report: &SoakReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "# rebate-loadgen soak\n");
    let _ = writeln!(
        out,
        "- started {}; wall {:.0} s; command `{}`",
        report.started_at, report.wall_s, report.command
    );
    let _ = writeln!(
        out,
        "- machine: {} cores, {}, {}, load average at start {}",
        report.machine.nproc,
        report.machine.cpu_model,
        report.machine.os,
        report.machine.loadavg_at_start
    );
    let _ = writeln!(
        out,
        "- {:.1} min at {:.0} rps, revisit share {:.2}: {} distinct keys asked of {} seeded",
        report.minutes,
        report.rate_rps,
        report.revisit_share,
        report.distinct_keys_asked,
        report.keys_seeded
    );
    let _ = writeln!(
        out,
        "- budgets: L1 {:?}; rendered_max_bytes {:?} (status page capacity {:?})",
        report.budgets.l1_max_entries,
        report.budgets.rendered_max_bytes,
        report.budgets.rendered_capacity_bytes_reported
    );
    let _ = writeln!(
        out,
        "- warm-up end {:.0} s ({})",
        report.warmup_end_s.unwrap_or(0.0),
        report.warmup_criterion
    );
    let _ = writeln!(
        out,
        "- RSS: start {}, at warm-up end {}, end {}, max {}; slope after warm-up {} MiB/min; growth after warm-up {} → flat (≤ {:.0} %): {}",
        mib(report.rss_start_bytes),
        mib(report.rss_at_warmup_end_bytes),
        mib(report.rss_end_bytes),
        mib(report.rss_max_bytes),
        report
            .rss_slope_after_warmup_mib_per_min
            .map_or("–".into(), |slope| format!("{slope:.2}")),
        report
            .growth_after_warmup
            .map_or("–".into(), |growth| format!("{:.1} %", growth * 100.0)),
        FLAT_GROWTH * 100.0,
        match report.flat {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "no figure",
        }
    );
    let _ = writeln!(
        out,
        "- live heap (jemalloc allocated): at warm-up end {}, end {}",
        mib(report.heap_allocated_at_warmup_end_bytes),
        mib(report.heap_allocated_end_bytes)
    );
    let load = &report.load;
    let _ = writeln!(
        out,
        "- load: {} requests, HTTP ok {}, business ok {}, P50 {} ms, P99 {} ms, 503 {}, 5xx ≠ 503 {}, unfinished {}, dispatch lag P99 {:.1} ms",
        load.logical_requests,
        load.http_success_rate
            .map_or("–".into(), |rate| format!("{:.2} %", rate * 100.0)),
        load.business_success_rate
            .map_or("–".into(), |rate| format!("{:.2} %", rate * 100.0)),
        load.p50_ms.map_or("–".into(), |v| format!("{v:.1}")),
        load.p99_ms.map_or("–".into(), |v| format!("{v:.1}")),
        load.received_503,
        load.server_errors_non_503,
        report.unfinished,
        report.dispatch_lag_p99_ms
    );
    if let Some(cpu) = report.harness_cpu {
        let _ = writeln!(
            out,
            "- harness CPU {:.2} cores ({:.0} % of the machine); service CPU {}",
            cpu.cores,
            cpu.machine_share * 100.0,
            report
                .service_cpu
                .map_or("–".into(), |cpu| format!("{:.2} cores", cpu.cores))
        );
    }
    let loads = |part: &str| report.final_status["caches"][part]["source_loads"].as_u64();
    let _ = writeln!(
        out,
        "- store loads at the end (distinct keys that reached MariaDB, about): product {}, rate {}",
        opt(loads("product")),
        opt(loads("rate"))
    );
    for note in &report.notes {
        let _ = writeln!(out, "- {note}");
    }
    out.push_str("\n| t s | RSS MiB | product L1 | rate L1 | coupons L1 | extras L1 | rendered | rendered MiB | level | keys asked |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    let step = (report.samples.len() / 30).max(1);
    for sample in report.samples.iter().step_by(step) {
        let _ = writeln!(
            out,
            "| {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            sample.at_s,
            sample
                .rss_bytes
                .map_or("–".into(), |b| format!("{:.1}", b as f64 / 1048576.0)),
            opt(sample.product_entries),
            opt(sample.rate_entries),
            opt(sample.coupons_entries),
            opt(sample.extras_entries),
            opt(sample.rendered_entries),
            sample
                .rendered_bytes
                .map_or("–".into(), |b| format!("{:.1}", b as f64 / 1048576.0)),
            sample.level.map_or("–".into(), |l| l.to_string()),
            sample.swept_keys
        );
    }
    out
}

fn opt(value: Option<u64>) -> String {
    value.map_or("–".into(), |value| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_s: f64, rss_mib: u64, product: u64) -> SoakSample {
        SoakSample {
            at_s,
            rss_bytes: Some(rss_mib * 1024 * 1024),
            heap_allocated_bytes: None,
            heap_resident_bytes: None,
            product_entries: Some(product),
            rate_entries: None,
            coupons_entries: None,
            extras_entries: None,
            rendered_entries: None,
            rendered_bytes: None,
            level: Some(0),
            swept_keys: 0,
        }
    }

    #[test]
    fn warm_up_ends_when_every_cache_is_full_or_at_three_quarters() {
        let mut samples: Vec<SoakSample> = (0..100)
            .map(|second| sample(second as f64, 100, (second * 3_000).min(200_000)))
            .collect();
        for sample in &mut samples {
            // Extras (budget 100,000) fills at 1,000 a second: full (99,000) at second 99.
            sample.extras_entries = Some((sample.at_s as u64 * 1_000).min(100_000));
        }
        let product_only = vec![("product".to_owned(), 200_000)];
        let (end, why) = warmup_end(&samples, &product_only, 200.0);
        // 99 % of 200,000 = 198,000 entries: second 66 (198,000) is the first.
        assert_eq!(end, 66.0);
        assert!(why.contains("99 %"));
        let both = vec![
            ("product".to_owned(), 200_000),
            ("extras".to_owned(), 100_000),
        ];
        assert_eq!(warmup_end(&samples, &both, 200.0).0, 99.0);
        // Full only after three quarters of the run, or never: three quarters.
        let (end, why) = warmup_end(&samples, &both, 100.0);
        assert_eq!(end, 75.0);
        assert!(why.contains("three quarters"));
        let huge = vec![("product".to_owned(), 1_000_000)];
        assert_eq!(warmup_end(&samples, &huge, 100.0).0, 75.0);
    }

    #[test]
    fn rss_figures_after_the_warm_up() {
        let mut samples: Vec<SoakSample> =
            (0..10).map(|s| sample(s as f64, 100 + s * 10, 0)).collect();
        samples.extend((10..20).map(|s| sample(s as f64, 200, 0)));
        let rss = rss_figures(&samples, 10.0);
        let mib = 1024 * 1024;
        assert_eq!(rss.at_warmup_end, Some(200 * mib));
        assert_eq!(rss.end, Some(200 * mib));
        assert_eq!(rss.max, Some(200 * mib));
        assert_eq!(rss.slope_mib_per_min, Some(0.0));
        assert_eq!(rss.growth, Some(0.0));
        // Growing after the warm-up: the first five samples' median is 120 MiB, the last five's
        // 200 MiB.
        let rss = rss_figures(&samples, 0.0);
        assert_eq!(rss.at_warmup_end, Some(120 * mib));
        assert_eq!(rss.end, Some(200 * mib));
        assert!((rss.growth.unwrap() - 80.0 / 120.0).abs() < 1e-9);
    }

    #[test]
    fn budgets_are_read_from_the_service_defaults() {
        let text = "[parts.product]\ntimeout_class = \"core\"\nl1_max_entries = 200000\n\n[parts.extras]\nl1_max_entries = 100_000\n[engine]\nmode = \"aggregated\"\nrendered_max_bytes = 33554432\n";
        let budgets = budgets_from_toml(text);
        assert_eq!(
            budgets.l1_max_entries,
            vec![
                ("product".to_owned(), 200_000),
                ("extras".to_owned(), 100_000)
            ]
        );
        assert_eq!(budgets.rendered_max_bytes, Some(33_554_432));
        // The real file has all four parts.
        let real =
            std::fs::read_to_string(crate::service::workspace_root().join("config/default.toml"))
                .unwrap();
        assert_eq!(budgets_from_toml(&real).l1_max_entries.len(), 4);
    }
}
