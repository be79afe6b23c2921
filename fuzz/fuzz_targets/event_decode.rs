//! `decode_event`: the invalidation-event wire decoder fed by RabbitMQ and the admin route.
//!
//! Its contract is "strict and total": any bytes give an event or a `Rejection`, never a panic.
//! Beyond that this checks that an accepted event satisfies the documented invariants (1–100
//! distinct ids and a platform for an item kind, neither for `rules_changed`, version ≥ 1,
//! whole-second `occurred_at`), that `encode_event` of it decodes to
//! the same event with stable bytes, that a correct signature is accepted exactly when the body
//! is, and that a wrong or missing signature is refused before the body is parsed at all.
#![no_main]

use std::collections::HashSet;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use rebate_domain::Timestamp;
use rebate_events::{
    MAX_BODY_BYTES, MAX_ITEMS_PER_EVENT, Rejection, SigningKey, ValidationPolicy, decode_event,
    encode_event, sign,
};

const NOW_MILLIS: i64 = 1_796_126_400_000; // 2026-12-01T12:00:00Z

fuzz_target!(|data: &[u8]| {
    let now = Timestamp::from_millis(NOW_MILLIS);
    let permissive = ValidationPolicy::permissive(now);
    let key = SigningKey::new("fuzz-signing-secret-0123456789").unwrap();
    let signed_only = ValidationPolicy {
        max_age: None,
        max_future_skew: None,
        ..ValidationPolicy::production(key.clone(), Duration::ZERO, now)
    };

    let plain = decode_event(data, None, &permissive);

    // With a signing key the body's signature is checked first, over the raw bytes.
    let signature = sign(data, &key);
    assert_eq!(decode_event(data, Some(&signature), &signed_only), plain);
    if data.len() <= MAX_BODY_BYTES {
        let mut wrong = signature.clone().into_bytes();
        let last = wrong.last_mut().unwrap();
        *last = if *last == b'0' { b'1' } else { b'0' };
        let wrong = String::from_utf8(wrong).unwrap();
        assert_eq!(
            decode_event(data, Some(&wrong), &signed_only),
            Err(Rejection::SignatureMismatch)
        );
        assert_eq!(
            decode_event(data, None, &signed_only),
            Err(Rejection::SignatureMissing)
        );
    }

    match plain {
        Ok(event) => {
            let ids = event.item_ids();
            if event.kind().names_items() {
                assert!((1..=MAX_ITEMS_PER_EVENT).contains(&ids.len()));
                assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len());
                assert!(event.platform().is_some());
            } else {
                assert!(ids.is_empty());
                assert_eq!(event.platform(), None);
            }
            assert!(event.version() >= 1);
            assert_eq!(event.occurred_at().as_millis().rem_euclid(1_000), 0);

            let body = encode_event(&event);
            let again = decode_event(&body, None, &permissive).unwrap_or_else(|rejection| {
                panic!(
                    "re-encoded event refused: {rejection} ({})",
                    String::from_utf8_lossy(&body)
                )
            });
            assert_eq!(again, event);
            assert_eq!(encode_event(&again), body, "encoding is not stable");
        }
        Err(rejection) => {
            assert!(!rejection.code().is_empty());
            assert!(!rejection.to_string().is_empty());
        }
    }
});
