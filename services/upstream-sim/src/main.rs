//! `upstream-sim [--listen ADDR]`: serves the simulated coupon and extras APIs until ctrl-c or
//! SIGTERM.

use std::net::SocketAddr;

use anyhow::Context;
use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;
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
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();

    let shutdown = CancellationToken::new();
    let simulator = RunningSimulator::start(cli.listen, shutdown.clone())
        .await
        .with_context(|| format!("binding {}", cli.listen))?;
    tracing::info!(addr = %simulator.addr(), "upstream simulator listening");

    shutdown_signal().await;
    tracing::info!("shutdown signal received, stopping");
    shutdown.cancel();
    simulator.stopped().await;
    Ok(())
}

/// Resolves on ctrl-c or, on Unix, SIGTERM (what container runtimes send).
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
