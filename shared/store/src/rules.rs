//! Rule sets: the runtime-tunable configuration operators change while the service runs, kept as
//! numbered versions, and each instance's latest report of the version it applied.
//!
//! Contract: [`RuleRepository`] stores documents as opaque JSON text; what a document means, and
//! which moves between [`RuleState`]s are allowed, is the caller's policy (it names the states a
//! move may start from in [`RuleRepository::transition_rule_set`]). The store guarantees three
//! things on both backends:
//! - versions are assigned by the store: 1 first, then the highest stored version + 1;
//! - at most one row is [`RuleState::Active`], also while writers race: activating a row
//!   supersedes the one active before in the same transaction;
//! - a value that does not fit its column (the limits below) is refused with
//!   [`StoreError::ValueOutOfRange`] before anything is written, and a row that breaks an invariant
//!   reads as [`StoreError::CorruptRow`].
//!
//! The SQL is written once, generic over the database, in the private `sql` submodule; each store
//! adds only its dialect (how a writing transaction starts, how rows are locked, the upsert, and
//! which errors mean a lost race).

pub(crate) mod sql;

use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use rebate_domain::Timestamp;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::StoreError;

/// The longest document, in bytes of UTF-8 (MySQL: `MEDIUMTEXT` with a CHECK).
pub const MAX_DOCUMENT_BYTES: usize = 64 * 1024;
/// The longest author, in characters (MySQL's `VARCHAR` counts characters, not bytes).
pub const MAX_AUTHOR_CHARS: usize = 128;
/// The longest reason, in characters.
pub const MAX_REASON_CHARS: usize = 1024;
/// The longest rollout description, in bytes.
pub const MAX_ROLLOUT_BYTES: usize = 16 * 1024;
/// The longest verdict, in bytes.
pub const MAX_VERDICT_BYTES: usize = 16 * 1024;
/// The longest instance id, in characters; an empty one is refused too.
pub const MAX_INSTANCE_ID_CHARS: usize = 128;
/// The longest instance report, in bytes.
pub const MAX_REPORT_BYTES: usize = 16 * 1024;
/// The most rows one page of [`RuleRepository::rule_sets`] returns, whatever the caller asks for.
pub const MAX_RULE_SETS_PAGE: u32 = 1_000;

/// Where a rule set stands in its lifecycle. Stored as its [`RuleState::as_str`] name, which is
/// also its serde form; the schema's CHECK lists the same names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuleState {
    /// Stored and applied nowhere yet, waiting for an operator.
    Staged,
    /// Applied by part of the fleet (see the row's rollout) while its verdict is out.
    Canary,
    /// What every instance applies. At most one row is in this state.
    Active,
    /// Reverted after it was applied, in favour of its `previous_version`.
    RolledBack,
    /// Was active until another version became active.
    Superseded,
    /// To become active inside its schedule window.
    Scheduled,
    /// Stopped before it became active.
    Aborted,
    /// Its schedule window ended before it became active.
    Expired,
}

impl RuleState {
    pub const ALL: [RuleState; 8] = [
        RuleState::Staged,
        RuleState::Canary,
        RuleState::Active,
        RuleState::RolledBack,
        RuleState::Superseded,
        RuleState::Scheduled,
        RuleState::Aborted,
        RuleState::Expired,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            RuleState::Staged => "staged",
            RuleState::Canary => "canary",
            RuleState::Active => "active",
            RuleState::RolledBack => "rolled_back",
            RuleState::Superseded => "superseded",
            RuleState::Scheduled => "scheduled",
            RuleState::Aborted => "aborted",
            RuleState::Expired => "expired",
        }
    }

    /// The state named `text`, exactly as [`RuleState::as_str`] spells it.
    pub fn parse(text: &str) -> Result<Self, UnknownRuleState> {
        RuleState::ALL
            .into_iter()
            .find(|state| state.as_str() == text)
            .ok_or_else(|| UnknownRuleState(rebate_domain::text::truncate_chars(text, 32)))
    }
}

/// A name that is not one of [`RuleState::ALL`] (cut to 32 characters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown rule state {0:?}; expected one of staged, canary, active, rolled_back, superseded, \
     scheduled, aborted, expired"
)]
pub struct UnknownRuleState(pub String);

impl FromStr for RuleState {
    type Err = UnknownRuleState;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl fmt::Display for RuleState {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

impl Serialize for RuleState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for RuleState {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// One stored version of the rules, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSetRow {
    /// Assigned by the store: the highest version so far + 1, starting at 1.
    pub version: u64,
    /// The rules themselves, JSON text as written.
    pub document: String,
    pub author: String,
    /// Why the operator made the change; shown in the history.
    pub reason: String,
    pub created_at: Timestamp,
    /// When it last became active; `None` if it never was.
    pub activated_at: Option<Timestamp>,
    pub state: RuleState,
    /// How a canary is rolled out (JSON text), for the caller to interpret.
    pub rollout: Option<String>,
    pub schedule_from: Option<Timestamp>,
    pub schedule_until: Option<Timestamp>,
    /// The version to go back to when this one is reverted, as the caller recorded it.
    pub previous_version: Option<u64>,
    /// The outcome of a canary or a check (JSON text), written by the move that decided it.
    pub verdict: Option<String>,
    /// When the row was inserted or last moved.
    pub updated_at: Timestamp,
}

/// What [`RuleRepository::insert_rule_set`] writes; the store adds the version and the times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRuleSet {
    pub document: String,
    pub author: String,
    pub reason: String,
    /// [`RuleState::Active`] activates it at once, superseding the active row.
    pub state: RuleState,
    pub rollout: Option<String>,
    pub schedule_from: Option<Timestamp>,
    pub schedule_until: Option<Timestamp>,
    /// Written as given: the store does not look it up or change it later.
    pub previous_version: Option<u64>,
}

/// An instance's latest word on the rules it runs; each report replaces the instance's previous
/// one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceReport {
    pub instance_id: String,
    /// The version the instance applies; 0 when it applies none.
    pub applied_version: u64,
    pub reported_at: Timestamp,
    /// Whatever else the instance tells (JSON text).
    pub report: String,
}

/// The versioned rule sets and the instances' reports.
///
/// As with [`crate::CatalogRepository`], `Ok(None)` (or an empty list, or `false`) means "not
/// there" and `Err` only that the store failed or a value was refused.
#[async_trait]
pub trait RuleRepository: Send + Sync + fmt::Debug {
    /// Inserts with the next version and returns it. When `new.state` is
    /// [`RuleState::Active`], the previously active row becomes [`RuleState::Superseded`] and the
    /// new row gets `activated_at = now`, in the same transaction.
    async fn insert_rule_set(&self, new: &NewRuleSet, now: Timestamp) -> Result<u64, StoreError>;

    async fn rule_set(&self, version: u64) -> Result<Option<RuleSetRow>, StoreError>;

    /// The history, newest first: at most `limit` rows (capped at [`MAX_RULE_SETS_PAGE`]), only
    /// versions below `before` when given (pass the last version of a page to get the next).
    async fn rule_sets(
        &self,
        limit: u32,
        before: Option<u64>,
    ) -> Result<Vec<RuleSetRow>, StoreError>;

    async fn active_rule_set(&self) -> Result<Option<RuleSetRow>, StoreError>;

    /// Every row in any of `states` (e.g. every canary or scheduled row), oldest first.
    async fn rule_sets_in(&self, states: &[RuleState]) -> Result<Vec<RuleSetRow>, StoreError>;

    /// Compare-and-set: moves `version` to `to` only if its state is one of `from`, and returns
    /// whether it moved (`false` for an unknown version too). `verdict`, when given, is written
    /// as well; `None` keeps the row's verdict. When `to` is [`RuleState::Active`], the row gets
    /// `activated_at = now` and the row active before (if another) becomes
    /// [`RuleState::Superseded`], in one transaction.
    async fn transition_rule_set(
        &self,
        version: u64,
        from: &[RuleState],
        to: RuleState,
        verdict: Option<&str>,
        now: Timestamp,
    ) -> Result<bool, StoreError>;

    /// Inserts or replaces the instance's report.
    async fn report_instance(&self, report: &InstanceReport) -> Result<(), StoreError>;

    /// Every report newer than `since` (strictly), ordered by instance id.
    async fn instance_reports(&self, since: Timestamp) -> Result<Vec<InstanceReport>, StoreError>;

    /// Deletes the reports older than `before` (instances gone for good: every restart reports
    /// under a new id); how many.
    async fn forget_instances(&self, before: Timestamp) -> Result<u64, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_parses_back_from_its_name_and_serialises_as_it() {
        for state in RuleState::ALL {
            assert_eq!(RuleState::parse(state.as_str()), Ok(state));
            assert_eq!(state.as_str().parse::<RuleState>(), Ok(state));
            assert_eq!(state.to_string(), state.as_str());
            let json = serde_json::to_string(&state).unwrap();
            assert_eq!(json, format!("\"{}\"", state.as_str()));
            assert_eq!(serde_json::from_str::<RuleState>(&json).unwrap(), state);
        }
        assert_eq!(RuleState::RolledBack.as_str(), "rolled_back");
    }

    #[test]
    fn names_are_exact() {
        for text in [
            "",
            "Active",
            "rolledback",
            "rolled-back",
            " active",
            "activated",
        ] {
            assert_eq!(
                RuleState::parse(text),
                Err(UnknownRuleState(text.to_owned())),
                "{text:?}"
            );
        }
        assert!(serde_json::from_str::<RuleState>("\"ACTIVE\"").is_err());
        let long = "x".repeat(100);
        let error = RuleState::parse(&long).unwrap_err();
        assert_eq!(
            error.0.chars().count(),
            33,
            "cut to 32 characters and an ellipsis"
        );
    }
}
