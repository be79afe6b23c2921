//! Which cluster node serves which key, so that a batch can be split into one pipeline per node.
//!
//! The redis client keeps its own slot map but does not expose it, and it refuses pipelines whose
//! keys span slots. We therefore keep a copy built from `CLUSTER SLOTS`, used only to *group*
//! keys: the client still routes every pipeline, and a key whose slot moved comes back as
//! `MOVED`, is retried on its own (the client follows the redirect) and makes us refresh the copy.

use std::collections::HashMap;

use redis::Value;

/// Redis Cluster's fixed number of hash slots.
pub(crate) const SLOT_COUNT: usize = 16_384;

/// The hash slot of `key`, as Redis computes it: CRC16/XMODEM of the key, or of the first
/// non-empty `{…}` hash tag in it, modulo 16384.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let hashed = hash_tag(key).unwrap_or(key);
    crc16_xmodem(hashed) % SLOT_COUNT as u16
}

fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&byte| byte == b'{')?;
    let after_open = &key[open + 1..];
    let close = after_open.iter().position(|&byte| byte == b'}')?;
    let tag = &after_open[..close];
    (!tag.is_empty()).then_some(tag)
}

fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The primary that owns each slot, by node index.
#[derive(Debug, Clone)]
pub(crate) struct SlotMap {
    /// `owner[slot]` indexes `nodes`; [`SlotMap::UNOWNED`] while a slot has no primary.
    owner: Vec<u16>,
    /// How each primary is identified: its node id, else `host:port`.
    nodes: Vec<String>,
}

impl SlotMap {
    const UNOWNED: u16 = u16::MAX;

    /// A map that knows no owner: every key takes the slow per-key path until a refresh.
    pub(crate) fn empty() -> Self {
        Self {
            owner: vec![Self::UNOWNED; SLOT_COUNT],
            nodes: Vec::new(),
        }
    }

    /// Parses a `CLUSTER SLOTS` reply:
    /// `[[start, end, [host, port, id?, …], replicas…], …]`.
    pub(crate) fn from_cluster_slots(reply: &Value) -> Result<Self, String> {
        let Value::Array(ranges) = reply else {
            return Err(format!("CLUSTER SLOTS answered {reply:?}, not an array"));
        };
        let mut map = Self::empty();
        let mut node_index: HashMap<String, u16> = HashMap::new();
        for range in ranges {
            let Value::Array(fields) = range else {
                return Err("a CLUSTER SLOTS range is not an array".to_owned());
            };
            let (Some(start), Some(end), Some(Value::Array(primary))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return Err("a CLUSTER SLOTS range lacks start, end or primary".to_owned());
            };
            let (Some(start), Some(end)) = (as_slot(start), as_slot(end)) else {
                return Err("a CLUSTER SLOTS range has an invalid slot number".to_owned());
            };
            let node = node_name(primary)
                .ok_or_else(|| "a CLUSTER SLOTS primary has no address".to_owned())?;
            let next_index = node_index.len();
            let index = *node_index.entry(node.clone()).or_insert_with(|| {
                map.nodes.push(node);
                u16::try_from(next_index).unwrap_or(Self::UNOWNED)
            });
            for slot in start..=end {
                map.owner[usize::from(slot)] = index;
            }
        }
        Ok(map)
    }

    /// The index of the primary owning `slot`, if known.
    pub(crate) fn owner_of(&self, slot: u16) -> Option<u16> {
        let owner = *self.owner.get(usize::from(slot))?;
        (owner != Self::UNOWNED).then_some(owner)
    }

    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len()
    }
}

fn as_slot(value: &Value) -> Option<u16> {
    let number = match value {
        Value::Int(number) => *number,
        Value::BulkString(digits) => std::str::from_utf8(digits).ok()?.parse().ok()?,
        _ => return None,
    };
    u16::try_from(number)
        .ok()
        .filter(|&slot| usize::from(slot) < SLOT_COUNT)
}

fn is_empty_bulk(value: &Value) -> bool {
    matches!(value, Value::BulkString(bytes) if bytes.is_empty())
}

fn node_name(fields: &[Value]) -> Option<String> {
    if let Some(Value::BulkString(id)) = fields.get(2).filter(|id| !is_empty_bulk(id)) {
        return Some(String::from_utf8_lossy(id).into_owned());
    }
    let host = match fields.first()? {
        Value::BulkString(host) => String::from_utf8_lossy(host).into_owned(),
        Value::SimpleString(host) => host.clone(),
        _ => return None,
    };
    let port = match fields.get(1)? {
        Value::Int(port) => *port,
        _ => return None,
    };
    Some(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::cluster_routing::{Route, SlotAddr};

    #[test]
    fn crc16_matches_the_redis_reference_vector() {
        // The check value from the Redis Cluster specification.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
    }

    #[test]
    fn slots_match_redis() {
        // Values from `CLUSTER KEYSLOT`.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }

    #[test]
    fn slots_agree_with_the_client_routing() {
        for index in 0..2_000 {
            let key = format!("rebate:v1:taobao:{index}:coupons");
            assert_eq!(
                Route::with_key(&key, SlotAddr::Master),
                Route::new(key_slot(key.as_bytes()), SlotAddr::Master),
                "{key}"
            );
        }
    }

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn parses_cluster_slots() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(30001), bulk("aaa")]),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(30004), bulk("ddd")]),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(10922),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(30002)]),
            ]),
            Value::Array(vec![
                Value::Int(10923),
                Value::Int(16000),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(30003), bulk("ccc")]),
            ]),
            Value::Array(vec![
                Value::Int(16001),
                Value::Int(16383),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(30001), bulk("aaa")]),
            ]),
        ]);
        let map = SlotMap::from_cluster_slots(&reply).unwrap();
        assert_eq!(map.node_count(), 3);
        assert_eq!(map.owner_of(0), map.owner_of(16383));
        assert_ne!(map.owner_of(0), map.owner_of(5461));
        assert_ne!(map.owner_of(5461), map.owner_of(10923));
        assert!(map.owner_of(16383).is_some());
        assert_eq!(map.owner_of(16384), None);
    }

    #[test]
    fn uncovered_slots_have_no_owner() {
        let reply = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(99),
            Value::Array(vec![bulk("10.0.0.1"), Value::Int(6379), bulk("aaa")]),
        ])]);
        let map = SlotMap::from_cluster_slots(&reply).unwrap();
        assert!(map.owner_of(99).is_some());
        assert_eq!(map.owner_of(100), None);
        assert_eq!(SlotMap::empty().owner_of(0), None);
    }

    #[test]
    fn refuses_malformed_replies() {
        assert!(SlotMap::from_cluster_slots(&Value::Nil).is_err());
        assert!(SlotMap::from_cluster_slots(&Value::Array(vec![Value::Int(1)])).is_err());
        let bad_range = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(20_000),
            Value::Array(vec![bulk("h"), Value::Int(1)]),
        ])]);
        assert!(SlotMap::from_cluster_slots(&bad_range).is_err());
    }
}
