//! The manager against a real (in-memory SQLite) store, a manual clock and fake targets: what
//! each instance applies, canary verdicts, schedules, rollbacks and restarts.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rebate_cache::ManualClock;
use rebate_domain::Timestamp;
use rebate_store::{RuleRepository, RuleState, SqliteStore};
use serde_json::{Value, json};

use super::canary::{Decision, RolloutRequest};
use super::manager::{ApplyTarget, NewRules, Rules, RulesError};
use super::schedule::Window;
use super::window::{RequestWindow, Totals};
use crate::Settings;

/// What a fake instance was told to apply, and the figures it reports.
#[derive(Debug, Default)]
struct FakeTarget {
    applied: Mutex<Vec<Option<f64>>>,
    answered: AtomicU64,
    complete: AtomicU64,
    trips: AtomicU64,
    level: AtomicU8,
}

impl ApplyTarget for FakeTarget {
    fn apply(&self, settings: &Settings) {
        self.applied
            .lock()
            .unwrap()
            .push(settings.resilience.coupons.quota_per_sec);
    }

    fn totals(&self) -> (Totals, u8) {
        (
            Totals {
                answers: crate::rules::window::AnswerTotals {
                    complete: self.complete.load(Ordering::Relaxed),
                    degraded: self.answered.load(Ordering::Relaxed)
                        - self.complete.load(Ordering::Relaxed),
                    ..Default::default()
                },
                trips: self.trips.load(Ordering::Relaxed),
            },
            self.level.load(Ordering::Relaxed),
        )
    }
}

impl FakeTarget {
    fn quotas(&self) -> Vec<Option<f64>> {
        self.applied.lock().unwrap().clone()
    }

    /// A second of traffic: `answered` items, `complete` of them whole, each request 2 ms.
    fn serve(&self, window: &RequestWindow, answered: u64, complete: u64) {
        self.answered.fetch_add(answered, Ordering::Relaxed);
        self.complete.fetch_add(complete, Ordering::Relaxed);
        for _ in 0..answered {
            window.record(Duration::from_millis(2));
        }
    }
}

struct Instance {
    rules: Arc<Rules>,
    target: Arc<FakeTarget>,
}

fn settings() -> Arc<Settings> {
    Arc::new(Settings::defaults().expect("embedded defaults"))
}

fn instance(id: &str, store: &Arc<SqliteStore>, clock: &ManualClock) -> Instance {
    let target = Arc::new(FakeTarget::default());
    let rules = Arc::new(Rules::new(
        settings(),
        id.to_owned(),
        Arc::clone(store) as Arc<dyn RuleRepository>,
        Arc::new(clock.clone()),
        Arc::clone(&target) as Arc<dyn ApplyTarget>,
        None,
        Arc::new(RequestWindow::new(600)),
    ));
    Instance { rules, target }
}

fn quota(per_sec: f64) -> Value {
    json!({"resilience": {"coupons": {"quota_per_sec": per_sec}}})
}

fn request(document: Value) -> NewRules {
    NewRules {
        document,
        author: "ops".to_owned(),
        reason: "contract change".to_owned(),
        rollout: None,
        schedule: None,
        stage: false,
    }
}

async fn store() -> Arc<SqliteStore> {
    Arc::new(SqliteStore::in_memory().await.expect("in-memory store"))
}

fn clock() -> ManualClock {
    ManualClock::new(Timestamp::parse_rfc3339("2026-12-12T19:00:00Z").unwrap())
}

#[tokio::test]
async fn a_new_version_is_applied_once_by_every_instance_and_a_dry_run_changes_nothing() {
    let (store, clock) = (store().await, clock());
    let (one, two) = (
        instance("one", &store, &clock),
        instance("two", &store, &clock),
    );
    one.rules.reconcile().await.unwrap();
    assert!(
        one.target.quotas().is_empty(),
        "the file's values are in force from the start"
    );

    let dry = one.rules.create(request(quota(10.0)), true).await.unwrap();
    assert!(dry.dry_run && dry.version.is_none());
    assert_eq!(dry.diff[0].key, "resilience.coupons.quota_per_sec");
    assert_eq!(
        (dry.diff[0].from.clone(), dry.diff[0].to.clone()),
        (json!(45.0), json!(10.0))
    );
    assert!(store.rule_sets(10, None).await.unwrap().is_empty());

    let created = one.rules.create(request(quota(10.0)), false).await.unwrap();
    assert_eq!(created.version, Some(1));
    assert_eq!(created.state, RuleState::Active);
    for _ in 0..3 {
        one.rules.reconcile().await.unwrap();
        two.rules.reconcile().await.unwrap();
    }
    assert_eq!(one.target.quotas(), [Some(10.0)]);
    assert_eq!(two.target.quotas(), [Some(10.0)]);
    assert_eq!(two.rules.applied().version, 1);

    // Back to the file's value: a version of nulls.
    one.rules
        .create(
            request(json!({"resilience": {"coupons": {"quota_per_sec": null}}})),
            false,
        )
        .await
        .unwrap();
    two.rules.reconcile().await.unwrap();
    assert_eq!(two.target.quotas(), [Some(10.0), Some(45.0)]);
    let overview = one.rules.overview().await.unwrap();
    assert_eq!(overview.active.unwrap().version, 2);
    let history = one.rules.history(10, None).await.unwrap();
    assert_eq!(history[0].state, RuleState::Active);
    assert_eq!(history[1].state, RuleState::Superseded);
    let diff = history[0].diff.as_ref().unwrap();
    assert_eq!(diff[0].key, "resilience.coupons.quota_per_sec");
    assert_eq!(
        (diff[0].from.clone(), diff[0].to.clone()),
        (json!(10.0), Value::Null)
    );
}

#[tokio::test]
async fn a_restarted_instance_starts_with_the_active_version() {
    let (store, clock) = (store().await, clock());
    let first = instance("one", &store, &clock);
    first
        .rules
        .create(request(quota(12.0)), false)
        .await
        .unwrap();
    let restarted = instance("one", &store, &clock);
    restarted.rules.reconcile().await.unwrap();
    assert_eq!(restarted.rules.applied().version, 1);
    assert_eq!(restarted.target.quotas(), [Some(12.0)]);
}

/// Three instances report; a canary goes to one of them.
async fn fleet_with_canary(
    store: &Arc<SqliteStore>,
    clock: &ManualClock,
    document: Value,
) -> (Vec<Instance>, u64) {
    let fleet: Vec<Instance> = ["a", "b", "c"]
        .into_iter()
        .map(|id| instance(id, store, clock))
        .collect();
    for member in &fleet {
        member.rules.reconcile().await.unwrap();
    }
    let mut asked = request(document);
    asked.rollout = Some(RolloutRequest {
        instances: Some(vec!["b".to_owned()]),
        observe_secs: Some(60),
        canary: None,
    });
    let created = fleet[0].rules.create(asked, false).await.unwrap();
    assert_eq!(created.state, RuleState::Canary);
    (fleet, created.version.unwrap())
}

/// `seconds` of traffic on every instance, `canary_complete` of 100 answers whole on the canary
/// (`b`) and all 100 on the others, each instance sampling and reconciling every second.
async fn traffic(fleet: &[Instance], clock: &ManualClock, seconds: u32, canary_complete: u64) {
    for _ in 0..seconds {
        for member in fleet {
            let complete = if member.rules.instance_id() == "b" {
                canary_complete
            } else {
                100
            };
            member.target.serve(member.rules.window(), 100, complete);
        }
        clock.advance(Duration::from_secs(1));
        for member in fleet {
            member.rules.sample();
            member.rules.reconcile().await.unwrap();
        }
    }
}

#[tokio::test]
async fn a_good_canary_runs_on_its_instance_only_and_is_promoted_after_its_window() {
    let (store, clock) = (store().await, clock());
    let (fleet, version) = fleet_with_canary(&store, &clock, quota(30.0)).await;
    traffic(&fleet, &clock, 30, 100).await;
    assert_eq!(fleet[1].target.quotas(), [Some(30.0)], "the canary runs it");
    assert!(fleet[0].target.quotas().is_empty() && fleet[2].target.quotas().is_empty());
    assert_eq!(
        store.rule_set(version).await.unwrap().unwrap().state,
        RuleState::Canary
    );

    traffic(&fleet, &clock, 32, 100).await;
    let row = store.rule_set(version).await.unwrap().unwrap();
    assert_eq!(row.state, RuleState::Active);
    let verdict: Value = serde_json::from_str(row.verdict.as_deref().unwrap()).unwrap();
    assert_eq!(verdict["decision"], "promote");
    assert_eq!(verdict["baseline"], "fleet");
    assert_eq!(verdict["canary_instances"], json!(["b"]));
    for member in &fleet {
        assert_eq!(member.rules.applied().version, version);
    }
}

#[tokio::test]
async fn a_bad_canary_is_rolled_back_within_its_window_and_the_others_never_apply_it() {
    let (store, clock) = (store().await, clock());
    let (fleet, version) = fleet_with_canary(&store, &clock, quota(30.0)).await;
    // The canary answers 70 % of items whole where the others answer all.
    traffic(&fleet, &clock, 20, 70).await;
    let row = store.rule_set(version).await.unwrap().unwrap();
    assert_eq!(row.state, RuleState::RolledBack);
    let verdict: Value = serde_json::from_str(row.verdict.as_deref().unwrap()).unwrap();
    assert_eq!(verdict["decision"], "roll_back");
    assert!(
        verdict["reasons"][0]
            .as_str()
            .unwrap()
            .contains("business success ratio")
    );
    assert!(verdict["canary"]["success_ratio"].as_f64().unwrap() < 0.75);
    assert_eq!(verdict["reference"]["success_ratio"].as_f64(), Some(1.0));
    assert!(verdict["decided_at_ms"].as_i64().unwrap() < row.created_at.as_millis() + 60_000);
    // The canary went back to the file's values; the others never left them.
    assert_eq!(fleet[1].target.quotas(), [Some(30.0), Some(45.0)]);
    assert!(fleet[0].target.quotas().is_empty() && fleet[2].target.quotas().is_empty());
}

#[tokio::test]
async fn an_operator_promotes_or_aborts_a_canary_by_hand() {
    let (store, clock) = (store().await, clock());
    let (fleet, version) = fleet_with_canary(&store, &clock, quota(30.0)).await;
    let conflict = fleet[0].rules.create(
        NewRules {
            rollout: Some(RolloutRequest {
                canary: Some(1),
                ..RolloutRequest::default()
            }),
            ..request(quota(20.0))
        },
        false,
    );
    assert!(matches!(conflict.await, Err(RulesError::Conflict(_))));
    let aborted = fleet[2].rules.abort(version, "alice").await.unwrap();
    assert_eq!(aborted.state, RuleState::Aborted);
    assert_eq!(aborted.verdict.unwrap()["by"], "alice");
    assert!(matches!(
        fleet[2].rules.promote(version, "alice").await,
        Err(RulesError::Conflict(_))
    ));

    let mut asked = request(quota(25.0));
    asked.rollout = Some(RolloutRequest {
        canary: Some(2),
        ..RolloutRequest::default()
    });
    let second = fleet[0].rules.create(asked, false).await.unwrap();
    assert_eq!(second.rollout.unwrap().instances.len(), 2);
    let promoted = fleet[0]
        .rules
        .promote(second.version.unwrap(), "bob")
        .await
        .unwrap();
    assert_eq!(promoted.state, RuleState::Active);
    for member in &fleet {
        member.rules.reconcile().await.unwrap();
        assert_eq!(member.rules.applied().version, second.version.unwrap());
    }
}

#[tokio::test]
async fn a_sale_s_window_opens_and_closes_on_the_clock_and_overlaps_are_refused() {
    let (store, clock) = (store().await, clock());
    let one = instance("one", &store, &clock);
    one.rules.create(request(quota(40.0)), false).await.unwrap();
    let at = |text: &str| Timestamp::parse_rfc3339(text).unwrap();
    let mut sale = request(quota(20.0));
    sale.schedule = Some(Window {
        from: at("2026-12-12T19:55:00Z"),
        until: at("2026-12-12T23:30:00Z"),
    });
    let scheduled = one.rules.create(sale.clone(), false).await.unwrap();
    assert_eq!(scheduled.state, RuleState::Scheduled);
    let mut overlapping = sale.clone();
    overlapping.schedule = Some(Window {
        from: at("2026-12-12T23:00:00Z"),
        until: at("2026-12-13T01:00:00Z"),
    });
    match one.rules.create(overlapping, false).await {
        Err(RulesError::Invalid(error)) => assert_eq!(error.field, "schedule"),
        other => panic!("{other:?}"),
    }

    one.rules.reconcile().await.unwrap();
    assert_eq!(one.target.quotas(), [Some(40.0)]);
    clock.advance(Duration::from_secs(55 * 60));
    one.rules.reconcile().await.unwrap();
    assert_eq!(one.rules.applied().version, 2, "the window opened at 19:55");
    assert_eq!(one.target.quotas(), [Some(40.0), Some(20.0)]);
    clock.advance(Duration::from_secs(3 * 3600 + 35 * 60));
    one.rules.reconcile().await.unwrap();
    assert_eq!(one.rules.applied().version, 1, "the window closed at 23:30");
    assert_eq!(one.target.quotas(), [Some(40.0), Some(20.0), Some(40.0)]);
    assert_eq!(
        store.rule_set(2).await.unwrap().unwrap().state,
        RuleState::Expired
    );
    assert_eq!(
        store.rule_set(1).await.unwrap().unwrap().state,
        RuleState::Active
    );
}

/// The version that comes back when a window closes is the one its opening replaced, not the
/// one active when the window was booked.
#[tokio::test]
async fn a_closing_window_brings_back_what_its_opening_replaced() {
    let (store, clock) = (store().await, clock());
    let one = instance("one", &store, &clock);
    one.rules.create(request(quota(40.0)), false).await.unwrap();
    let at = |text: &str| Timestamp::parse_rfc3339(text).unwrap();
    let mut sale = request(quota(20.0));
    sale.schedule = Some(Window {
        from: at("2026-12-12T19:55:00Z"),
        until: at("2026-12-12T23:30:00Z"),
    });
    one.rules.create(sale, false).await.unwrap();
    // Booked at 19:00 over version 1; version 3 becomes active before the window opens.
    clock.advance(Duration::from_secs(10 * 60));
    one.rules.create(request(quota(35.0)), false).await.unwrap();
    clock.advance(Duration::from_secs(45 * 60));
    one.rules.reconcile().await.unwrap();
    assert_eq!(one.rules.applied().version, 2);
    clock.advance(Duration::from_secs(4 * 3600));
    one.rules.reconcile().await.unwrap();
    assert_eq!(one.rules.applied().version, 3, "what the opening replaced");
    assert_eq!(one.target.quotas(), [Some(20.0), Some(35.0)]);
    assert_eq!(
        store.rule_set(1).await.unwrap().unwrap().state,
        RuleState::Superseded
    );
}

#[tokio::test]
async fn a_rollback_makes_an_earlier_document_active_as_a_new_version() {
    let (store, clock) = (store().await, clock());
    let one = instance("one", &store, &clock);
    one.rules.create(request(quota(40.0)), false).await.unwrap();
    one.rules.create(request(quota(10.0)), false).await.unwrap();
    let back = one
        .rules
        .rollback(1, "carol", Some("10/s hurt"))
        .await
        .unwrap();
    assert_eq!(back.version, Some(3));
    let row = store.rule_set(3).await.unwrap().unwrap();
    assert_eq!(row.reason, "rollback to version 1: 10/s hurt");
    assert_eq!(
        store.rule_set(2).await.unwrap().unwrap().state,
        RuleState::RolledBack
    );
    one.rules.reconcile().await.unwrap();
    assert_eq!(one.target.quotas(), [Some(40.0)]);
    assert!(matches!(
        one.rules.rollback(3, "carol", None).await,
        Err(RulesError::Conflict(_))
    ));
    assert!(matches!(
        one.rules.rollback(9, "carol", None).await,
        Err(RulesError::NotFound(9))
    ));
}

#[tokio::test]
async fn a_version_this_instance_s_file_refuses_is_counted_and_the_last_one_kept() {
    let (store, clock) = (store().await, clock());
    let one = instance("one", &store, &clock);
    one.rules.create(request(quota(40.0)), false).await.unwrap();
    one.rules.reconcile().await.unwrap();
    // Written by an instance whose file allowed more (or by hand): above this file's ceiling.
    store
        .insert_rule_set(
            &rebate_store::NewRuleSet {
                document: quota(90.0).to_string(),
                author: "ops".to_owned(),
                reason: "elsewhere".to_owned(),
                state: RuleState::Active,
                rollout: None,
                schedule_from: None,
                schedule_until: None,
                previous_version: Some(1),
            },
            Timestamp::from_millis(0),
        )
        .await
        .unwrap();
    for _ in 0..3 {
        one.rules.reconcile().await.unwrap();
    }
    assert_eq!(one.rules.applied().version, 1);
    assert_eq!(one.rules.counters.invalid.load(Ordering::Relaxed), 1);
    assert_eq!(one.target.quotas(), [Some(40.0)]);
}

#[tokio::test]
async fn a_staged_version_runs_nowhere_until_promoted() {
    let (store, clock) = (store().await, clock());
    let one = instance("one", &store, &clock);
    one.rules.create(request(quota(40.0)), false).await.unwrap();
    let staged = one
        .rules
        .create(
            NewRules {
                stage: true,
                ..request(quota(15.0))
            },
            false,
        )
        .await
        .unwrap();
    assert_eq!(staged.state, RuleState::Staged);
    one.rules.reconcile().await.unwrap();
    assert_eq!(one.target.quotas(), [Some(40.0)]);
    let promoted = one
        .rules
        .promote(staged.version.unwrap(), "dave")
        .await
        .unwrap();
    assert_eq!(promoted.state, RuleState::Active);
    one.rules.reconcile().await.unwrap();
    assert_eq!(one.target.quotas(), [Some(40.0), Some(15.0)]);
    assert_eq!(
        store.rule_set(1).await.unwrap().unwrap().state,
        RuleState::Superseded
    );
    let both = one.rules.create(
        NewRules {
            stage: true,
            rollout: Some(RolloutRequest {
                canary: Some(1),
                ..RolloutRequest::default()
            }),
            ..request(quota(20.0))
        },
        false,
    );
    match both.await {
        Err(RulesError::Invalid(error)) => assert_eq!(error.field, "stage"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn decisions_serialise_as_the_history_shows_them() {
    assert_eq!(
        serde_json::to_value(Decision::RollBack).unwrap(),
        json!("roll_back")
    );
}
