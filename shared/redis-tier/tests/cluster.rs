//! `RedisTier` on a real three-primary Redis Cluster started from the machine's `redis-server`.
#![allow(
    clippy::disallowed_methods,
    reason = "tests against a real Redis wait on the wall clock"
)]

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::key;
use rebate_cache::{FenceOutcome, SharedTier, TierEntry, TierKey};
use rebate_domain::PartKind;
use rebate_redis_tier::{RedisTarget, RedisTier, RedisTierConfig};
use rebate_testkit::programs_available;
use rebate_testkit::redis_server::{REDIS_PROGRAMS, RedisCluster};
use redis::aio::MultiplexedConnection;
use redis::cluster_routing::{Route, SlotAddr};

const TTL: Duration = Duration::from_secs(60);
/// The whole test, cluster start included, must finish well inside this.
const BUDGET: Duration = Duration::from_secs(15);

fn entry(version: u64, bytes: &[u8]) -> TierEntry {
    TierEntry {
        version,
        bytes: bytes.to_vec(),
    }
}

/// Moves `slot` and its keys from `from` to `to`, as a resharding would, behind the tier's back.
async fn migrate_slot(cluster: &RedisCluster, slot: u16, from: usize, to: usize) {
    let mut source = cluster.nodes()[from].connection().await;
    let mut target = cluster.nodes()[to].connection().await;
    let id = |connection: &mut MultiplexedConnection| {
        let mut connection = connection.clone();
        async move {
            redis::cmd("CLUSTER")
                .arg("MYID")
                .query_async::<String>(&mut connection)
                .await
                .unwrap()
        }
    };
    let source_id = id(&mut source).await;
    let target_id = id(&mut target).await;
    let setslot = |connection: &mut MultiplexedConnection, state: &str, node: &str| {
        let mut connection = connection.clone();
        let mut command = redis::cmd("CLUSTER");
        command.arg("SETSLOT").arg(slot).arg(state).arg(node);
        async move { command.query_async::<()>(&mut connection).await.unwrap() }
    };
    setslot(&mut target, "IMPORTING", &source_id).await;
    setslot(&mut source, "MIGRATING", &target_id).await;
    let keys: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(1000)
        .query_async(&mut source)
        .await
        .unwrap();
    if !keys.is_empty() {
        redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(cluster.nodes()[to].port())
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query_async::<()>(&mut source)
            .await
            .unwrap();
    }
    for node in cluster.nodes() {
        let mut connection = node.connection().await;
        setslot(&mut connection, "NODE", &target_id).await;
    }
}

#[tokio::test]
async fn a_cluster_serves_batches_per_node_fences_writes_and_leases() {
    if !programs_available("the redis cluster test", &REDIS_PROGRAMS) {
        return;
    }
    let started = Instant::now();
    let deadline = started + BUDGET;
    let cluster = RedisCluster::start(3, 0).await;

    // One seed node is enough: the tier discovers the others.
    let mut settings = RedisTierConfig::new(RedisTarget::Cluster(vec![cluster.urls()[0].clone()]));
    settings.prefix = format!("test-{}", std::process::id());
    settings.command_timeout = Duration::from_millis(500);
    settings.connect_timeout = Duration::from_secs(2);
    let tier = RedisTier::connect(settings).await.unwrap();
    tier.ping().await.unwrap();

    // Fifty items spread over many slots, present, plus ten absent ones.
    let present: Vec<TierKey> = (0..50)
        .map(|index| key(500_000 + index, PartKind::Rate))
        .collect();
    let absent: Vec<TierKey> = (0..10)
        .map(|index| key(900_000 + index, PartKind::Rate))
        .collect();
    let slots: HashSet<Route> = present
        .iter()
        .map(|&tier_key| Route::with_key(tier.key_name(tier_key), SlotAddr::Master))
        .collect();
    assert!(
        slots.len() >= 40,
        "keys fall into only {} slots",
        slots.len()
    );
    for (index, &tier_key) in present.iter().enumerate() {
        assert_eq!(
            tier.put_fenced(tier_key, &entry(index as u64 + 1, b"rate"), TTL)
                .await
                .unwrap(),
            FenceOutcome::Written
        );
    }
    let mut batch: Vec<TierKey> = Vec::new();
    for (index, &tier_key) in present.iter().enumerate() {
        batch.push(tier_key);
        if index % 5 == 0 {
            batch.push(absent[index / 5]);
        }
    }
    let expected: Vec<Option<TierEntry>> = batch
        .iter()
        .map(|tier_key| {
            present
                .iter()
                .position(|candidate| candidate == tier_key)
                .map(|index| entry(index as u64 + 1, b"rate"))
        })
        .collect();

    // One pipelined round trip per primary, whatever the number of slots.
    let before = tier.stats();
    assert_eq!(tier.get_many(&batch).await.unwrap(), expected);
    let after = tier.stats();
    assert_eq!(after.round_trips - before.round_trips, 3);
    assert_eq!(after.hits - before.hits, 50);
    assert_eq!(after.misses - before.misses, 10);

    // Fencing and leases go through the cluster connection to the owning node.
    let fenced = present[7];
    assert_eq!(
        tier.put_fenced(fenced, &entry(3, b"v3"), TTL)
            .await
            .unwrap(),
        FenceOutcome::Stale { current: 8 }
    );
    assert_eq!(
        tier.put_fenced(fenced, &entry(8, b"v8 again"), TTL)
            .await
            .unwrap(),
        FenceOutcome::Written
    );
    assert_eq!(
        tier.put_fenced(fenced, &entry(9, b"v9"), TTL)
            .await
            .unwrap(),
        FenceOutcome::Written
    );
    assert_eq!(
        tier.get_many(&[fenced]).await.unwrap(),
        vec![Some(entry(9, b"v9"))]
    );
    // On a cluster the lease and the entry live in different slots: two commands, same answers.
    let rebuilt = present[5];
    assert_eq!(
        tier.lease_and_read(rebuilt, 1, TTL).await.unwrap(),
        (true, Some(entry(6, b"rate")))
    );
    assert_eq!(
        tier.lease_and_read(rebuilt, 2, TTL).await.unwrap(),
        (false, Some(entry(6, b"rate")))
    );
    tier.release_lease(rebuilt, 1).await.unwrap();
    for &leased in &present[..5] {
        assert!(tier.try_lease(leased, 1, TTL).await.unwrap());
        assert!(!tier.try_lease(leased, 2, TTL).await.unwrap());
        tier.release_lease(leased, 2).await.unwrap();
        assert!(!tier.try_lease(leased, 2, TTL).await.unwrap());
        tier.release_lease(leased, 1).await.unwrap();
        assert!(tier.try_lease(leased, 2, TTL).await.unwrap());
    }

    // A corrupt value and a key of another type read as absent, on whichever node they live.
    let garbage = present[10];
    let wrong_type = present[11];
    let mut raw = redis::cluster::ClusterClient::new(vec![cluster.urls()[0].clone()])
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    redis::cmd("SET")
        .arg(tier.key_name(garbage))
        .arg("garbage")
        .query_async::<()>(&mut raw)
        .await
        .unwrap();
    redis::cmd("DEL")
        .arg(tier.key_name(wrong_type))
        .query_async::<()>(&mut raw)
        .await
        .unwrap();
    redis::cmd("RPUSH")
        .arg(tier.key_name(wrong_type))
        .arg("x")
        .query_async::<()>(&mut raw)
        .await
        .unwrap();
    let corrupt_before = tier.stats().corrupt;
    let found = tier
        .get_many(&[garbage, present[12], wrong_type])
        .await
        .unwrap();
    assert_eq!(found, vec![None, Some(entry(13, b"rate")), None]);
    assert_eq!(tier.stats().corrupt - corrupt_before, 2);
    tier.put_fenced(garbage, &entry(11, b"rate"), TTL)
        .await
        .unwrap();
    tier.put_fenced(wrong_type, &entry(12, b"rate"), TTL)
        .await
        .unwrap();

    // A slot moves behind the tier's back: the stale map sends one key to its old owner, which
    // answers MOVED; that key is fetched on its own and the map is refreshed.
    let moved = present[0];
    let moved_name = tier.key_name(moved);
    let from = cluster.owner_of(&moved_name).await;
    let to = (from + 1) % 3;
    let moved_slot = {
        let mut connection = cluster.nodes()[from].connection().await;
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&moved_name)
            .query_async::<u16>(&mut connection)
            .await
            .unwrap()
    };
    migrate_slot(&cluster, moved_slot, from, to).await;
    assert_eq!(cluster.owner_of(&moved_name).await, to);

    let mut current = expected.clone();
    current[batch.iter().position(|&k| k == fenced).unwrap()] = Some(entry(9, b"v9"));
    let before = tier.stats();
    assert_eq!(tier.get_many(&batch).await.unwrap(), current);
    let redirected = tier.stats().round_trips - before.round_trips;
    assert!(
        redirected > 3,
        "a stale slot map must cost extra round trips, got {redirected}"
    );
    // Once the background refresh lands, a batch is back to one round trip per node.
    loop {
        let before = tier.stats().round_trips;
        assert_eq!(tier.get_many(&batch).await.unwrap(), current);
        if tier.stats().round_trips - before == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slot map was never refreshed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Invalidation deletes across nodes in one pipeline per node as well.
    let before = tier.stats().round_trips;
    assert_eq!(tier.delete(&batch).await.unwrap(), 50);
    assert_eq!(tier.stats().round_trips - before, 3);
    assert!(
        tier.get_many(&present)
            .await
            .unwrap()
            .iter()
            .all(Option::is_none)
    );

    assert_eq!(tier.stats().errors, 0);
    assert!(started.elapsed() < BUDGET, "took {:?}", started.elapsed());
}
