//! The bus contract the adapters implement, and the in-process bus of the embedded default.
//!
//! Two deliveries per event, mirroring the broker topology: a *broadcast* to every instance
//! (each drops its own L1 copy) and a *shared* delivery to exactly one instance (it drops the L2
//! copy and re-warms it), with bounded redelivery and then the dead-letter queue.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use rebate_domain::Timestamp;
use serde::Serialize;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::event::InvalidationEvent;
use crate::wire::{ValidationPolicy, decode_event, encode_event, sign};

/// Sends events to every instance. Implemented by the in-process bus and by the broker adapter.
#[async_trait]
pub trait EventPublisher: Send + Sync + fmt::Debug + 'static {
    /// Hands the event to the bus. `Ok` means the bus accepted it (queued or confirmed by the
    /// broker), not that any consumer has processed it.
    async fn publish(&self, event: &InvalidationEvent) -> Result<(), PublishError>;
}

/// What an instance does with events. Broadcast: every instance (drops its own L1). Shared:
/// exactly one instance (drops L2 and re-warms); an `Err` means "retry later" (bounded
/// redelivery, then dead letter).
///
/// Events reach handlers already validated. Delivery is at least once and, across
/// redeliveries, not strictly ordered: handlers use [`crate::Deduplicator`] and
/// [`crate::VersionGate`] to skip repeats, and must not panic (the in-process bus survives a
/// panic, counting it as a failed delivery, but a broker adapter may not).
#[async_trait]
pub trait EventHandler: Send + Sync + 'static {
    async fn on_broadcast(&self, event: &InvalidationEvent);
    async fn on_shared(&self, event: &InvalidationEvent) -> Result<(), HandlerError>;

    /// This instance may have missed broadcast deliveries it cannot get back (a broker adapter
    /// reconnected too late to replay them): whatever it keeps only for itself must be dropped.
    /// `reason` says why, for the log. The in-process bus never calls it.
    async fn on_events_missed(&self, reason: &str) {
        let _ = reason;
    }
}

/// Why the bus did not accept an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// The queue is full; the caller decides whether to retry, shed or report. Publishing never
    /// blocks indefinitely.
    #[error("the event queue is full; try again later")]
    Backpressure,
    /// The bus was shut down.
    #[error("the event bus is shut down")]
    Closed,
    /// The broker could not be reached or did not confirm (broker adapters only).
    #[error("the event broker is unavailable: {0}")]
    Unavailable(String),
}

/// A shared-delivery failure. Either kind is redelivered; they differ when redelivery runs out.
///
/// - [`HandlerError::new`]: nothing of the event is known to hold, so the event is dead-lettered
///   with this message in its reason, for an operator to look at.
/// - [`HandlerError::incomplete`]: the event's essential effect is already in place (every
///   instance fenced its L1 from the broadcast delivery) and only a follow-up step failed on a
///   dependency outage (the L2 fence while Redis is down). That is not a poison message: when
///   redelivery runs out it is acknowledged and counted under its code
///   ([`BusStats::abandoned`]) instead of filling the dead-letter queue, which stays the place
///   for malformed, unsigned and stale events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HandlerError {
    message: String,
    incomplete: Option<&'static str>,
}

impl HandlerError {
    pub fn new(message: impl fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            incomplete: None,
        }
    }

    /// A failure of a follow-up step after the event's effect is in place; `code` is a stable
    /// snake_case label (e.g. `l2_fence_unapplied`) for counters and logs.
    pub fn incomplete(code: &'static str, message: impl fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            incomplete: Some(code),
        }
    }

    /// The code given to [`HandlerError::incomplete`]; `None` for a plain failure.
    pub fn incomplete_code(&self) -> Option<&'static str> {
        self.incomplete
    }
}

/// An event the bus gave up on, kept for operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The body as received, cut to [`DeadLetter::MAX_BODY_BYTES`] (every valid event fits).
    pub body: Vec<u8>,
    /// Human-readable reason, e.g. "item_ids is empty".
    pub reason: String,
    /// Stable label: a [`crate::Rejection::code`], `handler_failed` or `no_subscriber`.
    pub code: &'static str,
    /// Shared deliveries attempted; 0 when the event was rejected before reaching a handler.
    pub deliveries: u32,
    pub at: Timestamp,
}

impl DeadLetter {
    pub const MAX_BODY_BYTES: usize = 8 * 1024;
}

/// Counters for the metrics endpoint; a snapshot, serializable as is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BusStats {
    /// Accepted by `publish` or `publish_raw`.
    pub published: u64,
    /// Broadcast handler calls (one per subscriber per event).
    pub delivered_broadcast: u64,
    /// Events whose shared delivery succeeded.
    pub delivered_shared: u64,
    /// Shared deliveries retried after a handler error.
    pub redelivered: u64,
    pub dead_lettered: u64,
    /// Events whose shared delivery ran out of attempts on an [`HandlerError::incomplete`]
    /// failure: acknowledged without their follow-up step, not dead-lettered.
    pub abandoned: u64,
    /// `abandoned` by the handler's code.
    pub abandoned_by_code: BTreeMap<String, u64>,
    /// Decoding rejections by [`crate::Rejection::code`].
    pub rejected_by_reason: BTreeMap<String, u64>,
}

/// Settings of the in-process bus.
#[derive(Debug, Clone)]
pub struct BusConfig {
    /// Events waiting for the dispatcher; beyond it `publish` fails with
    /// [`PublishError::Backpressure`].
    pub queue_capacity: usize,
    /// Shared deliveries per event (first attempt included) before it is dead-lettered.
    pub max_deliveries: u32,
    /// Pause before a redelivery, so that a failing re-warm is not hammered.
    pub redelivery_delay: Duration,
    /// Dead letters kept (oldest dropped first).
    pub dead_letter_capacity: usize,
    /// How events are validated at delivery; `now` is replaced by the wall clock per event.
    /// When it holds a signing key, `publish` signs with it, so the signed path is exercised.
    pub policy: ValidationPolicy,
}

impl Default for BusConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 1_024,
            max_deliveries: 5,
            redelivery_delay: Duration::from_millis(200),
            dead_letter_capacity: 1_000,
            policy: ValidationPolicy::permissive(Timestamp::default()),
        }
    }
}

/// Unsubscribes its handler when dropped.
pub struct Subscription {
    id: u64,
    shared: Weak<Shared>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            lock(&shared.subscribers).retain(|(id, _)| *id != self.id);
        }
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Subscription")
            .field("id", &self.id)
            .finish()
    }
}

/// The embedded default: same validation, delivery and dead-letter semantics as the broker,
/// inside one process. Cheap to clone; all clones share one queue.
///
/// Events still queued when shutdown is requested are dropped, like the L1 caches they would
/// have invalidated.
#[derive(Clone)]
pub struct InProcessBus {
    shared: Arc<Shared>,
    sender: mpsc::Sender<Envelope>,
}

struct Envelope {
    body: Vec<u8>,
    signature: Option<String>,
}

type Subscribers = Vec<(u64, Arc<dyn EventHandler>)>;

struct Shared {
    settings: BusConfig,
    subscribers: Mutex<Subscribers>,
    next_subscription_id: AtomicU64,
    dead_letters: Mutex<VecDeque<DeadLetter>>,
    counters: Counters,
    /// Envelopes fully dispatched (delivered, dead-lettered or given up at shutdown).
    dispatched: AtomicU64,
    /// Woken after every dispatched envelope, for [`InProcessBus::settled`].
    progress: Notify,
    /// Cancelled when the dispatcher task ends, for whatever reason.
    stopped: CancellationToken,
}

#[derive(Default)]
struct Counters {
    published: AtomicU64,
    delivered_broadcast: AtomicU64,
    delivered_shared: AtomicU64,
    redelivered: AtomicU64,
    dead_lettered: AtomicU64,
    rejected_by_reason: Mutex<BTreeMap<&'static str, u64>>,
    abandoned: AtomicU64,
    abandoned_by_code: Mutex<BTreeMap<&'static str, u64>>,
}

impl InProcessBus {
    /// Creates the bus and spawns its dispatcher, which runs until `shutdown` is cancelled.
    /// Must be called inside a tokio runtime.
    pub fn start(settings: BusConfig, shutdown: CancellationToken) -> Self {
        let (sender, receiver) = mpsc::channel(settings.queue_capacity.max(1));
        let shared = Arc::new(Shared {
            settings,
            subscribers: Mutex::new(Vec::new()),
            next_subscription_id: AtomicU64::new(0),
            dead_letters: Mutex::new(VecDeque::new()),
            counters: Counters::default(),
            dispatched: AtomicU64::new(0),
            progress: Notify::new(),
            stopped: CancellationToken::new(),
        });
        tokio::spawn(run_dispatcher(Arc::clone(&shared), receiver, shutdown));
        Self { shared, sender }
    }

    /// Registers a handler until the returned subscription is dropped.
    pub fn subscribe(&self, handler: Arc<dyn EventHandler>) -> Subscription {
        let id = self
            .shared
            .next_subscription_id
            .fetch_add(1, Ordering::Relaxed);
        lock(&self.shared.subscribers).push((id, handler));
        Subscription {
            id,
            shared: Arc::downgrade(&self.shared),
        }
    }

    /// Enqueues an already-encoded body, exactly as a broker consumer would receive it; it is
    /// validated at delivery and dead-lettered with its reason if refused.
    pub fn publish_raw(
        &self,
        body: Vec<u8>,
        signature: Option<String>,
    ) -> Result<(), PublishError> {
        self.sender
            .try_send(Envelope { body, signature })
            .map_err(|error| match error {
                mpsc::error::TrySendError::Full(_) => PublishError::Backpressure,
                mpsc::error::TrySendError::Closed(_) => PublishError::Closed,
            })?;
        self.shared
            .counters
            .published
            .fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// The most recent dead letters, oldest first.
    pub fn dead_letters(&self) -> Vec<DeadLetter> {
        lock(&self.shared.dead_letters).iter().cloned().collect()
    }

    pub fn stats(&self) -> BusStats {
        let counters = &self.shared.counters;
        BusStats {
            published: counters.published.load(Ordering::Relaxed),
            delivered_broadcast: counters.delivered_broadcast.load(Ordering::Relaxed),
            delivered_shared: counters.delivered_shared.load(Ordering::Relaxed),
            redelivered: counters.redelivered.load(Ordering::Relaxed),
            dead_lettered: counters.dead_lettered.load(Ordering::Relaxed),
            rejected_by_reason: lock(&counters.rejected_by_reason)
                .iter()
                .map(|(code, count)| ((*code).to_owned(), *count))
                .collect(),
            abandoned: counters.abandoned.load(Ordering::Relaxed),
            abandoned_by_code: lock(&counters.abandoned_by_code)
                .iter()
                .map(|(code, count)| ((*code).to_owned(), *count))
                .collect(),
        }
    }

    /// Resolves once every event accepted before this call has been delivered or dead-lettered,
    /// or the dispatcher has stopped. For tests and for draining before a planned stop.
    pub async fn settled(&self) {
        let target = self.shared.counters.published.load(Ordering::SeqCst);
        loop {
            let progressed = self.shared.progress.notified();
            tokio::pin!(progressed);
            progressed.as_mut().enable();
            if self.shared.dispatched.load(Ordering::SeqCst) >= target
                || self.shared.stopped.is_cancelled()
            {
                return;
            }
            tokio::select! {
                () = progressed => {}
                () = self.shared.stopped.cancelled() => return,
            }
        }
    }

    /// Resolves once the dispatcher has stopped (after shutdown, or if it ever ended).
    pub async fn stopped(&self) {
        self.shared.stopped.cancelled().await;
    }
}

#[async_trait]
impl EventPublisher for InProcessBus {
    async fn publish(&self, event: &InvalidationEvent) -> Result<(), PublishError> {
        let body = encode_event(event);
        let signature = self
            .shared
            .settings
            .policy
            .signing_key
            .as_ref()
            .map(|key| sign(&body, key));
        self.publish_raw(body, signature)
    }
}

impl fmt::Debug for InProcessBus {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("InProcessBus")
            .field("settings", &self.shared.settings)
            .field("subscribers", &lock(&self.shared.subscribers).len())
            .field(
                "queued",
                &(self.sender.max_capacity() - self.sender.capacity()),
            )
            .finish()
    }
}

async fn run_dispatcher(
    shared: Arc<Shared>,
    mut receiver: mpsc::Receiver<Envelope>,
    shutdown: CancellationToken,
) {
    let stopped_guard = shared.stopped.clone().drop_guard();
    let mut shared_turn: usize = 0;
    loop {
        let envelope = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            next = receiver.recv() => match next {
                Some(envelope) => envelope,
                None => break,
            },
        };
        shared.dispatch(envelope, &mut shared_turn, &shutdown).await;
        shared.dispatched.fetch_add(1, Ordering::SeqCst);
        shared.progress.notify_waiters();
    }
    // Refuse new events before announcing the stop.
    drop(receiver);
    drop(stopped_guard);
    tracing::debug!("in-process event bus stopped");
}

impl Shared {
    async fn dispatch(
        &self,
        envelope: Envelope,
        shared_turn: &mut usize,
        shutdown: &CancellationToken,
    ) {
        let policy = self.settings.policy.clone().at(Timestamp::now());
        let event = match decode_event(&envelope.body, envelope.signature.as_deref(), &policy) {
            Ok(event) => Arc::new(event),
            Err(rejection) => {
                *lock(&self.counters.rejected_by_reason)
                    .entry(rejection.code())
                    .or_insert(0) += 1;
                self.dead_letter(envelope.body, rejection.to_string(), rejection.code(), 0);
                return;
            }
        };
        let subscribers: Subscribers = lock(&self.subscribers).clone();
        if subscribers.is_empty() {
            self.dead_letter(
                envelope.body,
                String::from("no subscriber was listening"),
                "no_subscriber",
                0,
            );
            return;
        }

        for (_, handler) in &subscribers {
            let handler = Arc::clone(handler);
            let event_for_handler = Arc::clone(&event);
            let outcome =
                contain_panic(async move { handler.on_broadcast(&event_for_handler).await }).await;
            if let Err(panic) = outcome {
                tracing::error!(event_id = %event.event_id(), %panic, "broadcast handler failed");
            }
            self.counters
                .delivered_broadcast
                .fetch_add(1, Ordering::Relaxed);
        }

        let mut deliveries: u32 = 0;
        loop {
            let (_, handler) = &subscribers[*shared_turn % subscribers.len()];
            *shared_turn = shared_turn.wrapping_add(1);
            deliveries += 1;
            let handler = Arc::clone(handler);
            let event_for_handler = Arc::clone(&event);
            let outcome =
                contain_panic(async move { handler.on_shared(&event_for_handler).await }).await;
            let (failure, incomplete) = match outcome {
                Ok(Ok(())) => {
                    self.counters
                        .delivered_shared
                        .fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Ok(Err(handler_error)) => {
                    (handler_error.to_string(), handler_error.incomplete_code())
                }
                Err(panic) => (panic, None),
            };
            if deliveries >= self.settings.max_deliveries
                && let Some(code) = incomplete
            {
                tracing::warn!(
                    event_id = %event.event_id(),
                    code,
                    deliveries,
                    %failure,
                    "shared delivery abandoned after its last attempt; its effect is in place, its follow-up is not"
                );
                self.counters.abandoned.fetch_add(1, Ordering::Relaxed);
                *lock(&self.counters.abandoned_by_code)
                    .entry(code)
                    .or_insert(0) += 1;
                return;
            }
            if deliveries >= self.settings.max_deliveries {
                let reason =
                    format!("shared handler failed {deliveries} times; last error: {failure}");
                self.dead_letter(envelope.body, reason, "handler_failed", deliveries);
                return;
            }
            tracing::warn!(event_id = %event.event_id(), deliveries, %failure, "shared handler failed; redelivering");
            self.counters.redelivered.fetch_add(1, Ordering::Relaxed);
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.settings.redelivery_delay) => {}
            }
        }
    }

    fn dead_letter(&self, mut body: Vec<u8>, reason: String, code: &'static str, deliveries: u32) {
        tracing::warn!(code, %reason, deliveries, "event dead-lettered");
        body.truncate(DeadLetter::MAX_BODY_BYTES);
        self.counters.dead_lettered.fetch_add(1, Ordering::Relaxed);
        let mut dead_letters = lock(&self.dead_letters);
        while dead_letters.len() >= self.settings.dead_letter_capacity.max(1) {
            dead_letters.pop_front();
        }
        dead_letters.push_back(DeadLetter {
            body,
            reason,
            code,
            deliveries,
            at: Timestamp::now(),
        });
    }
}

/// Runs a handler call as its own task so that a panic becomes an error, not a dead dispatcher.
async fn contain_panic<T: Send + 'static>(
    future: impl Future<Output = T> + Send + 'static,
) -> Result<T, String> {
    tokio::spawn(future).await.map_err(|join_error| {
        if join_error.is_panic() {
            String::from("handler panicked")
        } else {
            String::from("handler was cancelled")
        }
    })
}

/// Counters and lists stay usable after a panic elsewhere; their data cannot be half-written.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
