//! `client-contract`: a population of users whose client follows the contract (docs/CLIENTS.md)
//! against one whose client retries at once, each on a fresh service, under the same spike: the
//! per-client limit lowered by a live rule set for a minute, then restored. What the report
//! compares, side by side: requests and retries per user per minute before, during and after
//! the spike, what the users were shown, the service's requests and CPU, and how long the
//! service and the users took to recover once the spike ended.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::{Harness, ScenarioName, WARMED_KEYS};
use crate::analysis::{Tolerance, recovery_time};
use crate::chart::{self, Line};
use crate::population::{
    ClientKind, Contract, HttpTransport, PHASES, PopulationPlan, Tally, run_population,
};
use crate::procfs::{CpuMeter, clock_ticks_per_second, cpu_ticks};
use crate::report::{ScenarioReport, ScenarioStatus};

/// The spike: every user's own limit, from the default 50/s with bursts of 100, down to one
/// request every 10 s with no burst. Users tap about once every 4 s, so most of them meet it;
/// its `Retry-After` runs up to 10 s.
const SPIKE_PER_SEC: f64 = 0.1;
const SPIKE_BURST: u32 = 1;

/// What counts as the service having recovered: at most this share of its answers refused …
const RECOVERED_REFUSED_SHARE: f64 = 0.01;
/// … and no more requests than this many times the rate before the spike …
const RECOVERED_LOAD_FACTOR: f64 = 1.25;
/// … for this many seconds in a row.
const RECOVERED_SECONDS: usize = 3;

/// One second of what the service was sent and answered.
#[derive(Debug, Clone, Copy, PartialEq)]
struct LoadPoint {
    at_s: f64,
    sent: u64,
    answered: u64,
    /// `429` and `503` among the answers.
    refused: u64,
}

/// Seconds from `from_s` to the start of the first second that begins [`RECOVERED_SECONDS`]
/// seconds in which the service refused at most [`RECOVERED_REFUSED_SHARE`] of its answers
/// and was sent at most [`RECOVERED_LOAD_FACTOR`] × `baseline_rps` (+ 5, for the noise of small
/// runs). `None` when that never happens before the points end.
fn service_recovery(points: &[LoadPoint], from_s: f64, baseline_rps: f64) -> Option<f64> {
    let after: Vec<&LoadPoint> = points
        .iter()
        .filter(|point| point.at_s + 1e-9 >= from_s)
        .collect();
    let calm = |point: &&LoadPoint| {
        let refused_ok = point.answered == 0
            || point.refused as f64 <= RECOVERED_REFUSED_SHARE * point.answered as f64;
        refused_ok && point.sent as f64 <= RECOVERED_LOAD_FACTOR * baseline_rps + 5.0
    };
    (0..after.len()).find_map(|start| {
        let run = after.get(start..start + RECOVERED_SECONDS)?;
        run.iter()
            .all(calm)
            .then(|| (after[start].at_s - from_s).max(0.0))
    })
}

/// The figures of one phase (before, spike, after) of one kind's run.
#[derive(Debug, Clone, Default, PartialEq)]
struct PhaseFigures {
    seconds: f64,
    taps_per_user_min: f64,
    requests_per_user_min: f64,
    /// Over users: the 99th percentile and the most of requests per minute.
    requests_per_user_min_p99: f64,
    requests_per_user_min_max: f64,
    retries_per_user_min: f64,
    retries_per_user_min_max: f64,
    /// Retries ÷ requests sent.
    retry_share: Option<f64>,
    /// Attempts answered on the device: the throttle's and a running `Retry-After`'s.
    refused_locally_per_user_min: f64,
    /// Of the calls that ended: a live answer, the last good one, nothing, or left by the user
    /// (the next tap came first).
    live_share: Option<f64>,
    last_good_share: Option<f64>,
    nothing_share: Option<f64>,
    left_share: Option<f64>,
    shown_p50_ms: Option<f64>,
    shown_p99_ms: Option<f64>,
    service_rps: f64,
    /// `429`s ÷ answers.
    limited_share: Option<f64>,
    service_cores: Option<f64>,
    max_shed_level: u8,
}

/// One kind's run.
#[derive(Debug)]
struct KindRun {
    kind: ClientKind,
    tally: Arc<Tally>,
    /// The service's CPU in cores, per second of the taps.
    cpu: Vec<Option<f64>>,
    /// How long the spike's rule set and its release took to apply.
    applied: (Duration, Duration),
    generator_share: Option<f64>,
    phases: [PhaseFigures; 3],
    service_recovery_s: Option<f64>,
    user_recovery_s: Option<f64>,
    max_retries_in_call: u32,
    cancelled: u64,
}

fn quantile(sorted: &[f64], quantile: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((quantile * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn share(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

/// The figures of phase `phase` (an index into [`PHASES`]) over seconds `[from, to)`.
fn phase_figures(
    tally: &Tally,
    cpu: &[Option<f64>],
    phase: usize,
    from: usize,
    to: usize,
) -> PhaseFigures {
    let seconds = to.saturating_sub(from) as f64 * tally.window().as_secs_f64();
    let minutes = (seconds / 60.0).max(1e-9);
    let users = tally.users.len().max(1) as f64;
    let windows = tally
        .windows
        .get(from..to.min(tally.windows.len()))
        .unwrap_or(&[]);
    let sum = |pick: fn(&crate::population::WindowCounters) -> &std::sync::atomic::AtomicU64| {
        windows
            .iter()
            .map(|window| pick(window).load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let per_user =
        |pick: fn(&crate::population::UserCounters) -> &[std::sync::atomic::AtomicU32; 3]| {
            let mut values: Vec<f64> = tally
                .users
                .iter()
                .map(|user| f64::from(pick(user)[phase].load(Ordering::Relaxed)) / minutes)
                .collect();
            values.sort_by(f64::total_cmp);
            values
        };
    let requests = per_user(|user| &user.sent);
    let retries = per_user(|user| &user.retries);
    let taps = per_user(|user| &user.taps);
    let mean = |values: &[f64]| values.iter().sum::<f64>() / users;
    let (sent, retried) = (sum(|w| &w.sent), sum(|w| &w.retries));
    let (live, last_good, nothing) = (sum(|w| &w.live), sum(|w| &w.last_good), sum(|w| &w.nothing));
    let left = sum(|w| &w.left_waiting);
    let ended = live + last_good + nothing + left;
    let answered = sum(|w| &w.ok)
        + sum(|w| &w.limited_429)
        + sum(|w| &w.refused_503)
        + sum(|w| &w.other_status);
    let cores: Vec<f64> = cpu
        .get(from..to.min(cpu.len()))
        .unwrap_or(&[])
        .iter()
        .flatten()
        .copied()
        .collect();
    PhaseFigures {
        seconds,
        taps_per_user_min: mean(&taps),
        requests_per_user_min: mean(&requests),
        requests_per_user_min_p99: quantile(&requests, 0.99),
        requests_per_user_min_max: requests.last().copied().unwrap_or(0.0),
        retries_per_user_min: mean(&retries),
        retries_per_user_min_max: retries.last().copied().unwrap_or(0.0),
        retry_share: share(retried, sent),
        refused_locally_per_user_min: (sum(|w| &w.throttled) + sum(|w| &w.held)) as f64
            / users
            / minutes,
        live_share: share(live, ended),
        last_good_share: share(last_good, ended),
        nothing_share: share(nothing, ended),
        left_share: share(left, ended),
        shown_p50_ms: tally.shown_quantile_ms(from, to, 0.5),
        shown_p99_ms: tally.shown_quantile_ms(from, to, 0.99),
        service_rps: sent as f64 / seconds.max(1e-9),
        limited_share: share(sum(|w| &w.limited_429), answered),
        service_cores: (!cores.is_empty()).then(|| cores.iter().sum::<f64>() / cores.len() as f64),
        max_shed_level: windows
            .iter()
            .map(|window| window.shed_level.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0),
    }
}

/// The service's CPU in cores over each second from `start`, for `seconds` seconds.
async fn sample_cpu(pid: Option<u32>, start: Instant, seconds: usize) -> Vec<Option<f64>> {
    let ticks_per_second = clock_ticks_per_second();
    let mut samples = Vec::with_capacity(seconds);
    tokio::time::sleep_until(start).await;
    let mut last = pid.and_then(|pid| cpu_ticks(Some(pid)));
    for second in 1..=seconds {
        tokio::time::sleep_until(start + Duration::from_secs(second as u64)).await;
        let now = pid.and_then(|pid| cpu_ticks(Some(pid)));
        samples.push(match (last, now) {
            (Some(before), Some(after)) => {
                Some(after.saturating_sub(before) as f64 / ticks_per_second)
            }
            _ => None,
        });
        last = now;
    }
    samples
}

impl Harness {
    /// The population's size and timeline: a minute's spike after 30 s, a minute after it
    /// (`--quick`: 5 s after 4 s, 6 s after).
    fn population_plan(&self) -> PopulationPlan {
        let secs = Duration::from_secs;
        let (users, mean_think, items, before, spike, after) = if self.options.quick {
            (500, secs(2), 4, secs(4), secs(5), secs(6))
        } else {
            (5_000, secs(4), 8, secs(30), secs(60), secs(60))
        };
        PopulationPlan {
            users: self.options.users.unwrap_or(users).max(1),
            mean_think,
            items_per_user: items,
            taps_for: before + spike + after,
            // A call waits at most its budget; then one attempt's answer.
            drain: Contract::DEFAULT.budget + secs(1),
            spike: (before, before + spike),
            window: secs(1),
            seed: self.options.seed,
        }
    }

    pub(super) async fn client_contract(&mut self) -> anyhow::Result<ScenarioReport> {
        let name = ScenarioName::ClientContract;
        let mut report = ScenarioReport::new(name.as_str(), name.description());
        let keys = self.catalogue()?;
        let plan = self.population_plan();
        let taps_seconds = plan.taps_for.as_secs() as usize;
        let mut runs = Vec::new();
        for kind in ClientKind::ALL {
            let env = [(
                "REBATE__RESILIENCE__CLIENT_LIMIT__ENABLED".to_owned(),
                "true".to_owned(),
            )];
            let service = self
                .start_service(name.as_str(), kind.as_str(), &env)
                .await?;
            let warmed = self.warm(&service, keys.hottest(WARMED_KEYS)).await;
            report
                .notes
                .push(format!("{} clients: {}", kind.as_str(), warmed.note));
            let transport = Arc::new(HttpTransport {
                client: self.client.clone(),
                target: service.api.clone(),
            });
            let start = Instant::now() + Duration::from_millis(100);
            let generator = CpuMeter::start(None, clock_ticks_per_second());
            let spike = async {
                tokio::time::sleep_until(start + plan.spike.0).await;
                let lowered = service
                    .apply_rules(
                        &json!({"resilience": {"client_limit": {
                            "per_sec": SPIKE_PER_SEC, "burst": SPIKE_BURST}}}),
                        "client-contract: the spike",
                    )
                    .await?;
                tokio::time::sleep_until(start + plan.spike.1).await;
                let restored = service
                    .apply_rules(
                        &json!({"resilience": {"client_limit": {
                            "per_sec": null, "burst": null}}}),
                        "client-contract: the spike ends",
                    )
                    .await?;
                anyhow::Ok((lowered, restored))
            };
            let (tally, applied, cpu) = tokio::join!(
                run_population(&plan, kind, Contract::DEFAULT, &keys, transport, start),
                spike,
                sample_cpu(service.pid(), start, taps_seconds),
            );
            let generator_share = generator.read().map(|cpu| cpu.machine_share);
            service.stop().await;
            let applied = applied?;
            runs.push(analyse(kind, &plan, tally, cpu, applied, generator_share));
        }
        describe(&mut report, &plan, &runs);
        report.charts = self.draw_population_charts(&report.name, &plan, &runs)?;
        Ok(report)
    }

    fn draw_population_charts(
        &self,
        name: &str,
        plan: &PopulationPlan,
        runs: &[KindRun],
    ) -> anyhow::Result<Vec<String>> {
        let seconds = plan.taps_for.as_secs() as usize;
        let at = |index: usize| index as f64;
        let per_second = |run: &KindRun, pick: fn(&crate::population::WindowCounters) -> u64| {
            (0..seconds.min(run.tally.windows.len()))
                .map(|index| (at(index), pick(&run.tally.windows[index]) as f64))
                .collect::<Vec<_>>()
        };
        let mut requests = Vec::new();
        let mut shown = Vec::new();
        let mut cpu = Vec::new();
        for (color, run) in runs.iter().enumerate() {
            let kind = run.kind.as_str();
            requests.push(Line {
                label: format!("{kind}: requests"),
                points: per_second(run, |w| w.sent.load(Ordering::Relaxed)),
                dashed: false,
                color,
            });
            requests.push(Line {
                label: format!("{kind}: of which retries"),
                points: per_second(run, |w| w.retries.load(Ordering::Relaxed)),
                dashed: true,
                color,
            });
            let live_share = |window: &crate::population::WindowCounters| {
                share(window.live.load(Ordering::Relaxed), window.calls_ended())
            };
            shown.push(Line {
                label: format!("{kind}: live answers"),
                points: (0..seconds.min(run.tally.windows.len()))
                    .filter_map(|index| {
                        live_share(&run.tally.windows[index])
                            .map(|value| (at(index), value * 100.0))
                    })
                    .collect(),
                dashed: false,
                color,
            });
            if run.kind == ClientKind::Contract {
                shown.push(Line {
                    label: format!("{kind}: live or last good"),
                    points: (0..seconds.min(run.tally.windows.len()))
                        .filter_map(|index| {
                            let window = &run.tally.windows[index];
                            let shown = window.live.load(Ordering::Relaxed)
                                + window.last_good.load(Ordering::Relaxed);
                            share(shown, window.calls_ended())
                                .map(|value| (at(index), value * 100.0))
                        })
                        .collect(),
                    dashed: true,
                    color,
                });
            }
            cpu.push(Line {
                label: format!("{kind}: service CPU"),
                points: run
                    .cpu
                    .iter()
                    .enumerate()
                    .filter_map(|(index, cores)| cores.map(|cores| (at(index) + 1.0, cores)))
                    .collect(),
                dashed: false,
                color,
            });
        }
        let spike_marks = |lines: &mut Vec<Line>, top: f64| {
            for (label, at) in [("spike starts", plan.spike.0), ("spike ends", plan.spike.1)] {
                lines.push(Line {
                    label: label.to_owned(),
                    points: vec![(at.as_secs_f64(), 0.0), (at.as_secs_f64(), top)],
                    dashed: true,
                    color: 5,
                });
            }
        };
        let top = |lines: &[Line]| {
            lines
                .iter()
                .flat_map(|line| line.points.iter().map(|point| point.1))
                .fold(1.0_f64, f64::max)
        };
        let mut files = Vec::new();
        for (suffix, title, unit, mut lines) in [
            (
                "requests",
                "requests the service was sent per second (retries dashed)",
                "requests/s",
                requests,
            ),
            (
                "shown",
                "taps answered live, per second",
                "% of the calls that ended (left ones included)",
                shown,
            ),
            ("cpu", "the service's CPU per second", "cores", cpu),
        ] {
            let top = top(&lines);
            spike_marks(&mut lines, top);
            let file = format!("{name}-{suffix}.svg");
            chart::draw(
                &self.options.out_dir.join(&file),
                &format!("{name}: {title}"),
                unit,
                &lines,
                1.0,
            )?;
            files.push(file);
        }
        Ok(files)
    }
}

fn analyse(
    kind: ClientKind,
    plan: &PopulationPlan,
    tally: Arc<Tally>,
    cpu: Vec<Option<f64>>,
    applied: (Duration, Duration),
    generator_share: Option<f64>,
) -> KindRun {
    let bounds = [
        (0, plan.spike.0.as_secs() as usize),
        (
            plan.spike.0.as_secs() as usize,
            plan.spike.1.as_secs() as usize,
        ),
        (
            plan.spike.1.as_secs() as usize,
            plan.taps_for.as_secs() as usize,
        ),
    ];
    let phases: [PhaseFigures; 3] = std::array::from_fn(|phase| {
        let (from, to) = bounds[phase];
        phase_figures(&tally, &cpu, phase, from, to)
    });
    let taps_end = plan.taps_for.as_secs() as usize;
    let spike_end_s = plan.spike.1.as_secs_f64();
    let load: Vec<LoadPoint> = tally
        .windows
        .iter()
        .take(taps_end)
        .enumerate()
        .map(|(index, window)| {
            let refused = window.limited_429.load(Ordering::Relaxed)
                + window.refused_503.load(Ordering::Relaxed);
            LoadPoint {
                at_s: index as f64,
                sent: window.sent.load(Ordering::Relaxed),
                answered: refused
                    + window.ok.load(Ordering::Relaxed)
                    + window.other_status.load(Ordering::Relaxed),
                refused,
            }
        })
        .collect();
    let service_recovery_s = service_recovery(&load, spike_end_s, phases[0].service_rps);
    let mut points = tally.second_points();
    points.truncate(taps_end);
    let user_recovery_s = recovery_time(
        &points,
        spike_end_s,
        phases[0].shown_p99_ms.unwrap_or(0.0),
        phases[0].live_share.unwrap_or(1.0),
        &Tolerance::DEFAULT,
    );
    let max_retries_in_call = tally
        .users
        .iter()
        .map(|user| user.max_retries_in_call.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0);
    let cancelled = tally
        .windows
        .iter()
        .map(|window| window.superseded.load(Ordering::Relaxed))
        .sum();
    KindRun {
        kind,
        tally,
        cpu,
        applied,
        generator_share,
        phases,
        service_recovery_s,
        user_recovery_s,
        max_retries_in_call,
        cancelled,
    }
}

fn number(value: Option<f64>, decimals: usize) -> String {
    match value {
        Some(value) if value.is_finite() => format!("{value:.decimals$}"),
        _ => "–".to_owned(),
    }
}

fn percent(value: Option<f64>) -> String {
    value.map_or("–".to_owned(), |value| format!("{:.1} %", value * 100.0))
}

/// Notes, the side-by-side table and the named figures.
fn describe(report: &mut ScenarioReport, plan: &PopulationPlan, runs: &[KindRun]) {
    let contract = Contract::DEFAULT;
    let find = |kind| runs.iter().find(|run| run.kind == kind);
    if let (Some(good), Some(naive)) = (find(ClientKind::Contract), find(ClientKind::Naive)) {
        let (good_spike, naive_spike) = (&good.phases[1], &naive.phases[1]);
        report.notes.insert(
            0,
            format!(
                "in the spike, {:.1} requests per user per minute with the contract against {:.1} \
                 without it ({:.1}×); retries {} against {}; the service recovered {} s and {} s \
                 after it",
                good_spike.requests_per_user_min,
                naive_spike.requests_per_user_min,
                naive_spike.requests_per_user_min / good_spike.requests_per_user_min.max(1e-9),
                percent(good_spike.retry_share),
                percent(naive_spike.retry_share),
                number(good.service_recovery_s, 0),
                number(naive.service_recovery_s, 0),
            ),
        );
        let within = good.max_retries_in_call <= contract.max_retries();
        // The scenario measured nothing if the spike did not make the naive clients storm.
        let stormed = naive_spike.requests_per_user_min > 1.5 * good_spike.requests_per_user_min;
        if !within || !stormed {
            report.status = ScenarioStatus::Failed;
        }
        if !stormed {
            report.notes.push(
                "no storm: the naive clients sent less than 1.5× the contract's requests in the \
                 spike, so the spike did not bite (was the rule set applied?)"
                    .into(),
            );
        }
        report.notes.push(format!(
            "contract bound: at most {} retries per call, none before a Retry-After has passed, \
             none for a call the user left: {} (most in one call: {}; retries per user per \
             minute in the spike: mean {:.2}, most {:.1})",
            contract.max_retries(),
            if within { "met" } else { "NOT met" },
            good.max_retries_in_call,
            good_spike.retries_per_user_min,
            good_spike.retries_per_user_min_max,
        ));
        report.ratios.insert(
            "requests_per_user_in_spike_naive_vs_contract".into(),
            Some(naive_spike.requests_per_user_min / good_spike.requests_per_user_min.max(1e-9)),
        );
    }
    report.notes.push(format!(
        "{} users per run, each tapping on an open loop (exponential gaps, mean {:.0} s) over \
         {} items of their own (drawn from the catalogue's popularity); the spike is a live rule \
         set lowering every client's limit (resilience.client_limit) from 50/s with bursts of \
         100 to {SPIKE_PER_SEC}/s with a burst of {SPIKE_BURST}, from {:.0} s to {:.0} s; taps \
         end at {:.0} s. Each kind runs on a fresh service",
        plan.users,
        plan.mean_think.as_secs_f64(),
        plan.items_per_user,
        plan.spike.0.as_secs_f64(),
        plan.spike.1.as_secs_f64(),
        plan.taps_for.as_secs_f64(),
    ));
    for run in runs {
        report.notes.push(format!(
            "{}: the rule set took {:.0} ms to apply and its release {:.0} ms; {} calls were \
             cancelled by the user's next tap; the generator (this process) used {} of the \
             machine's CPU",
            run.kind.as_str(),
            run.applied.0.as_secs_f64() * 1000.0,
            run.applied.1.as_secs_f64() * 1000.0,
            run.cancelled,
            percent(run.generator_share),
        ));
    }
    report.notes.push(format!(
        "recovery: the service, from the spike's end until {RECOVERED_SECONDS} seconds in a row \
         with at most {:.0} % of its answers refused and at most {RECOVERED_LOAD_FACTOR}× its \
         requests per second before the spike; the users, until {} seconds in a row with the \
         share of live answers within {:.0} point of the one before the spike and the P99 from \
         tap to answer within {}× of it (or +{:.0} ms)",
        RECOVERED_REFUSED_SHARE * 100.0,
        Tolerance::DEFAULT.consecutive,
        Tolerance::DEFAULT.answered_drop * 100.0,
        Tolerance::DEFAULT.p99_factor,
        Tolerance::DEFAULT.p99_slack_ms,
    ));
    let mut table = String::from("| | ");
    table.push_str(
        &runs
            .iter()
            .map(|run| run.kind.as_str())
            .collect::<Vec<_>>()
            .join(" | "),
    );
    table.push_str(" |\n| --- |");
    table.push_str(&" ---: |".repeat(runs.len()));
    table.push('\n');
    let mut row = |label: &str, cell: &dyn Fn(&KindRun) -> String| {
        let _ = writeln!(
            table,
            "| {label} | {} |",
            runs.iter().map(cell).collect::<Vec<_>>().join(" | ")
        );
    };
    let by_phase = |pick: fn(&PhaseFigures) -> String| {
        move |run: &KindRun| run.phases.iter().map(pick).collect::<Vec<_>>().join(" / ")
    };
    row(
        "taps per user per minute (before / spike / after)",
        &by_phase(|phase| format!("{:.1}", phase.taps_per_user_min)),
    );
    row(
        "requests per user per minute (before / spike / after)",
        &by_phase(|phase| format!("{:.1}", phase.requests_per_user_min)),
    );
    row(
        "requests per user per minute in the spike: P99 / most",
        &|run| {
            format!(
                "{:.1} / {:.1}",
                run.phases[1].requests_per_user_min_p99, run.phases[1].requests_per_user_min_max
            )
        },
    );
    row(
        "retries per user per minute in the spike: mean / most",
        &|run| {
            format!(
                "{:.2} / {:.1}",
                run.phases[1].retries_per_user_min, run.phases[1].retries_per_user_min_max
            )
        },
    );
    row(
        "share of requests that were retries (before / spike / after)",
        &by_phase(|phase| percent(phase.retry_share)),
    );
    row("most retries in one call", &|run| {
        run.max_retries_in_call.to_string()
    });
    row(
        "attempts refused on the device per user per minute (before / spike / after)",
        &by_phase(|phase| format!("{:.2}", phase.refused_locally_per_user_min)),
    );
    row(
        "calls in the spike: live / last good / nothing / left waiting",
        &|run| {
            let spike = &run.phases[1];
            format!(
                "{} / {} / {} / {}",
                percent(spike.live_share),
                percent(spike.last_good_share),
                percent(spike.nothing_share),
                percent(spike.left_share)
            )
        },
    );
    row(
        "calls answered live (before / spike / after)",
        &by_phase(|phase| percent(phase.live_share)),
    );
    row("tap to answer P50 / P99, ms, in the spike", &|run| {
        format!(
            "{} / {}",
            number(run.phases[1].shown_p50_ms, 1),
            number(run.phases[1].shown_p99_ms, 0)
        )
    });
    row(
        "the service's requests/s (before / spike / after)",
        &by_phase(|phase| format!("{:.0}", phase.service_rps)),
    );
    row(
        "429 share of its answers (before / spike / after)",
        &by_phase(|phase| percent(phase.limited_share)),
    );
    row(
        "its CPU, cores (before / spike / after)",
        &by_phase(|phase| number(phase.service_cores, 2)),
    );
    row("highest shed level", &|run| {
        run.phases
            .iter()
            .map(|phase| phase.max_shed_level)
            .max()
            .unwrap_or(0)
            .to_string()
    });
    row("recovery after the spike: service / users, s", &|run| {
        format!(
            "{} / {}",
            number(run.service_recovery_s, 0),
            number(run.user_recovery_s, 0)
        )
    });
    report.tables.push(table);
    for run in runs {
        let kind = run.kind.as_str();
        let headline = &mut report.headline;
        for (index, phase) in run.phases.iter().enumerate() {
            let at = PHASES[index];
            headline.insert(
                format!("requests_per_user_min_{at}_{kind}"),
                Some(phase.requests_per_user_min),
            );
            headline.insert(format!("retry_share_{at}_{kind}"), phase.retry_share);
            headline.insert(format!("service_rps_{at}_{kind}"), Some(phase.service_rps));
            headline.insert(format!("service_cores_{at}_{kind}"), phase.service_cores);
        }
        headline.insert(
            format!("retries_per_user_min_spike_{kind}"),
            Some(run.phases[1].retries_per_user_min),
        );
        headline.insert(format!("live_share_spike_{kind}"), run.phases[1].live_share);
        headline.insert(
            format!("max_retries_in_call_{kind}"),
            Some(f64::from(run.max_retries_in_call)),
        );
        headline.insert(format!("service_recovery_s_{kind}"), run.service_recovery_s);
        headline.insert(format!("user_recovery_s_{kind}"), run.user_recovery_s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(at_s: f64, sent: u64, refused: u64) -> LoadPoint {
        LoadPoint {
            at_s,
            sent,
            answered: sent,
            refused,
        }
    }

    #[test]
    fn the_service_has_recovered_after_three_calm_seconds() {
        // Before: 100/s. The spike ends at 10 s; the storm goes on for two seconds.
        let mut points: Vec<LoadPoint> = (0..10).map(|s| point(f64::from(s), 100, 0)).collect();
        points.push(point(10.0, 400, 300));
        points.push(point(11.0, 200, 0));
        points.push(point(12.0, 110, 1));
        points.push(point(13.0, 100, 0));
        points.push(point(14.0, 90, 0));
        points.push(point(15.0, 100, 0));
        // 200 is over 1.25 × 100 + 5; 110 with 1 refused is calm.
        assert_eq!(service_recovery(&points, 10.0, 100.0), Some(2.0));
        // Never calm for three seconds: not recovered.
        assert_eq!(service_recovery(&points[..13], 10.0, 100.0), None);
    }

    #[test]
    fn quantiles_over_users() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&values, 0.99), 99.0);
        assert_eq!(quantile(&values, 1.0), 100.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
