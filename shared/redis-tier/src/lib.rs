//! The shared (L2) tier on Redis or Redis Cluster: [`RedisTier`] implements
//! [`rebate_cache::SharedTier`].
//!
//! Contract: a batch read costs one round trip on a single server (`MGET`) and one pipelined
//! round trip per node on a cluster (the nodes are asked in parallel); a write is refused on the
//! server when the key holds a newer data version (one Lua script, so no other writer can slip
//! in between the check and the `SET`); a rebuild lease is `SET NX PX` and is released only by
//! the token that took it. Every operation is bounded by the command timeout and fails as
//! [`TierError::Timeout`](rebate_cache::TierError::Timeout) or
//! [`TierError::Backend`](rebate_cache::TierError::Backend) — never a panic, never a password in
//! a message — and a stored value that does not decode reads as absent, so Redis can slow a
//! request down by at most the timeout and never fail it. This crate knows nothing of HTTP, SQL
//! or envelopes: it stores the opaque bytes it is given.
//!
//! # Layout
//! - [`settings`]: [`RedisTierConfig`] and [`RedisTarget`], with a `Debug` that masks passwords.
//! - `tier`: [`RedisTier`], its connection handling and the batch split by cluster node.
//! - `codec`: the stored form `{version}:{bytes}`.
//! - `scripts`: the fenced `SET`, the lease compare-and-delete, the token grant, the
//!   heartbeat, the hot keys' publication and change capture's lease and holder-only writes.
//! - `slots`: the key → slot → node map used to group a batch by node.
//! - `fleet`: fleet-wide token buckets ([`TokenGrant`]) and the registry of live instances.
//! - [`stats`]: [`RedisTierStats`], lock-free counters (round trips, hits, refused writes, …).
//! - `warm`: the fleet's warm jobs, chunks on a stream read through one consumer group.
//! - `capture`: change capture's lease with its fencing token ([`CaptureLease`]), and the
//!   records only the lease's holder may write ([`CaptureRecord`]).
//!
//! # Keys
//! `{prefix}:v1:{platform}:{item_id}:{part}` (e.g. `rebate:v1:taobao:100001:coupons`) and the
//! same with `:lease` appended for the rebuild lease. No hash tags: keys spread over all slots.
//! `{prefix}:quota:{api}` holds a fleet-wide token bucket, `{prefix}:instances` the registry.
//! `{<prefix>:warm}:jobs` is the stream of warm chunks and `{<prefix>:warm}:job:<id>` a warm job's
//! counters (one hash tag, so a chunk's acknowledgement and its job's counts change in one script).
//! `{<prefix>:cc}:lease`, `:fence`, `:position` and `:resync` are change capture's.

mod capture;
mod codec;
mod fleet;
mod scripts;
pub mod settings;
mod slots;
pub mod stats;
mod tier;
mod warm;

pub use capture::{CaptureLease, CaptureRecord, LeaseAttempt};
pub use fleet::{Heartbeat, KeyCounts, TokenGrant};
pub use settings::{RedisTarget, RedisTierConfig, RedisTls};
pub use stats::RedisTierStats;
pub use tier::RedisTier;
pub use warm::{WARM_GROUP, WarmChunk, WarmJobCounts, WarmTally};
