//! The last pings of the store and Redis, kept for the admin status page: [`RecentPings`]
//! answers from them while they are fresh and pings again in the background, one round at a
//! time, so that the page answers at once when a dependency is slow (`http::admin` takes the
//! pings; this module only keeps them).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// What pinging the store and Redis found.
#[derive(Debug, Clone, Copy)]
pub struct Pings {
    pub store_ok: bool,
    /// `None` without Redis.
    pub redis: Option<bool>,
}

/// Pings younger than this answer the status page without pinging again.
pub const PINGS_FRESH: Duration = Duration::from_secs(1);

/// How long the status page waits for new pings before it answers from the last ones.
pub const STATUS_PING_WAIT: Duration = Duration::from_millis(50);

/// The last pings of the store and Redis, for the status page. A slow dependency makes a ping
/// wait up to its timeout (the readiness probe's 500 ms), and under overload (when operators
/// look) both are slow: the page answers from the last pings and their age, and pings again in
/// the background, one round at a time. `/readyz` always pings (a load balancer asks for the
/// present) and records what it found here.
#[derive(Debug, Default)]
pub struct RecentPings {
    last: std::sync::Mutex<Option<(Instant, Pings)>>,
    pinging: std::sync::atomic::AtomicBool,
}

impl RecentPings {
    pub fn record(&self, pings: Pings) {
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((Instant::now(), pings));
    }

    fn latest(&self) -> Option<(Instant, Pings)> {
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The pings to show and how long ago they were taken: the last ones while younger than
    /// [`PINGS_FRESH`]; else a new round's when it ends within [`STATUS_PING_WAIT`]; else the
    /// last ones again (the round, still running, records its result for the next look). Only
    /// the very first look waits for its round. `ping` takes one round.
    pub async fn look<F>(self: &Arc<Self>, ping: impl Fn() -> F) -> (Pings, Duration)
    where
        F: Future<Output = Pings> + Send + 'static,
    {
        let latest = self.latest();
        if let Some((at, pings)) = latest
            && at.elapsed() < PINGS_FRESH
        {
            return (pings, at.elapsed());
        }
        if !self.pinging.swap(true, std::sync::atomic::Ordering::AcqRel) {
            let flag = PingingFlag(Arc::clone(self));
            let round = ping();
            let round = tokio::spawn(async move {
                let pings = round.await;
                flag.0.record(pings);
                pings
            });
            // The first look has nothing to fall back on: it waits for the round (bounded by
            // the pings' own timeout).
            let ended = if latest.is_some() {
                tokio::time::timeout(STATUS_PING_WAIT, round).await
            } else {
                Ok(round.await)
            };
            if let Ok(Ok(pings)) = ended {
                return (pings, Duration::ZERO);
            }
        }
        match self.latest() {
            Some((at, pings)) => (pings, at.elapsed()),
            // A first round that another look started and that has not ended (or a round that
            // panicked): ping here.
            None => {
                let pings = ping().await;
                self.record(pings);
                (pings, Duration::ZERO)
            }
        }
    }
}

/// Clears [`RecentPings::pinging`] when a background round ends, however it ends.
struct PingingFlag(Arc<RecentPings>);

impl Drop for PingingFlag {
    fn drop(&mut self) {
        self.0
            .pinging
            .store(false, std::sync::atomic::Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round that waits out a hanging dependency (the readiness probe's timeout).
    const ROUND_TIMEOUT: Duration = Duration::from_millis(500);

    /// One round of pings that takes `takes` and finds Redis as `redis`, counted in `rounds`.
    fn round(
        rounds: &Arc<std::sync::atomic::AtomicUsize>,
        takes: Duration,
        redis: bool,
    ) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = Pings> + Send>> {
        let rounds = Arc::clone(rounds);
        move || {
            rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Box::pin(async move {
                tokio::time::sleep(takes).await;
                Pings {
                    store_ok: true,
                    redis: Some(redis),
                }
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_status_answers_from_the_last_pings_while_a_slow_round_runs() {
        let recent = Arc::new(RecentPings::default());
        let rounds = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = || rounds.load(std::sync::atomic::Ordering::Relaxed);

        // The first look has nothing to show: it waits for its round, however slow.
        let started = Instant::now();
        let (pings, age) = recent
            .look(round(&rounds, Duration::from_millis(300), true))
            .await;
        assert_eq!((pings.redis, age), (Some(true), Duration::ZERO));
        assert_eq!(started.elapsed(), Duration::from_millis(300));
        assert_eq!(count(), 1);

        // Within a second, the same pings and their age; no new round.
        tokio::time::advance(Duration::from_millis(600)).await;
        let (pings, age) = recent.look(round(&rounds, Duration::ZERO, false)).await;
        assert_eq!((pings.redis, age), (Some(true), Duration::from_millis(600)));
        assert_eq!(count(), 1);

        // Stale pings and a quick round: the new round's pings.
        tokio::time::advance(Duration::from_millis(600)).await;
        let (pings, age) = recent
            .look(round(&rounds, Duration::from_millis(10), false))
            .await;
        assert_eq!((pings.redis, age), (Some(false), Duration::ZERO));
        assert_eq!(count(), 2);

        // Stale pings and a round slower than the wait (Redis hanging until the ping's
        // timeout): the look answers after the wait from the last pings, and the round goes on.
        tokio::time::advance(Duration::from_secs(2)).await;
        let started = Instant::now();
        let (pings, age) = recent.look(round(&rounds, ROUND_TIMEOUT, true)).await;
        assert_eq!(started.elapsed(), STATUS_PING_WAIT);
        assert_eq!(pings.redis, Some(false));
        assert_eq!(age, Duration::from_secs(2) + STATUS_PING_WAIT);
        assert_eq!(count(), 3);
        // A look while that round runs starts none of its own and does not wait.
        let started = Instant::now();
        let (pings, _) = recent.look(round(&rounds, ROUND_TIMEOUT, true)).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert_eq!(pings.redis, Some(false));
        assert_eq!(count(), 3);

        // The round ends and records what it found: the next look shows it.
        tokio::time::advance(ROUND_TIMEOUT).await;
        tokio::task::yield_now().await;
        let (pings, age) = recent.look(round(&rounds, Duration::ZERO, false)).await;
        assert_eq!(pings.redis, Some(true));
        assert!(age < PINGS_FRESH, "{age:?}");
        assert_eq!(count(), 3);
    }
}
