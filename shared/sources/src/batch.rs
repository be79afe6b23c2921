//! Coalescing concurrent loads of one part into the API's batch call.
//!
//! The affiliate APIs answer many item ids per call, and their contracts count calls, not ids.
//! A `Coalescer` collects the loads that start within a short window (or until the batch is
//! full) and sends them as one call: one quota token, one breaker permit, one bulkhead slot.
//! Everything above a loader stays per key: the part cache's single flight (one load per key in
//! this process), its L2 lease (one rebuild per key in the fleet) and its version fences.
//!
//! The window is the least a batch waits. When the API's quota has no token, a batch keeps
//! filling until one is there rather than being refused: under a quota that is the bottleneck,
//! every call then carries as many items as arrived since the last one. No member waits longer
//! than half its attempt's time (or past its deadline less half of it): the batch leaves by then,
//! token or not, and the rest of that time is the call's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use rebate_cache::{LoadContext, LoadFailure, Loaded};
use rebate_domain::ItemKey;
use rebate_telemetry::Timeline;
use serde::Serialize;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tracing::Instrument;

/// How a part's loads are coalesced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchConfig {
    /// The most item ids in one call (the API's own limit). 1 turns coalescing off: every load
    /// is a single-item call.
    pub max_items: usize,
    /// How long the first load of a batch waits for others to join it.
    pub window: Duration,
}

impl BatchConfig {
    /// One call per item, as without a batch endpoint.
    pub const SINGLE: BatchConfig = BatchConfig {
        max_items: 1,
        window: Duration::ZERO,
    };

    pub fn is_batching(&self) -> bool {
        self.max_items > 1
    }
}

/// One call for many keys.
#[async_trait]
pub(crate) trait BatchFetch: Send + Sync + 'static {
    type Value: Clone + Send + Sync + 'static;

    /// The API's name, for timelines and logs.
    fn name(&self) -> &'static str;

    /// How long until a call may start: zero while the quota has a token (or there is none).
    fn wait_for_token(&self) -> Duration;

    /// The keys the API answered, each with its value. A key it did not answer is missing.
    async fn fetch_many(
        &self,
        keys: &[ItemKey],
    ) -> Result<Vec<(ItemKey, Loaded<Self::Value>)>, LoadFailure>;
}

/// Calls made and items sent, for the status page and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BatchStats {
    /// The most item ids per call.
    pub max_items: usize,
    /// How long a batch waits for loads to join, in milliseconds.
    pub window_ms: u64,
    /// Batch calls made (each took one quota token).
    pub calls: u64,
    /// Distinct item ids sent in them: `items / calls` is the mean batch size.
    pub items: u64,
    /// Calls sent because the batch was full, before its window ended.
    pub sent_full: u64,
    /// Batches that waited past their window for a quota token.
    pub waited_for_token: u64,
}

/// Collects concurrent loads into batch calls of `fetcher`. Share it through an `Arc`: the
/// batches it sends run in their own tasks.
pub(crate) struct Coalescer<F: BatchFetch> {
    fetcher: F,
    config: BatchConfig,
    open: Mutex<OpenSlot<F::Value>>,
    counters: Counters,
}

impl<F: BatchFetch> std::fmt::Debug for Coalescer<F> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Coalescer")
            .field("api", &self.fetcher.name())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Counters {
    calls: AtomicU64,
    items: AtomicU64,
    sent_full: AtomicU64,
    waited_for_token: AtomicU64,
}

/// The batch being filled, if any, and the id the next one gets.
struct OpenSlot<V> {
    next_id: u64,
    batch: Option<OpenBatch<V>>,
}

struct OpenBatch<V> {
    /// Tells the batch's timer which batch it waits for: a full batch leaves early, and the
    /// timer of a batch that already left must not send the next one.
    id: u64,
    members: Vec<Member<V>>,
    /// The least the batch waits for loads to join: its first load's window.
    window_ends: Instant,
    /// When the batch leaves at the latest, token or not: the earliest of its members'.
    send_by: Instant,
    /// Wakes the timer when `send_by` moves forward.
    wake: Arc<Notify>,
    /// The call runs in the context of the member with the latest deadline (its attempt
    /// timeout, its retries): the one whose request can wait longest for a retry.
    context: Option<LoadContext>,
}

/// What a batch's timer does next.
enum Step<V> {
    /// The batch left full, or was sent: nothing to do.
    Gone,
    Wait(Instant),
    Send(OpenBatch<V>),
}

struct Member<V> {
    key: ItemKey,
    reply: oneshot::Sender<Result<Loaded<V>, LoadFailure>>,
    /// The member's request records the batch call on its own timeline.
    timeline: Option<Arc<Timeline>>,
    /// The member's span: the call's span is a child of the first member's and follows from
    /// the others', so every request's trace shows the call that answered it.
    span: tracing::Span,
}

impl<F: BatchFetch> Coalescer<F> {
    pub(crate) fn new(fetcher: F, config: BatchConfig) -> Self {
        Self {
            fetcher,
            config,
            open: Mutex::new(OpenSlot {
                next_id: 0,
                batch: None,
            }),
            counters: Counters::default(),
        }
    }

    #[cfg(test)]
    fn fetcher(&self) -> &F {
        &self.fetcher
    }

    pub(crate) fn stats(&self) -> BatchStats {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        BatchStats {
            max_items: self.config.max_items,
            window_ms: u64::try_from(self.config.window.as_millis()).unwrap_or(u64::MAX),
            calls: read(&self.counters.calls),
            items: read(&self.counters.items),
            sent_full: read(&self.counters.sent_full),
            waited_for_token: read(&self.counters.waited_for_token),
        }
    }

    /// Loads `key` as part of the next batch call.
    pub(crate) async fn load(
        self: &Arc<Self>,
        key: ItemKey,
    ) -> Result<Loaded<F::Value>, LoadFailure> {
        let (reply, answer) = oneshot::channel();
        let context = LoadContext::current();
        let now = Instant::now();
        let send_by = self.send_by(now, context.as_ref());
        let member = Member {
            key,
            reply,
            timeline: Timeline::current(),
            span: tracing::Span::current(),
        };
        self.join(member, now, send_by, context);
        answer.await.unwrap_or_else(|_| {
            Err(LoadFailure::error(format!(
                "{} batch call ended without an answer",
                self.fetcher.name()
            )))
        })
    }

    /// When a load started `now` must leave at the latest, token or not: after half the time
    /// its attempt may take (and before its deadline less that half), or after the window for a
    /// load of no request (the window then also bounds the wait for a token).
    fn send_by(&self, now: Instant, context: Option<&LoadContext>) -> Instant {
        let budget = context.and_then(|context| {
            let half = context.attempt_timeout()? / 2;
            let before_deadline = context.deadline().map_or(now + half, |deadline| {
                deadline.checked_sub(half).unwrap_or(now)
            });
            Some((now + half).min(before_deadline).max(now))
        });
        budget.unwrap_or(now + self.config.window)
    }

    fn join(
        self: &Arc<Self>,
        member: Member<F::Value>,
        now: Instant,
        send_by: Instant,
        context: Option<LoadContext>,
    ) {
        let mut slot = self.lock();
        let batch = match &mut slot.batch {
            Some(batch) => batch,
            None => {
                let id = slot.next_id;
                slot.next_id += 1;
                let wake = Arc::new(Notify::new());
                tokio::spawn(Arc::clone(self).send_when_due(id, Arc::clone(&wake)));
                slot.batch.insert(OpenBatch {
                    id,
                    members: Vec::with_capacity(self.config.max_items),
                    window_ends: now + self.config.window,
                    send_by,
                    wake,
                    context: None,
                })
            }
        };
        batch.members.push(member);
        if send_by < batch.send_by {
            batch.send_by = send_by;
            batch.wake.notify_one();
        }
        let later_deadline = match (&batch.context, &context) {
            (None, _) => true,
            (Some(current), Some(offered)) => offered.deadline() > current.deadline(),
            (Some(_), None) => false,
        };
        if later_deadline {
            batch.context = context;
        }
        if batch.members.len() >= self.config.max_items {
            let mut full = slot.batch.take().expect("the batch just filled");
            drop(slot);
            self.counters.sent_full.fetch_add(1, Ordering::Relaxed);
            // Its timer finds another id (or none) and ends; the next load opens a new batch.
            full.wake.notify_one();
            full.window_ends = now;
            tokio::spawn(Arc::clone(self).send_with_token(full));
        }
    }

    /// When a batch should be looked at again: `None` to send it now — it is due (its window
    /// over and a token there) or it must go (`send_by`, token or not).
    fn next_check(&self, window_ends: Instant, send_by: Instant, now: Instant) -> Option<Instant> {
        if now >= send_by {
            return None;
        }
        if now < window_ends {
            return Some(window_ends.min(send_by));
        }
        let wait = self.fetcher.wait_for_token();
        if wait.is_zero() {
            return None;
        }
        Some((now + wait).min(send_by))
    }

    /// A full batch, out of the slot: sent once a token is there, or by its `send_by`.
    async fn send_with_token(self: Arc<Self>, batch: OpenBatch<F::Value>) {
        let mut waited = false;
        while let Some(check) = self.next_check(batch.window_ends, batch.send_by, Instant::now()) {
            waited = true;
            tokio::time::sleep_until(check).await;
        }
        if waited {
            self.counters
                .waited_for_token
                .fetch_add(1, Ordering::Relaxed);
        }
        self.send(batch).await;
    }

    /// The timer of batch `id`: sends it when due (see [`Coalescer::next_check`]), unless it
    /// left full before.
    async fn send_when_due(self: Arc<Self>, id: u64, wake: Arc<Notify>) {
        let mut waited = false;
        loop {
            let now = Instant::now();
            let step = {
                let mut slot = self.lock();
                match &slot.batch {
                    Some(batch) if batch.id == id => {
                        match self.next_check(batch.window_ends, batch.send_by, now) {
                            None => Step::Send(slot.batch.take().expect("matched above")),
                            Some(check) => {
                                waited |= now >= batch.window_ends;
                                Step::Wait(check)
                            }
                        }
                    }
                    _ => Step::Gone,
                }
            };
            match step {
                Step::Gone => return,
                Step::Wait(check) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(check) => {}
                        () = wake.notified() => {}
                    }
                }
                Step::Send(batch) => {
                    if waited {
                        self.counters
                            .waited_for_token
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    self.send(batch).await;
                    return;
                }
            }
        }
    }

    /// One call for every distinct key of `batch`; each member gets its key's answer.
    async fn send(self: Arc<Self>, batch: OpenBatch<F::Value>) {
        let mut keys: Vec<ItemKey> = Vec::with_capacity(batch.members.len());
        for member in &batch.members {
            if !keys.contains(&member.key) {
                keys.push(member.key);
            }
        }
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        self.counters
            .items
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        let name = self.fetcher.name();
        let span = tracing::debug_span!(
            parent: batch.members.first().map(|member| &member.span).and_then(tracing::Span::id),
            "batch",
            api = name,
            items = keys.len(),
        );
        for member in batch.members.iter().skip(1) {
            span.follows_from(&member.span);
        }
        let started = Instant::now();
        // The call's stages (each attempt, its outcome) go on a time line of its own, copied
        // onto every member's afterwards.
        let call_timeline = batch
            .members
            .iter()
            .find_map(|member| member.timeline.as_ref())
            .map(|timeline| Timeline::new(timeline.trace_id()));
        let call = self.fetcher.fetch_many(&keys).instrument(span);
        let call = async {
            match batch.context {
                Some(context) => context.scope(call).await,
                None => call.await,
            }
        };
        let result = match &call_timeline {
            Some(timeline) => Arc::clone(timeline).scope(call).await,
            None => call.await,
        };
        let (mut found, outcome) = match result {
            Ok(found) => (Ok(found.into_iter().collect::<HashMap<_, _>>()), "answered"),
            Err(failure) => (Err(failure), "failed"),
        };
        let stage = format!("{outcome}: one call for {} items", keys.len());
        for member in batch.members {
            let answer = match &mut found {
                // A duplicate member (a load detached by an invalidation, then started again)
                // gets a copy; the last one could take it, but the batch is small.
                Ok(found) => found.get(&member.key).cloned().ok_or_else(|| {
                    LoadFailure::error(format!(
                        "{name} batch answer had no entry for {}",
                        member.key
                    ))
                }),
                Err(failure) => Err(failure.clone()),
            };
            if let Some(timeline) = member.timeline {
                if let Some(call_timeline) = &call_timeline {
                    timeline.record_from(call_timeline);
                }
                timeline.record("batch", name, stage.clone(), started, None);
            }
            // The caller may have given up; its load's result is then nobody's.
            let _ = member.reply.send(answer);
        }
    }

    /// A panic under the lock leaves the slot whole (each change is one assignment or push), so
    /// a poisoned lock is taken as it is.
    fn lock(&self) -> MutexGuard<'_, OpenSlot<F::Value>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use super::*;

    /// Answers every key but `missing`, with the call's number as the version; records calls.
    /// Its quota has a token from `token_at` on (the test's paused clock), none before.
    struct FakeApi {
        calls: StdMutex<Vec<Vec<ItemKey>>>,
        missing: Option<ItemKey>,
        fail: bool,
        delay: Duration,
        token_at: StdMutex<Option<Instant>>,
    }

    impl FakeApi {
        fn new() -> Self {
            Self {
                calls: StdMutex::new(Vec::new()),
                missing: None,
                fail: false,
                delay: Duration::ZERO,
                token_at: StdMutex::new(None),
            }
        }

        fn calls(&self) -> Vec<Vec<ItemKey>> {
            self.calls.lock().unwrap().clone()
        }
    }

    #[async_trait]
    impl BatchFetch for FakeApi {
        type Value = String;

        fn name(&self) -> &'static str {
            "fake"
        }

        fn wait_for_token(&self) -> Duration {
            self.token_at.lock().unwrap().map_or(Duration::ZERO, |at| {
                at.saturating_duration_since(Instant::now())
            })
        }

        async fn fetch_many(
            &self,
            keys: &[ItemKey],
        ) -> Result<Vec<(ItemKey, Loaded<String>)>, LoadFailure> {
            let number = {
                let mut calls = self.calls.lock().unwrap();
                calls.push(keys.to_vec());
                calls.len() as u64
            };
            tokio::time::sleep(self.delay).await;
            if self.fail {
                return Err(LoadFailure::error("fake api down"));
            }
            Ok(keys
                .iter()
                .filter(|key| Some(**key) != self.missing)
                .map(|key| {
                    let loaded = Loaded {
                        value: Some(key.to_string()),
                        version: number,
                    };
                    (*key, loaded)
                })
                .collect())
        }
    }

    fn key(id: u64) -> ItemKey {
        ItemKey::parse("taobao", &id.to_string()).unwrap()
    }

    fn coalescer(api: FakeApi, max_items: usize, window_ms: u64) -> Arc<Coalescer<FakeApi>> {
        Arc::new(Coalescer::new(
            api,
            BatchConfig {
                max_items,
                window: Duration::from_millis(window_ms),
            },
        ))
    }

    async fn load_all(
        coalescer: &Arc<Coalescer<FakeApi>>,
        ids: impl IntoIterator<Item = u64>,
    ) -> Vec<Result<Loaded<String>, LoadFailure>> {
        let loads: Vec<_> = ids
            .into_iter()
            .map(|id| {
                let coalescer = Arc::clone(coalescer);
                tokio::spawn(async move { coalescer.load(key(id)).await })
            })
            .collect();
        let mut answers = Vec::new();
        for load in loads {
            answers.push(load.await.unwrap());
        }
        answers
    }

    #[tokio::test(start_paused = true)]
    async fn loads_within_the_window_share_one_call() {
        let coalescer = coalescer(FakeApi::new(), 40, 5);
        let started = Instant::now();
        let answers = load_all(&coalescer, 100_001..=100_010).await;
        assert_eq!(started.elapsed(), Duration::from_millis(5));
        for (id, answer) in (100_001..=100_010).zip(answers) {
            let loaded = answer.unwrap();
            assert_eq!(loaded.value.as_deref(), Some(key(id).to_string().as_str()));
            assert_eq!(loaded.version, 1);
        }
        assert_eq!(coalescer.fetcher().calls().len(), 1);
        assert_eq!(coalescer.fetcher().calls()[0].len(), 10);
        let stats = coalescer.stats();
        assert_eq!((stats.calls, stats.items, stats.sent_full), (1, 10, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_leaves_before_its_window() {
        let coalescer = coalescer(FakeApi::new(), 4, 1_000);
        let started = Instant::now();
        let answers = load_all(&coalescer, 100_001..=100_008).await;
        assert!(started.elapsed() < Duration::from_millis(1_000));
        assert!(answers.iter().all(Result::is_ok));
        let calls = coalescer.fetcher().calls();
        assert_eq!(calls.len(), 2);
        assert!(calls.iter().all(|call| call.len() == 4));
        assert_eq!(coalescer.stats().sent_full, 2);
        // The timers of the batches that left full end without sending anything.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(coalescer.fetcher().calls().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn loads_after_the_window_go_in_the_next_call() {
        let coalescer = coalescer(FakeApi::new(), 40, 5);
        let first = load_all(&coalescer, [100_001, 100_002]).await;
        let second = load_all(&coalescer, [100_003]).await;
        assert_eq!(first[0].as_ref().unwrap().version, 1);
        assert_eq!(second[0].as_ref().unwrap().version, 2);
        assert_eq!(coalescer.fetcher().calls().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tight_deadline_sends_the_batch_at_once() {
        let coalescer = coalescer(FakeApi::new(), 40, 50);
        let waiting = {
            let coalescer = Arc::clone(&coalescer);
            tokio::spawn(async move { coalescer.load(key(100_001)).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(coalescer.fetcher().calls().is_empty());
        // This request must start its call within 5 ms: its deadline is 55 ms away and half its
        // 100 ms attempt must be left for the call.
        let context = LoadContext::new(Some(Instant::now() + Duration::from_millis(55)), 2)
            .for_part(Duration::from_millis(100));
        let joined = Instant::now();
        let urgent = context
            .scope({
                let coalescer = Arc::clone(&coalescer);
                async move { coalescer.load(key(100_002)).await }
            })
            .await;
        assert_eq!(joined.elapsed(), Duration::from_millis(5));
        assert!(urgent.is_ok());
        assert!(waiting.await.unwrap().is_ok());
        assert_eq!(
            coalescer.fetcher().calls(),
            vec![vec![key(100_001), key(100_002)]]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_same_key_twice_is_sent_once_and_answered_twice() {
        let coalescer = coalescer(FakeApi::new(), 40, 5);
        let answers = load_all(&coalescer, [100_001, 100_001, 100_002]).await;
        assert!(answers.iter().all(Result::is_ok));
        assert_eq!(
            coalescer.fetcher().calls(),
            vec![vec![key(100_001), key(100_002)]]
        );
        assert_eq!(coalescer.stats().items, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_call_fails_every_member_and_a_missing_key_fails_alone() {
        let failing = coalescer(
            FakeApi {
                fail: true,
                ..FakeApi::new()
            },
            40,
            5,
        );
        let answers = load_all(&failing, [100_001, 100_002]).await;
        for answer in answers {
            assert_eq!(answer.unwrap_err().detail.as_ref(), "fake api down");
        }

        let partial = coalescer(
            FakeApi {
                missing: Some(key(100_002)),
                ..FakeApi::new()
            },
            40,
            5,
        );
        let answers = load_all(&partial, [100_001, 100_002]).await;
        assert!(answers[0].is_ok());
        let failure = answers[1].as_ref().unwrap_err();
        assert!(
            failure.detail.contains("no entry for taobao:100002"),
            "{failure}"
        );
    }

    /// A request whose call may take 100 ms joins at `at` (paused clock): it leaves by 50 ms
    /// after joining, token or not.
    async fn load_with_budget(
        coalescer: &Arc<Coalescer<FakeApi>>,
        id: u64,
    ) -> Result<Loaded<String>, LoadFailure> {
        let context = LoadContext::new(Some(Instant::now() + Duration::from_secs(1)), 2)
            .for_part(Duration::from_millis(100));
        let coalescer = Arc::clone(coalescer);
        context
            .scope(async move { coalescer.load(key(id)).await })
            .await
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_token_a_batch_keeps_filling_until_one_is_there() {
        let coalescer = coalescer(FakeApi::new(), 40, 5);
        *coalescer.fetcher().token_at.lock().unwrap() =
            Some(Instant::now() + Duration::from_millis(30));
        let started = Instant::now();
        let early = tokio::spawn({
            let coalescer = Arc::clone(&coalescer);
            async move { load_with_budget(&coalescer, 100_001).await }
        });
        // Past the 5 ms window, before the token: the batch is still open and takes this load.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(coalescer.fetcher().calls().is_empty());
        let late = load_with_budget(&coalescer, 100_002).await;
        assert!(late.is_ok());
        assert!(early.await.unwrap().is_ok());
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(30),
            "sent when the token came"
        );
        assert_eq!(
            coalescer.fetcher().calls(),
            vec![vec![key(100_001), key(100_002)]]
        );
        assert_eq!(coalescer.stats().waited_for_token, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_leaves_by_half_its_members_attempt_time_token_or_not() {
        let coalescer = coalescer(FakeApi::new(), 40, 5);
        *coalescer.fetcher().token_at.lock().unwrap() =
            Some(Instant::now() + Duration::from_secs(10));
        let started = Instant::now();
        assert!(load_with_budget(&coalescer, 100_001).await.is_ok());
        // Half of the 100 ms attempt: the call then has the other half (here the fake answers).
        assert_eq!(started.elapsed(), Duration::from_millis(50));
        assert_eq!(coalescer.fetcher().calls().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_waits_for_its_token_while_the_next_one_fills() {
        let coalescer = coalescer(FakeApi::new(), 2, 5);
        *coalescer.fetcher().token_at.lock().unwrap() =
            Some(Instant::now() + Duration::from_millis(20));
        let started = Instant::now();
        let loads: Vec<_> = (100_001..=100_003)
            .map(|id| {
                let coalescer = Arc::clone(&coalescer);
                tokio::spawn(async move { load_with_budget(&coalescer, id).await })
            })
            .collect();
        for load in loads {
            assert!(load.await.unwrap().is_ok());
        }
        assert_eq!(started.elapsed(), Duration::from_millis(20));
        let calls = coalescer.fetcher().calls();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0], vec![key(100_001), key(100_002)]);
        assert_eq!(calls[1], vec![key(100_003)]);
    }

    #[tokio::test(start_paused = true)]
    async fn members_record_the_call_on_their_timelines() {
        let coalescer = coalescer(FakeApi::new(), 40, 5);
        let timeline = Timeline::new(rebate_telemetry::TraceId::generate());
        let answer = Arc::clone(&timeline)
            .scope({
                let coalescer = Arc::clone(&coalescer);
                async move { coalescer.load(key(100_001)).await }
            })
            .await;
        assert!(answer.is_ok());
        let stages = timeline.stages();
        assert_eq!(stages.len(), 1);
        assert_eq!(stages[0].kind, "batch");
        assert_eq!(stages[0].outcome, "answered: one call for 1 items");
    }
}
