//! Live rules on real instances: a fleet of three production-profile instances (MariaDB, Redis,
//! RabbitMQ) under load while operators change the coupon quota, canary a bad and a good rule
//! set, and lose the broker; and one embedded instance for a breaker across a threshold change
//! and the documents the admin API refuses.
//!
//! The instances' clocks and tickers follow the wall clock here ([`WallPace`]): canary windows,
//! polls and quotas are about real seconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rebate_tests::amqp::{AmqpFleet, CuttableProxy};
use rebate_tests::{ProductionEnv, TestApp, spawn_app_with, wait_until_true};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use upstream_sim::{Endpoint, Fault};

/// Moves every instance's clock and ticker with the wall clock until dropped.
struct WallPace {
    stop: CancellationToken,
}

impl WallPace {
    fn start(instances: &[&TestApp]) -> Self {
        let stop = CancellationToken::new();
        let handles: Vec<_> = instances
            .iter()
            .map(|app| (app.clock.clone(), app.ticker.clone()))
            .collect();
        let token = stop.clone();
        tokio::spawn(async move {
            let mut last = Instant::now();
            // Bounded: ten minutes at most, and the token ends it with the test.
            for _ in 0..12_000 {
                tokio::select! {
                    () = token.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
                let now = Instant::now();
                for (clock, ticker) in &handles {
                    clock.advance(now - last);
                    ticker.advance(now - last);
                }
                last = now;
            }
        });
        Self { stop }
    }
}

impl Drop for WallPace {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Cold items asked round-robin of `instances` at about `per_sec` a second until stopped (at most
/// `limit` requests); counts every status.
struct ColdLoad {
    stop: CancellationToken,
    statuses: Arc<std::sync::Mutex<std::collections::BTreeMap<u16, u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ColdLoad {
    fn start(instances: &[&TestApp], per_sec: u32, first_id: u64, limit: u64) -> Self {
        let stop = CancellationToken::new();
        let statuses = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
        let targets: Vec<(reqwest::Client, String)> = instances
            .iter()
            .map(|app| (app.client.clone(), app.base_url.clone()))
            .collect();
        let (token, counts) = (stop.clone(), Arc::clone(&statuses));
        let task = tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1) / per_sec);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let requests = tokio_util::task::TaskTracker::new();
            for sent in 0..limit {
                tokio::select! {
                    () = token.cancelled() => break,
                    _ = every.tick() => {}
                }
                let (client, base) = targets[(sent % targets.len() as u64) as usize].clone();
                let counts = Arc::clone(&counts);
                let id = first_id + sent;
                requests.spawn(async move {
                    let status = match client
                        .get(format!("{base}/api/v1/items/jd/{id}/rebate"))
                        .timeout(Duration::from_secs(10))
                        .send()
                        .await
                    {
                        Ok(response) => response.status().as_u16(),
                        Err(_) => 0,
                    };
                    *counts.lock().unwrap().entry(status).or_default() += 1;
                });
            }
            requests.close();
            requests.wait().await;
        });
        Self {
            stop,
            statuses,
            task,
        }
    }

    async fn finish(self) -> std::collections::BTreeMap<u16, u64> {
        self.stop.cancel();
        self.task.await.expect("the load task ends");
        self.statuses.lock().unwrap().clone()
    }
}

fn rule(document: Value, reason: &str) -> Value {
    json!({"document": document, "author": "test", "reason": reason})
}

fn coupon_quota(per_sec: f64) -> Value {
    json!({"resilience": {"coupons": {"quota_per_sec": per_sec}}})
}

async fn create(app: &TestApp, body: &Value) -> u64 {
    let response = app.admin_post("/admin/v1/rules", body).await;
    let status = response.status().as_u16();
    let created: Value = response.json().await.expect("a JSON body");
    assert_eq!(status, 201, "{created}");
    created["version"].as_u64().expect("a version")
}

/// The version each instance reports applied, as its admin API answers.
async fn applied_versions(instances: &[&TestApp]) -> Vec<u64> {
    let mut versions = Vec::new();
    for app in instances {
        let overview: Value = app
            .admin_get("/admin/v1/rules")
            .await
            .json()
            .await
            .expect("a JSON body");
        versions.push(
            overview["this_instance"]["applied_version"]
                .as_u64()
                .unwrap_or(0),
        );
    }
    versions
}

/// Creates `body` on the first instance and waits (at most `patience`) until every instance
/// reports it applied; the time from the request to the last report.
async fn apply_and_time(
    instances: &[&TestApp],
    body: &Value,
    patience: Duration,
) -> (u64, Duration) {
    let started = Instant::now();
    let version = create(instances[0], body).await;
    loop {
        if applied_versions(instances)
            .await
            .iter()
            .all(|&v| v == version)
        {
            return (version, started.elapsed());
        }
        assert!(
            started.elapsed() < patience,
            "version {version} not applied everywhere within {patience:?}: {:?}",
            applied_versions(instances).await
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Creates `body` on `app` and waits until `app` runs it; its version.
async fn applied_here(app: &TestApp, body: &Value) -> u64 {
    let version = create(app, body).await;
    wait_until_true("the version is applied", || async {
        app.state.rules.applied().version == version
    })
    .await;
    version
}

/// The version's row once it has left `canary` (at most `patience`).
async fn decided(app: &TestApp, version: u64, patience: Duration) -> Value {
    let started = Instant::now();
    loop {
        let row: Value = app
            .admin_get(&format!("/admin/v1/rules/{version}"))
            .await
            .json()
            .await
            .unwrap();
        if row["state"] != "canary" {
            return row;
        }
        assert!(
            started.elapsed() < patience,
            "no verdict within {patience:?}: {row}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn percentile(sorted: &[Duration], share: f64) -> Duration {
    let index = ((sorted.len() as f64 * share).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index]
}

/// Settings of a fleet member: its own instance id (the fleet's report rows are per id), and
/// the coupon API's contract of 45/s + 5 (the tests' default has no quota).
fn member(index: usize, settings: &mut query_api::Settings) {
    settings.observability.instance_id = format!("member-{index}");
    settings.http.max_connections_per_peer = 0;
    settings.resilience.coupons.quota_per_sec = Some(45.0);
    settings.resilience.coupons.quota_burst = Some(5);
}

/// The coupon quota lowered from 45 to 10 a second and raised back while three instances serve
/// cold items at four times the lower quota: every instance reports each new version, the
/// coupon API sees at most the new contract (10 + a burst of 5) in any second after the lower
/// one is in force, and nothing answers a 5xx other than 503. Then 18 more changes, for the
/// apply latency over 20 (printed for docs/BENCHMARKS.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_change_reaches_every_instance_and_the_new_contract_holds_at_once() {
    let mut env = ProductionEnv::new("rules-quota").await;
    let simulator = env.share_simulator().await;
    let fleet = AmqpFleet::spawn(&env, "rules-quota", 3, |index, settings| {
        member(index, settings);
        settings.resilience.fleet.quotas = true;
        settings.resilience.fleet.heartbeat_ms = 200;
        // One call per cold item: the calls are the items.
        settings.upstreams.coupons_batch_max_items = 1;
    })
    .await;
    let instances: Vec<&TestApp> = fleet.instances.iter().collect();
    let _pace = WallPace::start(&instances);
    let load = ColdLoad::start(&instances, 40, 100_001, 60 * 40);
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut latencies = Vec::new();
    let (lowered, took) = apply_and_time(
        &instances,
        &rule(coupon_quota(10.0), "the affiliate cut the contract to 15/s"),
        Duration::from_secs(10),
    )
    .await;
    latencies.push(took);
    // Calls granted before the last instance applied it may still be on the wire.
    tokio::time::sleep(Duration::from_millis(300)).await;
    simulator.reset_counters();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let under_contract = simulator.counters(Endpoint::Coupons);
    assert!(
        under_contract.peak_calls_per_sec <= 15,
        "the coupon API saw {} calls in one second under a contract of 10/s + 5 (version {lowered})",
        under_contract.peak_calls_per_sec
    );
    assert!(
        under_contract.calls >= 20,
        "the load reached the API: {under_contract:?}"
    );

    let (_, took) = apply_and_time(
        &instances,
        &rule(coupon_quota(45.0), "the contract is back to 50/s"),
        Duration::from_secs(10),
    )
    .await;
    latencies.push(took);
    for change in 0..18 {
        let per_sec = if change % 2 == 0 { 30.0 } else { 45.0 };
        let (_, took) = apply_and_time(
            &instances,
            &rule(coupon_quota(per_sec), "latency round"),
            Duration::from_secs(10),
        )
        .await;
        latencies.push(took);
    }
    let statuses = load.finish().await;
    let failures: Vec<_> = statuses
        .iter()
        .filter(|(status, _)| **status >= 500 && **status != 503 || **status == 0)
        .collect();
    assert!(
        failures.is_empty(),
        "answers other than 503 among the 5xx: {statuses:?}"
    );
    latencies.sort();
    eprintln!(
        "rules apply latency over {} changes under load: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; statuses {statuses:?}",
        latencies.len(),
        percentile(&latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.last().unwrap().as_secs_f64() * 1e3,
    );
    fleet.stop().await;
    env.clean_up().await;
}

/// A rule set that breaks the coupon part (a 5 ms attempt timeout against an API answering in
/// 30 ms) goes to one canary under load: the verdict rolls it back before its window ends, on
/// figures the history shows, and the other instances never run it. A harmless one is promoted
/// when its window ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_canary_is_rolled_back_by_its_figures_and_a_good_one_promoted() {
    let mut env = ProductionEnv::new("rules-canary").await;
    let simulator = env.share_simulator().await;
    simulator
        .set_fault(
            Endpoint::Coupons,
            Fault {
                latency_ms: 30,
                ..Fault::default()
            },
        )
        .unwrap();
    let fleet = AmqpFleet::spawn(&env, "rules-canary", 3, |index, settings| {
        member(index, settings);
        settings.rules.poll_interval_ms = 500;
        settings.rules.canary.min_requests = 30;
    })
    .await;
    let instances: Vec<&TestApp> = fleet.instances.iter().collect();
    let _pace = WallPace::start(&instances);
    let load = ColdLoad::start(&instances, 45, 104_001, 120 * 45);
    // Every instance reports before the rollout picks its canary.
    wait_until_true("every instance reports", || async {
        let overview: Value = instances[0]
            .admin_get("/admin/v1/rules")
            .await
            .json()
            .await
            .unwrap();
        overview["instances"]
            .as_array()
            .is_some_and(|all| all.len() == 3)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let canary = instances[1].state.rules.instance_id().to_owned();
    let mut bad = rule(
        json!({"parts": {"coupons": {"timeout_ms": 5}}}),
        "a tighter coupon timeout",
    );
    bad["rollout"] = json!({"instances": [canary], "observe_secs": 60});
    let version = create(instances[0], &bad).await;
    // Watch the others every 20 ms: they must never run it.
    let others_ran = Arc::new(AtomicBool::new(false));
    let watching = CancellationToken::new();
    let watcher = {
        let (others_ran, stop) = (Arc::clone(&others_ran), watching.clone());
        let others = [
            fleet.instances[0].state.clone(),
            fleet.instances[2].state.clone(),
        ];
        tokio::spawn(async move {
            for _ in 0..10_000 {
                if others
                    .iter()
                    .any(|state| state.rules.applied().version == version)
                {
                    others_ran.store(true, Ordering::SeqCst);
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
        })
    };
    let canary_ran = AtomicU64::new(0);
    let waiting = Instant::now();
    let row = loop {
        if instances[1].state.rules.applied().version == version {
            canary_ran.store(version, Ordering::SeqCst);
        }
        let row: Value = instances[0]
            .admin_get(&format!("/admin/v1/rules/{version}"))
            .await
            .json()
            .await
            .unwrap();
        if row["state"] != "canary" {
            break row;
        }
        assert!(
            waiting.elapsed() < Duration::from_secs(90),
            "no verdict: {row}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    watching.cancel();
    watcher.await.unwrap();
    assert_eq!(row["state"], "rolled_back", "{row}");
    assert_eq!(
        canary_ran.load(Ordering::SeqCst),
        version,
        "the canary ran it"
    );
    assert!(
        !others_ran.load(Ordering::SeqCst),
        "only the canary may run it"
    );
    let verdict = &row["verdict"];
    assert_eq!(verdict["decision"], "roll_back", "{verdict}");
    assert_eq!(verdict["by"], "auto");
    assert_eq!(verdict["baseline"], "fleet");
    let rollout = &row["rollout"];
    assert!(
        verdict["decided_at_ms"].as_i64().unwrap()
            < rollout["started_at_ms"].as_i64().unwrap() + 60_000,
        "decided within the window: {row}"
    );
    assert!(
        verdict["canary"]["requests"].as_u64().unwrap() >= 30,
        "decided on traffic: {verdict}"
    );
    // The history shows the same figures.
    let history: Value = instances[2]
        .admin_get("/admin/v1/rules/history")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(history[0]["version"].as_u64(), Some(version));
    assert_eq!(&history[0]["verdict"], verdict);
    wait_until_true("the canary is back on the file's values", || async {
        instances[1].state.rules.applied().version == 0
    })
    .await;

    let mut good = rule(
        json!({"resilience": {"retry": {"ratio": 0.2}}}),
        "more retries for the sale",
    );
    // On another instance: the first canary's coupon breaker may still be open on its
    // cool-down, and those degraded answers would count against this one.
    let second_canary = instances[2].state.rules.instance_id().to_owned();
    good["rollout"] = json!({"instances": [second_canary], "observe_secs": 8});
    let good_version = create(instances[0], &good).await;
    let row = decided(instances[0], good_version, Duration::from_secs(60)).await;
    assert_eq!(row["state"], "active", "{row}");
    assert_eq!(row["verdict"]["decision"], "promote", "{row}");
    wait_until_true("the promoted version runs everywhere", || async {
        applied_versions(&instances)
            .await
            .iter()
            .all(|&applied| applied == good_version)
    })
    .await;
    load.finish().await;
    fleet.stop().await;
    env.clean_up().await;
}

/// With the broker gone for every instance, a change reaches them all by their polls; an
/// instance started afterwards runs the active version before it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_broker_a_change_arrives_by_poll_and_a_new_instance_starts_on_it() {
    let env = ProductionEnv::new("rules-poll").await;
    let broker: std::net::SocketAddr = "127.0.0.1:5672".parse().unwrap();
    let proxies = [
        CuttableProxy::start(broker).await,
        CuttableProxy::start(broker).await,
        CuttableProxy::start(broker).await,
    ];
    let urls: Vec<String> = proxies.iter().map(CuttableProxy::url).collect();
    let fleet = AmqpFleet::spawn(&env, "rules-poll", 3, |index, settings| {
        member(index, settings);
        settings.events.amqp.url = urls[index].clone();
        settings.rules.poll_interval_ms = 1_000;
    })
    .await;
    let instances: Vec<&TestApp> = fleet.instances.iter().collect();
    let _pace = WallPace::start(&instances);
    for proxy in &proxies {
        proxy.cut();
    }
    wait_until_true("every instance sees the broker gone", || async {
        instances.iter().all(|app| !app.state.events.is_ready())
    })
    .await;
    let (version, took) = apply_and_time(
        &instances,
        &rule(coupon_quota(20.0), "changed while the broker is down"),
        Duration::from_secs(3),
    )
    .await;
    eprintln!(
        "with the broker down, every instance ran version {version} after {took:?} (poll 1 s)"
    );

    let late = env.spawn_instance(|settings| member(3, settings)).await;
    assert_eq!(
        late.state.rules.applied().version,
        version,
        "a starting instance applies the active version before it serves"
    );
    assert_eq!(
        late.state
            .protection
            .coupons
            .snapshot()
            .quota
            .map(|quota| quota.per_second),
        Some(20.0)
    );
    late.stop().await;
    fleet.stop().await;
    env.clean_up().await;
}

/// An open breaker stays open, on its own cool-down, when its thresholds change.
#[tokio::test]
async fn a_breaker_keeps_its_open_state_across_a_threshold_change() {
    let app = spawn_app_with(|settings| {
        settings.resilience.coupons.min_calls = Some(5);
        settings.resilience.coupons.retry = false;
    })
    .await;
    app.break_upstream(Endpoint::Coupons);
    for id in 0..20u64 {
        app.get_item("jd", &(500 + id).to_string()).await;
    }
    let state_of =
        |status: &Value| status["protection"]["dependencies"][2]["breaker"]["state"].clone();
    let status: Value = app
        .admin_get("/admin/v1/status")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        state_of(&status),
        "open",
        "{}",
        status["protection"]["dependencies"][2]
    );
    let version = applied_here(
        &app,
        &rule(
            json!({"resilience": {"coupons": {"min_calls": 50, "failure_ratio": 0.9}}}),
            "calmer breaker",
        ),
    )
    .await;
    let status: Value = app
        .admin_get("/admin/v1/status")
        .await
        .json()
        .await
        .unwrap();
    let coupons = &status["protection"]["dependencies"][2];
    assert_eq!(state_of(&status), "open", "{coupons}");
    assert_eq!(coupons["breaker_thresholds"]["min_calls"], 50, "{coupons}");
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains(&format!("rebate_rules_version {version}")),
        "{metrics}"
    );
    assert!(
        metrics.contains("rebate_rules_applied_total{outcome=\"applied\"} 1"),
        "{metrics}"
    );
    app.stop().await;
}

/// Twenty-odd wrong requests are 400s that name the field, and none of them changes anything.
#[tokio::test]
async fn invalid_rule_sets_are_refused_naming_the_field_and_change_nothing() {
    let app = spawn_app_with(|settings| {
        settings.rules.max_document_bytes = 4096;
        settings.resilience.coupons.quota_per_sec = Some(45.0);
        settings.resilience.coupons.quota_burst = Some(5);
    })
    .await;
    let big = "x".repeat(5000);
    let in_days = |days: f64| {
        rebate_domain::Timestamp::now()
            .saturating_add_millis((days * 86_400_000.0) as u64)
            .to_rfc3339()
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            rule(json!({"resilience": {"coupons": {"bogus": 1}}}), "x"),
            "resilience.coupons.bogus",
        ),
        (
            rule(json!({"http": {"listen": "0.0.0.0:80"}}), "x"),
            "http.listen",
        ),
        (
            rule(json!({"http": {"request_deadline_ms": 10}}), "x"),
            "http.request_deadline_ms",
        ),
        (
            rule(coupon_quota(60.0), "x"),
            "resilience.coupons.quota_per_sec",
        ),
        (
            rule(json!({"resilience": {"coupons": {"quota_burst": 9}}}), "x"),
            "resilience.coupons.quota_burst",
        ),
        (
            rule(
                json!({"resilience": {"coupons": {"quota_per_sec": "ten"}}}),
                "x",
            ),
            "resilience.coupons.quota_per_sec",
        ),
        (rule(json!({}), "x"), "document"),
        (rule(json!([]), "x"), "document"),
        (rule(json!({"warmup": {"x": big}}), "x"), "document"),
        (rule(json!({"resilience": {}}), "x"), "resilience"),
        (rule(json!({"resilience": 1}), "x"), "resilience"),
        (
            rule(
                json!({"parts": {"coupons": {"timeout_class": "slow"}}}),
                "x",
            ),
            "parts.coupons.timeout_class",
        ),
        (
            rule(
                json!({"resilience": {"shedding": {"pinned_level": 7}}}),
                "x",
            ),
            "resilience.shedding.pinned_level",
        ),
        (
            rule(
                json!({"resilience": {"shedding": {"thresholds": [0.5]}}}),
                "x",
            ),
            "resilience.shedding.thresholds",
        ),
        (
            rule(json!({"resilience": {"mysql": {"quota_per_sec": 5}}}), "x"),
            "resilience.mysql.quota_per_sec",
        ),
        (
            rule(
                json!({"resilience": {"admission_wait": {"prefetch_max_wait_ms": 5000}}}),
                "x",
            ),
            "resilience.admission_wait.prefetch_max_wait_ms",
        ),
        (rule(coupon_quota(10.0), " "), "reason"),
        (
            json!({"document": coupon_quota(10.0), "author": "", "reason": "r"}),
            "author",
        ),
        (
            {
                let mut body = rule(coupon_quota(10.0), "r");
                body["rollout"] = json!({"canary": 5});
                body
            },
            "rollout.canary",
        ),
        (
            {
                let mut body = rule(coupon_quota(10.0), "r");
                body["rollout"] = json!({"canary": 1, "observe_secs": 999_999});
                body
            },
            "rollout.observe_secs",
        ),
        (
            {
                let mut body = rule(coupon_quota(10.0), "r");
                body["schedule"] = json!({"from": in_days(3.0), "until": in_days(2.0)});
                body
            },
            "schedule.until",
        ),
    ];
    assert!(cases.len() >= 20);
    for (body, field) in &cases {
        let response = app.admin_post("/admin/v1/rules", body).await;
        let status = response.status().as_u16();
        let error: Value = response.json().await.unwrap();
        assert_eq!(status, 400, "{body}: {error}");
        assert_eq!(error["error"]["code"], "invalid_rule", "{body}: {error}");
        assert_eq!(error["error"]["field"], *field, "{body}: {error}");
    }
    // An overlapping schedule, against one that was accepted.
    let mut sale = rule(coupon_quota(20.0), "sale");
    sale["schedule"] = json!({"from": in_days(2.0), "until": in_days(2.2)});
    let scheduled = create(&app, &sale).await;
    let mut overlapping = rule(coupon_quota(30.0), "sale again");
    overlapping["schedule"] = json!({"from": in_days(2.1), "until": in_days(2.5)});
    let response = app.admin_post("/admin/v1/rules", &overlapping).await;
    assert_eq!(response.status().as_u16(), 400);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["field"], "schedule", "{error}");
    // Nothing but the accepted schedule was stored, and nothing was applied.
    let history: Value = app
        .admin_get("/admin/v1/rules/history")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(history.as_array().map(Vec::len), Some(1), "{history}");
    assert_eq!(history[0]["version"].as_u64(), Some(scheduled));
    assert_eq!(history[0]["state"], "scheduled");
    assert_eq!(app.state.rules.applied().version, 0);
    // A dry run changes nothing either.
    let response = app
        .admin_post(
            "/admin/v1/rules?dry_run=true",
            &rule(coupon_quota(10.0), "try"),
        )
        .await;
    assert_eq!(response.status().as_u16(), 200);
    let dry: Value = response.json().await.unwrap();
    assert_eq!(
        dry["diff"][0]["key"], "resilience.coupons.quota_per_sec",
        "{dry}"
    );
    let history: Value = app
        .admin_get("/admin/v1/rules/history")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(history.as_array().map(Vec::len), Some(1));
    app.stop().await;
}

/// A rule set pins a shed level and releases it; a version that leaves the pin as it was does
/// not release a level an operator pinned for a drill.
#[tokio::test]
async fn a_rule_set_s_pin_moves_the_shed_level_only_when_it_changes() {
    let app = spawn_app_with(|_| {}).await;
    let forced = |status: &Value| status["protection"]["shedding"]["forced"].clone();
    let status = || async {
        app.admin_get("/admin/v1/status")
            .await
            .json::<Value>()
            .await
            .unwrap()
    };
    let drill = app
        .admin_put("/admin/v1/shedding", &json!({"level": "cache_only"}))
        .await;
    assert!(drill.status().is_success(), "{}", drill.status());
    applied_here(
        &app,
        &rule(
            json!({"resilience": {"retry": {"ratio": 0.2}}}),
            "unrelated",
        ),
    )
    .await;
    assert_eq!(
        forced(&status().await),
        "cache_only",
        "the drill's pin stays"
    );

    applied_here(
        &app,
        &rule(
            json!({"resilience": {"shedding": {"pinned_level": 1}}}),
            "sale's first minutes",
        ),
    )
    .await;
    assert_eq!(forced(&status().await), "drop_extras");

    applied_here(
        &app,
        &rule(
            json!({"resilience": {"shedding": {"pinned_level": null}}}),
            "back to the measured level",
        ),
    )
    .await;
    assert_eq!(forced(&status().await), Value::Null);
    app.stop().await;
}
