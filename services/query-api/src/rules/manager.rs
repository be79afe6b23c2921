//! [`Rules`]: the versions in the store, the one this instance runs, and every change to them.
//!
//! Writes (a new version, promote, abort, rollback) go to the store first and are then
//! announced on the event bus. Every instance converges on its own in [`Rules::reconcile`]: it
//! carries out due schedule windows and canary verdicts (compare-and-set transitions, so any
//! instance may and one does), works out the version meant for it, applies it when it differs
//! from the one it runs, and reports its version and figures. It runs on every announcement and
//! every `rules.poll_interval_ms`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use rebate_cache::Clock;
use rebate_domain::Timestamp;
use rebate_store::{
    InstanceReport as StoredReport, NewRuleSet, RuleRepository, RuleSetRow, RuleState, StoreError,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{Mutex, Notify, watch};
use tokio_util::sync::CancellationToken;

use super::canary::{
    self, Baseline, CanaryFigures, Decision, InstanceReport, Rollout, RolloutRequest, Summary,
    Verdict,
};
use super::document::{self, Change, LiveSettings, RuleError};
use super::schedule::{self, Due, Window};
use super::window::{Figures, RequestWindow, Totals};
use crate::config::{RulesSettings, Settings};

/// Where a version's values go: the running service's guards, engine and caches (tests use a
/// fake).
pub trait ApplyTarget: Send + Sync + std::fmt::Debug + 'static {
    /// Puts `settings`' live values in force. Called with validated settings only, one call at
    /// a time.
    fn apply(&self, settings: &Settings);
    /// The running totals the canary's figures come from, and the shed level now.
    fn totals(&self) -> (Totals, u8);
}

/// Announces a change to the other instances (the event bus); errors are logged, the poll
/// heals a lost announcement.
#[async_trait::async_trait]
pub trait Announcer: Send + Sync + std::fmt::Debug + 'static {
    async fn announce(&self, version: u64);
}

/// The version this instance runs.
#[derive(Debug, Clone)]
pub struct Applied {
    /// 0: none (the file's values).
    pub version: u64,
    pub live: LiveSettings,
    pub applied_at: Timestamp,
}

/// Why an admin request about rules failed.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// 400: a field of the request is wrong.
    #[error(transparent)]
    Invalid(#[from] RuleError),
    /// 404.
    #[error("no rule set version {0}")]
    NotFound(u64),
    /// 409: the version is not in a state that allows it.
    #[error("{0}")]
    Conflict(String),
    /// 503: the store failed.
    #[error("the rule store is unavailable: {0}")]
    Store(#[from] StoreError),
}

/// `POST /admin/v1/rules`'s body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewRules {
    pub document: Value,
    pub author: String,
    pub reason: String,
    #[serde(default)]
    pub rollout: Option<RolloutRequest>,
    #[serde(default)]
    pub schedule: Option<Window>,
    /// Store it as `staged`: applied nowhere until an operator promotes it (a sale's rules,
    /// prepared and reviewed ahead).
    #[serde(default)]
    pub stage: bool,
}

/// What creating (or dry-running) a version answered.
#[derive(Debug, Clone, Serialize)]
pub struct Created {
    /// `None` on a dry run.
    pub version: Option<u64>,
    pub dry_run: bool,
    pub state: RuleState,
    /// The live keys it changes against the values in force now (the active version's).
    pub diff: Vec<Change>,
    /// The document as stored.
    pub document: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Window>,
}

/// One version as the admin API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct VersionView {
    pub version: u64,
    pub state: RuleState,
    pub document: Value,
    pub author: String,
    pub reason: String,
    pub created_at: Timestamp,
    pub activated_at: Option<Timestamp>,
    pub previous_version: Option<u64>,
    pub rollout: Option<Value>,
    pub schedule: Option<Window>,
    pub verdict: Option<Value>,
    /// The keys this document sets differently from the version before it (`null`: the file's
    /// value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<Vec<Change>>,
}

/// An instance as the admin API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct InstanceView {
    pub instance_id: String,
    pub applied_version: u64,
    pub reported_at: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryFigures>,
}

/// `GET /admin/v1/rules`.
#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    pub active: Option<VersionView>,
    pub canary: Option<VersionView>,
    pub scheduled: Vec<VersionView>,
    pub this_instance: InstanceView,
    /// Instances that reported within three poll intervals.
    pub instances: Vec<InstanceView>,
    /// The live values in force on this instance.
    pub effective: LiveSettings,
}

/// Counts of applies by outcome (`rebate_rules_applied_total{outcome}`).
#[derive(Debug, Default)]
pub struct ApplyCounters {
    pub applied: AtomicU64,
    /// The version's document no longer checks against this instance's file: kept the last.
    pub invalid: AtomicU64,
    /// The store could not be read.
    pub store_failed: AtomicU64,
}

/// Live rules of one instance.
#[derive(Debug)]
pub struct Rules {
    file: Arc<Settings>,
    config: RulesSettings,
    instance_id: String,
    repo: Arc<dyn RuleRepository>,
    clock: Arc<dyn Clock>,
    target: Arc<dyn ApplyTarget>,
    announcer: Option<Arc<dyn Announcer>>,
    window: Arc<RequestWindow>,
    current: ArcSwap<Applied>,
    /// One reconcile or write at a time on this instance.
    busy: Mutex<()>,
    wake: Notify,
    /// The last version refused by [`Rules::apply`], so it is logged and counted once.
    refused: AtomicU64,
    /// The hour this instance last dropped the reports of instances long gone.
    last_forget: std::sync::atomic::AtomicI64,
    pub counters: ApplyCounters,
}

/// How long an instance's report counts it as live: three polls.
const LIVE_POLLS: u64 = 3;
const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;
/// A canary is judged no sooner than this after it began: every instance has applied it.
const SETTLE_MS: i64 = 5_000;

impl Rules {
    pub fn new(
        file: Arc<Settings>,
        instance_id: String,
        repo: Arc<dyn RuleRepository>,
        clock: Arc<dyn Clock>,
        target: Arc<dyn ApplyTarget>,
        announcer: Option<Arc<dyn Announcer>>,
        window: Arc<RequestWindow>,
    ) -> Self {
        let now = clock.now();
        Self {
            config: file.rules.clone(),
            current: ArcSwap::from_pointee(Applied {
                version: 0,
                live: LiveSettings::of(&file),
                applied_at: now,
            }),
            file,
            instance_id,
            repo,
            clock,
            target,
            announcer,
            window,
            busy: Mutex::new(()),
            wake: Notify::new(),
            refused: AtomicU64::new(0),
            last_forget: std::sync::atomic::AtomicI64::new(i64::MIN),
            counters: ApplyCounters::default(),
        }
    }

    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The version in force here (0: the file's values).
    pub fn applied(&self) -> Arc<Applied> {
        self.current.load_full()
    }

    pub fn window(&self) -> &Arc<RequestWindow> {
        &self.window
    }

    fn live_span_ms(&self) -> i64 {
        i64::try_from(self.config.poll_interval_ms.saturating_mul(LIVE_POLLS)).unwrap_or(i64::MAX)
    }

    /// Checks and stores a new version (or, with `dry_run`, only checks it and says what it
    /// would change).
    pub async fn create(&self, request: NewRules, dry_run: bool) -> Result<Created, RulesError> {
        let checked = document::check(
            &self.file,
            &self.config.ceilings,
            &request.document,
            self.config.max_document_bytes,
        )?;
        let author = request.author.trim();
        if author.is_empty() || author.chars().count() > 128 {
            return Err(RuleError::new("author", "must be 1 to 128 characters").into());
        }
        let reason = request.reason.trim();
        if reason.is_empty() || reason.chars().count() > 1024 {
            return Err(RuleError::new("reason", "must be 1 to 1024 characters").into());
        }
        if request.stage && (request.rollout.is_some() || request.schedule.is_some()) {
            return Err(RuleError::new(
                "stage",
                "a staged version waits for a promote; it takes no rollout or schedule",
            )
            .into());
        }
        if request.rollout.is_some() && request.schedule.is_some() {
            return Err(RuleError::new(
                "rollout",
                "a scheduled rule set opens on the whole fleet at once; it takes no canary",
            )
            .into());
        }
        let _busy = self.busy.lock().await;
        let now = self.clock.now();
        let open = self
            .repo
            .rule_sets_in(&[RuleState::Active, RuleState::Canary, RuleState::Scheduled])
            .await?;
        let active = open.iter().find(|row| row.state == RuleState::Active);
        let in_force = match active {
            Some(row) => self
                .live_of(row)
                .unwrap_or_else(|_| LiveSettings::of(&self.file)),
            None => LiveSettings::of(&self.file),
        };
        let diff = document::diff(&in_force, &checked.live);
        let mut rollout = None;
        let state = if request.stage {
            RuleState::Staged
        } else if let Some(window) = &request.schedule {
            schedule::check(window, now, &open)?;
            RuleState::Scheduled
        } else if let Some(asked) = &request.rollout {
            if let Some(canary) = open.iter().find(|row| row.state == RuleState::Canary) {
                return Err(RulesError::Conflict(format!(
                    "version {} is in canary; promote or abort it first",
                    canary.version
                )));
            }
            rollout = Some(self.plan_rollout(asked, now).await?);
            RuleState::Canary
        } else {
            RuleState::Active
        };
        if dry_run {
            return Ok(Created {
                version: None,
                dry_run: true,
                state,
                diff,
                document: checked.document,
                rollout,
                schedule: request.schedule,
            });
        }
        let new = NewRuleSet {
            document: checked.document.to_string(),
            author: author.to_owned(),
            reason: reason.to_owned(),
            state,
            rollout: rollout
                .as_ref()
                .map(|rollout| serde_json::to_string(rollout).expect("plain data")),
            schedule_from: request.schedule.map(|window| window.from),
            schedule_until: request.schedule.map(|window| window.until),
            previous_version: active.map(|row| row.version),
        };
        let version = self.repo.insert_rule_set(&new, now).await?;
        let keys: Vec<&str> = diff.iter().map(|change| change.key.as_str()).collect();
        tracing::info!(version, state = %state, author, reason, keys = ?keys, "rule set created");
        drop(_busy);
        self.changed(version).await;
        Ok(Created {
            version: Some(version),
            dry_run: false,
            state,
            diff,
            document: checked.document,
            rollout,
            schedule: request.schedule,
        })
    }

    /// Chooses the canary instances among the live ones.
    async fn plan_rollout(
        &self,
        asked: &RolloutRequest,
        now: Timestamp,
    ) -> Result<Rollout, RulesError> {
        let observe_secs = asked
            .observe_secs
            .unwrap_or(self.config.canary.observe_secs);
        if !(1..=self.config.canary.max_observe_secs).contains(&observe_secs) {
            return Err(RuleError::new(
                "rollout.observe_secs",
                format!(
                    "{observe_secs} is outside 1..={} (rules.canary.max_observe_secs)",
                    self.config.canary.max_observe_secs
                ),
            )
            .into());
        }
        let live: Vec<String> = self
            .live_reports(now)
            .await?
            .into_iter()
            .map(|report| report.instance_id)
            .collect();
        let instances = match (&asked.instances, asked.canary) {
            (Some(_), Some(_)) => {
                return Err(
                    RuleError::new("rollout", "name instances or a count, not both").into(),
                );
            }
            (Some(named), None) => {
                if named.is_empty() || named.len() > 1000 {
                    return Err(RuleError::new(
                        "rollout.instances",
                        "must name 1 to 1000 instances",
                    )
                    .into());
                }
                if let Some(unknown) = named.iter().find(|id| !live.contains(id)) {
                    return Err(RuleError::new(
                        "rollout.instances",
                        format!("{unknown:?} is not a live instance (live: {live:?})"),
                    )
                    .into());
                }
                let mut named = named.clone();
                named.sort();
                named.dedup();
                named
            }
            (None, Some(count)) => {
                let count = count as usize;
                if count == 0 || count > live.len() {
                    return Err(RuleError::new(
                        "rollout.canary",
                        format!("{count} is outside 1..={} (the live instances)", live.len()),
                    )
                    .into());
                }
                let mut chosen = live.clone();
                // A random choice, so the same instance is not every canary.
                use rand::seq::SliceRandom;
                chosen.shuffle(&mut rand::rng());
                chosen.truncate(count);
                chosen.sort();
                chosen
            }
            (None, None) => {
                return Err(RuleError::new("rollout", "names neither canary nor instances").into());
            }
        };
        Ok(Rollout {
            instances,
            observe_secs,
            started_at_ms: now.as_millis(),
        })
    }

    /// An operator promotes a canary, or a staged version, to the whole fleet.
    pub async fn promote(&self, version: u64, by: &str) -> Result<VersionView, RulesError> {
        let row = self.row(version).await?;
        match row.state {
            RuleState::Canary => {
                let verdict = self.manual_verdict(&row, Decision::Promote, by).await?;
                self.transition(
                    version,
                    &[RuleState::Canary],
                    RuleState::Active,
                    Some(&verdict),
                )
                .await
            }
            RuleState::Staged => {
                // Checked again: the file may have changed since it was staged.
                self.live_of(&row)?;
                tracing::info!(version, by, "staged rule set promoted");
                self.transition(version, &[RuleState::Staged], RuleState::Active, None)
                    .await
            }
            state => Err(RulesError::Conflict(format!(
                "version {version} is {state}; only a canary or a staged version is promoted"
            ))),
        }
    }

    /// An operator aborts a canary or a scheduled version.
    pub async fn abort(&self, version: u64, by: &str) -> Result<VersionView, RulesError> {
        let row = self.row(version).await?;
        if !matches!(
            row.state,
            RuleState::Canary | RuleState::Scheduled | RuleState::Staged
        ) {
            return Err(RulesError::Conflict(format!(
                "version {version} is {}; only a canary, scheduled or staged version is aborted",
                row.state
            )));
        }
        let verdict = match row.state {
            RuleState::Canary => Some(self.manual_verdict(&row, Decision::RollBack, by).await?),
            _ => None,
        };
        self.transition(
            version,
            &[RuleState::Canary, RuleState::Scheduled, RuleState::Staged],
            RuleState::Aborted,
            verdict.as_ref(),
        )
        .await
    }

    /// Makes `version`'s document active again, as a new version (the history keeps every
    /// step); the version active until then is marked rolled back.
    pub async fn rollback(
        &self,
        version: u64,
        author: &str,
        reason: Option<&str>,
    ) -> Result<Created, RulesError> {
        let row = self.row(version).await?;
        let document: Value = serde_json::from_str(&row.document).map_err(|error| {
            RulesError::Conflict(format!(
                "version {version}'s document is unreadable: {error}"
            ))
        })?;
        let active = self.repo.active_rule_set().await?;
        if active
            .as_ref()
            .is_some_and(|active| active.version == version)
        {
            return Err(RulesError::Conflict(format!(
                "version {version} is already active"
            )));
        }
        let reason = match reason {
            Some(reason) if !reason.trim().is_empty() => {
                format!("rollback to version {version}: {reason}")
            }
            _ => format!("rollback to version {version}"),
        };
        let created = self
            .create(
                NewRules {
                    document,
                    author: author.to_owned(),
                    reason,
                    rollout: None,
                    schedule: None,
                    stage: false,
                },
                false,
            )
            .await?;
        if let Some(active) = active {
            self.repo
                .transition_rule_set(
                    active.version,
                    &[RuleState::Superseded],
                    RuleState::RolledBack,
                    None,
                    self.clock.now(),
                )
                .await?;
        }
        Ok(created)
    }

    async fn manual_verdict(
        &self,
        row: &RuleSetRow,
        decision: Decision,
        by: &str,
    ) -> Result<Verdict, RulesError> {
        let now = self.clock.now();
        let rollout = rollout_of(row);
        let mut verdict = match &rollout {
            Some(rollout) => self.assess(row.version, rollout, now).await?.0,
            None => empty_verdict(now),
        };
        verdict.decision = decision;
        verdict.by = by.to_owned();
        verdict.reasons = vec![format!("decided by an operator ({by})")];
        Ok(verdict)
    }

    async fn transition(
        &self,
        version: u64,
        from: &[RuleState],
        to: RuleState,
        verdict: Option<&Verdict>,
    ) -> Result<VersionView, RulesError> {
        let verdict_text =
            verdict.map(|verdict| serde_json::to_string(verdict).expect("plain data"));
        let moved = self
            .repo
            .transition_rule_set(version, from, to, verdict_text.as_deref(), self.clock.now())
            .await?;
        if !moved {
            let row = self.row(version).await?;
            return Err(RulesError::Conflict(format!(
                "version {version} is {} now",
                row.state
            )));
        }
        if let Some(verdict) = verdict {
            tracing::info!(version, to = %to, decision = ?verdict.decision, by = %verdict.by, reasons = ?verdict.reasons, "canary verdict");
        }
        self.changed(version).await;
        let row = self.row(version).await?;
        Ok(self.view(&row, None))
    }

    async fn row(&self, version: u64) -> Result<RuleSetRow, RulesError> {
        self.repo
            .rule_set(version)
            .await?
            .ok_or(RulesError::NotFound(version))
    }

    /// After a write: converge here at once, and tell the others. The announcement runs on
    /// its own: a broker that is away must not hold up the operator's answer (the others'
    /// polls see the change anyway).
    async fn changed(&self, version: u64) {
        self.announce(version);
        self.wake.notify_one();
    }

    fn announce(&self, version: u64) {
        if let Some(announcer) = &self.announcer {
            let announcer = Arc::clone(announcer);
            tokio::spawn(async move { announcer.announce(version).await });
        }
    }

    fn live_of(&self, row: &RuleSetRow) -> Result<LiveSettings, RuleError> {
        let document: Value = serde_json::from_str(&row.document)
            .map_err(|error| RuleError::new("document", error.to_string()))?;
        document::check(&self.file, &self.config.ceilings, &document, usize::MAX)
            .map(|checked| checked.live)
    }

    async fn live_reports(&self, now: Timestamp) -> Result<Vec<StoredReport>, StoreError> {
        let since = Timestamp::from_millis(now.as_millis().saturating_sub(self.live_span_ms()));
        self.repo.instance_reports(since).await
    }

    /// One round: due schedules and verdicts, then the version meant for this instance, then
    /// this instance's report. Errors of the store leave everything as it is until the next.
    pub async fn reconcile(&self) -> Result<(), StoreError> {
        let _busy = self.busy.lock().await;
        let result = self.reconcile_locked().await;
        if result.is_err() {
            self.counters.store_failed.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    async fn reconcile_locked(&self) -> Result<(), StoreError> {
        let now = self.clock.now();
        let mut rows = self.open_rows().await?;
        let mut moved = false;
        for due in schedule::due(&rows, now) {
            moved |= self.carry_out(due, now).await?;
        }
        if let Some(canary) = rows.iter().find(|row| row.state == RuleState::Canary)
            && let Some(rollout) = rollout_of(canary)
            && now.as_millis() >= rollout.started_at_ms.saturating_add(SETTLE_MS)
        {
            moved |= self.judge(canary.version, &rollout, now).await?;
        }
        if moved {
            rows = self.open_rows().await?;
        }
        let canary = rows
            .iter()
            .find(|row| row.state == RuleState::Canary)
            .and_then(|row| rollout_of(row).map(|rollout| (row, rollout)));
        let meant = match &canary {
            Some((row, rollout)) if rollout.includes(&self.instance_id) => Some(*row),
            _ => rows.iter().find(|row| row.state == RuleState::Active),
        };
        self.apply(meant, now);
        let report = InstanceReport {
            applied_version: self.current.load().version,
            applied_at_ms: self.current.load().applied_at.as_millis(),
            canary: canary.map(|(row, rollout)| self.canary_figures(row.version, &rollout, now)),
        };
        self.repo
            .report_instance(&StoredReport {
                instance_id: self.instance_id.clone(),
                applied_version: report.applied_version,
                reported_at: now,
                report: serde_json::to_string(&report).expect("plain data"),
            })
            .await?;
        // Every restart reports under a new id: the rows of instances gone a day are dropped,
        // by whichever instance polls at the turn of the hour (often enough, rarely).
        if self
            .last_forget
            .swap(now.as_millis() / HOUR_MS, Ordering::Relaxed)
            != now.as_millis() / HOUR_MS
        {
            let before = Timestamp::from_millis(now.as_millis().saturating_sub(DAY_MS));
            self.repo.forget_instances(before).await?;
        }
        Ok(())
    }

    async fn open_rows(&self) -> Result<Vec<RuleSetRow>, StoreError> {
        self.repo
            .rule_sets_in(&[RuleState::Active, RuleState::Canary, RuleState::Scheduled])
            .await
    }

    /// Puts `row`'s values (none: the file's) in force when they are not already.
    fn apply(&self, row: Option<&RuleSetRow>, now: Timestamp) {
        let version = row.map_or(0, |row| row.version);
        let current = self.current.load();
        if current.version == version {
            return;
        }
        let live = match row {
            Some(row) => match self.live_of(row) {
                Ok(live) => live,
                Err(error) => {
                    // Checked when created; a file changed since may refuse it. Keep what runs,
                    // and say so once per version.
                    if self.refused.swap(version, Ordering::Relaxed) != version {
                        self.counters.invalid.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(version, %error, "rule set does not check against this instance's configuration; keeping version {}", current.version);
                    }
                    return;
                }
            },
            None => LiveSettings::of(&self.file),
        };
        let mut settings = (*self.file).clone();
        live.apply_to(&mut settings);
        self.target.apply(&settings);
        let keys: Vec<String> = document::diff(&current.live, &live)
            .into_iter()
            .map(|change| change.key)
            .collect();
        tracing::info!(version, from = current.version, keys = ?keys, "rule set applied");
        self.current.store(Arc::new(Applied {
            version,
            live,
            applied_at: now,
        }));
        self.counters.applied.fetch_add(1, Ordering::Relaxed);
    }

    async fn carry_out(&self, due: Due, now: Timestamp) -> Result<bool, StoreError> {
        let moved = match due {
            Due::Open(version) => {
                self.repo
                    .transition_rule_set(
                        version,
                        &[RuleState::Scheduled],
                        RuleState::Active,
                        None,
                        now,
                    )
                    .await?
            }
            Due::Expire(version) => {
                self.repo
                    .transition_rule_set(
                        version,
                        &[RuleState::Scheduled],
                        RuleState::Expired,
                        None,
                        now,
                    )
                    .await?
            }
            Due::Close { version, opened_at } => {
                match self.active_before(version, opened_at).await? {
                    Some(previous) => {
                        let reopened = self
                            .repo
                            .transition_rule_set(
                                previous,
                                &[RuleState::Superseded],
                                RuleState::Active,
                                None,
                                now,
                            )
                            .await?;
                        // The window's version is superseded by that; say it expired instead.
                        let closed = self
                            .repo
                            .transition_rule_set(
                                version,
                                &[RuleState::Superseded, RuleState::Active],
                                RuleState::Expired,
                                None,
                                now,
                            )
                            .await?;
                        reopened || closed
                    }
                    None => {
                        self.repo
                            .transition_rule_set(
                                version,
                                &[RuleState::Active],
                                RuleState::Expired,
                                None,
                                now,
                            )
                            .await?
                    }
                }
            }
        };
        if moved {
            tracing::info!(?due, "rule set schedule carried out");
            self.announce(match due {
                Due::Open(version) | Due::Expire(version) | Due::Close { version, .. } => version,
            });
        }
        Ok(moved)
    }

    /// The version a window's opening at `opened_at` superseded: the last one activated before
    /// it (among the recent history), if it is still only superseded.
    async fn active_before(
        &self,
        window: u64,
        opened_at: Option<Timestamp>,
    ) -> Result<Option<u64>, StoreError> {
        let Some(opened_at) = opened_at else {
            return Ok(None);
        };
        let rows = self.repo.rule_sets(200, None).await?;
        Ok(rows
            .iter()
            .filter(|row| row.version != window)
            .filter_map(|row| row.activated_at.map(|at| (at, row)))
            .filter(|(at, _)| *at <= opened_at)
            .max_by_key(|(at, row)| (*at, row.version))
            .filter(|(_, row)| row.state == RuleState::Superseded)
            .map(|(_, row)| row.version))
    }

    /// This instance's figures for a canary under way.
    fn canary_figures(&self, version: u64, rollout: &Rollout, now: Timestamp) -> CanaryFigures {
        let start = u64::try_from(rollout.started_at_ms / 1000).unwrap_or(0);
        let end = u64::try_from(now.as_millis() / 1000)
            .unwrap_or(0)
            .max(start);
        let span = end - start;
        CanaryFigures {
            version,
            // The first seconds are the switch itself; they count for the canary.
            during: self.window.figures(start, end),
            before: self
                .window
                .figures(start.saturating_sub(span.max(1)), start),
        }
    }

    /// The figures of both sides of a canary, from the instances' reports.
    async fn assess(
        &self,
        version: u64,
        rollout: &Rollout,
        now: Timestamp,
    ) -> Result<(Verdict, bool), StoreError> {
        let reports = self.live_reports(now).await?;
        let mut canary_side = Figures::default();
        let mut reference_side = Figures::default();
        let mut canary_instances = Vec::new();
        let mut reference_instances = Vec::new();
        let mut before_side = Figures::default();
        let mut missing = Vec::new();
        for stored in &reports {
            let Ok(report) = serde_json::from_str::<InstanceReport>(&stored.report) else {
                continue;
            };
            let Some(figures) = report.canary.filter(|figures| figures.version == version) else {
                if rollout.includes(&stored.instance_id) {
                    missing.push(stored.instance_id.clone());
                }
                continue;
            };
            if rollout.includes(&stored.instance_id) {
                if stored.applied_version != version {
                    missing.push(stored.instance_id.clone());
                }
                canary_side.add(&figures.during);
                before_side.add(&figures.before);
                canary_instances.push(stored.instance_id.clone());
            } else {
                reference_side.add(&figures.during);
                reference_instances.push(stored.instance_id.clone());
            }
        }
        let (baseline, reference, reference_count) = if reference_instances.is_empty() {
            (Baseline::Before, before_side, canary_instances.len())
        } else {
            (Baseline::Fleet, reference_side, reference_instances.len())
        };
        let window_over = now.as_millis() >= rollout.ends_at_ms();
        let canary_summary = Summary::of(&canary_side, canary_instances.len());
        let reference_summary = Summary::of(&reference, reference_count);
        let (mut decision, mut reasons) = canary::judge(
            &canary_summary,
            &reference_summary,
            &self.config.canary,
            window_over,
        );
        if window_over && (!missing.is_empty() || canary_instances.is_empty()) {
            decision = Decision::RollBack;
            reasons.push(format!(
                "canary instances did not report running version {version}: {missing:?}"
            ));
        }
        Ok((
            Verdict {
                decision,
                by: "auto".to_owned(),
                reasons,
                baseline,
                canary_instances,
                baseline_instances: if baseline == Baseline::Fleet {
                    reference_instances
                } else {
                    Vec::new()
                },
                canary: canary_summary,
                reference: reference_summary,
                decided_at_ms: now.as_millis(),
            },
            window_over,
        ))
    }

    /// Decides a canary when its figures say so; true when its state moved.
    async fn judge(
        &self,
        version: u64,
        rollout: &Rollout,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let (verdict, _) = self.assess(version, rollout, now).await?;
        let to = match verdict.decision {
            Decision::Wait => return Ok(false),
            Decision::Promote => RuleState::Active,
            Decision::RollBack => RuleState::RolledBack,
        };
        let text = serde_json::to_string(&verdict).expect("plain data");
        let moved = self
            .repo
            .transition_rule_set(version, &[RuleState::Canary], to, Some(&text), now)
            .await?;
        if moved {
            tracing::warn!(version, decision = ?verdict.decision, reasons = ?verdict.reasons, canary = ?verdict.canary, reference = ?verdict.reference, "canary verdict");
            self.announce(version);
        }
        Ok(moved)
    }

    /// Runs [`Rules::reconcile`] every poll interval, on every announcement and after every
    /// write here, and samples the request window every second, until `shutdown`.
    pub async fn run(
        self: Arc<Self>,
        mut announcements: Option<watch::Receiver<u64>>,
        shutdown: CancellationToken,
    ) {
        let mut poll = tokio::time::interval(self.config.poll_interval());
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sample = tokio::time::interval(Duration::from_secs(1));
        sample.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            let announced = async {
                match announcements.as_mut() {
                    Some(receiver) => receiver.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = sample.tick() => {
                    self.sample();
                    continue;
                }
                _ = poll.tick() => {}
                open = announced => {
                    if !open {
                        announcements = None;
                    }
                }
                () = self.wake.notified() => {}
            }
            if let Err(error) = self.reconcile().await {
                tracing::warn!(%error, "rule sets could not be read; keeping version {}", self.current.load().version);
            }
        }
    }

    /// Closes this second of the request window.
    pub fn sample(&self) {
        let (totals, level) = self.target.totals();
        let second = u64::try_from(self.clock.now().as_millis() / 1000).unwrap_or(0);
        self.window.sample(second, totals, level);
    }

    /// `GET /admin/v1/rules`.
    pub async fn overview(&self) -> Result<Overview, RulesError> {
        let now = self.clock.now();
        let rows = self.open_rows().await?;
        let view = |state: RuleState| rows.iter().filter(move |row| row.state == state);
        let instances = self
            .live_reports(now)
            .await?
            .into_iter()
            .map(|stored| {
                let canary = serde_json::from_str::<InstanceReport>(&stored.report)
                    .ok()
                    .and_then(|report| report.canary);
                InstanceView {
                    instance_id: stored.instance_id,
                    applied_version: stored.applied_version,
                    reported_at: stored.reported_at,
                    canary,
                }
            })
            .collect();
        let applied = self.current.load();
        Ok(Overview {
            active: view(RuleState::Active)
                .next()
                .map(|row| self.view(row, None)),
            canary: view(RuleState::Canary)
                .next()
                .map(|row| self.view(row, None)),
            scheduled: view(RuleState::Scheduled)
                .map(|row| self.view(row, None))
                .collect(),
            this_instance: InstanceView {
                instance_id: self.instance_id.clone(),
                applied_version: applied.version,
                reported_at: applied.applied_at,
                canary: None,
            },
            instances,
            effective: applied.live.clone(),
        })
    }

    /// `GET /admin/v1/rules/history`: newest first, each with its diff against the version
    /// before it.
    pub async fn history(
        &self,
        limit: u32,
        before: Option<u64>,
    ) -> Result<Vec<VersionView>, RulesError> {
        let limit = limit.clamp(1, 200);
        // One more row, for the oldest one's diff.
        let rows = self.repo.rule_sets(limit + 1, before).await?;
        Ok(rows
            .iter()
            .take(limit as usize)
            .enumerate()
            .map(|(index, row)| self.view(row, Some(rows.get(index + 1))))
            .collect())
    }

    /// `GET /admin/v1/rules/{version}`, with its diff against the version before it.
    pub async fn version(&self, version: u64) -> Result<VersionView, RulesError> {
        let row = self.row(version).await?;
        let earlier = match version {
            1 => None,
            _ => self.repo.rule_set(version - 1).await?,
        };
        Ok(self.view(&row, Some(earlier.as_ref())))
    }

    fn view(&self, row: &RuleSetRow, earlier: Option<Option<&RuleSetRow>>) -> VersionView {
        let document: Value = serde_json::from_str(&row.document).unwrap_or(Value::Null);
        let diff = earlier.map(|earlier| {
            let before = earlier
                .and_then(|row| serde_json::from_str::<Value>(&row.document).ok())
                .unwrap_or(Value::Null);
            document::document_diff(&before, &document)
        });
        VersionView {
            version: row.version,
            state: row.state,
            document,
            author: row.author.clone(),
            reason: row.reason.clone(),
            created_at: row.created_at,
            activated_at: row.activated_at,
            previous_version: row.previous_version,
            rollout: row
                .rollout
                .as_deref()
                .and_then(|text| serde_json::from_str(text).ok()),
            schedule: Window::of(row),
            verdict: row
                .verdict
                .as_deref()
                .and_then(|text| serde_json::from_str(text).ok()),
            diff,
        }
    }
}

fn rollout_of(row: &RuleSetRow) -> Option<Rollout> {
    row.rollout
        .as_deref()
        .and_then(|text| serde_json::from_str(text).ok())
}

fn empty_verdict(now: Timestamp) -> Verdict {
    let empty = Summary::of(&Figures::default(), 1);
    Verdict {
        decision: Decision::Wait,
        by: String::new(),
        reasons: Vec::new(),
        baseline: Baseline::Before,
        canary_instances: Vec::new(),
        baseline_instances: Vec::new(),
        canary: empty.clone(),
        reference: empty,
        decided_at_ms: now.as_millis(),
    }
}
