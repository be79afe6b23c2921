//! The byte-level callback the consumer drives.

use async_trait::async_trait;
use serde::Serialize;

/// Which of the two queues a delivery came from; the handler acts differently on each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueRole {
    /// This instance's own exclusive queue: every instance sees every event (drop L1).
    Broadcast,
    /// The durable queue shared by all instances: one of them sees each event (drop + re-warm L2).
    Shared,
}

impl QueueRole {
    /// Stable lowercase name, used in headers and logs.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Broadcast => "broadcast",
            Self::Shared => "shared",
        }
    }
}

/// How a delivery failed, which decides its fate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    /// Transient (e.g. the store is down): republished after a delay until `max_deliveries`,
    /// then dead-lettered with this reason.
    #[error("retryable: {reason}")]
    Retry {
        /// Human-readable reason, carried to the dead-letter queue if retries run out.
        reason: String,
    },
    /// Transient, but the delivery's essential effect is already in place and only a follow-up
    /// step failed (e.g. the broadcast already fenced every instance's L1; the shared L2 fence
    /// failed because Redis is down). Retried exactly like [`DeliveryError::Retry`]; when
    /// attempts run out it is acknowledged and counted under `code` in
    /// [`crate::BusStats::abandoned_by_code`] instead of being dead-lettered: it is not a poison
    /// message, and the dead-letter queue stays the list of events that were never valid.
    #[error("incomplete ({code}): {reason}")]
    Incomplete {
        /// Short machine-readable code, the counter key (e.g. `l2_fence_unapplied`).
        code: String,
        /// Human-readable reason, logged when the delivery is abandoned.
        reason: String,
    },
    /// The input itself is bad (malformed, unsigned, bad signature): dead-lettered at once.
    #[error("rejected ({code}): {reason}")]
    Reject {
        /// Short machine-readable code, used as the counter key and the `x-death-code` header.
        code: String,
        /// Human-readable reason, carried in the `x-death-reason` header.
        reason: String,
    },
}

impl DeliveryError {
    /// Shorthand for [`DeliveryError::Retry`].
    pub fn retry(reason: impl Into<String>) -> Self {
        Self::Retry {
            reason: reason.into(),
        }
    }

    /// Shorthand for [`DeliveryError::Incomplete`].
    pub fn incomplete(code: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Incomplete {
            code: code.into(),
            reason: reason.into(),
        }
    }

    /// Shorthand for [`DeliveryError::Reject`].
    pub fn reject(code: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Reject {
            code: code.into(),
            reason: reason.into(),
        }
    }
}

/// Application callback for each delivery, kept at the byte level so this crate does not depend
/// on the event contract (see the `events` adapter for the typed version).
#[async_trait]
pub trait DeliveryHandler: Send + Sync + 'static {
    /// `Ok` → ack. `Err(Retry)` → requeue until max deliveries, then dead-letter with the reason.
    /// `Err(Incomplete)` → requeue until max deliveries, then ack and count as abandoned.
    /// `Err(Reject)` → dead-letter at once. A panic is treated as `Retry`.
    async fn handle(
        &self,
        queue: QueueRole,
        body: &[u8],
        signature: Option<&str>,
    ) -> Result<(), DeliveryError>;

    /// Broadcast deliveries this instance should have had are gone (see [`crate::CatchUp`]).
    async fn on_missed(&self, reason: &str) {
        let _ = reason;
    }
}
