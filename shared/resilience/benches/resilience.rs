//! What the protection costs per call: breaker admit + record, bulkhead acquire + release, quota
//! acquire, shedder admit + complete (and the same on the admission queue's no-wait path: the
//! check a deferrable request makes while nobody waits, and every completion's notification),
//! per-client limiter, the per-item limit on upstream loads.
//! Each on one thread, and on two threads hammering the same guard (this machine has two cores)
//! — the contended figure is the time per operation on each thread while the other runs too.
//!
//! Run: `cargo bench -p rebate-resilience`.
#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark measures wall-clock time"
)]

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use rebate_resilience::{
    AdmissionQueue, BreakerConfig, Bulkhead, CircuitBreaker, ClassWait, KeyedLimiter, LoadShedder,
    MonotonicTicker, RateConfig, RequestClass, ShedConfig, Ticker, TokenBucket, WaitConfig,
};

fn ticker() -> Arc<dyn Ticker> {
    Arc::new(MonotonicTicker::new())
}

/// Runs `operation` `iters` times on each of two threads at once; the time per operation on one
/// thread.
fn on_two_threads<G: Send + Sync + 'static>(
    guard: &Arc<G>,
    iters: u64,
    operation: fn(&G),
) -> Duration {
    let barrier = Arc::new(Barrier::new(2));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (guard, barrier) = (Arc::clone(guard), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                let started = Instant::now();
                for _ in 0..iters {
                    operation(&guard);
                }
                started.elapsed()
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|thread| thread.join().unwrap())
        .max()
        .unwrap()
}

fn breaker_call(breaker: &CircuitBreaker) {
    if let Ok(permit) = breaker.try_acquire() {
        permit.success();
    }
}

fn bulkhead_call(bulkhead: &Bulkhead) {
    black_box(bulkhead.try_acquire().is_ok());
}

/// A bucket too large to run dry during the run, so every call takes the granting path.
fn bucket() -> TokenBucket {
    TokenBucket::new(RateConfig {
        per_second: 1e9,
        burst: u32::MAX,
    })
}

fn shedder_call(shedder: &LoadShedder) {
    let admission = shedder.admit();
    black_box(admission.level());
}

/// A shedder with an empty admission queue beside it, as the edge holds them.
struct QueuedShedder {
    shedder: LoadShedder,
    queue: AdmissionQueue,
}

/// A deferrable request's admission when nobody waits and there is room: the queue's check,
/// the shedder's room and admission, and the completion's notification.
fn queued_shedder_call(guards: &QueuedShedder) {
    let class = RequestClass::Prefetch;
    if !guards.queue.ahead(class) && guards.shedder.has_room() {
        let admission = guards.shedder.admit();
        black_box(class.served_at(admission.level()));
    }
    guards.queue.notify();
}

fn guards(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("guards");

    let breaker = Arc::new(CircuitBreaker::new(
        "bench",
        BreakerConfig::default(),
        ticker(),
    ));
    group.bench_function("breaker admit+record, 1 thread", |bench| {
        bench.iter(|| breaker_call(&breaker))
    });
    group.bench_function("breaker admit+record, 2 threads", |bench| {
        bench.iter_custom(|iters| on_two_threads(&breaker, iters, breaker_call))
    });

    let bulkhead = Arc::new(Bulkhead::new("bench", 1024));
    group.bench_function("bulkhead acquire+release, 1 thread", |bench| {
        bench.iter(|| bulkhead_call(&bulkhead))
    });
    group.bench_function("bulkhead acquire+release, 2 threads", |bench| {
        bench.iter_custom(|iters| on_two_threads(&bulkhead, iters, bulkhead_call))
    });

    let quota = Arc::new((bucket(), ticker()));
    let quota_call = |(bucket, ticker): &(TokenBucket, Arc<dyn Ticker>)| {
        black_box(bucket.try_acquire_at(ticker.now_nanos()).is_ok());
    };
    group.bench_function("quota acquire, 1 thread", |bench| {
        bench.iter(|| quota_call(&quota))
    });
    group.bench_function("quota acquire, 2 threads", |bench| {
        bench.iter_custom(|iters| on_two_threads(&quota, iters, quota_call))
    });

    let shedder = Arc::new(LoadShedder::new(ShedConfig::default(), ticker()));
    group.bench_function("shedder admit+complete, 1 thread", |bench| {
        bench.iter(|| shedder_call(&shedder))
    });
    group.bench_function("shedder admit+complete, 2 threads", |bench| {
        bench.iter_custom(|iters| on_two_threads(&shedder, iters, shedder_call))
    });
    let queued = Arc::new(QueuedShedder {
        shedder: LoadShedder::new(ShedConfig::default(), ticker()),
        queue: AdmissionQueue::new(
            WaitConfig::default().with(
                RequestClass::Prefetch,
                ClassWait {
                    max_waiters: 256,
                    max_wait: Duration::from_millis(200),
                },
            ),
            ticker(),
        ),
    });
    group.bench_function(
        "shedder admit+complete, no-wait queue path, 1 thread",
        |bench| bench.iter(|| queued_shedder_call(&queued)),
    );
    group.bench_function(
        "shedder admit+complete, no-wait queue path, 2 threads",
        |bench| bench.iter_custom(|iters| on_two_threads(&queued, iters, queued_shedder_call)),
    );

    let clients = Arc::new(KeyedLimiter::new(
        RateConfig {
            per_second: 1e9,
            burst: u32::MAX,
        },
        100_000,
        Duration::from_secs(300),
        ticker(),
    ));
    let client_call = |clients: &KeyedLimiter| {
        black_box(clients.try_acquire("id:app-ios-7.2").is_ok());
    };
    group.bench_function("per-client limit (known client), 1 thread", |bench| {
        bench.iter(|| client_call(&clients))
    });
    group.bench_function("per-client limit (known client), 2 threads", |bench| {
        bench.iter_custom(|iters| on_two_threads(&clients, iters, client_call))
    });

    // The per-item limit on upstream loads (`rebate-guard`'s hot items): the same keyed check,
    // once per load, over many items in turn — 10,000 items through a map of 16,384, each
    // bucket 1/s with bursts of 3, so most checks are refusals as for a viral item's reloads.
    let items = KeyedLimiter::new(
        RateConfig {
            per_second: 1.0,
            burst: 3,
        },
        16_384,
        Duration::from_secs(3),
        ticker(),
    );
    let keys: Vec<String> = (0..10_000)
        .map(|n| format!("taobao:{}", 100_001 + n))
        .collect();
    let mut next = 0;
    group.bench_function("per-item limit (10,000 items in turn), 1 thread", |bench| {
        bench.iter(|| {
            next = (next + 1) % keys.len();
            black_box(items.try_acquire(&keys[next]).is_ok())
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = guards
}
criterion_main!(benches);
