//! `ItemKey::parse(platform, item_id)`: the two path segments of every item request.
//!
//! The input is split at its first newline into the platform and the item id. The result is
//! checked against an independent model of the rules (platform taobao/jd/pdd, id 1–20 ASCII
//! digits, platform reported first), and accepted keys must round-trip through `Display`, the
//! accessors and serde exactly, leading zeros included.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rebate_domain::{ItemId, ItemKey, KeyError, Platform};

fuzz_target!(|data: &[u8]| {
    let (platform, item_id) = match data.iter().position(|&byte| byte == b'\n') {
        Some(cut) => (&data[..cut], &data[cut + 1..]),
        None => (data, &[][..]),
    };
    let (Ok(platform), Ok(item_id)) = (std::str::from_utf8(platform), std::str::from_utf8(item_id))
    else {
        return;
    };

    match ItemKey::parse(platform, item_id) {
        Ok(key) => {
            assert!(["taobao", "jd", "pdd"].contains(&platform));
            assert_eq!(key.platform.as_str(), platform);
            assert!((1..=ItemId::MAX_LEN).contains(&item_id.len()));
            assert!(item_id.bytes().all(|byte| byte.is_ascii_digit()));
            assert_eq!(key.item_id.as_str(), item_id);
            assert_eq!(key.to_string(), format!("{platform}:{item_id}"));

            let shown = key.to_string();
            let (left, right) = shown.split_once(':').expect("Display puts a colon between");
            assert_eq!(ItemKey::parse(left, right), Ok(key));
            assert_eq!(
                ItemKey::new(platform.parse().unwrap(), item_id.parse().unwrap()),
                key
            );

            let json = serde_json::to_string(&key).expect("a key always serializes");
            assert_eq!(serde_json::from_str::<ItemKey>(&json).unwrap(), key);
        }
        Err(error) => {
            let platform_ok = Platform::ALL.iter().any(|known| known.as_str() == platform);
            let expected_kind = if !platform_ok {
                "platform"
            } else if item_id.is_empty() {
                "empty"
            } else if item_id.len() > ItemId::MAX_LEN {
                "too long"
            } else {
                assert!(
                    !item_id.bytes().all(|byte| byte.is_ascii_digit()),
                    "{error:?}"
                );
                "not digits"
            };
            match &error {
                KeyError::UnknownPlatform(echoed) => {
                    assert_eq!(expected_kind, "platform");
                    // Client input is echoed back truncated: at most 32 characters and an ellipsis.
                    assert!(echoed.chars().count() <= 33, "{echoed:?}");
                    assert!(platform.starts_with(echoed.trim_end_matches('…')));
                }
                KeyError::EmptyItemId => assert_eq!(expected_kind, "empty"),
                KeyError::ItemIdTooLong(count) => {
                    assert_eq!(expected_kind, "too long");
                    assert_eq!(*count, item_id.len());
                }
                KeyError::ItemIdNotDigits => assert_eq!(expected_kind, "not digits"),
            }
            assert!(!error.to_string().is_empty());
        }
    }
});
