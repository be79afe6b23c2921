//! Every guard reconfigured from several threads while others call it: nothing panics, nothing
//! in flight is lost, and the configuration the last reconfiguration stored is the one in force.

use std::sync::Arc;
use std::time::Duration;

use rebate_resilience::{
    AdmissionQueue, BreakerConfig, Bulkhead, CircuitBreaker, ClassWait, KeyedLimiter, LoadShedder,
    ManualTicker, RateConfig, RequestClass, RetryBudget, RetryConfig, ShedConfig, Ticker,
    TokenBucket, WaitConfig,
};

/// One configuration of every guard.
#[derive(Debug, Clone)]
struct Rules {
    breaker: BreakerConfig,
    bulkhead: u32,
    rate: RateConfig,
    retry: RetryConfig,
    shed: ShedConfig,
    wait: WaitConfig,
}

fn rules(variant: u32) -> Rules {
    let step = f64::from(variant);
    let millis = |base: u64| Duration::from_millis(base + 10 * u64::from(variant));
    Rules {
        breaker: BreakerConfig {
            // A new window clears the counts while calls record into them.
            window: Duration::from_secs(5 + u64::from(variant)),
            failure_ratio: 0.3 + 0.1 * step,
            min_calls: 5 + variant,
            slow_call: millis(100),
            cool_down: millis(10),
            ..BreakerConfig::default()
        },
        bulkhead: 1 + variant,
        rate: RateConfig {
            per_second: 1_000.0 * (1.0 + step),
            burst: 5 + variant,
        },
        retry: RetryConfig {
            ratio: 0.1 * (1.0 + step),
            max_saved: 3 + variant,
            ..RetryConfig::default()
        },
        shed: ShedConfig {
            capacity_rps: 1_000 * variant,
            queue_delay_target: millis(5),
            min_in_flight: 2 + variant,
            max_in_flight: 8 + 4 * variant,
            thresholds: [0.6 + 0.05 * step, 0.9, 1.2],
            min_dwell: millis(1),
            interval: Duration::from_millis(1),
            ..ShedConfig::default()
        },
        wait: WaitConfig::default().with(
            RequestClass::Prefetch,
            ClassWait {
                max_waiters: 1 + variant,
                max_wait: millis(50),
            },
        ),
    }
}

struct Guards {
    ticker: ManualTicker,
    breaker: CircuitBreaker,
    bulkhead: Bulkhead,
    bucket: TokenBucket,
    clients: KeyedLimiter,
    budget: RetryBudget,
    shedder: LoadShedder,
    queue: AdmissionQueue,
}

impl Guards {
    fn new(rules: Rules) -> Self {
        let ticker = ManualTicker::new();
        let shared = || Arc::new(ticker.clone());
        Self {
            breaker: CircuitBreaker::new("coupons", rules.breaker, shared()),
            bulkhead: Bulkhead::new("coupons", rules.bulkhead),
            bucket: TokenBucket::new(rules.rate),
            clients: KeyedLimiter::new(rules.rate, 100, Duration::from_secs(60), shared()),
            budget: RetryBudget::new(&rules.retry),
            shedder: LoadShedder::new(rules.shed, shared()),
            queue: AdmissionQueue::new(rules.wait, shared()),
            ticker,
        }
    }

    fn reconfigure(&self, rules: &Rules) {
        assert!(self.breaker.reconfigure(rules.breaker.clone()).is_empty());
        self.bulkhead.resize(rules.bulkhead);
        self.bucket.set_rate_at(rules.rate, self.ticker_nanos());
        self.clients.set_rate(rules.rate);
        self.budget.reconfigure(&rules.retry);
        assert!(self.shedder.reconfigure(&rules.shed).is_empty());
        self.queue.reconfigure(rules.wait);
    }

    fn ticker_nanos(&self) -> u64 {
        self.ticker.now_nanos()
    }

    /// One request's worth of calls through every guard.
    fn call(&self, round: u32) {
        let admission = self.shedder.admit();
        if let Ok(permit) = self.breaker.try_acquire() {
            let slot = self.bulkhead.try_acquire();
            permit.record(!round.is_multiple_of(3) && slot.is_ok());
        }
        let _ = self.bucket.try_acquire_at(self.ticker_nanos());
        let _ = self
            .clients
            .try_acquire(["app-1", "h5-2", "jd-3"][round as usize % 3]);
        self.budget.deposit();
        let _ = self.budget.try_withdraw();
        if let Ok(waiter) = self.queue.join(RequestClass::Prefetch) {
            self.queue.notify();
            if round.is_multiple_of(2) {
                waiter.admitted();
            }
        }
        drop(admission);
        if round.is_multiple_of(50) {
            self.ticker.advance(Duration::from_millis(1));
        }
    }
}

#[test]
fn guards_reconfigured_from_many_threads_under_calls_end_with_the_last_configuration() {
    const ROUNDS: u32 = 10_000;
    const THREADS: u32 = 2;
    let guards = Guards::new(rules(0));
    let last = rules(3);
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let (guards, last) = (&guards, &last);
            scope.spawn(move || {
                for round in 0..ROUNDS {
                    guards.reconfigure(&rules((round + thread) % 3));
                }
                guards.reconfigure(last);
            });
            scope.spawn(move || {
                for round in 0..ROUNDS {
                    guards.call(round);
                }
            });
        }
    });

    assert_eq!(guards.breaker.config(), last.breaker);
    assert_eq!(guards.bulkhead.max(), last.bulkhead);
    assert_eq!(guards.bulkhead.in_flight(), 0, "every slot was given back");
    assert_eq!(guards.bucket.rate(), last.rate);
    assert_eq!(guards.clients.rate(), last.rate);
    assert_eq!(guards.budget.config(), last.retry);
    assert_eq!(guards.budget.max_per_request(), last.retry.max_per_request);
    assert_eq!(guards.shedder.config(), last.shed);
    let shed = guards.shedder.snapshot();
    assert_eq!(shed.in_flight, 0, "every admission was counted out");
    assert_eq!(
        (shed.min_in_flight, shed.max_in_flight, shed.thresholds),
        (
            last.shed.min_in_flight,
            last.shed.max_in_flight,
            last.shed.thresholds
        )
    );
    let limit = u64::from(last.shed.min_in_flight)..=u64::from(last.shed.max_in_flight);
    assert!(limit.contains(&shed.concurrency_limit), "{shed:?}");
    assert_eq!(guards.queue.config(), last.wait);
    assert_eq!(guards.queue.depth(RequestClass::Prefetch), 0);
}
