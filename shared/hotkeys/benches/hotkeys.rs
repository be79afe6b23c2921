//! What counting a hot key costs on the request path: `record` of a 24-byte `ItemKey` drawn from
//! a Zipf stream (30,000 items, exponent 1.15: the top 10 % get 90 % of the draws) into the
//! default sketch (4096 counters over 16 shards), already full so that evictions happen as in
//! service. On one thread, and on two threads recording into the same sketch at once (this
//! machine has two cores) — the two-thread figure is the time per record on each thread while
//! the other runs too.
//!
//! Run: `cargo bench -p rebate-hotkeys` (add `-- --quick` for a short run).
#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark measures wall-clock time"
)]

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Zipf};
use rebate_domain::{ItemId, ItemKey, Platform};
use rebate_hotkeys::{HeavyHitters, HotKeysConfig};

const ITEMS: f64 = 30_000.0;
const EXPONENT: f64 = 1.15;
/// Draws cycled through by the benchmark: a power of two, so the index is masked.
const STREAM: usize = 1 << 16;

fn zipf_stream(seed: u64) -> Arc<[ItemKey]> {
    let zipf = Zipf::new(ITEMS, EXPONENT).unwrap();
    let mut rng = SmallRng::seed_from_u64(seed);
    let platforms = [Platform::Taobao, Platform::Jd, Platform::Pdd];
    (0..STREAM)
        .map(|_| {
            let rank = zipf.sample(&mut rng) as u64;
            let platform = platforms[(rank % 3) as usize];
            ItemKey::new(platform, ItemId::from_u64(100_000 + rank))
        })
        .collect()
}

/// A default sketch that has already seen the stream once.
fn warm_sketch(stream: &[ItemKey]) -> Arc<HeavyHitters<ItemKey>> {
    let hitters = HeavyHitters::new(HotKeysConfig::default()).unwrap();
    for &key in stream {
        hitters.record(key);
    }
    Arc::new(hitters)
}

/// Records `iters` keys of the stream on each of two threads at once (from different offsets);
/// the time per record on one thread.
fn on_two_threads(
    hitters: &Arc<HeavyHitters<ItemKey>>,
    stream: &Arc<[ItemKey]>,
    iters: u64,
) -> Duration {
    let barrier = Arc::new(Barrier::new(2));
    let threads: Vec<_> = (0..2)
        .map(|thread| {
            let (hitters, stream, barrier) = (
                Arc::clone(hitters),
                Arc::clone(stream),
                Arc::clone(&barrier),
            );
            std::thread::spawn(move || {
                let offset = thread * STREAM / 2;
                barrier.wait();
                let started = Instant::now();
                for index in 0..iters as usize {
                    hitters.record(stream[(offset + index) & (STREAM - 1)]);
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

fn record(criterion: &mut Criterion) {
    let stream = zipf_stream(7);
    let mut group = criterion.benchmark_group("hot keys");

    let hitters = warm_sketch(&stream);
    let mut next = 0usize;
    group.bench_function("record (Zipf ItemKey), 1 thread", |bench| {
        bench.iter(|| {
            hitters.record(black_box(stream[next & (STREAM - 1)]));
            next += 1;
        })
    });

    let hitters = warm_sketch(&stream);
    group.bench_function("record (Zipf ItemKey), 2 threads", |bench| {
        bench.iter_custom(|iters| on_two_threads(&hitters, &stream, iters))
    });

    let hitters = warm_sketch(&stream);
    group.bench_function("top(100) of 4096", |bench| {
        bench.iter(|| black_box(hitters.top(100)))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = record
}
criterion_main!(benches);
