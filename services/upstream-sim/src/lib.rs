//! Simulated coupon and extras APIs, the two external HTTP/JSON services the rebate service
//! calls, with faults and call counters controlled at run time.
//!
//! Contract: the data for an item is a pure function of its key (and its coupon version), so two
//! calls for the same item return the same body (coupon expiries move only at UTC midnight).
//! Faults apply only to the data endpoints, per endpoint, in a fixed order (outage, rate limit,
//! latency, hang, error). Every answer other than `/healthz` is JSON, errors included. Hung calls
//! end when the simulator shuts down, so graceful shutdown never waits on them. This crate is a
//! test and demo tool: it depends on the domain types for its wire format and on nothing else of
//! the service, and nothing in the service's request path may depend on it.
//!
//! # Layout
//! - [`catalog`]: the deterministic data and the wire types [`CouponsResponse`],
//!   [`ExtrasResponse`].
//! - [`endpoint`]: [`Endpoint`] (coupons, extras) and [`PerEndpoint`].
//! - [`fault`]: [`Fault`] and its validation.
//! - `state`: [`SimState`], faults, counters and coupon versions shared with in-process tests.
//! - `http`: [`router`], the routes below, and the one mapping of errors to responses.
//! - `server`: [`RunningSimulator`], serving on its own listener with graceful shutdown.
//!
//! # Routes
//! - `GET /v1/coupons/{platform}/{item_id}`, `GET /v1/extras/{platform}/{item_id}`: data, or
//!   400 `invalid_item`, or an injected 429 / 500 / 503 / hang.
//! - `GET|DELETE /_sim/faults`, `GET|PUT|DELETE /_sim/faults/{endpoint}`: faults.
//! - `GET|DELETE /_sim/counters`: call counters.
//! - `GET /healthz`: `ok`.

pub mod catalog;
pub mod endpoint;
pub mod fault;
mod http;
mod server;
mod state;

pub use catalog::{CouponsResponse, ExtrasResponse};
pub use endpoint::{Endpoint, PerEndpoint, UnknownEndpoint};
pub use fault::{Fault, FaultError, MAX_LATENCY_MS};
pub use http::router;
pub use server::RunningSimulator;
pub use state::{CounterSnapshot, SimState};
