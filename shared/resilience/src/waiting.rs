//! A bounded wait for admission, for the classes of request that can afford one.
//!
//! Shedding answers at once: a request is served at a level or refused. A request nobody waits
//! for (a prefetch) can do better than a refusal when the service is at its limit for a moment:
//! it waits here, in its class's bounded queue, and is let in as capacity frees. The queue
//! decides only the *order*; the caller decides what capacity is (its admission check) and how
//! long a waiter may wait (a timer around [`Turn`]), so the piece composes with any admission.
//!
//! The contract:
//! - **Bounded.** Each class has its own bound on waiters; a full queue refuses at once
//!   ([`QueueFull`]). A class with a bound of 0 never waits; the highest class
//!   ([`RequestClass::Page`]) is refused by [`WaitConfig::validate`], so the requests a person
//!   waits for never queue, and never queue behind deferrable ones (they do not consult the
//!   queue at all).
//! - **Class order, FIFO within a class.** Only the *head* — the oldest waiter of the highest
//!   class with any waiter — is given the turn to try its admission. [`AdmissionQueue::notify`]
//!   (capacity may have freed: an admitted request ended, the limit rose) gives it the turn and
//!   wakes it; a waiter that leaves as the head (admitted, timed out or cancelled) hands the turn
//!   to the next head, so one freed slot can admit a chain of waiters and a turn is never lost
//!   with a waiter that gave up.
//! - **No lost wake-up.** The turn is a flag under the queue's lock, set before the waker is
//!   woken, so a notification that arrives while the head is busy trying is seen by its next
//!   poll. A waiter that joins as the head starts with the turn: its caller's check before
//!   joining may have raced with a notification that found the queue empty.
//! - **No leak.** Dropping a [`Waiter`] (its request's future dropped: a client that went away,
//!   a timer that fired) removes it and counts it as cancelled unless it already recorded an
//!   outcome.
//!
//! Cost: the no-wait path is atomics only — [`AdmissionQueue::notify`] on an empty queue is
//! one relaxed load, [`AdmissionQueue::ahead`] one load per class. Joining, polling, leaving and
//! notifying a non-empty queue take one mutex around a few `VecDeque` operations; only waiting
//! requests pay them.
//!
//! The bounds change in place ([`AdmissionQueue::reconfigure`]): each class's are two atomics,
//! stored under the queue's mutex (so joins, which check the bound under it, see them whole) and
//! read lock-free by [`AdmissionQueue::may_wait`] and [`AdmissionQueue::max_wait`].

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use serde::Serialize;

use crate::class::RequestClass;
use crate::ticker::{Ticker, saturating_nanos};

/// The longest wait a class may be configured with: a waiter is a request in the making, and a
/// wait of more than seconds is a timeout in all but name.
pub const MAX_CONFIGURED_WAIT: Duration = Duration::from_secs(10);
/// The largest bound on one class's waiters.
pub const MAX_CONFIGURED_WAITERS: u32 = 100_000;
/// Upper bounds (seconds) of the wait histogram's buckets; the last bucket is everything above.
pub const WAIT_BUCKETS_SECONDS: [f64; 10] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

/// One class's wait: how many may wait at once and how long each may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ClassWait {
    /// Waiters at once; the next is refused at once. 0: the class never waits.
    pub max_waiters: u32,
    /// The longest a waiter of this class waits (the caller caps it by the request's deadline).
    pub max_wait: Duration,
}

impl ClassWait {
    /// A class that never waits.
    pub const NEVER: Self = Self {
        max_waiters: 0,
        max_wait: Duration::ZERO,
    };
}

/// Which classes wait and how: one [`ClassWait`] per [`RequestClass`], lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WaitConfig {
    pub classes: [ClassWait; 3],
}

impl Default for WaitConfig {
    /// Nobody waits.
    fn default() -> Self {
        Self {
            classes: [ClassWait::NEVER; 3],
        }
    }
}

impl WaitConfig {
    /// This configuration with `class` waiting as `wait`.
    pub fn with(mut self, class: RequestClass, wait: ClassWait) -> Self {
        self.classes[class as usize] = wait;
        self
    }

    /// `class`'s wait.
    pub fn of(&self, class: RequestClass) -> ClassWait {
        self.classes[class as usize]
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.of(RequestClass::Page).max_waiters > 0 {
            return Err(
                "the page class cannot wait: a person waits for its answer, and it must never \
                 queue behind deferrable work"
                    .to_owned(),
            );
        }
        for class in RequestClass::ALL {
            let ClassWait {
                max_waiters,
                max_wait,
            } = self.of(class);
            if max_waiters > MAX_CONFIGURED_WAITERS {
                return Err(format!(
                    "{class}: max_waiters must be at most {MAX_CONFIGURED_WAITERS}, got {max_waiters}"
                ));
            }
            if max_waiters > 0 && (max_wait.is_zero() || max_wait > MAX_CONFIGURED_WAIT) {
                return Err(format!(
                    "{class}: max_wait must be within 1ms..={MAX_CONFIGURED_WAIT:?} for a class \
                     that waits, got {max_wait:?}"
                ));
            }
        }
        Ok(())
    }
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitOutcome {
    /// Admitted after waiting.
    Admitted,
    /// Refused at once: the class's queue was full (or the class does not wait).
    Full,
    /// The wait (or the request's deadline) ran out.
    TimedOut,
    /// The waiter went away (its client disconnected) before an outcome.
    Cancelled,
}

impl WaitOutcome {
    pub const ALL: [Self; 4] = [Self::Admitted, Self::Full, Self::TimedOut, Self::Cancelled];

    /// The name in metrics and the status page.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Admitted => "admitted",
            Self::Full => "full",
            Self::TimedOut => "timed_out",
            Self::Cancelled => "cancelled",
        }
    }
}

/// The class's queue was full: refuse the request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the {class} admission queue is full ({max_waiters} waiting)")]
pub struct QueueFull {
    pub class: RequestClass,
    pub max_waiters: u32,
}

/// Bounded per-class queues of requests waiting for admission (see the module's contract).
pub struct AdmissionQueue {
    /// Each class's bounds in force, lowest class first.
    bounds: [ClassBounds; 3],
    ticker: Arc<dyn Ticker>,
    /// Waiters in all classes, for the lock-free empty check of [`AdmissionQueue::notify`].
    total: AtomicU32,
    stats: [ClassStats; 3],
    inner: Mutex<Queues>,
}

#[derive(Default)]
struct Queues {
    /// Waiters per class, oldest first.
    waiting: [VecDeque<Slot>; 3],
    /// The waiter whose turn it is to try its admission (always the head when set).
    turn: Option<u64>,
    next_id: u64,
}

struct Slot {
    id: u64,
    waker: Option<Waker>,
}

/// One class's [`ClassWait`] in force: written under the queue's lock, read lock-free.
#[derive(Debug, Default)]
struct ClassBounds {
    max_waiters: AtomicU32,
    max_wait_nanos: AtomicU64,
}

impl ClassBounds {
    fn store(&self, wait: ClassWait) {
        self.max_waiters.store(wait.max_waiters, Ordering::Relaxed);
        self.max_wait_nanos
            .store(saturating_nanos(wait.max_wait), Ordering::Relaxed);
    }

    fn load(&self) -> ClassWait {
        ClassWait {
            max_waiters: self.max_waiters.load(Ordering::Relaxed),
            max_wait: Duration::from_nanos(self.max_wait_nanos.load(Ordering::Relaxed)),
        }
    }
}

/// One class's counters; written under the lock or with relaxed atomics, read lock-free.
#[derive(Default)]
struct ClassStats {
    depth: AtomicU32,
    /// The deepest `depth` has been since start (written under the lock).
    peak: AtomicU32,
    outcomes: [AtomicU64; 4],
    /// Waits that ended (any outcome but `full`), per [`WAIT_BUCKETS_SECONDS`] bucket, the last
    /// one for everything above.
    wait_buckets: [AtomicU64; WAIT_BUCKETS_SECONDS.len() + 1],
    wait_sum_nanos: AtomicU64,
}

impl Queues {
    /// The head: the oldest waiter of the highest class that has any.
    fn head(&mut self) -> Option<&mut Slot> {
        self.waiting
            .iter_mut()
            .rev()
            .find_map(|queue| queue.front_mut())
    }

    /// Gives the head the turn; returns its waker to wake once the lock is released.
    fn give_turn(&mut self) -> Option<Waker> {
        let head = self.head()?;
        let (id, waker) = (head.id, head.waker.take());
        self.turn = Some(id);
        waker
    }
}

impl AdmissionQueue {
    /// `config` must have passed [`WaitConfig::validate`].
    pub fn new(config: WaitConfig, ticker: Arc<dyn Ticker>) -> Self {
        debug_assert!(config.validate().is_ok(), "{:?}", config.validate());
        let bounds: [ClassBounds; 3] = Default::default();
        for (class, wait) in bounds.iter().zip(config.classes) {
            class.store(wait);
        }
        Self {
            bounds,
            ticker,
            total: AtomicU32::new(0),
            stats: Default::default(),
            inner: Mutex::new(Queues::default()),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> WaitConfig {
        WaitConfig {
            classes: self.bounds.each_ref().map(ClassBounds::load),
        }
    }

    /// Applies `config` in place. The waiters already queued keep their places and their
    /// turns, however many there are: a class whose bound falls below its waiters refuses new
    /// joins until enough have left to get below it, and a class set to 0 stops taking new
    /// waiters while its queued ones still wait their turn. The new `max_wait` applies to the
    /// waits that begin after the change (the caller reads [`Self::max_wait`] as a waiter starts
    /// its timer; a running timer keeps the wait it started with). `config` must have passed
    /// [`WaitConfig::validate`].
    pub fn reconfigure(&self, config: WaitConfig) {
        debug_assert!(config.validate().is_ok(), "{:?}", config.validate());
        let _queues = self.lock();
        for (class, wait) in self.bounds.iter().zip(config.classes) {
            class.store(wait);
        }
    }

    /// Whether requests of `class` wait here rather than being refused. One relaxed load, on
    /// every request's path: inlined into the caller.
    #[inline]
    pub fn may_wait(&self, class: RequestClass) -> bool {
        self.bounds[class as usize]
            .max_waiters
            .load(Ordering::Relaxed)
            > 0
    }

    /// The longest a waiter of `class` waits (before the caller's cap by its deadline).
    pub fn max_wait(&self, class: RequestClass) -> Duration {
        self.bounds[class as usize].load().max_wait
    }

    /// Whether anyone of `class` or a higher class is waiting: a new request of `class` must
    /// then queue behind them rather than take the capacity they wait for. Lock-free.
    pub fn ahead(&self, class: RequestClass) -> bool {
        self.stats[class as usize..]
            .iter()
            .any(|stats| stats.depth.load(Ordering::Acquire) > 0)
    }

    /// Waiters of `class` now.
    pub fn depth(&self, class: RequestClass) -> u32 {
        self.stats[class as usize].depth.load(Ordering::Relaxed)
    }

    /// Queues a request of `class`, or refuses it at once when the class's queue is full (or the
    /// class does not wait). The waiter starts with the turn when it is the head.
    pub fn join(&self, class: RequestClass) -> Result<Waiter<'_>, QueueFull> {
        let stats = &self.stats[class as usize];
        let mut queues = self.lock();
        let max_waiters = self.bounds[class as usize]
            .max_waiters
            .load(Ordering::Relaxed);
        let queue_len = queues.waiting[class as usize].len();
        if queue_len >= max_waiters as usize {
            drop(queues);
            stats.outcomes[WaitOutcome::Full as usize].fetch_add(1, Ordering::Relaxed);
            return Err(QueueFull { class, max_waiters });
        }
        let id = queues.next_id;
        queues.next_id += 1;
        queues.waiting[class as usize].push_back(Slot { id, waker: None });
        stats.depth.store(queue_len as u32 + 1, Ordering::Release);
        stats
            .peak
            .fetch_max(queue_len as u32 + 1, Ordering::Relaxed);
        self.total.fetch_add(1, Ordering::Release);
        if queues.head().map(|head| head.id) == Some(id) {
            // Its caller checked for capacity before joining; a notification in between found
            // the queue empty and woke nobody. Trying once more costs one check.
            queues.turn = Some(id);
        }
        drop(queues);
        Ok(Waiter {
            queue: self,
            class,
            id,
            joined_at_nanos: self.ticker.now_nanos(),
            ended: false,
        })
    }

    /// Capacity may have freed: gives the head the turn and wakes it. One relaxed load when
    /// nobody waits.
    pub fn notify(&self) {
        if self.total.load(Ordering::Acquire) == 0 {
            return;
        }
        let waker = self.lock().give_turn();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// The classes that wait, and those that no longer do but still have waiters.
    pub fn snapshot(&self) -> AdmissionQueueSnapshot {
        AdmissionQueueSnapshot {
            classes: RequestClass::ALL
                .into_iter()
                .filter(|class| self.may_wait(*class) || self.depth(*class) > 0)
                .map(|class| self.class_snapshot(class))
                .collect(),
        }
    }

    fn class_snapshot(&self, class: RequestClass) -> ClassQueueSnapshot {
        let stats = &self.stats[class as usize];
        let outcome =
            |outcome: WaitOutcome| stats.outcomes[outcome as usize].load(Ordering::Relaxed);
        let wait = self.bounds[class as usize].load();
        let wait_buckets: Vec<u64> = stats
            .wait_buckets
            .iter()
            .map(|bucket| bucket.load(Ordering::Relaxed))
            .collect();
        ClassQueueSnapshot {
            class,
            waiting: stats.depth.load(Ordering::Relaxed),
            peak_waiting: stats.peak.load(Ordering::Relaxed),
            max_waiters: wait.max_waiters,
            max_wait_ms: wait.max_wait.as_millis() as u64,
            admitted: outcome(WaitOutcome::Admitted),
            refused_full: outcome(WaitOutcome::Full),
            timed_out: outcome(WaitOutcome::TimedOut),
            cancelled: outcome(WaitOutcome::Cancelled),
            waits: wait_buckets.iter().sum(),
            wait_seconds_sum: stats.wait_sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            wait_buckets,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queues> {
        // The queues hold no invariant a panic elsewhere could break halfway: each operation
        // completes under the lock before anything that could panic.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Removes waiter `id` of `class` and records how its wait of `waited` ended; hands the turn
    /// on when it was the head.
    fn leave(&self, class: RequestClass, id: u64, outcome: WaitOutcome, waited: Duration) {
        let stats = &self.stats[class as usize];
        let mut queues = self.lock();
        let was_head = queues.head().map(|head| head.id) == Some(id);
        let queue = &mut queues.waiting[class as usize];
        if let Some(position) = queue.iter().position(|slot| slot.id == id) {
            queue.remove(position);
            stats.depth.store(queue.len() as u32, Ordering::Release);
            self.total.fetch_sub(1, Ordering::Release);
        }
        if queues.turn == Some(id) {
            queues.turn = None;
        }
        let waker = if was_head { queues.give_turn() } else { None };
        drop(queues);
        stats.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
        let seconds = waited.as_secs_f64();
        let bucket = WAIT_BUCKETS_SECONDS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(WAIT_BUCKETS_SECONDS.len());
        stats.wait_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        stats
            .wait_sum_nanos
            .fetch_add(saturating_nanos(waited), Ordering::Relaxed);
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Ready once waiter `id` has the turn (consuming it); else registers `waker`.
    fn poll_turn(&self, class: RequestClass, id: u64, waker: &Waker) -> Poll<()> {
        let mut queues = self.lock();
        if queues.turn == Some(id) {
            queues.turn = None;
            return Poll::Ready(());
        }
        if let Some(slot) = queues.waiting[class as usize]
            .iter_mut()
            .find(|slot| slot.id == id)
        {
            match &mut slot.waker {
                Some(registered) if registered.will_wake(waker) => {}
                registered => *registered = Some(waker.clone()),
            }
        }
        Poll::Pending
    }
}

impl fmt::Debug for AdmissionQueue {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("AdmissionQueue")
            .field("config", &self.config())
            .field("waiting", &self.total.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A request in its class's queue until it records an outcome or is dropped (cancelled).
#[must_use = "a waiter holds its place in the queue until it is admitted, times out or drops"]
pub struct Waiter<'a> {
    queue: &'a AdmissionQueue,
    class: RequestClass,
    id: u64,
    joined_at_nanos: u64,
    ended: bool,
}

impl<'a> Waiter<'a> {
    pub fn class(&self) -> RequestClass {
        self.class
    }

    /// Resolves when it is this waiter's turn to try its admission (it is the head and capacity
    /// may have freed). A failed try just awaits the next turn; the place is kept.
    pub fn turn(&mut self) -> Turn<'_, 'a> {
        Turn { waiter: self }
    }

    /// How long this waiter has waited.
    pub fn waited(&self) -> Duration {
        Duration::from_nanos(
            self.queue
                .ticker
                .now_nanos()
                .saturating_sub(self.joined_at_nanos),
        )
    }

    /// Its admission succeeded: leaves the queue (the next head gets the turn). Returns the wait.
    pub fn admitted(self) -> Duration {
        self.end(WaitOutcome::Admitted)
    }

    /// Its wait ran out: leaves the queue. Returns the wait.
    pub fn timed_out(self) -> Duration {
        self.end(WaitOutcome::TimedOut)
    }

    fn end(mut self, outcome: WaitOutcome) -> Duration {
        self.ended = true;
        let waited = self.waited();
        self.queue.leave(self.class, self.id, outcome, waited);
        waited
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.queue
                .leave(self.class, self.id, WaitOutcome::Cancelled, self.waited());
        }
    }
}

impl fmt::Debug for Waiter<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Waiter")
            .field("class", &self.class)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// The future of [`Waiter::turn`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Turn<'w, 'a> {
    waiter: &'w mut Waiter<'a>,
}

impl Future for Turn<'_, '_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        let waiter = &*self.waiter;
        waiter
            .queue
            .poll_turn(waiter.class, waiter.id, context.waker())
    }
}

/// What the status page and metrics show about the admission wait, for each class that waits.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdmissionQueueSnapshot {
    pub classes: Vec<ClassQueueSnapshot>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassQueueSnapshot {
    pub class: RequestClass,
    /// Waiting now.
    pub waiting: u32,
    /// The most that have waited at once since start: never above `max_waiters`.
    pub peak_waiting: u32,
    pub max_waiters: u32,
    pub max_wait_ms: u64,
    /// Admitted after waiting, since start.
    pub admitted: u64,
    /// Refused at once because the queue was full.
    pub refused_full: u64,
    /// Refused because the wait (or the request's deadline) ran out.
    pub timed_out: u64,
    /// Gone before an outcome (the client disconnected).
    pub cancelled: u64,
    /// Waits that ended (admitted, timed out or cancelled) and their total length.
    pub waits: u64,
    pub wait_seconds_sum: f64,
    /// Ended waits per bucket of [`WAIT_BUCKETS_SECONDS`] (not cumulative), the last one above.
    pub wait_buckets: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    use super::*;
    use crate::ticker::ManualTicker;

    use RequestClass::{List, Page, Prefetch};

    /// Counts its wake-ups.
    #[derive(Default)]
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl CountingWaker {
        fn woken(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    fn wait(max_waiters: u32) -> ClassWait {
        ClassWait {
            max_waiters,
            max_wait: Duration::from_millis(200),
        }
    }

    fn queue(prefetch: u32, list: u32) -> (AdmissionQueue, ManualTicker) {
        let ticker = ManualTicker::new();
        let config = WaitConfig::default()
            .with(Prefetch, wait(prefetch))
            .with(List, wait(list));
        config.validate().unwrap();
        (
            AdmissionQueue::new(config, Arc::new(ticker.clone())),
            ticker,
        )
    }

    /// Polls `waiter`'s turn once with `waker`.
    fn has_turn(waiter: &mut Waiter<'_>, waker: &Arc<CountingWaker>) -> bool {
        let waker = Waker::from(Arc::clone(waker));
        let mut context = Context::from_waker(&waker);
        let turn = std::pin::pin!(waiter.turn());
        turn.poll(&mut context).is_ready()
    }

    #[test]
    fn a_full_class_refuses_at_once_and_other_classes_are_bounded_apart() {
        let (queue, _) = queue(2, 1);
        let first = queue.join(Prefetch).unwrap();
        let second = queue.join(Prefetch).unwrap();
        assert_eq!(
            queue.join(Prefetch).unwrap_err(),
            QueueFull {
                class: Prefetch,
                max_waiters: 2
            }
        );
        let list = queue.join(List).unwrap();
        assert!(queue.join(List).is_err());
        assert_eq!((queue.depth(Prefetch), queue.depth(List)), (2, 1));
        assert!(queue.join(Page).is_err(), "the page class never waits");
        assert!(!queue.may_wait(Page) && queue.may_wait(Prefetch));
        drop((first, second, list));
        let snapshot = queue.snapshot();
        let prefetch = &snapshot.classes[0];
        assert_eq!((prefetch.class, prefetch.refused_full), (Prefetch, 1));
        assert_eq!((prefetch.waiting, prefetch.cancelled), (0, 2));
        assert_eq!(
            (prefetch.peak_waiting, snapshot.classes[1].peak_waiting),
            (2, 1)
        );
        assert_eq!(snapshot.classes.len(), 2, "only the classes that wait");
    }

    #[test]
    fn the_head_starts_with_the_turn_and_others_wait_for_theirs() {
        let (queue, _) = queue(4, 0);
        let waker = Arc::new(CountingWaker::default());
        let mut head = queue.join(Prefetch).unwrap();
        let mut second = queue.join(Prefetch).unwrap();
        assert!(has_turn(&mut head, &waker), "joined as the head");
        assert!(!has_turn(&mut head, &waker), "the turn is consumed");
        assert!(!has_turn(&mut second, &waker), "not the head");
        queue.notify();
        assert_eq!(waker.woken(), 1, "only the head is woken");
        assert!(!has_turn(&mut second, &waker));
        assert!(has_turn(&mut head, &waker));
    }

    #[test]
    fn admitting_the_head_hands_the_turn_to_the_next_in_fifo_order() {
        let (queue, ticker) = queue(4, 0);
        let waker = Arc::new(CountingWaker::default());
        let mut waiters: Vec<_> = (0..3).map(|_| queue.join(Prefetch).unwrap()).collect();
        for waiter in &mut waiters {
            has_turn(waiter, &waker);
        }
        ticker.advance(Duration::from_millis(30));
        queue.notify();
        let mut order = Vec::new();
        while !waiters.is_empty() {
            let index = waiters
                .iter_mut()
                .position(|waiter| has_turn(waiter, &waker))
                .expect("someone has the turn after the head left");
            order.push(waiters[index].id);
            assert_eq!(waiters.remove(index).admitted(), Duration::from_millis(30));
        }
        assert_eq!(order, [0, 1, 2]);
        let snapshot = queue.snapshot();
        let prefetch = &snapshot.classes[0];
        assert_eq!((prefetch.admitted, prefetch.waits), (3, 3));
        assert!((prefetch.wait_seconds_sum - 0.09).abs() < 1e-9);
        // 30 ms is in the bucket up to 50 ms.
        assert_eq!(prefetch.wait_buckets[5], 3);
    }

    #[test]
    fn a_higher_class_overtakes_waiting_lower_ones() {
        let (queue, _) = queue(4, 4);
        let waker = Arc::new(CountingWaker::default());
        let mut prefetch = queue.join(Prefetch).unwrap();
        assert!(queue.ahead(Prefetch) && !queue.ahead(List));
        let mut list = queue.join(List).unwrap();
        assert!(queue.ahead(List));
        assert!(!has_turn(&mut prefetch, &waker), "the list took the head");
        assert!(has_turn(&mut list, &waker));
        queue.notify();
        assert!(!has_turn(&mut prefetch, &waker));
        assert!(has_turn(&mut list, &waker));
        list.admitted();
        assert!(has_turn(&mut prefetch, &waker), "the turn passes down");
    }

    #[test]
    fn a_notification_while_the_head_is_trying_is_not_lost() {
        let (queue, _) = queue(4, 0);
        let waker = Arc::new(CountingWaker::default());
        let mut head = queue.join(Prefetch).unwrap();
        assert!(has_turn(&mut head, &waker));
        // The head is now checking its admission (and will fail); meanwhile capacity frees.
        queue.notify();
        assert!(has_turn(&mut head, &waker), "its next poll sees the turn");
    }

    #[test]
    fn a_head_that_gives_up_hands_its_turn_on_and_frees_its_slot() {
        let (queue, ticker) = queue(2, 0);
        let waker = Arc::new(CountingWaker::default());
        let mut head = queue.join(Prefetch).unwrap();
        let mut second = queue.join(Prefetch).unwrap();
        assert!(has_turn(&mut head, &waker), "its first try");
        assert!(!has_turn(&mut head, &waker), "it failed and waits");
        assert!(!has_turn(&mut second, &waker));
        queue.notify();
        // The head got the turn, then its client went away before it tried.
        ticker.advance(Duration::from_millis(5));
        drop(head);
        assert_eq!(
            waker.woken(),
            2,
            "the head, then the second on the hand-over"
        );
        assert!(has_turn(&mut second, &waker));
        let third = queue
            .join(Prefetch)
            .expect("the cancelled waiter freed its slot");
        assert_eq!(second.timed_out(), Duration::from_millis(5));
        drop(third);
        let snapshot = queue.snapshot();
        let prefetch = &snapshot.classes[0];
        assert_eq!(
            (prefetch.cancelled, prefetch.timed_out, prefetch.waiting),
            (2, 1, 0)
        );
        assert_eq!(queue.total.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_waiter_behind_the_head_leaving_changes_nobody_turn() {
        let (queue, _) = queue(3, 0);
        let waker = Arc::new(CountingWaker::default());
        let mut head = queue.join(Prefetch).unwrap();
        has_turn(&mut head, &waker);
        let middle = queue.join(Prefetch).unwrap();
        let mut last = queue.join(Prefetch).unwrap();
        assert!(!has_turn(&mut last, &waker));
        drop(middle);
        assert_eq!(waker.woken(), 0);
        assert!(!has_turn(&mut head, &waker) && !has_turn(&mut last, &waker));
        head.admitted();
        assert!(has_turn(&mut last, &waker), "next in line after the head");
    }

    #[test]
    fn notifying_an_empty_queue_does_nothing() {
        let (queue, _) = queue(1, 0);
        queue.notify();
        let waiter = queue.join(Prefetch).unwrap();
        drop(waiter);
        queue.notify();
        assert_eq!(queue.lock().turn, None);
    }

    #[test]
    fn waiters_on_many_threads_balance_out() {
        let (queue, _) = queue(64, 64);
        std::thread::scope(|scope| {
            for thread in 0..4 {
                let queue = &queue;
                scope.spawn(move || {
                    let waker = Arc::new(CountingWaker::default());
                    for round in 0..500 {
                        let class = if (thread + round) % 2 == 0 {
                            Prefetch
                        } else {
                            List
                        };
                        let Ok(mut waiter) = queue.join(class) else {
                            continue;
                        };
                        queue.notify();
                        if has_turn(&mut waiter, &waker) {
                            waiter.admitted();
                        } else if round % 3 == 0 {
                            waiter.timed_out();
                        }
                    }
                });
            }
        });
        assert_eq!(queue.total.load(Ordering::Relaxed), 0);
        assert!(queue.lock().waiting.iter().all(VecDeque::is_empty));
        let snapshot = queue.snapshot();
        let ended: u64 = snapshot
            .classes
            .iter()
            .map(|class| class.admitted + class.timed_out + class.cancelled + class.refused_full)
            .sum();
        assert_eq!(ended, 2_000, "every attempt has exactly one outcome");
    }

    #[test]
    fn a_smaller_bound_keeps_the_waiters_and_refuses_joins_until_they_drain_below_it() {
        let (queue, _) = queue(4, 2);
        let waker = Arc::new(CountingWaker::default());
        let mut waiters: Vec<_> = (0..4).map(|_| queue.join(Prefetch).unwrap()).collect();
        let shorter = ClassWait {
            max_waiters: 2,
            max_wait: Duration::from_millis(50),
        };
        let smaller = WaitConfig::default()
            .with(Prefetch, shorter)
            .with(List, ClassWait::NEVER);
        queue.reconfigure(smaller);
        assert_eq!(queue.config(), smaller);
        assert_eq!(queue.max_wait(Prefetch), Duration::from_millis(50));
        assert!(!queue.may_wait(List));
        assert_eq!(queue.depth(Prefetch), 4, "nobody queued is dropped");
        assert!(has_turn(&mut waiters[0], &waker), "the head keeps its turn");
        assert_eq!(
            queue.join(Prefetch).unwrap_err(),
            QueueFull {
                class: Prefetch,
                max_waiters: 2
            }
        );
        waiters.remove(0).admitted();
        assert!(has_turn(&mut waiters[0], &waker), "the turn is handed on");
        waiters.remove(0).admitted();
        assert!(queue.join(Prefetch).is_err(), "2 waiting at a bound of 2");
        drop(waiters.pop());
        let joined = queue.join(Prefetch).expect("1 waiting at a bound of 2");
        assert!(queue.join(List).is_err(), "the list class no longer waits");
        drop((waiters, joined));
        let snapshot = queue.snapshot();
        assert_eq!(snapshot.classes.len(), 1, "only the class that still waits");
        let prefetch = &snapshot.classes[0];
        assert_eq!((prefetch.max_waiters, prefetch.max_wait_ms), (2, 50));
        assert_eq!((prefetch.refused_full, prefetch.admitted), (2, 2));
    }

    #[test]
    fn validation_refuses_a_waiting_page_class_and_out_of_range_waits() {
        let page = WaitConfig::default().with(Page, wait(1));
        assert!(page.validate().unwrap_err().contains("page"));
        let forever = WaitConfig::default().with(
            Prefetch,
            ClassWait {
                max_waiters: 1,
                max_wait: Duration::from_secs(11),
            },
        );
        assert!(forever.validate().unwrap_err().contains("max_wait"));
        let zero = WaitConfig::default().with(
            Prefetch,
            ClassWait {
                max_waiters: 1,
                max_wait: Duration::ZERO,
            },
        );
        assert!(zero.validate().is_err());
        let huge = WaitConfig::default().with(Prefetch, wait(MAX_CONFIGURED_WAITERS + 1));
        assert!(huge.validate().unwrap_err().contains("max_waiters"));
        assert!(WaitConfig::default().validate().is_ok());
    }
}
