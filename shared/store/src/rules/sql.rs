//! The rule tables in SQL, written once for both stores.
//!
//! [`RuleTables`] holds every statement and transaction of [`super::RuleRepository`], generic
//! over the database; the statements are text both SQLite and MySQL parse (`?` placeholders, no
//! dialect functions). A store adds its [`RuleDialect`] and delegates each trait method to
//! [`RuleTables`].
//!
//! How writers stay correct when they race:
//! - SQLite runs one writing transaction at a time (`BEGIN IMMEDIATE`), so reading the newest
//!   version or the active row and then writing is never interleaved with another writer.
//! - MySQL/InnoDB lets writers interleave. A transaction that read a version another writer has
//!   since taken fails on the primary key, one that activates a row while another does fails on
//!   the unique key over the active row, and crossing row locks end in a deadlock; all three
//!   leave nothing written, and [`RuleTables`] runs the transaction again on a fresh snapshot
//!   (at most [`MAX_LOST_RACES`] times).
//!
//! Values are checked against the column limits before any statement runs, and every row read is
//! validated into a [`RuleSetRow`] or [`InstanceReport`], or refused as a corrupt row.

use std::future::Future;
use std::time::Duration;

use rebate_domain::Timestamp;
use rebate_domain::text::truncate_chars;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use super::{
    InstanceReport, MAX_AUTHOR_CHARS, MAX_DOCUMENT_BYTES, MAX_INSTANCE_ID_CHARS, MAX_REASON_CHARS,
    MAX_REPORT_BYTES, MAX_ROLLOUT_BYTES, MAX_RULE_SETS_PAGE, MAX_VERDICT_BYTES, NewRuleSet,
    RuleSetRow, RuleState,
};
use crate::StoreError;
use crate::rows::to_column;

/// How often a writing transaction is run again after losing a race before its error is
/// returned. Each round of racing writers lets at least one commit, so this covers that many
/// writers racing for the same version at once.
pub(crate) const MAX_LOST_RACES: u32 = 32;

/// The longest pause before running a transaction again; pauses are random up to
/// `2^round` ms (below this), so racing writers spread out instead of colliding again.
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(32);

/// What differs between the databases; everything else in [`RuleTables`] is shared.
pub(crate) trait RuleDialect: Database {
    /// Starts every writing transaction.
    const BEGIN_WRITE: &'static str;

    /// `SELECT state FROM rule_sets WHERE version = ?`, locking the row against other writers
    /// until the transaction ends (where the database locks single rows).
    const SELECT_STATE_FOR_UPDATE: &'static str;

    /// Inserts a `rule_instances` row or replaces every column of the existing one. Binds
    /// `instance_id`, `applied_version`, `reported_at_ms`, `report`.
    const UPSERT_INSTANCE: &'static str;

    /// Whether `error` means that a writing transaction lost a race with another writer (and
    /// wrote nothing), so that running it again can succeed.
    fn lost_race(error: &sqlx::Error) -> bool;

    /// Rows a statement changed.
    fn rows_affected(result: &Self::QueryResult) -> u64;
}

/// The columns of [`RuleSetRecord`], followed by `$tail`.
macro_rules! select_rule_sets {
    ($($tail:literal),*) => {
        concat!(
            "SELECT version, document, author, reason, created_at_ms, activated_at_ms, state, \
             rollout, schedule_from_ms, schedule_until_ms, previous_version, verdict, \
             updated_at_ms FROM rule_sets",
            $($tail),*
        )
    };
}

const SELECT_RULE_SET: &str = select_rule_sets!(" WHERE version = ?");

const SELECT_NEWEST_RULE_SETS: &str = select_rule_sets!(" ORDER BY version DESC LIMIT ?");

const SELECT_RULE_SETS_BEFORE: &str =
    select_rule_sets!(" WHERE version < ? ORDER BY version DESC LIMIT ?");

const SELECT_RULE_SET_IN_STATE: &str = select_rule_sets!(" WHERE state = ?");

/// 0 in an empty table, so the first version is 1.
const SELECT_NEWEST_VERSION: &str = "SELECT COALESCE(MAX(version), 0) FROM rule_sets";

/// Binds the new state (superseded), now, the old state (active) and the version being
/// activated, which keeps its own state.
const SUPERSEDE_ACTIVE: &str =
    "UPDATE rule_sets SET state = ?, updated_at_ms = ? WHERE state = ? AND version <> ?";

const INSERT_RULE_SET: &str = "INSERT INTO rule_sets (version, document, author, reason, \
     created_at_ms, activated_at_ms, state, rollout, schedule_from_ms, schedule_until_ms, \
     previous_version, verdict, updated_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)";

/// A `NULL` verdict or activation time keeps the row's own.
const MOVE_RULE_SET: &str = "UPDATE rule_sets SET state = ?, verdict = COALESCE(?, verdict), \
     activated_at_ms = COALESCE(?, activated_at_ms), updated_at_ms = ? WHERE version = ?";

const SELECT_INSTANCE_REPORTS: &str = "SELECT instance_id, applied_version, reported_at_ms, \
     report FROM rule_instances WHERE reported_at_ms > ? ORDER BY instance_id";

const DELETE_INSTANCE_REPORTS: &str = "DELETE FROM rule_instances WHERE reported_at_ms < ?";

/// Every [`super::RuleRepository`] operation on one store's pool.
#[derive(Debug)]
pub(crate) struct RuleTables<'pool, DB: Database> {
    pool: &'pool Pool<DB>,
}

impl<'pool, DB> RuleTables<'pool, DB>
where
    DB: RuleDialect,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Type<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'r> (i64,): FromRow<'r, DB::Row>,
    for<'r> (Vec<u8>,): FromRow<'r, DB::Row>,
    for<'r> RuleSetRecord: FromRow<'r, DB::Row>,
    for<'r> InstanceRecord: FromRow<'r, DB::Row>,
{
    pub(crate) fn new(pool: &'pool Pool<DB>) -> Self {
        Self { pool }
    }

    pub(crate) async fn insert_rule_set(
        &self,
        new: &NewRuleSet,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        let params = RuleSetParams::try_from(new)?;
        self.retrying("insert_rule_set", || self.insert_once(&params, now))
            .await
    }

    async fn insert_once(
        &self,
        params: &RuleSetParams<'_>,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        let now_ms = now.as_millis();
        let mut transaction = self.pool.begin_with(DB::BEGIN_WRITE).await?;
        let (newest,): (i64,) = sqlx::query_as(SELECT_NEWEST_VERSION)
            .fetch_one(&mut *transaction)
            .await?;
        // A negative version can only be a row planted past the CHECKs; count from 0 regardless.
        let version = newest
            .max(0)
            .checked_add(1)
            .ok_or_else(|| StoreError::ValueOutOfRange {
                key: String::from(NEW_RULE_SET_KEY),
                reason: format!("rule_sets.version {newest} is the column's maximum"),
            })?;
        let activated_at_ms = if params.state == RuleState::Active {
            supersede_active(&mut *transaction, version, now_ms).await?;
            Some(now_ms)
        } else {
            None
        };
        sqlx::query(INSERT_RULE_SET)
            .bind(version)
            .bind(params.document)
            .bind(params.author)
            .bind(params.reason)
            .bind(now_ms)
            .bind(activated_at_ms)
            .bind(params.state.as_str())
            .bind(params.rollout)
            .bind(params.schedule_from_ms)
            .bind(params.schedule_until_ms)
            .bind(params.previous_version)
            .bind(now_ms)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await?;
        Ok(version.unsigned_abs())
    }

    pub(crate) async fn rule_set(&self, version: u64) -> Result<Option<RuleSetRow>, StoreError> {
        // No row holds a version the column cannot.
        let Ok(stored_version) = i64::try_from(version) else {
            return Ok(None);
        };
        let record: Option<RuleSetRecord> = sqlx::query_as(SELECT_RULE_SET)
            .bind(stored_version)
            .fetch_optional(self.pool)
            .await?;
        record.map(RuleSetRecord::into_row).transpose()
    }

    pub(crate) async fn rule_sets(
        &self,
        limit: u32,
        before: Option<u64>,
    ) -> Result<Vec<RuleSetRow>, StoreError> {
        let page_size = i64::from(limit.min(MAX_RULE_SETS_PAGE));
        // Every stored version is below a `before` the column cannot hold.
        let stored_before = before.and_then(|bound| i64::try_from(bound).ok());
        let records: Vec<RuleSetRecord> = match stored_before {
            Some(bound) => {
                sqlx::query_as(SELECT_RULE_SETS_BEFORE)
                    .bind(bound)
                    .bind(page_size)
                    .fetch_all(self.pool)
                    .await?
            }
            None => {
                sqlx::query_as(SELECT_NEWEST_RULE_SETS)
                    .bind(page_size)
                    .fetch_all(self.pool)
                    .await?
            }
        };
        records.into_iter().map(RuleSetRecord::into_row).collect()
    }

    pub(crate) async fn active_rule_set(&self) -> Result<Option<RuleSetRow>, StoreError> {
        let record: Option<RuleSetRecord> = sqlx::query_as(SELECT_RULE_SET_IN_STATE)
            .bind(RuleState::Active.as_str())
            .fetch_optional(self.pool)
            .await?;
        record.map(RuleSetRecord::into_row).transpose()
    }

    pub(crate) async fn rule_sets_in(
        &self,
        states: &[RuleState],
    ) -> Result<Vec<RuleSetRow>, StoreError> {
        if states.is_empty() {
            return Ok(Vec::new());
        }
        let placeholders = vec!["?"; states.len()].join(", ");
        let statement = format!(
            concat!(
                select_rule_sets!(" WHERE state IN ("),
                "{}) ORDER BY version"
            ),
            placeholders
        );
        let mut query = sqlx::query_as(&statement);
        for state in states {
            query = query.bind(state.as_str());
        }
        let records: Vec<RuleSetRecord> = query.fetch_all(self.pool).await?;
        records.into_iter().map(RuleSetRecord::into_row).collect()
    }

    pub(crate) async fn transition_rule_set(
        &self,
        version: u64,
        from: &[RuleState],
        to: RuleState,
        verdict: Option<&str>,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let key = rule_set_key(version);
        let movement = Movement {
            version: to_column(&key, "rule_sets.version", version)?,
            from,
            to,
            verdict: verdict
                .map(|text| fit_bytes(&key, "rule_sets.verdict", text, MAX_VERDICT_BYTES))
                .transpose()?,
            now_ms: now.as_millis(),
        };
        if from.is_empty() {
            return Ok(false);
        }
        self.retrying("transition_rule_set", || self.transition_once(&movement))
            .await
    }

    async fn transition_once(&self, movement: &Movement<'_>) -> Result<bool, StoreError> {
        let mut transaction = self.pool.begin_with(DB::BEGIN_WRITE).await?;
        let current: Option<(Vec<u8>,)> = sqlx::query_as(DB::SELECT_STATE_FOR_UPDATE)
            .bind(movement.version)
            .fetch_optional(&mut *transaction)
            .await?;
        // Compared as stored: a state this build does not know is in no `from`.
        let moves = current.is_some_and(|(state,)| {
            movement
                .from
                .iter()
                .any(|expected| expected.as_str().as_bytes() == state)
        });
        if !moves {
            transaction.rollback().await?;
            return Ok(false);
        }
        let activated_at_ms = if movement.to == RuleState::Active {
            supersede_active(&mut *transaction, movement.version, movement.now_ms).await?;
            Some(movement.now_ms)
        } else {
            None
        };
        sqlx::query(MOVE_RULE_SET)
            .bind(movement.to.as_str())
            .bind(movement.verdict)
            .bind(activated_at_ms)
            .bind(movement.now_ms)
            .bind(movement.version)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await?;
        Ok(true)
    }

    pub(crate) async fn report_instance(&self, report: &InstanceReport) -> Result<(), StoreError> {
        let key = instance_key(&report.instance_id);
        if report.instance_id.is_empty() {
            return Err(StoreError::ValueOutOfRange {
                key,
                reason: String::from("rule_instances.instance_id is empty"),
            });
        }
        let instance_id = fit_chars(
            &key,
            "rule_instances.instance_id",
            &report.instance_id,
            MAX_INSTANCE_ID_CHARS,
        )?;
        let applied_version = to_column(
            &key,
            "rule_instances.applied_version",
            report.applied_version,
        )?;
        let body = fit_bytes(
            &key,
            "rule_instances.report",
            &report.report,
            MAX_REPORT_BYTES,
        )?;
        let reported_at_ms = report.reported_at.as_millis();
        // One statement, but InnoDB can still deadlock two upserts of a new key.
        self.retrying("report_instance", move || async move {
            sqlx::query(DB::UPSERT_INSTANCE)
                .bind(instance_id)
                .bind(applied_version)
                .bind(reported_at_ms)
                .bind(body)
                .execute(self.pool)
                .await?;
            Ok(())
        })
        .await
    }

    pub(crate) async fn instance_reports(
        &self,
        since: Timestamp,
    ) -> Result<Vec<InstanceReport>, StoreError> {
        let records: Vec<InstanceRecord> = sqlx::query_as(SELECT_INSTANCE_REPORTS)
            .bind(since.as_millis())
            .fetch_all(self.pool)
            .await?;
        records
            .into_iter()
            .map(InstanceRecord::into_report)
            .collect()
    }

    pub(crate) async fn forget_instances(&self, before: Timestamp) -> Result<u64, StoreError> {
        let done = sqlx::query(DELETE_INSTANCE_REPORTS)
            .bind(before.as_millis())
            .execute(self.pool)
            .await?;
        Ok(DB::rows_affected(&done))
    }

    /// Runs `attempt` (one whole transaction) again while it loses races, pausing a little
    /// longer each time.
    async fn retrying<T, Attempt, Outcome>(
        &self,
        operation: &'static str,
        mut attempt: Attempt,
    ) -> Result<T, StoreError>
    where
        Attempt: FnMut() -> Outcome,
        Outcome: Future<Output = Result<T, StoreError>>,
    {
        let mut lost_races = 0;
        loop {
            match attempt().await {
                Err(error) if lost_races < MAX_LOST_RACES && lost_race::<DB>(&error) => {
                    lost_races += 1;
                    tracing::debug!(
                        operation,
                        lost_races,
                        "rule write lost a race; running it again"
                    );
                    tokio::time::sleep(retry_pause(lost_races)).await;
                }
                outcome => return outcome,
            }
        }
    }
}

/// Every row active except `version` becomes superseded, inside the caller's transaction.
async fn supersede_active<'c, DB>(
    connection: &'c mut DB::Connection,
    version: i64,
    now_ms: i64,
) -> Result<(), StoreError>
where
    DB: Database,
    &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
{
    sqlx::query(SUPERSEDE_ACTIVE)
        .bind(RuleState::Superseded.as_str())
        .bind(now_ms)
        .bind(RuleState::Active.as_str())
        .bind(version)
        .execute(connection)
        .await?;
    Ok(())
}

fn lost_race<DB: RuleDialect>(error: &StoreError) -> bool {
    let StoreError::Database(source) = error else {
        return false;
    };
    source
        .downcast_ref::<sqlx::Error>()
        .is_some_and(DB::lost_race)
}

/// Random, up to `2^lost_races` ms and at most [`MAX_RETRY_PAUSE`].
fn retry_pause(lost_races: u32) -> Duration {
    let ceiling_ms = (1_u64 << lost_races.min(16)).min(MAX_RETRY_PAUSE.as_millis() as u64);
    Duration::from_millis(rand::random_range(1..=ceiling_ms))
}

/// The key of a rule set not yet inserted, in errors.
const NEW_RULE_SET_KEY: &str = "rule_set:new";

fn rule_set_key(version: impl std::fmt::Display) -> String {
    format!("rule_set:{version}")
}

/// An id that may be far too long is cut for the error message.
fn instance_key(instance_id: &str) -> String {
    format!("rule_instance:{}", truncate_chars(instance_id, 64))
}

fn fit_bytes<'a>(
    key: &str,
    column: &str,
    text: &'a str,
    max_bytes: usize,
) -> Result<&'a str, StoreError> {
    if text.len() <= max_bytes {
        return Ok(text);
    }
    Err(StoreError::ValueOutOfRange {
        key: key.to_owned(),
        reason: format!(
            "{column} is {} bytes long; at most {max_bytes} fit",
            text.len()
        ),
    })
}

fn fit_chars<'a>(
    key: &str,
    column: &str,
    text: &'a str,
    max_chars: usize,
) -> Result<&'a str, StoreError> {
    let chars = text.chars().count();
    if chars <= max_chars {
        return Ok(text);
    }
    Err(StoreError::ValueOutOfRange {
        key: key.to_owned(),
        reason: format!("{column} is {chars} characters long; at most {max_chars} fit"),
    })
}

/// A [`NewRuleSet`] as bound to SQL: every value already checked against its column.
struct RuleSetParams<'a> {
    document: &'a str,
    author: &'a str,
    reason: &'a str,
    state: RuleState,
    rollout: Option<&'a str>,
    schedule_from_ms: Option<i64>,
    schedule_until_ms: Option<i64>,
    previous_version: Option<i64>,
}

impl<'a> TryFrom<&'a NewRuleSet> for RuleSetParams<'a> {
    type Error = StoreError;

    fn try_from(new: &'a NewRuleSet) -> Result<Self, Self::Error> {
        let key = NEW_RULE_SET_KEY;
        let previous_version = match new.previous_version {
            Some(0) => {
                return Err(StoreError::ValueOutOfRange {
                    key: key.to_owned(),
                    reason: String::from(
                        "rule_sets.previous_version 0 is no version; they start at 1",
                    ),
                });
            }
            Some(previous) => Some(to_column(key, "rule_sets.previous_version", previous)?),
            None => None,
        };
        Ok(Self {
            document: fit_bytes(key, "rule_sets.document", &new.document, MAX_DOCUMENT_BYTES)?,
            author: fit_chars(key, "rule_sets.author", &new.author, MAX_AUTHOR_CHARS)?,
            reason: fit_chars(key, "rule_sets.reason", &new.reason, MAX_REASON_CHARS)?,
            state: new.state,
            rollout: new
                .rollout
                .as_deref()
                .map(|rollout| fit_bytes(key, "rule_sets.rollout", rollout, MAX_ROLLOUT_BYTES))
                .transpose()?,
            schedule_from_ms: new.schedule_from.map(Timestamp::as_millis),
            schedule_until_ms: new.schedule_until.map(Timestamp::as_millis),
            previous_version,
        })
    }
}

/// A checked [`super::RuleRepository::transition_rule_set`] call, run again as a whole when it
/// loses a race.
struct Movement<'a> {
    version: i64,
    from: &'a [RuleState],
    to: RuleState,
    verdict: Option<&'a str>,
    now_ms: i64,
}

/// A `rule_sets` row exactly as stored; [`RuleSetRecord::into_row`] is the only way out. The
/// state is bytes: MySQL declares it `ascii_bin`, which sqlx will not decode as a `String`.
#[derive(sqlx::FromRow)]
pub(crate) struct RuleSetRecord {
    version: i64,
    document: String,
    author: String,
    reason: String,
    created_at_ms: i64,
    activated_at_ms: Option<i64>,
    state: Vec<u8>,
    rollout: Option<String>,
    schedule_from_ms: Option<i64>,
    schedule_until_ms: Option<i64>,
    previous_version: Option<i64>,
    verdict: Option<String>,
    updated_at_ms: i64,
}

impl RuleSetRecord {
    fn into_row(self) -> Result<RuleSetRow, StoreError> {
        let corrupt = |reason: String| StoreError::CorruptRow {
            key: rule_set_key(self.version),
            reason,
        };
        let version = u64::try_from(self.version)
            .ok()
            .filter(|version| *version >= 1)
            .ok_or_else(|| corrupt(format!("rule_sets.version {} is below 1", self.version)))?;
        let state = std::str::from_utf8(&self.state)
            .ok()
            .and_then(|name| RuleState::parse(name).ok())
            .ok_or_else(|| {
                corrupt(format!(
                    "rule_sets.state is {:?}; expected one of {}",
                    String::from_utf8_lossy(&self.state),
                    RuleState::ALL.map(RuleState::as_str).join(", ")
                ))
            })?;
        let previous_version = self
            .previous_version
            .map(|previous| {
                u64::try_from(previous)
                    .ok()
                    .filter(|converted| *converted >= 1)
                    .ok_or_else(|| {
                        corrupt(format!("rule_sets.previous_version {previous} is below 1"))
                    })
            })
            .transpose()?;
        Ok(RuleSetRow {
            version,
            document: self.document,
            author: self.author,
            reason: self.reason,
            created_at: Timestamp::from_millis(self.created_at_ms),
            activated_at: self.activated_at_ms.map(Timestamp::from_millis),
            state,
            rollout: self.rollout,
            schedule_from: self.schedule_from_ms.map(Timestamp::from_millis),
            schedule_until: self.schedule_until_ms.map(Timestamp::from_millis),
            previous_version,
            verdict: self.verdict,
            updated_at: Timestamp::from_millis(self.updated_at_ms),
        })
    }
}

/// A `rule_instances` row exactly as stored. The id is bytes: MySQL compares it as
/// `utf8mb4_bin` (exact, ordered like SQLite), which sqlx will not decode as a `String`.
#[derive(sqlx::FromRow)]
pub(crate) struct InstanceRecord {
    instance_id: Vec<u8>,
    applied_version: i64,
    reported_at_ms: i64,
    report: String,
}

impl InstanceRecord {
    fn into_report(self) -> Result<InstanceReport, StoreError> {
        let instance_id =
            String::from_utf8(self.instance_id).map_err(|error| StoreError::CorruptRow {
                key: instance_key(&String::from_utf8_lossy(error.as_bytes())),
                reason: String::from("rule_instances.instance_id is not UTF-8"),
            })?;
        let applied_version =
            u64::try_from(self.applied_version).map_err(|_| StoreError::CorruptRow {
                key: instance_key(&instance_id),
                reason: format!(
                    "rule_instances.applied_version {} is negative",
                    self.applied_version
                ),
            })?;
        Ok(InstanceReport {
            instance_id,
            applied_version,
            reported_at: Timestamp::from_millis(self.reported_at_ms),
            report: self.report,
        })
    }
}
