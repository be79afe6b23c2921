//! The L2 path of a load, for a cache built with a shared tier. L2 is read first; an entry older
//! than the fence this instance holds counts as absent. On a miss the load takes the key's
//! rebuild lease: the winner loads from the source and, off its callers' path, writes the value
//! back (version-fenced: a newer version in L2 is kept) and releases the lease. A loser never makes
//! a caller wait on a copy it could serve (the lease rule of Meta's memcache): holding a servable
//! stale copy, it answers with it at once and follows the winner in the background, taking the
//! winner's value into L1 for the next reader while the key's load stays in flight (so the
//! readers in between join it and get the stale copy too, at no Redis cost). Without such a copy
//! it waits for the winner about as long as a rebuild takes here lately (`lease_wait` before it
//! has timed any), then loads itself.
//! Behind a fence (an event changed the key, and no copy here has its version yet) the read is
//! a miss, most likely: the lease is taken with it in one round trip, and its winner does not
//! read again. Any L2 error skips the tier. The fences that change events write to L2 are
//! written here too.

use std::sync::Arc;
use std::time::Duration;

use rebate_domain::{ItemKey, Timestamp};
use rebate_telemetry::record_stage;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::inner::Inner;
use super::load::{LoadFailure, LoadResult};
use super::settings::L2Config;
use super::stats::bump;
use crate::envelope::Envelope;
use crate::shared::{FenceOutcome, TierEntry, TierError, TierKey};

/// What a load through L2 hands back to `run_load`.
pub(super) struct L2Load<T> {
    pub(super) result: LoadResult<T>,
    /// The load stays in the single-flight map after its callers have their answer: the task
    /// following the lease winner takes it out when it is done.
    pub(super) following: bool,
}

impl<T> L2Load<T> {
    fn done(result: LoadResult<T>) -> Self {
        Self {
            result,
            following: false,
        }
    }

    fn following(failure: LoadFailure) -> Self {
        Self {
            result: Err(failure),
            following: true,
        }
    }
}

impl<T> Inner<T>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// L2, then (holding the key's lease, or after waiting for its holder) the source. A
    /// refresh of the L1 entry fresh until `refreshing` takes only an L2 copy fresh for longer:
    /// near the end of both lives it is L2's copy that needs the reload.
    pub(super) async fn load_through_l2(
        self: &Arc<Self>,
        l2: &L2Config,
        key: ItemKey,
        refreshing: Option<Timestamp>,
        load_id: u64,
    ) -> L2Load<T> {
        let tier_key = TierKey {
            item: key,
            part: self.settings.part,
        };
        let mut stale = None;
        // A copy older than this instance's fence is what the event replaced: L2 may still
        // hold it while the shared handler has not fenced L2 yet (or could not), and serving it
        // would undo the event here. It counts as absent.
        let fence = self.fence_version(key);
        let token: u64 = rand::random();
        // A source that would refuse (quota spent, breaker open, this item's share of loads
        // spent) gets no lease: the load below fails at once, and a lease would only cost two
        // round trips and make other instances wait on a rebuild that cannot happen here.
        let ready = self.loader.ready_for(key);
        // Behind a fence (an event changed the key) L2 holds the fence or what it replaced
        // unless another instance rebuilt first: the read is a miss, most likely. The lease is
        // taken in the same round trip, and its winner needs no second read; after an event
        // that is one Redis round trip before the source instead of three.
        let lease_started = tokio::time::Instant::now();
        let (read, mut lease) = if fence > 0 && ready {
            match self.lease_and_read(l2, tier_key, token).await {
                Ok((won, found)) => (Ok(found), Some(won)),
                Err(()) => (Err(()), None),
            }
        } else {
            (self.read_l2(l2, tier_key).await, None)
        };
        let read = read.map(|found| found.filter(|envelope| envelope.version >= fence));
        let newer = |envelope: &Envelope<T>| {
            envelope.is_fresh(self.clock.now())
                && refreshing.is_none_or(|fresh_until| envelope.fresh_until > fresh_until)
        };
        let tier_up = match read {
            Ok(Some(envelope)) if newer(&envelope) => {
                if lease == Some(true) {
                    let tier = Arc::clone(&l2.tier);
                    tokio::spawn(async move { tier.release_lease(tier_key, token).await });
                }
                bump(&self.stats.l2_hits);
                return L2Load::done(Ok(self.adopt_from_l2(key, envelope)));
            }
            Ok(found) => {
                bump(&self.stats.l2_misses);
                stale = found.filter(|envelope| envelope.is_servable(self.clock.now()));
                true
            }
            Err(()) => false,
        };

        let mut leased = false;
        if tier_up && ready {
            let read_with_lease = lease.is_some();
            let started = if read_with_lease {
                lease_started
            } else {
                tokio::time::Instant::now()
            };
            let outcome = match lease.take() {
                Some(won) => Ok(won),
                None => l2.tier.try_lease(tier_key, token, l2.lease_ttl).await,
            };
            match outcome {
                Ok(true) => {
                    bump(&self.stats.leases_won);
                    record_stage("lease", self.settings.name, "won", started, None);
                    leased = true;
                    // Another instance may have taken the lease, written L2 and released it
                    // between the read above and this lease: look once more before loading
                    // (a read taken with the lease already saw such a rebuild).
                    if !read_with_lease
                        && let Ok(Some(envelope)) = self.read_l2(l2, tier_key).await
                        && envelope.version >= fence
                        && newer(&envelope)
                    {
                        let tier = Arc::clone(&l2.tier);
                        tokio::spawn(async move { tier.release_lease(tier_key, token).await });
                        bump(&self.stats.l2_hits);
                        return L2Load::done(Ok(self.adopt_from_l2(key, envelope)));
                    }
                }
                Ok(false) => {
                    bump(&self.stats.leases_lost);
                    let held_in_l1 = self
                        .entries
                        .get(&key)
                        .is_some_and(|envelope| envelope.is_servable(self.clock.now()));
                    if stale.is_some() || held_in_l1 {
                        record_stage(
                            "lease",
                            self.settings.name,
                            "lost; served stale",
                            started,
                            None,
                        );
                        bump(&self.stats.lease_losses_served_stale);
                        if let Some(envelope) = stale {
                            self.adopt_from_l2(key, envelope);
                        }
                        self.follow_winner(l2, tier_key, fence, refreshing, load_id);
                        return L2Load::following(LoadFailure::timeout(
                            "another instance is rebuilding this key; serving stale meanwhile",
                        ));
                    }
                    let wait = self.loser_wait(l2);
                    let waited = self
                        .wait_for_winner(l2, tier_key, fence, &newer, wait)
                        .await;
                    let outcome = if waited.is_some() {
                        "lost; the winner's value arrived"
                    } else {
                        "lost; gave up waiting"
                    };
                    record_stage("lease", self.settings.name, outcome, started, None);
                    if let Some(envelope) = waited {
                        bump(&self.stats.lease_waits_served);
                        self.recent_winner_waits.record(started.elapsed());
                        return L2Load::done(Ok(self.adopt_from_l2(key, envelope)));
                    }
                    bump(&self.stats.lease_waits_given_up);
                }
                Err(error) => {
                    bump(&self.stats.l2_errors);
                    tracing::debug!(part = self.settings.name, %key, %error, "lease failed");
                }
            }
        }

        L2Load::done(match self.load_from_source(key).await {
            Ok(loaded) => {
                // One read of the lifetimes for both tiers: L2's stamp and L1's cap of it come
                // from the same change.
                let policies = **self.ttl_policies.load();
                let l2_policy = policies
                    .l2
                    .expect("a cache with a shared tier keeps an L2 policy");
                let envelope = self.stamp(&l2_policy, loaded);
                if tier_up {
                    self.write_l2_in_background(l2, tier_key, &envelope, leased.then_some(token));
                }
                Ok(self.adopt_under(&policies.l1, key, envelope))
            }
            Err(failure) => {
                if leased {
                    let tier = Arc::clone(&l2.tier);
                    tokio::spawn(async move { tier.release_lease(tier_key, token).await });
                }
                if let Some(envelope) = stale {
                    self.adopt_from_l2(key, envelope);
                }
                Err(failure)
            }
        })
    }

    /// How long a loser without a servable copy waits for the winner: about as long as a
    /// rebuild takes lately — the longer of what the winner still has to do (a load and two L2
    /// round trips, its second read and its write, each at the bound of this instance's recent
    /// times) and what losers here waited for winners' values lately (scheduling and queues
    /// included) — plus two polls, and never more than `lease_wait`. Past it the winner is stuck
    /// (a spent quota, a slow source) and loading here costs the caller less than waiting on.
    /// Before this instance has timed any load of the part it has nothing to size the wait
    /// from, and waits up to `lease_wait`: a cold fleet's first loads are the stampede the lease
    /// is for.
    fn loser_wait(&self, l2: &L2Config) -> Duration {
        let Some(load) = self.recent_loads.bound() else {
            return l2.lease_wait;
        };
        let trip = self.recent_l2_trips.bound().unwrap_or_default();
        let seen = self.recent_winner_waits.bound().unwrap_or_default();
        let floor = l2.lease_poll * 2;
        ((load + trip * 2).max(seen) + floor).min(l2.lease_wait.max(floor))
    }

    /// Follows the lease winner after the callers were given a stale copy: polls L2 for the
    /// winner's value for at most `lease_wait` and takes it into L1, then ends the load
    /// `load_id`, which stayed in flight meanwhile so that readers join it instead of asking
    /// Redis again.
    fn follow_winner(
        self: &Arc<Self>,
        l2: &L2Config,
        tier_key: TierKey,
        fence: u64,
        refreshing: Option<Timestamp>,
        load_id: u64,
    ) {
        let inner = Arc::clone(self);
        let l2 = l2.clone();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let newer = |envelope: &Envelope<T>| {
                envelope.is_fresh(inner.clock.now())
                    && refreshing.is_none_or(|fresh_until| envelope.fresh_until > fresh_until)
            };
            let waited = inner
                .wait_for_winner(&l2, tier_key, fence, newer, l2.lease_wait)
                .await;
            if let Some(envelope) = waited {
                bump(&inner.stats.lease_waits_served);
                inner.recent_winner_waits.record(started.elapsed());
                inner.adopt_from_l2(tier_key.item, envelope);
            } else {
                bump(&inner.stats.lease_waits_given_up);
            }
            inner.finish_load(tier_key.item, load_id);
        });
    }

    /// Takes the key's lease and reads its entry in one call (see
    /// [`SharedTier::lease_and_read`](crate::SharedTier::lease_and_read)): whether the lease
    /// was won, and the decoded entry. `Err` when the tier failed; the round trip is timed as
    /// an L2 read.
    async fn lease_and_read(
        &self,
        l2: &L2Config,
        tier_key: TierKey,
        token: u64,
    ) -> Result<(bool, Option<Envelope<T>>), ()> {
        let started = tokio::time::Instant::now();
        match l2.tier.lease_and_read(tier_key, token, l2.lease_ttl).await {
            Ok((won, entry)) => {
                self.recent_l2_trips.record(started.elapsed());
                let found = entry.and_then(|entry| self.decode_entry(tier_key, &entry.bytes));
                let outcome = match &found {
                    Some(envelope) if envelope.is_fresh(self.clock.now()) => "hit",
                    Some(_) => "stale",
                    None => "miss",
                };
                record_stage("l2", self.settings.name, outcome, started, None);
                Ok((won, found))
            }
            Err(error) => {
                bump(&self.stats.l2_errors);
                tracing::debug!(part = self.settings.name, key = %tier_key.item, %error, "L2 lease and read failed; skipping the tier");
                record_stage("l2", self.settings.name, "error", started, None);
                Err(())
            }
        }
    }

    /// An L2 entry's envelope; `None`, with a warning, when it does not decode.
    fn decode_entry(&self, tier_key: TierKey, bytes: &[u8]) -> Option<Envelope<T>> {
        match Envelope::decode(bytes) {
            Ok(envelope) if self.below_l2_floor(envelope.fetched_at) => None,
            Ok(envelope) => Some(envelope),
            Err(error) => {
                tracing::warn!(part = self.settings.name, key = %tier_key.item, %error, "undecodable L2 entry ignored");
                None
            }
        }
    }

    /// The decoded L2 entry, `Ok(None)` when absent or undecodable, `Err` when the tier failed.
    async fn read_l2(&self, l2: &L2Config, tier_key: TierKey) -> Result<Option<Envelope<T>>, ()> {
        let started = tokio::time::Instant::now();
        let read = self.read_l2_untimed(l2, tier_key).await;
        if read.is_ok() {
            self.recent_l2_trips.record(started.elapsed());
        }
        let outcome = match &read {
            Ok(Some(envelope)) if envelope.is_fresh(self.clock.now()) => "hit",
            Ok(Some(_)) => "stale",
            Ok(None) => "miss",
            Err(()) => "error",
        };
        record_stage("l2", self.settings.name, outcome, started, None);
        read
    }

    async fn read_l2_untimed(
        &self,
        l2: &L2Config,
        tier_key: TierKey,
    ) -> Result<Option<Envelope<T>>, ()> {
        match l2.tier.get_many(&[tier_key]).await {
            Ok(mut entries) => Ok(entries
                .pop()
                .flatten()
                .and_then(|entry| self.decode_entry(tier_key, &entry.bytes))),
            Err(error) => {
                bump(&self.stats.l2_errors);
                tracing::debug!(part = self.settings.name, key = %tier_key.item, %error, "L2 read failed; skipping the tier");
                Err(())
            }
        }
    }

    /// When a loser first looks for the winner's value: after what the winner's rebuild
    /// typically takes here (a source load and two L2 round trips, smoothed), at least 1 ms and
    /// at most `lease_poll`. A fixed `lease_poll` made a loser wait 15 ms for a value its winner
    /// wrote in 2; the polls after the first double up to `lease_poll`, so a slow winner costs
    /// a few more reads of one key, not a longer wait.
    fn first_poll(&self, l2: &L2Config) -> Duration {
        let load = self.recent_loads.typical().unwrap_or(l2.lease_poll);
        let trip = self.recent_l2_trips.typical().unwrap_or_default();
        (load + trip * 2)
            .max(Duration::from_millis(1))
            .min(l2.lease_poll)
    }

    /// Polls L2 for the lease winner's value (one `wanted` accepts) for at most `wait`: first
    /// after [`Self::first_poll`], then at doubling intervals up to `lease_poll`.
    async fn wait_for_winner(
        &self,
        l2: &L2Config,
        tier_key: TierKey,
        fence: u64,
        wanted: impl Fn(&Envelope<T>) -> bool,
        wait: Duration,
    ) -> Option<Envelope<T>> {
        let give_up = tokio::time::Instant::now() + wait;
        let mut pause = self.first_poll(l2);
        while tokio::time::Instant::now() < give_up {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(l2.lease_poll.max(pause));
            match self.read_l2(l2, tier_key).await {
                Ok(Some(envelope)) if wanted(&envelope) && envelope.version >= fence => {
                    return Some(envelope);
                }
                Ok(_) => {}
                Err(()) => return None,
            }
        }
        None
    }

    /// Writes the rebuilt value to L2 (version-fenced) and then releases the lease, off the
    /// caller's path: callers already have the value, Redis latency is not theirs to pay.
    fn write_l2_in_background(
        self: &Arc<Self>,
        l2: &L2Config,
        tier_key: TierKey,
        envelope: &Envelope<T>,
        lease_token: Option<u64>,
    ) {
        let bytes = match envelope.encode() {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::error!(part = self.settings.name, %error, "cannot encode an envelope");
                return;
            }
        };
        let entry = TierEntry {
            version: envelope.version,
            bytes,
        };
        let ttl = Duration::from_millis(envelope.stale_until.millis_since(self.clock.now()).max(1));
        let tier = Arc::clone(&l2.tier);
        let name = self.settings.name;
        let refused = Arc::clone(self);
        tokio::spawn(async move {
            match tier.put_fenced(tier_key, &entry, ttl).await {
                Ok(FenceOutcome::Written) => {}
                Ok(FenceOutcome::Stale { current }) => {
                    bump(&refused.stats.fenced_writes_refused);
                    tracing::debug!(part = name, key = %tier_key.item, version = entry.version, current, "L2 holds a newer version; write refused");
                }
                Err(error) => {
                    bump(&refused.stats.l2_errors);
                    tracing::debug!(part = name, key = %tier_key.item, %error, "L2 write failed");
                }
            }
            if let Some(token) = lease_token
                && let Err(error) = tier.release_lease(tier_key, token).await
            {
                tracing::debug!(part = name, key = %tier_key.item, %error, "lease release failed; it expires on its own");
            }
        });
    }

    /// Writes `fence` to L2, where a server-side version check keeps it from racing rebuilds of
    /// other instances. A refusal is success too: L2 then holds the fence's version or newer.
    pub(super) async fn fence_l2(
        &self,
        l2: &L2Config,
        key: ItemKey,
        fence: &Envelope<T>,
        fence_for: Duration,
    ) -> Result<(), TierError> {
        let bytes = fence
            .encode()
            .map_err(|error| TierError::Backend(format!("cannot encode a fence: {error}")))?;
        let tier_key = TierKey {
            item: key,
            part: self.settings.part,
        };
        let entry = TierEntry {
            version: fence.version,
            bytes,
        };
        match l2.tier.put_fence(tier_key, &entry, fence_for).await? {
            FenceOutcome::Written | FenceOutcome::Stale { .. } => Ok(()),
        }
    }
}
