//! What the tier does when Redis is not there or does not answer: fail fast, never hang.
#![allow(
    clippy::disallowed_methods,
    reason = "tests against a real Redis wait on the wall clock"
)]

mod common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::{Namespace, SHARED_URL, key, raw_connection};
use rebate_cache::{SharedTier, TierEntry, TierError};
use rebate_domain::PartKind;
use rebate_redis_tier::{RedisTarget, RedisTier, RedisTierConfig};
use rebate_testkit::programs_available;
use rebate_testkit::redis_server::{Mode, RedisProcess};

const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(100);
/// Scheduling noise allowed on top of a timeout on a busy two-core machine.
const SLACK: Duration = Duration::from_millis(400);

fn settings(target: RedisTarget) -> RedisTierConfig {
    let mut settings = RedisTierConfig::new(target);
    settings.prefix = "test-outage".to_owned();
    settings.connect_timeout = CONNECT_TIMEOUT;
    settings.command_timeout = COMMAND_TIMEOUT;
    settings
}

/// A port with nobody listening on it (bound, then released).
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn connect_fails_fast_when_nobody_listens() {
    let port = closed_port();
    for target in [
        RedisTarget::Single(format!("redis://:secret-pw@127.0.0.1:{port}")),
        RedisTarget::Cluster(vec![format!("redis://:secret-pw@127.0.0.1:{port}")]),
    ] {
        let started = Instant::now();
        let error = RedisTier::connect(settings(target.clone()))
            .await
            .expect_err("nothing listens there");
        let waited = started.elapsed();
        assert!(waited < CONNECT_TIMEOUT + SLACK, "{target:?}: {waited:?}");
        let TierError::Backend(message) = error else {
            panic!("{target:?}: expected a backend error, got {error:?}");
        };
        assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
        assert!(!message.contains("secret-pw"), "{message}");
    }
}

#[tokio::test]
async fn connect_gives_up_on_a_server_that_never_answers() {
    // The kernel completes the TCP handshake for the backlog; nobody ever reads or answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let started = Instant::now();
    let error = RedisTier::connect(settings(RedisTarget::Single(format!(
        "redis://127.0.0.1:{port}"
    ))))
    .await
    .expect_err("a silent server is not a redis");
    assert!(
        started.elapsed() < CONNECT_TIMEOUT + SLACK,
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(error, TierError::Backend(_)), "{error:?}");
    drop(silent);
}

#[tokio::test]
async fn commands_time_out_while_the_server_is_paused_and_work_again_after() {
    // A private server: pausing the shared one would stall everyone using it, so only a run
    // outside CI without redis-server falls back to it.
    let scratch = tempfile::tempdir().unwrap();
    let private = if programs_available("the paused test's private server", &["redis-server"]) {
        Some(RedisProcess::start(scratch.path(), Mode::Standalone).await)
    } else {
        eprintln!("pausing the shared redis instead of a private one");
        None
    };
    let url = private
        .as_ref()
        .map_or_else(|| SHARED_URL.to_owned(), RedisProcess::url);
    let namespace = Namespace::new(&url);
    let mut tier_settings = settings(RedisTarget::Single(url.clone()));
    tier_settings.prefix = namespace.prefix.clone();
    let tier = RedisTier::connect(tier_settings).await.unwrap();
    let tier_key = key(1, PartKind::Product);
    let entry = TierEntry {
        version: 1,
        bytes: b"before the pause".to_vec(),
    };
    tier.put_fenced(tier_key, &entry, Duration::from_secs(60))
        .await
        .unwrap();

    let mut admin = raw_connection(&url).await;
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(500)
        .arg("ALL")
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    let paused_at = Instant::now();

    let started = Instant::now();
    let read = tier.get_many(&[tier_key]).await;
    let waited = started.elapsed();
    assert!(matches!(read, Err(TierError::Timeout(_))), "{read:?}");
    assert!(
        waited >= COMMAND_TIMEOUT - Duration::from_millis(5),
        "{waited:?}"
    );
    assert!(waited < COMMAND_TIMEOUT + SLACK, "{waited:?}");

    let lease = tier.try_lease(tier_key, 7, Duration::from_secs(5)).await;
    assert!(matches!(lease, Err(TierError::Timeout(_))), "{lease:?}");
    assert!(matches!(tier.ping().await, Err(TierError::Timeout(_))));
    assert_eq!(
        tier.stats().timeouts,
        3,
        "one for each of the three calls above"
    );
    assert!(
        paused_at.elapsed() < Duration::from_millis(500),
        "the checks above must run inside the pause; the machine is too slow"
    );

    // After the pause the same tier answers again, without being rebuilt.
    let deadline = paused_at + Duration::from_secs(3);
    loop {
        match tier.get_many(&[tier_key]).await {
            Ok(found) => {
                assert_eq!(found, vec![Some(entry)]);
                break;
            }
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("still failing 3 s after a 500 ms pause: {error:?}"),
        }
    }
    assert!(paused_at.elapsed() >= Duration::from_millis(450));
    tier.ping().await.unwrap();
    drop(namespace);
    drop(private);
}
