//! What change capture keeps in Redis: the lease that lets one instance of the fleet read the
//! database's log, the fencing token that comes with it, the position read up to, and the last
//! fleet-wide resync.
//!
//! All four keys share one hash tag (`{<prefix>:cc}`), so each of its scripts (in `scripts`) runs
//! on one cluster node and is atomic there. The lease's value is `<token>|<instance>`; the token is
//! the counter `{<prefix>:cc}:fence` at the moment it was taken, so a later holder always has a
//! larger one. The position and the resync are written only by a script that first checks that the
//! writer still holds the lease with its token: a holder that lost the lease (a long pause, a
//! partition) cannot move the position back over its successor's.

use std::time::Duration;

use rebate_cache::TierError;
use redis::Value;

use crate::tier::RedisTier;

/// A held change-capture lease: the fencing token and the instance that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureLease {
    pub token: u64,
    pub instance: String,
}

impl CaptureLease {
    /// The lease key's value while this holder has it.
    fn value(&self) -> String {
        format!("{}|{}", self.token, self.instance)
    }

    /// Parses a lease key's value (`token|instance`).
    pub fn parse(value: &str) -> Option<Self> {
        let (token, instance) = value.split_once('|')?;
        Some(Self {
            token: token.parse().ok()?,
            instance: instance.to_owned(),
        })
    }
}

/// What a try for the lease found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseAttempt {
    Taken(CaptureLease),
    /// Someone holds it (`None` when its value did not parse).
    HeldBy(Option<CaptureLease>),
}

/// The two values a holder writes under its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureRecord {
    /// Where in the database's log the reader has published every change up to.
    Position,
    /// The last fleet-wide resync.
    Resync,
}

impl CaptureRecord {
    fn name(self) -> &'static str {
        match self {
            CaptureRecord::Position => "position",
            CaptureRecord::Resync => "resync",
        }
    }
}

impl RedisTier {
    /// Takes the change-capture lease for `instance` for `ttl` unless someone holds it.
    pub async fn take_capture_lease(
        &self,
        instance: &str,
        ttl: Duration,
    ) -> Result<LeaseAttempt, TierError> {
        let mut invocation = self.scripts().capture_take.prepare_invoke();
        invocation
            .key(self.capture_key("lease"))
            .key(self.capture_key("fence"))
            .arg(instance)
            .arg(millis(ttl));
        self.bounded(async {
            match self.invoke(&invocation).await? {
                Value::Array(reply) => match reply.as_slice() {
                    [Value::Int(0), holder] => Ok(LeaseAttempt::HeldBy(
                        text(holder).and_then(|holder| CaptureLease::parse(&holder)),
                    )),
                    [Value::Int(token), _] => Ok(LeaseAttempt::Taken(CaptureLease {
                        token: u64::try_from(*token).unwrap_or(0),
                        instance: instance.to_owned(),
                    })),
                    _ => Err(self.unexpected("the capture lease")),
                },
                _ => Err(self.unexpected("the capture lease")),
            }
        })
        .await
    }

    /// Extends `lease` by `ttl`; `false` when it is no longer held by it.
    pub async fn renew_capture_lease(
        &self,
        lease: &CaptureLease,
        ttl: Duration,
    ) -> Result<bool, TierError> {
        let mut invocation = self.scripts().capture_renew.prepare_invoke();
        invocation
            .key(self.capture_key("lease"))
            .arg(lease.value())
            .arg(millis(ttl));
        self.held_reply(&invocation, "the capture lease's renewal")
            .await
    }

    /// Gives `lease` up (nothing when it is no longer held by it).
    pub async fn release_capture_lease(&self, lease: &CaptureLease) -> Result<bool, TierError> {
        let mut invocation = self.scripts().capture_release.prepare_invoke();
        invocation.key(self.capture_key("lease")).arg(lease.value());
        self.held_reply(&invocation, "the capture lease's release")
            .await
    }

    /// Writes `record` as `lease`'s holder; `false` (nothing written) when the lease is no
    /// longer held by it.
    pub async fn write_capture_record(
        &self,
        lease: &CaptureLease,
        record: CaptureRecord,
        value: &str,
    ) -> Result<bool, TierError> {
        let mut invocation = self.scripts().capture_write.prepare_invoke();
        invocation
            .key(self.capture_key("lease"))
            .key(self.capture_key(record.name()))
            .arg(lease.value())
            .arg(value);
        self.held_reply(&invocation, "a capture record's write")
            .await
    }

    /// The stored `record`, `None` when there is none.
    pub async fn read_capture_record(
        &self,
        record: CaptureRecord,
    ) -> Result<Option<String>, TierError> {
        self.read_capture_key(record.name()).await
    }

    /// Who holds the change-capture lease now, if anyone.
    pub async fn capture_lease_holder(&self) -> Result<Option<CaptureLease>, TierError> {
        Ok(self
            .read_capture_key("lease")
            .await?
            .and_then(|value| CaptureLease::parse(&value)))
    }

    async fn read_capture_key(&self, name: &str) -> Result<Option<String>, TierError> {
        let mut get = redis::cmd("GET");
        get.arg(self.capture_key(name));
        self.bounded(async {
            match self.query_any(&get).await? {
                Value::Nil => Ok(None),
                value => text(&value)
                    .map(Some)
                    .ok_or_else(|| self.unexpected("a capture record")),
            }
        })
        .await
    }

    async fn held_reply(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
        what: &str,
    ) -> Result<bool, TierError> {
        self.bounded(async {
            match self.invoke(invocation).await? {
                Value::Int(done) => Ok(done == 1),
                _ => Err(self.unexpected(what)),
            }
        })
        .await
    }

    /// `{<prefix>:cc}:<name>`: one hash tag for every change-capture key.
    fn capture_key(&self, name: &str) -> String {
        format!("{{{}:cc}}:{name}", self.prefix())
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_value_round_trips() {
        let lease = CaptureLease {
            token: 42,
            instance: "api-1|x".to_owned(),
        };
        assert_eq!(CaptureLease::parse(&lease.value()), Some(lease));
        assert_eq!(CaptureLease::parse("x|api"), None);
        assert_eq!(CaptureLease::parse("42"), None);
    }
}
