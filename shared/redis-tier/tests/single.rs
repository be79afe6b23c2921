//! `RedisTier` against the real Redis at 127.0.0.1:6379, each test in its own key namespace.

mod common;

use std::time::Duration;

use common::{Namespace, SHARED_URL, key, raw_connection, settings};
use rebate_cache::{FenceOutcome, SharedTier, TierEntry};
use rebate_domain::PartKind;
use rebate_redis_tier::RedisTier;

const TTL: Duration = Duration::from_secs(60);

async fn tier(namespace: &Namespace) -> RedisTier {
    RedisTier::connect(settings(SHARED_URL, &namespace.prefix))
        .await
        .unwrap_or_else(|error| panic!("redis at {SHARED_URL} must be running: {error}"))
}

fn entry(version: u64, bytes: &[u8]) -> TierEntry {
    TierEntry {
        version,
        bytes: bytes.to_vec(),
    }
}

#[tokio::test]
async fn put_then_get_many_keeps_order_and_marks_absent_keys() {
    let namespace = Namespace::new(SHARED_URL);
    let tier = tier(&namespace).await;
    let stored = [
        (key(1, PartKind::Product), entry(7, b"{\"title\":\"a\"}")),
        (key(2, PartKind::Coupons), entry(1, b"")),
        (
            key(3, PartKind::Rate),
            entry(u64::MAX, b"\x00\xffbinary:with:colons"),
        ),
    ];
    for (tier_key, value) in &stored {
        assert_eq!(
            tier.put_fenced(*tier_key, value, TTL).await.unwrap(),
            FenceOutcome::Written
        );
    }

    let asked = [
        stored[2].0,
        key(4, PartKind::Product),
        stored[0].0,
        key(1, PartKind::Extras),
        stored[1].0,
    ];
    let found = tier.get_many(&asked).await.unwrap();
    assert_eq!(
        found,
        vec![
            Some(stored[2].1.clone()),
            None,
            Some(stored[0].1.clone()),
            None,
            Some(stored[1].1.clone()),
        ]
    );
    assert_eq!(tier.get_many(&[]).await.unwrap(), Vec::new());

    let stats = tier.stats();
    assert_eq!((stats.gets, stats.hits, stats.misses), (5, 3, 2));
    assert_eq!((stats.errors, stats.timeouts, stats.corrupt), (0, 0, 0));
}

#[tokio::test]
async fn stored_form_is_the_documented_key_and_version_prefix() {
    let namespace = Namespace::new(SHARED_URL);
    let tier = tier(&namespace).await;
    let tier_key = key(100001, PartKind::Coupons);
    let name = tier.key_name(tier_key);
    assert_eq!(
        name,
        format!("{}:v1:taobao:100001:coupons", namespace.prefix)
    );

    tier.put_fenced(tier_key, &entry(12, b"payload"), TTL)
        .await
        .unwrap();
    let mut raw = raw_connection(SHARED_URL).await;
    let stored: Vec<u8> = redis::cmd("GET")
        .arg(&name)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(stored, b"12:payload");
}

#[tokio::test]
async fn a_fence_keeps_an_entry_at_its_own_version_and_covers_older_ones() {
    let namespace = Namespace::new(SHARED_URL);
    let tier = tier(&namespace).await;
    let tier_key = key(11, PartKind::Rate);
    tier.put_fenced(tier_key, &entry(5, b"v5 rebuilt"), TTL)
        .await
        .unwrap();
    // The rebuild that read the changed row got there first: the fence at 5 keeps it.
    assert_eq!(
        tier.put_fence(tier_key, &entry(5, b"fence 5"), TTL)
            .await
            .unwrap(),
        FenceOutcome::Stale { current: 5 }
    );
    assert_eq!(
        tier.get_many(&[tier_key]).await.unwrap(),
        vec![Some(entry(5, b"v5 rebuilt"))]
    );
    // A fence past it covers it; a rebuild at the fence's version then replaces the fence.
    assert_eq!(
        tier.put_fence(tier_key, &entry(6, b"fence 6"), TTL)
            .await
            .unwrap(),
        FenceOutcome::Written
    );
    assert_eq!(
        tier.put_fenced(tier_key, &entry(6, b"v6 rebuilt"), TTL)
            .await
            .unwrap(),
        FenceOutcome::Written
    );
    assert_eq!(
        tier.get_many(&[tier_key]).await.unwrap(),
        vec![Some(entry(6, b"v6 rebuilt"))]
    );
}

#[tokio::test]
async fn older_versions_are_refused_and_equal_or_newer_ones_written() {
    let namespace = Namespace::new(SHARED_URL);
    let tier = tier(&namespace).await;
    let tier_key = key(10, PartKind::Rate);

    assert_eq!(
        tier.put_fenced(tier_key, &entry(3, b"v3"), TTL)
            .await
            .unwrap(),
        FenceOutcome::Written
    );
    assert_eq!(
        tier.put_fenced(tier_key, &entry(2, b"v2"), TTL)
            .await
            .unwrap(),
        FenceOutcome::Stale { current: 3 }
    );
    assert_eq!(
        tier.get_many(&[tier_key]).await.unwrap(),
        vec![Some(entry(3, b"v3"))]
    );
    assert_eq!(
        tier.put_fenced(tier_key, &entry(3, b"v3 again"), TTL)
            .await
            .unwrap(),
        FenceOutcome::Written
    );
    assert_eq!(
        tier.get_many(&[tier_key]).await.unwrap(),
        vec![Some(entry(3, b"v3 again"))]
    );
    assert_eq!(
        tier.put_fenced(tier_key, &entry(4, b"v4"), TTL)
            .await
            .unwrap(),
        FenceOutcome::Written
    );
    assert_eq!(
        tier.get_many(&[tier_key]).await.unwrap(),
        vec![Some(entry(4, b"v4"))]
    );

    let stats = tier.stats();
    assert_eq!((stats.fenced_writes, stats.stale_writes_refused), (3, 1));
}

#[tokio::test]
async fn fencing_is_exact_beyond_double_precision_and_across_digit_counts() {
    let namespace = Namespace::new(SHARED_URL);
    let tier = tier(&namespace).await;
    let tier_key = key(11, PartKind::Rate);
    // 2^53 + 1 and 2^53 are the same Lua number; the script must still tell them apart.
    let above = (1u64 << 53) + 1;
    tier.put_fenced(tier_key, &entry(above, b"new"), TTL)
        .await
        .unwrap();
    assert_eq!(
        tier.put_fenced(tier_key, &entry(above - 1, b"old"), TTL)
            .await
            .unwrap(),
        FenceOutcome::Stale { current: above }
    );
    // "9" sorts after "10" as text; as versions it is older.
    let other = key(12, PartKind::Rate);
    tier.put_fenced(other, &entry(10, b"ten"), TTL)
        .await
        .unwrap();
    assert_eq!(
        tier.put_fenced(other, &entry(9, b"nine"), TTL)
            .await
            .unwrap(),
        FenceOutcome::Stale { current: 10 }
    );
    assert_eq!(
        tier.put_fenced(other, &entry(u64::MAX, b"max"), TTL)
            .await
            .unwrap(),
        FenceOutcome::Written
    );
}

#[tokio::test]
async fn ttl_is_applied_and_refreshed_by_an_equal_version() {
    let namespace = Namespace::new(SHARED_URL);
    let tier = tier(&namespace).await;
    let tier_key = key(20, PartKind::Coupons);
    let name = tier.key_name(tier_key);
    let mut raw = raw_connection(SHARED_URL).await;
    let pttl = |raw: &mut redis::aio::MultiplexedConnection| {
        let mut raw = raw.clone();
        let name = name.clone();
        async move {
            redis::cmd("PTTL")
                .arg(name)
                .query_async::<i64>(&mut raw)
                .await
                .unwrap()
        }
    };

    tier.put_fenced(tier_key, &entry(1, b"x"), Duration::from_secs(5))
        .await
        .unwrap();
    let remaining = pttl(&mut raw).await;
    assert!(remaining > 0 && remaining <= 5_000, "PTTL {remaining}");

    tier.put_fenced(tier_key, &entry(1, b"x"), Duration::from_secs(50))
        .await
        .unwrap();
    let remaining = pttl(&mut raw).await;
    assert!(remaining > 5_000 && remaining <= 50_000, "PTTL {remaining}");

    // A refused write leaves the TTL alone.
    tier.put_fenced(tier_key, &entry(0, b"old"), Duration::from_secs(1))
        .await
        .unwrap();
    assert!(pttl(&mut raw).await > 5_000);

    // A zero TTL is raised to 1 ms instead of being refused by Redis.
    let brief = key(21, PartKind::Coupons);
    tier.put_fenced(brief, &entry(1, b"x"), Duration::ZERO)
        .await
        .unwrap();
}

#[tokio::test]
async fn leases_go_to_one_holder_and_only_it_releases() {
    let namespace = Namespace::new(SHARED_URL);
    let tier = tier(&namespace).await;
    let tier_key = key(30, PartKind::Product);
    let ttl = Duration::from_secs(10);

    assert!(tier.try_lease(tier_key, 111, ttl).await.unwrap());
    assert!(!tier.try_lease(tier_key, 222, ttl).await.unwrap());
    assert!(!tier.try_lease(tier_key, 111, ttl).await.unwrap());

    tier.release_lease(tier_key, 222).await.unwrap();
    assert!(!tier.try_lease(tier_key, 333, ttl).await.unwrap());

    tier.release_lease(tier_key, 111).await.unwrap();
    assert!(tier.try_lease(tier_key, 222, ttl).await.unwrap());

    // The lease lives beside the value and does not disturb it.
    tier.put_fenced(tier_key, &entry(1, b"value"), TTL)
        .await
        .unwrap();
    assert_eq!(
        tier.get_many(&[tier_key]).await.unwrap(),
        vec![Some(entry(1, b"value"))]
    );
    let mut raw = raw_connection(SHARED_URL).await;
    let holder: String = redis::cmd("GET")
        .arg(format!("{}:lease", tier.key_name(tier_key)))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(holder, "222");
}

/// The lease and the entry in one round trip: the lease goes to one holder as with
/// `try_lease`, and the entry comes back whoever holds it; a key of another type reads as absent.
#[tokio::test]
async fn lease_and_read_takes_the_lease_then_reads_in_one_round_trip() {
    let namespace = Namespace::new(SHARED_URL);
    let tier = tier(&namespace).await;
    let tier_key = key(32, PartKind::Rate);
    let ttl = Duration::from_secs(10);

    let trips = tier.stats().round_trips;
    assert_eq!(
        tier.lease_and_read(tier_key, 111, ttl).await.unwrap(),
        (true, None)
    );
    assert_eq!(tier.stats().round_trips - trips, 1);
    tier.put_fenced(tier_key, &entry(4, b"rebuilt"), TTL)
        .await
        .unwrap();
    assert_eq!(
        tier.lease_and_read(tier_key, 222, ttl).await.unwrap(),
        (false, Some(entry(4, b"rebuilt")))
    );
    tier.release_lease(tier_key, 111).await.unwrap();
    assert_eq!(
        tier.lease_and_read(tier_key, 222, ttl).await.unwrap(),
        (true, Some(entry(4, b"rebuilt")))
    );
    assert!(!tier.try_lease(tier_key, 333, ttl).await.unwrap());

    let wrong_type = key(33, PartKind::Rate);
    let mut raw = raw_connection(SHARED_URL).await;
    redis::cmd("RPUSH")
        .arg(tier.key_name(wrong_type))
        .arg("x")
        .query_async::<()>(&mut raw)
        .await
        .unwrap();
    let corrupt = tier.stats().corrupt;
    assert_eq!(
        tier.lease_and_read(wrong_type, 1, ttl).await.unwrap(),
        (true, None)
    );
    assert_eq!(tier.stats().corrupt - corrupt, 1);
}

#[tokio::test]
async fn an_expired_lease_can_be_taken_again() {
    let namespace = Namespace::new(SHARED_URL);
    let tier = tier(&namespace).await;
    let tier_key = key(31, PartKind::Product);

    assert!(
        tier.try_lease(tier_key, 1, Duration::from_millis(50))
            .await
            .unwrap()
    );
    assert!(
        !tier
            .try_lease(tier_key, 2, Duration::from_secs(10))
            .await
            .unwrap()
    );
    // The server's clock expires the lease, so real time has to pass here.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        tier.try_lease(tier_key, 2, Duration::from_secs(10))
            .await
            .unwrap()
    );
    // The first holder's late release must not free the second holder's lease.
    tier.release_lease(tier_key, 1).await.unwrap();
    assert!(
        !tier
            .try_lease(tier_key, 3, Duration::from_secs(10))
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn a_fifty_key_batch_costs_one_round_trip() {
    let namespace = Namespace::new(SHARED_URL);
    let tier = tier(&namespace).await;
    let keys: Vec<_> = (0..50)
        .map(|index| key(1_000 + index, PartKind::Rate))
        .collect();
    for (index, tier_key) in keys.iter().enumerate().filter(|(index, _)| index % 2 == 0) {
        tier.put_fenced(*tier_key, &entry(index as u64, b"rate"), TTL)
            .await
            .unwrap();
    }

    let before = tier.stats();
    let found = tier.get_many(&keys).await.unwrap();
    let after = tier.stats();

    assert_eq!(after.round_trips - before.round_trips, 1);
    assert_eq!(after.gets - before.gets, 50);
    assert_eq!(after.hits - before.hits, 25);
    for (index, value) in found.iter().enumerate() {
        let expected = (index % 2 == 0).then(|| entry(index as u64, b"rate"));
        assert_eq!(value, &expected, "key {index}");
    }
}

#[tokio::test]
async fn corrupt_values_read_as_absent_and_are_counted() {
    let namespace = Namespace::new(SHARED_URL);
    let tier = tier(&namespace).await;
    let garbage = key(40, PartKind::Product);
    let wrong_type = key(41, PartKind::Product);
    let good = key(42, PartKind::Product);
    let mut raw = raw_connection(SHARED_URL).await;
    redis::cmd("SET")
        .arg(tier.key_name(garbage))
        .arg("not an entry")
        .arg("EX")
        .arg(60)
        .query_async::<()>(&mut raw)
        .await
        .unwrap();
    redis::cmd("RPUSH")
        .arg(tier.key_name(wrong_type))
        .arg("a list")
        .query_async::<()>(&mut raw)
        .await
        .unwrap();
    tier.put_fenced(good, &entry(5, b"good"), TTL)
        .await
        .unwrap();

    let found = tier.get_many(&[garbage, good, wrong_type]).await.unwrap();
    assert_eq!(found, vec![None, Some(entry(5, b"good")), None]);
    // MGET answers nil for a key of another type, so only the garbage counts as corrupt here
    // (a cluster's per-key GET sees WRONGTYPE and counts it too).
    let stats = tier.stats();
    assert_eq!((stats.corrupt, stats.errors), (1, 0));

    // A fenced write replaces a corrupt value (and a key of another type).
    for tier_key in [garbage, wrong_type] {
        assert_eq!(
            tier.put_fenced(tier_key, &entry(1, b"fixed"), TTL)
                .await
                .unwrap(),
            FenceOutcome::Written
        );
    }
    assert_eq!(
        tier.get_many(&[garbage, wrong_type]).await.unwrap(),
        vec![Some(entry(1, b"fixed")), Some(entry(1, b"fixed"))]
    );
}

#[tokio::test]
async fn delete_removes_entries_in_one_round_trip() {
    let namespace = Namespace::new(SHARED_URL);
    let tier = tier(&namespace).await;
    let keys = [key(50, PartKind::Rate), key(51, PartKind::Rate)];
    for tier_key in keys {
        tier.put_fenced(tier_key, &entry(1, b"x"), TTL)
            .await
            .unwrap();
    }
    let before = tier.stats().round_trips;
    let removed = tier
        .delete(&[keys[0], keys[1], key(52, PartKind::Rate)])
        .await
        .unwrap();
    assert_eq!(removed, 2);
    assert_eq!(tier.stats().round_trips - before, 1);
    assert_eq!(tier.get_many(&keys).await.unwrap(), vec![None, None]);
    assert_eq!(tier.delete(&[]).await.unwrap(), 0);
}

#[tokio::test]
async fn ping_answers_and_clones_share_counters() {
    let namespace = Namespace::new(SHARED_URL);
    let tier = tier(&namespace).await;
    let clone = tier.clone();
    clone.ping().await.unwrap();
    tier.ping().await.unwrap();
    assert_eq!(tier.stats().round_trips, 2);
    let shown = format!("{tier:?}");
    assert!(
        shown.contains("single") && shown.contains(&namespace.prefix),
        "{shown}"
    );
}

#[tokio::test]
async fn a_wrong_password_fails_without_showing_it() {
    let namespace = Namespace::new(SHARED_URL);
    let url = "redis://:not-the-password-7f3a@127.0.0.1:6379";
    match RedisTier::connect(settings(url, &namespace.prefix)).await {
        Err(error) => {
            let message = error.to_string();
            assert!(!message.contains("not-the-password-7f3a"), "{message}");
            assert!(message.contains("127.0.0.1:6379"), "{message}");
        }
        // A server that ignores AUTH is acceptable here; the Debug must still hide it.
        Ok(tier) => assert!(!format!("{tier:?}").contains("not-the-password-7f3a")),
    }
}
