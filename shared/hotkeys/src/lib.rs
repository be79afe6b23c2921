//! The service's hot items, learned from its own traffic: a bounded heavy-hitter sketch.
//!
//! Contract: [`HeavyHitters`] keeps at most its configured number of counters, whatever the
//! traffic, and reports each tracked key with a `count` that never falls below the key's true
//! count and an `error` such that `count − error` never exceeds it; a key it does not track had
//! at most [`HeavyHitters::untracked_bound`] draws. Without decay, every key drawn more than
//! `N / k` times (N the draws into its shard, k the counters per shard) is therefore tracked.
//! Old traffic fades only through [`HeavyHitters::decay`], with a factor the caller computes (the
//! bounds then hold against true counts decayed alike), so this crate reads no clock. Recording
//! takes one short lock out of several, for a hash lookup and a few heap steps. The crate does
//! no I/O, spawns nothing, and depends on nothing of ours: publishing the top keys (to Redis, to
//! the status page) is the service's business.
//!
//! # Layout
//! - `heavy_hitters`: [`HeavyHitters`], the sharded front the request threads share (a key's
//!   shard is chosen by its hash, one `Mutex` per shard).
//! - `space_saving`: one Space-Saving table (Metwally et al.) as an indexed binary min-heap,
//!   and [`HotKey`], a tracked key as read.
//! - `decay`: a decay factor as exact integer scaling ([`InvalidDecayFactor`] when out of
//!   range).
//! - `config`: [`HotKeysConfig`] and [`HotKeysConfigError`].

mod config;
mod decay;
mod heavy_hitters;
mod space_saving;

pub use config::{HotKeysConfig, HotKeysConfigError, MAX_CAPACITY};
pub use decay::InvalidDecayFactor;
pub use heavy_hitters::HeavyHitters;
pub use space_saving::HotKey;
