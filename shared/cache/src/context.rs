//! What the request that started a load allows it: an attempt timeout, a deadline for retries
//! and a share of retries.
//!
//! A load runs in its own task (so a caller that gives up does not waste it), which would cut it
//! off from the request that asked for it. [`PartCache`](crate::PartCache) therefore carries the
//! starting caller's [`LoadContext`] into the load task, where a loader reads it with
//! [`LoadContext::current`]: each attempt may take the part's timeout at the request's shed level
//! (measured from when the attempt starts, so that callers joining the load later are not cut off
//! by the starter's deadline), a retry is only started if it can end before the request's
//! deadline, and the request's retries (at most two, shared by all its parts and items) are spent.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use std::time::Duration;

use tokio::time::Instant;

tokio::task_local! {
    static CONTEXT: LoadContext;
}

#[derive(Debug, Clone)]
pub struct LoadContext {
    deadline: Option<Instant>,
    attempt_timeout: Option<Duration>,
    retries_left: Arc<AtomicU32>,
}

impl LoadContext {
    /// A context for one request: its deadline and the retries it may spend in total.
    pub fn new(deadline: Option<Instant>, retries: u32) -> Self {
        Self {
            deadline,
            attempt_timeout: None,
            retries_left: Arc::new(AtomicU32::new(retries)),
        }
    }

    /// The same request (deadline, shared retries) for one part, whose attempts may each take
    /// `attempt_timeout`.
    pub fn for_part(&self, attempt_timeout: Duration) -> Self {
        Self {
            deadline: self.deadline,
            attempt_timeout: Some(attempt_timeout),
            retries_left: Arc::clone(&self.retries_left),
        }
    }

    /// How long one attempt may take, when the request set it (its part's tier at its shed level).
    pub fn attempt_timeout(&self) -> Option<Duration> {
        self.attempt_timeout
    }

    /// The context of the running task, if a request set one.
    pub fn current() -> Option<Self> {
        CONTEXT.try_with(Clone::clone).ok()
    }

    /// Runs `future` with this context as [`LoadContext::current`].
    pub async fn scope<F: Future>(self, future: F) -> F::Output {
        CONTEXT.scope(self, future).await
    }

    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Gives back a retry taken with [`LoadContext::take_retry`] that was not made after all.
    pub fn refund_retry(&self) {
        self.retries_left.fetch_add(1, Ordering::AcqRel);
    }

    /// Takes one of the request's retries; false when none is left.
    pub fn take_retry(&self) -> bool {
        self.retries_left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(1)
            })
            .is_ok()
    }

    pub fn retries_left(&self) -> u32 {
        self.retries_left.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn retries_are_shared_by_every_part_of_a_request() {
        let request = LoadContext::new(None, 2);
        let coupons = request.for_part(Duration::from_millis(500));
        let extras = request.for_part(Duration::from_millis(250));
        assert_eq!(extras.attempt_timeout(), Some(Duration::from_millis(250)));
        assert!(coupons.take_retry());
        assert!(extras.take_retry());
        assert!(!coupons.take_retry());
        assert_eq!(request.retries_left(), 0);
        extras.refund_retry();
        assert!(coupons.take_retry());
    }

    #[tokio::test]
    async fn the_context_is_visible_inside_its_scope_only() {
        assert!(LoadContext::current().is_none());
        let deadline = Instant::now() + Duration::from_secs(1);
        let seen = LoadContext::new(Some(deadline), 1)
            .scope(async { LoadContext::current().and_then(|context| context.deadline()) })
            .await;
        assert_eq!(seen, Some(deadline));
    }
}
