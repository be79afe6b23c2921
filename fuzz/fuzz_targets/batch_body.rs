//! The batch route's JSON body: `serde_json::from_slice::<BatchRequest>` then `check_size(50)`.
//!
//! The body comes straight from clients. Decoding must never panic; an accepted body must be
//! exactly `{"items": [{"platform", "item_id"}, …]}` (unknown fields refused), re-parse equal
//! when written back out, and `check_size` must accept exactly 1 to 50 keys and name the count
//! it refused. Each key's own validation (`ItemKey::parse`) runs too, as the handler does.
#![no_main]

use libfuzzer_sys::fuzz_target;
use query_api::http::ApiError;
use query_api::http::items::BatchRequest;
use rebate_domain::ItemKey;

const MAX_BATCH: usize = 50;

fuzz_target!(|data: &[u8]| {
    let Ok(batch) = serde_json::from_slice::<BatchRequest>(data) else {
        return;
    };

    match batch.check_size(MAX_BATCH) {
        Ok(()) => assert!((1..=MAX_BATCH).contains(&batch.items.len())),
        Err(ApiError::InvalidBatchSize { got, max }) => {
            assert_eq!((got, max), (batch.items.len(), MAX_BATCH));
            assert!(got == 0 || got > MAX_BATCH);
        }
        Err(other) => panic!("check_size returned {other:?}"),
    }

    let rewritten = serde_json::json!({
        "items": batch
            .items
            .iter()
            .map(|key| serde_json::json!({"platform": key.platform, "item_id": key.item_id}))
            .collect::<Vec<_>>(),
    });
    let reparsed: BatchRequest = serde_json::from_slice(&serde_json::to_vec(&rewritten).unwrap())
        .expect("a re-serialized batch parses");
    assert_eq!(reparsed.items, batch.items);

    for key in &batch.items {
        if let Ok(parsed) = ItemKey::parse(&key.platform, &key.item_id) {
            assert_eq!(parsed.platform.as_str(), key.platform);
            assert_eq!(parsed.item_id.as_str(), key.item_id);
        }
    }
});
