//! `/metrics` on the admin listener, against the real service: the exposition is valid
//! OpenMetrics text, and known traffic moves exactly the numbers it should.

use std::collections::{BTreeMap, HashMap};

use std::time::Duration;

use rebate_tests::{ProductionEnv, TestApp, spawn_app};
use serde_json::json;
use upstream_sim::Endpoint;

const SINGLE_ROUTE: &str = "/api/v1/items/{platform}/{item_id}/rebate";
const BATCH_ROUTE: &str = "/api/v1/items:batch";
const REQUESTS: &str = "rebate_http_request_duration_seconds";

type Labels = BTreeMap<String, String>;

/// One scrape, parsed strictly.
#[derive(Debug)]
struct Exposition {
    /// Family name → type, from `# TYPE`.
    types: HashMap<String, String>,
    samples: Vec<(String, Labels, f64)>,
}

impl Exposition {
    /// Parses OpenMetrics text, refusing anything malformed: every sample is
    /// `name{labels} value` with a float value and belongs to the family whose `# TYPE` came last
    /// (with the suffixes its type allows); every family is typed once; the text ends with
    /// `# EOF`.
    fn parse(text: &str) -> Self {
        let body = text
            .strip_suffix("# EOF\n")
            .unwrap_or_else(|| panic!("the exposition must end with `# EOF`:\n{text}"));
        let mut types = HashMap::new();
        let mut current: Option<(String, String)> = None;
        let mut samples = Vec::new();
        for line in body.lines() {
            if let Some(comment) = line.strip_prefix("# ") {
                let (keyword, rest) = comment.split_once(' ').expect("`# KEYWORD name …`");
                let (name, value) = rest.split_once(' ').unwrap_or((rest, ""));
                assert!(valid_name(name), "bad metric name in {line:?}");
                match keyword {
                    "HELP" => {}
                    "UNIT" => assert!(name.ends_with(&format!("_{value}")), "{line:?}"),
                    "TYPE" => {
                        assert!(
                            [
                                "counter",
                                "gauge",
                                "histogram",
                                "info",
                                "unknown",
                                "summary",
                                "stateset",
                                "gaugehistogram"
                            ]
                            .contains(&value),
                            "unknown type in {line:?}"
                        );
                        let previous = types.insert(name.to_owned(), value.to_owned());
                        assert!(previous.is_none(), "{name} typed twice");
                        current = Some((name.to_owned(), value.to_owned()));
                    }
                    other => panic!("unknown comment keyword {other:?} in {line:?}"),
                }
                continue;
            }
            let (name, labels, value) = parse_sample(line);
            let (family, kind) = current
                .as_ref()
                .unwrap_or_else(|| panic!("sample before any # TYPE: {line:?}"));
            let suffix = name
                .strip_prefix(family.as_str())
                .unwrap_or_else(|| panic!("{line:?} outside its family {family}"));
            let allowed: &[&str] = match kind.as_str() {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                "info" => &["_info"],
                _ => &[""],
            };
            assert!(
                allowed.contains(&suffix),
                "{line:?}: suffix {suffix:?} not allowed for a {kind}"
            );
            if suffix == "_bucket" {
                assert!(labels.contains_key("le"), "bucket without le: {line:?}");
            }
            samples.push((name, labels, value));
        }
        Self { types, samples }
    }

    /// The sample with exactly these labels.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let wanted: Labels = labels
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        self.samples
            .iter()
            .find(|(sample, labels, _)| sample == name && *labels == wanted)
            .map(|(_, _, value)| *value)
    }

    /// The sum over every sample of `name` whose labels include these.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(sample, sample_labels, _)| {
                sample == name
                    && labels.iter().all(|(key, value)| {
                        sample_labels.get(*key).map(String::as_str) == Some(value)
                    })
            })
            .map(|(_, _, value)| value)
            .sum()
    }

    fn requests(&self, route: &str, status: &str) -> f64 {
        self.sum(
            &format!("{REQUESTS}_count"),
            &[("route", route), ("status", status)],
        )
    }

    fn answers(&self, outcome: &str) -> f64 {
        self.value("rebate_answers_total", &[("outcome", outcome)])
            .unwrap_or_else(|| panic!("rebate_answers_total{{outcome={outcome:?}}} missing"))
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_' || first == ':')
        && chars.all(|rest| rest.is_ascii_alphanumeric() || rest == '_' || rest == ':')
}

/// `name{key="value",…} value`, with `\\`, `\"` and `\n` escapes in label values.
fn parse_sample(line: &str) -> (String, Labels, f64) {
    let name_end = line
        .find(['{', ' '])
        .unwrap_or_else(|| panic!("no value in {line:?}"));
    let name = &line[..name_end];
    assert!(valid_name(name), "bad metric name in {line:?}");
    let mut labels = Labels::new();
    let mut rest = &line[name_end..];
    if let Some(mut inside) = rest.strip_prefix('{') {
        loop {
            if let Some(after) = inside.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, after_key) = inside
                .split_once("=\"")
                .unwrap_or_else(|| panic!("bad label in {line:?}"));
            assert!(valid_name(key), "bad label name {key:?} in {line:?}");
            let mut value = String::new();
            let mut chars = after_key.char_indices();
            let end = loop {
                match chars.next() {
                    Some((index, '"')) => break index,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, '\\')) => value.push('\\'),
                        Some((_, '"')) => value.push('"'),
                        Some((_, 'n')) => value.push('\n'),
                        other => panic!("bad escape {other:?} in {line:?}"),
                    },
                    Some((_, other)) => value.push(other),
                    None => panic!("unterminated label value in {line:?}"),
                }
            };
            assert!(
                labels.insert(key.to_owned(), value).is_none(),
                "label {key} twice in {line:?}"
            );
            inside = &after_key[end + 1..];
            inside = inside.strip_prefix(',').unwrap_or(inside);
        }
    }
    let value = rest
        .strip_prefix(' ')
        .unwrap_or_else(|| panic!("no space before the value in {line:?}"));
    let value = match value {
        "NaN" => f64::NAN,
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        number => number
            .parse()
            .unwrap_or_else(|_| panic!("value {number:?} is not a float in {line:?}")),
    };
    (name.to_owned(), labels, value)
}

async fn scrape(app: &TestApp) -> Exposition {
    let response = app
        .client
        .get(format!("{}/metrics", app.admin_url))
        .send()
        .await
        .expect("request reaches the admin listener");
    assert_eq!(response.status(), 200);
    Exposition::parse(&response.text().await.unwrap())
}

#[tokio::test]
async fn metrics_are_served_without_a_token_as_valid_openmetrics_text() {
    let app = spawn_app().await;
    let response = app
        .client
        .get(format!("{}/metrics", app.admin_url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let metrics = Exposition::parse(&response.text().await.unwrap());
    // Nothing answered yet: nothing has failed either.
    assert_eq!(
        metrics.value("rebate_business_success_ratio", &[]),
        Some(1.0)
    );
    assert_eq!(metrics.value("rebate_shed_level", &[]), Some(0.0));
    // The accept queue is read by the shedder's probe every 10 ms; at rest it is empty.
    if cfg!(target_os = "linux") {
        assert_eq!(
            metrics.value("rebate_listen_queue_connections", &[]),
            Some(0.0)
        );
        let backlog = metrics.value("rebate_listen_queue_backlog", &[]);
        assert!(
            backlog.is_some_and(|backlog| backlog >= 128.0),
            "{backlog:?}"
        );
    }

    // Families with labels appear with their first sample.
    assert_eq!(app.get_item("jd", "100001").await.status(), 200);
    let metrics = scrape(&app).await;
    for (family, kind) in [
        (REQUESTS, "histogram"),
        ("rebate_dependency_call_duration_seconds", "histogram"),
        ("rebate_answers", "counter"),
        ("rebate_business_success_ratio", "gauge"),
        ("rebate_answer_ratio", "gauge"),
        ("rebate_cache_lookups", "counter"),
        ("rebate_cache_single_flight_joins", "counter"),
        ("rebate_cache_entries", "gauge"),
        ("rebate_rendered_quotes_served", "counter"),
        ("rebate_rendered_quotes_bytes", "gauge"),
        ("rebate_breaker_state", "gauge"),
        ("rebate_bulkhead_in_flight", "gauge"),
        ("rebate_shed_level", "gauge"),
        ("rebate_client_limit_refused", "counter"),
        ("rebate_events", "counter"),
        ("rebate_http_connections", "counter"),
        ("rebate_http_connections_open", "gauge"),
        ("rebate_listen_queue_connections", "gauge"),
        ("rebate_listen_queue_wait_seconds", "gauge"),
        ("rebate_listen_queue_drops", "counter"),
    ] {
        assert_eq!(
            metrics.types.get(family).map(String::as_str),
            Some(kind),
            "{family}"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn known_traffic_moves_exactly_the_numbers_it_should() {
    let app = spawn_app().await;
    let before = scrape(&app).await;

    // One item three times (a cold miss, then two answers from its kept rendering), one unknown
    // item, one batch of two.
    for _ in 0..3 {
        let response = app.get_item("jd", "100001").await;
        assert_eq!(response.status(), 200);
    }
    assert_eq!(app.get_item("jd", "999999999").await.status(), 404);
    let batch = app
        .post_batch(&json!({"items": [
            {"platform": "jd", "item_id": "100002"},
            {"platform": "jd", "item_id": "100003"},
        ]}))
        .await;
    assert_eq!(batch.status(), 200);
    let after = scrape(&app).await;

    assert_eq!(after.requests(SINGLE_ROUTE, "200"), 3.0);
    assert_eq!(after.requests(SINGLE_ROUTE, "404"), 1.0);
    assert_eq!(after.requests(BATCH_ROUTE, "200"), 1.0);
    // The histogram's buckets add up to its count.
    assert_eq!(
        after.sum(
            &format!("{REQUESTS}_bucket"),
            &[
                ("route", SINGLE_ROUTE),
                ("status", "200"),
                ("degraded", "false"),
                ("le", "+Inf")
            ]
        ),
        3.0
    );
    // No raw path ever becomes a label.
    assert!(
        after
            .samples
            .iter()
            .all(|(_, labels, _)| labels.values().all(|value| !value.contains("100001"))),
        "a raw path leaked into a label"
    );

    assert_eq!(
        after.answers("complete") - before.answers("complete"),
        5.0,
        "three singles and two batch lines"
    );
    // The unknown item's 404 is a correct answer, not a failure.
    assert_eq!(
        after.answers("not_found") - before.answers("not_found"),
        1.0
    );
    assert_eq!(after.answers("failed"), before.answers("failed"));
    assert_eq!(after.answers("degraded"), before.answers("degraded"));
    let ratio = after.value("rebate_business_success_ratio", &[]).unwrap();
    assert!((ratio - 1.0).abs() < 1e-9, "{ratio}");
    assert_eq!(
        after.value("rebate_answer_ratio", &[("outcome", "failed")]),
        Some(0.0)
    );

    let product_l1_hits = |metrics: &Exposition| {
        metrics
            .value(
                "rebate_cache_lookups_total",
                &[("part", "product"), ("tier", "l1"), ("result", "hit")],
            )
            .unwrap()
    };
    // The two warm single reads are answered from the kept rendering, without any part lookup.
    let rendered_served = |metrics: &Exposition| {
        metrics
            .value("rebate_rendered_quotes_served_total", &[])
            .unwrap_or(0.0)
    };
    assert_eq!(
        rendered_served(&after) - rendered_served(&before),
        2.0,
        "the two warm reads were served from the rendering"
    );
    // One rendering kept per item answered complete: 100001 and the batch's two.
    let rendered_kept = |metrics: &Exposition| {
        metrics
            .value("rebate_rendered_quotes_kept_total", &[])
            .unwrap_or(0.0)
    };
    assert_eq!(rendered_kept(&after) - rendered_kept(&before), 3.0);
    assert!(after.value("rebate_rendered_quotes_bytes", &[]).unwrap() > 0.0);
    // Every product lookup was a cold item's miss.
    assert_eq!(product_l1_hits(&after), product_l1_hits(&before));
    // No Redis in the embedded profile: no L2 series, rather than zeros that read as misses.
    assert_eq!(
        after.sum("rebate_cache_lookups_total", &[("tier", "l2")]),
        0.0
    );
    assert!(!after.types.contains_key("rebate_cache_leases"));
    // One coupon call per item asked alone, the unknown one's included (an item's four parts
    // load together), and one for the batch's two.
    let coupon_successes = |metrics: &Exposition| {
        metrics.sum(
            "rebate_dependency_call_duration_seconds_count",
            &[("dependency", "coupons"), ("outcome", "success")],
        )
    };
    assert_eq!(coupon_successes(&after) - coupon_successes(&before), 3.0);
    assert_eq!(
        after.value("rebate_breaker_state", &[("dependency", "coupons")]),
        Some(0.0)
    );

    let forced = app
        .admin_put("/admin/v1/shedding", &json!({"level": "cache_only"}))
        .await;
    assert_eq!(forced.status(), 200);
    let shedding = scrape(&app).await;
    assert_eq!(shedding.value("rebate_shed_level", &[]), Some(3.0));
    assert_eq!(shedding.value("rebate_shed_forced", &[]), Some(1.0));
    app.stop().await;
}

#[tokio::test]
async fn a_coupon_outage_shows_as_degraded_answers_and_a_lower_success_ratio() {
    let app = spawn_app().await;
    assert_eq!(app.get_item("taobao", "100001").await.status(), 200);
    let before = scrape(&app).await;
    assert_eq!(
        before.value("rebate_business_success_ratio", &[]),
        Some(1.0)
    );

    app.break_upstream(Endpoint::Coupons);
    let response = app.get_item("taobao", "100002").await;
    assert_eq!(response.status(), 200);
    let quote: serde_json::Value = response.json().await.unwrap();
    assert_eq!(quote["degraded"], true, "{quote}");
    let after = scrape(&app).await;

    assert_eq!(after.answers("degraded") - before.answers("degraded"), 1.0);
    // One answer complete and one degraded.
    let ratio = after.value("rebate_business_success_ratio", &[]).unwrap();
    assert!((ratio - 0.5).abs() < 1e-9, "{ratio}");
    assert_eq!(
        after.sum(
            &format!("{REQUESTS}_count"),
            &[
                ("route", SINGLE_ROUTE),
                ("status", "200"),
                ("degraded", "true")
            ]
        ),
        1.0
    );
    // The cold item's one coupon call failed and was not retried: the retry budget saves a tenth
    // of a retry per first attempt, and two first attempts make no whole one.
    let coupon_errors = |metrics: &Exposition| {
        metrics.sum(
            "rebate_dependency_call_duration_seconds_count",
            &[("dependency", "coupons"), ("outcome", "error")],
        )
    };
    assert_eq!(coupon_errors(&after) - coupon_errors(&before), 1.0);
    app.stop().await;
}

#[tokio::test]
async fn admin_endpoints_still_need_the_token_while_probes_and_metrics_do_not() {
    let app = spawn_app().await;
    let status_url = format!("{}/admin/v1/status", app.admin_url);
    assert_eq!(
        app.client.get(&status_url).send().await.unwrap().status(),
        401
    );
    let wrong = app
        .client
        .get(&status_url)
        .bearer_auth("not-the-token")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    assert_eq!(app.admin_get("/admin/v1/status").await.status(), 200);
    for path in ["/metrics", "/healthz", "/readyz"] {
        let response = app
            .client
            .get(format!("{}{path}", app.admin_url))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
    }
    app.stop().await;
}

/// The production profile adds the L2 series (lookups, leases, errors) and the Bloom filter's.
#[tokio::test]
async fn with_redis_and_the_bloom_filter_their_series_appear() {
    let env = ProductionEnv::new("metrics_l2").await;
    let app = env
        .spawn_instance(|settings| {
            settings.http.request_deadline_ms = 5_000;
            settings.http.request_timeout_ms = 6_000;
        })
        .await;
    let filter = app
        .state
        .engine
        .item_filter()
        .expect("bloom enabled")
        .clone();
    for _ in 0..200 {
        if filter.is_ready() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(filter.is_ready(), "the bloom filter is built within 10 s");

    // Five unknown ids the filter rejects: it is seeded at random, so about one id in a thousand
    // passes it (a false positive, which goes on to L2 and the store); those are left out here,
    // so that every count below is exact. Asking the filter counts, so the rejections are read
    // as a difference from after this.
    let unknown: Vec<String> = (0..)
        .map(|index: u64| (900_000_000_000 + index * 7_919).to_string())
        .filter(|id| !filter.might_contain(&rebate_domain::ItemKey::parse("jd", id).unwrap()))
        .take(5)
        .collect();
    let before = scrape(&app).await;

    assert_eq!(app.get_item("jd", "100001").await.status(), 200);
    for id in &unknown {
        assert_eq!(app.get_item("jd", id).await.status(), 404);
    }
    let metrics = scrape(&app).await;
    let lookups = |tier: &str, result: &str| {
        metrics.value(
            "rebate_cache_lookups_total",
            &[("part", "product"), ("tier", tier), ("result", result)],
        )
    };
    // The cold item missed L2 and its rebuild took a lease; the unknown ids never got that far.
    assert_eq!(lookups("l2", "miss"), Some(1.0), "the cold item missed L2");
    assert_eq!(lookups("l2", "hit"), Some(0.0));
    assert_eq!(
        metrics.value(
            "rebate_cache_leases_total",
            &[("part", "product"), ("result", "won")],
        ),
        Some(1.0),
        "the cold item's rebuild took a lease"
    );
    assert_eq!(
        metrics.value("rebate_cache_l2_errors_total", &[("part", "product")]),
        Some(0.0)
    );
    assert_eq!(metrics.value("rebate_bloom_ready", &[]), Some(1.0));
    let rejections =
        |metrics: &Exposition| metrics.value("rebate_bloom_rejections_total", &[]).unwrap();
    assert_eq!(rejections(&metrics) - rejections(&before), 5.0);
    // The filter's 404s are correct answers: counted as not found, never as failures.
    assert_eq!(metrics.answers("not_found"), 5.0);
    assert_eq!(metrics.answers("failed"), 0.0);
    app.stop().await;
    env.clean_up().await;
}
