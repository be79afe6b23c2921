//! The rule sets' part of the store contract ([`crate::rules`]): versions, the single active row,
//! compare-and-set moves, history paging, instance reports, column limits and corrupt rows, and
//! writers racing each other. Listed in [`super::contract_suite!`]; run as
//! `…::contract::rules::name`.
//!
//! Times are fixed instants ([`at`]), never the clock: the store takes "now" as an argument.

use futures::future::join_all;
use rebate_domain::Timestamp;

use super::{ContractStore, assert_corrupt};
use crate::StoreError;
use crate::rules::{
    InstanceReport, MAX_AUTHOR_CHARS, MAX_DOCUMENT_BYTES, MAX_INSTANCE_ID_CHARS, MAX_REASON_CHARS,
    MAX_REPORT_BYTES, MAX_ROLLOUT_BYTES, MAX_RULE_SETS_PAGE, MAX_VERDICT_BYTES, NewRuleSet,
    RuleSetRow, RuleState,
};

/// `offset_ms` after an arbitrary fixed instant.
fn at(offset_ms: i64) -> Timestamp {
    Timestamp::from_millis(1_800_000_000_000 + offset_ms)
}

fn new_rule_set(state: RuleState) -> NewRuleSet {
    NewRuleSet {
        document: String::from(r#"{"limits":{"qps":100}}"#),
        author: String::from("operator"),
        reason: String::from("contract test"),
        state,
        rollout: None,
        schedule_from: None,
        schedule_until: None,
        previous_version: None,
    }
}

async fn insert<S: ContractStore>(store: &S, state: RuleState, now: Timestamp) -> u64 {
    store
        .insert_rule_set(&new_rule_set(state), now)
        .await
        .unwrap()
}

async fn row<S: ContractStore>(store: &S, version: u64) -> RuleSetRow {
    store.rule_set(version).await.unwrap().unwrap()
}

fn versions(rows: &[RuleSetRow]) -> Vec<u64> {
    rows.iter().map(|row| row.version).collect()
}

async fn active_versions<S: ContractStore>(store: &S) -> Vec<u64> {
    versions(&store.rule_sets_in(&[RuleState::Active]).await.unwrap())
}

/// JSON text of exactly `bytes` bytes: a string of `x`.
fn json_of_bytes(bytes: usize) -> String {
    format!("\"{}\"", "x".repeat(bytes - 2))
}

fn assert_out_of_range<T: std::fmt::Debug>(
    result: Result<T, StoreError>,
    expected_key: &str,
    column: &str,
) {
    match result {
        Err(StoreError::ValueOutOfRange { key, reason }) => {
            assert_eq!(key, expected_key, "{reason}");
            assert!(reason.contains(column), "{reason:?} should name {column}");
        }
        other => panic!("expected ValueOutOfRange for {column}, got {other:?}"),
    }
}

fn report(instance_id: &str, applied_version: u64, reported_at: Timestamp) -> InstanceReport {
    InstanceReport {
        instance_id: instance_id.to_owned(),
        applied_version,
        reported_at,
        report: format!(r#"{{"applied":{applied_version}}}"#),
    }
}

pub(crate) async fn a_fresh_store_has_no_rule_sets_or_reports<S: ContractStore>(store: &S) {
    assert_eq!(store.rule_sets(100, None).await.unwrap(), []);
    assert_eq!(store.rule_sets_in(&RuleState::ALL).await.unwrap(), []);
    assert_eq!(store.active_rule_set().await.unwrap(), None);
    assert_eq!(store.rule_set(1).await.unwrap(), None);
    let moved = store
        .transition_rule_set(1, &RuleState::ALL, RuleState::Active, None, at(0))
        .await
        .unwrap();
    assert!(!moved, "there is no version 1 to move");
    let reports = store
        .instance_reports(Timestamp::from_millis(i64::MIN))
        .await
        .unwrap();
    assert_eq!(reports, []);
}

/// Every field round-trips, text that is not ASCII included; the store adds version and times.
pub(crate) async fn versions_grow_from_1_and_rows_read_back_as_written<S: ContractStore>(
    store: &S,
) {
    let scheduled = NewRuleSet {
        document: String::from(r#"{"rules":[{"platform":"jd","boost_bps":25}],"note":"双十一"}"#),
        author: String::from("王小明"),
        reason: String::from("双十一 boost, approved in OPS-42"),
        state: RuleState::Scheduled,
        rollout: Some(String::from(r#"{"percent":10}"#)),
        schedule_from: Some(at(60_000)),
        schedule_until: Some(at(120_000)),
        previous_version: Some(7),
    };

    let first = store.insert_rule_set(&scheduled, at(1)).await.unwrap();
    let second = insert(store, RuleState::Staged, at(2)).await;
    let third = insert(store, RuleState::Canary, at(3)).await;

    assert_eq!([first, second, third], [1, 2, 3]);
    assert_eq!(
        row(store, 1).await,
        RuleSetRow {
            version: 1,
            document: scheduled.document.clone(),
            author: scheduled.author.clone(),
            reason: scheduled.reason.clone(),
            created_at: at(1),
            activated_at: None,
            state: RuleState::Scheduled,
            rollout: scheduled.rollout.clone(),
            schedule_from: Some(at(60_000)),
            schedule_until: Some(at(120_000)),
            previous_version: Some(7),
            verdict: None,
            updated_at: at(1),
        }
    );
    let staged = row(store, 2).await;
    assert_eq!(
        (staged.state, staged.created_at, staged.updated_at),
        (RuleState::Staged, at(2), at(2))
    );
    assert_eq!(
        (
            staged.rollout,
            staged.schedule_from,
            staged.previous_version
        ),
        (None, None, None)
    );
    assert_eq!(store.rule_set(4).await.unwrap(), None);
    assert_eq!(store.rule_set(0).await.unwrap(), None);
    assert_eq!(store.rule_set(u64::MAX).await.unwrap(), None);
    assert_eq!(
        store.active_rule_set().await.unwrap(),
        None,
        "none inserted active"
    );
}

pub(crate) async fn inserting_an_active_rule_set_supersedes_the_active_one<S: ContractStore>(
    store: &S,
) {
    let first = insert(store, RuleState::Active, at(10)).await;
    let active = store.active_rule_set().await.unwrap().unwrap();
    assert_eq!(
        (active.version, active.state, active.activated_at),
        (first, RuleState::Active, Some(at(10)))
    );
    let staged = insert(store, RuleState::Staged, at(20)).await;
    assert_eq!(
        active_versions(store).await,
        [first],
        "a staged row changes nothing"
    );

    let second = insert(store, RuleState::Active, at(30)).await;

    let superseded = row(store, first).await;
    assert_eq!(superseded.state, RuleState::Superseded);
    assert_eq!(
        superseded.activated_at,
        Some(at(10)),
        "when it was activated"
    );
    assert_eq!(superseded.updated_at, at(30));
    let active = store.active_rule_set().await.unwrap().unwrap();
    assert_eq!(
        (active.version, active.activated_at, active.updated_at),
        (second, Some(at(30)), at(30))
    );
    let untouched = row(store, staged).await;
    assert_eq!(
        (untouched.state, untouched.updated_at),
        (RuleState::Staged, at(20))
    );
    assert_eq!(active_versions(store).await, [second]);
}

pub(crate) async fn a_transition_moves_only_from_an_expected_state<S: ContractStore>(store: &S) {
    let version = insert(store, RuleState::Staged, at(0)).await;
    let verdict = r#"{"error_rate":0.2,"passed":false}"#;

    let wrong_from = store
        .transition_rule_set(
            version,
            &[RuleState::Canary],
            RuleState::Aborted,
            Some(verdict),
            at(1),
        )
        .await
        .unwrap();
    assert!(!wrong_from);
    let unchanged = row(store, version).await;
    assert_eq!(
        (unchanged.state, unchanged.verdict, unchanged.updated_at),
        (RuleState::Staged, None, at(0)),
        "a refused move writes nothing, verdict included"
    );

    let to_canary = store
        .transition_rule_set(
            version,
            &[RuleState::Scheduled, RuleState::Staged],
            RuleState::Canary,
            None,
            at(2),
        )
        .await
        .unwrap();
    assert!(to_canary);
    let canary = row(store, version).await;
    assert_eq!(
        (canary.state, canary.updated_at, canary.activated_at),
        (RuleState::Canary, at(2), None)
    );

    let aborted = store
        .transition_rule_set(
            version,
            &[RuleState::Canary],
            RuleState::Aborted,
            Some(verdict),
            at(3),
        )
        .await
        .unwrap();
    assert!(aborted);
    assert_eq!(row(store, version).await.verdict.as_deref(), Some(verdict));

    let expired = store
        .transition_rule_set(
            version,
            &[RuleState::Aborted],
            RuleState::Expired,
            None,
            at(4),
        )
        .await
        .unwrap();
    assert!(expired);
    let expired_row = row(store, version).await;
    assert_eq!(expired_row.state, RuleState::Expired);
    assert_eq!(
        expired_row.verdict.as_deref(),
        Some(verdict),
        "no verdict keeps the one written"
    );
    assert_eq!(expired_row.created_at, at(0));

    let from_nothing = store
        .transition_rule_set(version, &[], RuleState::Staged, None, at(5))
        .await
        .unwrap();
    assert!(!from_nothing);
    let unknown_version = store
        .transition_rule_set(version + 1, &RuleState::ALL, RuleState::Staged, None, at(5))
        .await
        .unwrap();
    assert!(!unknown_version);
    assert_eq!(row(store, version).await.state, RuleState::Expired);
    assert_eq!(store.active_rule_set().await.unwrap(), None);
}

/// Promotion and revert: every activation supersedes the row active before, so exactly one row
/// is active after each.
pub(crate) async fn promoting_a_canary_supersedes_the_active_one_atomically<S: ContractStore>(
    store: &S,
) {
    let original = insert(store, RuleState::Active, at(0)).await;
    let canary = insert(store, RuleState::Canary, at(1)).await;
    let verdict = r#"{"passed":true}"#;

    let promoted = store
        .transition_rule_set(
            canary,
            &[RuleState::Canary],
            RuleState::Active,
            Some(verdict),
            at(2),
        )
        .await
        .unwrap();

    assert!(promoted);
    assert_eq!(active_versions(store).await, [canary]);
    let active = row(store, canary).await;
    assert_eq!(
        (
            active.activated_at,
            active.updated_at,
            active.verdict.as_deref()
        ),
        (Some(at(2)), at(2), Some(verdict))
    );
    let superseded = row(store, original).await;
    assert_eq!(
        (superseded.state, superseded.updated_at),
        (RuleState::Superseded, at(2))
    );

    // Revert: the superseded original becomes active again, then the canary is marked.
    let reverted = store
        .transition_rule_set(
            original,
            &[RuleState::Superseded],
            RuleState::Active,
            None,
            at(3),
        )
        .await
        .unwrap();
    assert!(reverted);
    assert_eq!(active_versions(store).await, [original]);
    assert_eq!(row(store, original).await.activated_at, Some(at(3)));
    assert_eq!(row(store, canary).await.state, RuleState::Superseded);
    let rolled_back = store
        .transition_rule_set(
            canary,
            &[RuleState::Superseded],
            RuleState::RolledBack,
            None,
            at(4),
        )
        .await
        .unwrap();
    assert!(rolled_back);
    assert_eq!(row(store, canary).await.state, RuleState::RolledBack);

    // Activating the active row again keeps it the only active one.
    let again = store
        .transition_rule_set(
            original,
            &[RuleState::Active],
            RuleState::Active,
            None,
            at(5),
        )
        .await
        .unwrap();
    assert!(again);
    assert_eq!(active_versions(store).await, [original]);
    assert_eq!(row(store, original).await.activated_at, Some(at(5)));
}

pub(crate) async fn history_is_newest_first_paged_by_before_and_capped<S: ContractStore>(
    store: &S,
) {
    for offset in 1..=5 {
        insert(store, RuleState::Staged, at(offset)).await;
    }

    let all = store.rule_sets(10, None).await.unwrap();
    assert_eq!(versions(&all), [5, 4, 3, 2, 1]);
    assert_eq!(all[0].created_at, at(5));
    let page =
        |limit, before| async move { versions(&store.rule_sets(limit, before).await.unwrap()) };
    assert_eq!(page(2, None).await, [5, 4]);
    assert_eq!(page(2, Some(4)).await, [3, 2]);
    assert_eq!(page(2, Some(2)).await, [1]);
    assert_eq!(page(2, Some(1)).await, Vec::<u64>::new());
    assert_eq!(page(0, None).await, Vec::<u64>::new());
    assert_eq!(page(10, Some(u64::MAX)).await, [5, 4, 3, 2, 1]);

    // 1,000 more rows planted in one statement; a page never holds more than the cap.
    let planted: Vec<String> = (6..=1_005)
        .map(|version| format!("({version}, '{{}}', 'bulk', 'cap', 0, 'superseded', 0)"))
        .collect();
    store
        .execute_sql(&format!(
            "INSERT INTO rule_sets (version, document, author, reason, created_at_ms, state, \
             updated_at_ms) VALUES {}",
            planted.join(", ")
        ))
        .await
        .unwrap();

    let capped = store.rule_sets(u32::MAX, None).await.unwrap();
    assert_eq!(capped.len(), MAX_RULE_SETS_PAGE as usize);
    assert_eq!(capped.first().map(|row| row.version), Some(1_005));
    assert_eq!(capped.last().map(|row| row.version), Some(6));
    assert_eq!(page(u32::MAX, Some(6)).await, [5, 4, 3, 2, 1]);
    assert_eq!(
        insert(store, RuleState::Staged, at(6)).await,
        1_006,
        "the next version follows the highest stored"
    );
}

pub(crate) async fn rule_sets_in_lists_the_given_states_oldest_first<S: ContractStore>(store: &S) {
    for state in [
        RuleState::Canary,
        RuleState::Scheduled,
        RuleState::Staged,
        RuleState::Canary,
        RuleState::Active,
        RuleState::Scheduled,
    ] {
        insert(store, state, at(0)).await;
    }
    let listed = |states: &'static [RuleState]| async move {
        versions(&store.rule_sets_in(states).await.unwrap())
    };

    assert_eq!(
        listed(&[RuleState::Canary, RuleState::Scheduled]).await,
        [1, 2, 4, 6]
    );
    assert_eq!(
        listed(&[RuleState::Scheduled, RuleState::Canary]).await,
        [1, 2, 4, 6]
    );
    assert_eq!(
        listed(&[RuleState::Canary, RuleState::Canary]).await,
        [1, 4]
    );
    assert_eq!(listed(&[RuleState::Active]).await, [5]);
    assert_eq!(listed(&[RuleState::Expired]).await, Vec::<u64>::new());
    assert_eq!(listed(&[]).await, Vec::<u64>::new());
    assert_eq!(listed(&RuleState::ALL).await, [1, 2, 3, 4, 5, 6]);
    let canaries = store.rule_sets_in(&[RuleState::Canary]).await.unwrap();
    assert!(canaries.iter().all(|row| row.state == RuleState::Canary));
}

pub(crate) async fn instance_reports_are_replaced_and_filtered_by_time<S: ContractStore>(
    store: &S,
) {
    store
        .report_instance(&report("pod-b", 0, at(1)))
        .await
        .unwrap();
    store
        .report_instance(&report("pod-a", 3, at(2)))
        .await
        .unwrap();
    // Ids are exact: a different case is a different instance.
    store
        .report_instance(&report("Pod-A", 3, at(3)))
        .await
        .unwrap();
    store
        .report_instance(&report("节点-1", 2, at(3)))
        .await
        .unwrap();
    let replacement = InstanceReport {
        instance_id: String::from("pod-b"),
        applied_version: 5,
        reported_at: at(4),
        report: String::from(r#"{"applied":5,"errors":[]}"#),
    };
    store.report_instance(&replacement).await.unwrap();

    let everything = store.instance_reports(at(0)).await.unwrap();

    // Ordered by the id's bytes: upper case before lower case, ASCII before other text.
    assert_eq!(
        everything,
        [
            report("Pod-A", 3, at(3)),
            report("pod-a", 3, at(2)),
            replacement.clone(),
            report("节点-1", 2, at(3)),
        ]
    );
    let ids = |reports: Vec<InstanceReport>| -> Vec<String> {
        reports
            .into_iter()
            .map(|report| report.instance_id)
            .collect()
    };
    assert_eq!(
        ids(store.instance_reports(at(2)).await.unwrap()),
        ["Pod-A", "pod-b", "节点-1"],
        "strictly newer than `since`"
    );
    assert_eq!(ids(store.instance_reports(at(3)).await.unwrap()), ["pod-b"]);
    assert_eq!(store.instance_reports(at(4)).await.unwrap(), []);

    // A report may go back in time (an instance's clock); the latest write wins.
    store
        .report_instance(&report("pod-b", 1, at(0)))
        .await
        .unwrap();
    assert_eq!(ids(store.instance_reports(at(0)).await.unwrap()).len(), 3);
    assert_eq!(
        store
            .instance_reports(Timestamp::from_millis(0))
            .await
            .unwrap()[2],
        report("pod-b", 1, at(0))
    );

    // Instances gone for good are forgotten: strictly older than the bound.
    assert_eq!(store.forget_instances(at(3)).await.unwrap(), 2);
    assert_eq!(
        ids(store
            .instance_reports(Timestamp::from_millis(i64::MIN))
            .await
            .unwrap()),
        ["Pod-A", "节点-1"]
    );
}

pub(crate) async fn values_beyond_the_rule_columns_are_refused_before_writing<S: ContractStore>(
    store: &S,
) {
    let base = new_rule_set(RuleState::Active);
    let refused = [
        (
            NewRuleSet {
                document: json_of_bytes(MAX_DOCUMENT_BYTES + 1),
                ..base.clone()
            },
            "rule_sets.document",
        ),
        (
            NewRuleSet {
                author: "规".repeat(MAX_AUTHOR_CHARS + 1),
                ..base.clone()
            },
            "rule_sets.author",
        ),
        (
            NewRuleSet {
                reason: "é".repeat(MAX_REASON_CHARS + 1),
                ..base.clone()
            },
            "rule_sets.reason",
        ),
        (
            NewRuleSet {
                rollout: Some(json_of_bytes(MAX_ROLLOUT_BYTES + 1)),
                ..base.clone()
            },
            "rule_sets.rollout",
        ),
        (
            NewRuleSet {
                previous_version: Some(u64::MAX),
                ..base.clone()
            },
            "rule_sets.previous_version",
        ),
        (
            NewRuleSet {
                previous_version: Some(0),
                ..base.clone()
            },
            "rule_sets.previous_version",
        ),
    ];
    for (new, column) in refused {
        assert_out_of_range(
            store.insert_rule_set(&new, at(0)).await,
            "rule_set:new",
            column,
        );
    }
    assert_eq!(
        store.rule_sets(10, None).await.unwrap(),
        [],
        "nothing written"
    );

    // The limits themselves fit; characters are counted as characters, not bytes.
    let at_the_limits = NewRuleSet {
        document: json_of_bytes(MAX_DOCUMENT_BYTES),
        author: "规".repeat(MAX_AUTHOR_CHARS),
        reason: "é".repeat(MAX_REASON_CHARS),
        rollout: Some(json_of_bytes(MAX_ROLLOUT_BYTES)),
        previous_version: Some(i64::MAX as u64),
        ..base.clone()
    };
    let version = store.insert_rule_set(&at_the_limits, at(1)).await.unwrap();
    let stored = row(store, version).await;
    assert_eq!(stored.document, at_the_limits.document);
    assert_eq!(stored.author, at_the_limits.author);
    assert_eq!(stored.reason, at_the_limits.reason);
    assert_eq!(stored.rollout, at_the_limits.rollout);
    assert_eq!(stored.previous_version, Some(i64::MAX as u64));

    let long_verdict = json_of_bytes(MAX_VERDICT_BYTES + 1);
    assert_out_of_range(
        store
            .transition_rule_set(
                version,
                &[RuleState::Active],
                RuleState::Superseded,
                Some(&long_verdict),
                at(2),
            )
            .await,
        "rule_set:1",
        "rule_sets.verdict",
    );
    assert_out_of_range(
        store
            .transition_rule_set(
                u64::MAX,
                &[RuleState::Active],
                RuleState::Superseded,
                None,
                at(2),
            )
            .await,
        &format!("rule_set:{}", u64::MAX),
        "rule_sets.version",
    );
    assert_eq!(row(store, version).await.state, RuleState::Active);
    let longest_verdict = json_of_bytes(MAX_VERDICT_BYTES);
    let moved = store
        .transition_rule_set(
            version,
            &[RuleState::Active],
            RuleState::Superseded,
            Some(&longest_verdict),
            at(3),
        )
        .await
        .unwrap();
    assert!(moved);
    assert_eq!(row(store, version).await.verdict, Some(longest_verdict));

    let too_long_id = "节".repeat(MAX_INSTANCE_ID_CHARS + 1);
    for (bad, key, column) in [
        (
            report("", 1, at(0)),
            String::from("rule_instance:"),
            "rule_instances.instance_id",
        ),
        (
            report(&too_long_id, 1, at(0)),
            format!("rule_instance:{}…", "节".repeat(64)),
            "rule_instances.instance_id",
        ),
        (
            report("pod-a", u64::MAX, at(0)),
            String::from("rule_instance:pod-a"),
            "rule_instances.applied_version",
        ),
        (
            InstanceReport {
                report: json_of_bytes(MAX_REPORT_BYTES + 1),
                ..report("pod-a", 1, at(0))
            },
            String::from("rule_instance:pod-a"),
            "rule_instances.report",
        ),
    ] {
        assert_out_of_range(store.report_instance(&bad).await, &key, column);
    }
    assert_eq!(store.instance_reports(at(-1)).await.unwrap(), []);
    let largest = InstanceReport {
        instance_id: "节".repeat(MAX_INSTANCE_ID_CHARS),
        applied_version: i64::MAX as u64,
        reported_at: at(0),
        report: json_of_bytes(MAX_REPORT_BYTES),
    };
    store.report_instance(&largest).await.unwrap();
    assert_eq!(store.instance_reports(at(-1)).await.unwrap(), [largest]);
}

/// Rows planted past the CHECKs, as a careless tool could write them.
pub(crate) async fn a_rule_row_breaking_an_invariant_is_a_corrupt_row<S: ContractStore>(store: &S) {
    let good = insert(store, RuleState::Staged, at(0)).await;
    store
        .execute_unchecked(&[
            "INSERT INTO rule_sets (version, document, author, reason, created_at_ms, state, \
             updated_at_ms) VALUES (2, '{}', 'tool', 'manual fix', 0, 'paused', 0)",
            "INSERT INTO rule_sets (version, document, author, reason, created_at_ms, state, \
             previous_version, updated_at_ms) VALUES (3, '{}', 'tool', 'manual fix', 0, \
             'superseded', -4, 0)",
            "INSERT INTO rule_instances (instance_id, applied_version, reported_at_ms, report) \
             VALUES ('pod-x', -1, 5, '{}')",
        ])
        .await;

    assert_corrupt(store.rule_set(2).await, "rule_set:2", "paused");
    assert_corrupt(store.rule_set(3).await, "rule_set:3", "previous_version");
    assert_corrupt(store.rule_sets(10, None).await, "rule_set:3", "-4");
    assert_corrupt(store.rule_sets(10, Some(3)).await, "rule_set:2", "state");
    assert_corrupt(
        store.instance_reports(Timestamp::from_millis(0)).await,
        "rule_instance:pod-x",
        "applied_version",
    );
    // The rest reads as before; an unknown state is in no `from` and never moves.
    assert_eq!(row(store, good).await.state, RuleState::Staged);
    assert_eq!(
        versions(&store.rule_sets_in(&[RuleState::Staged]).await.unwrap()),
        [good]
    );
    let moved = store
        .transition_rule_set(2, &RuleState::ALL, RuleState::Active, None, at(1))
        .await
        .unwrap();
    assert!(!moved);
    assert_eq!(store.active_rule_set().await.unwrap(), None);
}

/// The schema's state list and [`RuleState`] agree both ways, and raw SQL that breaks an
/// invariant is refused by the database itself.
pub(crate) async fn the_schema_knows_every_state_and_refuses_invalid_rule_rows<S: ContractStore>(
    store: &S,
) {
    let row_sql = |version: u64, state: &str| {
        format!(
            "INSERT INTO rule_sets (version, document, author, reason, created_at_ms, state, \
             updated_at_ms) VALUES ({version}, '{{}}', 'a', 'r', 0, '{state}', 0)"
        )
    };
    for (version, state) in (1..).zip(RuleState::ALL) {
        store
            .execute_sql(&row_sql(version, state.as_str()))
            .await
            .unwrap();
    }
    let stored = store.rule_sets_in(&RuleState::ALL).await.unwrap();
    let states: Vec<RuleState> = stored.iter().map(|row| row.state).collect();
    assert_eq!(states, RuleState::ALL);

    let oversized_document = json_of_bytes(MAX_DOCUMENT_BYTES + 1);
    let long_author = "a".repeat(MAX_AUTHOR_CHARS + 1);
    let refused = [
        row_sql(100, "paused"),
        row_sql(101, "active"),
        row_sql(0, "staged"),
        String::from(
            "INSERT INTO rule_sets (version, document, author, reason, created_at_ms, state, \
             updated_at_ms) VALUES (102, 'not json', 'a', 'r', 0, 'staged', 0)",
        ),
        format!(
            "INSERT INTO rule_sets (version, document, author, reason, created_at_ms, state, \
             updated_at_ms) VALUES (103, '{oversized_document}', 'a', 'r', 0, 'staged', 0)"
        ),
        format!(
            "INSERT INTO rule_sets (version, document, author, reason, created_at_ms, state, \
             updated_at_ms) VALUES (104, '{{}}', '{long_author}', 'r', 0, 'staged', 0)"
        ),
        String::from(
            "INSERT INTO rule_sets (version, document, author, reason, created_at_ms, state, \
             rollout, updated_at_ms) VALUES (105, '{}', 'a', 'r', 0, 'staged', '{', 0)",
        ),
        String::from(
            "INSERT INTO rule_sets (version, document, author, reason, created_at_ms, state, \
             verdict, updated_at_ms) VALUES (106, '{}', 'a', 'r', 0, 'staged', 'no', 0)",
        ),
        String::from(
            "INSERT INTO rule_sets (version, document, author, reason, created_at_ms, state, \
             previous_version, updated_at_ms) VALUES (107, '{}', 'a', 'r', 0, 'staged', 0, 0)",
        ),
        String::from("UPDATE rule_sets SET state = 'active' WHERE version = 1"),
        String::from(
            "INSERT INTO rule_instances (instance_id, applied_version, reported_at_ms, report) \
             VALUES ('pod-a', -1, 0, '{}')",
        ),
        String::from(
            "INSERT INTO rule_instances (instance_id, applied_version, reported_at_ms, report) \
             VALUES ('', 0, 0, '{}')",
        ),
        String::from(
            "INSERT INTO rule_instances (instance_id, applied_version, reported_at_ms, report) \
             VALUES ('pod-b', 0, 0, 'not json')",
        ),
    ];
    for statement in &refused {
        let result = store.execute_sql(statement).await;
        assert!(
            result.is_err(),
            "accepted: {}",
            rebate_domain::text::truncate_chars(statement, 200)
        );
    }
    assert_eq!(
        store.rule_sets_in(&RuleState::ALL).await.unwrap(),
        stored,
        "nothing changed"
    );
    assert_eq!(
        store
            .instance_reports(at(-2_000_000_000_000))
            .await
            .unwrap(),
        []
    );
}

/// Eight writers at once, half of them activating: each gets a version of its own, the versions
/// are consecutive, and the newest activation is the one active row.
pub(crate) async fn concurrent_inserts_get_distinct_consecutive_versions<S: ContractStore>(
    store: &S,
) {
    let first = insert(store, RuleState::Active, at(0)).await;
    let states: Vec<RuleState> = (0..8)
        .map(|index| {
            if index % 2 == 0 {
                RuleState::Active
            } else {
                RuleState::Staged
            }
        })
        .collect();

    let new_rule_sets: Vec<NewRuleSet> = states.iter().map(|state| new_rule_set(*state)).collect();

    let results = join_all(
        new_rule_sets
            .iter()
            .map(|new| store.insert_rule_set(new, at(1))),
    )
    .await;

    let mut inserted: Vec<u64> = results.into_iter().map(Result::unwrap).collect();
    let activated: Vec<u64> = inserted
        .iter()
        .zip(&states)
        .filter(|(_, state)| **state == RuleState::Active)
        .map(|(version, _)| *version)
        .collect();
    inserted.sort_unstable();
    assert_eq!(inserted, (first + 1..=first + 8).collect::<Vec<_>>());
    // Versions are taken in commit order, so the highest activated version committed last.
    let newest_activation = activated.iter().copied().max();
    assert_eq!(
        active_versions(store).await,
        Vec::from_iter(newest_activation)
    );
    for version in activated.iter().chain([&first]) {
        if Some(*version) != newest_activation {
            assert_eq!(
                row(store, *version).await.state,
                RuleState::Superseded,
                "{version}"
            );
        }
    }
    assert_eq!(store.rule_sets(100, None).await.unwrap().len(), 9);
}

/// Eight canaries promoted at once: all move, one is left active. Then eight moves of one row
/// from the same state: exactly one wins the compare-and-set.
pub(crate) async fn concurrent_promotions_leave_exactly_one_active<S: ContractStore>(store: &S) {
    let first = insert(store, RuleState::Active, at(0)).await;
    let mut canaries = Vec::new();
    for _ in 0..8 {
        canaries.push(insert(store, RuleState::Canary, at(0)).await);
    }

    let promoted = join_all(canaries.iter().map(|canary| {
        store.transition_rule_set(
            *canary,
            &[RuleState::Canary],
            RuleState::Active,
            None,
            at(1),
        )
    }))
    .await;

    assert!(promoted.into_iter().all(|moved| moved.unwrap()));
    let active = active_versions(store).await;
    assert_eq!(active.len(), 1, "{active:?}");
    let superseded = store.rule_sets_in(&[RuleState::Superseded]).await.unwrap();
    assert_eq!(
        superseded.len(),
        8,
        "the first active row and seven canaries"
    );
    assert!(!versions(&superseded).contains(&active[0]));
    assert!(versions(&superseded).contains(&first));

    let contested = insert(store, RuleState::Canary, at(2)).await;
    let moves = join_all((0..8).map(|_| {
        store.transition_rule_set(
            contested,
            &[RuleState::Canary],
            RuleState::Aborted,
            None,
            at(3),
        )
    }))
    .await;
    let winners = moves
        .into_iter()
        .filter(|moved| *moved.as_ref().unwrap())
        .count();
    assert_eq!(winners, 1);
    assert_eq!(row(store, contested).await.state, RuleState::Aborted);
}
