//! Background work that shares the service's shutdown token: Bloom filter builds, warm-up and
//! the queue-delay probe of the load shedder (the runtime's queue and the listener's).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use rebate_cache::ItemFilter;
use rebate_domain::ItemKey;
use rebate_engine::{QueryEngine, ShedLevel};
use rebate_store::CatalogRepository;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::hot_keys::HotKeys;
use crate::listen_queue::AcceptWait;
use crate::protection::Protection;

/// Builds the filter from the store now, then again every `interval` (or sooner when
/// [`ItemFilter::request_rebuild`] asks), until shutdown. A failed build keeps the previous
/// filter (or fail-open) and is retried at the next interval.
pub async fn maintain_item_filter(
    filter: Arc<ItemFilter>,
    store: Arc<dyn CatalogRepository>,
    interval: Duration,
    shutdown: CancellationToken,
) {
    loop {
        let build = filter.rebuild(store.keys());
        let result = tokio::select! {
            result = build => result,
            () = shutdown.cancelled() => return,
        };
        match result {
            Ok(report) => tracing::info!(
                keys = report.keys,
                capacity = report.capacity,
                elapsed_ms = report.elapsed.as_millis() as u64,
                "bloom filter built"
            ),
            Err(error) => tracing::warn!(%error, "bloom filter build failed; keeping the old one"),
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = filter.rebuild_requested() => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// What warm-up loads and how gently.
#[derive(Debug, Clone)]
pub struct WarmupPlan {
    /// Keys named in the config, warmed first.
    pub items: Vec<ItemKey>,
    /// How many hot keys follow them: learned from traffic first (`crate::hot_keys`), then the
    /// store's `hot_items` (the seed).
    pub hot_items_limit: u32,
    /// Upper bound on quotes per second, so warm-up never crowds out live traffic; read at
    /// the start of each round (`warmup.rate_per_sec` is live).
    pub rate_per_sec: Arc<crate::rules::apply::LiveKnobs>,
    pub interval: Duration,
    /// Deadline of each warm-up quote, as for a client request.
    pub deadline: Duration,
}

impl WarmupPlan {
    /// The configured items, then up to `hot_items_limit` keys learned from traffic, topped up
    /// from the store's hot items (the seed), each key once.
    async fn keys(
        &self,
        hot_keys: Option<&HotKeys>,
        store: &dyn CatalogRepository,
    ) -> Vec<ItemKey> {
        let limit = self.hot_items_limit as usize;
        let mut keys = self.items.clone();
        let mut seen: HashSet<ItemKey> = keys.iter().copied().collect();
        let mut hot = 0;
        if let Some(hot_keys) = hot_keys {
            for key in hot_keys.learned(limit).await {
                if seen.insert(key) {
                    keys.push(key);
                    hot += 1;
                }
            }
        }
        if hot < limit {
            match store.hot_keys(self.hot_items_limit).await {
                Ok(seed) => {
                    for key in seed {
                        if hot == limit {
                            break;
                        }
                        if seen.insert(key) {
                            keys.push(key);
                            hot += 1;
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot read the hot items; warming the configured and learned ones only")
                }
            }
        }
        keys
    }
}

/// Measures how long work waits before a worker of the runtime starts it, every
/// `queue_probe_every`, and reports it to the load shedder: the longest of how late the probe's
/// timer fired, how long one yield took to be polled again (both time spent queued behind other
/// tasks; a starved probe reports its lateness when it finally runs) and, with `accept_wait`,
/// how long connections wait in the listener's accept queue — where a saturated instance's
/// queue stands when its runtime admits work as fast as it finishes it. Also reports how busy
/// the runtime's workers were since the last period (tokio's per-worker busy time), which tells
/// the shedder whether requests in flight are CPU work or waits. Costs one timer, one yield, one
/// atomic read per worker and, with `accept_wait`, one netlink round trip per period.
pub async fn probe_queue_delay(
    protection: Arc<Protection>,
    mut accept_wait: Option<AcceptWait>,
    shutdown: CancellationToken,
) {
    let Some(shedder) = protection.shedder.as_ref() else {
        return;
    };
    let every = shedder.config().queue_probe_every;
    let mut busy = WorkerBusy::new(tokio::runtime::Handle::current().metrics());
    let mut due = Instant::now() + every;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep_until(due) => {}
        }
        let woke = Instant::now();
        let late = woke.saturating_duration_since(due);
        tokio::task::yield_now().await;
        let yielded = woke.elapsed();
        let accepting = accept_wait
            .as_mut()
            .and_then(AcceptWait::sample)
            .unwrap_or_default();
        shedder.record_queue_delay(late.max(yielded).max(accepting));
        let (busy_time, available) = busy.since_last();
        shedder.record_worker_busy(busy_time, available);
        due = Instant::now() + every;
    }
}

/// The runtime's total worker busy time between two readings.
struct WorkerBusy {
    metrics: tokio::runtime::RuntimeMetrics,
    read_at: std::time::Instant,
    total: Duration,
}

impl WorkerBusy {
    #[expect(
        clippy::disallowed_methods,
        reason = "tokio measures worker busy time on the wall clock, not on the runtime's (possibly paused) clock"
    )]
    fn new(metrics: tokio::runtime::RuntimeMetrics) -> Self {
        let total = Self::total(&metrics);
        Self {
            metrics,
            read_at: std::time::Instant::now(),
            total,
        }
    }

    fn total(metrics: &tokio::runtime::RuntimeMetrics) -> Duration {
        (0..metrics.num_workers())
            .map(|worker| metrics.worker_total_busy_duration(worker))
            .sum()
    }

    /// Busy time summed over the workers since the last call, and the worker time that passed
    /// (elapsed × workers).
    #[expect(
        clippy::disallowed_methods,
        reason = "tokio measures worker busy time on the wall clock, not on the runtime's (possibly paused) clock"
    )]
    fn since_last(&mut self) -> (Duration, Duration) {
        // Wall-clock time, as tokio measures busy time (not the runtime's possibly paused clock).
        let now = std::time::Instant::now();
        let total = Self::total(&self.metrics);
        let busy = total.saturating_sub(self.total);
        let workers = u32::try_from(self.metrics.num_workers()).unwrap_or(u32::MAX);
        let available = now.saturating_duration_since(self.read_at) * workers;
        self.read_at = now;
        self.total = total;
        (busy, available)
    }
}

/// Loads the plan's keys through the normal query path (so L1 and L2 both fill) at a bounded
/// rate, at start and then every `interval`, until shutdown. Warm-up is optional work: while the
/// service sheds load (level ≥ 1) keys are skipped rather than loaded.
pub async fn warm_up(
    engine: QueryEngine,
    store: Arc<dyn CatalogRepository>,
    protection: Arc<Protection>,
    hot_keys: Option<Arc<HotKeys>>,
    plan: WarmupPlan,
    shutdown: CancellationToken,
) {
    loop {
        let started = Instant::now();
        let keys = plan.keys(hot_keys.as_deref(), store.as_ref()).await;
        let rate = plan.rate_per_sec.warmup_rate();
        let mut ticks = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut warmed = 0u64;
        let mut skipped = 0u64;
        for key in &keys {
            tokio::select! {
                _ = ticks.tick() => {}
                () = shutdown.cancelled() => return,
            }
            if protection.level() != ShedLevel::Normal {
                skipped += 1;
                continue;
            }
            if engine
                .quote(*key, Instant::now() + plan.deadline)
                .await
                .is_ok()
            {
                warmed += 1;
            }
        }
        tracing::info!(
            keys = keys.len(),
            warmed,
            skipped_while_shedding = skipped,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "warm-up done"
        );
        tokio::select! {
            () = tokio::time::sleep(plan.interval) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use rebate_resilience::ManualTicker;

    use super::*;
    use crate::listen_queue::ListenQueue;
    use crate::server::ConnectionStats;

    /// Connections that wait in the listener's accept queue are the shedder's queue delay, as
    /// the runtime's own queue is: a queue nobody drains puts the instance at level 3, and once
    /// drained the levels walk back down.
    #[tokio::test(start_paused = true)]
    async fn connections_waiting_for_accept_shed_load_until_they_are_taken() {
        let ticker = ManualTicker::new();
        let protection = Arc::new(Protection::for_tests(Arc::new(ticker.clone())));
        let listener = crate::server::bind("127.0.0.1:0".parse().unwrap(), 64).unwrap();
        let address = listener.local_addr().unwrap();
        let stats = Arc::new(ConnectionStats::default());
        let accept_wait = AcceptWait::new(ListenQueue::open(&listener).unwrap(), stats);
        let shutdown = CancellationToken::new();
        let probe = tokio::spawn(probe_queue_delay(
            Arc::clone(&protection),
            Some(accept_wait),
            shutdown.clone(),
        ));
        let shedder = protection
            .shedder
            .as_ref()
            .expect("shedding is on by default");
        // One interval of the shedder's: the probe reports on the paused clock, the shedder
        // evaluates on its own ticker at the next admission.
        let interval = |admissions: usize| {
            let ticker = ticker.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(250)).await;
                ticker.advance(Duration::from_millis(250));
                for _ in 0..admissions {
                    drop(shedder.admit());
                }
            }
        };
        for _ in 0..4 {
            interval(2).await;
        }
        assert_eq!(
            shedder.level(),
            ShedLevel::Normal,
            "{:?}",
            shedder.snapshot()
        );

        let mut clients = Vec::new();
        for _ in 0..20 {
            clients.push(tokio::net::TcpStream::connect(address).await.unwrap());
        }
        for _ in 0..3 {
            interval(2).await;
        }
        let snapshot = shedder.snapshot();
        assert_eq!(snapshot.level, ShedLevel::CacheOnly, "{snapshot:?}");
        assert!(snapshot.queue_delay_ms >= 100.0, "{snapshot:?}");

        let mut accepted = Vec::new();
        for _ in 0..20 {
            accepted.push(listener.accept().await.unwrap());
        }
        // Half the admissions of the queued spell: a lower load than the one that saturated,
        // so no hold keeps level 3 once the queue is gone.
        let mut seconds_to_normal = None;
        for step in 1..=40 {
            interval(1).await;
            if shedder.level() == ShedLevel::Normal {
                seconds_to_normal = Some(f64::from(step) * 0.25);
                break;
            }
        }
        let snapshot = shedder.snapshot();
        assert!(snapshot.queue_delay_ms < 1.0, "{snapshot:?}");
        let seconds = seconds_to_normal.expect("back at level 0 within 10 s");
        assert!(seconds <= 5.0, "{seconds} s to level 0: {snapshot:?}");
        shutdown.cancel();
        probe.await.unwrap();
    }
}
