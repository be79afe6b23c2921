//! `rebatectl` against a running embedded-profile instance: an invalidation changes what the
//! next query returns; inspect and warm report what the tiers hold; bad input and a wrong token
//! fail with a precise message; `rules` applies, shows, diffs, rolls back and follows live rule
//! sets, and a refused rule names its key.

use std::path::Path;

use rebate_domain::ItemKey;
use rebate_tests::{TestApp, spawn_app};
use serde_json::Value;

const BINARY: &str = env!("CARGO_BIN_EXE_rebatectl");

struct Outcome {
    success: bool,
    /// The exit code (`None`: ended by a signal).
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

async fn rebatectl(app: &TestApp, token: &str, args: &[&str]) -> Outcome {
    let output = tokio::process::Command::new(BINARY)
        .args(["--admin", &app.admin_url, "--token", token])
        .args(args)
        .env_remove("REBATE_ADMIN_TOKEN")
        // `rules` commands default their author to $USER.
        .env("USER", "tester")
        .output()
        .await
        .expect("rebatectl runs");
    Outcome {
        success: output.status.success(),
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

async fn rate_of(app: &TestApp, item: &str) -> Value {
    let body: Value = app.get_item("jd", item).await.json().await.unwrap();
    body["rebate"]["rate_bps"].clone()
}

#[tokio::test]
async fn invalidate_changes_what_the_next_query_returns() {
    let app = spawn_app().await;
    let key = ItemKey::parse("jd", "100077").unwrap();
    let before = rate_of(&app, "100077").await;
    let version = app.write_rate(key, 7_777, None).await;
    assert_eq!(
        rate_of(&app, "100077").await,
        before,
        "cached until the event"
    );

    let version_text = version.to_string();
    let outcome = rebatectl(
        &app,
        &app.admin_token,
        &[
            "invalidate",
            "--platform",
            "jd",
            "--item",
            "100077",
            "--kind",
            "rate_changed",
            "--version",
            &version_text,
        ],
    )
    .await;
    assert!(outcome.success, "{}", outcome.stderr);
    let answer: Value = serde_json::from_str(&outcome.stdout).unwrap();
    assert!(answer["event_id"].as_str().is_some_and(|id| !id.is_empty()));
    app.state.events.in_process().unwrap().settled().await;
    assert_eq!(rate_of(&app, "100077").await, 7_777);

    let outcome = rebatectl(
        &app,
        &app.admin_token,
        &["inspect", "--platform", "jd", "--item", "100077"],
    )
    .await;
    assert!(outcome.success, "{}", outcome.stderr);
    let inspected: Value = serde_json::from_str(&outcome.stdout).unwrap();
    assert_eq!(inspected["parts"]["rate"]["l1"]["version"], version);
    assert_eq!(inspected["store"]["rate"]["version"], version);
    assert_eq!(inspected["store"]["rate"]["rate_bps"], 7_777);
    assert_eq!(
        inspected["parts"]["rate"]["l2"],
        Value::Null,
        "no L2 in the embedded profile"
    );
    app.stop().await;
}

#[tokio::test]
async fn warm_loads_items_and_bad_input_is_refused_precisely() {
    let app = spawn_app().await;
    let outcome = rebatectl(
        &app,
        &app.admin_token,
        &[
            "warm",
            "--platform",
            "pdd",
            "--item",
            "100101",
            "--item",
            "100102",
        ],
    )
    .await;
    assert!(outcome.success, "{}", outcome.stderr);
    let answer: Value = serde_json::from_str(&outcome.stdout).unwrap();
    assert_eq!(answer["warmed"], 2);
    let loads = app.product_loads();
    assert_eq!(app.get_item("pdd", "100101").await.status(), 200);
    assert_eq!(app.product_loads(), loads, "warmed items are cached");

    let wrong = rebatectl(
        &app,
        "not-the-token-at-all",
        &["inspect", "--platform", "pdd", "--item", "1"],
    )
    .await;
    assert!(!wrong.success);
    assert!(
        wrong.stderr.contains("401") && wrong.stderr.contains("unauthorized"),
        "{}",
        wrong.stderr
    );

    let bad = rebatectl(
        &app,
        &app.admin_token,
        &[
            "invalidate",
            "--platform",
            "ebay",
            "--item",
            "1",
            "--kind",
            "rate_changed",
            "--version",
            "2",
        ],
    )
    .await;
    assert!(!bad.success);
    assert!(
        bad.stderr.contains("invalid_platform") && bad.stderr.contains("ebay"),
        "{}",
        bad.stderr
    );

    let zero = rebatectl(
        &app,
        &app.admin_token,
        &[
            "invalidate",
            "--platform",
            "jd",
            "--item",
            "1",
            "--kind",
            "rate_changed",
            "--version",
            "0",
        ],
    )
    .await;
    assert!(!zero.success);
    assert!(zero.stderr.contains("version"), "{}", zero.stderr);

    // Health needs no token; everything under /admin/v1 does.
    let health = app
        .client
        .get(format!("{}/healthz", app.admin_url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    app.stop().await;
}

/// `warm --file` queues the file's keys as a warm job, follows it to the end and prints its
/// summary; a delisted item is "not found", not a failure. A file with bad lines is refused
/// before anything is sent, naming each bad line.
#[tokio::test]
async fn warm_file_runs_a_job_and_reports_its_summary() {
    let app = rebate_tests::spawn_app_with(|settings| {
        settings.warm_jobs.consume = true;
        settings.warm_jobs.chunk_keys = 50;
        settings.warm_jobs.rate_per_sec = 5_000;
        settings.warm_jobs.poll_interval_ms = 20;
    })
    .await;
    let directory = tempfile::tempdir().unwrap();
    let file = directory.path().join("ids.txt");
    let mut text = String::from("# the first 400 jd items, one delisted\n");
    for id in 101_001..=101_400u64 {
        text.push_str(&format!("jd:{id}\n"));
    }
    std::fs::write(&file, text).unwrap();
    let path = file.to_str().unwrap();
    let outcome = rebatectl(
        &app,
        &app.admin_token,
        &["warm", "--file", path, "--poll-ms", "50"],
    )
    .await;
    assert!(outcome.success, "{}", outcome.stderr);
    let summary: Value = serde_json::from_str(&outcome.stdout).unwrap();
    assert_eq!(summary["state"], "done", "{summary}");
    assert_eq!(summary["loaded"], 399, "{summary}");
    assert_eq!(summary["not_found"], 1, "{summary}");
    assert_eq!(summary["failed"], 0, "{summary}");
    assert!(
        outcome.stderr.contains("progress: ")
            && outcome.stderr.contains("loaded 399, not found 1, failed 0"),
        "plain progress lines and the summary off a terminal: {}",
        outcome.stderr
    );
    assert_eq!(app.product_loads(), 400);

    std::fs::write(&file, "jd:100001\nebay:1\n\njd:12x\n").unwrap();
    let bad = rebatectl(&app, &app.admin_token, &["warm", "--file", path]).await;
    assert!(!bad.success);
    assert!(
        bad.stderr.contains("line 2:")
            && bad.stderr.contains("ebay")
            && bad.stderr.contains("line 4:"),
        "{}",
        bad.stderr
    );
    assert_eq!(app.product_loads(), 400, "nothing was sent");
    app.stop().await;
}

/// The coupon quota at the embedded default (45/s, its ceiling in `[rules.ceilings]`), which the
/// test defaults switch off: a rule set may lower a quota, not add one.
async fn spawn_app_with_coupon_quota() -> TestApp {
    rebate_tests::spawn_app_with(|settings| {
        let defaults = query_api::Settings::defaults().unwrap();
        settings.resilience.coupons.quota_per_sec = defaults.resilience.coupons.quota_per_sec;
        settings.resilience.coupons.quota_burst = defaults.resilience.coupons.quota_burst;
    })
    .await
}

/// A rule set file setting the coupon quota.
fn quota_file(directory: &Path, name: &str, quota: u32) -> String {
    let path = directory.join(name);
    std::fs::write(
        &path,
        format!(r#"{{"resilience": {{"coupons": {{"quota_per_sec": {quota}}}}}}}"#),
    )
    .unwrap();
    path.to_str().unwrap().to_owned()
}

/// `rules --json get`.
async fn rules_overview(app: &TestApp) -> Value {
    let outcome = rebatectl(app, &app.admin_token, &["rules", "--json", "get"]).await;
    assert!(outcome.success, "{}", outcome.stderr);
    serde_json::from_str(&outcome.stdout).unwrap()
}

/// Waits until this instance runs `version`.
async fn wait_applied(app: &TestApp, version: u64) {
    rebate_tests::wait_until_true(&format!("this instance runs version {version}"), || async {
        rules_overview(app).await["this_instance"]["applied_version"] == version
    })
    .await;
}

/// A dry run changes nothing; apply stores a version that `get` shows and the instance runs; a
/// value above its ceiling is refused naming the key; the history lists every version with the
/// keys it changed; a rollback is a new version with the old document; `watch` refreshes
/// `--count` times.
#[tokio::test]
async fn rules_are_applied_shown_refused_rolled_back_and_watched() {
    let app = spawn_app_with_coupon_quota().await;
    let directory = tempfile::tempdir().unwrap();
    let thirty = quota_file(directory.path(), "thirty.json", 30);

    let diff = rebatectl(&app, &app.admin_token, &["rules", "diff", &thirty]).await;
    assert!(diff.success, "{}", diff.stderr);
    assert!(
        diff.stdout.contains("nothing was stored")
            && diff
                .stdout
                .contains("resilience.coupons.quota_per_sec: 45.0 → 30.0"),
        "{}",
        diff.stdout
    );
    let overview = rules_overview(&app).await;
    assert_eq!(overview["active"], Value::Null, "a dry run stores nothing");
    assert_eq!(overview["this_instance"]["applied_version"], 0);

    let no_reason = rebatectl(&app, &app.admin_token, &["rules", "apply", &thirty]).await;
    assert_eq!(no_reason.code, Some(2), "{}", no_reason.stderr);
    assert!(
        no_reason.stderr.contains("--reason"),
        "{}",
        no_reason.stderr
    );

    let apply = [
        "rules",
        "apply",
        &thirty,
        "--reason",
        "coupon API asked",
        "--author",
        "ops",
    ];
    let applied = rebatectl(&app, &app.admin_token, &apply).await;
    assert!(applied.success, "{}", applied.stderr);
    assert!(
        applied.stdout.starts_with("version 1: active\n")
            && applied
                .stdout
                .contains("resilience.coupons.quota_per_sec: 45.0 → 30.0"),
        "{}",
        applied.stdout
    );
    wait_applied(&app, 1).await;
    let shown = rebatectl(&app, &app.admin_token, &["rules", "get"]).await;
    assert!(shown.success, "{}", shown.stderr);
    for part in [
        "active: version 1, since ",
        "author: ops",
        "reason: coupon API asked",
        "\"quota_per_sec\": 30",
        "canary: none",
        "instances (1 live):",
    ] {
        assert!(shown.stdout.contains(part), "{part} in {}", shown.stdout);
    }
    let this_instance = shown
        .stdout
        .lines()
        .find(|line| line.ends_with("(this instance)"))
        .unwrap_or_else(|| panic!("this instance is listed: {}", shown.stdout));
    assert!(this_instance.contains("version 1 "), "{this_instance}");

    // Above the ceiling: a 400 naming the key, exit code 1, nothing stored.
    let fifty = quota_file(directory.path(), "fifty.json", 50);
    let diff_fifty = ["rules", "diff", &fifty];
    let apply_fifty = ["rules", "apply", &fifty, "--reason", "more"];
    for command in [&diff_fifty[..], &apply_fifty[..]] {
        let refused = rebatectl(&app, &app.admin_token, command).await;
        assert_eq!(refused.code, Some(1), "{command:?}: {}", refused.stderr);
        assert!(
            refused.stderr.contains("400")
                && refused.stderr.contains("invalid_rule")
                && refused
                    .stderr
                    .contains("field resilience.coupons.quota_per_sec: ")
                && refused.stderr.contains("ceiling"),
            "{command:?}: {}",
            refused.stderr
        );
    }
    assert_eq!(rules_overview(&app).await["active"]["version"], 1);

    let twenty = quota_file(directory.path(), "twenty.json", 20);
    let second = rebatectl(
        &app,
        &app.admin_token,
        &[
            "rules",
            "apply",
            &twenty,
            "--reason",
            "lower still",
            "--author",
            "ops",
        ],
    )
    .await;
    assert!(
        second.stdout.starts_with("version 2: active\n"),
        "{}",
        second.stdout
    );
    assert!(second.stdout.contains("30.0 → 20.0"), "{}", second.stdout);

    let history = rebatectl(&app, &app.admin_token, &["rules", "history"]).await;
    assert!(history.success, "{}", history.stderr);
    let lines: Vec<&str> = history.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", history.stdout);
    assert!(
        lines[0].trim_start().starts_with("2  active")
            && lines[0].contains("\"lower still\"")
            && lines[0].contains("changes: resilience.coupons.quota_per_sec"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].trim_start().starts_with("1  superseded") && lines[1].contains("ops"),
        "{}",
        lines[1]
    );

    let rollback = rebatectl(
        &app,
        &app.admin_token,
        &[
            "rules", "rollback", "1", "--reason", "too low", "--author", "ops",
        ],
    )
    .await;
    assert!(rollback.success, "{}", rollback.stderr);
    assert!(
        rollback.stdout.starts_with("version 3: active\n")
            && rollback.stdout.contains("20.0 → 30.0"),
        "{}",
        rollback.stdout
    );
    wait_applied(&app, 3).await;
    let overview = rules_overview(&app).await;
    assert_eq!(
        overview["active"]["reason"],
        "rollback to version 1: too low"
    );
    assert_eq!(
        overview["active"]["document"],
        serde_json::json!({"resilience": {"coupons": {"quota_per_sec": 30}}})
    );
    let history = rebatectl(
        &app,
        &app.admin_token,
        &["rules", "history", "--limit", "2"],
    )
    .await;
    let lines: Vec<&str> = history.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", history.stdout);
    assert!(
        lines[0].trim_start().starts_with("3  active"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].trim_start().starts_with("2  rolled_back"),
        "{}",
        lines[1]
    );

    let watch = rebatectl(
        &app,
        &app.admin_token,
        &["rules", "watch", "--interval", "100ms", "--count", "2"],
    )
    .await;
    assert!(watch.success, "{}", watch.stderr);
    let frames: Vec<&str> = watch.stdout.split("── ").skip(1).collect();
    assert_eq!(frames.len(), 2, "{}", watch.stdout);
    for frame in frames {
        assert!(
            frame.contains("active: version 3") && frame.contains("(this instance)"),
            "{frame}"
        );
    }
    assert!(watch.stdout.contains("refresh 2 of 2"), "{}", watch.stdout);

    let missing = rebatectl(&app, &app.admin_token, &["rules", "promote", "99"]).await;
    assert_eq!(missing.code, Some(1));
    assert!(
        missing.stderr.contains("rule_set_not_found"),
        "{}",
        missing.stderr
    );
    app.stop().await;
}

/// A canary on this instance: `get` and `watch` show it with its time left; abort sends the
/// instance back to the active version with an operator's verdict, and promote makes the next
/// canary active.
#[tokio::test]
async fn a_canary_is_shown_then_aborted_or_promoted() {
    let app = spawn_app_with_coupon_quota().await;
    let directory = tempfile::tempdir().unwrap();
    let thirty = quota_file(directory.path(), "thirty.json", 30);
    // The instance has reported at least once, so it is live and may be chosen.
    wait_applied(&app, 0).await;
    let canary = [
        "rules",
        "apply",
        &thirty,
        "--canary",
        "1",
        "--observe",
        "10m",
        "--reason",
        "try it",
    ];
    let started = rebatectl(&app, &app.admin_token, &canary).await;
    assert!(started.success, "{}", started.stderr);
    assert!(
        started.stdout.starts_with("version 1: canary\n") && started.stdout.contains("for 600 s"),
        "{}",
        started.stdout
    );
    wait_applied(&app, 1).await;
    let watch = rebatectl(
        &app,
        &app.admin_token,
        &["rules", "watch", "--interval", "100ms", "--count", "1"],
    )
    .await;
    assert!(watch.success, "{}", watch.stderr);
    assert!(
        watch.stdout.contains("canary: version 1 on ")
            && watch.stdout.contains("(1 of 1 live instances)")
            && watch.stdout.contains("s of 600 s left")
            && watch.stdout.contains("canary: 0 requests"),
        "{}",
        watch.stdout
    );

    let aborted = rebatectl(
        &app,
        &app.admin_token,
        &["rules", "abort", "1", "--author", "ops"],
    )
    .await;
    assert!(aborted.success, "{}", aborted.stderr);
    assert!(
        aborted.stdout.starts_with("version 1: aborted\n")
            && aborted
                .stdout
                .contains("verdict roll_back (ops): decided by an operator (ops)"),
        "{}",
        aborted.stdout
    );
    wait_applied(&app, 0).await;

    let again = rebatectl(&app, &app.admin_token, &canary).await;
    assert!(
        again.stdout.starts_with("version 2: canary\n"),
        "{}",
        again.stdout
    );
    let promoted = rebatectl(&app, &app.admin_token, &["rules", "promote", "2"]).await;
    assert!(promoted.success, "{}", promoted.stderr);
    assert!(
        promoted.stdout.starts_with("version 2: active\n")
            && promoted.stdout.contains("verdict promote (tester)"),
        "{}",
        promoted.stdout
    );
    wait_applied(&app, 2).await;
    let history = rebatectl(&app, &app.admin_token, &["rules", "history"]).await;
    assert!(
        history
            .stdout
            .lines()
            .nth(1)
            .is_some_and(|line| line.contains("aborted") && line.contains("verdict roll_back")),
        "{}",
        history.stdout
    );
    app.stop().await;
}
