//! The fleet's shared state on the real Redis at 127.0.0.1:6379: token buckets that several
//! instances draw from, and the registry of live instances.
#![allow(
    clippy::disallowed_methods,
    reason = "tests against a real Redis wait on the wall clock"
)]

mod common;

use std::time::{Duration, Instant};

use common::{Namespace, SHARED_URL, settings};
use rebate_redis_tier::RedisTier;

async fn tier(namespace: &Namespace) -> RedisTier {
    RedisTier::connect(settings(SHARED_URL, &namespace.prefix))
        .await
        .unwrap_or_else(|error| panic!("redis at {SHARED_URL} must be running: {error}"))
}

#[tokio::test]
async fn a_bucket_grants_its_burst_then_its_rate_to_every_instance_together() {
    let namespace = Namespace::new(SHARED_URL);
    let first = tier(&namespace).await;
    let second = tier(&namespace).await;
    // 10 a second (one per 100 ms), burst 3: three at once, then the rest wait.
    let grant = first.take_tokens("coupons", 10.0, 3, 2).await.unwrap();
    assert_eq!((grant.granted, grant.retry_after), (2, Duration::ZERO));
    let grant = second.take_tokens("coupons", 10.0, 3, 5).await.unwrap();
    assert_eq!(
        grant.granted, 1,
        "the burst is shared: one left for the other instance"
    );
    assert!(
        grant.retry_after > Duration::from_millis(50)
            && grant.retry_after <= Duration::from_millis(100),
        "{grant:?}"
    );
    let grant = first.take_tokens("coupons", 10.0, 3, 1).await.unwrap();
    assert_eq!(grant.granted, 0);
    // Another bucket is not touched.
    assert_eq!(
        first
            .take_tokens("extras", 10.0, 3, 3)
            .await
            .unwrap()
            .granted,
        3
    );

    // Over 1.5 s of asking all the time, both instances together get the rate's share.
    let started = Instant::now();
    let mut granted = 0;
    while started.elapsed() < Duration::from_millis(1_500) {
        for tier in [&first, &second] {
            granted += tier
                .take_tokens("coupons", 10.0, 3, 2)
                .await
                .unwrap()
                .granted;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let most = (elapsed * 10.0).ceil() as u32 + 1;
    assert!(
        (13..=most).contains(&granted),
        "{granted} tokens in {elapsed:.2} s"
    );
}

#[tokio::test]
async fn the_registry_counts_instances_until_they_stop_beating() {
    let namespace = Namespace::new(SHARED_URL);
    let tier = tier(&namespace).await;
    let expire_after = Duration::from_millis(300);
    let live = |beat: rebate_redis_tier::Heartbeat| beat.live;
    assert_eq!(live(tier.heartbeat("b", expire_after).await.unwrap()), 1);
    let a = tier.heartbeat("a", expire_after).await.unwrap();
    assert_eq!((a.live, a.rank), (2, 0), "\"a\" sorts before \"b\"");
    let b = tier.heartbeat("b", expire_after).await.unwrap();
    assert_eq!((b.live, b.rank), (2, 1), "counted once, second by name");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(live(tier.heartbeat("a", expire_after).await.unwrap()), 2);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // "b" was last heard of 400 ms ago.
    let alone = tier.heartbeat("a", expire_after).await.unwrap();
    assert_eq!((alone.live, alone.rank), (1, 0));
}

#[tokio::test]
async fn hot_keys_of_live_instances_are_summed_and_a_silent_one_drops_out() {
    let namespace = Namespace::new(SHARED_URL);
    let tier = tier(&namespace).await;
    assert_eq!(tier.fleet_hot_keys(10).await.unwrap(), vec![]);
    let ttl = Duration::from_millis(400);
    let counts = |pairs: &[(&str, u64)]| -> Vec<(String, u64)> {
        pairs
            .iter()
            .map(|(key, count)| ((*key).to_owned(), *count))
            .collect()
    };
    tier.publish_hot_keys("a", &counts(&[("jd:1", 50), ("jd:2", 10)]), ttl)
        .await
        .unwrap();
    tier.publish_hot_keys("b", &counts(&[("jd:2", 45), ("jd:3", 5)]), ttl)
        .await
        .unwrap();
    assert_eq!(
        tier.fleet_hot_keys(10).await.unwrap(),
        counts(&[("jd:2", 55), ("jd:1", 50), ("jd:3", 5)])
    );
    assert_eq!(
        tier.fleet_hot_keys(1).await.unwrap(),
        counts(&[("jd:2", 55)])
    );
    // "a" publishes again (its list replaced, not added to); "b" falls silent and expires.
    tokio::time::sleep(Duration::from_millis(250)).await;
    tier.publish_hot_keys("a", &counts(&[("jd:1", 60)]), ttl)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(
        tier.fleet_hot_keys(10).await.unwrap(),
        counts(&[("jd:1", 60)])
    );
}

/// Change capture's lease: one holder at a time, a larger fencing token for each new holder,
/// and the records written only by the holder whose token still holds it.
#[tokio::test]
async fn the_capture_lease_fences_a_holder_that_lost_it() {
    use rebate_redis_tier::{CaptureRecord, LeaseAttempt};

    let namespace = Namespace::new(SHARED_URL);
    let first = tier(&namespace).await;
    let second = tier(&namespace).await;
    let ttl = Duration::from_secs(30);
    let LeaseAttempt::Taken(old) = first.take_capture_lease("api-1", ttl).await.unwrap() else {
        panic!("a free lease is taken");
    };
    match second.take_capture_lease("api-2", ttl).await.unwrap() {
        LeaseAttempt::HeldBy(Some(holder)) => assert_eq!(holder, old),
        other => panic!("the lease is held: {other:?}"),
    }
    assert!(
        first
            .write_capture_record(&old, CaptureRecord::Position, "p1")
            .await
            .unwrap()
    );
    assert!(first.renew_capture_lease(&old, ttl).await.unwrap());

    // The lease lapses (its key goes, as at the end of its life); another instance takes it.
    let lease_key = format!("{{{}:cc}}:lease", namespace.prefix);
    let mut connection = redis::Client::open(SHARED_URL)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(&lease_key)
        .query_async(&mut connection)
        .await
        .unwrap();
    let LeaseAttempt::Taken(new) = second.take_capture_lease("api-2", ttl).await.unwrap() else {
        panic!("a lapsed lease is taken");
    };
    assert!(new.token > old.token, "{new:?} after {old:?}");

    // The old holder can neither write nor renew nor release; the new one can.
    assert!(
        !first
            .write_capture_record(&old, CaptureRecord::Position, "stale")
            .await
            .unwrap()
    );
    assert!(!first.renew_capture_lease(&old, ttl).await.unwrap());
    assert!(!first.release_capture_lease(&old).await.unwrap());
    assert!(
        second
            .write_capture_record(&new, CaptureRecord::Position, "p2")
            .await
            .unwrap()
    );
    assert_eq!(
        first
            .read_capture_record(CaptureRecord::Position)
            .await
            .unwrap()
            .as_deref(),
        Some("p2")
    );
    assert_eq!(
        first.capture_lease_holder().await.unwrap(),
        Some(new.clone())
    );
    assert!(second.release_capture_lease(&new).await.unwrap());
    assert_eq!(first.capture_lease_holder().await.unwrap(), None);

    let names: Vec<String> = ["lease", "fence", "position", "resync"]
        .iter()
        .map(|name| format!("{{{}:cc}}:{name}", namespace.prefix))
        .collect();
    let _: i64 = redis::cmd("DEL")
        .arg(&names)
        .query_async(&mut connection)
        .await
        .unwrap();
}
