//! Operators' warm jobs: a list of up to `warm_jobs.max_keys` keys, split into chunks, that the
//! fleet loads through the normal query path (so L1 and L2 fill) at a rate each instance can
//! afford.
//!
//! Contract: [`WarmJobs::submit`] takes validated keys, drops repeats, splits them into chunks
//! of `chunk_keys` and queues them, or refuses the whole job when the queue would pass
//! `max_queued_chunks`. With Redis the chunks are entries of one stream read by every instance
//! through one consumer group (`rebate_redis_tier`'s `warm` module): each instance's
//! [`WarmJobs::consume`] takes one chunk at a time, loads its keys at most `rate_per_sec` a
//! second and `concurrency` at once, only while the shed level is 0 (warming is optional work:
//! it pauses, never degrades, while the service sheds), touches the chunk while it works so that
//! it is not taken from a live instance, and acknowledges it with its tally. A chunk untouched for
//! `claim_idle_ms` — its instance died or was stopped mid-chunk — is claimed by another instance
//! (`XAUTOCLAIM`) and loaded again from the start. A chunk's tally is added to its job only by the
//! acknowledgement that removed it from the pending list, in the same script, so a chunk loaded
//! twice is counted once (no per-job set of done chunks to keep and expire). Without Redis (the
//! embedded profile) the same consumer reads an in-process queue; a stopped process loses what it
//! had queued, which an embedded single instance accepts. [`WarmJobs::progress`] reads a job's
//! counters, kept `job_ttl_secs` after their last change.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rebate_domain::ItemKey;
use rebate_engine::{QueryEngine, QueryError, ShedLevel};
use rebate_redis_tier::{RedisTier, WarmChunk, WarmJobCounts, WarmTally};
use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::protection::Protection;

/// Chunks queued per Redis round trip at submission: ~70 KiB of keys at 500 a chunk, well
/// within the command timeout, where a whole 200,000-key job in one script would not be.
const CHUNKS_PER_CALL: usize = 8;

/// A chunk delivered this many times (its instances kept dying on it) is counted as failed
/// instead of being loaded again.
const MAX_DELIVERIES: u32 = 5;

/// How often a consumer paused by load shedding looks at the level again.
const CALM_POLL: Duration = Duration::from_millis(250);

/// A consumer that holds no chunk and has not been seen for this long (an instance stopped or
/// restarted: each start is a new consumer) is dropped from the group.
const FORGET_CONSUMERS_AFTER: Duration = Duration::from_secs(86_400);

/// Jobs the in-process backend remembers at most; the oldest finished one goes first.
const MAX_LOCAL_JOBS: usize = 1_024;

/// The runtime form of `[warm_jobs]`.
#[derive(Debug, Clone)]
pub struct WarmJobConfig {
    pub consume: bool,
    pub max_keys: usize,
    pub chunk_keys: usize,
    pub max_queued_chunks: u64,
    pub rate_per_sec: u32,
    pub concurrency: usize,
    pub poll_interval: Duration,
    pub claim_idle: Duration,
    pub job_ttl: Duration,
    /// Deadline of each load, as for a client request.
    pub deadline: Duration,
}

impl WarmJobConfig {
    /// `[warm_jobs]`, with the request deadline for each load.
    pub fn from_settings(settings: &Settings) -> Self {
        let warm = &settings.warm_jobs;
        Self {
            consume: warm.consume,
            max_keys: warm.max_keys,
            chunk_keys: warm.chunk_keys,
            max_queued_chunks: warm.max_queued_chunks,
            rate_per_sec: warm.rate_per_sec,
            concurrency: warm.concurrency,
            poll_interval: Duration::from_millis(warm.poll_interval_ms),
            claim_idle: Duration::from_millis(warm.claim_idle_ms),
            job_ttl: Duration::from_secs(warm.job_ttl_secs),
            deadline: settings.request_deadline(),
        }
    }
}

/// A queued job, as `POST /admin/v1/warm-jobs` answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Receipt {
    pub job_id: String,
    pub chunks: u64,
    /// Distinct keys queued.
    pub keys: u64,
    /// Keys named more than once (each is loaded once).
    pub duplicates: u64,
}

/// Where a job stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Progress {
    pub job_id: String,
    /// `running`, `done`, or `incomplete` (its submission failed part way: the chunks not
    /// queued never run).
    pub state: &'static str,
    pub total_keys: u64,
    pub total_chunks: u64,
    pub queued_chunks: u64,
    pub done_chunks: u64,
    pub loaded: u64,
    pub not_found: u64,
    pub failed: u64,
}

impl Progress {
    fn from_counts(job_id: &str, counts: &WarmJobCounts) -> Self {
        let state = if counts.incomplete {
            "incomplete"
        } else if counts.done_chunks >= counts.total_chunks {
            "done"
        } else {
            "running"
        };
        Self {
            job_id: job_id.to_owned(),
            state,
            total_keys: counts.total_keys,
            total_chunks: counts.total_chunks,
            queued_chunks: counts.queued_chunks,
            done_chunks: counts.done_chunks,
            loaded: counts.loaded,
            not_found: counts.not_found,
            failed: counts.failed,
        }
    }
}

/// Why a job was not queued or its progress not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WarmJobError {
    #[error(
        "the warm queue holds {queued} chunks and this job needs {wanted} more; at most {max} \
         may wait (warm_jobs.max_queued_chunks): retry once running jobs are done"
    )]
    QueueFull { queued: u64, wanted: u64, max: u64 },
    #[error("{0}")]
    Unavailable(String),
}

/// What this instance's consumer did since start, for the status page.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WarmStats {
    pub backend: &'static str,
    pub consuming: bool,
    /// Waiting for the shed level to return to 0.
    pub paused: bool,
    pub chunks_done: u64,
    /// Chunks taken over from a consumer that stopped touching them.
    pub chunks_claimed: u64,
    /// Chunks left unacknowledged (shutdown, or claimed by another instance meanwhile).
    pub chunks_abandoned: u64,
    /// Chunks this instance finished after another had already acknowledged them.
    pub chunks_counted_elsewhere: u64,
    pub keys_loaded: u64,
    pub keys_not_found: u64,
    pub keys_failed: u64,
}

#[derive(Debug, Default)]
struct Counters {
    paused: AtomicBool,
    chunks_done: AtomicU64,
    chunks_claimed: AtomicU64,
    chunks_abandoned: AtomicU64,
    chunks_counted_elsewhere: AtomicU64,
    keys_loaded: AtomicU64,
    keys_not_found: AtomicU64,
    keys_failed: AtomicU64,
}

fn add(counter: &AtomicU64, value: u64) {
    counter.fetch_add(value, Ordering::Relaxed);
}

/// The warm jobs of this instance: where chunks are queued, and its consumer's counters.
#[derive(Debug)]
pub struct WarmJobs {
    config: WarmJobConfig,
    /// Keys a second in force: `config.rate_per_sec` until a rule set changes it.
    rate_per_sec: std::sync::atomic::AtomicU32,
    backend: Backend,
    counters: Counters,
}

#[derive(Debug)]
enum Backend {
    Redis {
        tier: Arc<RedisTier>,
        /// This instance's consumer name in the group (its registry name: unique per start).
        consumer: String,
    },
    Local(LocalQueue),
}

/// A chunk this consumer holds.
#[derive(Debug)]
struct Taken {
    job: String,
    keys: Vec<ItemKey>,
    /// Keys of the payload that do not parse (only a foreign writer could put them there).
    unparsable: u32,
    origin: Origin,
}

#[derive(Debug)]
enum Origin {
    Redis(WarmChunk),
    Local,
}

impl WarmJobs {
    /// On Redis when `tier` is given (every instance of the fleet shares the stream), else in
    /// process.
    pub fn new(config: WarmJobConfig, tier: Option<Arc<RedisTier>>, instance_id: &str) -> Self {
        let backend = match tier {
            Some(tier) => Backend::Redis {
                tier,
                consumer: crate::fleet::registry_name(instance_id),
            },
            None => Backend::Local(LocalQueue::default()),
        };
        Self {
            rate_per_sec: std::sync::atomic::AtomicU32::new(config.rate_per_sec),
            config,
            backend,
            counters: Counters::default(),
        }
    }

    pub fn config(&self) -> &WarmJobConfig {
        &self.config
    }

    /// Keys a second in force (`warm_jobs.rate_per_sec`, live).
    pub fn rate_per_sec(&self) -> u32 {
        self.rate_per_sec.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A rule set's rate: the next chunk is paced by it.
    pub fn set_rate_per_sec(&self, rate: u32) {
        self.rate_per_sec
            .store(rate, std::sync::atomic::Ordering::Relaxed);
    }

    /// The keys without repeats, in order of first appearance, and how many repeats there were.
    pub fn distinct(keys: Vec<ItemKey>) -> (Vec<ItemKey>, u64) {
        let total = keys.len();
        let mut seen = HashSet::with_capacity(total);
        let distinct: Vec<ItemKey> = keys.into_iter().filter(|key| seen.insert(*key)).collect();
        let duplicates = (total - distinct.len()) as u64;
        (distinct, duplicates)
    }

    /// The chunks' payloads: `chunk_keys` keys each, `platform:item_id` separated by spaces.
    pub fn split(keys: &[ItemKey], chunk_keys: usize) -> Vec<String> {
        keys.chunks(chunk_keys.max(1))
            .map(|chunk| {
                let mut payload = String::with_capacity(chunk.len() * 18);
                for (index, key) in chunk.iter().enumerate() {
                    if index > 0 {
                        payload.push(' ');
                    }
                    payload.push_str(&key.to_string());
                }
                payload
            })
            .collect()
    }

    /// A payload's keys, and how many of its words are not keys.
    pub fn parse_payload(payload: &str) -> (Vec<ItemKey>, u32) {
        let mut keys = Vec::new();
        let mut unparsable = 0u32;
        for word in payload.split_ascii_whitespace() {
            match word
                .split_once(':')
                .and_then(|(platform, item_id)| ItemKey::parse(platform, item_id).ok())
            {
                Some(key) => keys.push(key),
                None => unparsable = unparsable.saturating_add(1),
            }
        }
        (keys, unparsable)
    }

    /// A job id: 16 lowercase hex digits.
    pub fn is_job_id(text: &str) -> bool {
        text.len() == 16
            && text
                .bytes()
                .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
    }

    /// Queues `keys` (already validated, at most `max_keys`) as one job.
    pub async fn submit(&self, keys: Vec<ItemKey>) -> Result<Receipt, WarmJobError> {
        let (keys, duplicates) = Self::distinct(keys);
        let payloads = Self::split(&keys, self.config.chunk_keys);
        let job_id = format!("{:016x}", rand::random::<u64>());
        let chunks = payloads.len() as u64;
        let receipt = Receipt {
            job_id: job_id.clone(),
            chunks,
            keys: keys.len() as u64,
            duplicates,
        };
        match &self.backend {
            Backend::Local(queue) => {
                queue.submit(&self.config, &job_id, keys)?;
            }
            Backend::Redis { tier, .. } => {
                let created = tier
                    .warm_create_job(
                        &job_id,
                        chunks,
                        receipt.keys,
                        self.config.max_queued_chunks,
                        self.config.job_ttl,
                    )
                    .await
                    .map_err(|error| {
                        WarmJobError::Unavailable(format!(
                            "the warm job could not be created in Redis: {error}"
                        ))
                    })?;
                if let Err(queued) = created {
                    return Err(WarmJobError::QueueFull {
                        queued,
                        wanted: chunks,
                        max: self.config.max_queued_chunks,
                    });
                }
                for (group, payloads) in payloads.chunks(CHUNKS_PER_CALL).enumerate() {
                    let first = u32::try_from(group * CHUNKS_PER_CALL).unwrap_or(u32::MAX);
                    if let Err(error) = tier.warm_queue_chunks(&job_id, first, payloads).await {
                        if let Err(marking) = tier.warm_mark_incomplete(&job_id).await {
                            tracing::warn!(job = %job_id, error = %marking, "a part-queued warm job could not be marked incomplete");
                        }
                        return Err(WarmJobError::Unavailable(format!(
                            "Redis failed after {first} of the job's {chunks} chunks were queued \
                             (job {job_id}, now incomplete; the queued chunks still run): {error}"
                        )));
                    }
                }
            }
        }
        tracing::info!(job = %job_id, keys = receipt.keys, chunks, "warm job queued");
        Ok(receipt)
    }

    /// Job `job_id`'s progress; `None` for an unknown (or expired) job.
    pub async fn progress(&self, job_id: &str) -> Result<Option<Progress>, WarmJobError> {
        match &self.backend {
            Backend::Local(queue) => Ok(queue
                .counts(job_id, self.config.job_ttl)
                .map(|counts| Progress::from_counts(job_id, &counts))),
            Backend::Redis { tier, .. } => tier
                .warm_job_counts(job_id)
                .await
                .map(|counts| counts.map(|counts| Progress::from_counts(job_id, &counts)))
                .map_err(|error| {
                    WarmJobError::Unavailable(format!(
                        "the warm job's progress could not be read from Redis: {error}"
                    ))
                }),
        }
    }

    pub fn stats(&self) -> WarmStats {
        let counters = &self.counters;
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        WarmStats {
            backend: match self.backend {
                Backend::Redis { .. } => "redis",
                Backend::Local(_) => "in_process",
            },
            consuming: self.config.consume,
            paused: counters.paused.load(Ordering::Relaxed),
            chunks_done: read(&counters.chunks_done),
            chunks_claimed: read(&counters.chunks_claimed),
            chunks_abandoned: read(&counters.chunks_abandoned),
            chunks_counted_elsewhere: read(&counters.chunks_counted_elsewhere),
            keys_loaded: read(&counters.keys_loaded),
            keys_not_found: read(&counters.keys_not_found),
            keys_failed: read(&counters.keys_failed),
        }
    }

    /// Works through chunks until `shutdown`: one at a time, each loaded and acknowledged. A
    /// chunk in hand at shutdown is left unacknowledged, for another instance to claim.
    pub async fn consume(
        self: Arc<Self>,
        engine: QueryEngine,
        protection: Arc<Protection>,
        shutdown: CancellationToken,
    ) {
        let mut pacer = Pacer::new(self.rate_per_sec());
        // Claims are looked for at start (this consumer's own chunks of a previous life are
        // someone else's by name) and then every half idle time.
        let mut next_claim = Instant::now();
        let mut failing = false;
        loop {
            if !self.until_calm(&protection, &shutdown, None).await {
                return;
            }
            let taken = match self.take(&mut next_claim, &shutdown).await {
                Ok(Some(taken)) => {
                    failing = false;
                    taken
                }
                Ok(None) => continue,
                Err(error) => {
                    if failing {
                        tracing::debug!(%error, "warm chunks still cannot be read");
                    } else {
                        tracing::warn!(%error, "warm chunks cannot be read; retrying every poll interval");
                        failing = true;
                    }
                    tokio::select! {
                        () = tokio::time::sleep(self.config.poll_interval) => continue,
                        () = shutdown.cancelled() => return,
                    }
                }
            };
            match self
                .work(
                    &taken,
                    &engine,
                    &protection,
                    pacer.at(self.rate_per_sec()),
                    &shutdown,
                )
                .await
            {
                Some(tally) => self.complete(&taken, tally).await,
                None => add(&self.counters.chunks_abandoned, 1),
            }
            if shutdown.is_cancelled() {
                return;
            }
        }
    }

    /// The next chunk: a claimed one when a claim is due and one is abandoned, else a new one;
    /// `Ok(None)` after an idle poll interval (or at shutdown).
    async fn take(
        &self,
        next_claim: &mut Instant,
        shutdown: &CancellationToken,
    ) -> Result<Option<Taken>, rebate_cache::TierError> {
        match &self.backend {
            Backend::Redis { tier, consumer } => {
                if Instant::now() >= *next_claim {
                    if let Some(chunk) = tier
                        .warm_claim_chunk(consumer, self.config.claim_idle, FORGET_CONSUMERS_AFTER)
                        .await?
                    {
                        tracing::info!(job = %chunk.job, chunk = chunk.index, deliveries = chunk.deliveries, "claimed an abandoned warm chunk");
                        add(&self.counters.chunks_claimed, 1);
                        return Ok(Some(Taken::from_redis(chunk)));
                    }
                    *next_claim = Instant::now() + self.config.claim_idle / 2;
                }
                if let Some(chunk) = tier.warm_next_chunk(consumer).await? {
                    return Ok(Some(Taken::from_redis(chunk)));
                }
                tokio::select! {
                    () = tokio::time::sleep(self.config.poll_interval) => {}
                    () = shutdown.cancelled() => {}
                }
                Ok(None)
            }
            Backend::Local(queue) => {
                if let Some((job, keys)) = queue.pop() {
                    return Ok(Some(Taken {
                        job,
                        keys,
                        unparsable: 0,
                        origin: Origin::Local,
                    }));
                }
                tokio::select! {
                    () = queue.ready.notified() => {}
                    () = tokio::time::sleep(self.config.poll_interval) => {}
                    () = shutdown.cancelled() => {}
                }
                Ok(None)
            }
        }
    }

    /// Loads a chunk's keys; `None` when it is given up (shutdown, or another consumer claimed
    /// it meanwhile).
    async fn work(
        &self,
        taken: &Taken,
        engine: &QueryEngine,
        protection: &Protection,
        pacer: &mut Pacer,
        shutdown: &CancellationToken,
    ) -> Option<WarmTally> {
        let mut tally = WarmTally {
            failed: taken.unparsable,
            ..WarmTally::default()
        };
        if let Origin::Redis(chunk) = &taken.origin
            && chunk.deliveries > MAX_DELIVERIES
        {
            tracing::warn!(job = %taken.job, chunk = chunk.index, deliveries = chunk.deliveries, "warm chunk delivered too often; counted as failed");
            tally.failed = tally
                .failed
                .saturating_add(u32::try_from(taken.keys.len()).unwrap_or(u32::MAX));
            return Some(tally);
        }
        let mut touch = Touch::new(self.config.claim_idle);
        for batch in taken.keys.chunks(self.config.concurrency) {
            if !self
                .until_calm(protection, shutdown, Some((taken, &mut touch)))
                .await
            {
                return None;
            }
            let cost = u32::try_from(batch.len()).unwrap_or(u32::MAX);
            if !pacer.wait(cost, shutdown).await {
                return None;
            }
            let results = engine
                .quote_many(batch, Instant::now() + self.config.deadline)
                .await;
            for result in results {
                match result {
                    Ok(_) => tally.loaded += 1,
                    Err(QueryError::NotFound { .. }) => tally.not_found += 1,
                    Err(QueryError::Unavailable { .. }) => tally.failed += 1,
                }
            }
            if !self.keep(taken, &mut touch).await {
                return None;
            }
        }
        Some(tally)
    }

    /// Waits while the service sheds load, keeping the chunk in hand (if any) from being
    /// claimed; `false` at shutdown or when the chunk was claimed by another consumer.
    async fn until_calm(
        &self,
        protection: &Protection,
        shutdown: &CancellationToken,
        mut holding: Option<(&Taken, &mut Touch)>,
    ) -> bool {
        loop {
            if shutdown.is_cancelled() {
                return false;
            }
            if protection.level() == ShedLevel::Normal {
                self.counters.paused.store(false, Ordering::Relaxed);
                return true;
            }
            self.counters.paused.store(true, Ordering::Relaxed);
            tokio::select! {
                () = tokio::time::sleep(CALM_POLL) => {}
                () = shutdown.cancelled() => return false,
            }
            if let Some((taken, touch)) = holding.as_mut()
                && !self.keep(taken, touch).await
            {
                return false;
            }
        }
    }

    /// Renews this consumer's hold on a Redis chunk when due; `false` when another consumer
    /// has claimed it. A failed renewal keeps working: the worst is a claim and a second load.
    async fn keep(&self, taken: &Taken, touch: &mut Touch) -> bool {
        let (Origin::Redis(chunk), Backend::Redis { tier, consumer, .. }) =
            (&taken.origin, &self.backend)
        else {
            return true;
        };
        if !touch.due() {
            return true;
        }
        match tier.warm_touch_chunk(consumer, &chunk.entry_id).await {
            Ok(owned) => {
                if !owned {
                    tracing::info!(job = %chunk.job, chunk = chunk.index, "warm chunk claimed by another instance; leaving it");
                }
                owned
            }
            Err(error) => {
                tracing::debug!(%error, "warm chunk's hold not renewed");
                true
            }
        }
    }

    async fn complete(&self, taken: &Taken, tally: WarmTally) {
        let counted = match (&taken.origin, &self.backend) {
            (Origin::Redis(chunk), Backend::Redis { tier, .. }) => {
                match tier
                    .warm_complete_chunk(chunk, tally, self.config.job_ttl)
                    .await
                {
                    Ok(counted) => counted,
                    Err(error) => {
                        // Still pending: it is claimed and loaded again after the idle time.
                        tracing::warn!(%error, job = %chunk.job, chunk = chunk.index, "warm chunk not acknowledged; it will be claimed again");
                        add(&self.counters.chunks_abandoned, 1);
                        return;
                    }
                }
            }
            (_, Backend::Local(queue)) => {
                queue.complete(&taken.job, tally);
                true
            }
            (Origin::Local, Backend::Redis { .. }) => false,
        };
        let counters = &self.counters;
        if !counted {
            add(&counters.chunks_counted_elsewhere, 1);
            return;
        }
        add(&counters.chunks_done, 1);
        add(&counters.keys_loaded, u64::from(tally.loaded));
        add(&counters.keys_not_found, u64::from(tally.not_found));
        add(&counters.keys_failed, u64::from(tally.failed));
    }
}

impl Taken {
    fn from_redis(chunk: WarmChunk) -> Self {
        let (keys, unparsable) = WarmJobs::parse_payload(&chunk.keys);
        Self {
            job: chunk.job.clone(),
            keys,
            unparsable,
            origin: Origin::Redis(chunk),
        }
    }
}

/// When a held chunk's idle time must be reset next: every third of the claim idle time.
#[derive(Debug)]
struct Touch {
    every: Duration,
    next: Instant,
}

impl Touch {
    fn new(claim_idle: Duration) -> Self {
        let every = claim_idle / 3;
        Self {
            every,
            next: Instant::now() + every,
        }
    }

    fn due(&mut self) -> bool {
        let now = Instant::now();
        if now < self.next {
            return false;
        }
        self.next = now + self.every;
        true
    }
}

/// Spaces loads to at most `rate` keys a second: a batch of `n` keys may start once the
/// previous batches' time (`n / rate` each) has passed.
#[derive(Debug)]
struct Pacer {
    rate_per_sec: u32,
    per_key: Duration,
    next: Instant,
}

impl Pacer {
    fn new(rate_per_sec: u32) -> Self {
        Self {
            rate_per_sec,
            per_key: Duration::from_secs(1) / rate_per_sec.max(1),
            next: Instant::now(),
        }
    }

    /// The pacer at `rate_per_sec` from now on, the time already owed kept.
    fn at(&mut self, rate_per_sec: u32) -> &mut Self {
        if rate_per_sec != self.rate_per_sec {
            self.rate_per_sec = rate_per_sec;
            self.per_key = Duration::from_secs(1) / rate_per_sec.max(1);
        }
        self
    }

    /// Waits for `keys` keys' worth of time; `false` at shutdown.
    async fn wait(&mut self, keys: u32, shutdown: &CancellationToken) -> bool {
        let now = Instant::now();
        if self.next < now {
            self.next = now;
        }
        tokio::select! {
            () = tokio::time::sleep_until(self.next) => {}
            () = shutdown.cancelled() => return false,
        }
        self.next += self.per_key * keys;
        true
    }
}

/// The embedded profile's queue: chunks and job counters in process.
#[derive(Debug, Default)]
struct LocalQueue {
    state: Mutex<LocalState>,
    ready: Notify,
}

#[derive(Debug, Default)]
struct LocalState {
    chunks: VecDeque<(String, Vec<ItemKey>)>,
    jobs: HashMap<String, LocalJob>,
}

#[derive(Debug)]
struct LocalJob {
    counts: WarmJobCounts,
    changed: Instant,
}

impl LocalQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, LocalState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn submit(
        &self,
        config: &WarmJobConfig,
        job_id: &str,
        keys: Vec<ItemKey>,
    ) -> Result<(), WarmJobError> {
        let chunks: Vec<Vec<ItemKey>> = keys
            .chunks(config.chunk_keys.max(1))
            .map(<[ItemKey]>::to_vec)
            .collect();
        let wanted = chunks.len() as u64;
        let mut state = self.lock();
        let queued = state.chunks.len() as u64;
        if queued + wanted > config.max_queued_chunks {
            return Err(WarmJobError::QueueFull {
                queued,
                wanted,
                max: config.max_queued_chunks,
            });
        }
        let now = Instant::now();
        state
            .jobs
            .retain(|_, job| now.saturating_duration_since(job.changed) < config.job_ttl);
        if state.jobs.len() >= MAX_LOCAL_JOBS {
            let oldest_done = state
                .jobs
                .iter()
                .filter(|(_, job)| job.counts.done_chunks >= job.counts.total_chunks)
                .min_by_key(|(_, job)| job.changed)
                .map(|(id, _)| id.clone());
            match oldest_done {
                Some(id) => {
                    state.jobs.remove(&id);
                }
                None => {
                    return Err(WarmJobError::QueueFull {
                        queued,
                        wanted,
                        max: config.max_queued_chunks,
                    });
                }
            }
        }
        state.jobs.insert(
            job_id.to_owned(),
            LocalJob {
                counts: WarmJobCounts {
                    total_chunks: wanted,
                    total_keys: keys.len() as u64,
                    queued_chunks: wanted,
                    ..WarmJobCounts::default()
                },
                changed: now,
            },
        );
        state
            .chunks
            .extend(chunks.into_iter().map(|chunk| (job_id.to_owned(), chunk)));
        drop(state);
        self.ready.notify_one();
        Ok(())
    }

    fn pop(&self) -> Option<(String, Vec<ItemKey>)> {
        self.lock().chunks.pop_front()
    }

    fn complete(&self, job_id: &str, tally: WarmTally) {
        let mut state = self.lock();
        if let Some(job) = state.jobs.get_mut(job_id) {
            job.counts.done_chunks += 1;
            job.counts.loaded += u64::from(tally.loaded);
            job.counts.not_found += u64::from(tally.not_found);
            job.counts.failed += u64::from(tally.failed);
            job.changed = Instant::now();
        }
    }

    fn counts(&self, job_id: &str, ttl: Duration) -> Option<WarmJobCounts> {
        let state = self.lock();
        let job = state.jobs.get(job_id)?;
        (Instant::now().saturating_duration_since(job.changed) < ttl).then_some(job.counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(platform: &str, id: u64) -> ItemKey {
        ItemKey::parse(platform, &id.to_string()).unwrap()
    }

    fn config() -> WarmJobConfig {
        WarmJobConfig {
            consume: true,
            max_keys: 1_000,
            chunk_keys: 3,
            max_queued_chunks: 4,
            rate_per_sec: 10,
            concurrency: 2,
            poll_interval: Duration::from_millis(100),
            claim_idle: Duration::from_secs(3),
            job_ttl: Duration::from_secs(60),
            deadline: Duration::from_secs(1),
        }
    }

    #[test]
    fn keys_split_into_chunks_that_parse_back() {
        let keys: Vec<ItemKey> = (1..=7).map(|id| key("jd", id)).collect();
        let payloads = WarmJobs::split(&keys, 3);
        assert_eq!(payloads, ["jd:1 jd:2 jd:3", "jd:4 jd:5 jd:6", "jd:7"]);
        let parsed: Vec<ItemKey> = payloads
            .iter()
            .flat_map(|payload| {
                let (keys, unparsable) = WarmJobs::parse_payload(payload);
                assert_eq!(unparsable, 0);
                keys
            })
            .collect();
        assert_eq!(parsed, keys);
        let (keys, unparsable) = WarmJobs::parse_payload("jd:1 ebay:2 jd:x taobao:9");
        assert_eq!(keys, [key("jd", 1), key("taobao", 9)]);
        assert_eq!(unparsable, 2);
    }

    #[test]
    fn repeats_are_dropped_in_order_of_first_appearance() {
        let (keys, duplicates) = WarmJobs::distinct(vec![
            key("jd", 2),
            key("pdd", 2),
            key("jd", 2),
            key("jd", 1),
            key("pdd", 2),
        ]);
        assert_eq!(keys, [key("jd", 2), key("pdd", 2), key("jd", 1)]);
        assert_eq!(duplicates, 2);
    }

    #[test]
    fn job_ids_are_sixteen_lowercase_hex_digits() {
        assert!(WarmJobs::is_job_id("0123456789abcdef"));
        for refused in [
            "",
            "0123456789ABCDEF",
            "0123456789abcde",
            "0123456789abcdefa",
            "../../etc/passwd",
        ] {
            assert!(!WarmJobs::is_job_id(refused), "{refused}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_in_process_queue_is_bounded_and_counts_each_chunk() {
        let jobs = WarmJobs::new(config(), None, "test");
        let keys: Vec<ItemKey> = (1..=7).map(|id| key("jd", id)).collect();
        let receipt = jobs.submit(keys.clone()).await.unwrap();
        assert_eq!(
            (receipt.chunks, receipt.keys, receipt.duplicates),
            (3, 7, 0)
        );
        // 3 queued + 3 more would pass the bound of 4.
        assert_eq!(
            jobs.submit(keys).await,
            Err(WarmJobError::QueueFull {
                queued: 3,
                wanted: 3,
                max: 4
            })
        );
        let Backend::Local(queue) = &jobs.backend else {
            panic!("no tier: in process");
        };
        let (job, chunk) = queue.pop().unwrap();
        assert_eq!(job, receipt.job_id);
        assert_eq!(chunk, [key("jd", 1), key("jd", 2), key("jd", 3)]);
        queue.complete(
            &job,
            WarmTally {
                loaded: 2,
                not_found: 1,
                failed: 0,
            },
        );
        let progress = jobs.progress(&receipt.job_id).await.unwrap().unwrap();
        assert_eq!(progress.state, "running");
        assert_eq!(
            (progress.done_chunks, progress.loaded, progress.not_found),
            (1, 2, 1)
        );
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(
            jobs.progress(&receipt.job_id).await.unwrap(),
            None,
            "expired"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_pacer_holds_the_rate() {
        let shutdown = CancellationToken::new();
        let mut pacer = Pacer::new(10);
        let started = Instant::now();
        for _ in 0..5 {
            assert!(pacer.wait(2, &shutdown).await);
        }
        // Five batches of two at ten a second: the fifth may start after 0.8 s.
        assert_eq!(started.elapsed(), Duration::from_millis(800));
        shutdown.cancel();
        assert!(!pacer.wait(2, &shutdown).await);
    }

    #[test]
    fn progress_says_done_only_when_every_chunk_is() {
        let mut counts = WarmJobCounts {
            total_chunks: 2,
            total_keys: 4,
            queued_chunks: 2,
            done_chunks: 1,
            ..WarmJobCounts::default()
        };
        assert_eq!(Progress::from_counts("a", &counts).state, "running");
        counts.done_chunks = 2;
        assert_eq!(Progress::from_counts("a", &counts).state, "done");
        counts.incomplete = true;
        assert_eq!(Progress::from_counts("a", &counts).state, "incomplete");
    }
}
