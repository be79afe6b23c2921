//! Why an event was refused. The `Display` text is the dead-letter reason operators read; the
//! [`Rejection::code`] is the stable label for counters and headers.

use rebate_domain::{ItemId, KeyError};

use crate::limits::{MAX_BODY_BYTES, MAX_ITEMS_PER_EVENT, MAX_VERSION, SCHEMA_VERSION};

/// One precise reason an event is not acceptable, whether received or built locally.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The body exceeds [`MAX_BODY_BYTES`]; it is not even parsed.
    #[error("body is {size} bytes; the limit is {limit} bytes", limit = MAX_BODY_BYTES)]
    TooLarge { size: usize },
    /// Not JSON at all (syntax error, truncated input, invalid UTF-8).
    #[error("malformed JSON at line {line} column {column}: {detail}")]
    MalformedJson {
        line: usize,
        column: usize,
        detail: String,
    },
    /// A field this schema does not define; refused so that typos are not silently ignored.
    #[error("unknown field `{0}`")]
    UnknownField(String),
    #[error("missing field `{0}`")]
    MissingField(String),
    #[error("duplicate field `{0}`")]
    DuplicateField(String),
    /// Valid JSON of the wrong shape, e.g. a number where a string belongs.
    #[error("wrong type: {0}")]
    WrongType(String),
    /// A newer (or bogus) schema; the consumer must be upgraded before publishers switch.
    #[error("schema {0} is not supported; this consumer reads schema {SCHEMA_VERSION}")]
    UnsupportedSchema(u64),
    #[error("{0}")]
    InvalidEventId(&'static str),
    #[error(
        "unknown event kind {0:?}; expected one of rate_changed, product_changed, coupons_changed, item_created, item_delisted, rules_changed"
    )]
    UnknownKind(String),
    #[error("platform: {0}")]
    InvalidPlatform(KeyError),
    #[error("item_ids[{index}]: {error}")]
    InvalidItemId { index: usize, error: KeyError },
    #[error("item_ids is empty")]
    NoItems,
    #[error("more than {MAX_ITEMS_PER_EVENT} item ids (got {count}); split the batch")]
    TooManyItems { count: usize },
    #[error("duplicate item id {0}")]
    DuplicateItemId(ItemId),
    /// `platform` or `item_ids` on a `rules_changed` event, the one kind that names no items.
    #[error("`{0}` is not allowed on a rules_changed event: it names no items")]
    FieldNotAllowed(&'static str),
    #[error("version must be at least 1")]
    VersionZero,
    /// Above [`MAX_VERSION`] (2^53 − 1): JSON readers that use doubles would round it.
    #[error("version {version} is above the maximum {MAX_VERSION} (2^53 - 1)")]
    VersionTooLarge { version: u64 },
    #[error("occurred_at is not an RFC 3339 timestamp: {0}")]
    InvalidOccurredAt(String),
    /// The policy requires a signature and none travelled with the body.
    #[error("signature missing")]
    SignatureMissing,
    #[error("signature must look like sha256=<64 lowercase hex digits>")]
    SignatureMalformed,
    /// Wrong secret or a body altered in transit.
    #[error("signature does not match")]
    SignatureMismatch,
    /// Older than the policy's maximum age: possibly a replay, certainly not worth acting on.
    #[error("event is {age_secs} s old; the limit is {limit_secs} s")]
    TooOld { age_secs: u64, limit_secs: u64 },
    /// Further ahead than the allowed clock skew.
    #[error("occurred_at is {ahead_secs} s in the future")]
    InFuture { ahead_secs: u64 },
}

impl Rejection {
    /// A short, stable snake_case label for counters, metrics and dead-letter headers.
    pub const fn code(&self) -> &'static str {
        match self {
            Rejection::TooLarge { .. } => "too_large",
            Rejection::MalformedJson { .. } => "malformed_json",
            Rejection::UnknownField(_) => "unknown_field",
            Rejection::MissingField(_) => "missing_field",
            Rejection::DuplicateField(_) => "duplicate_field",
            Rejection::WrongType(_) => "wrong_type",
            Rejection::UnsupportedSchema(_) => "unsupported_schema",
            Rejection::InvalidEventId(_) => "invalid_event_id",
            Rejection::UnknownKind(_) => "unknown_kind",
            Rejection::InvalidPlatform(_) => "invalid_platform",
            Rejection::InvalidItemId { .. } => "invalid_item_id",
            Rejection::NoItems => "no_items",
            Rejection::TooManyItems { .. } => "too_many_items",
            Rejection::DuplicateItemId(_) => "duplicate_item_id",
            Rejection::FieldNotAllowed(_) => "field_not_allowed",
            Rejection::VersionZero => "version_zero",
            Rejection::VersionTooLarge { .. } => "version_too_large",
            Rejection::InvalidOccurredAt(_) => "invalid_occurred_at",
            Rejection::SignatureMissing => "signature_missing",
            Rejection::SignatureMalformed => "signature_malformed",
            Rejection::SignatureMismatch => "signature_mismatch",
            Rejection::TooOld { .. } => "too_old",
            Rejection::InFuture { .. } => "in_future",
        }
    }
}
