//! The black-box suite: the real `Application` on port 0 over real HTTP, against real stores,
//! brokers and the upstream simulator. One binary with a module per area, so the application is
//! linked once; shared helpers live in the `rebate_tests` library (`tests/support`).
#![allow(
    clippy::disallowed_methods,
    reason = "black-box tests against real servers wait and measure on the wall clock"
)]

mod admin_auth;
mod api;
mod change_capture;
mod connections;
mod contract;
mod dashboard;
mod edge;
mod events;
mod fleet;
mod hot_items;
mod lease;
mod metrics;
mod observability;
mod observer;
mod production;
mod readiness;
mod resilience;
mod rules;
mod strict_http;
mod tls;
mod warm_jobs;
