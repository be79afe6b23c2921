//! Helpers shared by the workspace's test suites (a dev-dependency only; never in the service).
//!
//! Contract: every wait is bounded and fails the test naming what it waited for; every process a
//! helper starts dies with its guard, also when the test panics; names never collide with a test
//! running at the same time, and ports are asked of the kernel, never fixed. Nothing here knows
//! the service's crates.
//!
//! # Layout
//! - [`wait_until`] / [`wait_until_true`]: poll a condition every 10 ms, and fail the test naming
//!   what it waited for once [`WAIT_LIMIT`] has passed. For tests against real servers, whose
//!   progress no virtual clock can drive; a test of time-based logic moves its clock instead.
//! - [`unique_suffix`]: keeps the names (databases, key prefixes, queues) of tests running at the
//!   same time apart.
//! - [`free_port`] / [`free_ports`]: loopback ports nobody listens on, for processes the test
//!   starts.
//! - [`programs`]: whether the external programs a test needs (`redis-server`, `rabbitmqctl`, …)
//!   run here; under CI (`CI` set) a missing one fails the test, elsewhere the test may skip
//!   itself saying so ([`programs_available`], [`require_programs`]).
//! - `redis_server` (feature `redis`): `RedisProcess`, a private `redis-server` (single, or one
//!   cluster node), and `RedisCluster`, a Redis Cluster of them with replicas that can fail a
//!   master over (`CLUSTER FAILOVER`).
//! - `tls` (feature `tls`): `TestPki`, a CA and the server and client certificates it signed,
//!   made with rcgen for servers started with TLS on.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

pub mod programs;
#[cfg(feature = "redis")]
pub mod redis_server;
#[cfg(feature = "tls")]
pub mod tls;

pub use programs::{programs_available, require_programs};

/// How long a condition may take before the test fails.
pub const WAIT_LIMIT: Duration = Duration::from_secs(10);

const POLL_EVERY: Duration = Duration::from_millis(10);

/// Polls `condition` until it holds; panics naming `what` after [`WAIT_LIMIT`].
pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    wait_until_true(what, || std::future::ready(condition())).await;
}

/// [`wait_until`] for a condition that has to ask something (an HTTP answer, a store row).
pub async fn wait_until_true<F: Future<Output = bool>>(
    what: &str,
    mut condition: impl FnMut() -> F,
) {
    let give_up = Instant::now() + WAIT_LIMIT;
    while !condition().await {
        assert!(Instant::now() < give_up, "timed out waiting until {what}");
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// A number that differs between tests running at the same time, in this process or another.
pub fn unique_suffix() -> u32 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or_default();
    nanos ^ std::process::id().rotate_left(16)
}

/// A loopback port nobody listens on right now (bound, then released). Another process may take
/// it before the test's own process binds it: starting that process fails then, and whoever
/// waits for it says so.
pub fn free_port() -> u16 {
    let [port] = free_ports();
    port
}

/// `N` different loopback ports nobody listens on right now: all are held while they are picked,
/// so none is handed out twice.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: [std::net::TcpListener; N] = std::array::from_fn(|_| {
        std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port")
    });
    listeners.map(|listener| listener.local_addr().expect("a bound address").port())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_condition_that_comes_true_ends_the_wait() {
        let polls = AtomicU32::new(0);
        wait_until("the third poll", || {
            polls.fetch_add(1, Ordering::Relaxed) >= 2
        })
        .await;
        assert_eq!(polls.load(Ordering::Relaxed), 3);
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "timed out waiting until never")]
    async fn a_condition_that_never_holds_fails_naming_it() {
        wait_until("never", || false).await;
    }
}
