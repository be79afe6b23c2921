//! Hot items: one item invalidated again and again (its coupons changed a hundred times a second)
//! costs the coupon API at most its own per-item limit of calls, and its other answers degrade
//! like a spent quota does (template coupons, reason `hot_item`), while other items' coupons
//! load as usual. Time is the service's injected ticker, moved by hand: the ten seconds of the
//! run pass in about as long as its requests take.

use std::time::Duration;

use rebate_domain::ItemKey;
use rebate_events::EventKind;
use rebate_tests::{event_for, spawn_app_with};
use serde_json::Value;
use upstream_sim::Endpoint;

/// The per-item limit under test: a burst of 3 loads, then one a second.
const BURST: u32 = 3;
const PER_SECOND: f64 = 1.0;

#[tokio::test]
async fn one_item_invalidated_a_hundred_times_a_second_costs_at_most_its_limit_of_coupon_calls() {
    let app = spawn_app_with(|settings| {
        settings.resilience.coupons.hot_item_per_sec = Some(PER_SECOND);
        settings.resilience.coupons.hot_item_burst = Some(BURST);
    })
    .await;
    let viral = ItemKey::parse("jd", "100007").unwrap();
    let bus = app.state.events.in_process().expect("embedded profile");

    let mut viral_live = 0;
    let mut viral_refused = 0;
    let mut others_loaded = 0;
    // 100 events a second for 10 s on the ticker: one every 10 ms.
    for step in 0..1_000u32 {
        let version = app.simulator.bump_coupon_version(viral);
        app.state
            .events
            .publisher()
            .publish(&event_for(EventKind::CouponsChanged, viral, version))
            .await
            .unwrap();
        bus.settled().await;

        // The event also re-warms the item in the background: that load and this request's
        // share the item's bucket, so the calls are counted over the whole run.
        let answer: Value = app.get_item("jd", "100007").await.json().await.unwrap();
        match coupons_degraded(&answer) {
            None => viral_live += 1,
            Some(part) => {
                assert_eq!(part["reason"], "hot_item", "step {step}: {answer}");
                assert_eq!(
                    part["served"], "template",
                    "the event fenced the old coupons"
                );
                assert_eq!(answer["coupons"], serde_json::json!([]));
                viral_refused += 1;
            }
        }

        // Midway through each second (the viral item's bucket empty), a cold item: its coupons
        // can only be live by a load of their own, made while the viral item's are refused.
        if step % 100 == 50 {
            let other = (100_101 + step / 100).to_string();
            let answer: Value = app.get_item("jd", &other).await.json().await.unwrap();
            assert_eq!(coupons_degraded(&answer), None, "{other}: {answer}");
            assert_eq!(answer["degraded"], false, "{other}: {answer}");
            others_loaded += 1;
        }
        app.ticker.advance(Duration::from_millis(10));
    }

    // Every other item was loaded once; the rest of what the coupon API was sent is the viral
    // item's: the burst, then one load a second (the 10th second's token comes as the run ends).
    assert_eq!(others_loaded, 10);
    let sent = app.simulator.counters(Endpoint::Coupons);
    let viral_loads = sent.items - others_loaded;
    let limit = u64::from(BURST) + 10;
    // At least most of its tokens were used (a load detached by the next event may share a call
    // with the one after it): the item is limited, not starved.
    assert!(
        (u64::from(BURST) + 5..=limit).contains(&viral_loads),
        "{viral_loads} coupon loads of the viral item, limit {limit}"
    );
    assert!(
        sent.calls <= viral_loads + others_loaded,
        "{} calls for {} items",
        sent.calls,
        sent.items
    );
    // A load's coupons are fenced by the next event, so each load answered one request at most.
    assert!(viral_live <= viral_loads, "{viral_live} live answers");
    assert_eq!(viral_live + viral_refused, 1_000);

    // Refusals are counted per dependency, are no failures of the API, and never name the item.
    let status: Value = app
        .admin_get("/admin/v1/status")
        .await
        .json()
        .await
        .unwrap();
    let coupons = status["protection"]["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|dependency| dependency["name"] == "coupons")
        .unwrap()
        .clone();
    assert_eq!(coupons["breaker"]["state"], "closed");
    assert_eq!(coupons["failures"], 0);
    assert_eq!(coupons["hot_items"]["per_second"], PER_SECOND);
    assert_eq!(coupons["hot_items"]["burst"], BURST);
    let refused = coupons["rejected_hot_item"].as_u64().unwrap();
    assert!(refused >= viral_refused, "{refused} < {viral_refused}");
    assert_eq!(coupons["hot_items"]["refused"], refused);

    let metrics = app.metrics_text().await;
    let scraped: u64 = metrics
        .lines()
        .find_map(|sample| {
            sample.strip_prefix(r#"rebate_hot_item_refused_total{dependency="coupons"} "#)
        })
        .expect("the refusals' series")
        .parse()
        .unwrap();
    // A last re-warm may still have been refused after the status was read.
    assert!(scraped >= refused, "{scraped} < {refused}");
    assert!(!metrics.contains("100007"), "no series names an item");
    app.stop().await;
}

/// The coupons' entry in `degraded_parts`, if they were not live.
fn coupons_degraded(answer: &Value) -> Option<&Value> {
    answer["degraded_parts"]
        .as_array()
        .expect("a quote")
        .iter()
        .find(|part| part["part"] == "coupons")
}
