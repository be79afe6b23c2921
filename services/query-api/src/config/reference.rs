//! The configuration reference, `docs/CONFIGURATION.md`, generated from the embedded defaults
//! (`config/default.toml`, which documents every key in its comments) and printed by
//! `rebate-query config-reference`: every key with its default, its environment variable and
//! what it does, plus the optional keys that have no default. A test keeps the committed file
//! equal to what this renders.

use std::fmt::Write as _;

use super::DEFAULT_CONFIG;

/// Keys the service accepts without a default in `config/default.toml`: `(sections, key, what
/// it does)`. Listed for each of the sections that does not set it.
const OPTIONAL: &[(&[&str], &str, &str)] = &[
    (
        &[
            "parts.product",
            "parts.rate",
            "parts.coupons",
            "parts.extras",
        ],
        "timeout_ms",
        "Optional: this part's own timeout, instead of its timeout class's.",
    ),
    (
        DEPENDENCIES,
        "min_calls",
        "Optional: calls in the window before the breaker judges (default: resilience.breaker's).",
    ),
    (
        DEPENDENCIES,
        "failure_ratio",
        "Optional: the failure share that opens the breaker (default: resilience.breaker's).",
    ),
    (
        DEPENDENCIES,
        "cool_down_ms",
        "Optional: how long the breaker stays open first (default: resilience.breaker's).",
    ),
    (
        DEPENDENCIES,
        "quota_per_sec",
        "Optional: outbound quota in calls per second (external APIs); unset: no quota.",
    ),
    (
        DEPENDENCIES,
        "quota_burst",
        "Optional: the quota's burst (with quota_per_sec).",
    ),
    (
        &["resilience.shedding"],
        "pinned_level",
        "Optional: a shed level (0-3) held whatever the load, as PUT /admin/v1/shedding pins one; meant for a rule set (a sale's first minutes at level 1).",
    ),
];

const DEPENDENCIES: &[&str] = &[
    "resilience.mysql",
    "resilience.redis",
    "resilience.coupons",
    "resilience.extras",
];

/// One key of the reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Dotted: `http.cors.max_age_secs`.
    pub key: String,
    /// As written in the defaults (TOML), or `unset`.
    pub default: String,
    pub description: String,
}

impl Entry {
    /// The environment variable that overrides it: `REBATE__HTTP__CORS__MAX_AGE_SECS`.
    pub fn env(&self) -> String {
        // A quoted key holds dots of its own (`rules.ceilings."resilience.coupons.quota_per_sec"`):
        // no variable name can spell it.
        if self.key.contains('"') {
            return "(file only)".to_owned();
        }
        format!(
            "REBATE__{}",
            self.key.replace('.', "__").to_ascii_uppercase()
        )
    }
}

/// Every key of the embedded defaults, in file order, each with the comment above it (or, for
/// a key in a group under one comment, that comment), then the optional keys.
pub fn entries() -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut section = String::new();
    let mut pending: Vec<&str> = Vec::new();
    let mut group: Option<(String, String)> = None;
    // A comment right above a section header describes the section, and the sections after it
    // with the same parent (`[parts.product]`'s is `[parts.rate]`'s too) until one has its own.
    let mut preambles: Vec<(String, String, String)> = Vec::new();
    let mut preamble: Option<String> = None;
    let mut lines = DEFAULT_CONFIG.lines();
    let mut sections = Vec::new();
    while let Some(line) = lines.next() {
        let trimmed = line.trim();
        if let Some(name) = trimmed
            .strip_prefix('[')
            .and_then(|rest| rest.strip_suffix(']'))
        {
            section = name.to_owned();
            sections.push(section.clone());
            let parent = section.split('.').next().unwrap_or("").to_owned();
            if !pending.is_empty() {
                preambles.retain(|(known, _, _)| *known != parent);
                preambles.push((parent.clone(), section.clone(), pending.join(" ")));
            }
            preamble =
                preambles
                    .iter()
                    .find(|(known, _, _)| *known == parent)
                    .map(|(_, at, text)| {
                        if *at == section {
                            format!("`[{at}]`: {text}")
                        } else {
                            format!("As for `[{at}]`: {text}")
                        }
                    });
            pending.clear();
            group = None;
        } else if let Some(comment) = trimmed.strip_prefix('#') {
            pending.push(comment.trim());
        } else if trimmed.is_empty() {
            pending.clear();
            group = None;
        } else if let Some((name, value)) = trimmed.split_once('=') {
            let mut value = value.trim().to_owned();
            // A list over several lines.
            if value.starts_with('[') && !value.contains(']') {
                for more in lines.by_ref() {
                    value.push(' ');
                    value.push_str(more.trim());
                    if more.contains(']') {
                        break;
                    }
                }
            }
            let key = format!("{section}.{}", name.trim());
            let description = if pending.is_empty() {
                match (&group, &preamble) {
                    (Some((first, text)), _) => format!("With `{first}`: {text}"),
                    (None, Some(text)) => text.clone(),
                    (None, None) => String::new(),
                }
            } else {
                let text = pending.join(" ");
                group = Some((key.clone(), text.clone()));
                pending.clear();
                text
            };
            entries.push(Entry {
                key,
                default: value,
                description,
            });
        }
    }
    for (in_sections, name, description) in OPTIONAL {
        for section in in_sections
            .iter()
            .filter(|s| sections.iter().any(|t| t == *s))
        {
            let key = format!("{section}.{name}");
            if entries.iter().all(|entry| entry.key != key) {
                entries.push(Entry {
                    key,
                    default: "unset".to_owned(),
                    description: (*description).to_owned(),
                });
            }
        }
    }
    entries
}

/// The whole of `docs/CONFIGURATION.md`.
pub fn render() -> String {
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from the embedded defaults (`config/default.toml`) by `rebate-query \
         config-reference`; a test keeps this file equal to its output. Settings come from the \
         defaults, then the file given with `--config` (naming only what it changes), then \
         environment variables; `DATABASE_URL`, `REDIS_URL`, `AMQP_URL` and \
         `OTEL_EXPORTER_OTLP_ENDPOINT` win over their keys. Unknown keys and out-of-range \
         values stop the service at start with a message naming the key. A list is given to an \
         environment variable in TOML, e.g. \
         `REBATE__HTTP__CORS__ALLOWED_ORIGINS='[\"https://h5.example.com\"]'`.\n\n\
         Keys marked **live** may also be changed while the fleet runs, by a rule set \
         (`POST /admin/v1/rules`, `rebatectl rules apply`, the dashboard): a JSON document of \
         these sections' names over this file, applied by every instance in one swap. The rest \
         take a restart. `[rules.ceilings]` caps what a rule set may raise a live key to.\n\n\
         | key | default | live | environment variable | what it does |\n\
         | --- | --- | --- | --- | --- |\n",
    );
    let live = super::Settings::defaults()
        .map(|settings| crate::rules::LiveSettings::of(&settings).leaves())
        .unwrap_or_default();
    for entry in entries() {
        let _ = writeln!(
            out,
            "| `{}` | `{}` | {} | `{}` | {} |",
            entry.key,
            entry.default.replace('|', "\\|"),
            if live.contains_key(&entry.key) {
                "live"
            } else {
                ""
            },
            entry.env(),
            entry.description.replace('|', "\\|"),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_reference_is_what_the_defaults_render() {
        let committed = include_str!("../../../../docs/CONFIGURATION.md");
        assert!(
            committed == render(),
            "docs/CONFIGURATION.md is out of date: run \
             `cargo run -p query-api -- config-reference > docs/CONFIGURATION.md`"
        );
    }

    #[test]
    fn every_key_is_described_and_named_for_the_environment() {
        let entries = entries();
        assert!(entries.len() > 150, "{}", entries.len());
        for entry in &entries {
            assert!(
                !entry.description.is_empty(),
                "{} has no description",
                entry.key
            );
            // Only a quoted key (a ceiling's dotted name) has no variable, and says so.
            if entry.key.contains('"') {
                assert_eq!(entry.env(), "(file only)", "{}", entry.key);
            } else {
                assert!(entry.env().starts_with("REBATE__"), "{}", entry.key);
            }
        }
        let cors = entries
            .iter()
            .find(|entry| entry.key == "http.cors.max_age_secs")
            .unwrap();
        assert_eq!(cors.default, "600");
        assert_eq!(cors.env(), "REBATE__HTTP__CORS__MAX_AGE_SECS");
    }

    #[test]
    fn the_optional_keys_are_keys_the_service_takes() {
        // Each optional key, set in a file on its own, loads (unknown keys would not).
        for entry in entries().iter().filter(|entry| entry.default == "unset") {
            let (section, name) = entry.key.rsplit_once('.').unwrap();
            let value = match name {
                "failure_ratio" => "0.5",
                "quota_per_sec" => "50.0",
                // A burst needs its rate.
                "quota_burst" => "100\nquota_per_sec = 50.0",
                "pinned_level" => "1",
                _ => "100",
            };
            let mut file = tempfile::NamedTempFile::new().unwrap();
            std::io::Write::write_all(
                &mut file,
                format!("[{section}]\n{name} = {value}\n").as_bytes(),
            )
            .unwrap();
            let loaded = crate::config::Settings::load(Some(file.path()));
            assert!(loaded.is_ok(), "{}: {:?}", entry.key, loaded.err());
        }
    }
}
