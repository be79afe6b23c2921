//! `upstream-sim [--listen ADDR]`: serves the simulated coupon and extras APIs until ctrl-c or
//! SIGTERM.

use std::net::SocketAddr;

use anyhow::Context;
use clap::Parser;
use tokio_util::sync::CancellationToken;
use upstream_sim::RunningSimulator;

/// Simulated coupon and extras APIs with faults and counters controlled under /_sim.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, env = "UPSTREAM_SIM_LISTEN", default_value = "127.0.0.1:9090")]
    listen: SocketAddr,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    rebate_telemetry::init(rebate_telemetry::LogFormat::Text, "info", None)?;

    let shutdown = CancellationToken::new();
    let simulator = RunningSimulator::start(cli.listen, shutdown.clone())
        .await
        .with_context(|| format!("binding {}", cli.listen))?;
    tracing::info!(addr = %simulator.addr(), "upstream simulator listening");

    rebate_telemetry::shutdown_signal().await;
    shutdown.cancel();
    simulator.stopped().await;
    Ok(())
}
