//! Live rules: the runtime-tunable part of the configuration, changed for the whole fleet while
//! it runs.
//!
//! Contract: a rule set is a JSON document of live keys under the config file's names
//! ([`document`]), checked by the file's own validation and kept under the file's ceilings. Rule
//! sets are versioned rows in the store (`rebate_store::RuleRepository`); one is active. Every
//! instance applies the version meant for it — the active one, or a canary it is part of — each
//! guard, the engine's budget and each part's lifetimes swapped whole ([`apply`]), hears of a
//! change on the event bus and reads the store every
//! `rules.poll_interval_ms` as well, and applies the active version before it reports ready. A
//! canary is judged on the instances' own figures ([`canary`]); a scheduled rule set is active
//! inside its window only ([`schedule`]).
//!
//! # Layout
//! - [`document`]: [`LiveSettings`], the check of a document, diffs.
//! - [`window`]: [`RequestWindow`](window::RequestWindow), the per-second figures a canary is
//!   judged on.
//! - [`canary`]: the rollout and the verdict.
//! - [`schedule`]: windows, their overlap, what should be active at an instant.
//! - [`apply`]: [`ServiceTarget`](apply::ServiceTarget), the swap into the guards, engine and
//!   caches, and [`LiveKnobs`](apply::LiveKnobs), the live values read outside the guards.
//! - [`manager`]: [`Rules`](manager::Rules): creating, promoting, aborting and rolling back
//!   versions, the poll, and what the admin API answers.

pub mod apply;
pub mod canary;
pub mod document;
pub mod manager;
pub mod schedule;
pub mod window;

pub use document::{
    Ceilings, Change, Checked, LiveSettings, RuleError, check, check_ceilings, diff,
};

#[cfg(test)]
mod tests;
