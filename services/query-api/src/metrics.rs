//! Prometheus metrics, served as OpenMetrics text on the admin listener's `/metrics`.
//!
//! Three kinds of numbers, each kept where it is cheapest:
//! - **recorded per event** here: request latency by route, status and degradation
//!   (fed by the API's trace stage, `crate::http::middleware::traced`), answers by outcome, and dependency calls by outcome ([`CallObserver`]);
//! - **read at scrape time** from the counters the caches, guards, shedder and event bus keep
//!   anyway ([`StateCollector`]), so nothing is counted twice;
//! - **derived at scrape time**: the business success ratio, for dashboards without PromQL.
//!
//! Every name starts with `rebate_`; labels are small closed sets (never a raw path or an item id).

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use rebate_cache::{CacheStatsSnapshot, PartView};
use rebate_domain::PartKind;
use rebate_engine::QueryEngine;
use rebate_guard::{CallObserver, CallOutcome};
use rebate_resilience::{AdmissionQueue, BreakerState, RequestClass, WAIT_BUCKETS_SECONDS};
use rebate_sources::BatchStats;

use crate::consistency::{CheckSource, ConsistencyObserver, Outcome};
use crate::event_bus::EventBus;
use crate::http::admin_auth::{AuthFailures, Reason};
use crate::http::routes::{BATCH_ROUTE, ITEM_ROUTE};
use crate::protection::Protection;
use crate::rules::window::AnswerTotals;
use crate::server::ConnectionStats;
use crate::upstreams::UpstreamClients;
use crate::warm_jobs::WarmJobs;

/// What `/metrics` answers with: the OpenMetrics text format that `prometheus-client` encodes
/// (Prometheus scrapes it natively).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Latency buckets in seconds, 100 µs … 5 s in 1–2.5–5 steps: fine enough to read P50, P99 and
/// P999 of a cache hit (sub-millisecond) and of a timed-out dependency (hundreds of ms) alike.
const LATENCY_BUCKETS: [f64; 15] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

type LatencyFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// What one request answered per item. The item handlers attach it to their response; the
/// request middleware hands it to [`Metrics::record_request`] and the slow-request log. Error
/// responses carry none; they are counted from their status ([`AnswerTotals`] says how).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Answered {
    /// Items answered with every part live.
    pub complete: u32,
    /// Items answered with at least one part stale or template.
    pub degraded: u32,
    /// Unknown or delisted items (batch lines only): a correct answer.
    pub not_found: u32,
    /// Items the client named wrongly (batch lines only).
    pub invalid: u32,
    /// Items answered with any other error (batch lines only).
    pub failed: u32,
}

/// The service's metrics registry and the handles the hot path records into.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: LatencyFamily<RequestLabels>,
    /// The series of answered requests (200) by route, class and degradation, each found in
    /// `requests` once: the family's map hashes the four labels with SipHash on every lookup,
    /// a thirtieth of a cached request's instructions. Filled on first use, so a series appears
    /// in the exposition only once it has a sample, as the family's others do.
    answered: [OnceLock<Histogram>; AnsweredSeries::COUNT],
    answers: Answers,
    calls: Arc<CallMetrics>,
    /// Matched requests' latency by second, for live rules' canary verdicts.
    window: Arc<crate::rules::window::RequestWindow>,
}

/// `route` is the matched path template, never the raw path: one series per route, however many
/// items are asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    route: Route,
    class: ClassLabel,
    status: u16,
    degraded: bool,
}

/// Where a 200's series sits in [`Metrics`]'s `answered`: route (other, item, batch) × class
/// (none and the three) × degraded.
struct AnsweredSeries;

impl AnsweredSeries {
    const COUNT: usize = 3 * 4 * 2;

    fn index(labels: &RequestLabels) -> Option<usize> {
        if labels.status != 200 {
            return None;
        }
        let route = match labels.route {
            Route::Other => 0,
            Route::Matched(ITEM_ROUTE) => 1,
            Route::Matched(BATCH_ROUTE) => 2,
            Route::Matched(_) => return None,
        };
        let class = match labels.class.0 {
            None => 0,
            Some(RequestClass::Prefetch) => 1,
            Some(RequestClass::List) => 2,
            Some(RequestClass::Page) => 3,
        };
        Some((route * 4 + class) * 2 + usize::from(labels.degraded))
    }
}

/// A request's class, or `other` for one refused before it had one (429, 431, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ClassLabel(Option<RequestClass>);

impl EncodeLabelValue for ClassLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), fmt::Error> {
        fmt::Write::write_str(encoder, self.0.map_or("other", RequestClass::as_str))
    }
}

/// A public route's template, or `other` for whatever only the fallbacks answer.
#[derive(Debug, Clone, Copy)]
pub enum Route {
    Matched(&'static str),
    Other,
}

impl Route {
    /// The route `path` matches ([`crate::http::routes::template_of`]).
    pub fn of(path: &str) -> Self {
        crate::http::routes::template_of(path).map_or(Route::Other, Route::Matched)
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Route::Matched(template) => template,
            Route::Other => "other",
        }
    }
}

impl PartialEq for Route {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Route {}

impl Hash for Route {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl EncodeLabelValue for Route {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), fmt::Error> {
        fmt::Write::write_str(encoder, self.as_str())
    }
}

/// Per-item answers by outcome. Fixed handles, so recording is a few atomic adds.
#[derive(Debug, Clone, Default)]
struct Answers {
    complete: Counter,
    degraded: Counter,
    not_found: Counter,
    invalid: Counter,
    limited: Counter,
    failed: Counter,
}

impl Answers {
    fn totals(&self) -> AnswerTotals {
        AnswerTotals {
            complete: self.complete.get(),
            degraded: self.degraded.get(),
            not_found: self.not_found.get(),
            invalid: self.invalid.get(),
            limited: self.limited.get(),
            failed: self.failed.get(),
        }
    }
}

/// Items answered since start, shared with [`Metrics`].
#[derive(Debug, Clone)]
pub struct AnswerCounters(Answers);

impl AnswerCounters {
    pub fn totals(&self) -> AnswerTotals {
        self.0.totals()
    }
}

/// Seconds the ratios of the exposition are over.
const RECENT_SECONDS: usize = 60;

/// The success ratio and the shares of degraded, limited and failed answers over the last
/// [`RECENT_SECONDS`] seconds (the window's slots and the part of the second under way),
/// derived at scrape time.
#[derive(Debug)]
struct RecentRatios {
    answers: Answers,
    window: Arc<crate::rules::window::RequestWindow>,
}

impl Collector for RecentRatios {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let recent = self
            .window
            .recent_answers(RECENT_SECONDS, &self.answers.totals());
        let metric = encoder.encode_descriptor(
            "rebate_business_success_ratio",
            "Complete and not-found (a correct 404) answers divided by the answers judged (all but 400-class client errors) over the last 60 s; 1 with none.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(recent.success_ratio().unwrap_or(1.0)).encode(metric)?;
        let mut family = encoder.encode_descriptor(
            "rebate_answer_ratio",
            "Degraded, limited (429) and failed (5xx) answers, each divided by the answers judged over the last 60 s; 0 with none.",
            None,
            MetricType::Gauge,
        )?;
        for (outcome, count) in [
            ("degraded", recent.degraded),
            ("limited", recent.limited),
            ("failed", recent.failed),
        ] {
            let labels = [("outcome", outcome)];
            ConstGauge::new(recent.share(count).unwrap_or(0.0))
                .encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CallLabels {
    dependency: &'static str,
    outcome: &'static str,
}

/// Every guarded dependency call (attempts and the guard's own refusals), by outcome.
#[derive(Debug)]
struct CallMetrics {
    calls: LatencyFamily<CallLabels>,
}

impl CallObserver for CallMetrics {
    fn observe(&self, dependency: &'static str, outcome: CallOutcome, elapsed: Duration) {
        let labels = CallLabels {
            dependency,
            outcome: outcome.as_str(),
        };
        self.calls
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The registry with the per-event metrics. The state collector is added by
    /// [`Metrics::collect_from`] once the state it reads exists.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests: LatencyFamily<RequestLabels> =
            Family::new_with_constructor(latency_histogram);
        registry.register_with_unit(
            "rebate_http_request_duration",
            "API request latency by route template, status code and whether any answered item was degraded",
            Unit::Seconds,
            requests.clone(),
        );
        let answers = Answers::default();
        registry.register(
            "rebate_answers",
            "Items answered, by outcome: complete (every part live), degraded (some part stale or template), not_found (404, a correct answer), invalid (400-class), limited (429), failed (5xx and failed batch lines)",
            AnswerFamily(answers.clone()),
        );
        let window = Arc::new(crate::rules::window::RequestWindow::new(
            crate::rules::window::KEPT_SECONDS,
        ));
        registry.register_collector(Box::new(RecentRatios {
            answers: answers.clone(),
            window: Arc::clone(&window),
        }));
        let calls = Arc::new(CallMetrics {
            calls: Family::new_with_constructor(latency_histogram),
        });
        registry.register_with_unit(
            "rebate_dependency_call_duration",
            "Guarded dependency calls (every attempt, and the guard's own instant refusals) by dependency and outcome",
            Unit::Seconds,
            calls.calls.clone(),
        );
        Self {
            registry,
            requests,
            answered: std::array::from_fn(|_| OnceLock::new()),
            answers,
            calls,
            window,
        }
    }

    /// Where finished requests' latency is kept by second (live rules' canary figures).
    pub fn request_window(&self) -> Arc<crate::rules::window::RequestWindow> {
        Arc::clone(&self.window)
    }

    /// A handle on the answer counters (live rules' canary figures read them every second).
    pub fn answer_counters(&self) -> AnswerCounters {
        AnswerCounters(self.answers.clone())
    }

    /// Adds live rules' version and apply counters, read at scrape time.
    pub fn collect_rules(&mut self, rules: Arc<crate::rules::manager::Rules>) {
        self.registry
            .register_collector(Box::new(RulesCollector(rules)));
    }

    /// Adds change capture's counters, read at scrape time.
    pub fn collect_change_capture(&mut self, capture: Arc<crate::change_capture::ChangeCapture>) {
        self.registry
            .register_collector(Box::new(ChangeCaptureCollector(capture)));
    }

    /// The observer every dependency guard reports its calls to.
    pub fn call_observer(&self) -> Arc<dyn CallObserver> {
        Arc::clone(&self.calls) as Arc<dyn CallObserver>
    }

    /// Adds the numbers read from the service's state at scrape time.
    pub fn collect_from(&mut self, collector: StateCollector) {
        self.registry.register_collector(Box::new(collector));
    }

    /// Adds the admin listener's authentication failures, read at scrape time.
    pub fn collect_admin_auth(&mut self, failures: Arc<AuthFailures>) {
        self.registry
            .register_collector(Box::new(AdminAuthCollector(failures)));
    }

    /// Records one finished API request: its latency, and what it answered per item. A request
    /// on a matched route that failed (status ≥ 400) without a per-item account is one failed
    /// answer; fallbacks (unknown paths) answer no item.
    pub fn record_request(
        &self,
        route: &Route,
        class: Option<RequestClass>,
        status: u16,
        answered: Option<Answered>,
        elapsed: Duration,
    ) {
        let degraded = answered.is_some_and(|answered| answered.degraded > 0);
        let labels = RequestLabels {
            route: *route,
            class: ClassLabel(class),
            status,
            degraded,
        };
        let seconds = elapsed.as_secs_f64();
        if matches!(route, Route::Matched(_)) {
            self.window.record(elapsed);
        }
        match AnsweredSeries::index(&labels) {
            Some(index) => self.answered[index]
                .get_or_init(|| self.requests.get_or_create(&labels).clone())
                .observe(seconds),
            None => self.requests.get_or_create(&labels).observe(seconds),
        }
        match answered {
            Some(answered) => {
                let answers = &self.answers;
                for (counter, count) in [
                    (&answers.complete, answered.complete),
                    (&answers.degraded, answered.degraded),
                    (&answers.not_found, answered.not_found),
                    (&answers.invalid, answered.invalid),
                    (&answers.failed, answered.failed),
                ] {
                    if count > 0 {
                        counter.inc_by(u64::from(count));
                    }
                }
            }
            None if matches!(route, Route::Matched(_)) => {
                let counter = match status {
                    404 => &self.answers.not_found,
                    429 => &self.answers.limited,
                    400..=499 => &self.answers.invalid,
                    500.. => &self.answers.failed,
                    _ => return,
                };
                counter.inc();
            }
            None => {}
        }
    }

    /// The whole exposition, `# EOF` included.
    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut text = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// `rebate_answers_total{outcome}` over the fixed counters.
#[derive(Debug)]
struct AnswerFamily(Answers);

impl EncodeMetric for AnswerFamily {
    fn encode(&self, mut encoder: prometheus_client::encoding::MetricEncoder<'_>) -> fmt::Result {
        for (outcome, counter) in [
            ("complete", &self.0.complete),
            ("degraded", &self.0.degraded),
            ("not_found", &self.0.not_found),
            ("invalid", &self.0.invalid),
            ("limited", &self.0.limited),
            ("failed", &self.0.failed),
        ] {
            let labels = [("outcome", outcome)];
            counter.encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// One part cache's counters, read once per scrape.
struct PartStats {
    part: &'static str,
    has_l2: bool,
    stats: CacheStatsSnapshot,
}

impl PartStats {
    fn of(part: PartKind, cache: &dyn PartView) -> Self {
        Self {
            part: part.as_str(),
            has_l2: cache.shared_tier().is_some(),
            stats: cache.stats(),
        }
    }
}

/// A per-part counter family: name, help, and the snapshot field it reads.
type PartCounter = (&'static str, &'static str, fn(&CacheStatsSnapshot) -> u64);

/// Reads, at scrape time, the counters the caches, the Bloom filter, the guards, the shedder,
/// the client limiter, the event bus and the warm-job consumer keep anyway. Holds clones of what it reads (all cheap
/// handles), not the `AppState`, which holds the metrics.
#[derive(Debug)]
pub struct StateCollector {
    engine: QueryEngine,
    protection: Arc<Protection>,
    events: EventBus,
    consistency: Arc<ConsistencyObserver>,
    upstreams: UpstreamClients,
    connections: Arc<ConnectionStats>,
    warm_jobs: Arc<WarmJobs>,
}

impl StateCollector {
    pub fn new(
        engine: QueryEngine,
        protection: Arc<Protection>,
        events: EventBus,
        consistency: Arc<ConsistencyObserver>,
        upstreams: UpstreamClients,
        connections: Arc<ConnectionStats>,
        warm_jobs: Arc<WarmJobs>,
    ) -> Self {
        Self {
            warm_jobs,
            connections,
            consistency,
            engine,
            protection,
            events,
            upstreams,
        }
    }

    fn encode_caches(&self, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let caches: Vec<PartStats> = self
            .engine
            .parts()
            .views()
            .iter()
            .map(|(part, cache)| PartStats::of(part, *cache))
            .collect();
        // L2 series only for parts that have an L2 tier: zeros for a tier that does not exist
        // would read as a tier that never hits.
        let with_l2 = || caches.iter().filter(|cache| cache.has_l2);
        let lookups = caches.iter().flat_map(|cache| {
            let stats = &cache.stats;
            let l2 = [
                ("l2", "hit", stats.l2_hits),
                ("l2", "miss", stats.l2_misses),
            ];
            [("l1", "hit", stats.hits), ("l1", "miss", stats.misses)]
                .into_iter()
                .chain(l2.into_iter().filter(|_| cache.has_l2))
                .map(|(tier, result, count)| {
                    (
                        [("part", cache.part), ("tier", tier), ("result", result)],
                        count,
                    )
                })
        });
        counters(
            encoder,
            "rebate_cache_lookups",
            "Cache lookups by part, tier (l1; l2 where configured) and result (hit: a fresh entry; miss).",
            lookups,
        )?;
        let ratios = caches.iter().flat_map(|cache| {
            let stats = &cache.stats;
            let l2 = ("l2", stats.l2_hits, stats.l2_misses);
            [("l1", stats.hits, stats.misses)]
                .into_iter()
                .chain(std::iter::once(l2).filter(|_| cache.has_l2))
                .filter(|(_, hits, misses)| hits + misses > 0)
                .map(|(tier, hits, misses)| {
                    (
                        [("part", cache.part), ("tier", tier)],
                        hits as f64 / (hits + misses) as f64,
                    )
                })
        });
        gauges(
            encoder,
            "rebate_cache_hit_ratio",
            "Hits divided by lookups since start, by part and tier; absent for a tier nothing was looked up in.",
            ratios,
        )?;
        let per_part: [PartCounter; 8] = [
            (
                "rebate_cache_single_flight_joins",
                "Callers that joined a load already in flight for the same key instead of starting one.",
                |stats| stats.loads_joined,
            ),
            (
                "rebate_cache_loads",
                "Loads started (L2 read, lease, source) for keys L1 could not answer fresh.",
                |stats| stats.loads_started,
            ),
            (
                "rebate_cache_source_loads",
                "Loads that reached the source (store or upstream API).",
                |stats| stats.source_loads,
            ),
            (
                "rebate_cache_load_failures",
                "Loads that failed (timeout, error, breaker, bulkhead, quota).",
                |stats| stats.load_failures,
            ),
            (
                "rebate_cache_stale_served",
                "Answers served from a stale entry after a failed or late load.",
                |stats| stats.stale_served,
            ),
            (
                "rebate_cache_not_found_cached",
                "Not-found markers cached for ids that passed the Bloom filter but do not exist.",
                |stats| stats.not_found_cached,
            ),
            (
                "rebate_cache_invalidations",
                "Invalidation fences applied.",
                |stats| stats.invalidations,
            ),
            (
                "rebate_cache_fences_lifted",
                "L1 fences lifted because a load found the store more than events.max_version_gap behind the event.",
                |stats| stats.fences_lifted,
            ),
        ];
        for (name, help, read) in per_part {
            counters(
                encoder,
                name,
                help,
                caches
                    .iter()
                    .map(|cache| ([("part", cache.part)], read(&cache.stats))),
            )?;
        }
        if let Some(rendered) = self.engine.rendered_stats() {
            const NO_LABELS: [(&str, &str); 0] = [];
            let rendered_counters: [(&str, &str, u64); 3] = [
                (
                    "rebate_rendered_quotes_served",
                    "Quotes answered from a kept rendering (no part lookup, no serialisation); these requests do not appear in the L1 lookups.",
                    rendered.hits,
                ),
                (
                    "rebate_rendered_quotes_kept",
                    "Complete quotes rendered and kept until a part stops being fresh, a coupon expires or a change event arrives.",
                    rendered.inserts,
                ),
                (
                    "rebate_rendered_quotes_fenced",
                    "Renderings refused because an invalidation raced them.",
                    rendered.fenced,
                ),
            ];
            for (name, help, value) in rendered_counters {
                counters(encoder, name, help, [(NO_LABELS, value)])?;
            }
            gauges(
                encoder,
                "rebate_rendered_quotes_bytes",
                "Bytes of JSON held by kept renderings.",
                [(NO_LABELS, rendered.bytes)],
            )?;
        }
        gauges(
            encoder,
            "rebate_cache_entries",
            "Entries in L1 (moka's estimate), by part.",
            caches
                .iter()
                .map(|cache| ([("part", cache.part)], cache.stats.entries)),
        )?;
        if with_l2().next().is_none() {
            return Ok(());
        }
        counters(
            encoder,
            "rebate_cache_l2_errors",
            "L2 commands that failed or timed out (the tier was skipped).",
            with_l2().map(|cache| ([("part", cache.part)], cache.stats.l2_errors)),
        )?;
        counters(
            encoder,
            "rebate_cache_leases",
            "Cross-instance rebuild leases by part and result (won: this instance rebuilt; lost: waited for another).",
            with_l2().flat_map(|cache| {
                [
                    ("won", cache.stats.leases_won),
                    ("lost", cache.stats.leases_lost),
                ]
                .map(|(result, count)| ([("part", cache.part), ("result", result)], count))
            }),
        )?;
        counters(
            encoder,
            "rebate_cache_lease_stale_answers",
            "Lost leases answered at once with the stale copy held, while the winner rebuilt.",
            with_l2().map(|cache| {
                (
                    [("part", cache.part)],
                    cache.stats.lease_losses_served_stale,
                )
            }),
        )?;
        counters(
            encoder,
            "rebate_cache_lease_waits",
            "Waits for a lease winner's value by outcome (winner_value: it arrived; gave_up: it did not in time).",
            with_l2().flat_map(|cache| {
                [
                    ("winner_value", cache.stats.lease_waits_served),
                    ("gave_up", cache.stats.lease_waits_given_up),
                ]
                .map(|(outcome, count)| ([("part", cache.part), ("outcome", outcome)], count))
            }),
        )
    }

    fn encode_bloom(&self, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let Some(filter) = self.engine.item_filter() else {
            return Ok(());
        };
        let stats = filter.stats();
        single_gauge(
            encoder,
            "rebate_bloom_ready",
            "1 once the Bloom filter of item keys is built (every key passes before).",
            u64::from(stats.ready),
        )?;
        single_gauge(
            encoder,
            "rebate_bloom_keys",
            "Keys in the Bloom filter.",
            stats.keys,
        )?;
        single_counter(
            encoder,
            "rebate_bloom_checks",
            "Keys checked against the Bloom filter.",
            stats.checks,
        )?;
        single_counter(
            encoder,
            "rebate_bloom_rejections",
            "Unknown keys refused by the Bloom filter before any cache tier.",
            stats.rejections,
        )
    }

    fn encode_dependencies(&self, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let snapshots = self
            .protection
            .dependencies()
            .map(|dependency| dependency.snapshot());
        let by_dependency = |read: fn(&rebate_guard::DependencySnapshot) -> u64| {
            snapshots
                .iter()
                .map(move |snapshot| ([("dependency", snapshot.name)], read(snapshot)))
        };
        gauges(
            encoder,
            "rebate_breaker_state",
            "Circuit breaker state by dependency: 0 closed, 1 half-open, 2 open.",
            by_dependency(|snapshot| match snapshot.breaker.state {
                BreakerState::Closed => 0,
                BreakerState::HalfOpen => 1,
                BreakerState::Open => 2,
            }),
        )?;
        counters(
            encoder,
            "rebate_breaker_trips",
            "Times the breaker opened.",
            by_dependency(|snapshot| snapshot.breaker.trips),
        )?;
        counters(
            encoder,
            "rebate_breaker_rejected",
            "Calls the breaker refused.",
            by_dependency(|snapshot| snapshot.breaker.rejected),
        )?;
        gauges(
            encoder,
            "rebate_bulkhead_in_flight",
            "Calls in flight through the dependency's bulkhead.",
            by_dependency(|snapshot| u64::from(snapshot.bulkhead.in_flight)),
        )?;
        gauges(
            encoder,
            "rebate_bulkhead_max",
            "The bulkhead's bound on concurrent calls.",
            by_dependency(|snapshot| u64::from(snapshot.bulkhead.max)),
        )?;
        counters(
            encoder,
            "rebate_bulkhead_rejected",
            "Calls refused because the bulkhead was full.",
            by_dependency(|snapshot| snapshot.bulkhead.rejected),
        )?;
        counters(
            encoder,
            "rebate_quota_refused",
            "Calls refused by the outbound quota (dependencies with a quota only).",
            snapshots.iter().filter_map(|snapshot| {
                let quota = snapshot.quota.as_ref()?;
                Some(([("dependency", snapshot.name)], quota.refused))
            }),
        )?;
        counters(
            encoder,
            "rebate_hot_item_refused",
            "Loads refused because their item's own share of loads toward the dependency was spent (hot items; dependencies with the per-item limit only). By dependency only, never by item: the hot keys' page names the items.",
            snapshots.iter().filter_map(|snapshot| {
                snapshot.hot_items.as_ref()?;
                Some(([("dependency", snapshot.name)], snapshot.rejected_hot_item))
            }),
        )?;
        counters(
            encoder,
            "rebate_retries",
            "Retries made (dependencies that retry only).",
            snapshots.iter().filter_map(|snapshot| {
                let retry = snapshot.retry.as_ref()?;
                Some(([("dependency", snapshot.name)], retry.retries))
            }),
        )?;
        counters(
            encoder,
            "rebate_retries_refused",
            "Retries the global retry budget refused.",
            snapshots.iter().filter_map(|snapshot| {
                let retry = snapshot.retry.as_ref()?;
                Some(([("dependency", snapshot.name)], retry.refused))
            }),
        )?;
        let batches = self.upstreams.batch_stats();
        let by_api = |read: fn(&BatchStats) -> u64| {
            [("coupons", batches.coupons), ("extras", batches.extras)]
                .into_iter()
                .filter_map(move |(api, stats)| Some(([("dependency", api)], read(&stats?))))
        };
        counters(
            encoder,
            "rebate_upstream_batch_calls",
            "Batch calls made to an external API (APIs with batching on only).",
            by_api(|stats| stats.calls),
        )?;
        counters(
            encoder,
            "rebate_upstream_batch_items",
            "Item ids sent in batch calls: items / calls is the mean batch size.",
            by_api(|stats| stats.items),
        )
    }

    fn encode_edge(&self, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let protection = &self.protection;
        single_gauge(
            encoder,
            "rebate_shed_level",
            "The load-shedding level new requests are served at: 0 normal, 1 drop extras, 2 short timeouts, 3 cache only.",
            u64::from(protection.level().as_u8()),
        )?;
        if let Some(shedder) = &protection.shedder {
            let snapshot = shedder.snapshot();
            single_gauge(
                encoder,
                "rebate_shed_forced",
                "1 while an operator pins the shed level.",
                u64::from(snapshot.forced.is_some()),
            )?;
            single_gauge(
                encoder,
                "rebate_shed_load",
                "The last load the shedder measured (1.0 = full load: a standing queue at the target, in-flight at the limit, or the saturated rate held at level 3).",
                snapshot.load,
            )?;
            single_gauge(
                encoder,
                "rebate_in_flight_requests",
                "API requests admitted and not yet answered.",
                snapshot.in_flight,
            )?;
            single_gauge(
                encoder,
                "rebate_concurrency_limit",
                "The shedder's (adaptive) concurrency limit.",
                snapshot.concurrency_limit,
            )?;
            single_gauge(
                encoder,
                "rebate_shed_queue_delay_seconds",
                "The queue delay the shedder compares (the runtime's or the listener's accept queue's, whichever is longer at each probe): the lower of the last two intervals' minimum probe reports.",
                snapshot.queue_delay_ms / 1e3,
            )?;
            if let Some(busy) = snapshot.worker_busy {
                single_gauge(
                    encoder,
                    "rebate_runtime_worker_busy_ratio",
                    "The share of the last shedding interval the runtime's workers were busy (in-flight overload with busy workers is saturation).",
                    busy,
                )?;
            }
        }
        let report = self.consistency.report();
        counters(
            encoder,
            "rebate_consistency_checks",
            "The consistency observer's checks of product and rate copies (kept rendering, L1, L2) against the store, by source (event: an operator's event; binlog: change capture's; sample: the drift sampler, no event), window after the event or first look, and outcome: consistent, inconsistent (a tier would serve a version older than the event's; for sample, one the store's row does not match), unknown (L2 or the store could not be read), ahead_of_store (events only: the store's row is more than events.max_version_gap behind the event, or has not reached it by the first window at or after events.fence_secs).",
            CheckSource::ALL.into_iter().flat_map(|source| {
                report.sources.get(source).iter().flat_map(move |window| {
                    let label = window_label(window.window_ms);
                    Outcome::ALL.map(|outcome| {
                        (
                            [
                                ("source", source.as_str().to_owned()),
                                ("window", label.clone()),
                                ("outcome", outcome.as_str().to_owned()),
                            ],
                            window.count(outcome),
                        )
                    })
                })
            }),
        )?;
        single_counter(
            encoder,
            "rebate_consistency_ahead_of_store",
            "Sampled events the consistency observer found ahead of the store's row, once per event, item and part (each is logged once).",
            report.ahead_of_store,
        )?;
        let warming = self.engine.cache_only_loads();
        counters(
            encoder,
            "rebate_cache_only_loads",
            "Keys shed level 3 found incomplete in L1: started (loaded at level 2 under one of engine.cache_only_loads permits) or refused (answered from L1 alone, every permit taken).",
            [("started", warming.started), ("refused", warming.refused)]
                .map(|(result, count)| ([("result", result)], count)),
        )?;
        let (clients, refused) = protection
            .clients
            .as_ref()
            .map_or((0, 0), |clients| clients.limiter.stats());
        single_gauge(
            encoder,
            "rebate_client_limit_clients",
            "Clients with a token bucket (0 when the per-client limit is off).",
            clients,
        )?;
        single_counter(
            encoder,
            "rebate_client_limit_refused",
            "Requests refused with 429 by the per-client limit.",
            refused,
        )?;
        counters(
            encoder,
            "rebate_shed_refused",
            "Requests refused with 503 because their class gives way at the shed level (prefetch from level 2).",
            protection
                .refused_by_class()
                .map(|(class, refused)| ([("class", class.as_str())], refused)),
        )?;
        match &protection.admission_queue {
            Some(queue) => encode_admission_queue(encoder, queue),
            None => Ok(()),
        }
    }

    fn encode_connections(&self, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let connections = self.connections.snapshot();
        single_gauge(
            encoder,
            "rebate_http_connections_open",
            "Connections open on the API listener.",
            connections.open,
        )?;
        counters(
            encoder,
            "rebate_http_connections",
            "Connections the API listener took off its accept queue: accepted, or refused at the listener's or the peer address's cap (answered 503 and closed).",
            [
                ("accepted", connections.accepted),
                ("refused_listener_full", connections.refused_listener_full),
                ("refused_peer_full", connections.refused_peer_full),
            ]
            .map(|(result, count)| ([("result", result)], count)),
        )?;
        single_gauge(
            encoder,
            "rebate_http_connections_idle",
            "Connections on the API listener waiting for a next request with their last answer sent, at the watchdog's last sweep: the ones a new connection may replace at the cap.",
            connections.idle,
        )?;
        single_gauge(
            encoder,
            "rebate_http_idle_timeout_seconds",
            "The idle timeout a connection gets now: http.idle_timeout_ms, shrinking toward http.idle_timeout_floor_ms once more than http.idle_shrink_from of the connections are open.",
            connections.idle_timeout_ms as f64 / 1e3,
        )?;
        let idle_closes = connections.idle_closes;
        counters(
            encoder,
            "rebate_http_idle_closes",
            "Idle keep-alive connections the API listener closed: the oldest idle one, to admit a new connection at the listener's or an address's cap (evicted_for_new), or at the idle timeout of the moment (idle_timeout).",
            [
                ("evicted_for_new", idle_closes.evicted_for_new),
                ("idle_timeout", idle_closes.idle_timeout),
            ]
            .map(|(reason, count)| ([("reason", reason)], count)),
        )?;
        let late = connections.watchdog_closes;
        counters(
            encoder,
            "rebate_http_watchdog_closes",
            "Connections the listener's watchdog closed because their own task had not acted within 20 ms of a deadline (the runtime's queues were that long), by the deadline: the request head, the body, a write (stalled, or the close due after an answer that ends the connection), the idle timeout.",
            [
                ("head", late.head),
                ("body", late.body),
                ("write", late.write),
                ("idle", late.idle),
            ]
            .map(|(deadline, count)| ([("deadline", deadline)], count)),
        )?;
        let Some(queue) = connections.listen_queue else {
            return Ok(());
        };
        single_gauge(
            encoder,
            "rebate_listen_queue_connections",
            "Connections in the API listener's kernel accept queue at the shedder probe's last reading.",
            queue.queued,
        )?;
        single_gauge(
            encoder,
            "rebate_listen_queue_backlog",
            "The most connections the kernel queues for the API listener before it drops handshakes.",
            queue.backlog,
        )?;
        single_counter(
            encoder,
            "rebate_listen_queue_drops",
            "Handshakes the kernel dropped because the API listener's accept queue was full (each client retries a second later, then 3 s, 7 s, …).",
            queue.dropped,
        )?;
        single_gauge(
            encoder,
            "rebate_listen_queue_wait_seconds",
            "The time a connection waits to be served, estimated at the last reading: the kernel's accept queue, or the accepted connections whose task has not begun, over the rate they leave it (the larger), or at least 1 s within a second of a drop.",
            queue.wait_ms / 1e3,
        )
    }

    fn encode_events(&self, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let stats = self.events.stats();
        counters(
            encoder,
            "rebate_events",
            "Invalidation events by result: published (by this instance), processed (a delivery the handler accepted), failed (a delivery refused or failed; each is redelivered, dead-lettered or abandoned), redelivered, dead_lettered, abandoned (its L1 fences in place, its L2 fence never written: acknowledged, not a poison message).",
            [
                ("published", stats.published),
                ("processed", stats.processed),
                ("failed", stats.failed),
                ("redelivered", stats.redelivered),
                ("dead_lettered", stats.dead_lettered),
                ("abandoned", stats.abandoned),
            ]
            .map(|(result, count)| ([("result", result)], count)),
        )?;
        single_gauge(
            encoder,
            "rebate_events_connected",
            "1 while events can flow (always for the in-process bus; while connected for RabbitMQ).",
            u64::from(self.events.is_ready()),
        )
    }
}

impl StateCollector {
    /// This instance's share of the fleet's warm jobs (a job's own progress is its route's).
    fn encode_warm_jobs(&self, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let stats = self.warm_jobs.stats();
        counters(
            encoder,
            "rebate_warm_job_chunks",
            "Warm-job chunks this instance finished, by result: done (acknowledged and counted), claimed (taken over from a consumer that stopped touching its chunk), abandoned (left unacknowledged: shutdown, or claimed meanwhile), counted_elsewhere (finished after another instance had acknowledged it).",
            [
                ("done", stats.chunks_done),
                ("claimed", stats.chunks_claimed),
                ("abandoned", stats.chunks_abandoned),
                ("counted_elsewhere", stats.chunks_counted_elsewhere),
            ]
            .map(|(result, count)| ([("result", result)], count)),
        )?;
        counters(
            encoder,
            "rebate_warm_job_keys",
            "Keys of warm-job chunks this instance counted, by result: loaded, not_found, failed.",
            [
                ("loaded", stats.keys_loaded),
                ("not_found", stats.keys_not_found),
                ("failed", stats.keys_failed),
            ]
            .map(|(result, count)| ([("result", result)], count)),
        )?;
        single_gauge(
            encoder,
            "rebate_warm_jobs_paused",
            "1 while this instance's warm-job consumer waits for the shed level to return to 0.",
            u64::from(stats.paused),
        )
    }
}

impl Collector for StateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        self.encode_caches(&mut encoder)?;
        self.encode_bloom(&mut encoder)?;
        self.encode_dependencies(&mut encoder)?;
        self.encode_edge(&mut encoder)?;
        self.encode_connections(&mut encoder)?;
        self.encode_events(&mut encoder)?;
        self.encode_warm_jobs(&mut encoder)?;
        encode_memory(&mut encoder)
    }
}

/// `rebate_rules_version` and `rebate_rules_applied_total{outcome}`: live rules on this
/// instance.
#[derive(Debug)]
struct RulesCollector(Arc<crate::rules::manager::Rules>);

impl Collector for RulesCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let rules = &self.0;
        single_gauge(
            &mut encoder,
            "rebate_rules_version",
            "The live rule set version this instance runs (0: the config file's values).",
            rules.applied().version,
        )?;
        let counters_of = &rules.counters;
        counters(
            &mut encoder,
            "rebate_rules_applied",
            "Rule set versions this instance switched to, by outcome: applied, invalid (the version does not check against this instance's config file; the last one stays), store_failed (a poll could not read the store).",
            [
                ("applied", &counters_of.applied),
                ("invalid", &counters_of.invalid),
                ("store_failed", &counters_of.store_failed),
            ]
            .map(|(outcome, count)| {
                (
                    [("outcome", outcome)],
                    count.load(std::sync::atomic::Ordering::Relaxed),
                )
            }),
        )
    }
}

/// `rebate_change_capture_*`: the binlog reader's role and counts on this instance.
#[derive(Debug)]
struct ChangeCaptureCollector(Arc<crate::change_capture::ChangeCapture>);

impl Collector for ChangeCaptureCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let status = self.0.status();
        single_gauge(
            &mut encoder,
            "rebate_change_capture_reader",
            "Whether this instance holds the change capture lease and reads the binlog (1) or stands by (0).",
            i64::from(status.role == crate::change_capture::Role::Reader),
        )?;
        single_counter(
            &mut encoder,
            "rebate_change_capture_events",
            "Invalidation events this instance published for rows changed in the binlog, as the reader.",
            status.events_published,
        )?;
        counters(
            &mut encoder,
            "rebate_change_capture_rows",
            "Changed rows of the followed tables this instance read, as the reader: read (all of them), unversioned (updated without a new version: their fence cannot displace a copy cached at that version).",
            [
                ([("outcome", "read")], status.rows),
                ([("outcome", "unversioned")], status.unversioned_rows),
            ],
        )?;
        counters(
            &mut encoder,
            "rebate_change_capture_resyncs",
            "Fleet-wide resyncs: started (decided by this instance as the reader, when it could not prove no change was missed), applied (carried out here: L1 and renderings dropped, older L2 copies ignored).",
            [
                ([("step", "started")], status.resyncs_started),
                ([("step", "applied")], status.resyncs_applied),
            ],
        )
    }
}

/// `rebate_admin_auth_failures_total{reason}`: the admin listener's refused token checks.
#[derive(Debug)]
struct AdminAuthCollector(Arc<AuthFailures>);

impl Collector for AdminAuthCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let stats = self.0.stats();
        counters(
            &mut encoder,
            "rebate_admin_auth_failures",
            "Admin requests refused for their token, by reason: missing (no bearer token), invalid (a wrong token), throttled (429 unread: the peer offered admin.auth_throttle.max_failures wrong tokens).",
            Reason::ALL.map(|reason| {
                (
                    [("reason", reason.as_str())],
                    stats.by_reason[reason as usize],
                )
            }),
        )?;
        single_gauge(
            &mut encoder,
            "rebate_admin_auth_tracked_peers",
            "Peers in the admin listener's failure table (at most admin.auth_throttle.tracked_peers).",
            u64::try_from(stats.tracked_peers).unwrap_or(u64::MAX),
        )
    }
}

fn encode_memory(encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
    let memory = crate::memory::MemoryStats::read();
    if let Some(rss) = memory.rss_bytes {
        single_gauge(
            encoder,
            "rebate_process_resident_memory_bytes",
            "The process's resident set (VmRSS).",
            rss,
        )?;
    }
    let Some(heap) = memory.heap else {
        return Ok(());
    };
    gauges(
        encoder,
        "rebate_heap_bytes",
        "jemalloc's counters: allocated (live data), active (pages holding live data), resident (allocator pages in memory), metadata, retained (unmapped, kept for reuse).",
        [
            ("allocated", heap.allocated_bytes),
            ("active", heap.active_bytes),
            ("resident", heap.resident_bytes),
            ("metadata", heap.metadata_bytes),
            ("retained", heap.retained_bytes),
        ]
        .map(|(kind, bytes)| ([("kind", kind)], bytes)),
    )
}

/// The deferrable classes' admission wait, read from the queue's counters at scrape time: the
/// depth now, every outcome, and the waits that ended as a histogram.
fn encode_admission_queue(
    encoder: &mut DescriptorEncoder<'_>,
    queue: &AdmissionQueue,
) -> fmt::Result {
    let snapshot = queue.snapshot();
    gauges(
        encoder,
        "rebate_admission_queue_depth",
        "Requests waiting for admission now, by class (only the classes that may wait).",
        snapshot
            .classes
            .iter()
            .map(|class| ([("class", class.class.as_str())], u64::from(class.waiting))),
    )?;
    gauges(
        encoder,
        "rebate_admission_queue_peak_depth",
        "The most requests of a class that have waited for admission at once since start (never above the class's max_waiters; a scrape of the depth misses peaks between scrapes).",
        snapshot.classes.iter().map(|class| {
            (
                [("class", class.class.as_str())],
                u64::from(class.peak_waiting),
            )
        }),
    )?;
    counters(
        encoder,
        "rebate_admission_wait_outcomes",
        "Requests of a class that may wait that met a full queue or waited, by class and outcome: admitted (after waiting), full (503 at once), timed_out (503 once the class's wait ran out), cancelled (the client went away while waiting).",
        snapshot.classes.iter().flat_map(|class| {
            [
                ("admitted", class.admitted),
                ("full", class.refused_full),
                ("timed_out", class.timed_out),
                ("cancelled", class.cancelled),
            ]
            .map(|(outcome, count)| {
                (
                    [("class", class.class.as_str()), ("outcome", outcome)],
                    count,
                )
            })
        }),
    )?;
    let mut metric = encoder.encode_descriptor(
        "rebate_admission_wait_seconds",
        "How long requests waited for admission, by class (every wait that ended: admitted, timed out or cancelled).",
        None,
        MetricType::Histogram,
    )?;
    for class in &snapshot.classes {
        // Upper bounds as the histogram type writes them, the last one `+Inf`.
        let buckets: Vec<(f64, u64)> = WAIT_BUCKETS_SECONDS
            .iter()
            .copied()
            .chain(std::iter::once(f64::MAX))
            .zip(class.wait_buckets.iter().copied())
            .collect();
        metric
            .encode_family(&[("class", class.class.as_str())])?
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            class.wait_seconds_sum,
            class.waits,
            &buckets,
            None,
        )?;
    }
    Ok(())
}

/// One counter family: its descriptor, then a sample per label set.
/// `1s` for whole seconds, else `250ms`.
fn window_label(window_ms: u64) -> String {
    if window_ms.is_multiple_of(1_000) {
        format!("{}s", window_ms / 1_000)
    } else {
        format!("{window_ms}ms")
    }
}

fn counters<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, u64)>,
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in samples {
        ConstCounter::new(value).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// One gauge family: its descriptor, then a sample per label set.
fn gauges<L: EncodeLabelSet, V: prometheus_client::encoding::EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, V)>,
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        ConstGauge::new(value).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

fn single_counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: u64,
) -> fmt::Result {
    let metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    ConstCounter::new(value).encode(metric)
}

fn single_gauge<V: prometheus_client::encoding::EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: V,
) -> fmt::Result {
    let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(value).encode(metric)
}

/// The value of one series in an exposition (tests read what `/metrics` would answer).
#[cfg(test)]
pub(crate) fn sample<'a>(text: &'a str, series: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_answered_series_has_its_own_slot_and_lands_in_the_family() {
        let mut seen = std::collections::HashSet::new();
        for route in [
            Route::Other,
            Route::Matched(ITEM_ROUTE),
            Route::Matched(BATCH_ROUTE),
        ] {
            for class in [None]
                .into_iter()
                .chain(RequestClass::ALL.into_iter().map(Some))
            {
                for degraded in [false, true] {
                    let labels = RequestLabels {
                        route,
                        class: ClassLabel(class),
                        status: 200,
                        degraded,
                    };
                    let index = AnsweredSeries::index(&labels).unwrap();
                    assert!(index < AnsweredSeries::COUNT && seen.insert(index));
                    let other_status = RequestLabels {
                        status: 503,
                        ..labels
                    };
                    assert_eq!(AnsweredSeries::index(&other_status), None);
                }
            }
        }
        assert_eq!(seen.len(), AnsweredSeries::COUNT);

        let metrics = Metrics::new();
        let item = Route::Matched(ITEM_ROUTE);
        for status in [200, 200, 200, 429] {
            metrics.record_request(
                &item,
                Some(RequestClass::Page),
                status,
                None,
                Duration::from_millis(1),
            );
        }
        let text = metrics.encode().unwrap();
        let count = |status: u16| {
            sample(
                &text,
                &format!(
                    r#"rebate_http_request_duration_seconds_count{{route="{ITEM_ROUTE}",class="page",status="{status}",degraded="false"}}"#
                ),
            )
            .map(str::to_owned)
        };
        assert_eq!(count(200).as_deref(), Some("3"), "{text}");
        assert_eq!(count(429).as_deref(), Some("1"), "{text}");
        assert!(
            !text.contains(r#"degraded="true""#),
            "a series without samples is not shown: {text}"
        );
    }

    #[test]
    fn the_success_ratio_is_one_before_any_answer_then_complete_over_all() {
        let metrics = Metrics::new();
        assert_eq!(metrics.answers.totals().success_ratio(), None);
        let text = metrics.encode().unwrap();
        assert_eq!(sample(&text, "rebate_business_success_ratio"), Some("1.0"));

        let route = Route::Other;
        let answered = Answered {
            complete: 3,
            degraded: 1,
            ..Answered::default()
        };
        metrics.record_request(
            &route,
            Some(RequestClass::Page),
            200,
            Some(answered),
            Duration::from_millis(2),
        );
        assert_eq!(metrics.answers.totals().success_ratio(), Some(0.75));
        let text = metrics.encode().unwrap();
        assert_eq!(
            sample(&text, r#"rebate_answers_total{outcome="complete"}"#),
            Some("3")
        );
        assert_eq!(
            sample(&text, r#"rebate_answers_total{outcome="degraded"}"#),
            Some("1")
        );
        assert_eq!(sample(&text, "rebate_business_success_ratio"), Some("0.75"));
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn a_correct_404_is_a_success_a_client_error_is_not_judged_and_429s_have_their_ratio() {
        let metrics = Metrics::new();
        let item = Route::Matched(ITEM_ROUTE);
        let record = |status: u16, answered: Option<Answered>| {
            metrics.record_request(&item, None, status, answered, Duration::from_millis(1));
        };
        record(200, Some(answered_complete()));
        record(404, None);
        record(400, None);
        record(429, None);
        record(503, None);
        let text = metrics.encode().unwrap();
        for (outcome, count) in [
            ("complete", "1"),
            ("not_found", "1"),
            ("invalid", "1"),
            ("limited", "1"),
            ("failed", "1"),
        ] {
            let series = format!(r#"rebate_answers_total{{outcome="{outcome}"}}"#);
            assert_eq!(sample(&text, &series), Some(count), "{outcome}");
        }
        // Judged: all but the 400. A success: the 200 and the 404.
        assert_eq!(sample(&text, "rebate_business_success_ratio"), Some("0.5"));
        for outcome in ["limited", "failed"] {
            let series = format!(r#"rebate_answer_ratio{{outcome="{outcome}"}}"#);
            assert_eq!(sample(&text, &series), Some("0.25"), "{outcome}");
        }
        assert_eq!(
            sample(&text, r#"rebate_answer_ratio{outcome="degraded"}"#),
            Some("0.0")
        );
    }

    #[test]
    fn the_ratios_are_over_the_last_minute() {
        use crate::rules::window::Totals;

        let metrics = Metrics::new();
        let item = Route::Matched(ITEM_ROUTE);
        let close_second = |second: u64| {
            let totals = Totals {
                answers: metrics.answers.totals(),
                trips: 0,
            };
            metrics.window.sample(second, totals, 0);
        };
        close_second(1_000);
        // A bad second: every answer failed.
        for _ in 0..10 {
            metrics.record_request(&item, None, 503, None, Duration::from_millis(1));
        }
        close_second(1_001);
        let text = metrics.encode().unwrap();
        assert_eq!(sample(&text, "rebate_business_success_ratio"), Some("0.0"));
        // A minute of good seconds later, the bad one has left the window.
        for second in 1_002..1_062 {
            metrics.record_request(
                &item,
                None,
                200,
                Some(answered_complete()),
                Duration::from_millis(1),
            );
            close_second(second);
        }
        let text = metrics.encode().unwrap();
        assert_eq!(sample(&text, "rebate_business_success_ratio"), Some("1.0"));
        assert_eq!(
            sample(&text, r#"rebate_answer_ratio{outcome="failed"}"#),
            Some("0.0")
        );
        // Since start, the failures are still counted.
        assert_eq!(
            sample(&text, r#"rebate_answers_total{outcome="failed"}"#),
            Some("10")
        );
    }

    fn answered_complete() -> Answered {
        Answered {
            complete: 1,
            ..Answered::default()
        }
    }

    #[test]
    fn dependency_calls_are_timed_by_outcome() {
        let metrics = Metrics::new();
        let observer = metrics.call_observer();
        observer.observe("coupons", CallOutcome::Timeout, Duration::from_millis(300));
        observer.observe("coupons", CallOutcome::BreakerOpen, Duration::ZERO);
        let text = metrics.encode().unwrap();
        let prefix = "rebate_dependency_call_duration_seconds";
        assert_eq!(
            sample(
                &text,
                &format!(r#"{prefix}_count{{dependency="coupons",outcome="timeout"}}"#)
            ),
            Some("1")
        );
        // 300 ms falls in the 0.5 s bucket, not the 0.25 s one.
        assert_eq!(
            sample(
                &text,
                &format!(r#"{prefix}_bucket{{le="0.25",dependency="coupons",outcome="timeout"}}"#)
            ),
            Some("0")
        );
        assert_eq!(
            sample(
                &text,
                &format!(r#"{prefix}_bucket{{le="0.5",dependency="coupons",outcome="timeout"}}"#)
            ),
            Some("1")
        );
        assert_eq!(
            sample(
                &text,
                &format!(r#"{prefix}_count{{dependency="coupons",outcome="breaker_open"}}"#)
            ),
            Some("1")
        );
    }
}
