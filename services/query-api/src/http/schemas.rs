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
    /// `invalid_rule` only: the key or request field it is about, dotted as in the config file
    /// (`resilience.coupons.quota_per_sec`, `author`, `rollout.canary`, `schedule.until`).
    #[serde(default)]
    #[schema(nullable = false)]
    pub field: Option<String>,
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
    #[schema(schema_with = operator_event_kind)]
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

/// The kinds an operator may publish: every [`EventKind`] that names items. `rules_changed` is
/// the service's own announcement of a new rule set version, never an operator's.
fn operator_event_kind() -> utoipa::openapi::Object {
    let kinds = EventKind::ALL
        .into_iter()
        .filter(|kind| kind.names_items())
        .map(EventKind::as_str);
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(kinds))
        .description(Some(
            "What changed upstream; the kind decides which cached parts become stale. \
             `rules_changed` is not among them: only the service announces a rule set change.",
        ))
        .build()
}

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
    /// With change capture on: who reads the binlog, the last fleet-wide resync and the last
    /// failure. Never makes the instance unready.
    #[serde(default)]
    pub change_capture: Option<ChangeCaptureHealth>,
}

/// Change capture as `/readyz` shows it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChangeCaptureHealth {
    /// `reader` when this instance reads the binlog, else `standby`.
    pub role: String,
    /// The instance reading, as last seen.
    pub reader: Option<String>,
    /// Fleet-wide resyncs this instance applied since it started.
    pub resyncs_applied: u64,
    /// The last fleet-wide resync: its floor (ms since the epoch), reason and deciding instance.
    #[schema(value_type = Option<Object>)]
    pub last_resync: Option<serde_json::Value>,
    /// The reader's last failure, until reading works again.
    pub error: Option<String>,
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
    /// The consistency observer: applied events (operators' and the binlog's) and sampled cached
    /// keys, checked in L1, L2 and the kept renderings against the store, by source and window.
    #[schema(value_type = Object)]
    pub consistency: serde_json::Value,
    /// The event bus's counters: published, applied, redelivered, dead-lettered.
    #[schema(value_type = Object)]
    pub event_counts: serde_json::Value,
    /// This instance's warm-job consumer: its backend and what it loaded.
    #[schema(value_type = Object)]
    pub warm_jobs: serde_json::Value,
    /// Change capture from the binlog (null when off): role, reader, position, counts, the
    /// last resync and the last failure.
    #[schema(value_type = Option<Object>)]
    pub change_capture: Option<serde_json::Value>,
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

/// Where a rule set stands: `staged` (stored, waiting for an operator), `canary` (on the
/// rollout's instances while its verdict is out), `active` (the fleet's; at most one),
/// `rolled_back`, `superseded` (active until another became active), `scheduled` (active
/// inside its window), `aborted` or `expired` (its window ended before it opened).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RuleState {
    Staged,
    Canary,
    Active,
    RolledBack,
    Superseded,
    Scheduled,
    Aborted,
    Expired,
}

/// A schedule window (RFC 3339, UTC): the rule set is active from `from` until `until`, then
/// the version active when it opened comes back. At most 31 days long, opening within a year,
/// overlapping no other window.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleWindow {
    #[schema(format = DateTime)]
    pub from: String,
    /// After `from` and after now.
    #[schema(format = DateTime)]
    pub until: String,
}

/// What a new rule set asks of its canary: a number of instances or named ones (exactly one
/// of the two), and the observation window.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RolloutRequest {
    /// How many instances take the canary, chosen at random among the live ones (at most as
    /// many as are live).
    #[serde(default)]
    #[schema(minimum = 1)]
    pub canary: Option<u32>,
    /// The canary instances by id (`instance_id` in `GET /admin/v1/rules`), each live.
    #[serde(default)]
    #[schema(min_items = 1, max_items = 1000)]
    pub instances: Option<Vec<String>>,
    /// Seconds the canary is observed before it is promoted: 1 to
    /// `rules.canary.max_observe_secs` (default `rules.canary.observe_secs`).
    #[serde(default)]
    #[schema(minimum = 1)]
    pub observe_secs: Option<u64>,
}

/// `POST /admin/v1/rules`'s body: a document, who and why, and either a canary or a schedule
/// (neither: the version becomes active on the whole fleet at once).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewRules {
    /// The live keys to set, under the config file's section names
    /// (`{"resilience": {"coupons": {"quota_per_sec": 10}}}`): only keys marked live in
    /// docs/CONFIGURATION.md, at least one. A key set to `null` keeps the file's value. Each
    /// value is checked as the file's is, and may not exceed its ceiling in the file's
    /// `[rules.ceilings]`; at most `rules.max_document_bytes` as JSON.
    #[schema(value_type = Object)]
    pub document: serde_json::Value,
    /// Who asks (1–128 characters, trimmed).
    #[schema(min_length = 1, max_length = 128, pattern = "\\S")]
    pub author: String,
    /// Why (1–1024 characters, trimmed).
    #[schema(min_length = 1, max_length = 1024, pattern = "\\S")]
    pub reason: String,
    /// Start as a canary on some instances; judged on their figures.
    #[serde(default)]
    pub rollout: Option<RolloutRequest>,
    /// Be active inside a window only (no canary then).
    #[serde(default)]
    pub schedule: Option<RuleWindow>,
    /// Store it `staged`: applied nowhere until promoted (no rollout or schedule then).
    #[serde(default)]
    pub stage: bool,
}

/// The optional body of promote, abort and rollback (an empty body is `{}`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleDecision {
    /// Who decides (1–128 characters, trimmed); absent or null: `operator`.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 128, pattern = "\\S")]
    pub author: Option<String>,
    /// Rollback only: added to the new version's reason (`rollback to version N: …`).
    /// Promote and abort take it and ignore it.
    #[serde(default)]
    pub reason: Option<String>,
}

/// One live key a rule set changes, dotted as in the config file.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleChange {
    pub key: String,
    /// The value before; null: the file's value (or unset).
    #[schema(value_type = Value, required = true)]
    pub from: serde_json::Value,
    /// The value after; null: the file's value.
    #[schema(value_type = Value, required = true)]
    pub to: serde_json::Value,
}

/// A canary's instances and observation window, as stored with its version.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rollout {
    pub instances: Vec<String>,
    pub observe_secs: u64,
    /// When the canary began (Unix ms).
    pub started_at_ms: i64,
}

/// What a new version (or a dry run) came to.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatedRuleSet {
    /// The new version; null on a dry run.
    #[schema(required = true, minimum = 1)]
    pub version: Option<u64>,
    pub dry_run: bool,
    /// `active`, `canary` or `scheduled`.
    pub state: RuleState,
    /// The live keys it changes against the values in force now (the active version's).
    pub diff: Vec<RuleChange>,
    /// The document as stored.
    #[schema(value_type = Object)]
    pub document: serde_json::Value,
    /// With a canary: the instances chosen and the window.
    #[serde(default)]
    #[schema(nullable = false)]
    pub rollout: Option<Rollout>,
    /// With a schedule: its window.
    #[serde(default)]
    #[schema(nullable = false)]
    pub schedule: Option<RuleWindow>,
}

/// What a canary verdict decided.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum VerdictDecision {
    Promote,
    RollBack,
    /// Not yet: the window is open and nothing is wrong so far.
    Wait,
}

/// What a canary was compared with: the other instances over the same seconds (`fleet`), or,
/// with no other instance, the canary instances' own span before the change (`before`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum VerdictBaseline {
    Fleet,
    Before,
}

/// One side's figures in a verdict.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VerdictSummary {
    pub requests: u64,
    /// Items answered with every part live, or a correct 404, ÷ items answered (400-class
    /// client errors not counted); null without answers.
    #[schema(required = true, minimum = 0, maximum = 1)]
    pub success_ratio: Option<f64>,
    /// Null without requests.
    #[schema(required = true, minimum = 0)]
    pub p99_ms: Option<f64>,
    #[schema(maximum = 3)]
    pub max_shed_level: u8,
    #[schema(minimum = 0)]
    pub trips_per_instance: f64,
}

/// A canary's verdict and the figures it was made on.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Verdict {
    pub decision: VerdictDecision,
    /// `auto` (judged on the `rules.canary` margins), or the operator who promoted or aborted.
    pub by: String,
    pub reasons: Vec<String>,
    pub baseline: VerdictBaseline,
    pub canary_instances: Vec<String>,
    /// The other instances, for a `fleet` baseline.
    pub baseline_instances: Vec<String>,
    pub canary: VerdictSummary,
    pub reference: VerdictSummary,
    /// Unix ms.
    pub decided_at_ms: i64,
}

/// One version.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleVersion {
    #[schema(minimum = 1)]
    pub version: u64,
    pub state: RuleState,
    /// The document as stored: live keys under the config file's section names.
    #[schema(value_type = Object)]
    pub document: serde_json::Value,
    pub author: String,
    pub reason: String,
    #[schema(format = DateTime)]
    pub created_at: String,
    /// When it last became active; null if it never did.
    #[schema(required = true, format = DateTime)]
    pub activated_at: Option<String>,
    /// The version active when it was created.
    #[schema(required = true)]
    pub previous_version: Option<u64>,
    /// Null unless it was created as a canary.
    #[schema(required = true)]
    pub rollout: Option<Rollout>,
    /// Null unless it was created with a schedule.
    #[schema(required = true)]
    pub schedule: Option<RuleWindow>,
    /// Null until its canary was decided.
    #[schema(required = true)]
    pub verdict: Option<Verdict>,
    /// In the history and `GET /admin/v1/rules/{version}` only: the keys its document sets
    /// differently from the version before it (null: the file's value).
    #[serde(default)]
    #[schema(nullable = false)]
    pub diff: Option<Vec<RuleChange>>,
}

/// What a span of seconds held on one instance.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WindowFigures {
    /// Seconds with figures in the span.
    pub seconds: u64,
    pub requests: u64,
    /// Items answered, and those answered with every part live.
    pub answered: u64,
    pub complete: u64,
    /// Breaker trips.
    pub trips: u64,
    #[schema(maximum = 3)]
    pub max_shed_level: u8,
    /// Request latency histogram: counts in 32 buckets whose upper bounds grow by half from
    /// 0.1 ms (the last is unbounded).
    pub latency: Vec<u64>,
}

/// An instance's own figures for the canary under way.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CanaryFigures {
    pub version: u64,
    /// Since the canary began.
    pub during: WindowFigures,
    /// Over as long a span before it.
    pub before: WindowFigures,
}

/// An instance and the version it runs.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleInstance {
    pub instance_id: String,
    /// 0: none (the file's values).
    pub applied_version: u64,
    /// Its last report (for this instance: when it applied its version).
    #[schema(format = DateTime)]
    pub reported_at: String,
    /// While a canary is under way.
    #[serde(default)]
    #[schema(nullable = false)]
    pub canary: Option<CanaryFigures>,
}

/// `GET /admin/v1/rules`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RulesOverview {
    #[schema(required = true)]
    pub active: Option<RuleVersion>,
    #[schema(required = true)]
    pub canary: Option<RuleVersion>,
    pub scheduled: Vec<RuleVersion>,
    pub this_instance: RuleInstance,
    /// Instances that reported within three poll intervals (`rules.poll_interval_ms`).
    pub instances: Vec<RuleInstance>,
    /// The live values in force on this instance: every live key, under the config file's
    /// section names.
    #[schema(value_type = Object)]
    pub effective: serde_json::Value,
}

#[cfg(test)]
mod tests {
    //! The rule routes' answers, built from the service's own types, read back through their
    //! mirrors here (the other answers are held to theirs by `tests/suite/contract.rs`).

    use rebate_domain::Timestamp;
    use serde::de::DeserializeOwned;
    use serde_json::{Value, json};

    use crate::config::Settings;
    use crate::rules::canary::{self, Baseline, Decision};
    use crate::rules::manager::{Created, InstanceView, Overview, VersionView};
    use crate::rules::schedule::Window;
    use crate::rules::window::Figures;
    use crate::rules::{Change, LiveSettings};

    fn conforms<Mirror: DeserializeOwned>(answer: &impl serde::Serialize) {
        let text = serde_json::to_string(answer).unwrap();
        if let Err(error) = serde_json::from_str::<Mirror>(&text) {
            panic!(
                "{} does not read {text}: {error}",
                std::any::type_name::<Mirror>()
            );
        }
    }

    fn window() -> Window {
        Window {
            from: Timestamp::from_millis(1_767_225_600_000),
            until: Timestamp::from_millis(1_767_312_000_000),
        }
    }

    fn rollout() -> canary::Rollout {
        canary::Rollout {
            instances: vec!["query-a".to_owned()],
            observe_secs: 120,
            started_at_ms: 1_767_225_600_000,
        }
    }

    fn diff() -> Vec<Change> {
        vec![
            Change {
                key: "resilience.coupons.quota_per_sec".to_owned(),
                from: json!(45.0),
                to: json!(30.0),
            },
            Change {
                key: "resilience.shedding.thresholds".to_owned(),
                from: json!([0.7, 0.85, 0.95]),
                to: Value::Null,
            },
        ]
    }

    fn version(verdict: Option<Value>, diff: Option<Vec<Change>>) -> VersionView {
        VersionView {
            version: 3,
            state: rebate_store::RuleState::Canary,
            document: json!({"resilience": {"coupons": {"quota_per_sec": 30.0}}}),
            author: "alice".to_owned(),
            reason: "a lower quota".to_owned(),
            created_at: Timestamp::from_millis(1_767_225_600_000),
            activated_at: None,
            previous_version: Some(2),
            rollout: Some(serde_json::to_value(rollout()).unwrap()),
            schedule: Some(window()),
            verdict,
            diff,
        }
    }

    #[test]
    fn the_rule_routes_answers_match_their_mirrors() {
        let summary = canary::Summary::of(&Figures::default(), 1);
        let verdict = canary::Verdict {
            decision: Decision::RollBack,
            by: "auto".to_owned(),
            reasons: vec!["p99 above its margin".to_owned()],
            baseline: Baseline::Fleet,
            canary_instances: vec!["query-a".to_owned()],
            baseline_instances: vec!["query-b".to_owned()],
            canary: summary.clone(),
            reference: summary,
            decided_at_ms: 1_767_225_720_000,
        };
        let with_verdict = version(Some(serde_json::to_value(&verdict).unwrap()), Some(diff()));
        conforms::<super::RuleVersion>(&with_verdict);
        conforms::<Vec<super::RuleVersion>>(&vec![with_verdict, version(None, Some(Vec::new()))]);
        let mut bare = version(None, None);
        bare.rollout = None;
        bare.schedule = None;
        bare.previous_version = None;
        bare.activated_at = Some(Timestamp::from_millis(1_767_225_600_000));
        conforms::<super::RuleVersion>(&bare);

        for (version, rollout, schedule) in [
            (Some(4), Some(rollout()), None),
            (None, None, Some(window())),
            (Some(5), None, None),
        ] {
            conforms::<super::CreatedRuleSet>(&Created {
                version,
                dry_run: version.is_none(),
                state: rebate_store::RuleState::Active,
                diff: diff(),
                document: json!({"warmup": {"rate_per_sec": 100}}),
                rollout,
                schedule,
            });
        }

        let settings = Settings::defaults().unwrap();
        let instance = |canary| InstanceView {
            instance_id: "query-a".to_owned(),
            applied_version: 3,
            reported_at: Timestamp::from_millis(1_767_225_600_000),
            canary,
        };
        conforms::<super::RulesOverview>(&Overview {
            active: Some(bare),
            canary: Some(version(None, None)),
            scheduled: vec![version(None, None)],
            this_instance: instance(None),
            instances: vec![
                instance(None),
                instance(Some(canary::CanaryFigures {
                    version: 3,
                    during: Figures::default(),
                    before: Figures::default(),
                })),
            ],
            effective: LiveSettings::of(&settings),
        });
        conforms::<super::RulesOverview>(&Overview {
            active: None,
            canary: None,
            scheduled: Vec::new(),
            this_instance: instance(None),
            instances: Vec::new(),
            effective: LiveSettings::of(&settings),
        });
    }

    /// The names a schema's `enum` lists.
    fn enum_names<Mirror: utoipa::PartialSchema>() -> Vec<String> {
        let schema = serde_json::to_value(Mirror::schema()).unwrap();
        schema["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|name| name.as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn the_rule_states_are_the_stores() {
        let stored: Vec<String> = rebate_store::RuleState::ALL
            .iter()
            .map(|state| state.as_str().to_owned())
            .collect();
        assert_eq!(enum_names::<super::RuleState>(), stored);
        for decision in [Decision::Promote, Decision::RollBack, Decision::Wait] {
            conforms::<super::VerdictDecision>(&decision);
        }
        for baseline in [Baseline::Fleet, Baseline::Before] {
            conforms::<super::VerdictBaseline>(&baseline);
        }
    }

    #[test]
    fn operators_may_publish_every_kind_but_the_services_own() {
        let schema = serde_json::to_value(super::operator_event_kind()).unwrap();
        let kinds: Vec<&str> = schema["enum"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(kinds.contains(&"rate_changed"), "{kinds:?}");
        assert!(!kinds.contains(&"rules_changed"), "{kinds:?}");
        assert_eq!(kinds.len(), rebate_events::EventKind::ALL.len() - 1);
    }
}
