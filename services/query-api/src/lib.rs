//! The rebate query service: configuration, wiring and the REST edge.
//!
//! Contract: [`Application::build`] turns validated [`Settings`] into a bound, ready-to-serve
//! service (store opened and migrated, demo data seeded when asked, upstream clients or the
//! embedded simulator started, caches and engine wired); [`Application::run_until_stopped`] serves
//! until the shutdown token is cancelled and then drains for a bounded time. All HTTP concerns
//! live in [`http`]; the query logic lives in `rebate-engine` and knows nothing of HTTP.
//!
//! # Layout
//! - [`config`]: [`Settings`], loaded from the embedded defaults, a file and the environment.
//! - [`startup`]: [`Application`]: wiring only (`startup/store.rs` opens the store and the L2
//!   tier, `startup/engine.rs` builds the part caches and the engine).
//! - [`state`]: [`AppState`], what every handler and middleware shares.
//! - [`event_bus`]: [`EventBus`](event_bus::EventBus), in process or RabbitMQ, with one set of
//!   counters.
//! - [`admin_token`]: the admin listener's bearer token and its file.
//! - [`background`]: Bloom filter builds and warm-up, under the same shutdown token.
//! - [`invalidation`]: applies operators' change events to the caches (fences, re-warm).
//! - [`consistency`]: [`ConsistencyObserver`](consistency::ConsistencyObserver), what this
//!   instance would serve (kept rendering, L1, L2) compared with the store: after applied
//!   events, and for keys the drift sampler draws without any event.
//! - [`hot_keys`]: [`HotKeys`](hot_keys::HotKeys), the hot items learned from traffic, this
//!   instance's and the fleet's.
//! - [`fleet`]: [`Fleet`](fleet::Fleet), this instance's heartbeat in the registry of live
//!   instances and the fleet-wide quota buckets in Redis.
//! - [`lifecycle`]: starting, serving, draining: what readiness reports.
//! - [`listen_queue`]: [`ListenQueue`](listen_queue::ListenQueue), the kernel's accept queue of
//!   the API listener, read for the load shedder.
//! - [`pings`]: [`RecentPings`](pings::RecentPings), the last pings of the store and Redis that
//!   the admin status page answers from.
//! - [`protection`]: [`Protection`](protection::Protection), the guards of every dependency, the
//!   load shedder and the per-client limiter, from `[resilience]`.
//! - [`rules`]: live rule sets: the runtime-tunable keys, checked, stored, pushed, canaried and
//!   scheduled.
//! - [`memory`]: [`MemoryStats`](memory::MemoryStats), the allocator's counters and the
//!   resident set; jemalloc is the global allocator unless the `jemalloc` feature is off.
//! - [`metrics`]: [`Metrics`](metrics::Metrics), the Prometheus registry behind the admin
//!   listener's `/metrics`: request and dependency-call latency recorded as they happen, cache,
//!   guard, shedding and event counters read from the state at scrape time.
//! - [`server`]: the listeners' connection loop: header, idle and write timeouts, connection
//!   caps per listener and per peer, bounded drain.
//! - [`chunked`]: the chunk-size check on the bytes a connection reads: a chunk announcing more
//!   than the body limit fails the request's body at once (413).
//! - [`slow`]: [`SlowLog`](slow::SlowLog), the last slow, failed or degraded requests with
//!   their stages, by trace id.
//! - [`http`]: the router, the error type and the middleware (trace id, request timeout).
//! - [`upstreams`]: [`UpstreamClients`](upstreams::UpstreamClients), the coupon and extras API
//!   clients kept for their batch counters.
//! - [`warm_jobs`]: [`WarmJobs`](warm_jobs::WarmJobs), operators' warm jobs: chunks on a Redis
//!   stream the fleet works through (an in-process queue without Redis).

pub mod admin_token;
pub mod background;
pub mod change_capture;
pub mod chunked;
pub mod config;
pub mod consistency;
pub mod event_bus;
pub mod fleet;
pub mod hot_keys;
pub mod http;
pub mod invalidation;
pub mod lifecycle;
pub mod listen_queue;
pub mod memory;
pub mod metrics;
pub mod pings;
pub mod protection;
pub mod rules;
pub mod server;
pub mod slow;
pub mod startup;
pub mod state;
#[cfg(test)]
mod test_log;
pub mod upstreams;
pub mod warm_jobs;

pub use config::Settings;
pub use startup::Application;
pub use state::AppState;
