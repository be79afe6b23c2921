//! Test helpers: a unique key namespace per test on the shared Redis, and private
//! `redis-server` processes (single or cluster) that die with their guard.
#![allow(dead_code)] // each test binary uses a different subset
#![allow(
    clippy::disallowed_methods,
    reason = "tests against a real Redis wait on the wall clock"
)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// Why `redis-server`/`redis-cli` cannot be used, if they cannot.
pub(crate) fn redis_binaries_missing() -> Option<String> {
    for binary in ["redis-server", "redis-cli"] {
        let found = Command::new(binary)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Err(error) = found {
            return Some(format!("{binary} is not runnable: {error}"));
        }
    }
    None
}

/// A port, and the port 10000 above it (a cluster node's bus port), both free right now.
pub(crate) fn free_port_pair() -> u16 {
    loop {
        let port: u16 = 20_000 + rand::random::<u16>() % 10_000;
        let free = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
}

/// A `redis-server` child process, killed and reaped on drop so a failing test leaks nothing.
#[derive(Debug)]
pub(crate) struct ServerProcess {
    pub port: u16,
    child: Child,
}

impl ServerProcess {
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts a server in `dir` on a free port and waits until it answers; retries on another
    /// port if the chosen one was taken in the meantime.
    pub(crate) fn start(dir: &Path, cluster: bool) -> Self {
        for _attempt in 0..5 {
            let port = free_port_pair();
            let mut command = Command::new("redis-server");
            command
                .arg("--port")
                .arg(port.to_string())
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--daemonize", "no", "--protected-mode", "no"])
                .arg("--dir")
                .arg(dir)
                .arg("--logfile")
                .arg(dir.join(format!("redis-{port}.log")))
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if cluster {
                command
                    .args(["--cluster-enabled", "yes", "--cluster-config-file"])
                    .arg(format!("nodes-{port}.conf"));
            }
            let child = command.spawn().expect("redis-server starts");
            let mut server = Self { port, child };
            if server.wait_until_answering(Duration::from_secs(3)) {
                return server;
            }
        }
        panic!("could not start redis-server on a free port in 5 attempts");
    }

    fn wait_until_answering(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_exited)) = self.child.try_wait() {
                return false;
            }
            let answered = sync_connection(&self.url())
                .and_then(|mut connection| redis::cmd("PING").query::<String>(&mut connection));
            if answered.is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
