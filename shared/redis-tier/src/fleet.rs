//! What a fleet of instances shares in Redis besides the cache: token buckets that hold an
//! external API's contract for every instance together, and a registry of live instances (how
//! many share a bucket when Redis is away).

use std::time::Duration;

use rebate_cache::TierError;
use redis::Value;

use crate::tier::RedisTier;

/// Tokens taken from a fleet-wide bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenGrant {
    /// How many of the tokens asked for were granted (0 when the bucket is empty).
    pub granted: u32,
    /// When fewer were granted than asked: how long until the next token.
    pub retry_after: Duration,
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
    /// heard of for `expire_after`, and returns how many are alive, this one included.
    pub async fn heartbeat(
        &self,
        instance: &str,
        expire_after: Duration,
    ) -> Result<u32, TierError> {
        let name = format!("{}:instances", self.prefix());
        let mut invocation = self.scripts().heartbeat.prepare_invoke();
        invocation.key(&name).arg(instance).arg(
            u64::try_from(expire_after.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        );
        self.bounded(async {
            match self.invoke(&invocation).await? {
                Value::Int(live) => Ok(u32::try_from(live).unwrap_or(u32::MAX).max(1)),
                _ => Err(self.unexpected("the heartbeat")),
            }
        })
        .await
    }
}
