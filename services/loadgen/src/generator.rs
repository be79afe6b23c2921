//! The load itself: an open-loop generator that sends on schedule whatever the target does, and
//! a closed-loop saturation probe for finding the most a target can answer.
//!
//! Open loop: request *i* is due at `start + schedule.offset_of(i)`. The dispatcher sleeps until
//! then (or not at all when it is late), takes an in-flight permit without waiting and spawns
//! the request; its latency runs from the due time, so a slow target or a late dispatcher shows
//! up in the latency instead of silently lowering the offered rate (no coordinated omission).
//! No permit left means `client_overflow`, counted, never skipped silently.
//!
//! Threads: the dispatcher runs on the thread that drives the run (`rebate-loadgen`'s main
//! thread, in the runtime's `block_on`), not on a worker of the generator's runtime, so it never
//! waits behind a request; the requests it spawns go through the runtime's shared queue to every
//! worker. The closed-loop probe's connections are tasks spawned the same way, one per
//! connection, so the workers share them (and steal from each other when one falls behind).
//! Both read the generator's CPU over their measured part ([`crate::generator_bound`]).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::{
    Attempt, AttemptRecord, Behaviour, LoadClient, LogicalOutcome, RequestKind, RequestTimes,
    Target, TransportError,
};
pub use crate::generator_bound::{DispatchHealth, GENERATOR_WORKER_THREAD};
use crate::generator_bound::{RunCpu, RunCpuMeter};
use crate::keys::KeyPicker;
use crate::recorder::{Final, Phase, Recorded, Recorder};
use crate::schedule::Schedule;

/// What the simulated clients ask for and how they behave.
#[derive(Debug, Clone)]
pub struct Workload {
    pub keys: Arc<KeyPicker>,
    /// Share of logical requests sent as `POST /api/v1/items:batch` (0–1).
    pub batch_ratio: f64,
    /// Keys per batch, drawn uniformly in `batch_min..=batch_max` (1–50).
    pub batch_min: usize,
    pub batch_max: usize,
    /// Share of the *single-item* requests marked `x-request-class: prefetch` (0–1), so that
    /// a run shows the service refusing prefetches first. A share of the singles, not of all
    /// requests, so that any value fits any `batch_ratio`: all requests × (1 − batch_ratio) ×
    /// prefetch_ratio are prefetches.
    pub prefetch_ratio: f64,
    /// Share of requests from App clients (`app-ios-N`); the rest are H5 (`h5-web-N`).
    pub app_share: f64,
    /// Distinct client ids of each kind.
    pub clients_per_kind: u32,
    pub behaviour: Behaviour,
}

impl Workload {
    /// Singles only, well-behaved, 70 % App.
    pub fn singles(keys: Arc<KeyPicker>) -> Self {
        Self {
            keys,
            batch_ratio: 0.0,
            batch_min: 1,
            batch_max: 50,
            prefetch_ratio: 0.0,
            app_share: 0.7,
            clients_per_kind: 1000,
            behaviour: Behaviour::WellBehaved,
        }
    }

    /// Mean items per logical request.
    pub fn mean_items(&self) -> f64 {
        let mean_batch = (self.batch_min + self.batch_max) as f64 / 2.0;
        (1.0 - self.batch_ratio) + self.batch_ratio * mean_batch
    }

    /// The next request and client id, plus (draws, draws in the top 10 %).
    fn next(&self, rng: &mut SmallRng) -> (RequestKind, String, u32, u32) {
        let client = rng.random_range(1..=self.clients_per_kind.max(1));
        let client_id = if rng.random::<f64>() < self.app_share {
            format!("app-ios-{client}")
        } else {
            format!("h5-web-{client}")
        };
        if self.batch_ratio > 0.0 && rng.random::<f64>() < self.batch_ratio {
            let size = rng
                .random_range(self.batch_min..=self.batch_max)
                .clamp(1, 50)
                .min(self.keys.len());
            let mut seen = HashSet::with_capacity(size);
            let mut keys = Vec::with_capacity(size);
            let (mut draws, mut hot) = (0, 0);
            // Distinct keys; bounded tries (a Zipf draw repeats the hottest keys often).
            for _ in 0..size * 20 {
                if keys.len() == size {
                    break;
                }
                let (key, is_hot) = self.keys.pick(rng);
                if seen.insert(key) {
                    keys.push(key);
                    draws += 1;
                    hot += u32::from(is_hot);
                }
            }
            (RequestKind::Batch(keys), client_id, draws, hot)
        } else {
            let (key, is_hot) = self.keys.pick(rng);
            // Drawn only when asked for, so that without prefetches a seed still draws the
            // requests it drew before they existed.
            let prefetch = self.prefetch_ratio > 0.0 && rng.random::<f64>() < self.prefetch_ratio;
            let request = if prefetch {
                RequestKind::Prefetch(key)
            } else {
                RequestKind::Single(key)
            };
            (request, client_id, 1, u32::from(is_hot))
        }
    }
}

/// One open-loop run.
#[derive(Debug, Clone)]
pub struct OpenLoop {
    /// The whole schedule, warm-up included.
    pub schedule: Schedule,
    /// Requests due before this offset warm connections and caches and are not recorded;
    /// phases, windows and counts are measured from here.
    pub measure_from: Duration,
    /// Named parts of the run (e.g. before / during a fault), first at 0.
    pub phases: Vec<Phase>,
    /// Most logical requests in flight (retry waits included); beyond it: client_overflow.
    pub max_in_flight: usize,
    /// After the last due time, how long requests still in flight may take; then they are
    /// abandoned and counted as `unfinished`.
    pub drain_timeout: Duration,
    pub window: Duration,
    pub seed: u64,
}

/// What an open-loop run measured.
#[derive(Debug, Clone)]
pub struct RunOutput {
    pub recorded: Recorded,
    /// Requests due in the measured part.
    pub offered_requests: u64,
    /// Length of the measured part of the schedule.
    pub schedule_duration: Duration,
    pub offered_rps: f64,
    pub peak_offered_rps: f64,
    /// From the measured start to the last completion (or the drain bound).
    pub elapsed: Duration,
    /// HTTP requests sent, retries included.
    pub total_sent: u64,
    /// In flight when the drain bound ran out.
    pub unfinished: u64,
    /// Never dispatched because the dispatcher fell past the run's time bound.
    pub not_sent: u64,
    pub dispatch: DispatchHealth,
    /// The generator's CPU (and the target's) from the first measured request to the end of
    /// the drain; `None` where `/proc` cannot be read.
    pub cpu: Option<RunCpu>,
    pub key_draws: u64,
    pub hot_key_draws: u64,
}

/// Sends `plan`'s schedule from `start` (which may be slightly in the future so that samplers
/// and fault injectors can share it; the measured part begins at `start + plan.measure_from`).
pub async fn run_open_loop(
    client: &LoadClient,
    target: &Target,
    workload: &Workload,
    plan: &OpenLoop,
    start: Instant,
) -> RunOutput {
    let recorder = Arc::new(Recorder::new(plan.window, plan.phases.clone()));
    let permits = Arc::new(Semaphore::new(plan.max_in_flight));
    let sent = Arc::new(AtomicU64::new(0));
    let target = Arc::new(target.clone());
    let give_up_at = start + plan.schedule.duration() + plan.drain_timeout;
    let mut rng = SmallRng::seed_from_u64(plan.seed);
    let mut lag = Histogram::<u64>::new_with_max(600_000_000, 3).expect("valid histogram bounds");
    let mut tasks = JoinSet::new();
    let (mut key_draws, mut hot_key_draws) = (0_u64, 0_u64);
    let mut dispatched = 0_u64;
    let mut cpu_meter: Option<RunCpuMeter> = None;

    for offset in plan.schedule.offsets() {
        let due = start + offset;
        let now = Instant::now();
        if now >= give_up_at {
            break;
        }
        if due > now {
            tokio::time::sleep_until(due).await;
        }
        while tasks.try_join_next().is_some() {}
        let (request, client_id, draws, hot) = workload.next(&mut rng);
        let Some(measured_offset) = offset.checked_sub(plan.measure_from) else {
            // Warm-up: sent like the rest, recorded nowhere.
            if let Ok(permit) = permits.clone().try_acquire_owned() {
                let (client, target) = (client.clone(), target.clone());
                tasks.spawn(async move {
                    let _ = client.attempt(&target, &request, &client_id).await;
                    drop(permit);
                });
            }
            continue;
        };
        let offset = measured_offset;
        dispatched += 1;
        lag.saturating_record(Instant::now().saturating_duration_since(due).as_micros() as u64);
        if cpu_meter.is_none() {
            // Once, at the first measured request (after its lag is taken): the lead-in's
            // connection set-up is not the run's CPU.
            cpu_meter = Some(RunCpuMeter::start(target.cpu_source()));
        }
        key_draws += u64::from(draws);
        hot_key_draws += u64::from(hot);
        let class = request.class();
        let items = request.items() as u32;
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            recorder.record(
                offset,
                Duration::ZERO,
                Final::ClientOverflow,
                class,
                items,
                &[],
            );
            continue;
        };
        let (client, target, recorder, sent) = (
            client.clone(),
            target.clone(),
            recorder.clone(),
            sent.clone(),
        );
        let behaviour = workload.behaviour;
        tasks.spawn(async move {
            let count_attempt = || {
                sent.fetch_add(1, Ordering::Relaxed);
            };
            let outcome = client
                .logical(
                    &target,
                    &request,
                    &client_id,
                    behaviour,
                    RequestTimes { due, give_up_at },
                    &count_attempt,
                )
                .await;
            let latency = Instant::now().saturating_duration_since(due);
            recorder.record(
                offset,
                latency,
                final_of(&outcome),
                class,
                items,
                &outcome.log,
            );
            drop(permit);
        });
    }
    let measured_total = plan
        .schedule
        .offsets()
        .filter(|offset| *offset >= plan.measure_from)
        .count() as u64;
    let not_sent = measured_total.saturating_sub(dispatched);

    let drain_until = (Instant::now() + plan.drain_timeout).min(give_up_at.max(Instant::now()));
    let mut unfinished = 0;
    loop {
        tokio::select! {
            next = tasks.join_next() => {
                if next.is_none() {
                    break;
                }
            }
            () = tokio::time::sleep_until(drain_until) => {
                unfinished = tasks.len() as u64;
                tasks.abort_all();
                break;
            }
        }
    }
    let cpu = cpu_meter.as_ref().and_then(RunCpuMeter::finish);
    let measured_start = start + plan.measure_from;
    let elapsed = Instant::now().saturating_duration_since(measured_start);
    let schedule_duration = plan.schedule.duration().saturating_sub(plan.measure_from);
    RunOutput {
        recorded: recorder.snapshot(),
        offered_requests: measured_total,
        schedule_duration,
        offered_rps: measured_total as f64 / schedule_duration.as_secs_f64().max(1e-9),
        peak_offered_rps: plan.schedule.peak_rps(),
        elapsed,
        total_sent: sent.load(Ordering::Relaxed),
        unfinished,
        not_sent,
        dispatch: DispatchHealth {
            lag_p99_ms: lag.value_at_quantile(0.99) as f64 / 1000.0,
            lag_max_ms: lag.max() as f64 / 1000.0,
        },
        cpu,
        key_draws,
        hot_key_draws,
    }
}

fn final_of(outcome: &LogicalOutcome) -> Final {
    match &outcome.last {
        Attempt::Response(response) => Final::Response {
            status: response.status,
            business_ok: response.business_ok,
            shed_level: outcome.shed_level,
        },
        Attempt::Transport(TransportError::Overflow) => Final::ClientOverflow,
        Attempt::Transport(error) => Final::Transport(*error),
    }
}

/// What a closed-loop probe measured.
#[derive(Debug, Clone)]
pub struct ProbeOutput {
    pub recorded: Recorded,
    pub concurrency: usize,
    pub measured: Duration,
    /// 2xx answers per second over the measured part.
    pub ok_rps: f64,
    pub total_sent: u64,
    /// The generator's CPU (and the target's) over the counted part; `None` where `/proc`
    /// cannot be read.
    pub cpu: Option<RunCpu>,
}

/// `concurrency` connections each send one request, wait for it, send the next, for `warmup`
/// (not counted) then `duration`. Latency here is per send, as in any closed loop; it is the
/// throughput that this probe is for.
///
/// Each connection is a task of its own on the generator's runtime, so with several worker
/// threads they are spread over all of them (a closed loop on one task, or on one worker,
/// would cap the generator at one core and measure it instead of the target). The generator's
/// CPU is read over the counted part, from the end of the warm-up to the last answer.
pub async fn closed_loop_probe(
    client: &LoadClient,
    target: &Target,
    workload: &Workload,
    concurrency: usize,
    warmup: Duration,
    duration: Duration,
    seed: u64,
) -> ProbeOutput {
    let started = Instant::now();
    let measure_from = started + warmup;
    let end = measure_from + duration;
    let recorder = Arc::new(Recorder::new(
        Duration::from_secs(1),
        vec![Phase {
            name: "saturation".to_owned(),
            start: Duration::ZERO,
        }],
    ));
    let sent = Arc::new(AtomicU64::new(0));
    let mut connections = JoinSet::new();
    for connection in 0..concurrency {
        let (client, target, workload, recorder, sent) = (
            client.clone(),
            target.clone(),
            workload.clone(),
            recorder.clone(),
            sent.clone(),
        );
        connections.spawn(async move {
            let mut rng = SmallRng::seed_from_u64(seed.wrapping_add(connection as u64));
            // Bounded by time; each attempt is bounded by the client's timeout.
            while Instant::now() < end {
                let (request, client_id, _, _) = workload.next(&mut rng);
                let sent_at = Instant::now();
                let attempt = client.attempt(&target, &request, &client_id).await;
                let latency = sent_at.elapsed();
                if sent_at >= measure_from {
                    sent.fetch_add(1, Ordering::Relaxed);
                    let record = AttemptRecord {
                        status: attempt.status(),
                        latency,
                        refusal: attempt.refusal(),
                        retry_after: attempt.retry_after().is_some(),
                        queued: attempt.queued(),
                    };
                    let outcome = LogicalOutcome {
                        last: attempt,
                        attempts: 1,
                        shed_level: None,
                        log: Vec::new(),
                    };
                    recorder.record(
                        sent_at - measure_from,
                        latency,
                        final_of(&outcome),
                        request.class(),
                        request.items() as u32,
                        &[record],
                    );
                }
            }
        });
    }
    tokio::time::sleep_until(measure_from).await;
    let cpu_meter = RunCpuMeter::start(target.cpu_source());
    while connections.join_next().await.is_some() {}
    let cpu = cpu_meter.finish();
    let measured = Instant::now()
        .saturating_duration_since(measure_from)
        .max(duration);
    let recorded = recorder.snapshot();
    let ok_rps = recorded.total.ok_2xx() as f64 / measured.as_secs_f64();
    ProbeOutput {
        recorded,
        concurrency,
        measured,
        ok_rps,
        total_sent: sent.load(Ordering::Relaxed),
        cpu,
    }
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    use axum::routing::get;

    use super::*;
    use crate::client::RequestClass;
    use crate::schedule::Segment;

    async fn slow_server(delay: Duration) -> Target {
        let app = Router::new().fallback(get(move || async move {
            tokio::time::sleep(delay).await;
            "{\"degraded\":false}"
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Target::parse(&format!("http://{address}")).unwrap()
    }

    fn workload() -> Workload {
        Workload::singles(Arc::new(KeyPicker::service_hot_list(1).unwrap()))
    }

    #[tokio::test]
    async fn open_loop_keeps_sending_while_the_target_is_slow() {
        // 200 rps for 0.5 s against a target that takes 200 ms: a closed loop with few
        // connections would send far fewer; the open loop sends all 100 on time.
        let target = slow_server(Duration::from_millis(200)).await;
        let client = LoadClient::new(Duration::from_secs(2)).unwrap();
        let plan = OpenLoop {
            schedule: Schedule::new(vec![Segment::constant(200.0, Duration::from_millis(500))])
                .unwrap(),
            measure_from: Duration::ZERO,
            phases: vec![Phase {
                name: "all".into(),
                start: Duration::ZERO,
            }],
            max_in_flight: 1000,
            drain_timeout: Duration::from_secs(2),
            window: Duration::from_secs(1),
            seed: 5,
        };
        let output = run_open_loop(&client, &target, &workload(), &plan, Instant::now()).await;
        let total = output.recorded.total.summary();
        assert_eq!(output.offered_requests, 100);
        assert_eq!(total.logical_requests, 100);
        assert_eq!(total.ok_2xx, 100);
        assert_eq!(total.business_ok, 100);
        assert_eq!(output.total_sent, 100);
        assert!(total.p50_ms.unwrap() >= 199.0);
        assert!(
            output.elapsed < Duration::from_millis(1200),
            "{:?}",
            output.elapsed
        );
    }

    #[tokio::test]
    async fn beyond_the_in_flight_bound_requests_are_counted_as_overflow() {
        let target = slow_server(Duration::from_millis(300)).await;
        let client = LoadClient::new(Duration::from_secs(2)).unwrap();
        let plan = OpenLoop {
            schedule: Schedule::constant(100.0, Duration::from_millis(200)).unwrap(),
            measure_from: Duration::ZERO,
            phases: vec![Phase {
                name: "all".into(),
                start: Duration::ZERO,
            }],
            max_in_flight: 5,
            drain_timeout: Duration::from_secs(2),
            window: Duration::from_secs(1),
            seed: 5,
        };
        let output = run_open_loop(&client, &target, &workload(), &plan, Instant::now()).await;
        let total = output.recorded.total.summary();
        assert_eq!(total.logical_requests, 20);
        assert_eq!(total.client_overflow, 15);
        assert_eq!(output.total_sent, 5);
    }

    #[tokio::test]
    async fn the_drain_bound_abandons_requests_still_in_flight() {
        let target = slow_server(Duration::from_secs(5)).await;
        let client = LoadClient::new(Duration::from_secs(10)).unwrap();
        let plan = OpenLoop {
            schedule: Schedule::constant(50.0, Duration::from_millis(100)).unwrap(),
            measure_from: Duration::ZERO,
            phases: vec![Phase {
                name: "all".into(),
                start: Duration::ZERO,
            }],
            max_in_flight: 100,
            drain_timeout: Duration::from_millis(200),
            window: Duration::from_secs(1),
            seed: 5,
        };
        let started = std::time::Instant::now();
        let output = run_open_loop(&client, &target, &workload(), &plan, Instant::now()).await;
        assert_eq!(output.unfinished, 5);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn warm_up_requests_are_sent_but_not_recorded() {
        let target = slow_server(Duration::ZERO).await;
        let client = LoadClient::new(Duration::from_secs(2)).unwrap();
        let plan = OpenLoop {
            schedule: Schedule::new(vec![
                Segment::constant(100.0, Duration::from_millis(200)),
                Segment::constant(100.0, Duration::from_millis(300)),
            ])
            .unwrap(),
            measure_from: Duration::from_millis(200),
            phases: vec![Phase {
                name: "all".into(),
                start: Duration::ZERO,
            }],
            max_in_flight: 100,
            drain_timeout: Duration::from_secs(2),
            window: Duration::from_secs(1),
            seed: 5,
        };
        let output = run_open_loop(&client, &target, &workload(), &plan, Instant::now()).await;
        assert_eq!(output.offered_requests, 30);
        assert_eq!(output.recorded.total.logical(), 30);
        assert_eq!(output.total_sent, 30);
        assert!((output.offered_rps - 100.0).abs() < 1e-6);
        assert_eq!(output.schedule_duration, Duration::from_millis(300));
        // The CPU is read over the measured part, on this test's one-thread runtime; a test
        // server's CPU is not read.
        let cpu = output.cpu.expect("/proc is readable");
        assert_eq!(cpu.generator_workers, 1);
        assert_eq!(cpu.target_cores, None);
        assert!(cpu.wall_s > 0.0 && cpu.generator_cpu_s >= 0.0);
    }

    #[test]
    fn a_closed_loop_probe_reads_its_workers_and_its_targets_cpu() {
        // As rebate-loadgen runs it: two named workers, the ceiling in the same process.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(GENERATOR_WORKER_THREAD)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let ceiling = crate::ceiling::CeilingServer::start(
                b"{\"degraded\":false}".to_vec(),
                "application/json".to_owned(),
                1,
            )
            .unwrap();
            let client = LoadClient::new(Duration::from_secs(2)).unwrap();
            let probe = closed_loop_probe(
                &client,
                &ceiling.target().unwrap(),
                &workload(),
                4,
                Duration::from_millis(50),
                Duration::from_millis(300),
                5,
            )
            .await;
            assert!(probe.recorded.total.ok_2xx() > 0);
            let cpu = probe.cpu.expect("/proc is readable");
            assert_eq!(cpu.generator_workers, 2, "read from the runtime");
            assert!(
                cpu.worker_cores.is_some(),
                "the workers are told apart by name"
            );
            assert!(!cpu.worker_cores_each.is_empty() && cpu.worker_cores_each.len() <= 2);
            assert!(
                cpu.target_cores.is_some(),
                "the ceiling's threads are the target"
            );
        });
    }

    #[tokio::test]
    async fn a_503_then_200_after_retry_after_is_slow_logically_but_fast_when_admitted() {
        // The service sheds the request (503, Retry-After: 1), then answers the retry at once:
        // the logical latency holds the 1 s wait, the admitted attempt only its own few ms.
        let (target, calls) = crate::client::test_server::overloaded_for(1).await;
        let client = LoadClient::new(Duration::from_secs(2)).unwrap();
        let plan = OpenLoop {
            schedule: Schedule::constant(1.0, Duration::from_secs(1)).unwrap(),
            measure_from: Duration::ZERO,
            phases: vec![Phase {
                name: "all".into(),
                start: Duration::ZERO,
            }],
            max_in_flight: 10,
            drain_timeout: Duration::from_secs(3),
            window: Duration::from_secs(1),
            seed: 5,
        };
        let output = run_open_loop(&client, &target, &workload(), &plan, Instant::now()).await;
        let total = output.recorded.total.summary();
        assert_eq!(total.logical_requests, 1);
        assert_eq!((total.ok_2xx, total.business_ok), (1, 1));
        assert_eq!((output.total_sent, total.attempts), (2, 2));
        assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 2);
        assert_eq!(total.received_503, 1);
        assert_eq!(total.server_errors_non_503, 0);
        assert_eq!(total.admitted_attempts, 1);
        let logical = total.p99_ms.unwrap();
        assert!(logical >= 1000.0, "logical latency {logical} ms");
        let admitted = total.admitted_p99_ms.unwrap();
        assert!(admitted < 100.0, "admitted-attempt latency {admitted} ms");
        let window = &output.recorded.windows[0].summary();
        assert_eq!(window.admitted_p99_ms, total.admitted_p99_ms);
    }

    /// Answers a prefetch as the shedding service may (503 `overloaded`, `Retry-After: 0`,
    /// `x-shed-level: 3`), any other class header 400, and a page 200 at `x-shed-level: 1`.
    async fn class_aware_server() -> Target {
        let app = Router::new().fallback(get(|headers: HeaderMap| async move {
            match headers.get("x-request-class").map(|value| value.as_bytes()) {
                Some(b"prefetch") => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [("x-shed-level", "3"), ("retry-after", "0")],
                    r#"{"error":{"code":"overloaded"}}"#,
                )
                    .into_response(),
                Some(_) => StatusCode::BAD_REQUEST.into_response(),
                None => ([("x-shed-level", "1")], r#"{"degraded":false}"#).into_response(),
            }
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Target::parse(&format!("http://{address}")).unwrap()
    }

    #[tokio::test]
    async fn prefetches_carry_their_class_and_are_recorded_apart() {
        let target = class_aware_server().await;
        let client = LoadClient::new(Duration::from_secs(2)).unwrap();
        let mut workload = workload();
        workload.prefetch_ratio = 0.5;
        let plan = OpenLoop {
            schedule: Schedule::constant(200.0, Duration::from_millis(500)).unwrap(),
            measure_from: Duration::ZERO,
            phases: vec![Phase {
                name: "all".into(),
                start: Duration::ZERO,
            }],
            max_in_flight: 1000,
            drain_timeout: Duration::from_secs(3),
            window: Duration::from_secs(1),
            seed: 5,
        };
        let output = run_open_loop(&client, &target, &workload, &plan, Instant::now()).await;
        let page = output.recorded.class(RequestClass::Page).summary();
        let prefetch = output.recorded.class(RequestClass::Prefetch).summary();
        assert_eq!(page.logical_requests + prefetch.logical_requests, 100);
        assert!(
            (30..=70).contains(&prefetch.logical_requests),
            "{prefetch:?}"
        );
        assert_eq!(page.ok_2xx, page.logical_requests, "no page sent a class");
        assert_eq!(page.max_shed_level_seen, Some(1));
        // Refused, retried twice after the `Retry-After: 0`, refused again.
        assert_eq!(prefetch.ok_2xx, 0);
        assert_eq!(prefetch.received_503, 3 * prefetch.logical_requests);
        assert_eq!(prefetch.max_shed_level_seen, Some(3));
        assert_eq!(output.recorded.class(RequestClass::List).logical(), 0);
        // The window's level is the pages' (the level the service measured).
        assert_eq!(
            output.recorded.windows[0].summary().max_shed_level_seen,
            Some(1)
        );
    }

    #[test]
    fn the_prefetch_share_is_a_share_of_the_single_item_requests() {
        let mut workload = workload();
        workload.batch_ratio = 0.2;
        workload.batch_min = 2;
        workload.batch_max = 5;
        workload.prefetch_ratio = 0.25;
        let mut rng = SmallRng::seed_from_u64(11);
        let draws = 20_000;
        let (mut batches, mut prefetches) = (0_u32, 0_u32);
        for _ in 0..draws {
            match workload.next(&mut rng).0 {
                RequestKind::Batch(_) => batches += 1,
                RequestKind::Prefetch(_) => prefetches += 1,
                RequestKind::Single(_) => {}
            }
        }
        let batch_share = f64::from(batches) / f64::from(draws);
        let prefetch_share_of_singles = f64::from(prefetches) / f64::from(draws - batches);
        assert!((batch_share - 0.2).abs() < 0.015, "{batch_share}");
        assert!(
            (prefetch_share_of_singles - 0.25).abs() < 0.015,
            "{prefetch_share_of_singles}"
        );

        workload.prefetch_ratio = 0.0;
        for _ in 0..1000 {
            let (request, _, _, _) = workload.next(&mut rng);
            assert!(!matches!(request, RequestKind::Prefetch(_)));
        }
    }

    #[test]
    fn batches_hold_distinct_keys_within_bounds() {
        let mut workload = workload();
        workload.batch_ratio = 1.0;
        workload.batch_min = 10;
        workload.batch_max = 50;
        let mut rng = SmallRng::seed_from_u64(9);
        for _ in 0..200 {
            let (request, client_id, _, _) = workload.next(&mut rng);
            assert!(client_id.starts_with("app-ios-") || client_id.starts_with("h5-web-"));
            let RequestKind::Batch(keys) = request else {
                panic!("batch expected")
            };
            assert!((10..=50).contains(&keys.len()));
            let distinct: HashSet<_> = keys.iter().collect();
            assert_eq!(distinct.len(), keys.len());
        }
        assert!((workload.mean_items() - 30.0).abs() < 1e-9);
    }
}
