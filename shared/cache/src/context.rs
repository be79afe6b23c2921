//! What the request that started a load allows it: a deadline and a share of retries.
//!
//! A load runs in its own task (so a caller that gives up does not waste it), which would cut it
//! off from the request that asked for it. [`PartCache`](crate::PartCache) therefore carries the
//! starting caller's [`LoadContext`] into the load task, where a loader reads it with
//! [`LoadContext::current`] to cap each attempt at the deadline and to spend the request's
//! retries (at most two per request, shared by all its parts).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::time::Instant;

tokio::task_local! {
    static CONTEXT: LoadContext;
}

#[derive(Debug, Clone)]
pub struct LoadContext {
    deadline: Option<Instant>,
    retries_left: Arc<AtomicU32>,
}

impl LoadContext {
    /// A context for one request: its deadline and the retries it may spend in total.
    pub fn new(deadline: Option<Instant>, retries: u32) -> Self {
        Self {
            deadline,
            retries_left: Arc::new(AtomicU32::new(retries)),
        }
    }

    /// The same request's retry allowance under another deadline (one per part).
    pub fn with_deadline(&self, deadline: Instant) -> Self {
        Self {
            deadline: Some(deadline),
            retries_left: Arc::clone(&self.retries_left),
        }
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
    use std::time::Duration;

    #[tokio::test]
    async fn retries_are_shared_by_every_part_of_a_request() {
        let request = LoadContext::new(None, 2);
        let coupons = request.with_deadline(Instant::now() + Duration::from_millis(500));
        let extras = request.with_deadline(Instant::now() + Duration::from_millis(250));
        assert!(coupons.take_retry());
        assert!(extras.take_retry());
        assert!(!coupons.take_retry());
        assert_eq!(request.retries_left(), 0);
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
