//! A rule set's document: the live keys, checked as the config file's are, overlaid on the file.
//!
//! A document is a JSON object with the config file's section names
//! (`{"resilience": {"coupons": {"quota_per_sec": 10}}}`). Only the keys of [`LiveSettings`] may
//! appear; a key set to `null` keeps the file's value. [`check`] overlays the document on the
//! file's live values, reads the result with the file's types, holds it under the file's
//! ceilings (`[rules.ceilings]`), and validates the whole configuration with the file's own
//! code, so a value the file would refuse is refused here with the same words.

use std::collections::BTreeMap;

use rebate_domain::PerPart;
use rebate_engine::TimeoutClass;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::config::{ConfigError, PartSettings, Settings};

/// Why a document was refused: the key it is about (dotted, as in the config file) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct RuleError {
    pub field: String,
    pub reason: String,
}

impl RuleError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl From<ConfigError> for RuleError {
    fn from(error: ConfigError) -> Self {
        match error {
            ConfigError::Invalid { field, reason } => Self::new(field, reason),
            other => Self::new("document", other.to_string()),
        }
    }
}

/// Every key an operator may change at runtime, under the config file's names. Everything else
/// (listen addresses, URLs, secrets, pool and cache sizes, the breaker's bucket count, the
/// shedder's probe periods) is restart-only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveSettings {
    pub http: LiveHttp,
    pub timeouts: LiveTimeouts,
    pub parts: PerPart<LivePart>,
    pub resilience: LiveResilience,
    pub warmup: LiveRate,
    pub warm_jobs: LiveRate,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveHttp {
    pub request_deadline_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveTimeouts {
    pub core_ms: u64,
    pub normal_ms: u64,
    pub edge_ms: u64,
}

/// A part's timeout and cache lifetimes (`[parts.*]` without `l1_max_entries`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LivePart {
    #[serde(with = "timeout_class_name")]
    pub timeout_class: TimeoutClass,
    pub timeout_ms: Option<u64>,
    pub fresh_secs: u64,
    pub refresh_ahead_ms: u64,
    pub jitter_ratio: f64,
    pub stale_secs: u64,
    pub not_found_secs: u64,
    pub l2_fresh_secs: u64,
    pub l2_jitter_secs: u64,
    pub l2_stale_secs: u64,
    pub l2_not_found_secs: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveResilience {
    pub breaker: LiveBreaker,
    pub mysql: LiveDependency,
    pub redis: LiveDependency,
    pub coupons: LiveDependency,
    pub extras: LiveDependency,
    pub retry: LiveRetry,
    pub shedding: LiveShedding,
    pub admission_wait: crate::config::resilience::AdmissionWaitSettings,
    pub client_limit: LiveClientLimit,
}

/// `[resilience.breaker]` without `buckets` (the window's slices are allocated once).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveBreaker {
    pub window_secs: u64,
    pub failure_ratio: f64,
    pub min_calls: u32,
    pub cool_down_ms: u64,
    pub max_cool_down_ms: u64,
    pub probe_stages: u32,
}

/// A dependency's section without `retry` and `hot_item_max_items`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveDependency {
    pub slow_call_ms: u64,
    pub max_concurrent: u32,
    pub min_calls: Option<u32>,
    pub failure_ratio: Option<f64>,
    pub cool_down_ms: Option<u64>,
    pub quota_per_sec: Option<f64>,
    pub quota_burst: Option<u32>,
    pub hot_item_per_sec: Option<f64>,
    pub hot_item_burst: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveRetry {
    pub max_per_request: u32,
    pub ratio: f64,
    pub max_saved: u32,
    pub base_backoff_ms: u64,
    pub max_backoff_ms: u64,
}

/// `[resilience.shedding]` without `enabled`, the probe periods and `adaptive`, plus a pinned
/// level (0–3; `null`: follow the load).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveShedding {
    pub capacity_rps: u32,
    pub queue_delay_target_ms: u64,
    pub max_in_flight: u32,
    pub min_in_flight: u32,
    pub thresholds: [f64; 3],
    pub hysteresis: f64,
    pub min_dwell_ms: u64,
    pub core_timeout_factor: f64,
    pub normal_timeout_factor: f64,
    pub edge_timeout_factor: f64,
    pub retry_after_min_secs: u32,
    pub retry_after_max_secs: u32,
    pub pinned_level: Option<u8>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveClientLimit {
    pub per_sec: f64,
    pub burst: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveRate {
    pub rate_per_sec: u32,
}

mod timeout_class_name {
    use rebate_engine::TimeoutClass;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        class: &TimeoutClass,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(match class {
            TimeoutClass::Core => "core",
            TimeoutClass::Normal => "normal",
            TimeoutClass::Edge => "edge",
        })
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<TimeoutClass, D::Error> {
        TimeoutClass::deserialize(deserializer)
    }
}

impl LivePart {
    fn of(part: &PartSettings) -> Self {
        Self {
            timeout_class: part.timeout_class,
            timeout_ms: part.timeout_ms,
            fresh_secs: part.fresh_secs,
            refresh_ahead_ms: part.refresh_ahead_ms,
            jitter_ratio: part.jitter_ratio,
            stale_secs: part.stale_secs,
            not_found_secs: part.not_found_secs,
            l2_fresh_secs: part.l2_fresh_secs,
            l2_jitter_secs: part.l2_jitter_secs,
            l2_stale_secs: part.l2_stale_secs,
            l2_not_found_secs: part.l2_not_found_secs,
        }
    }

    fn apply(&self, part: &mut PartSettings) {
        part.timeout_class = self.timeout_class;
        part.timeout_ms = self.timeout_ms;
        part.fresh_secs = self.fresh_secs;
        part.refresh_ahead_ms = self.refresh_ahead_ms;
        part.jitter_ratio = self.jitter_ratio;
        part.stale_secs = self.stale_secs;
        part.not_found_secs = self.not_found_secs;
        part.l2_fresh_secs = self.l2_fresh_secs;
        part.l2_jitter_secs = self.l2_jitter_secs;
        part.l2_stale_secs = self.l2_stale_secs;
        part.l2_not_found_secs = self.l2_not_found_secs;
    }
}

impl LiveDependency {
    fn of(dependency: &crate::config::DependencySettings) -> Self {
        Self {
            slow_call_ms: dependency.slow_call_ms,
            max_concurrent: dependency.max_concurrent,
            min_calls: dependency.min_calls,
            failure_ratio: dependency.failure_ratio,
            cool_down_ms: dependency.cool_down_ms,
            quota_per_sec: dependency.quota_per_sec,
            quota_burst: dependency.quota_burst,
            hot_item_per_sec: dependency.hot_item_per_sec,
            hot_item_burst: dependency.hot_item_burst,
        }
    }

    fn apply(&self, dependency: &mut crate::config::DependencySettings) {
        dependency.slow_call_ms = self.slow_call_ms;
        dependency.max_concurrent = self.max_concurrent;
        dependency.min_calls = self.min_calls;
        dependency.failure_ratio = self.failure_ratio;
        dependency.cool_down_ms = self.cool_down_ms;
        dependency.quota_per_sec = self.quota_per_sec;
        dependency.quota_burst = self.quota_burst;
        dependency.hot_item_per_sec = self.hot_item_per_sec;
        dependency.hot_item_burst = self.hot_item_burst;
    }
}

impl LiveSettings {
    /// The live values of `settings`.
    pub fn of(settings: &Settings) -> Self {
        let resilience = &settings.resilience;
        let shedding = &resilience.shedding;
        let breaker = &resilience.breaker;
        let retry = &resilience.retry;
        Self {
            http: LiveHttp {
                request_deadline_ms: settings.http.request_deadline_ms,
            },
            timeouts: LiveTimeouts {
                core_ms: settings.timeouts.core_ms,
                normal_ms: settings.timeouts.normal_ms,
                edge_ms: settings.timeouts.edge_ms,
            },
            parts: settings.parts.map(|_, part| LivePart::of(part)),
            resilience: LiveResilience {
                breaker: LiveBreaker {
                    window_secs: breaker.window_secs,
                    failure_ratio: breaker.failure_ratio,
                    min_calls: breaker.min_calls,
                    cool_down_ms: breaker.cool_down_ms,
                    max_cool_down_ms: breaker.max_cool_down_ms,
                    probe_stages: breaker.probe_stages,
                },
                mysql: LiveDependency::of(&resilience.mysql),
                redis: LiveDependency::of(&resilience.redis),
                coupons: LiveDependency::of(&resilience.coupons),
                extras: LiveDependency::of(&resilience.extras),
                retry: LiveRetry {
                    max_per_request: retry.max_per_request,
                    ratio: retry.ratio,
                    max_saved: retry.max_saved,
                    base_backoff_ms: retry.base_backoff_ms,
                    max_backoff_ms: retry.max_backoff_ms,
                },
                shedding: LiveShedding {
                    capacity_rps: shedding.capacity_rps,
                    queue_delay_target_ms: shedding.queue_delay_target_ms,
                    max_in_flight: shedding.max_in_flight,
                    min_in_flight: shedding.min_in_flight,
                    thresholds: shedding.thresholds,
                    hysteresis: shedding.hysteresis,
                    min_dwell_ms: shedding.min_dwell_ms,
                    core_timeout_factor: shedding.core_timeout_factor,
                    normal_timeout_factor: shedding.normal_timeout_factor,
                    edge_timeout_factor: shedding.edge_timeout_factor,
                    retry_after_min_secs: shedding.retry_after_min_secs,
                    retry_after_max_secs: shedding.retry_after_max_secs,
                    pinned_level: shedding.pinned_level,
                },
                admission_wait: resilience.admission_wait.clone(),
                client_limit: LiveClientLimit {
                    per_sec: resilience.client_limit.per_sec,
                    burst: resilience.client_limit.burst,
                },
            },
            warmup: LiveRate {
                rate_per_sec: settings.warmup.rate_per_sec,
            },
            warm_jobs: LiveRate {
                rate_per_sec: settings.warm_jobs.rate_per_sec,
            },
        }
    }

    /// `settings` with these live values.
    pub fn apply_to(&self, settings: &mut Settings) {
        settings.http.request_deadline_ms = self.http.request_deadline_ms;
        settings.timeouts.core_ms = self.timeouts.core_ms;
        settings.timeouts.normal_ms = self.timeouts.normal_ms;
        settings.timeouts.edge_ms = self.timeouts.edge_ms;
        for (kind, part) in self.parts.iter() {
            part.apply(settings.parts.get_mut(kind));
        }
        let resilience = &mut settings.resilience;
        let breaker = &mut resilience.breaker;
        breaker.window_secs = self.resilience.breaker.window_secs;
        breaker.failure_ratio = self.resilience.breaker.failure_ratio;
        breaker.min_calls = self.resilience.breaker.min_calls;
        breaker.cool_down_ms = self.resilience.breaker.cool_down_ms;
        breaker.max_cool_down_ms = self.resilience.breaker.max_cool_down_ms;
        breaker.probe_stages = self.resilience.breaker.probe_stages;
        self.resilience.mysql.apply(&mut resilience.mysql);
        self.resilience.redis.apply(&mut resilience.redis);
        self.resilience.coupons.apply(&mut resilience.coupons);
        self.resilience.extras.apply(&mut resilience.extras);
        let retry = &mut resilience.retry;
        retry.max_per_request = self.resilience.retry.max_per_request;
        retry.ratio = self.resilience.retry.ratio;
        retry.max_saved = self.resilience.retry.max_saved;
        retry.base_backoff_ms = self.resilience.retry.base_backoff_ms;
        retry.max_backoff_ms = self.resilience.retry.max_backoff_ms;
        let live = &self.resilience.shedding;
        let shedding = &mut resilience.shedding;
        shedding.capacity_rps = live.capacity_rps;
        shedding.queue_delay_target_ms = live.queue_delay_target_ms;
        shedding.max_in_flight = live.max_in_flight;
        shedding.min_in_flight = live.min_in_flight;
        shedding.thresholds = live.thresholds;
        shedding.hysteresis = live.hysteresis;
        shedding.min_dwell_ms = live.min_dwell_ms;
        shedding.core_timeout_factor = live.core_timeout_factor;
        shedding.normal_timeout_factor = live.normal_timeout_factor;
        shedding.edge_timeout_factor = live.edge_timeout_factor;
        shedding.retry_after_min_secs = live.retry_after_min_secs;
        shedding.retry_after_max_secs = live.retry_after_max_secs;
        shedding.pinned_level = live.pinned_level;
        resilience.admission_wait = self.resilience.admission_wait.clone();
        resilience.client_limit.per_sec = self.resilience.client_limit.per_sec;
        resilience.client_limit.burst = self.resilience.client_limit.burst;
        settings.warmup.rate_per_sec = self.warmup.rate_per_sec;
        settings.warm_jobs.rate_per_sec = self.warm_jobs.rate_per_sec;
    }

    /// Every leaf, by dotted key (`resilience.coupons.quota_per_sec`), `null` where unset.
    pub fn leaves(&self) -> BTreeMap<String, Value> {
        leaves_of(&serde_json::to_value(self).expect("plain data"))
    }
}

/// The leaves of a JSON value by dotted key; a `null` document has none.
fn leaves_of(value: &Value) -> BTreeMap<String, Value> {
    fn flatten(prefix: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    flatten(&join(prefix, key), value, out);
                }
            }
            Value::Null if prefix.is_empty() => {}
            leaf => {
                out.insert(prefix.to_owned(), leaf.clone());
            }
        }
    }
    let mut leaves = BTreeMap::new();
    flatten("", value, &mut leaves);
    leaves
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

/// One live key a rule set changes: its value in force before and after.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    pub key: String,
    pub from: Value,
    pub to: Value,
}

/// The keys whose values differ between `before` and `after`, in key order.
pub fn diff(before: &LiveSettings, after: &LiveSettings) -> Vec<Change> {
    diff_leaves(before.leaves(), after.leaves())
}

/// The keys two documents set differently (`null` where one does not set the key: the file's
/// value), in key order.
pub fn document_diff(before: &Value, after: &Value) -> Vec<Change> {
    diff_leaves(leaves_of(before), leaves_of(after))
}

fn diff_leaves(before: BTreeMap<String, Value>, after: BTreeMap<String, Value>) -> Vec<Change> {
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|key| {
            let from = before.get(key).cloned().unwrap_or(Value::Null);
            let to = after.get(key).cloned().unwrap_or(Value::Null);
            (from != to).then(|| Change {
                key: key.clone(),
                from,
                to,
            })
        })
        .collect()
}

/// Hard ceilings from the file (`[rules.ceilings]`): a numeric live key an operator may not
/// raise above its ceiling at runtime (a quota's ceiling is the provider's contract).
pub type Ceilings = BTreeMap<String, f64>;

/// Checks the file's own ceilings: each names a numeric live key, and the file keeps under it.
pub fn check_ceilings(settings: &Settings, ceilings: &Ceilings) -> Result<(), RuleError> {
    let leaves = LiveSettings::of(settings).leaves();
    for (key, ceiling) in ceilings {
        let field = format!("rules.ceilings.{key}");
        let Some(value) = leaves.get(key) else {
            return Err(RuleError::new(field, "names no live key"));
        };
        if !ceiling.is_finite() {
            return Err(RuleError::new(field, "must be a finite number"));
        }
        if let Some(value) = value.as_f64()
            && value > *ceiling
        {
            return Err(RuleError::new(
                field,
                format!("the file's own {key} ({value}) is above it"),
            ));
        }
        if !value.is_number() && !value.is_null() {
            return Err(RuleError::new(field, format!("{key} is not a number")));
        }
    }
    Ok(())
}

/// A checked document: what it resolves to over the file.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The document as it will be stored: the submitted keys, `null`s (the file's value) kept.
    pub document: Value,
    /// The whole configuration in force under it.
    pub settings: Settings,
    pub live: LiveSettings,
}

/// Checks `document` as a rule set over the file's `base` settings: an object of live keys
/// only, of the file's types, at most `max_bytes` as JSON, under `ceilings`, and valid as a whole
/// configuration. The error names the first key at fault.
pub fn check(
    base: &Settings,
    ceilings: &Ceilings,
    document: &Value,
    max_bytes: usize,
) -> Result<Checked, RuleError> {
    let Value::Object(map) = document else {
        return Err(RuleError::new(
            "document",
            format!(
                "must be a JSON object of config sections, got {}",
                kind(document)
            ),
        ));
    };
    let size = serde_json::to_vec(document).map_or(usize::MAX, |bytes| bytes.len());
    if size > max_bytes {
        return Err(RuleError::new(
            "document",
            format!(
                "is {size} bytes as JSON, over the limit of {max_bytes} (rules.max_document_bytes)"
            ),
        ));
    }
    let file = LiveSettings::of(base);
    let mut merged = serde_json::to_value(&file).expect("plain data");
    let mut named = 0usize;
    let document = overlay("", &mut merged, map, &mut named)?;
    if named == 0 {
        return Err(RuleError::new(
            "document",
            "names no key: a rule set sets at least one live key (null keeps the file's value)",
        ));
    }
    let live: LiveSettings = serde_path_to_error::deserialize(merged).map_err(|error| {
        let field = error.path().to_string();
        RuleError::new(field, error.into_inner().to_string())
    })?;
    for (key, ceiling) in ceilings {
        if let Some(value) = live.leaves().get(key).and_then(Value::as_f64)
            && value > *ceiling
        {
            return Err(RuleError::new(
                key.clone(),
                format!(
                    "{value} is above its ceiling of {ceiling} in the config file (rules.ceilings)"
                ),
            ));
        }
    }
    applicable(&file, &live)?;
    let mut settings = base.clone();
    live.apply_to(&mut settings);
    settings.validate()?;
    Ok(Checked {
        document: Value::Object(document),
        settings,
        live,
    })
}

/// Values a running instance cannot take: a guard the file did not build cannot be created
/// at runtime.
fn applicable(file: &LiveSettings, live: &LiveSettings) -> Result<(), RuleError> {
    for (name, before, after) in [
        ("mysql", &file.resilience.mysql, &live.resilience.mysql),
        ("redis", &file.resilience.redis, &live.resilience.redis),
        (
            "coupons",
            &file.resilience.coupons,
            &live.resilience.coupons,
        ),
        ("extras", &file.resilience.extras, &live.resilience.extras),
    ] {
        if before.quota_per_sec.is_none() && after.quota_per_sec.is_some() {
            return Err(RuleError::new(
                format!("resilience.{name}.quota_per_sec"),
                "this dependency has no quota in the config file; a quota is added by a restart",
            ));
        }
        let hot = |dependency: &LiveDependency| {
            dependency.hot_item_per_sec.is_some_and(|rate| rate > 0.0)
        };
        if !hot(before) && hot(after) {
            return Err(RuleError::new(
                format!("resilience.{name}.hot_item_per_sec"),
                "this dependency has no per-item limit in the config file; one is added by a restart",
            ));
        }
        if hot(before) && !hot(after) {
            return Err(RuleError::new(
                format!("resilience.{name}.hot_item_per_sec"),
                "the per-item limit cannot be switched off at runtime; raise it instead",
            ));
        }
    }
    Ok(())
}

/// Lays `document`'s keys over `merged` (the file's live values), refusing keys that are not
/// live; returns the document as it will be stored and counts the keys it names.
fn overlay(
    prefix: &str,
    merged: &mut Value,
    document: &Map<String, Value>,
    named: &mut usize,
) -> Result<Map<String, Value>, RuleError> {
    let mut kept = Map::new();
    for (key, value) in document {
        let path = join(prefix, key);
        let Some(slot) = merged.as_object_mut().and_then(|map| map.get_mut(key)) else {
            return Err(unknown(&path));
        };
        match (value, slot.is_object()) {
            (Value::Null, _) => {
                kept.insert(key.clone(), Value::Null);
                *named += 1;
            }
            (Value::Object(inner), true) => {
                if inner.is_empty() {
                    return Err(RuleError::new(path, "is an empty section"));
                }
                let nested = overlay(&path, slot, inner, named)?;
                if !nested.is_empty() {
                    kept.insert(key.clone(), Value::Object(nested));
                }
            }
            (_, true) => {
                return Err(RuleError::new(
                    path,
                    format!("is a section: expected an object, got {}", kind(value)),
                ));
            }
            (value, false) => {
                *slot = value.clone();
                kept.insert(key.clone(), value.clone());
                *named += 1;
            }
        }
    }
    Ok(kept)
}

/// A key the document may not set: restart-only when the config file knows it.
fn unknown(path: &str) -> RuleError {
    use figment::providers::Format as _;
    let known = figment::Figment::from(figment::providers::Toml::string(
        crate::config::DEFAULT_CONFIG,
    ))
    .find_value(path)
    .is_ok();
    RuleError::new(
        path,
        if known {
            "is restart-only: set it in the config file and restart the instances"
        } else {
            "is not a configuration key"
        },
    )
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn base() -> Settings {
        Settings::defaults().expect("embedded defaults")
    }

    fn run(document: Value) -> Result<Checked, RuleError> {
        let base = base();
        check(&base, &base.rules.ceilings, &document, 65_536)
    }

    #[test]
    fn a_document_overlays_the_file_and_null_keeps_the_file_s_value() {
        let checked = run(json!({
            "resilience": {"coupons": {"quota_per_sec": 10, "slow_call_ms": null}},
            "parts": {"coupons": {"timeout_ms": 300}},
        }))
        .unwrap();
        assert_eq!(
            checked.settings.resilience.coupons.quota_per_sec,
            Some(10.0)
        );
        assert_eq!(checked.settings.resilience.coupons.slow_call_ms, 400);
        assert_eq!(checked.settings.parts.coupons.timeout_ms, Some(300));
        assert_eq!(
            checked.document,
            json!({"resilience": {"coupons": {"quota_per_sec": 10, "slow_call_ms": null}}, "parts": {"coupons": {"timeout_ms": 300}}})
        );
        let changes = diff(&LiveSettings::of(&base()), &checked.live);
        let keys: Vec<&str> = changes.iter().map(|change| change.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "parts.coupons.timeout_ms",
                "resilience.coupons.quota_per_sec"
            ]
        );
        assert_eq!(changes[1].from, json!(45.0));
        assert_eq!(changes[1].to, json!(10.0));
    }

    #[test]
    fn the_live_values_round_trip_through_the_settings() {
        let settings = base();
        let live = LiveSettings::of(&settings);
        let mut copy = settings.clone();
        live.apply_to(&mut copy);
        assert_eq!(LiveSettings::of(&copy), live);
        assert!(
            live.leaves()
                .contains_key("resilience.shedding.pinned_level")
        );
        assert!(!live.leaves().contains_key("http.listen"));
    }

    /// Twenty-odd ways to get a document wrong: each is refused naming its key.
    #[test]
    fn invalid_documents_are_refused_naming_the_field() {
        let big = "x".repeat(70_000);
        let cases: Vec<(Value, &str, &str)> = vec![
            (json!([1, 2]), "document", "must be a JSON object"),
            (json!("quota"), "document", "must be a JSON object"),
            (json!({}), "document", "names no key"),
            (json!({"resilience": {}}), "resilience", "empty section"),
            (json!({"bogus": 1}), "bogus", "not a configuration key"),
            (
                json!({"resilience": {"coupons": {"quota_per_secs": 10}}}),
                "resilience.coupons.quota_per_secs",
                "not a configuration key",
            ),
            (
                json!({"http": {"listen": "0.0.0.0:1"}}),
                "http.listen",
                "restart-only",
            ),
            (
                json!({"parts": {"coupons": {"l1_max_entries": 5}}}),
                "parts.coupons.l1_max_entries",
                "restart-only",
            ),
            (
                json!({"resilience": {"coupons": {"quota_per_sec": "10"}}}),
                "resilience.coupons.quota_per_sec",
                "invalid type",
            ),
            (
                json!({"http": {"request_deadline_ms": -1}}),
                "http.request_deadline_ms",
                "invalid value",
            ),
            (json!({"resilience": 5}), "resilience", "is a section"),
            (
                json!({"http": {"request_deadline_ms": 10}}),
                "http.request_deadline_ms",
                "outside 50..=60000",
            ),
            (
                json!({"resilience": {"breaker": {"failure_ratio": 1.5}}}),
                "resilience.mysql",
                "failure_ratio",
            ),
            (
                json!({"resilience": {"coupons": {"quota_per_sec": 50}}}),
                "resilience.coupons.quota_per_sec",
                "above its ceiling of 45",
            ),
            (
                json!({"resilience": {"extras": {"quota_burst": 6}}}),
                "resilience.extras.quota_burst",
                "above its ceiling of 5",
            ),
            (
                json!({"resilience": {"mysql": {"quota_per_sec": 100}}}),
                "resilience.mysql.quota_per_sec",
                "no quota in the config file",
            ),
            (
                json!({"parts": {"coupons": {"timeout_class": "fast"}}}),
                "parts.coupons.timeout_class",
                "unknown variant",
            ),
            (
                json!({"resilience": {"shedding": {"thresholds": [0.9, 0.8, 1.0]}}}),
                "resilience.shedding",
                "threshold",
            ),
            (
                json!({"resilience": {"shedding": {"thresholds": [0.7, 0.8]}}}),
                "resilience.shedding.thresholds",
                "invalid length",
            ),
            (
                json!({"resilience": {"shedding": {"pinned_level": 4}}}),
                "resilience.shedding.pinned_level",
                "outside 0..=3",
            ),
            (
                json!({"resilience": {"admission_wait": {"prefetch_max_wait_ms": 2000}}}),
                "resilience.admission_wait.prefetch_max_wait_ms",
                "request's deadline",
            ),
            (
                json!({"resilience": {"extras": {"hot_item_per_sec": 0}}}),
                "resilience.extras.hot_item_per_sec",
                "cannot be switched off",
            ),
            (
                json!({"warm_jobs": {"rate_per_sec": 0}}),
                "warm_jobs.rate_per_sec",
                "outside",
            ),
            (
                json!({"warmup": {"note": big}}),
                "document",
                "over the limit",
            ),
        ];
        assert!(cases.len() >= 20);
        for (document, field, words) in cases {
            let error = run(document.clone())
                .expect_err(&document.to_string()[..60.min(document.to_string().len())]);
            assert_eq!(error.field, field, "{document}: {error}");
            assert!(error.reason.contains(words), "{document}: {error}");
        }
    }

    #[test]
    fn the_file_s_ceilings_name_live_numeric_keys_it_keeps_under() {
        let settings = base();
        let mut ceilings = Ceilings::new();
        ceilings.insert("http.listen".to_owned(), 1.0);
        assert!(
            check_ceilings(&settings, &ceilings)
                .unwrap_err()
                .reason
                .contains("no live key")
        );
        let mut ceilings = Ceilings::new();
        ceilings.insert("resilience.coupons.quota_per_sec".to_owned(), 40.0);
        assert!(
            check_ceilings(&settings, &ceilings)
                .unwrap_err()
                .reason
                .contains("above it")
        );
        check_ceilings(&settings, &settings.rules.ceilings).unwrap();
    }
}
