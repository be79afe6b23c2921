//! Message header names this crate reads and writes.

use lapin::types::{AMQPValue, FieldTable};

/// Signature of the body (the event contract's HMAC), set by publishers.
pub const SIGNATURE: &str = "x-signature";
/// Handler attempts so far; absent on the first delivery. Incremented on each republish.
pub const DELIVERIES: &str = "x-deliveries";
/// On dead-lettered messages: why (human-readable).
pub const DEATH_REASON: &str = "x-death-reason";
/// On dead-lettered messages: why (machine-readable code, e.g. `retries_exhausted`).
pub const DEATH_CODE: &str = "x-death-code";
/// Routing key the event was first published with (retries are republished to the queue directly).
pub const ORIGINAL_ROUTING_KEY: &str = "x-original-routing-key";
/// Queue the message was consumed from before it was dead-lettered.
pub const ORIGINAL_QUEUE: &str = "x-original-queue";

/// Reads a header as text, accepting either AMQP string type.
#[must_use]
pub fn text(headers: &FieldTable, name: &str) -> Option<String> {
    match headers.inner().get(name)? {
        AMQPValue::LongString(value) => {
            Some(String::from_utf8_lossy(value.as_bytes()).into_owned())
        }
        AMQPValue::ShortString(value) => Some(value.as_str().to_owned()),
        _ => None,
    }
}

/// Reads a header as a non-negative integer, accepting any AMQP integer width (other clients and
/// tools choose different ones).
#[must_use]
pub fn count(headers: &FieldTable, name: &str) -> Option<u64> {
    match *headers.inner().get(name)? {
        AMQPValue::ShortShortInt(value) => u64::try_from(value).ok(),
        AMQPValue::ShortShortUInt(value) => Some(u64::from(value)),
        AMQPValue::ShortInt(value) => u64::try_from(value).ok(),
        AMQPValue::ShortUInt(value) => Some(u64::from(value)),
        AMQPValue::LongInt(value) => u64::try_from(value).ok(),
        AMQPValue::LongUInt(value) => Some(u64::from(value)),
        AMQPValue::LongLongInt(value) => u64::try_from(value).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::LongString;

    use super::*;

    #[test]
    fn integers_of_any_width_are_counts() {
        let mut headers = FieldTable::default();
        headers.insert("a".into(), AMQPValue::ShortShortUInt(3));
        headers.insert("b".into(), AMQPValue::LongLongInt(7));
        headers.insert("c".into(), AMQPValue::LongInt(-1));
        headers.insert("d".into(), AMQPValue::LongString(LongString::from("4")));
        assert_eq!(count(&headers, "a"), Some(3));
        assert_eq!(count(&headers, "b"), Some(7));
        assert_eq!(count(&headers, "c"), None);
        assert_eq!(count(&headers, "d"), None);
        assert_eq!(count(&headers, "missing"), None);
    }

    #[test]
    fn text_accepts_both_string_types() {
        let mut headers = FieldTable::default();
        headers.insert(
            "l".into(),
            AMQPValue::LongString(LongString::from("sha256=ab")),
        );
        headers.insert("s".into(), AMQPValue::ShortString("x".into()));
        headers.insert("n".into(), AMQPValue::LongInt(1));
        assert_eq!(text(&headers, "l").as_deref(), Some("sha256=ab"));
        assert_eq!(text(&headers, "s").as_deref(), Some("x"));
        assert_eq!(text(&headers, "n"), None);
    }
}
