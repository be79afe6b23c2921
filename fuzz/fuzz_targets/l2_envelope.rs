//! `Envelope::<T>::decode`: the bytes read back from Redis (L2) for each of the four parts.
//!
//! Redis is shared by every instance and any of them, an operator or an older release may have
//! written the key, so decoding must be total. Whatever decodes must re-encode to bytes that
//! decode to the same envelope (a value written back to L2 stays itself), and the freshness
//! checks and the arithmetic L1 applies when adopting an L2 entry must not panic even on
//! extreme timestamps.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rebate_cache::Envelope;
use rebate_domain::{Coupon, Extras, Product, RebateRate, Timestamp};
use serde::Serialize;
use serde::de::DeserializeOwned;

fn check<T>(bytes: &[u8])
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let Ok(envelope) = Envelope::<T>::decode(bytes) else {
        return;
    };

    let encoded = envelope.encode().expect("a decoded envelope re-encodes");
    let again = Envelope::<T>::decode(&encoded).expect("re-encoded bytes decode");
    assert_eq!(again, envelope);
    assert_eq!(again.encode().unwrap(), encoded, "encoding is not stable");
    if !envelope.tombstone {
        assert!(!String::from_utf8_lossy(&encoded).contains("\"tombstone\""));
    }

    let instants = [
        Timestamp::from_millis(i64::MIN),
        Timestamp::from_millis(-1),
        Timestamp::from_millis(0),
        Timestamp::from_millis(1_764_504_000_000),
        Timestamp::from_millis(i64::MAX),
        envelope.fetched_at,
        envelope.fresh_until,
        envelope.stale_until,
    ];
    for now in instants {
        let fresh = envelope.is_fresh(now);
        let servable = envelope.is_servable(now);
        if envelope.tombstone {
            assert!(!fresh && !servable, "a fence is never served");
        } else {
            assert_eq!(fresh, now < envelope.fresh_until);
            assert_eq!(servable, now < envelope.stale_until);
        }
        // What L1 does with an adopted L2 entry (part/l1.rs `adopt_from_l2`, admin views).
        let capped = envelope
            .fresh_until
            .min(now.saturating_add_millis(u64::MAX));
        assert!(capped <= envelope.fresh_until);
        let _ = envelope.stale_until.millis_since(now);
        let _ = now.millis_since(envelope.fetched_at);
        let _ = format!("{:?} {}", envelope.fresh_until, envelope.stale_until);
    }
    assert_eq!(envelope.is_not_found(), envelope.value.is_none());
}

fuzz_target!(|data: &[u8]| {
    check::<Product>(data);
    check::<RebateRate>(data);
    check::<Vec<Coupon>>(data);
    check::<Extras>(data);
});
