//! The bounds every event is checked against: its schema, its size, its item count and its
//! versions. Here, apart from the types, so that the rejections can name them.

/// The schema this crate writes and the only one it reads. A change that old consumers cannot
/// read bumps it; consumers are upgraded first.
pub const SCHEMA_VERSION: u64 = 1;

/// Bodies above this are refused unparsed. A valid event is under 4 KiB; the margin is for
/// whitespace, not for growth.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// At most this many item ids travel in one event, so that one message stays small and one
/// failing re-warm does not hold up thousands of items. Publishers split larger batches.
pub const MAX_ITEMS_PER_EVENT: usize = 100;

/// The highest data version an event may carry: 2^53 − 1, JavaScript's `Number.MAX_SAFE_INTEGER`.
///
/// Versions travel as JSON numbers, and every consumer of the body — a browser console, a
/// `jq` pipeline, a dashboard written in JS — must read the same number we fence with; above
/// 2^53 − 1 doubles round and two different versions compare equal. The bound also keeps every
/// version inside the store's signed 64-bit `version` column (a fence at a version no row can
/// reach would hide the item until the fence expires), and leaves room for any sane producer:
/// counters, and Unix timestamps in milliseconds or microseconds (1.8 × 10^15 in 2027). Valid
/// versions are therefore `1 ..= MAX_VERSION`.
pub const MAX_VERSION: u64 = (1 << 53) - 1;
