//! `rebate-loadgen`: an open-loop load harness for the rebate query service whose figures are
//! measured, repeatable and comparable — each one next to a reference measured in the same run
//! (a bare axum ceiling, the naive "before" profile, or the same run's healthy phase).
//!
//! It only ever sends traffic to this machine's loopback, starts and kills every process it
//! needs (the release service binary, a private `redis-server`), and every loop in it is
//! bounded in count and time. It depends on no crate of the service: it talks to the binary
//! over HTTP only, like a client would.
//!
//! # Layout
//!
//! - [`schedule`]: when request *i* is due (constant rates, ramps): pure math.
//! - [`keys`]: the demo catalogue and a Zipf key picker calibrated to "top 10 % → 90 %".
//! - [`client`]: one logical request — build, send, retry (well-behaved / naive), classify;
//!   [`wire`]: the lean keep-alive HTTP/1.1 connections it sends on.
//! - [`recorder`]: HDR histograms (logical latency and admitted attempts) and counters: total,
//!   per second, per phase, per request class.
//! - [`generator`]: the open-loop dispatcher and the closed-loop saturation probe;
//!   [`generator_bound`]: the generator's CPU over each run and whether it, not the target,
//!   was the limit.
//! - [`ceiling`]: the fixed-body axum server on its own runtime.
//! - [`service`]: the service child process, its admin and simulator APIs, Redis, MariaDB.
//! - [`scenario`]: the scenarios and what each compares; [`population`]: simulated users, each
//!   with a client of its own (the client contract's, or one that retries at once), for
//!   `client-contract`.
//! - [`report`] and [`chart`]: JSON, Markdown and SVG output.
//! - [`chaos`]: faults under load on the production profile (`rebate-loadgen chaos`), with the
//!   raw-TCP attackers of [`attack`]; [`soak`]: a long run over a million keys with the
//!   service's RSS sampled (`rebate-loadgen soak`); [`analysis`]: the pure arithmetic of both
//!   (recovery time, limit recovery, level moves, RSS slope); [`procfs`]: RSS and CPU from
//!   `/proc`.
#![allow(
    clippy::disallowed_methods,
    reason = "a load generator measures wall-clock time against real servers"
)]

pub mod analysis;
pub mod attack;
pub mod ceiling;
pub mod chaos;
pub mod chart;
pub mod client;
pub mod generator;
pub mod generator_bound;
pub mod keys;
pub mod population;
pub mod procfs;
pub mod recorder;
pub mod report;
pub mod scenario;
pub mod schedule;
pub mod service;
pub mod soak;
pub mod wire;
