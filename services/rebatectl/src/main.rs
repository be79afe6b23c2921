//! `rebatectl`: the operators' command line. It talks to a running instance's admin API
//! (`admin.listen`, bearer token), so the same commands work against the embedded default and a
//! production fleet (where the instance publishes the event on RabbitMQ for every instance).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};

#[derive(Debug, Parser)]
#[command(name = "rebatectl", version, about = "Operate a rebate-query fleet")]
struct Cli {
    /// Base URL of an instance's admin listener.
    #[arg(
        long,
        env = "REBATECTL_ADMIN",
        default_value = "http://127.0.0.1:8090",
        global = true
    )]
    admin: String,
    /// Admin bearer token; when absent it is read from --token-file.
    #[arg(
        long,
        env = "REBATE_ADMIN_TOKEN",
        hide_env_values = true,
        global = true
    )]
    token: Option<String>,
    /// Where an instance without a configured token wrote its generated one.
    #[arg(long, default_value = "data/admin-token", global = true)]
    token_file: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
#[value(rename_all = "snake_case")]
enum Kind {
    RateChanged,
    ProductChanged,
    CouponsChanged,
    ItemCreated,
    ItemDelisted,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::RateChanged => "rate_changed",
            Kind::ProductChanged => "product_changed",
            Kind::CouponsChanged => "coupons_changed",
            Kind::ItemCreated => "item_created",
            Kind::ItemDelisted => "item_delisted",
        }
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Publish a change event: every instance stops serving the older version.
    Invalidate {
        #[arg(long)]
        platform: String,
        /// Item id; repeat for several items of the same platform.
        #[arg(long = "item", required = true)]
        items: Vec<String>,
        #[arg(long, value_enum)]
        kind: Kind,
        /// The data version the change wrote (values older than it are fenced out).
        #[arg(long)]
        version: u64,
        /// An id of your own, to make retries idempotent; generated when absent.
        #[arg(long)]
        event_id: Option<String>,
    },
    /// Show what L1, L2 and the store hold for one item.
    Inspect {
        #[arg(long)]
        platform: String,
        #[arg(long)]
        item: String,
    },
    /// Load items into the caches now.
    Warm {
        #[arg(long)]
        platform: String,
        #[arg(long = "item", required = true)]
        items: Vec<String>,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(output) => {
            print_json(&output);
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("rebatectl: {error:#}");
            ExitCode::FAILURE
        }
    }
}

#[allow(clippy::print_stdout)] // printing the answer is what a CLI is for
fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

async fn run(cli: Cli) -> anyhow::Result<Value> {
    let token = match cli.token {
        Some(token) => token,
        None => std::fs::read_to_string(&cli.token_file)
            .with_context(|| {
                format!(
                    "no --token given and cannot read the token file {}",
                    cli.token_file.display()
                )
            })?
            .trim()
            .to_owned(),
    };
    let base = cli.admin.trim_end_matches('/').to_owned();
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(std::time::Duration::from_secs(30))
        .build()?;
    let request = match cli.command {
        Command::Invalidate {
            platform,
            items,
            kind,
            version,
            event_id,
        } => {
            let mut body = json!({"kind": kind.as_str(), "platform": platform, "item_ids": items, "version": version});
            if let Some(event_id) = event_id {
                body["event_id"] = json!(event_id);
            }
            client.post(format!("{base}/admin/v1/events")).json(&body)
        }
        Command::Inspect { platform, item } => {
            client.get(format!("{base}/admin/v1/items/{platform}/{item}"))
        }
        Command::Warm { platform, items } => {
            let items: Vec<Value> = items
                .iter()
                .map(|item| json!({"platform": platform, "item_id": item}))
                .collect();
            client
                .post(format!("{base}/admin/v1/warm"))
                .json(&json!({ "items": items }))
        }
    };
    let response = request
        .bearer_auth(token)
        .send()
        .await
        .with_context(|| format!("cannot reach the admin API at {base}"))?;
    let status = response.status();
    let body: Value = response
        .json()
        .await
        .with_context(|| format!("the admin API answered {status} without JSON"))?;
    if !status.is_success() {
        let message = body["error"]["message"].as_str().unwrap_or("no message");
        let code = body["error"]["code"].as_str().unwrap_or("unknown");
        bail!("{status} {code}: {message}");
    }
    Ok(body)
}
