//! `rebate-query`: serves the rebate query API, seeds the demo catalogue, or prints the
//! configuration reference or the OpenAPI document.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use query_api::{Application, Settings};

#[derive(Debug, Parser)]
#[command(
    name = "rebate-query",
    version,
    about = "Rebate query aggregation service"
)]
struct Cli {
    /// Config file merged over the embedded defaults (only the keys it names).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to serve the API on; overrides http.listen.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Address of the admin listener; overrides admin.listen.
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<SocketAddr>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the API (the default).
    Serve,
    /// Create the catalogue if needed, load the demo catalogue into it, and exit.
    Seed,
    /// Load and validate the configuration (defaults, `--config`, environment), then exit: 0
    /// when the service would start with it, else the message naming the key.
    CheckConfig,
    /// Print the configuration reference (every key, its default, its environment variable and
    /// what it does) as Markdown, and exit.
    ConfigReference,
    /// Print the OpenAPI 3.1 document of the public and admin APIs (`docs/openapi.json`, also
    /// served as the admin listener's `/openapi.json`), and exit.
    Openapi,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Command::ConfigReference) = cli.command {
        use std::io::Write as _;
        // The reference is this command's output, not a log line.
        std::io::stdout().write_all(query_api::config::reference::render().as_bytes())?;
        return Ok(());
    }
    if let Some(Command::Openapi) = cli.command {
        use std::io::Write as _;
        // The document is this command's output, not a log line.
        std::io::stdout().write_all(query_api::http::openapi::render().as_bytes())?;
        return Ok(());
    }
    let mut settings = Settings::load(cli.config.as_deref())?;
    if let Some(listen) = cli.listen {
        settings.http.listen = listen;
    }
    if let Some(listen) = cli.admin_listen {
        settings.admin.listen = listen;
    }
    let command = cli.command.unwrap_or(Command::Serve);
    if let Command::CheckConfig = command {
        use std::io::Write as _;
        writeln!(std::io::stdout(), "configuration valid")?;
        return Ok(());
    }
    // Seeding exports no traces.
    let otlp = match command {
        Command::Serve => settings.otlp(),
        Command::Seed | Command::ConfigReference | Command::Openapi | Command::CheckConfig => None,
    };
    let telemetry =
        rebate_telemetry::init(settings.log.format, &settings.log.filter, otlp.as_ref())?;
    if let Some(otlp) = &otlp {
        tracing::info!(endpoint = %otlp.endpoint, sample_ratio = otlp.sample_ratio, "exporting traces over OTLP");
    }

    let result = match command {
        Command::Serve => serve(settings).await,
        Command::Seed => query_api::startup::seed(&settings).await,
        Command::ConfigReference | Command::Openapi | Command::CheckConfig => Ok(()),
    };
    // Off the runtime's worker: the exporter's last flush awaits the runtime.
    tokio::task::spawn_blocking(move || telemetry.shutdown()).await?;
    result
}

async fn serve(settings: Settings) -> anyhow::Result<()> {
    let application = Application::build(settings).await?;
    let shutdown = application.shutdown_token();
    tokio::spawn(async move {
        rebate_telemetry::shutdown_signal().await;
        shutdown.cancel();
    });
    application.run_until_stopped().await
}
