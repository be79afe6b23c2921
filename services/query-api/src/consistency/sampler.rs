//! The drift sampler: every second, keys this instance holds are looked at without any event,
//! so a copy nobody announced a change for still shows (`source="sample"`).
//!
//! # Drawing keys
//! Each round draws `events.observer.drift_keys_per_sec` keys, none twice:
//! 1. Hot keys first, for up to half the round: this instance's top keys in the hot-key sketch
//!    (`crate::hot_keys`), the items most clients see.
//! 2. The rest from the kept renderings, then from L1's copies of products and rates: reservoir
//!    samples over at most `RENDERINGS_VISITED` (65,536) entries of each map, so a big cache
//!    costs bounded work a round.
//! 3. More hot keys when there were too few of those.
//!
//! A key being followed (below) is not drawn again until its windows end.
//!
//! # Judging
//! | look | a copy is behind when its version… |
//! | --- | --- |
//! | first | differs from the store row's (0 when there is no row) |
//! | at each window | is below the store row's at the first look and now, whichever is lower, or above the row's now |
//!
//! At the first look, lower is a stale copy and higher a copy the store never had. A
//! not-found marker for an existing row, or a found copy with no row, differs too. At a
//! window, a write that landed after the first look is a new change on its way: a copy that
//! holds at least the first look's version is not blamed for lagging it.
//!
//! A part with no tier behind at the first look counts `consistent` at every window at once
//! (`unknown` if L2 or the store could not be read). A key with a part behind is followed:
//! looked at again after each window (`events.observer.windows_ms`, from the first look),
//! each counting `consistent`, `inconsistent` or `unknown`. So propagation delay shows as
//! `inconsistent` at an early window only, drift at every window. An inconsistency is logged
//! once per key, part and episode, at the first window that finds it, at warn level with every
//! tier's version and the store's.
//!
//! At most `events.observer.max_pending` keys are followed at once; a key found behind beyond
//! that is counted in `skipped` and not followed. A round looks at `KEYS_AT_ONCE` (16) keys at
//! a time; a round longer than a second delays the next one.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use rand::Rng;
use rand::seq::SliceRandom;
use rebate_cache::PartView;
use rebate_domain::{ItemKey, PartKind};
use tokio::time::{Instant, MissedTickBehavior};

use super::ConsistencyObserver;
use super::report::{DriftReport, Outcome};
use super::source::CheckSource;
use super::tiers::{self, STORE_BACKED, Seen, Unreadable};
use crate::hot_keys::HotKeys;

/// How often a round draws its keys.
const ROUND_EVERY: Duration = Duration::from_secs(1);

/// Keys looked at together in a round: each look is up to two L2 reads and two store queries.
pub(super) const KEYS_AT_ONCE: usize = 16;

/// The most kept renderings a round walks to draw its keys. The default 32 MiB map holds about
/// 48,000; a larger one is drawn from its first this-many, in the map's own order.
pub(super) const RENDERINGS_VISITED: usize = 65_536;

/// The sampler's state inside the observer.
#[derive(Debug, Default)]
pub(super) struct DriftState {
    /// Keys found behind and being followed: not drawn again until their windows end.
    following: Mutex<HashSet<ItemKey>>,
    drawn: AtomicU64,
    skipped: AtomicU64,
}

impl DriftState {
    fn following(&self) -> MutexGuard<'_, HashSet<ItemKey>> {
        // Each change is one insert or remove: a panic under the lock leaves the set whole.
        self.following
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Which look at a key: its first, or one at a window after it.
#[derive(Debug, Clone, Copy)]
enum Moment {
    First,
    /// `first_store`: the store row's version at the first look (`None`: no row).
    Window {
        first_store: Option<u64>,
    },
}

/// One part of a followed key: what its first look saw in the store, and whether its
/// inconsistency was logged in this episode.
#[derive(Debug, Clone, Copy)]
struct Followed {
    part: PartKind,
    first_store: Option<u64>,
    logged: bool,
}

impl ConsistencyObserver {
    /// Starts the drift sampler on the observer's tasks, until shutdown: one round a second.
    /// Does nothing when the observer is off or `drift_keys_per_sec` is 0. `hot_keys` is the
    /// instance's hot-key sketch, drawn from first.
    pub fn start_drift_sampler(self: &Arc<Self>, hot_keys: Option<Arc<HotKeys>>) {
        if !self.settings.enabled || self.settings.drift_keys_per_sec == 0 {
            return;
        }
        let observer = Arc::clone(self);
        self.tasks.spawn(async move {
            let mut rounds = tokio::time::interval(ROUND_EVERY);
            rounds.set_missed_tick_behavior(MissedTickBehavior::Delay);
            // The first tick is immediate: nothing is cached yet.
            rounds.tick().await;
            loop {
                tokio::select! {
                    _ = rounds.tick() => observer.sample_round(hot_keys.as_deref()).await,
                    () = observer.shutdown.cancelled() => return,
                }
            }
        });
    }

    /// One round: draws the keys, looks at each, and follows those found behind.
    pub(super) async fn sample_round(self: &Arc<Self>, hot_keys: Option<&HotKeys>) {
        let keys = self.draw(hot_keys);
        self.drift
            .drawn
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        futures::stream::iter(keys)
            .for_each_concurrent(KEYS_AT_ONCE, |key| self.first_look(key))
            .await;
    }

    pub(super) fn drift_report(&self) -> DriftReport {
        DriftReport {
            keys_per_sec: self.settings.drift_keys_per_sec,
            drawn: self.drift.drawn.load(Ordering::Relaxed),
            following: self.drift.following().len() as u64,
            skipped: self.drift.skipped.load(Ordering::Relaxed),
        }
    }

    /// The round's keys: see the module documentation.
    pub(super) fn draw(&self, hot_keys: Option<&HotKeys>) -> Vec<ItemKey> {
        let wanted = self.settings.drift_keys_per_sec as usize;
        let hot: Vec<ItemKey> = hot_keys.map_or_else(Vec::new, |hot_keys| {
            hot_keys
                .local_top(wanted)
                .into_iter()
                .map(|count| count.key)
                .collect()
        });
        // Walked before the followed keys are locked: a round's walk takes the lock from no one.
        let rendered = self.sample_renderings(wanted);
        // Then what L1 holds of the store-backed parts, for keys cached without a rendering.
        let parts = self.engine.parts();
        let cached: Vec<ItemKey> = [&parts.product as &dyn PartView, &parts.rate]
            .into_iter()
            .flat_map(|part| part.sample_keys(wanted, RENDERINGS_VISITED))
            .collect();
        let following = self.drift.following();
        let mut taken: HashSet<ItemKey> = HashSet::with_capacity(wanted);
        let mut keys: Vec<ItemKey> = Vec::with_capacity(wanted);
        let mut take = |key: ItemKey, keys: &mut Vec<ItemKey>| {
            if !following.contains(&key) && taken.insert(key) {
                keys.push(key);
            }
        };
        let mut hot = hot.into_iter();
        while keys.len() < wanted.div_ceil(2) {
            let Some(key) = hot.next() else { break };
            take(key, &mut keys);
        }
        for key in rendered.into_iter().chain(cached).chain(hot) {
            if keys.len() >= wanted {
                break;
            }
            take(key, &mut keys);
        }
        keys
    }

    /// Up to `wanted` keys with a kept rendering, drawn at random (a reservoir sample) from the
    /// first `RENDERINGS_VISITED` of the map, in random order.
    fn sample_renderings(&self, wanted: usize) -> Vec<ItemKey> {
        let mut rng = rand::rng();
        let mut reservoir: Vec<ItemKey> = Vec::with_capacity(wanted);
        let candidates = self.engine.rendered_keys().take(RENDERINGS_VISITED);
        for (seen, key) in candidates.enumerate() {
            if reservoir.len() < wanted {
                reservoir.push(key);
            } else if let Some(kept) = reservoir.get_mut(rng.random_range(0..=seen)) {
                *kept = key;
            }
        }
        reservoir.shuffle(&mut rng);
        reservoir
    }

    /// A drawn key's first look, part by part; a key with a part behind is followed.
    async fn first_look(self: &Arc<Self>, key: ItemKey) {
        let looked_at = Instant::now();
        let mut behind = Vec::new();
        for part in STORE_BACKED {
            match self.look_for_drift(key, part, Moment::First).await {
                Err(Unreadable) => self
                    .counts
                    .add_every_window(CheckSource::Sample, Outcome::Unknown),
                Ok((_, false)) => self
                    .counts
                    .add_every_window(CheckSource::Sample, Outcome::Consistent),
                Ok((seen, true)) => behind.push(Followed {
                    part,
                    first_store: seen.store,
                    logged: false,
                }),
            }
        }
        if behind.is_empty() {
            return;
        }
        let admitted = {
            let mut following = self.drift.following();
            following.len() < usize::try_from(self.settings.max_pending).unwrap_or(usize::MAX)
                && following.insert(key)
        };
        if !admitted {
            self.drift.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.follow(key, looked_at, behind);
    }

    /// Looks at a followed key after each window from its first look, counting each.
    fn follow(self: &Arc<Self>, key: ItemKey, looked_at: Instant, mut parts: Vec<Followed>) {
        let observer = Arc::clone(self);
        self.tasks.spawn(async move {
            for (index, window) in observer.settings.windows.iter().enumerate() {
                tokio::select! {
                    () = tokio::time::sleep_until(looked_at + *window) => {}
                    () = observer.shutdown.cancelled() => break,
                }
                for followed in &mut parts {
                    let outcome = match observer
                        .look_for_drift(
                            key,
                            followed.part,
                            Moment::Window {
                                first_store: followed.first_store,
                            },
                        )
                        .await
                    {
                        Err(Unreadable) => Outcome::Unknown,
                        Ok((_, false)) => Outcome::Consistent,
                        Ok((seen, true)) => {
                            if !followed.logged {
                                followed.logged = true;
                                log_drift(key, followed.part, *window, seen);
                            }
                            Outcome::Inconsistent
                        }
                    };
                    observer.counts.add(CheckSource::Sample, index, outcome);
                }
            }
            observer.drift.following().remove(&key);
        });
    }

    /// One look at `key`'s `part`, and whether a tier is behind (see the module
    /// documentation's table).
    async fn look_for_drift(
        &self,
        key: ItemKey,
        part: PartKind,
        moment: Moment,
    ) -> Result<(Seen, bool), Unreadable> {
        let seen = tiers::look(&self.engine, self.store.as_ref(), key, part).await?;
        let store_now = seen.store.unwrap_or(0);
        let floor = match moment {
            Moment::First => store_now,
            Moment::Window { first_store } => first_store.unwrap_or(0).min(store_now),
        };
        let behind = seen
            .copies
            .any(|version| version < floor || version > store_now);
        Ok((seen, behind))
    }
}

fn log_drift(key: ItemKey, part: PartKind, window: Duration, seen: Seen) {
    tracing::warn!(
        source = CheckSource::Sample.as_str(),
        %key,
        part = part.as_str(),
        window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
        rendering_version = seen.copies.rendering,
        l1_version = seen.copies.l1,
        l2_version = seen.copies.l2,
        store_version = seen.store,
        "inconsistent: a cache tier would serve a copy the store's row does not match"
    );
}
