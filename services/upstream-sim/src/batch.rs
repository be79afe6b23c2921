//! Batch calls: many item keys in one request, as real affiliate APIs take them.
//!
//! `POST /v1/coupons:batch` and `POST /v1/extras:batch` take a [`BatchRequest`] and answer a
//! [`BatchResponse`] whose elements are, in request order, exactly the bodies the single-item
//! routes answer. A batch is one call: one fault draw for the whole batch (an outage refuses all
//! of it), one count in `calls` and `batch_calls`, its length in `items`. That is what the
//! service's coalescing of cold loads is measured by: one outbound quota token per call.

use std::ops::RangeInclusive;

use rebate_domain::{ItemKey, KeyError};
use serde::{Deserialize, Serialize};

/// The most items one batch call may carry unless changed with
/// [`crate::SimState::set_max_batch_items`]: a typical affiliate API's page size.
pub const MAX_BATCH_ITEMS: usize = 40;

/// The values [`crate::SimState::set_max_batch_items`] accepts. A thousand keys is past any real
/// API's limit and still fits in [`MAX_BODY_BYTES`].
pub const MAX_BATCH_ITEMS_BOUNDS: RangeInclusive<usize> = 1..=1_000;

/// The largest request body any route accepts; larger ones are answered 413 `payload_too_large`.
///
/// The longest item, `{"platform":"taobao","item_id":"<20 digits>"},`, is 56 bytes, so the
/// largest allowed batch (1 000 such items, compact JSON) is about 55 KiB. Fault bodies are far
/// smaller.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Body of a batch call: `{"items":[{"platform":"taobao","item_id":"100001"}, …]}`.
///
/// Keys stay text until [`BatchRequest::parse`], so an invalid one is reported by its index
/// rather than as a JSON error somewhere in the body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    pub items: Vec<BatchItem>,
}

/// One key of a [`BatchRequest`], as sent; the same JSON shape as a serialised [`ItemKey`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchItem {
    pub platform: String,
    pub item_id: String,
}

/// Body of a successful batch call: one element per requested key, in request order (a key
/// asked twice is answered twice), each exactly what the single-item route answers for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchResponse<T> {
    pub items: Vec<T>,
}

/// Why a well-formed batch body was refused before it was counted as a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("items must not be empty")]
    Empty,
    #[error("{count} items in one call; at most {max} are allowed")]
    TooManyItems { count: usize, max: usize },
    /// The first invalid key; `index` counts from 0 in request order.
    #[error("items[{index}]: {source}")]
    InvalidItem { index: usize, source: KeyError },
}

/// [`crate::SimState::set_max_batch_items`] was given a value outside [`MAX_BATCH_ITEMS_BOUNDS`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "max_batch_items must be between {} and {}, got {value}",
    MAX_BATCH_ITEMS_BOUNDS.start(),
    MAX_BATCH_ITEMS_BOUNDS.end()
)]
pub struct BatchLimitError {
    pub value: usize,
}

impl BatchRequest {
    /// The request a client sends for `keys`, in that order.
    pub fn new(keys: impl IntoIterator<Item = ItemKey>) -> Self {
        Self {
            items: keys.into_iter().map(BatchItem::from).collect(),
        }
    }

    /// Checks the size against `max_items`, then parses every key in order; the first invalid one
    /// is reported with its index. The size is checked first, so an oversized batch costs no
    /// parsing.
    pub fn parse(&self, max_items: usize) -> Result<Vec<ItemKey>, BatchError> {
        if self.items.is_empty() {
            return Err(BatchError::Empty);
        }
        if self.items.len() > max_items {
            return Err(BatchError::TooManyItems {
                count: self.items.len(),
                max: max_items,
            });
        }
        self.items
            .iter()
            .enumerate()
            .map(|(index, item)| {
                ItemKey::parse(&item.platform, &item.item_id)
                    .map_err(|source| BatchError::InvalidItem { index, source })
            })
            .collect()
    }
}

impl From<ItemKey> for BatchItem {
    fn from(key: ItemKey) -> Self {
        Self {
            platform: key.platform.as_str().to_owned(),
            item_id: key.item_id.as_str().to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use rebate_domain::{ItemId, Platform};

    use super::*;

    fn key(platform: &str, item_id: &str) -> ItemKey {
        ItemKey::parse(platform, item_id).unwrap()
    }

    #[test]
    fn keys_round_trip_in_order_with_duplicates() {
        let keys = vec![
            key("jd", "7"),
            key("taobao", "100001"),
            key("jd", "7"),
            key("pdd", "007"),
        ];
        let request = BatchRequest::new(keys.clone());
        let json = serde_json::to_string(&request).unwrap();
        assert!(
            json.starts_with(r#"{"items":[{"platform":"jd","item_id":"7"},"#),
            "{json}"
        );
        // The shape a client gets by serialising `ItemKey`s directly.
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            serde_json::json!({ "items": keys }),
            "same wire shape as ItemKey"
        );
        let parsed: BatchRequest = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed.parse(MAX_BATCH_ITEMS), Ok(keys));
    }

    #[test]
    fn size_is_checked_before_keys() {
        assert_eq!(
            BatchRequest { items: Vec::new() }.parse(MAX_BATCH_ITEMS),
            Err(BatchError::Empty)
        );
        let mut items: Vec<BatchItem> = (0..41)
            .map(|number| BatchItem::from(ItemKey::new(Platform::Jd, ItemId::from_u64(number))))
            .collect();
        items[3].platform = "amazon".into();
        let too_many = BatchRequest { items };
        assert_eq!(
            too_many.parse(40),
            Err(BatchError::TooManyItems { count: 41, max: 40 })
        );
        let error = too_many.parse(41).unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"items[3]: unknown platform "amazon"; expected one of taobao, jd, pdd"#
        );
    }

    #[test]
    fn the_first_invalid_item_is_named() {
        let request: BatchRequest = serde_json::from_value(serde_json::json!({"items": [
            {"platform": "jd", "item_id": "1"},
            {"platform": "jd", "item_id": "12a"},
            {"platform": "jd", "item_id": ""},
        ]}))
        .unwrap();
        assert_eq!(
            request.parse(MAX_BATCH_ITEMS),
            Err(BatchError::InvalidItem {
                index: 1,
                source: KeyError::ItemIdNotDigits
            })
        );
    }

    #[test]
    fn unknown_fields_are_refused() {
        for body in [
            r#"{"items":[],"extra":1}"#,
            r#"{"items":[{"platform":"jd","item_id":"1","sku":"2"}]}"#,
        ] {
            let error = serde_json::from_str::<BatchRequest>(body).unwrap_err();
            assert!(error.to_string().contains("unknown field"), "{error}");
        }
    }

    #[test]
    fn the_largest_batch_fits_in_the_body_limit() {
        let longest = ItemId::parse(&"9".repeat(ItemId::MAX_LEN)).unwrap();
        let request = BatchRequest::new(std::iter::repeat_n(
            ItemKey::new(Platform::Taobao, longest),
            *MAX_BATCH_ITEMS_BOUNDS.end(),
        ));
        let bytes = serde_json::to_vec(&request).unwrap().len();
        assert!(bytes <= MAX_BODY_BYTES, "{bytes}");
    }
}
