//! Reconfiguring a guard while calls go through it ("live rules").
//!
//! Every guard keeps the values its calls read in atomics, each read with one relaxed load
//! (a plain move on x86), so a new value takes effect at the next decision without a lock on any
//! call path. A reconfiguration stores them one by one under a mutex that only reconfigurations
//! (and status pages) take: concurrent reconfigurations cannot interleave, and the last one's
//! values are the ones in force. A decision racing a reconfiguration may read some old and
//! some new values; each is a valid value, and the next decision sees only the new ones.
//!
//! State is never rebuilt: a breaker keeps its state, deadline and window, a bucket its tokens,
//! a queue its waiters. What cannot change in place (a fixed array's length, the interval that
//! every measurement is taken over) is kept at its old value and named in the [`RestartOnly`]
//! the reconfiguration returns.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::Serialize;

/// The restart-only fields a reconfiguration asked to change: each kept its old value and takes
/// the new one only when the guard is built again. Empty when everything took effect.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[must_use = "restart-only fields that differ were kept at their old values"]
pub struct RestartOnly {
    /// Field names as in the guard's configuration (`buckets`, `interval`, `breaker.buckets`).
    pub fields: Vec<String>,
}

impl RestartOnly {
    /// Whether everything asked for took effect.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// Notes `field` when the value asked for differs from the one kept.
    pub fn note<T: PartialEq + ?Sized>(&mut self, field: &str, kept: &T, asked: &T) {
        if kept != asked {
            self.fields.push(field.to_owned());
        }
    }

    /// Adds the fields a part kept (`breaker`'s `buckets` becomes `breaker.buckets`).
    pub fn nest(&mut self, part: &str, kept: RestartOnly) {
        self.fields.extend(
            kept.fields
                .into_iter()
                .map(|field| format!("{part}.{field}")),
        );
    }
}

impl fmt::Display for RestartOnly {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.fields.join(", "))
    }
}

/// An `f64` kept as bits in an `AtomicU64`.
pub(crate) fn load_f64(bits: &AtomicU64) -> f64 {
    f64::from_bits(bits.load(Ordering::Relaxed))
}

pub(crate) fn store_f64(bits: &AtomicU64, value: f64) {
    bits.store(value.to_bits(), Ordering::Relaxed);
}

/// The configuration in force behind a guard's mutex. Nothing under it can be left half-done
/// by a panic (the values are plain copies), so a poisoned lock is used as it stands.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fields_that_differ_are_noted_and_parts_are_prefixed() {
        let mut kept = RestartOnly::default();
        kept.note("buckets", &20, &20);
        assert!(kept.is_empty());
        kept.note("buckets", &20, &40);
        let mut guard = RestartOnly::default();
        guard.nest("breaker", kept);
        guard.note("quota", &Some(1), &None);
        assert_eq!(guard.fields, ["breaker.buckets", "quota"]);
        assert_eq!(guard.to_string(), "breaker.buckets, quota");
    }
}
