//! `rebatectl` against a running embedded-profile instance: an invalidation changes what the
//! next query returns; inspect and warm report what the tiers hold; bad input and a wrong token
//! fail with a precise message.

use rebate_domain::ItemKey;
use rebate_tests::{TestApp, spawn_app};
use serde_json::Value;

const BINARY: &str = env!("CARGO_BIN_EXE_rebatectl");

struct Outcome {
    success: bool,
    stdout: String,
    stderr: String,
}

async fn rebatectl(app: &TestApp, token: &str, args: &[&str]) -> Outcome {
    let output = tokio::process::Command::new(BINARY)
        .args(["--admin", &app.admin_url, "--token", token])
        .args(args)
        .env_remove("REBATE_ADMIN_TOKEN")
        .output()
        .await
        .expect("rebatectl runs");
    Outcome {
        success: output.status.success(),
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
