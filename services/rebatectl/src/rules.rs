//! `rebatectl rules`: live rule sets through the admin API's `/admin/v1/rules`.
//!
//! `get`, `history` and `watch` only read. `diff` asks for a dry run, which stores nothing.
//! `apply` stores a new version (active at once, a canary, or a sale window); `rollback` makes an
//! older version's document active again as a new version; `promote` and `abort` decide a canary.
//! Each prints text for people (values as JSON, `null` where a key is unset), or the admin API's
//! JSON with `--json`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{ArgGroup, Args, Subcommand};
use rebate_domain::Timestamp;
use serde_json::{Map, Value, json};

use crate::{Admin, Output, Usage};

const RULES: &str = "/admin/v1/rules";

#[derive(Debug, Args)]
pub(crate) struct RulesArgs {
    /// Print the admin API's JSON answers instead of text (`watch`: one line a refresh).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: RulesCommand,
}

#[derive(Debug, Subcommand)]
enum RulesCommand {
    /// The active version and its document, any canary or scheduled version, and the version
    /// each live instance runs.
    Get,
    /// What FILE would change against the values in force, from a dry run: nothing is stored.
    Diff {
        /// A rule set document (`{"resilience": {"coupons": {"quota_per_sec": 30}}}`), or a
        /// whole request body with a "document" key.
        file: PathBuf,
    },
    /// Store FILE as a new version: active on every instance at once, a canary first
    /// (--canary or --instances), or active inside a window (--from, --until).
    Apply(Apply),
    /// The versions, newest first: state, author, when, why, the keys each changed, and a
    /// canary's verdict.
    History {
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=200))]
        limit: u32,
    },
    /// Make VERSION's document active again, as a new version (the history keeps every step).
    Rollback {
        version: u64,
        /// Why (the history shows "rollback to version N: REASON").
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        author: Author,
    },
    /// Promote a canary (without waiting for its verdict) or a staged version to the whole
    /// fleet now.
    Promote {
        version: u64,
        #[command(flatten)]
        author: Author,
    },
    /// Stop a canary (its instances go back to the active version) or a scheduled version.
    Abort {
        version: u64,
        #[command(flatten)]
        author: Author,
    },
    /// Follow a rollout: each live instance's version and a canary's figures and verdict,
    /// refreshed every --interval, until ctrl-c or --count refreshes.
    Watch {
        /// e.g. 1s, 500ms, 2m.
        #[arg(long, default_value = "1s", value_parser = parse_interval)]
        interval: Duration,
        /// Stop after this many refreshes.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
    },
}

/// Who makes a change (the history shows it).
#[derive(Debug, Args)]
struct Author {
    /// Who makes the change (the history shows it); default $USER.
    #[arg(long)]
    author: Option<String>,
}

impl Author {
    /// `--author`, else `$USER`.
    fn name(self) -> Option<String> {
        self.author
            .or_else(|| std::env::var("USER").ok())
            .filter(|name| !name.trim().is_empty())
    }
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("rollout").args(["canary", "instances"])))]
struct Apply {
    /// A rule set document, or a whole request body with a "document" key (the options below
    /// override its fields).
    file: PathBuf,
    /// A canary on this many live instances (chosen at random) before the whole fleet.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    canary: Option<u32>,
    /// A canary on these instances (comma-separated ids, as `rules get` lists them).
    #[arg(long, value_delimiter = ',')]
    instances: Option<Vec<String>>,
    /// How long the canary is observed before its verdict, in whole seconds (e.g. 120s, 2m);
    /// default rules.canary.observe_secs.
    #[arg(long, requires = "rollout", value_parser = parse_observe)]
    observe: Option<Duration>,
    #[command(flatten)]
    author: Author,
    /// Why: required (here or in a request body's "reason"); the history shows it.
    #[arg(long)]
    reason: Option<String>,
    /// A window (RFC 3339, e.g. 2026-12-12T19:55:00Z): active from --from until --until, then
    /// the version active before comes back. Takes no canary.
    #[arg(long, requires = "until", conflicts_with = "rollout", value_parser = parse_timestamp)]
    from: Option<Timestamp>,
    /// The end of the --from window (RFC 3339).
    #[arg(long, requires = "from", value_parser = parse_timestamp)]
    until: Option<Timestamp>,
    /// Store it staged: applied nowhere until `rules promote VERSION`.
    #[arg(long, conflicts_with_all = ["rollout", "from"])]
    stage: bool,
}

pub(crate) async fn run(admin: &Admin, args: RulesArgs) -> anyhow::Result<Output> {
    let json = args.json;
    let (answer, text): (Value, fn(&Value) -> String) = match args.command {
        RulesCommand::Get => (admin.get(RULES).await?, |overview| {
            overview_text(overview, Timestamp::now())
        }),
        RulesCommand::Diff { file } => {
            let mut request = read_request(&file)?;
            // A dry run stores nothing: stand-ins for what only a stored version needs.
            let author = Author { author: None }.name();
            request
                .entry("author")
                .or_insert_with(|| json!(author.unwrap_or_else(|| "rebatectl".to_owned())));
            request.entry("reason").or_insert_with(|| json!("dry run"));
            let path = format!("{RULES}?dry_run=true");
            (admin.post(&path, &Value::Object(request)).await?, |dry| {
                format!("dry run: nothing was stored\n{}", diff_text(&dry["diff"]))
            })
        }
        RulesCommand::Apply(apply) => {
            let request = apply_request(apply)?;
            (
                admin.post(RULES, &Value::Object(request)).await?,
                |created| created_text(created),
            )
        }
        RulesCommand::History { limit } => {
            let path = format!("{RULES}/history?limit={limit}");
            (admin.get(&path).await?, history_text)
        }
        RulesCommand::Rollback {
            version,
            reason,
            author,
        } => {
            let mut body = decision(author);
            if let Some(reason) = reason {
                body.insert("reason".to_owned(), json!(reason));
            }
            let path = format!("{RULES}/{version}/rollback");
            (admin.post(&path, &Value::Object(body)).await?, |created| {
                created_text(created)
            })
        }
        RulesCommand::Promote { version, author } => {
            let path = format!("{RULES}/{version}/promote");
            let body = Value::Object(decision(author));
            (admin.post(&path, &body).await?, decided_text)
        }
        RulesCommand::Abort { version, author } => {
            let path = format!("{RULES}/{version}/abort");
            let body = Value::Object(decision(author));
            (admin.post(&path, &body).await?, decided_text)
        }
        RulesCommand::Watch { interval, count } => {
            watch(admin, interval, count, json).await?;
            return Ok(Output::Printed);
        }
    };
    Ok(if json {
        Output::Json(answer)
    } else {
        Output::Text(text(&answer))
    })
}

/// The body of promote, abort and rollback: the author when one is known (the service says
/// "operator" otherwise).
fn decision(author: Author) -> Map<String, Value> {
    let mut body = Map::new();
    if let Some(author) = author.name() {
        body.insert("author".to_owned(), json!(author));
    }
    body
}

/// FILE as a request body: the file itself when it has a "document" key, else a body with the
/// file as its document.
fn read_request(file: &Path) -> anyhow::Result<Map<String, Value>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the rule set file {}", file.display()))?;
    let value: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
    let Value::Object(object) = value else {
        anyhow::bail!(
            "{} must hold a JSON object: a rule set document, or a request body with a \"document\" key",
            file.display()
        );
    };
    // "document" is no config section, so a document never has that key.
    if object.contains_key("document") {
        return Ok(object);
    }
    let mut request = Map::new();
    request.insert("document".to_owned(), Value::Object(object));
    Ok(request)
}

/// `rules apply`'s request: FILE's, with the options laid over it.
fn apply_request(apply: Apply) -> anyhow::Result<Map<String, Value>> {
    let mut request = read_request(&apply.file)?;
    if let Some(reason) = apply.reason {
        request.insert("reason".to_owned(), json!(reason));
    }
    let has_reason = request
        .get("reason")
        .and_then(Value::as_str)
        .is_some_and(|reason| !reason.trim().is_empty());
    if !has_reason {
        return Err(Usage(
            "--reason is required: say why this version is needed (the history keeps it)"
                .to_owned(),
        )
        .into());
    }
    if let Some(author) = apply.author.author {
        request.insert("author".to_owned(), json!(author));
    } else if !request.contains_key("author") {
        let user = Author { author: None }
            .name()
            .ok_or_else(|| Usage("no --author given and $USER is not set".to_owned()))?;
        request.insert("author".to_owned(), json!(user));
    }
    if apply.canary.is_some() || apply.instances.is_some() {
        let mut rollout = Map::new();
        if let Some(count) = apply.canary {
            rollout.insert("canary".to_owned(), json!(count));
        }
        if let Some(instances) = apply.instances {
            rollout.insert("instances".to_owned(), json!(instances));
        }
        if let Some(observe) = apply.observe {
            rollout.insert("observe_secs".to_owned(), json!(observe.as_secs()));
        }
        request.insert("rollout".to_owned(), Value::Object(rollout));
    }
    if apply.stage {
        request.insert("stage".to_owned(), json!(true));
    }
    if let (Some(from), Some(until)) = (apply.from, apply.until) {
        request.insert(
            "schedule".to_owned(),
            json!({"from": from.to_rfc3339(), "until": until.to_rfc3339()}),
        );
    }
    Ok(request)
}

/// `120s`, `2m`, `500ms`, `1h`: a whole number and its unit.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|character: char| !character.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit: write e.g. 500ms, 120s, 2m or 1h"))?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number"))?;
    let millis_per_unit = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("{text:?}: the unit is ms, s, m or h")),
    };
    number
        .checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// A refresh interval: 100 ms to an hour.
fn parse_interval(text: &str) -> Result<Duration, String> {
    let interval = parse_duration(text)?;
    if !(Duration::from_millis(100)..=Duration::from_secs(3_600)).contains(&interval) {
        return Err(format!("{text:?} is outside 100ms..=1h"));
    }
    Ok(interval)
}

/// An observation window: whole seconds, at least one.
fn parse_observe(text: &str) -> Result<Duration, String> {
    let window = parse_duration(text)?;
    if window.subsec_nanos() != 0 || window.is_zero() {
        return Err(format!(
            "{text:?}: the observation window is a whole number of seconds"
        ));
    }
    Ok(window)
}

fn parse_timestamp(text: &str) -> Result<Timestamp, String> {
    Timestamp::parse_rfc3339(text)
        .map_err(|error| format!("{text:?} is not RFC 3339 (2026-12-12T19:55:00Z): {error}"))
}

// ----- text -------------------------------------------------------------------------------------

/// A value as JSON (`45.0`, `"core"`, `null`).
fn value_text(value: &Value) -> String {
    value.to_string()
}

/// A string field, or `—`.
fn field<'a>(value: &'a Value, key: &str) -> &'a str {
    value[key].as_str().unwrap_or("—")
}

/// A diff's lines, `  key: from → to`.
fn diff_text(diff: &Value) -> String {
    let changes = diff.as_array().map(Vec::as_slice).unwrap_or_default();
    if changes.is_empty() {
        return "  no change: every key keeps the value in force\n".to_owned();
    }
    let mut text = String::new();
    for change in changes {
        let _ = writeln!(
            text,
            "  {}: {} → {}",
            field(change, "key"),
            value_text(&change["from"]),
            value_text(&change["to"])
        );
    }
    text
}

/// A diff's keys on one line.
fn changed_keys(diff: &Value) -> String {
    match diff.as_array() {
        Some(changes) if !changes.is_empty() => changes
            .iter()
            .map(|change| field(change, "key"))
            .collect::<Vec<_>>()
            .join(", "),
        Some(_) => "no change".to_owned(),
        None => "—".to_owned(),
    }
}

/// What `POST /admin/v1/rules` (or a rollback) answered.
fn created_text(created: &Value) -> String {
    let mut text = format!(
        "version {}: {}\n",
        value_text(&created["version"]),
        field(created, "state")
    );
    let rollout = &created["rollout"];
    if rollout.is_object() {
        let _ = writeln!(
            text,
            "  canary on {} for {} s",
            string_list(&rollout["instances"]),
            value_text(&rollout["observe_secs"])
        );
    }
    let schedule = &created["schedule"];
    if schedule.is_object() {
        let _ = writeln!(
            text,
            "  window {} – {}",
            field(schedule, "from"),
            field(schedule, "until")
        );
    }
    text.push_str(&diff_text(&created["diff"]));
    text
}

/// What promote or abort answered: the version as it stands now.
fn decided_text(view: &Value) -> String {
    let mut text = format!(
        "version {}: {}\n",
        value_text(&view["version"]),
        field(view, "state")
    );
    if view["verdict"].is_object() {
        let _ = writeln!(text, "  {}", verdict_text(&view["verdict"]));
    }
    text
}

fn string_list(list: &Value) -> String {
    list.as_array()
        .map(|items| {
            items
                .iter()
                .map(|item| {
                    item.as_str()
                        .map_or_else(|| item.to_string(), str::to_owned)
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_else(|| "—".to_owned())
}

/// `verdict promote (auto): reason; reason · canary … · baseline (fleet) …`.
fn verdict_text(verdict: &Value) -> String {
    let reasons = verdict["reasons"]
        .as_array()
        .map(|reasons| {
            reasons
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default();
    format!(
        "verdict {} ({}): {reasons} · canary {} · baseline ({}) {}",
        field(verdict, "decision"),
        field(verdict, "by"),
        summary_text(&verdict["canary"]),
        field(verdict, "baseline"),
        summary_text(&verdict["reference"]),
    )
}

/// A verdict's side: requests, success ratio, p99, trips, shed level.
fn summary_text(summary: &Value) -> String {
    let ratio = summary["success_ratio"]
        .as_f64()
        .map_or_else(|| "—".to_owned(), |ratio| format!("{:.2} %", ratio * 100.0));
    let p99 = summary["p99_ms"]
        .as_f64()
        .map_or_else(|| "—".to_owned(), |p99| format!("{p99:.1} ms"));
    format!(
        "{} requests, {ratio} complete, p99 {p99}, {} trips/instance, shed level {}",
        value_text(&summary["requests"]),
        value_text(&summary["trips_per_instance"]),
        value_text(&summary["max_shed_level"]),
    )
}

/// An instance's own figures (`during` or `before` a canary).
fn figures_text(figures: &Value) -> String {
    let count = |key: &str| figures[key].as_u64().unwrap_or(0);
    let ratio = match count("answered") {
        0 => "—".to_owned(),
        answered => format!(
            "{:.2} %",
            count("complete") as f64 * 100.0 / answered as f64
        ),
    };
    format!(
        "{} requests, {ratio} complete, {} trips, shed level {}",
        count("requests"),
        count("trips"),
        count("max_shed_level")
    )
}

/// `GET /admin/v1/rules` for people.
fn overview_text(overview: &Value, now: Timestamp) -> String {
    let mut text = String::new();
    let active = &overview["active"];
    if active.is_object() {
        let _ = writeln!(
            text,
            "active: version {}, since {}",
            value_text(&active["version"]),
            field(active, "activated_at")
        );
        let _ = writeln!(text, "  author: {}", field(active, "author"));
        let _ = writeln!(text, "  reason: {}", field(active, "reason"));
        let document = serde_json::to_string_pretty(&active["document"])
            .unwrap_or_else(|_| active["document"].to_string());
        text.push_str("  document:\n");
        for line in document.lines() {
            let _ = writeln!(text, "    {line}");
        }
    } else {
        text.push_str("active: none (every instance runs its config file's values)\n");
    }
    text.push_str(&canary_line(overview, now));
    let scheduled = overview["scheduled"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for version in scheduled {
        let _ = writeln!(
            text,
            "scheduled: version {}, {} – {} ({}: {})",
            value_text(&version["version"]),
            field(&version["schedule"], "from"),
            field(&version["schedule"], "until"),
            field(version, "author"),
            field(version, "reason"),
        );
    }
    text.push_str(&instances_text(overview));
    text
}

/// `canary: none`, or its version, instances and time left (by this machine's clock).
fn canary_line(overview: &Value, now: Timestamp) -> String {
    let canary = &overview["canary"];
    if !canary.is_object() {
        return "canary: none\n".to_owned();
    }
    let rollout = &canary["rollout"];
    let instances = rollout["instances"].as_array().map_or(0, Vec::len);
    let live = overview["instances"].as_array().map_or(0, Vec::len);
    let observe_secs = rollout["observe_secs"].as_i64().unwrap_or(0);
    let ends_at_ms = rollout["started_at_ms"]
        .as_i64()
        .unwrap_or(0)
        .saturating_add(observe_secs.saturating_mul(1000));
    let left_secs = u64::try_from(ends_at_ms - now.as_millis())
        .unwrap_or(0)
        .div_ceil(1000);
    let left = if left_secs > 0 {
        format!("{left_secs} s of {observe_secs} s left")
    } else {
        format!("its {observe_secs} s are over, the verdict is due")
    };
    format!(
        "canary: version {} on {} ({instances} of {live} live instances), {left}\n",
        value_text(&canary["version"]),
        string_list(&rollout["instances"]),
    )
}

/// One line per live instance: its version and, during a canary, its figures.
fn instances_text(overview: &Value) -> String {
    let this = &overview["this_instance"];
    let this_id = field(this, "instance_id");
    let mut instances: Vec<&Value> = overview["instances"]
        .as_array()
        .map(|list| list.iter().collect())
        .unwrap_or_default();
    // This instance has not reported yet: it still runs something.
    if !instances
        .iter()
        .any(|instance| field(instance, "instance_id") == this_id)
    {
        instances.push(this);
    }
    let width = instances
        .iter()
        .map(|instance| field(instance, "instance_id").chars().count())
        .max()
        .unwrap_or(0);
    let canary_version = overview["canary"]["version"].as_u64();
    let mut text = format!("instances ({} live):\n", instances.len());
    for instance in instances {
        let id = field(instance, "instance_id");
        let _ = write!(
            text,
            "  {id:<width$}  version {:<4}  reported {}",
            value_text(&instance["applied_version"]),
            field(instance, "reported_at"),
        );
        if id == this_id {
            text.push_str("  (this instance)");
        }
        let figures = &instance["canary"];
        if figures.is_object() && figures["version"].as_u64() == canary_version {
            let side = if instance["applied_version"].as_u64() == canary_version {
                "canary"
            } else {
                "baseline"
            };
            let _ = write!(
                text,
                "\n  {:width$}  {side}: {} (before: {})",
                "",
                figures_text(&figures["during"]),
                figures_text(&figures["before"])
            );
        }
        text.push('\n');
    }
    text
}

/// `GET /admin/v1/rules/history` for people: one line a version.
fn history_text(history: &Value) -> String {
    let versions = history.as_array().map(Vec::as_slice).unwrap_or_default();
    if versions.is_empty() {
        return "no rule set yet: every instance runs its config file's values\n".to_owned();
    }
    let mut text = String::new();
    for version in versions {
        let _ = write!(
            text,
            "{:>5}  {:<11}  {}  {}  {}  changes: {}",
            value_text(&version["version"]),
            field(version, "state"),
            field(version, "created_at"),
            field(version, "author"),
            // Quoted: a reason is one line here whatever it holds.
            value_text(&version["reason"]),
            changed_keys(&version["diff"]),
        );
        if version["verdict"].is_object() {
            let _ = write!(text, "  {}", verdict_text(&version["verdict"]));
        }
        text.push('\n');
    }
    text
}

/// Prints the rollout every `interval`, `count` times (or until ctrl-c). A canary that leaves
/// the canary state is looked up once more for its verdict.
async fn watch(
    admin: &Admin,
    interval: Duration,
    count: Option<u64>,
    json: bool,
) -> anyhow::Result<()> {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut followed: Option<u64> = None;
    let mut shown = 0u64;
    while count.is_none_or(|count| shown < count) {
        ticks.tick().await;
        let overview = admin.get(RULES).await?;
        shown += 1;
        if json {
            print(&format!("{overview}\n"));
            continue;
        }
        let now = Timestamp::now();
        let mut frame = format!(
            "── {} · refresh {shown}{}\n",
            now.to_rfc3339(),
            count
                .map(|count| format!(" of {count}"))
                .unwrap_or_default()
        );
        let active = &overview["active"]["version"];
        let _ = writeln!(
            frame,
            "active: {}",
            if active.is_u64() {
                format!("version {active}")
            } else {
                "none".to_owned()
            }
        );
        frame.push_str(&canary_line(&overview, now));
        let canary = overview["canary"]["version"].as_u64();
        if let Some(ended) = followed.filter(|version| Some(*version) != canary) {
            // The canary was decided since the last refresh: its verdict.
            let view = admin.get(&format!("{RULES}/{ended}")).await?;
            let _ = writeln!(
                frame,
                "canary version {ended} ended: {}",
                field(&view, "state")
            );
            if view["verdict"].is_object() {
                let _ = writeln!(frame, "  {}", verdict_text(&view["verdict"]));
            }
        }
        followed = canary;
        frame.push_str(&instances_text(&overview));
        print(&frame);
    }
    Ok(())
}

#[allow(clippy::print_stdout)] // a watch prints as it goes
fn print(text: &str) {
    use std::io::Write as _;
    print!("{text}");
    let _ = std::io::stdout().flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_their_unit() {
        assert_eq!(parse_duration("120s"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3_600)));
        for bad in [
            "120",
            "s",
            "1.5s",
            "-1s",
            "2 minutes",
            "99999999999999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_observe("500ms").is_err());
        assert!(parse_observe("0s").is_err());
        assert_eq!(parse_observe("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_interval("10ms").is_err());
    }

    #[test]
    fn a_diff_reads_key_from_to() {
        let diff = json!([
            {"key": "resilience.coupons.quota_per_sec", "from": 45.0, "to": 30.0},
            {"key": "parts.rate.timeout_class", "from": "core", "to": null}
        ]);
        assert_eq!(
            diff_text(&diff),
            "  resilience.coupons.quota_per_sec: 45.0 → 30.0\n  parts.rate.timeout_class: \"core\" → null\n"
        );
        assert!(diff_text(&json!([])).contains("no change"));
        assert_eq!(
            changed_keys(&diff),
            "resilience.coupons.quota_per_sec, parts.rate.timeout_class"
        );
    }

    #[test]
    fn a_history_line_is_one_line_whatever_the_reason_holds() {
        let history = json!([{
            "version": 4, "state": "rolled_back", "author": "ops", "reason": "two\nlines",
            "created_at": "2026-12-06T10:00:00Z",
            "diff": [{"key": "warm_jobs.rate_per_sec", "from": null, "to": 100}],
            "verdict": {"decision": "roll_back", "by": "auto", "reasons": ["p99 too high"],
                "baseline": "fleet",
                "canary": {"requests": 900, "success_ratio": 0.99, "p99_ms": 80.0, "max_shed_level": 0, "trips_per_instance": 0.0},
                "reference": {"requests": 1800, "success_ratio": 0.995, "p99_ms": 20.0, "max_shed_level": 0, "trips_per_instance": 0.0}}
        }]);
        let text = history_text(&history);
        assert_eq!(text.lines().count(), 1, "{text}");
        for part in [
            "4  rolled_back",
            "\"two\\nlines\"",
            "changes: warm_jobs.rate_per_sec",
            "verdict roll_back (auto): p99 too high",
            "p99 80.0 ms",
        ] {
            assert!(text.contains(part), "{part} in {text}");
        }
    }

    #[test]
    fn a_canary_shows_its_instances_time_left_and_figures() {
        let now = Timestamp::from_millis(1_000_000);
        let overview = json!({
            "active": {"version": 3, "author": "ops", "reason": "r", "activated_at": "t", "document": {"a": 1}},
            "canary": {"version": 4, "rollout": {"instances": ["a"], "observe_secs": 120, "started_at_ms": 1_000_000 - 36_000}},
            "scheduled": [],
            "this_instance": {"instance_id": "a", "applied_version": 4, "reported_at": "t"},
            "instances": [
                {"instance_id": "a", "applied_version": 4, "reported_at": "t",
                 "canary": {"version": 4, "during": {"requests": 10, "answered": 8, "complete": 8, "trips": 0, "max_shed_level": 0},
                            "before": {"requests": 0, "answered": 0, "complete": 0, "trips": 0, "max_shed_level": 0}}},
                {"instance_id": "bb", "applied_version": 3, "reported_at": "t"}
            ]
        });
        let text = overview_text(&overview, now);
        assert!(
            text.contains("canary: version 4 on a (1 of 2 live instances), 84 s of 120 s left"),
            "{text}"
        );
        assert!(
            text.contains("a   version 4     reported t  (this instance)"),
            "{text}"
        );
        assert!(
            text.contains("canary: 10 requests, 100.00 % complete, 0 trips"),
            "{text}"
        );
        assert!(text.contains("bb  version 3 "), "{text}");
        assert!(
            text.contains("    \"a\": 1"),
            "the document, indented: {text}"
        );
    }
}
