//! Warm jobs: `POST /admin/v1/warm-jobs` on the embedded profile (an in-process queue) and on a
//! production fleet sharing one Redis stream (real Redis and MariaDB, a key prefix per test):
//! every key loaded once across the instances, a chunk left by a dead consumer claimed and done by
//! another, an instance stopped mid-job leaving no chunk undone.

use std::time::Duration;

use query_api::Settings;
use rebate_tests::{ProductionEnv, TestApp, spawn_app_with};
use serde_json::{Value, json};

/// Fast consumers for tests: the job's pace is not what is measured.
fn quick(settings: &mut Settings) {
    settings.warm_jobs.consume = true;
    settings.warm_jobs.chunk_keys = 100;
    settings.warm_jobs.rate_per_sec = 4_000;
    settings.warm_jobs.concurrency = 50;
    settings.warm_jobs.poll_interval_ms = 20;
    settings.warm_jobs.claim_idle_ms = 1_000;
}

/// [`quick`] on a production instance, whose MySQL is shared by the tests running at the same
/// time on two cores: loads a few at a time, each with room to finish, so that what is counted
/// is the job's bookkeeping rather than a busy database's timeouts.
fn quick_on_mysql(settings: &mut Settings) {
    quick(settings);
    settings.warm_jobs.concurrency = 10;
    settings.http.request_deadline_ms = 5_000;
    settings.http.request_timeout_ms = 6_000;
    settings.timeouts.core_ms = 5_000;
}

fn items(platform: &str, ids: std::ops::RangeInclusive<u64>) -> Vec<Value> {
    ids.map(|id| json!({"platform": platform, "item_id": id.to_string()}))
        .collect()
}

async fn submit(app: &TestApp, items: &[Value]) -> (u16, Value) {
    let response = app
        .client
        .post(format!("{}/admin/v1/warm-jobs", app.admin_url))
        .bearer_auth(&app.admin_token)
        .json(&json!({ "items": items }))
        .send()
        .await
        .expect("the admin listener answers");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

async fn progress(app: &TestApp, job_id: &str) -> (u16, Value) {
    let response = app
        .admin_get(&format!("/admin/v1/warm-jobs/{job_id}"))
        .await;
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

/// The job's progress once it is done (at most 60 s).
async fn finished(app: &TestApp, job_id: &str) -> Value {
    for _ in 0..1_200 {
        let (status, body) = progress(app, job_id).await;
        assert_eq!(status, 200, "{body}");
        if body["state"] == "done" {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("warm job {job_id} not done within 60 s");
}

fn product_loads(apps: &[&TestApp]) -> u64 {
    apps.iter().map(|app| app.product_loads()).sum()
}

/// The embedded profile runs the job in process; a body far over `http.body_limit_bytes` is
/// taken on this route; bad keys and unknown jobs are refused precisely.
#[tokio::test]
async fn the_embedded_profile_runs_a_warm_job_in_process() {
    let app = spawn_app_with(quick).await;
    // 2,000 keys (~90 KB of JSON; every other route takes 64 KiB), one named twice; 101123 and
    // 101623 are delisted.
    let mut keys = items("pdd", 100_001..=102_000);
    keys.push(keys[0].clone());
    let (status, receipt) = submit(&app, &keys).await;
    assert_eq!(status, 202, "{receipt}");
    assert_eq!(receipt["chunks"], 20, "{receipt}");
    assert_eq!(receipt["keys"], 2_000, "{receipt}");
    assert_eq!(receipt["duplicates"], 1, "{receipt}");
    let job_id = receipt["job_id"].as_str().unwrap();
    let done = finished(&app, job_id).await;
    assert_eq!(
        (&done["loaded"], &done["not_found"], &done["failed"]),
        (&json!(1_998), &json!(2), &json!(0)),
        "{done}"
    );
    assert_eq!(done["done_chunks"], 20, "{done}");
    assert_eq!(app.product_loads(), 2_000, "each key loaded once");
    let status: Value = app
        .admin_get("/admin/v1/status")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(status["warm_jobs"]["backend"], "in_process", "{status}");
    assert_eq!(status["warm_jobs"]["chunks_done"], 20, "{status}");
    let metrics = app.metrics_text().await;
    for series in [
        r#"rebate_warm_job_chunks_total{result="done"} 20"#,
        r#"rebate_warm_job_chunks_total{result="claimed"} 0"#,
        r#"rebate_warm_job_keys_total{result="loaded"} 1998"#,
        r#"rebate_warm_job_keys_total{result="not_found"} 2"#,
        r#"rebate_warm_job_keys_total{result="failed"} 0"#,
        "rebate_warm_jobs_paused 0",
    ] {
        assert!(
            metrics.lines().any(|line| line == series),
            "{series} not in the exposition"
        );
    }

    let mut bad = items("jd", 100_001..=100_005);
    bad[3]["platform"] = json!("ebay");
    let (status, body) = submit(&app, &bad).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_platform", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("items[3]") && message.contains("ebay"),
        "{message}"
    );
    let (status, body) = submit(&app, &[]).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (400, &json!("invalid_batch_size"))
    );

    let wrong_method = app.admin_get("/admin/v1/warm-jobs").await;
    assert_eq!(wrong_method.status(), 405);
    let allow = wrong_method
        .headers()
        .get("allow")
        .map(|value| value.to_str().unwrap().to_owned());
    assert_eq!(allow.as_deref(), Some("POST"), "{allow:?}");
    let stranger = app
        .client
        .post(format!("{}/admin/v1/warm-jobs", app.admin_url))
        .json(&json!({"items": keys}))
        .send()
        .await
        .unwrap();
    assert_eq!(stranger.status(), 401, "the token comes first");

    let (status, body) = progress(&app, "0123456789abcdef").await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!("job_not_found"))
    );
    let (status, body) = progress(&app, "not-a-job").await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (400, &json!("invalid_query"))
    );
    app.stop().await;
}

/// 3,000 keys on two instances sharing a Redis stream: both take chunks, and every key is
/// loaded exactly once across the fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_shares_a_warm_job_and_loads_each_key_once() {
    let env = ProductionEnv::new("warm_fleet").await;
    let slower = |settings: &mut Settings| {
        quick_on_mysql(settings);
        // 100-key chunks of 100 ms each: both instances are asking while the other works.
        settings.warm_jobs.rate_per_sec = 1_000;
    };
    let first = env.spawn_instance(slower).await;
    let second = env.spawn_instance(slower).await;
    let (status, receipt) = submit(&first, &items("jd", 100_001..=103_000)).await;
    assert_eq!(status, 202, "{receipt}");
    assert_eq!(receipt["chunks"], 30, "{receipt}");
    let job_id = receipt["job_id"].as_str().unwrap();
    let done = finished(&second, job_id).await;
    // 101123, 101623, 102123 and 102623 are delisted.
    assert_eq!(
        (&done["loaded"], &done["not_found"], &done["failed"]),
        (&json!(2_996), &json!(4), &json!(0)),
        "{done}"
    );
    assert_eq!(product_loads(&[&first, &second]), 3_000, "each key once");
    let (one, other) = (
        first.state.warm_jobs.stats(),
        second.state.warm_jobs.stats(),
    );
    assert_eq!(one.chunks_done + other.chunks_done, 30, "{one:?} {other:?}");
    assert!(
        one.chunks_done > 0 && other.chunks_done > 0,
        "both instances worked: {one:?} {other:?}"
    );
    assert_eq!(
        one.chunks_counted_elsewhere + other.chunks_counted_elsewhere,
        0
    );
    first.stop().await;
    second.stop().await;
    env.clean_up().await;
}

/// A consumer that takes a chunk and dies before acknowledging it: once the chunk has been idle
/// for `claim_idle_ms`, the live instance claims it and the job completes.
#[tokio::test]
async fn a_chunk_left_by_a_dead_consumer_is_claimed_and_done() {
    let env = ProductionEnv::new("warm_claim").await;
    let app = env.spawn_instance(quick_on_mysql).await;
    // While shedding the instance takes no chunk, so the dead consumer gets the first.
    let pinned = app
        .admin_put("/admin/v1/shedding", &json!({"level": "drop_extras"}))
        .await;
    assert_eq!(pinned.status(), 200);
    let (status, receipt) = submit(&app, &items("taobao", 100_001..=100_300)).await;
    assert_eq!(status, 202, "{receipt}");
    let job_id = receipt["job_id"].as_str().unwrap().to_owned();

    let stream = format!("{{{}:warm}}:jobs", env.prefix);
    let client = redis::Client::open(env.redis_url.as_str()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let taken: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(rebate_redis_tier::WARM_GROUP)
        .arg("dead-consumer")
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(
        matches!(taken, redis::Value::Array(ref streams) if !streams.is_empty()),
        "the dead consumer took a chunk: {taken:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, paused) = progress(&app, &job_id).await;
    assert_eq!(
        paused["done_chunks"], 0,
        "nothing runs while shedding: {paused}"
    );
    assert!(app.state.warm_jobs.stats().paused);

    let released = app
        .admin_put("/admin/v1/shedding", &json!({"level": null}))
        .await;
    assert_eq!(released.status(), 200);
    let done = finished(&app, &job_id).await;
    assert_eq!(done["loaded"], 300, "{done}");
    assert_eq!(done["done_chunks"], 3, "{done}");
    let stats = app.state.warm_jobs.stats();
    assert_eq!(stats.chunks_claimed, 1, "{stats:?}");
    assert_eq!(app.product_loads(), 300);
    let (length, pending): (u64, Vec<redis::Value>) = redis::pipe()
        .cmd("XLEN")
        .arg(&stream)
        .cmd("XPENDING")
        .arg(&stream)
        .arg(rebate_redis_tier::WARM_GROUP)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(length, 0, "acknowledged chunks are deleted");
    assert_eq!(pending.first(), Some(&redis::Value::Int(0)), "{pending:?}");
    app.stop().await;
    env.clean_up().await;
}

/// One of two instances stops mid-job: the other finishes every chunk, the stopped one's
/// unacknowledged chunk included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_stopped_mid_job_leaves_no_chunk_undone() {
    let env = ProductionEnv::new("warm_stop").await;
    let paced = |settings: &mut Settings| {
        quick_on_mysql(settings);
        settings.warm_jobs.rate_per_sec = 500;
    };
    let staying = env.spawn_instance(paced).await;
    let leaving = env.spawn_instance(paced).await;
    let (status, receipt) = submit(&staying, &items("pdd", 100_001..=102_000)).await;
    assert_eq!(status, 202, "{receipt}");
    let job_id = receipt["job_id"].as_str().unwrap().to_owned();
    for _ in 0..400 {
        if leaving.state.warm_jobs.stats().chunks_done >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(leaving.state.warm_jobs.stats().chunks_done >= 2);
    leaving.stop().await;
    let done = finished(&staying, &job_id).await;
    assert_eq!(done["done_chunks"], 20, "{done}");
    assert_eq!(
        (&done["loaded"], &done["not_found"], &done["failed"]),
        (&json!(1_998), &json!(2), &json!(0)),
        "{done}"
    );
    staying.stop().await;
    env.clean_up().await;
}
