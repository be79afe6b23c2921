//! Simulated coupon and extras APIs, the two external HTTP/JSON services the rebate service
//! calls, with faults and call counters controlled at run time.
//!
//! Contract: the data for an item is a pure function of its key (and its coupon version), so two
//! calls for the same item return the same body (coupon expiries move only at UTC midnight).
//! Faults apply only to the data endpoints, per endpoint, once per call, in a fixed order (outage,
//! rate limit, latency, hang, error); a batch call is one call, so one draw decides its whole
//! answer. Every answer other than `/healthz` is JSON, errors included. Hung calls
//! end when the simulator shuts down, so graceful shutdown never waits on them. This crate is a
//! test and demo tool: it depends on the domain types for its wire format and on nothing else of
//! the service, and nothing in the service's request path may depend on it.
//!
//! # Layout
//! - [`catalog`]: the deterministic data and the wire types [`CouponsResponse`],
//!   [`ExtrasResponse`].
//! - [`batch`]: the batch wire types [`BatchRequest`], [`BatchResponse`], their validation
//!   ([`BatchError`]) and the limits [`MAX_BATCH_ITEMS`], [`MAX_BODY_BYTES`].
//! - [`endpoint`]: [`Endpoint`] (coupons, extras) and [`PerEndpoint`].
//! - [`fault`]: [`Fault`] and its validation.
//! - `state`: [`SimState`], faults, counters, the batch size limit and coupon versions shared
//!   with in-process tests.
//! - `peak`: the sliding one-second window behind `peak_calls_per_sec`.
//! - `http`: [`router`], the routes below, one handler per route kind shared by both endpoints,
//!   and the one mapping of errors to responses.
//! - `server`: [`RunningSimulator`], serving on its own listener with graceful shutdown.
//!
//! # Routes
//! - `GET /v1/coupons/{platform}/{item_id}`, `GET /v1/extras/{platform}/{item_id}`: data, or
//!   400 `invalid_item`, or an injected 429 / 500 / 503 / hang.
//! - `POST /v1/coupons:batch`, `POST /v1/extras:batch` with `{"items":[{"platform","item_id"},
//!   …]}` (`application/json`): `{"items":[…]}`, one single-route body per key in request order;
//!   or 400 `invalid_item` (naming `items[k]`), `invalid_body` (malformed or empty),
//!   `too_many_items` (over [`SimState::max_batch_items`]), 413 `payload_too_large` (body over
//!   [`MAX_BODY_BYTES`]), 415 `unsupported_media_type`, or an injected fault for the whole batch.
//! - `GET|DELETE /_sim/faults`, `GET|PUT|DELETE /_sim/faults/{endpoint}`: faults.
//! - `GET|DELETE /_sim/counters`: call counters ([`CounterSnapshot`]: outcomes, items, batch
//!   calls, peak calls per second).
//! - `GET /healthz`: `ok`.

pub mod batch;
pub mod catalog;
pub mod endpoint;
pub mod fault;
mod http;
mod peak;
mod server;
mod state;

pub use batch::{
    BatchError, BatchItem, BatchLimitError, BatchRequest, BatchResponse, MAX_BATCH_ITEMS,
    MAX_BATCH_ITEMS_BOUNDS, MAX_BODY_BYTES,
};
pub use catalog::{CouponsResponse, ExtrasResponse};
pub use endpoint::{Endpoint, PerEndpoint, UnknownEndpoint};
pub use fault::{Fault, FaultError, MAX_LATENCY_MS};
pub use http::router;
pub use server::RunningSimulator;
pub use state::{CounterSnapshot, SimState};
