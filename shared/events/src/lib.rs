//! Cache-invalidation events: the contract between operators' publishers and every instance.
//!
//! Contract: an event is versioned JSON (schema 1) naming what changed (`kind`), for which
//! items of one platform, at which data version (`1 ..=` [`MAX_VERSION`], i.e. 2^53 − 1, so that
//! every JSON reader sees the exact number) and when. One kind names no items: `rules_changed`,
//! the service's announcement that its live-rules set reached a version, which carries neither
//! platform nor items and is otherwise signed, checked and delivered as any event. Decoding is
//! strict and total: any bytes yield either a valid [`InvalidationEvent`] or a [`Rejection`]
//! whose text is the dead-letter reason, never a panic. In production a [`ValidationPolicy`] also
//! requires an HMAC-SHA256 signature (carried beside the body) and refuses stale events.
//! Duplicates and out-of-order events are harmless; [`Deduplicator`] and [`VersionGate`] merely
//! save work.
//! This crate does no network I/O and knows nothing of RabbitMQ, HTTP or the cache tiers:
//! broker adapters implement [`EventPublisher`] and drive [`EventHandler`]s; the embedded
//! default is the [`InProcessBus`], which validates and delivers with the same semantics.
//!
//! # Layout
//! - [`event`]: [`InvalidationEvent`], [`EventId`], [`EventKind`] and the parts each kind affects.
//! - [`wire`]: the JSON format, [`encode_event`], [`decode_event`], [`sign`], [`SigningKey`],
//!   [`ValidationPolicy`].
//! - [`rejection`]: [`Rejection`], every reason an event is refused, with stable codes.
//! - [`dedupe`]: [`Deduplicator`] (event ids) and [`VersionGate`] (versions per item and part).
//! - [`bus`]: [`EventPublisher`], [`EventHandler`] and the [`InProcessBus`].

pub mod bus;
pub mod dedupe;
pub mod event;
pub mod limits;
pub mod rejection;
pub mod wire;

pub use bus::{
    BusConfig, BusStats, DeadLetter, EventHandler, EventPublisher, HandlerError, InProcessBus,
    PublishError, Subscription,
};
pub use dedupe::{Deduplicator, VersionGate};
pub use event::{
    EventId, EventKind, FIRST_VERSION, Fence, InvalidationEvent, MAX_ITEMS_PER_EVENT, MAX_VERSION,
};
pub use rejection::Rejection;
pub use wire::{
    MAX_BODY_BYTES, SCHEMA_VERSION, SIGNATURE_PREFIX, SigningKey, SigningKeyTooShort,
    ValidationPolicy, decode_event, encode_event, sign,
};
