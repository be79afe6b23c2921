//! Monotonic time in nanoseconds, injectable.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A monotonic clock in nanoseconds since an arbitrary origin. Production uses
/// [`MonotonicTicker`]; tests hold a [`ManualTicker`] and move it.
pub trait Ticker: Send + Sync + Debug + 'static {
    fn now_nanos(&self) -> u64;
}

/// `std::time::Instant` measured from the ticker's creation (a vDSO read, ~20 ns).
#[derive(Debug, Clone, Copy)]
pub struct MonotonicTicker {
    origin: Instant,
}

impl MonotonicTicker {
    #[expect(
        clippy::disallowed_methods,
        reason = "the monotonic ticker is the one wrapper of the system clock that guards read"
    )]
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicTicker {
    fn default() -> Self {
        Self::new()
    }
}

impl Ticker for MonotonicTicker {
    fn now_nanos(&self) -> u64 {
        // Starts at 1 s so that "0" can mean "never" in the guards' atomics.
        saturating_nanos(self.origin.elapsed()).saturating_add(1_000_000_000)
    }
}

/// A ticker that only moves when told to. Clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualTicker {
    nanos: Arc<AtomicU64>,
}

impl ManualTicker {
    /// Starts at 1 s, like [`MonotonicTicker`].
    pub fn new() -> Self {
        Self {
            nanos: Arc::new(AtomicU64::new(1_000_000_000)),
        }
    }

    pub fn advance(&self, by: Duration) {
        self.nanos.fetch_add(saturating_nanos(by), Ordering::SeqCst);
    }
}

impl Default for ManualTicker {
    fn default() -> Self {
        Self::new()
    }
}

impl Ticker for ManualTicker {
    fn now_nanos(&self) -> u64 {
        self.nanos.load(Ordering::SeqCst)
    }
}

/// A duration in nanoseconds, saturating at `u64::MAX` (584 years).
pub(crate) fn saturating_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

impl<T: Ticker + ?Sized> Ticker for Arc<T> {
    fn now_nanos(&self) -> u64 {
        (**self).now_nanos()
    }
}
