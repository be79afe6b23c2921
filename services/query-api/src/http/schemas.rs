//! Schema-only types for the OpenAPI document ([`super::openapi`]): the JSON the service
//! writes — some of it by hand, such as the kept renderings and the trace id appended to them —
//! and the bodies it takes, described field by field. Contract: each type matches its JSON
//! exactly; they derive `Deserialize` with unknown fields denied so that tests hold real answers
//! to them (and the document says `additionalProperties: false`); the service never builds them,
//! so nothing here runs on the request path.

use serde::Deserialize;
use utoipa::ToSchema;

// The enums the service itself (de)serialises derive their schemas where they are defined (each
// crate's `openapi` feature): a copy here would drift when a variant is added.
pub use rebate_domain::{ErrorCode, PartKind};
pub use rebate_engine::{DegradeReason, Served};
pub use rebate_events::EventKind;
pub use rebate_resilience::{RequestClass, ShedLevel};

/// A shopping platform.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Platform {
    Taobao,
    Jd,
    Pdd,
}

/// A fixed text to show for a degraded part (clients may match it).
#[derive(Debug, Deserialize, ToSchema)]
pub enum Notice {
    #[serde(rename = "返利比例以实际下单为准")]
    RateUnknown,
    #[serde(rename = "返利信息可能有延迟，以实际下单为准")]
    RateMayBeOutdated,
    #[serde(rename = "优惠券信息暂时无法获取，预估返利未计入优惠券")]
    CouponsUnavailable,
}

/// The item.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ItemView {
    pub platform: Platform,
    #[schema(pattern = "^[0-9]{1,20}$")]
    pub item_id: String,
    pub title: String,
    /// The price in cents.
    pub price_cents: u64,
    pub image_url: String,
    pub shop_name: String,
}

/// The rebate: `rate_bps` and `estimated_cents` are null when the rate is unknown.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RebateView {
    /// Basis points: 850 = 8.5 %.
    #[schema(required = true, maximum = 10000)]
    pub rate_bps: Option<u16>,
    /// ⌊(price − best usable coupon) × rate_bps / 10000⌋, in cents.
    #[schema(required = true)]
    pub estimated_cents: Option<u64>,
    pub source: Served,
    /// When the rate was fetched from its source; null for `template`.
    #[schema(required = true, format = DateTime)]
    pub as_of: Option<String>,
}

/// A coupon.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Coupon {
    pub coupon_id: String,
    pub discount_cents: u64,
    /// The order total from which the coupon applies.
    pub threshold_cents: u64,
    #[schema(format = DateTime)]
    pub expires_at: String,
}

/// Extras; a quote is complete without them.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Extras {
    pub sales_30d: u64,
    pub popular_searches: Vec<String>,
}

/// A part that is not live, why, and what stands in for it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DegradedPart {
    pub part: PartKind,
    pub reason: DegradeReason,
    pub served: Served,
    /// For `stale` data: when it was fetched.
    #[serde(default)]
    #[schema(format = DateTime)]
    pub as_of: Option<String>,
}

/// One item's quote, as the batch route embeds it (no trace id of its own).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Quote {
    pub item: ItemView,
    pub rebate: RebateView,
    pub coupons: Vec<Coupon>,
    /// Null when the extras failed or were shed.
    #[schema(required = true)]
    pub extras: Option<Extras>,
    /// True when any part is not live.
    pub degraded: bool,
    pub degraded_parts: Vec<DegradedPart>,
    pub notices: Vec<Notice>,
}

/// The single-item route's answer: the quote and the request's trace id (appended to a kept
/// rendering's JSON by hand, or serialised with an assembled quote).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuoteBody {
    pub item: ItemView,
    pub rebate: RebateView,
    pub coupons: Vec<Coupon>,
    #[schema(required = true)]
    pub extras: Option<Extras>,
    pub degraded: bool,
    pub degraded_parts: Vec<DegradedPart>,
    pub notices: Vec<Notice>,
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub trace_id: String,
}

/// What went wrong.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorJson {
    pub code: ErrorCode,
    /// For people; never a stack trace or an internal address.
    pub message: String,
}

/// Every error's body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorEnvelope {
    pub error: ErrorJson,
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub trace_id: String,
}

/// One key of a batch. Any strings: a bad key is answered on its own line (400).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchKey {
    pub platform: String,
    pub item_id: String,
}

/// `POST /api/v1/items:batch`'s body: 1–`http.max_batch_items` (50) keys.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    #[schema(min_items = 1, max_items = 50)]
    pub items: Vec<BatchKey>,
}

/// One key's error in a batch.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchError {
    pub code: ErrorCode,
    pub message: String,
    /// For `overloaded` items: when asking again may help.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub retry_after_secs: Option<u32>,
}

/// One distinct key's answer: `quote` with status 200, else `error`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchResult {
    pub platform: String,
    pub item_id: String,
    /// The status this key would have had on its own.
    #[schema(minimum = 200, maximum = 599)]
    pub status: u16,
    #[serde(default)]
    pub quote: Option<Quote>,
    #[serde(default)]
    pub error: Option<BatchError>,
}

/// The batch route's answer: each distinct key once, in order of first appearance.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchBody {
    pub results: Vec<BatchResult>,
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub trace_id: String,
}

/// A key of the warm route: both must be valid, or the whole request is refused.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WarmKey {
    pub platform: Platform,
    #[schema(pattern = "^[0-9]{1,20}$")]
    pub item_id: String,
}

/// `POST /admin/v1/warm`'s body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WarmRequest {
    #[schema(min_items = 1, max_items = 50)]
    pub items: Vec<WarmKey>,
}

/// What a warm-up loaded.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WarmAnswer {
    pub requested: u64,
    /// Keys whose quote loaded (unknown items do not).
    pub warmed: u64,
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub trace_id: String,
}

/// `POST /admin/v1/warm-jobs`'s body: 1–`warm_jobs.max_keys` (200,000) keys, all valid.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WarmJobRequest {
    #[schema(min_items = 1, max_items = 200000)]
    pub items: Vec<WarmKey>,
}

/// A queued warm job.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WarmJobReceipt {
    /// 16 lowercase hex digits; `GET /admin/v1/warm-jobs/{job_id}` follows it.
    #[schema(pattern = "^[0-9a-f]{16}$")]
    pub job_id: String,
    /// Chunks of `warm_jobs.chunk_keys` keys queued.
    pub chunks: u64,
    /// Distinct keys queued.
    pub keys: u64,
    /// Keys named more than once (each is loaded once).
    pub duplicates: u64,
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub trace_id: String,
}

/// Where a warm job stands.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WarmJobState {
    Running,
    Done,
    /// Its submission failed part way: the chunks not queued never run.
    Incomplete,
}

/// A warm job's progress, summed over the instances that worked on it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WarmJobProgress {
    #[schema(pattern = "^[0-9a-f]{16}$")]
    pub job_id: String,
    pub state: WarmJobState,
    pub total_keys: u64,
    pub total_chunks: u64,
    pub queued_chunks: u64,
    pub done_chunks: u64,
    /// Keys whose quote loaded.
    pub loaded: u64,
    /// Unknown or delisted items.
    pub not_found: u64,
    /// Keys whose product could not be loaded (source down, nothing stale cached).
    pub failed: u64,
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub trace_id: String,
}

/// `PUT /admin/v1/shedding`'s body: a level pins it, null returns to the measured level.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShedOverride {
    #[schema(required = true)]
    pub level: Option<ShedLevel>,
}

/// The shedder after the change.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShedAnswer {
    /// The shedder's snapshot: measured and forced levels, signals and limits.
    #[schema(value_type = Object)]
    pub shedding: serde_json::Value,
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub trace_id: String,
}

/// `POST /admin/v1/events`'s body; `event_id` is generated when absent.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventRequest {
    pub kind: EventKind,
    pub platform: Platform,
    /// 1–100 distinct item ids.
    #[schema(min_items = 1, max_items = 100, inline)]
    pub item_ids: Vec<ItemId>,
    /// The source's data version; a cache never goes back to an older one.
    #[schema(minimum = 1, maximum = 9007199254740991_u64)]
    pub version: u64,
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9._:-]{1,64}$")]
    pub event_id: Option<String>,
}

/// 1–20 ASCII digits.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(pattern = "^[0-9]{1,20}$")]
pub struct ItemId(pub String);

/// The event as published.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventAnswer {
    #[schema(pattern = "^[A-Za-z0-9._:-]{1,64}$")]
    pub event_id: String,
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub trace_id: String,
}

/// The lifecycle phase.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Starting,
    Serving,
    Draining,
}

/// `ok` or `down`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StoreHealth {
    Ok,
    Down,
}

/// `ok`, `down` or `disabled`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RedisHealth {
    Ok,
    Down,
    Disabled,
}

/// The event bus's connection.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventsHealth {
    Connected,
    Disconnected,
}

/// What is down but does not stop the instance from answering.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DegradedDependency {
    Store,
    Redis,
    Events,
}

/// After a broker reconnect: the missed events replayed, or L1 dropped.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    Replayed,
    DroppedL1,
}

/// `/readyz`: whether a load balancer should send this instance traffic, and what is down.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Readiness {
    pub ready: bool,
    pub phase: Phase,
    pub store: StoreHealth,
    pub redis: RedisHealth,
    pub events: EventsHealth,
    pub degraded: Vec<DegradedDependency>,
    #[serde(default)]
    pub events_catch_up: Option<CatchUp>,
}

/// `/admin/v1/status`: why the service answers the way it does right now. The nested
/// objects are the guards', caches' and bus's own snapshots, for operators.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Status {
    /// The measured (or forced) shed level.
    pub shed_level: ShedLevel,
    /// Breakers, bulkheads, quotas, retry budgets, the shedder and the client limit.
    #[schema(value_type = Object)]
    pub protection: serde_json::Value,
    /// Each part cache's counters, by part.
    #[schema(value_type = Object)]
    pub caches: serde_json::Value,
    /// The kept renderings' counters.
    #[schema(value_type = Object)]
    pub rendered_quotes: serde_json::Value,
    /// The permits for loads at shed level 2 and above.
    #[schema(value_type = Object)]
    pub cache_only_loads: serde_json::Value,
    /// The Bloom gate's state; null when it is off.
    #[schema(value_type = Option<Object>, required = true)]
    pub bloom: serde_json::Value,
    pub store_loads_max_in_flight: u64,
    /// The coupon and extras APIs' batch counters.
    #[schema(value_type = Object)]
    pub upstream_batches: serde_json::Value,
    /// Both listeners' connection counters.
    #[schema(value_type = Object)]
    pub connections: serde_json::Value,
    /// The allocator's counters and the resident set.
    #[schema(value_type = Object)]
    pub memory: serde_json::Value,
    /// Each applied event checked in L1 and L2 against the store.
    #[schema(value_type = Object)]
    pub consistency: serde_json::Value,
    /// The event bus's counters: published, applied, redelivered, dead-lettered.
    #[schema(value_type = Object)]
    pub event_counts: serde_json::Value,
    /// This instance's warm-job consumer: its backend and what it loaded.
    #[schema(value_type = Object)]
    pub warm_jobs: serde_json::Value,
    pub ready: bool,
    pub phase: Phase,
    pub store: StoreHealth,
    pub redis: RedisHealth,
    pub events: EventsHealth,
    pub degraded: Vec<DegradedDependency>,
    /// How long ago the store and Redis were pinged.
    pub pinged_ms_ago: u64,
    /// `in_process`, or the RabbitMQ connection's state and last error.
    pub events_connection: EventsConnection,
}

/// The event bus's connection on the status page.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum EventsConnection {
    /// The in-process bus: always connected.
    InProcess(InProcessBus),
    /// RabbitMQ: the connection's state, last error and reconnects.
    Amqp(std::collections::HashMap<String, serde_json::Value>),
}

/// `in_process`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InProcessBus {
    InProcess,
}

/// What L1, L2 and the store hold for one item.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Inspection {
    pub platform: Platform,
    #[schema(pattern = "^[0-9]{1,20}$")]
    pub item_id: String,
    /// By part: `{"l1": entry or null, "l2": entry, "absent", an error or null without L2}`.
    #[schema(value_type = Object)]
    pub parts: serde_json::Value,
    /// The store's product and rate rows (version and the fields caches hold), or null.
    #[schema(value_type = Object)]
    pub store: serde_json::Value,
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub trace_id: String,
}

/// One hot item.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KeyCount {
    /// `platform:item_id`.
    #[schema(pattern = "^(taobao|jd|pdd):[0-9]{1,20}$")]
    pub key: String,
    pub count: u64,
    /// How much `count` may overestimate (this instance's list only).
    #[serde(default)]
    pub error: Option<u64>,
}

/// `GET /admin/v1/hot-keys`: `{"enabled": false}` when hot keys are off, else the lists.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HotKeys {
    pub enabled: bool,
    #[serde(default)]
    pub half_life_secs: Option<u64>,
    /// This instance's hottest items.
    #[serde(default)]
    pub instance: Option<Vec<KeyCount>>,
    /// The fleet's: null without Redis.
    #[serde(default)]
    pub fleet: Option<FleetHotKeys>,
}

/// The fleet's hottest items, summed over the lists every instance published lately, or
/// why they could not be read.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum FleetHotKeys {
    Listed(Vec<KeyCount>),
    Unavailable {
        /// Why Redis could not give the list.
        unavailable: String,
    },
}

/// Why a request was recorded.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SlowReason {
    Slow,
    Failed,
    Degraded,
}

/// One stage of a recorded request.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// `part`, `l2`, `lease`, `dependency`, `shed`.
    pub kind: String,
    /// The part or dependency.
    pub name: String,
    pub outcome: String,
    pub started_ms: f64,
    pub elapsed_ms: f64,
    /// For dependency calls: 1 for the first attempt, 2 and 3 for retries.
    #[serde(default)]
    pub attempt: Option<u32>,
}

/// One slow, failed or degraded request.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SlowRequest {
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub trace_id: String,
    pub instance: String,
    #[schema(format = DateTime)]
    pub at: String,
    pub method: String,
    pub path: String,
    pub status: u16,
    pub latency_ms: f64,
    #[schema(maximum = 3)]
    pub shed_level: u8,
    #[schema(required = true)]
    pub class: Option<RequestClass>,
    pub reasons: Vec<SlowReason>,
    pub stages: Vec<Stage>,
}

/// `GET /admin/v1/slow-requests`: the newest first.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SlowRequests {
    /// `observability.slow_log_size`.
    pub capacity: u64,
    pub recorded: u64,
    pub requests: Vec<SlowRequest>,
}
