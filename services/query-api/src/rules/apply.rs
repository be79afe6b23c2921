//! [`ServiceTarget`]: a rule set's values put in force in the running service.
//!
//! Each piece changes as a unit — a guard's whole configuration, the engine's budget (the four
//! parts' timeouts, the shortened ones and the retries, one swap the next request reads once),
//! a part's two tiers of lifetimes — and every piece keeps its state. Reading a value on the hot
//! path stays one relaxed atomic load (the request deadline, a guard's threshold) or one
//! `ArcSwap` load per request (the engine's budget).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use rebate_engine::QueryEngine;

use super::manager::ApplyTarget;
use super::window::Totals;
use crate::Settings;
use crate::metrics::AnswerCounters;
use crate::protection::{DependencyTimeouts, Protection};

/// Values read by code that is not a guard: the request deadline (per request) and the two
/// warming rates (per round or chunk).
#[derive(Debug)]
pub struct LiveKnobs {
    request_deadline_nanos: AtomicU64,
    warmup_rate: AtomicU32,
    warm_jobs_rate: AtomicU32,
}

impl LiveKnobs {
    pub fn new(settings: &Settings) -> Self {
        let knobs = Self {
            request_deadline_nanos: AtomicU64::new(0),
            warmup_rate: AtomicU32::new(0),
            warm_jobs_rate: AtomicU32::new(0),
        };
        knobs.set(settings);
        knobs
    }

    fn set(&self, settings: &Settings) {
        let nanos = u64::try_from(settings.request_deadline().as_nanos()).unwrap_or(u64::MAX);
        self.request_deadline_nanos.store(nanos, Ordering::Relaxed);
        self.warmup_rate
            .store(settings.warmup.rate_per_sec, Ordering::Relaxed);
        self.warm_jobs_rate
            .store(settings.warm_jobs.rate_per_sec, Ordering::Relaxed);
    }

    /// `http.request_deadline_ms` in force.
    pub fn request_deadline(&self) -> Duration {
        Duration::from_nanos(self.request_deadline_nanos.load(Ordering::Relaxed))
    }

    /// `warmup.rate_per_sec` in force.
    pub fn warmup_rate(&self) -> u32 {
        self.warmup_rate.load(Ordering::Relaxed)
    }

    /// `warm_jobs.rate_per_sec` in force.
    pub fn warm_jobs_rate(&self) -> u32 {
        self.warm_jobs_rate.load(Ordering::Relaxed)
    }
}

/// The running service, as a rule set changes it.
#[derive(Debug)]
pub struct ServiceTarget {
    pub engine: QueryEngine,
    pub protection: Arc<Protection>,
    pub knobs: Arc<LiveKnobs>,
    pub answers: AnswerCounters,
    pub warm_jobs: Arc<crate::warm_jobs::WarmJobs>,
}

/// Announces a new version on the event bus (`rules_changed`); the poll heals a lost one.
#[derive(Debug)]
pub struct BusAnnouncer(pub crate::event_bus::EventBus);

#[async_trait::async_trait]
impl super::manager::Announcer for BusAnnouncer {
    async fn announce(&self, version: u64) {
        let event = match rebate_events::InvalidationEvent::rules_changed(
            rebate_events::EventId::generate(),
            version,
            rebate_domain::Timestamp::now(),
        ) {
            Ok(event) => event,
            Err(error) => {
                tracing::error!(version, %error, "cannot build the rules announcement");
                return;
            }
        };
        if let Err(error) = self.0.publisher().publish(&event).await {
            tracing::warn!(version, %error, "rules announcement not published; instances see the change at their next poll");
        }
    }
}

impl ApplyTarget for ServiceTarget {
    fn apply(&self, settings: &Settings) {
        self.protection
            .reconfigure(&settings.resilience, DependencyTimeouts::of(settings));
        for (kind, view) in self.engine.parts().views().iter() {
            let part = settings.parts.get(kind);
            // Validated with the rest of the document; a refusal here would be a bug.
            if let Err(error) = view.set_ttl(part.ttl_policy(), Some(part.l2_ttl_policy())) {
                tracing::error!(part = kind.as_str(), %error, "lifetimes refused; the part keeps its last");
            }
            view.set_refresh_lead(Duration::from_millis(part.refresh_ahead_ms));
        }
        self.engine.set_request_budget(settings.request_budget());
        self.engine.set_refresh_lead(settings.rendering_lead());
        self.knobs.set(settings);
        self.warm_jobs
            .set_rate_per_sec(settings.warm_jobs.rate_per_sec);
    }

    fn totals(&self) -> (Totals, u8) {
        let answers = self.answers.totals();
        let trips = self
            .protection
            .dependencies()
            .iter()
            .map(|guard| guard.breaker().snapshot().trips)
            .sum();
        (Totals { answers, trips }, self.protection.level().as_u8())
    }
}
