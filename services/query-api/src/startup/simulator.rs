//! The embedded upstream simulator of the embedded profile. It is a test tool, compiled in only
//! with the `simulator` feature (on by default, so `cargo run` works out of the box); a production
//! build leaves it out with `--no-default-features --features jemalloc`, and such a build refuses
//! `upstreams.simulate = true` at configuration time.

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;

#[cfg(feature = "simulator")]
pub use upstream_sim::RunningSimulator;

/// Built without the `simulator` feature there is no simulator: this type has no values.
#[cfg(not(feature = "simulator"))]
#[derive(Debug)]
pub enum RunningSimulator {}

#[cfg(not(feature = "simulator"))]
impl RunningSimulator {
    pub fn base_url(&self) -> String {
        match *self {}
    }

    pub async fn stopped(self) {
        match self {}
    }
}

/// Starts the simulator when `upstreams.simulate` is on.
pub(super) async fn start(
    settings: &Settings,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<RunningSimulator>> {
    if !settings.upstreams.simulate {
        return Ok(None);
    }
    #[cfg(feature = "simulator")]
    {
        let simulator =
            RunningSimulator::start(settings.upstreams.simulator_listen, shutdown.child_token())
                .await
                .context("starting the embedded upstream simulator")?;
        tracing::info!(addr = %simulator.addr(), "embedded upstream simulator started");
        Ok(Some(simulator))
    }
    #[cfg(not(feature = "simulator"))]
    {
        let _ = shutdown;
        Err(anyhow::anyhow!(crate::config::NO_SIMULATOR)).context("upstreams.simulate")
    }
}
