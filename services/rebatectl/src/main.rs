//! `rebatectl`: the operators' command line. It talks to a running instance's admin API
//! (`admin.listen`, bearer token), so the same commands work against the embedded default and a
//! production fleet (where the instance publishes the event on RabbitMQ for every instance, and
//! queues a warm job on the Redis stream every instance works through).
//!
//! Every command but `rules` prints the admin API's JSON answer on stdout. `warm --file` also
//! draws the job's progress on stderr (a bar on a terminal, a line every few seconds otherwise),
//! ends with a summary line there, and exits non-zero when a key failed to load or the job did not
//! finish. `rules` ([`rules`]) prints text for people, or the JSON with `--json`.
//!
//! Exit codes: 0 done; 1 the admin API refused or could not be reached (the message names its
//! status, error code and, for a rule set, the key at fault); 2 the command line is incomplete.
//!
//! # Layout
//! - `main.rs`: the command line, the admin API client ([`Admin`]) and its errors, `invalidate`,
//!   `inspect` and `warm`.
//! - [`rules`]: `rules get | diff | apply | history | rollback | promote | abort | watch`.

mod rules;

use std::fmt;
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

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
    /// Load items into the caches: a few now (--platform, --item), or a file of keys as a warm
    /// job for the whole fleet (--file).
    Warm {
        #[arg(long, required_unless_present = "file", conflicts_with = "file")]
        platform: Option<String>,
        #[arg(long = "item", requires = "platform")]
        items: Vec<String>,
        /// One key a line, `platform:item_id` (e.g. `taobao:100001`); blank lines and lines
        /// starting with `#` are skipped. Queued as a warm job; its progress is shown until done.
        #[arg(long)]
        file: Option<PathBuf>,
        /// How often the job's progress is asked for.
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(50..=60_000))]
        poll_ms: u64,
        /// Give up waiting (the job keeps running) after this long.
        #[arg(long, default_value_t = 3_600, value_parser = clap::value_parser!(u64).range(1..=604_800))]
        max_wait_secs: u64,
    },
    /// Live rule sets: what each instance runs, the history, and new versions, canaries,
    /// rollbacks.
    Rules(rules::RulesArgs),
}

/// What a command leaves on stdout.
#[derive(Debug)]
enum Output {
    /// The admin API's JSON answer, pretty-printed.
    Json(Value),
    /// Text for people.
    Text(String),
    /// Printed as it came (`rules watch`).
    Printed,
}

impl Output {
    #[allow(clippy::print_stdout)] // printing the answer is what a CLI is for
    fn print(&self) {
        match self {
            Output::Json(value) => print_json(value),
            Output::Text(text) => print!("{text}"),
            Output::Printed => {}
        }
    }
}

/// A command line that cannot be carried out as given (exit code 2, as clap's own usage errors).
#[derive(Debug)]
struct Usage(String);

impl fmt::Display for Usage {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// The admin API's refusal: its status, error code and message, and the key at fault when the
/// error is about one (`invalid_rule`).
#[derive(Debug)]
struct Refused {
    status: reqwest::StatusCode,
    code: String,
    message: String,
    field: Option<String>,
}

impl fmt::Display for Refused {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Refused {
            status,
            code,
            message,
            field,
        } = self;
        match field {
            // The service's message starts with the field already ("field: reason").
            Some(field) => {
                let reason = message
                    .strip_prefix(field.as_str())
                    .and_then(|rest| rest.strip_prefix(": "))
                    .unwrap_or(message);
                write!(formatter, "{status} {code}, field {field}: {reason}")
            }
            None => write!(formatter, "{status} {code}: {message}"),
        }
    }
}

impl std::error::Error for Refused {}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(output) => {
            output.print();
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("rebatectl: {error:#}");
            if error.downcast_ref::<Usage>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
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

async fn run(cli: Cli) -> anyhow::Result<Output> {
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
    let admin = Admin {
        client: reqwest::Client::builder()
            .no_proxy()
            .timeout(std::time::Duration::from_secs(30))
            .build()?,
        base: cli.admin.trim_end_matches('/').to_owned(),
        token,
    };
    let answer = match cli.command {
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
            admin.post("/admin/v1/events", &body).await?
        }
        Command::Inspect { platform, item } => {
            admin
                .get(&format!("/admin/v1/items/{platform}/{item}"))
                .await?
        }
        Command::Warm {
            file: Some(file),
            poll_ms,
            max_wait_secs,
            ..
        } => {
            warm_job(
                &admin,
                &file,
                Duration::from_millis(poll_ms),
                Duration::from_secs(max_wait_secs),
            )
            .await?
        }
        Command::Warm {
            platform, items, ..
        } => {
            let platform = platform.unwrap_or_default();
            let items: Vec<Value> = items
                .iter()
                .map(|item| json!({"platform": platform, "item_id": item}))
                .collect();
            admin
                .post("/admin/v1/warm", &json!({ "items": items }))
                .await?
        }
        Command::Rules(args) => return rules::run(&admin, args).await,
    };
    Ok(Output::Json(answer))
}

/// One instance's admin API.
struct Admin {
    client: reqwest::Client,
    base: String,
    token: String,
}

impl Admin {
    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.answer(self.client.get(format!("{}{path}", self.base)))
            .await
    }

    async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.answer(self.client.post(format!("{}{path}", self.base)).json(body))
            .await
    }

    /// The JSON body of a successful answer, or the admin API's error as [`Refused`].
    async fn answer(&self, request: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        let response = request
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("cannot reach the admin API at {}", self.base))?;
        let status = response.status();
        let body: Value = response
            .json()
            .await
            .with_context(|| format!("the admin API answered {status} without JSON"))?;
        if !status.is_success() {
            let text = |key: &str| body["error"][key].as_str().map(str::to_owned);
            return Err(Refused {
                status,
                code: text("code").unwrap_or_else(|| "unknown".to_owned()),
                message: text("message").unwrap_or_else(|| "no message".to_owned()),
                field: text("field"),
            }
            .into());
        }
        Ok(body)
    }
}

/// The platforms an item key may name (the service checks again; this only reports a file's bad
/// lines before anything is sent).
const PLATFORMS: [&str; 3] = ["taobao", "jd", "pdd"];

/// A file's keys as the warm-jobs route takes them, or every bad line (numbered from 1; at most
/// ten shown, then how many more).
fn read_keys(text: &str) -> Result<Vec<Value>, String> {
    const MAX_REPORTED: usize = 10;
    let mut keys = Vec::new();
    let mut bad = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_line(line) {
            Ok((platform, item_id)) => {
                keys.push(json!({"platform": platform, "item_id": item_id}));
            }
            Err(reason) => bad.push(format!("line {}: {reason}", index + 1)),
        }
    }
    if bad.is_empty() {
        return Ok(keys);
    }
    let shown = bad.len().min(MAX_REPORTED);
    let mut report = bad[..shown].join("\n");
    if bad.len() > shown {
        report.push_str(&format!("\n… and {} more bad lines", bad.len() - shown));
    }
    Err(report)
}

fn parse_line(line: &str) -> Result<(&str, &str), String> {
    let shown: String = line.chars().take(40).collect();
    let Some((platform, item_id)) = line.split_once(':') else {
        return Err(format!("{shown:?} is not platform:item_id"));
    };
    if !PLATFORMS.contains(&platform) {
        return Err(format!(
            "{shown:?}: unknown platform {platform:?} (taobao, jd or pdd)"
        ));
    }
    if item_id.is_empty()
        || item_id.len() > 20
        || !item_id.bytes().all(|byte| byte.is_ascii_digit())
    {
        return Err(format!("{shown:?}: the item id must be 1-20 ASCII digits"));
    }
    Ok((platform, item_id))
}

/// Submits the file's keys as a warm job, follows its progress until it is done, and ends with
/// its summary: an error (non-zero exit) when a key failed, the job is incomplete, or it is
/// still running after `max_wait`.
async fn warm_job(
    admin: &Admin,
    file: &Path,
    every: Duration,
    max_wait: Duration,
) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the key file {}", file.display()))?;
    let keys = read_keys(&text)
        .map_err(|report| anyhow::anyhow!("{}: bad keys\n{report}", file.display()))?;
    if keys.is_empty() {
        bail!("{} names no key", file.display());
    }
    let receipt = admin
        .post("/admin/v1/warm-jobs", &json!({ "items": keys }))
        .await?;
    let job_id = receipt["job_id"]
        .as_str()
        .context("the admin API answered without a job id")?
        .to_owned();
    let mut view = ProgressView::new(std::io::stderr().is_terminal());
    let started = tokio::time::Instant::now();
    let progress = loop {
        let progress = admin.get(&format!("/admin/v1/warm-jobs/{job_id}")).await?;
        view.show(&progress, started.elapsed());
        if progress["state"] != "running" {
            break progress;
        }
        if started.elapsed() >= max_wait {
            view.finish();
            bail!(
                "warm job {job_id} still running after {} s (it goes on; follow it at /admin/v1/warm-jobs/{job_id})",
                max_wait.as_secs()
            );
        }
        tokio::time::sleep(every).await;
    };
    view.finish();
    let count = |field: &str| progress[field].as_u64().unwrap_or(0);
    eprintln!(
        "warm job {job_id}: {} keys in {:.1} s: loaded {}, not found {}, failed {}",
        count("total_keys"),
        started.elapsed().as_secs_f64(),
        count("loaded"),
        count("not_found"),
        count("failed"),
    );
    if progress["state"] == "incomplete" {
        print_json(&progress);
        bail!("warm job {job_id} is incomplete: its submission failed part way");
    }
    if count("failed") > 0 {
        print_json(&progress);
        bail!(
            "{} keys of warm job {job_id} failed to load",
            count("failed")
        );
    }
    Ok(progress)
}

/// The job's progress on stderr: a bar redrawn in place on a terminal, else a plain line at
/// most every [`ProgressView::PLAIN_EVERY`] (and the last one).
struct ProgressView {
    terminal: bool,
    drawn: bool,
    last_plain: Option<Duration>,
}

impl ProgressView {
    const WIDTH: u64 = 30;
    const PLAIN_EVERY: Duration = Duration::from_secs(5);

    fn new(terminal: bool) -> Self {
        Self {
            terminal,
            drawn: false,
            last_plain: None,
        }
    }

    fn show(&mut self, progress: &Value, elapsed: Duration) {
        let count = |field: &str| progress[field].as_u64().unwrap_or(0);
        let (total, done) = (
            count("total_keys").max(1),
            count("loaded") + count("not_found") + count("failed"),
        );
        let percent = done.min(total) * 100 / total;
        let text = format!(
            "{percent:>3}% {done}/{total} keys · loaded {} · not found {} · failed {}",
            count("loaded"),
            count("not_found"),
            count("failed")
        );
        let mut stderr = std::io::stderr().lock();
        if self.terminal {
            let filled = (done.min(total) * Self::WIDTH / total) as usize;
            let bar = format!(
                "{}{}",
                "#".repeat(filled),
                "-".repeat(Self::WIDTH as usize - filled)
            );
            let _ = write!(stderr, "\r[{bar}] {text}\x1b[K");
            let _ = stderr.flush();
            self.drawn = true;
        } else if self
            .last_plain
            .is_none_or(|last| elapsed.saturating_sub(last) >= Self::PLAIN_EVERY)
            || progress["state"] != "running"
        {
            let _ = writeln!(stderr, "progress: {text}");
            self.last_plain = Some(elapsed);
        }
    }

    fn finish(&mut self) {
        if self.drawn {
            eprintln!();
            self.drawn = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_is_read_line_by_line_and_bad_lines_are_named() {
        let keys = read_keys("# hot items\ntaobao:100001\n\n  jd:7  \n").unwrap();
        assert_eq!(
            keys,
            [
                json!({"platform": "taobao", "item_id": "100001"}),
                json!({"platform": "jd", "item_id": "7"})
            ]
        );
        let report = read_keys("jd:1\nebay:2\njd 3\njd:12a\njd:\n").unwrap_err();
        let lines: Vec<&str> = report.lines().collect();
        assert_eq!(lines.len(), 4, "{report}");
        assert!(
            lines[0].starts_with("line 2:") && lines[0].contains("ebay"),
            "{report}"
        );
        assert!(
            lines[1].starts_with("line 3:") && lines[1].contains("platform:item_id"),
            "{report}"
        );
        assert!(
            lines[2].starts_with("line 4:") && lines[2].contains("digits"),
            "{report}"
        );
        assert!(lines[3].starts_with("line 5:"), "{report}");
        let many: String = (0..25).map(|_| "nope\n").collect();
        let report = read_keys(&many).unwrap_err();
        assert!(report.ends_with("… and 15 more bad lines"), "{report}");
    }
}
