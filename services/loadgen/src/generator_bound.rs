//! Whether a run measured its target or the generator. The harness's CPU over every measured
//! run (its threads but the in-process ceiling's, read from `/proc`), the target's over the same
//! span, and the *generator-bound* verdict drawn from them and from the dispatcher's punctuality.
//!
//! Why: on this 2-core machine the generator, the service and the in-process ceiling share the
//! cores. A closed loop whose generator runs out of CPU measures the generator; an open loop
//! whose dispatcher runs late, or that dropped requests at its in-flight bound, did not offer
//! the load its schedule says. Either way the figure is the harness's, and its row has to say
//! so, not a paragraph in the docs.
//!
//! The verdict ([`judge`]) is a pure function of the figures, with its thresholds as constants
//! here, so that what "generator-bound" means is tested and written down in one place
//! (docs/LOADGEN.md, "Generator-bound").

use std::fmt;
use std::time::Instant;

use serde::Serialize;

use crate::ceiling::CEILING_THREAD;
use crate::procfs::{self, CpuSource, ThreadCpu};

/// The name of the generator runtime's worker threads (`rebate-loadgen` names its runtimes so):
/// how `/proc/self/task` tells them from the dispatcher's thread and the ceiling's.
pub const GENERATOR_WORKER_THREAD: &str = "loadgen-worker";
// Linux keeps 15 bytes of a thread's name (`comm`); a longer one would not be found again.
const _: () = assert!(GENERATOR_WORKER_THREAD.len() <= 15);

/// How punctual the dispatcher was: if it runs late, the generator (not the target) is the
/// bottleneck and the report says so.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DispatchHealth {
    pub lag_p99_ms: f64,
    pub lag_max_ms: f64,
}

/// The generator's worker threads are saturated at this share of the cores they may use
/// (one per worker, at most the machine's): a thread runnable all the time still loses some
/// ticks to the scheduler, so 100 % is never read.
pub const SATURATED_SHARE: f64 = 0.9;
/// A closed loop's generator and target together use at least this share of the machine's
/// cores: the machine is full, and the CPU one of them takes is CPU the other does not get.
pub const BUSY_MACHINE_SHARE: f64 = 0.9;
/// An open loop's dispatcher later than this at P99 (ms) did not send on schedule.
pub const DISPATCH_LAG_P99_LIMIT_MS: f64 = 1.0;

/// What `/proc` says at one instant: this process's CPU (exited threads included), each live
/// thread's, and the target's when it is a process of its own.
#[derive(Debug, Clone)]
pub struct CpuSnapshot {
    at: Instant,
    process_ticks: u64,
    threads: Vec<ThreadCpu>,
    target: CpuSource,
    target_process_ticks: Option<u64>,
}

impl CpuSnapshot {
    /// Reads `/proc` now (about one file per thread of this process); `None` when this
    /// process's own `/proc/self/stat` cannot be read (not Linux).
    pub fn take(target: CpuSource) -> Option<Self> {
        let at = Instant::now();
        let process_ticks = procfs::cpu_ticks(None)?;
        let target_process_ticks = match target {
            CpuSource::Process(pid) => procfs::cpu_ticks(Some(pid)),
            CpuSource::Unmeasured | CpuSource::OwnThreads(_) => None,
        };
        Some(Self {
            at,
            process_ticks,
            threads: procfs::own_threads(),
            target,
            target_process_ticks,
        })
    }
}

/// The CPU of one measured run: the generator's (every thread of the harness process but the
/// in-process ceiling's) and its target's, each as cores kept busy (CPU seconds ÷ wall
/// seconds: 1.0 is one core).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunCpu {
    pub wall_s: f64,
    /// CPU seconds of the harness's threads but the in-process servers' (the ceiling, or a
    /// target served by threads of this process).
    pub generator_cpu_s: f64,
    /// `generator_cpu_s ÷ wall_s`.
    pub generator_cores: f64,
    /// `generator_cores ÷ machine_cores`.
    pub generator_machine_share: f64,
    /// Worker threads of the generator's runtime (`--generator-threads`).
    pub generator_workers: usize,
    /// The cores used by those workers alone (threads named [`GENERATOR_WORKER_THREAD`]); the
    /// rest of `generator_cores` is the thread that drives the run (the open loop's
    /// dispatcher). `None` when no thread bears the name (a runtime not built by
    /// `rebate-loadgen`, e.g. a test's).
    pub worker_cores: Option<f64>,
    /// The same per worker thread, busiest first: how evenly the load spread over them.
    pub worker_cores_each: Vec<f64>,
    /// The target's cores over the same span: the service's process, or the ceiling's threads;
    /// `None` when not measured.
    pub target_cores: Option<f64>,
    /// The cores this process may run on.
    pub machine_cores: usize,
}

impl RunCpu {
    /// The CPU used from `start` to `end` (two snapshots taken with the same target), with the
    /// runtime's `workers` and the machine's cores.
    pub fn between(
        start: &CpuSnapshot,
        end: &CpuSnapshot,
        workers: usize,
        machine_cores: usize,
        ticks_per_second: f64,
    ) -> Self {
        let wall_s = end.at.saturating_duration_since(start.at).as_secs_f64();
        let per_wall = |ticks: u64| ticks as f64 / ticks_per_second / wall_s.max(1e-9);
        let (ceiling_ticks, _) = named_ticks(&start.threads, &end.threads, CEILING_THREAD);
        let in_process_target = match end.target {
            CpuSource::OwnThreads(name) => {
                Some((name, named_ticks(&start.threads, &end.threads, name).0))
            }
            CpuSource::Unmeasured | CpuSource::Process(_) => None,
        };
        let excluded = ceiling_ticks
            + in_process_target
                .filter(|(name, _)| *name != CEILING_THREAD)
                .map_or(0, |(_, ticks)| ticks);
        let generator_ticks = end
            .process_ticks
            .saturating_sub(start.process_ticks)
            .saturating_sub(excluded);
        let generator_cpu_s = generator_ticks as f64 / ticks_per_second;
        let generator_cores = per_wall(generator_ticks);
        let (worker_ticks, mut each) =
            named_ticks(&start.threads, &end.threads, GENERATOR_WORKER_THREAD);
        each.sort_unstable_by(|a, b| b.cmp(a));
        each.truncate(workers.max(1));
        let target_cores = match end.target {
            CpuSource::Unmeasured => None,
            CpuSource::Process(_) => match (start.target_process_ticks, end.target_process_ticks) {
                (Some(before), Some(after)) => Some(per_wall(after.saturating_sub(before))),
                _ => None,
            },
            CpuSource::OwnThreads(_) => in_process_target.map(|(_, ticks)| per_wall(ticks)),
        };
        let machine_cores = machine_cores.max(1);
        Self {
            wall_s,
            generator_cpu_s,
            generator_cores,
            generator_machine_share: generator_cores / machine_cores as f64,
            generator_workers: workers,
            worker_cores: (!each.is_empty()).then(|| per_wall(worker_ticks)),
            worker_cores_each: each.into_iter().map(per_wall).collect(),
            target_cores,
            machine_cores,
        }
    }
}

/// Measures a run: [`RunCpuMeter::start`] where the measured part begins, [`RunCpuMeter::finish`]
/// where it ends.
#[derive(Debug, Clone)]
pub struct RunCpuMeter {
    start: Option<CpuSnapshot>,
}

impl RunCpuMeter {
    pub fn start(target: CpuSource) -> Self {
        Self {
            start: CpuSnapshot::take(target),
        }
    }

    /// The CPU since [`RunCpuMeter::start`], with the worker count of the runtime this runs on.
    pub fn finish(&self) -> Option<RunCpu> {
        let start = self.start.as_ref()?;
        let end = CpuSnapshot::take(start.target)?;
        let workers = tokio::runtime::Handle::try_current()
            .map_or(1, |runtime| runtime.metrics().num_workers());
        Some(RunCpu::between(
            start,
            &end,
            workers,
            procfs::machine_cores(),
            procfs::clock_ticks_per_second(),
        ))
    }
}

/// Ticks used between two thread listings by the threads named `name` in `end`, in all and per
/// thread. A thread that started since `start` counts from 0; one that exited before `end` is
/// not seen (its ticks are in the process's total, so an exiting ceiling thread would be
/// counted as the generator's: the ceiling outlives every run that measures it).
fn named_ticks(start: &[ThreadCpu], end: &[ThreadCpu], name: &str) -> (u64, Vec<u64>) {
    let each: Vec<u64> = end
        .iter()
        .filter(|thread| thread.name == name)
        .map(|thread| {
            let before = start
                .iter()
                .find(|earlier| earlier.tid == thread.tid && earlier.name == thread.name)
                .map_or(0, |earlier| earlier.ticks);
            thread.ticks.saturating_sub(before)
        })
        .collect();
    (each.iter().sum(), each)
}

/// Open or closed loop: only a closed loop's throughput is set by how fast the generator can
/// go, so only there is the generator's share of a full machine a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopKind {
    Open,
    Closed,
}

/// What [`judge`] decides from.
#[derive(Debug, Clone, Copy)]
pub struct Evidence<'a> {
    pub kind: LoopKind,
    pub cpu: Option<&'a RunCpu>,
    /// The open loop's dispatcher lateness.
    pub dispatch: Option<DispatchHealth>,
    /// Requests not sent because `--max-in-flight` was reached.
    pub client_overflow: u64,
    /// Requests never dispatched because the dispatcher fell past the run's time bound.
    pub not_sent: u64,
}

/// Why a run was generator-bound.
#[derive(Debug, Clone, PartialEq)]
pub enum Reason {
    /// The generator's workers used ≥ [`SATURATED_SHARE`] of the cores they may use.
    WorkersSaturated {
        cores: f64,
        may_use: usize,
    },
    /// A closed loop's generator used more CPU than its target on a machine they kept
    /// ≥ [`BUSY_MACHINE_SHARE`] busy.
    MoreCpuThanTarget {
        generator: f64,
        target: f64,
        machine_cores: usize,
    },
    /// The open loop's dispatcher was late by more than [`DISPATCH_LAG_P99_LIMIT_MS`] at P99.
    DispatchLate {
        p99_ms: f64,
        max_ms: f64,
    },
    ClientOverflow {
        requests: u64,
    },
    NotSent {
        requests: u64,
    },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WorkersSaturated { cores, may_use } => write!(
                f,
                "its worker threads used {cores:.2} of the {may_use} core(s) they may use \
                 (≥ {:.0} %)",
                SATURATED_SHARE * 100.0
            ),
            Self::MoreCpuThanTarget {
                generator,
                target,
                machine_cores,
            } => write!(
                f,
                "it used more CPU than its target ({generator:.2} against {target:.2} cores) \
                 while the two kept ≥ {:.0} % of the {machine_cores} core(s) busy: the \
                 throughput is the machine's split between them",
                BUSY_MACHINE_SHARE * 100.0
            ),
            Self::DispatchLate { p99_ms, max_ms } => write!(
                f,
                "the dispatcher ran late (P99 {p99_ms:.2} ms, max {max_ms:.2} ms behind \
                 schedule, limit {DISPATCH_LAG_P99_LIMIT_MS} ms); the lag is inside the \
                 latencies, which are measured from the scheduled time"
            ),
            Self::ClientOverflow { requests } => write!(
                f,
                "{requests} request(s) not sent because --max-in-flight was reached (client \
                 overflow): the harness cut the offered load"
            ),
            Self::NotSent { requests } => write!(
                f,
                "{requests} request(s) never dispatched: the dispatcher fell past the run's \
                 time bound"
            ),
        }
    }
}

/// Whether the generator, not the target, was the limit of a run: every reason found, none
/// when it was not. Missing figures (no CPU read, no dispatcher) are not evidence either way.
pub fn judge(evidence: &Evidence<'_>) -> Vec<Reason> {
    let mut reasons = Vec::new();
    if let Some(cpu) = evidence.cpu {
        // The workers alone when they can be told apart, else every generator thread.
        let cores = cpu.worker_cores.unwrap_or(cpu.generator_cores);
        let may_use = cpu.generator_workers.clamp(1, cpu.machine_cores.max(1));
        if cores >= SATURATED_SHARE * may_use as f64 {
            reasons.push(Reason::WorkersSaturated { cores, may_use });
        }
        if evidence.kind == LoopKind::Closed
            && let Some(target) = cpu.target_cores
            && cpu.generator_cores > target
            && cpu.generator_cores + target >= BUSY_MACHINE_SHARE * cpu.machine_cores as f64
        {
            reasons.push(Reason::MoreCpuThanTarget {
                generator: cpu.generator_cores,
                target,
                machine_cores: cpu.machine_cores,
            });
        }
    }
    if let Some(dispatch) = evidence.dispatch
        && dispatch.lag_p99_ms > DISPATCH_LAG_P99_LIMIT_MS
    {
        reasons.push(Reason::DispatchLate {
            p99_ms: dispatch.lag_p99_ms,
            max_ms: dispatch.lag_max_ms,
        });
    }
    if evidence.client_overflow > 0 {
        reasons.push(Reason::ClientOverflow {
            requests: evidence.client_overflow,
        });
    }
    if evidence.not_sent > 0 {
        reasons.push(Reason::NotSent {
            requests: evidence.not_sent,
        });
    }
    reasons
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn thread(tid: u32, name: &str, ticks: u64) -> ThreadCpu {
        ThreadCpu {
            tid,
            name: name.to_owned(),
            ticks,
        }
    }

    /// Two snapshots 2 s apart: the process used 300 ticks (3 s at 100 ticks/s) in between.
    fn snapshots(target: CpuSource) -> (CpuSnapshot, CpuSnapshot) {
        let at = Instant::now();
        let start = CpuSnapshot {
            at,
            process_ticks: 1000,
            threads: vec![
                thread(1, "rebate-loadgen", 10),
                thread(2, GENERATOR_WORKER_THREAD, 0),
                thread(3, GENERATOR_WORKER_THREAD, 50),
                thread(4, CEILING_THREAD, 0),
                thread(5, CEILING_THREAD, 0),
                thread(6, CEILING_THREAD, 30),
            ],
            target,
            target_process_ticks: Some(500),
        };
        let end = CpuSnapshot {
            at: at + Duration::from_secs(2),
            process_ticks: 1300,
            threads: vec![
                thread(1, "rebate-loadgen", 30),
                thread(2, GENERATOR_WORKER_THREAD, 100),
                thread(3, GENERATOR_WORKER_THREAD, 120),
                thread(4, CEILING_THREAD, 80),
                thread(5, CEILING_THREAD, 40),
                // Thread 6 exited; thread 7 is a new (blocking-pool) thread of the runtime.
                thread(7, GENERATOR_WORKER_THREAD, 5),
            ],
            target,
            target_process_ticks: Some(740),
        };
        (start, end)
    }

    fn close(actual: f64, expected: f64) -> bool {
        (actual - expected).abs() < 1e-9
    }

    #[test]
    fn the_generator_is_the_process_but_the_ceiling_and_the_target_its_ceiling_threads() {
        let (start, end) = snapshots(CpuSource::OwnThreads(CEILING_THREAD));
        let cpu = RunCpu::between(&start, &end, 2, 2, 100.0);
        assert!(close(cpu.wall_s, 2.0));
        // 300 ticks of the process − 120 of the ceiling's threads = 1.8 s over 2 s.
        assert!(close(cpu.generator_cpu_s, 1.8), "{cpu:?}");
        assert!(close(cpu.generator_cores, 0.9), "{cpu:?}");
        assert!(close(cpu.generator_machine_share, 0.45), "{cpu:?}");
        assert!(close(cpu.target_cores.unwrap(), 0.6), "{cpu:?}");
        // Workers 100 + 70 + 5 ticks; per thread the two busiest, as there are two workers.
        assert!(close(cpu.worker_cores.unwrap(), 0.875), "{cpu:?}");
        assert_eq!(cpu.worker_cores_each.len(), 2);
        assert!(close(cpu.worker_cores_each[0], 0.5) && close(cpu.worker_cores_each[1], 0.35));
        assert_eq!((cpu.generator_workers, cpu.machine_cores), (2, 2));
    }

    #[test]
    fn a_service_targets_cpu_is_its_process_and_the_idle_ceiling_is_still_not_the_generator() {
        let (start, end) = snapshots(CpuSource::Process(4242));
        let cpu = RunCpu::between(&start, &end, 1, 2, 100.0);
        assert!(close(cpu.target_cores.unwrap(), 1.2), "{cpu:?}");
        assert!(close(cpu.generator_cores, 0.9), "{cpu:?}");
        assert_eq!(cpu.worker_cores_each.len(), 1);

        let (start, mut end) = snapshots(CpuSource::Process(4242));
        end.target_process_ticks = None; // the service exited during the run
        let cpu = RunCpu::between(&start, &end, 1, 2, 100.0);
        assert_eq!(cpu.target_cores, None);

        let (start, end) = snapshots(CpuSource::Unmeasured);
        let cpu = RunCpu::between(&start, &end, 1, 2, 100.0);
        assert_eq!(cpu.target_cores, None);
    }

    #[test]
    fn without_named_workers_there_is_no_worker_figure() {
        let (mut start, mut end) = snapshots(CpuSource::Unmeasured);
        for snapshot in [&mut start, &mut end] {
            snapshot
                .threads
                .retain(|thread| thread.name != GENERATOR_WORKER_THREAD);
        }
        let cpu = RunCpu::between(&start, &end, 2, 2, 100.0);
        assert_eq!(cpu.worker_cores, None);
        assert!(cpu.worker_cores_each.is_empty());
    }

    fn cpu(workers: usize, worker: Option<f64>, generator: f64, target: Option<f64>) -> RunCpu {
        RunCpu {
            wall_s: 10.0,
            generator_cpu_s: generator * 10.0,
            generator_cores: generator,
            generator_machine_share: generator / 2.0,
            generator_workers: workers,
            worker_cores: worker,
            worker_cores_each: worker.into_iter().collect(),
            target_cores: target,
            machine_cores: 2,
        }
    }

    fn closed(cpu: &RunCpu) -> Vec<Reason> {
        judge(&Evidence {
            kind: LoopKind::Closed,
            cpu: Some(cpu),
            dispatch: None,
            client_overflow: 0,
            not_sent: 0,
        })
    }

    fn open(cpu: &RunCpu, lag_p99_ms: f64, client_overflow: u64, not_sent: u64) -> Vec<Reason> {
        judge(&Evidence {
            kind: LoopKind::Open,
            cpu: Some(cpu),
            dispatch: Some(DispatchHealth {
                lag_p99_ms,
                lag_max_ms: lag_p99_ms * 4.0,
            }),
            client_overflow,
            not_sent,
        })
    }

    #[test]
    fn one_saturated_worker_makes_a_closed_loop_generator_bound() {
        let reasons = closed(&cpu(1, Some(0.95), 1.0, Some(0.9)));
        assert_eq!(
            reasons,
            [
                Reason::WorkersSaturated {
                    cores: 0.95,
                    may_use: 1
                },
                Reason::MoreCpuThanTarget {
                    generator: 1.0,
                    target: 0.9,
                    machine_cores: 2
                }
            ]
        );
        assert!(reasons[0].to_string().contains("0.95 of the 1 core(s)"));
        // The same worker with room left, against a target that takes more: not bound.
        assert!(closed(&cpu(1, Some(0.7), 0.72, Some(1.25))).is_empty());
    }

    #[test]
    fn workers_are_capped_by_the_machine() {
        // Four workers on two cores may use two: 1.85 is saturated, 1.7 is not.
        assert_eq!(
            closed(&cpu(4, Some(1.85), 1.9, None)),
            [Reason::WorkersSaturated {
                cores: 1.85,
                may_use: 2
            }]
        );
        assert!(closed(&cpu(4, Some(1.7), 1.75, None)).is_empty());
    }

    #[test]
    fn a_closed_loop_taking_more_cpu_than_its_target_is_bound_only_on_a_full_machine() {
        // 1.05 + 0.9 ≥ 90 % of 2 cores, and the generator took the larger part.
        assert_eq!(
            closed(&cpu(2, Some(1.0), 1.05, Some(0.9))),
            [Reason::MoreCpuThanTarget {
                generator: 1.05,
                target: 0.9,
                machine_cores: 2
            }]
        );
        // The target took the larger part of a full machine: the target is the limit.
        assert!(closed(&cpu(2, Some(0.7), 0.7, Some(1.3))).is_empty());
        // A slow target that waits on I/O: neither is short of CPU.
        assert!(closed(&cpu(2, Some(0.3), 0.3, Some(0.1))).is_empty());
        // No target figure: no comparison.
        assert!(closed(&cpu(2, Some(1.0), 1.05, None)).is_empty());
    }

    #[test]
    fn without_named_workers_the_whole_generator_counts() {
        assert_eq!(
            closed(&cpu(1, None, 0.93, None)),
            [Reason::WorkersSaturated {
                cores: 0.93,
                may_use: 1
            }]
        );
        assert!(closed(&cpu(1, None, 0.5, None)).is_empty());
    }

    #[test]
    fn an_open_loop_is_bound_by_a_late_dispatcher_overflow_or_requests_not_sent() {
        let healthy = cpu(2, Some(0.6), 0.75, Some(1.2));
        assert!(open(&healthy, 0.4, 0, 0).is_empty());
        assert!(open(&healthy, DISPATCH_LAG_P99_LIMIT_MS, 0, 0).is_empty());
        assert_eq!(
            open(&healthy, 2.5, 0, 0),
            [Reason::DispatchLate {
                p99_ms: 2.5,
                max_ms: 10.0
            }]
        );
        assert_eq!(
            open(&healthy, 0.4, 15, 3),
            [
                Reason::ClientOverflow { requests: 15 },
                Reason::NotSent { requests: 3 }
            ]
        );
        // Taking more CPU than the target does not limit an open loop: its rate is fixed.
        assert!(open(&cpu(2, Some(0.9), 1.1, Some(0.8)), 0.4, 0, 0).is_empty());
        // A saturated worker does: answers wait for it, inside the latencies.
        assert_eq!(
            open(&cpu(1, Some(0.97), 1.2, Some(0.6)), 0.4, 0, 0),
            [Reason::WorkersSaturated {
                cores: 0.97,
                may_use: 1
            }]
        );
    }

    #[test]
    fn no_figures_are_no_evidence() {
        let reasons = judge(&Evidence {
            kind: LoopKind::Closed,
            cpu: None,
            dispatch: None,
            client_overflow: 0,
            not_sent: 0,
        });
        assert!(reasons.is_empty());
    }

    #[test]
    fn a_meter_reads_the_ceilings_threads_as_the_target_and_not_as_the_generator() {
        const TICKS: u64 = 3;
        let meter = RunCpuMeter::start(CpuSource::OwnThreads(CEILING_THREAD));
        let spinner = procfs::SpunThread::start(CEILING_THREAD, TICKS);
        let cpu = meter.finish().unwrap();
        let (name, ticks) = spinner.finish();
        assert_eq!(name, CEILING_THREAD, "the name survives comm's 15 bytes");
        assert!(ticks >= TICKS);
        let target_s = cpu.target_cores.unwrap() * cpu.wall_s;
        let tick_s = 1.0 / procfs::clock_ticks_per_second();
        assert!(target_s >= TICKS as f64 * tick_s - 1e-9, "{cpu:?}");
        assert!(cpu.generator_cpu_s >= 0.0 && cpu.wall_s > 0.0, "{cpu:?}");
    }
}
