//! Test helpers: a unique key namespace per test on the shared Redis. Private `redis-server`
//! processes (single or cluster) come from `rebate_testkit::redis_server`.
#![allow(dead_code)] // each test binary uses a different subset

use std::time::Duration;

use rebate_cache::TierKey;
use rebate_domain::{ItemId, ItemKey, PartKind, Platform};
use rebate_redis_tier::{RedisTarget, RedisTierConfig};

/// The Redis the integration tests use; it must be running.
pub(crate) const SHARED_URL: &str = "redis://127.0.0.1:6379";

pub(crate) fn key(item_id: u64, part: PartKind) -> TierKey {
    TierKey {
        item: ItemKey::new(Platform::Taobao, ItemId::from_u64(item_id)),
        part,
    }
}

pub(crate) fn settings(url: &str, prefix: &str) -> RedisTierConfig {
    let mut settings = RedisTierConfig::new(RedisTarget::Single(url.to_owned()));
    settings.prefix = prefix.to_owned();
    settings.connect_timeout = Duration::from_secs(2);
    settings
}

/// A key prefix no other test (or test run) uses; its keys are deleted on drop, and every test
/// writes with short TTLs so that a killed run leaves nothing behind for long either.
#[derive(Debug)]
pub(crate) struct Namespace {
    pub prefix: String,
    url: String,
}

impl Namespace {
    pub(crate) fn new(url: &str) -> Self {
        Self {
            prefix: format!("test-{}-{:016x}", std::process::id(), rand::random::<u64>()),
            url: url.to_owned(),
        }
    }

    /// Keys currently stored under the prefix.
    pub(crate) fn keys(&self) -> Vec<String> {
        let Ok(mut connection) = sync_connection(&self.url) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let page: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{}:*", self.prefix))
                .arg("COUNT")
                .arg(1000)
                .query(&mut connection);
            let Ok((next, keys)) = page else {
                return found;
            };
            found.extend(keys);
            if next == 0 {
                return found;
            }
            cursor = next;
        }
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let keys = self.keys();
        if keys.is_empty() {
            return;
        }
        if let Ok(mut connection) = sync_connection(&self.url) {
            let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(&keys).query(&mut connection);
        }
    }
}

pub(crate) fn sync_connection(url: &str) -> redis::RedisResult<redis::Connection> {
    redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(2))
}

/// A plain multiplexed connection, to look at or tamper with what the tier stored.
pub(crate) async fn raw_connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("valid url")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|error| panic!("redis at {url} must be running for these tests: {error}"))
}
