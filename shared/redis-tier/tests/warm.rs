//! Warm jobs' stream on the real Redis at 127.0.0.1:6379: chunks shared by consumers, a claimed
//! chunk counted once however many consumers finish it, and the stream's bound.

mod common;

use std::time::Duration;

use common::{Namespace, SHARED_URL, raw_connection, settings};
use rebate_redis_tier::{RedisTier, WarmTally};

const TTL: Duration = Duration::from_secs(60);

async fn tier(namespace: &Namespace) -> RedisTier {
    RedisTier::connect(settings(SHARED_URL, &namespace.prefix))
        .await
        .unwrap_or_else(|error| panic!("redis at {SHARED_URL} must be running: {error}"))
}

/// Deletes the warm keys of `job` (the namespace's own clean-up matches `{prefix}:*` only).
async fn clean_up(tier: &RedisTier, job: &str) {
    let mut connection = raw_connection(SHARED_URL).await;
    let _: i64 = redis::cmd("DEL")
        .arg(tier.warm_stream_key())
        .arg(tier.warm_job_key(job))
        .query_async(&mut connection)
        .await
        .unwrap();
}

fn tally(loaded: u32) -> WarmTally {
    WarmTally {
        loaded,
        not_found: 1,
        failed: 0,
    }
}

#[tokio::test]
async fn a_claimed_chunk_is_counted_once_however_many_consumers_finish_it() {
    let namespace = Namespace::new(SHARED_URL);
    let tier = tier(&namespace).await;
    assert_eq!(
        tier.warm_next_chunk("a").await.unwrap(),
        None,
        "no stream yet: the group is made and nothing is read"
    );
    let job = "00000000000000aa";
    tier.warm_create_job(job, 2, 5, 10, TTL)
        .await
        .unwrap()
        .unwrap();
    tier.warm_queue_chunks(
        job,
        0,
        &["jd:1 jd:2 jd:3".to_owned(), "jd:4 jd:5".to_owned()],
    )
    .await
    .unwrap();

    let first = tier.warm_next_chunk("a").await.unwrap().unwrap();
    assert_eq!(
        (first.job.as_str(), first.index, first.keys.as_str()),
        (job, 0, "jd:1 jd:2 jd:3")
    );
    assert_eq!(first.deliveries, 1);
    let second = tier.warm_next_chunk("b").await.unwrap().unwrap();
    assert_eq!(second.index, 1);
    assert_eq!(
        tier.warm_next_chunk("b").await.unwrap(),
        None,
        "both handed out"
    );
    assert!(
        tier.warm_complete_chunk(&second, tally(1), TTL)
            .await
            .unwrap()
    );

    // "a" stalls: "b" claims its chunk (any idle time will do here), and "a" learns it at its
    // next touch.
    let claimed = tier
        .warm_claim_chunk("b", Duration::ZERO, Duration::from_secs(3600))
        .await
        .unwrap()
        .expect("a's chunk is pending");
    assert_eq!(
        (claimed.entry_id.as_str(), claimed.deliveries),
        (first.entry_id.as_str(), 2)
    );
    assert!(!tier.warm_touch_chunk("a", &first.entry_id).await.unwrap());
    assert!(tier.warm_touch_chunk("b", &claimed.entry_id).await.unwrap());

    assert!(
        tier.warm_complete_chunk(&claimed, tally(2), TTL)
            .await
            .unwrap()
    );
    assert!(
        !tier
            .warm_complete_chunk(&first, tally(2), TTL)
            .await
            .unwrap(),
        "the second acknowledgement counts nothing"
    );
    let counts = tier.warm_job_counts(job).await.unwrap().unwrap();
    assert_eq!(
        (
            counts.total_chunks,
            counts.queued_chunks,
            counts.done_chunks
        ),
        (2, 2, 2)
    );
    assert_eq!((counts.loaded, counts.not_found, counts.failed), (3, 2, 0));
    assert!(!counts.incomplete);
    // "c" finds nothing to claim, and forgets the consumers that hold nothing ("a", "b").
    assert_eq!(
        tier.warm_claim_chunk("c", Duration::ZERO, Duration::ZERO)
            .await
            .unwrap(),
        None
    );

    let mut connection = raw_connection(SHARED_URL).await;
    let length: u64 = redis::cmd("XLEN")
        .arg(tier.warm_stream_key())
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(length, 0, "acknowledged chunks are deleted");
    let consumers: Vec<redis::Value> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(tier.warm_stream_key())
        .arg(rebate_redis_tier::WARM_GROUP)
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(
        consumers.is_empty(),
        "idle consumers forgotten: {consumers:?}"
    );
    assert_eq!(
        tier.warm_job_counts("00000000000000ff").await.unwrap(),
        None
    );
    clean_up(&tier, job).await;
}

#[tokio::test]
async fn a_job_that_would_overfill_the_stream_is_refused_whole() {
    let namespace = Namespace::new(SHARED_URL);
    let tier = tier(&namespace).await;
    let job = "00000000000000bb";
    tier.warm_create_job(job, 3, 3, 4, TTL)
        .await
        .unwrap()
        .unwrap();
    let payloads: Vec<String> = (1..=3).map(|id| format!("pdd:{id}")).collect();
    tier.warm_queue_chunks(job, 0, &payloads).await.unwrap();
    let refused = "00000000000000cc";
    assert_eq!(
        tier.warm_create_job(refused, 2, 2, 4, TTL).await.unwrap(),
        Err(3),
        "3 waiting + 2 > 4"
    );
    assert_eq!(
        tier.warm_job_counts(refused).await.unwrap(),
        None,
        "nothing created"
    );
    tier.warm_mark_incomplete(job).await.unwrap();
    assert!(tier.warm_job_counts(job).await.unwrap().unwrap().incomplete);
    clean_up(&tier, job).await;
}
