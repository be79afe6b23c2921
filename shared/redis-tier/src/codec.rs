//! The stored form of a [`TierEntry`]: `{version}:{bytes}`.
//!
//! The version leads the value in canonical decimal so that the fencing script can read it with
//! one anchored pattern match on the first bytes, without decoding the envelope. The Lua side
//! ([`crate::scripts`]) and [`decode`] must agree on what a valid version is: 1 to 20 ASCII
//! digits, no leading zero (except `0` itself), fitting a `u64`.

use rebate_cache::TierEntry;

/// The longest canonical `u64` in decimal (`18446744073709551615`).
pub(crate) const MAX_VERSION_DIGITS: usize = 20;

/// `{version}:{bytes}`, ready for `SET`.
pub(crate) fn encode(entry: &TierEntry) -> Vec<u8> {
    let version = entry.version.to_string();
    let mut stored = Vec::with_capacity(version.len() + 1 + entry.bytes.len());
    stored.extend_from_slice(version.as_bytes());
    stored.push(b':');
    stored.extend_from_slice(&entry.bytes);
    stored
}

/// The entry in a stored value, or `None` when the value was not written by [`encode`].
pub(crate) fn decode(stored: &[u8]) -> Option<TierEntry> {
    let head = &stored[..stored.len().min(MAX_VERSION_DIGITS + 1)];
    let colon = head.iter().position(|&byte| byte == b':')?;
    let version = parse_canonical_version(&stored[..colon])?;
    Some(TierEntry {
        version,
        bytes: stored[colon + 1..].to_vec(),
    })
}

/// A version as the fencing script reports it; the same rules as the stored prefix.
pub(crate) fn parse_canonical_version(digits: &[u8]) -> Option<u64> {
    let canonical = !digits.is_empty()
        && digits.len() <= MAX_VERSION_DIGITS
        && digits.iter().all(u8::is_ascii_digit)
        && (digits.len() == 1 || digits[0] != b'0');
    if !canonical {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn encodes_version_colon_bytes() {
        let entry = TierEntry {
            version: 42,
            bytes: b"payload:with:colons".to_vec(),
        };
        assert_eq!(encode(&entry), b"42:payload:with:colons");
        assert_eq!(decode(&encode(&entry)), Some(entry));
    }

    #[test]
    fn empty_payload_and_extreme_versions_round_trip() {
        for version in [0, 1, u64::MAX] {
            let entry = TierEntry {
                version,
                bytes: Vec::new(),
            };
            assert_eq!(decode(&encode(&entry)), Some(entry));
        }
    }

    #[test]
    fn garbage_is_not_an_entry() {
        for garbage in [
            &b""[..],
            b"no colon at all",
            b":no version",
            b"12a:bytes",
            b"007:leading zeros",
            b"-1:negative",
            b"18446744073709551616:one past u64",
            b"123456789012345678901:twenty-one digits",
            b" 1:space",
            b"\xff\xfe:binary",
        ] {
            assert_eq!(
                decode(garbage),
                None,
                "{:?}",
                String::from_utf8_lossy(garbage)
            );
        }
    }

    proptest! {
        #[test]
        fn any_entry_round_trips(version in any::<u64>(), bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let entry = TierEntry { version, bytes };
            prop_assert_eq!(decode(&encode(&entry)), Some(entry));
        }

        #[test]
        fn decode_never_panics(stored in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(&stored);
        }
    }
}
