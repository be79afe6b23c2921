//! What a fleet of instances shares in Redis besides the cache: token buckets that hold an
//! external API's contract for every instance together, a registry of live instances (how
//! many share a bucket when Redis is away), and each instance's hot keys, summed into the
//! fleet's.

use std::time::Duration;

use rebate_cache::TierError;
use redis::Value;

/// How one instance's hot keys were counted: `(key, count)`, hottest first.
pub type KeyCounts = Vec<(String, u64)>;

use crate::tier::RedisTier;

/// Tokens taken from a fleet-wide bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenGrant {
    /// How many of the tokens asked for were granted (0 when the bucket is empty).
    pub granted: u32,
    /// When fewer were granted than asked: how long until the next token.
    pub retry_after: Duration,
}

/// What a heartbeat learned of the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// Instances alive, this one included (at least 1).
    pub live: u32,
    /// This instance's place among their names in byte order, from 0.
    pub rank: u32,
}

impl RedisTier {
    /// Takes up to `want` tokens from the fleet's bucket `bucket` (`{prefix}:quota:{bucket}`),
    /// which refills `per_second` tokens a second and holds at most `burst`: the same GCRA as
    /// the local `TokenBucket`, so the fleet together makes at most `burst + per_second` calls in
    /// any second. One script call, atomic on the server, timed by the server's clock.
    pub async fn take_tokens(
        &self,
        bucket: &str,
        per_second: f64,
        burst: u32,
        want: u32,
    ) -> Result<TokenGrant, TierError> {
        let name = format!("{}:quota:{bucket}", self.prefix());
        // Whole microseconds: exact in a Lua double for any realistic rate.
        let interval_us = (1e6 / per_second).round().max(1.0) as u64;
        let tolerance_us = interval_us.saturating_mul(u64::from(burst.max(1)));
        let mut invocation = self.scripts().take_tokens.prepare_invoke();
        invocation
            .key(&name)
            .arg(interval_us)
            .arg(tolerance_us)
            .arg(want);
        self.bounded(async {
            match self.invoke(&invocation).await? {
                Value::Array(reply) => match reply.as_slice() {
                    [Value::Int(granted), Value::Int(retry_after_us)] => Ok(TokenGrant {
                        granted: u32::try_from(*granted).unwrap_or(0),
                        retry_after: Duration::from_micros(
                            u64::try_from(*retry_after_us).unwrap_or(0),
                        ),
                    }),
                    _ => Err(self.unexpected("the token grant")),
                },
                _ => Err(self.unexpected("the token grant")),
            }
        })
        .await
    }

    /// Records `instance` as alive in the registry (`{prefix}:instances`), forgets instances not
    /// heard of for `expire_after`, and returns how many are alive (this one included) and its
    /// place among them.
    pub async fn heartbeat(
        &self,
        instance: &str,
        expire_after: Duration,
    ) -> Result<Heartbeat, TierError> {
        let name = format!("{}:instances", self.prefix());
        let mut invocation = self.scripts().heartbeat.prepare_invoke();
        invocation.key(&name).arg(instance).arg(
            u64::try_from(expire_after.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        );
        self.bounded(async {
            match self.invoke(&invocation).await? {
                Value::Array(fields) => match fields.as_slice() {
                    [Value::Int(live), Value::Int(rank)] => Ok(Heartbeat {
                        live: u32::try_from(*live).unwrap_or(u32::MAX).max(1),
                        rank: u32::try_from(*rank).unwrap_or(u32::MAX),
                    }),
                    _ => Err(self.unexpected("the heartbeat")),
                },
                _ => Err(self.unexpected("the heartbeat")),
            }
        })
        .await
    }

    /// Replaces `instance`'s list of hot keys (key, count) in the fleet's view; it counts for
    /// `ttl` unless published again. One script on the node of the hot keys' hash tag.
    pub async fn publish_hot_keys(
        &self,
        instance: &str,
        counts: &[(String, u64)],
        ttl: Duration,
    ) -> Result<(), TierError> {
        let members = self.hot_keys_key("members");
        let own = self.hot_keys_key(&format!("i:{instance}"));
        let mut invocation = self.scripts().publish_hot_keys.prepare_invoke();
        invocation
            .key(&own)
            .key(&members)
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1));
        for (key, count) in counts {
            invocation.arg(key).arg(*count);
        }
        self.bounded(async {
            match self.invoke(&invocation).await? {
                Value::Int(1) => Ok(()),
                _ => Err(self.unexpected("the hot keys' publication")),
            }
        })
        .await
    }

    /// The fleet's `limit` hottest keys: every list published within its ttl, counts summed,
    /// hottest first. Two round trips (the lists' names, then their union), on one node.
    pub async fn fleet_hot_keys(&self, limit: usize) -> Result<KeyCounts, TierError> {
        let members = self.hot_keys_key("members");
        self.bounded(async {
            let mut names = redis::cmd("ZRANGE");
            names.arg(&members).arg(0).arg(-1);
            let lists: Vec<String> = match self.query_any(&names).await? {
                Value::Array(names) => names
                    .into_iter()
                    .filter_map(|name| match name {
                        Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
                        _ => None,
                    })
                    .collect(),
                _ => return Err(self.unexpected("ZRANGE of the hot keys' lists")),
            };
            if lists.is_empty() {
                return Ok(Vec::new());
            }
            let mut union = redis::cmd("ZUNION");
            union.arg(lists.len()).arg(&lists).arg("WITHSCORES");
            let mut counts = match self.query_any(&union).await? {
                Value::Array(values) => {
                    pairs(values).ok_or_else(|| self.unexpected("ZUNION of the hot keys' lists"))?
                }
                _ => return Err(self.unexpected("ZUNION of the hot keys' lists")),
            };
            counts.sort_by(|left, right| right.1.cmp(&left.1).then_with(|| left.0.cmp(&right.0)));
            counts.truncate(limit);
            Ok(counts)
        })
        .await
    }

    /// A key of the hot keys' view: `{<prefix>:hot}:<name>`, one hash tag for all of them so
    /// that a union of the instances' lists runs on one cluster node.
    fn hot_keys_key(&self, name: &str) -> String {
        format!("{{{}:hot}}:{name}", self.prefix())
    }
}

/// `[member, score, member, score, …]` (RESP2) or `[[member, score], …]` (RESP3) as pairs, the
/// scores rounded to whole counts.
fn pairs(values: Vec<Value>) -> Option<KeyCounts> {
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    };
    let score = |value: &Value| match value {
        Value::Double(score) => Some(score.max(0.0).round() as u64),
        Value::Int(score) => u64::try_from(*score).ok(),
        other => text(other)?
            .parse::<f64>()
            .ok()
            .map(|score| score.max(0.0).round() as u64),
    };
    if values.iter().all(|value| matches!(value, Value::Array(_))) {
        return values
            .into_iter()
            .map(|pair| match pair {
                Value::Array(pair) if pair.len() == 2 => Some((text(&pair[0])?, score(&pair[1])?)),
                _ => None,
            })
            .collect();
    }
    if !values.len().is_multiple_of(2) {
        return None;
    }
    values
        .chunks(2)
        .map(|pair| Some((text(&pair[0])?, score(&pair[1])?)))
        .collect()
}
