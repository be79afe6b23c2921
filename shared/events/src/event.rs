//! The invalidation event itself: what changed, for which items, at which data version.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use rebate_domain::{ItemId, ItemKey, PartKind, Platform, Timestamp};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::rejection::Rejection;

pub use crate::limits::{MAX_ITEMS_PER_EVENT, MAX_VERSION};

/// The identity of one event, used to drop duplicates (brokers deliver at least once).
///
/// 1 to 64 characters of `[A-Za-z0-9._:-]`: wide enough for UUIDs, ULIDs and operator-chosen
/// ids such as `ops:2026-11-30:1`, narrow enough to be safe in headers, logs and metric labels.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(String);

impl EventId {
    pub const MAX_LEN: usize = 64;

    /// Parses an id given by a publisher.
    pub fn parse(text: &str) -> Result<Self, Rejection> {
        if text.is_empty() {
            return Err(Rejection::InvalidEventId("event_id must not be empty"));
        }
        if text.len() > Self::MAX_LEN {
            return Err(Rejection::InvalidEventId(
                "event_id is longer than 64 characters",
            ));
        }
        let allowed = |byte: &u8| byte.is_ascii_alphanumeric() || b"._:-".contains(byte);
        if !text.as_bytes().iter().all(allowed) {
            return Err(Rejection::InvalidEventId(
                "event_id may contain only A-Z a-z 0-9 . _ : -",
            ));
        }
        Ok(Self(text.to_owned()))
    }

    /// A fresh random id (32 lowercase hex characters, 128 random bits) for publishers that have
    /// no natural id of their own.
    pub fn generate() -> Self {
        let random_bits: u128 = rand::random();
        Self(format!("{random_bits:032x}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for EventId {
    type Err = Rejection;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.0)
    }
}

impl fmt::Debug for EventId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "EventId({})", self.0)
    }
}

impl Serialize for EventId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for EventId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        EventId::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// What changed upstream. The kind decides which cached parts become stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", expecting = "an event kind")]
pub enum EventKind {
    /// The commission rate changed.
    RateChanged,
    /// Title, price, images or status changed.
    ProductChanged,
    /// Coupons were added, removed or changed.
    CouponsChanged,
    /// A new item exists: the Bloom filter must learn it, and whatever was cached for the key
    /// before it existed (not-found answers) must not outlive the event.
    ItemCreated,
    /// The item left the platform: its product row changed status (and version). The item then
    /// answers 404 from its product part; its other parts are unchanged.
    ItemDelisted,
    /// A live-rules set reached a new version (the event's `version`): every instance re-reads
    /// its rules from the store now rather than at its next poll. It names no platform and no
    /// item and touches no cache. Only the service announces it, never an operator.
    RulesChanged,
}

impl EventKind {
    pub const ALL: [EventKind; 6] = [
        EventKind::RateChanged,
        EventKind::ProductChanged,
        EventKind::CouponsChanged,
        EventKind::ItemCreated,
        EventKind::ItemDelisted,
        EventKind::RulesChanged,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            EventKind::RateChanged => "rate_changed",
            EventKind::ProductChanged => "product_changed",
            EventKind::CouponsChanged => "coupons_changed",
            EventKind::ItemCreated => "item_created",
            EventKind::ItemDelisted => "item_delisted",
            EventKind::RulesChanged => "rules_changed",
        }
    }

    /// Whether events of this kind name a platform and 1 to [`MAX_ITEMS_PER_EVENT`] items.
    /// Every kind does but `rules_changed`, which names neither (and operators may not publish).
    pub const fn names_items(self) -> bool {
        !matches!(self, EventKind::RulesChanged)
    }

    /// The cached parts this kind makes stale, i.e. what the consumer must fence.
    pub const fn affected_parts(self) -> &'static [PartKind] {
        match self {
            EventKind::RateChanged => &[PartKind::Rate],
            EventKind::ProductChanged | EventKind::ItemDelisted => &[PartKind::Product],
            EventKind::CouponsChanged => &[PartKind::Coupons],
            EventKind::ItemCreated => &[PartKind::Product, PartKind::Rate, PartKind::Extras],
            EventKind::RulesChanged => &[],
        }
    }

    /// Whether the items must be added to the "known items" Bloom filter, so that the first
    /// query for a brand-new item is not turned away as unknown.
    pub const fn adds_to_bloom_filter(self) -> bool {
        matches!(self, EventKind::ItemCreated)
    }
}

impl FromStr for EventKind {
    type Err = Rejection;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        EventKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == text)
            .ok_or_else(|| Rejection::UnknownKind(truncate_for_message(text)))
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// The schema lists the kinds operators may publish (the admin API's request is its only use):
/// `rules_changed` is the service's own announcement, refused from operators.
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for EventKind {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
        ObjectBuilder::new()
            .schema_type(SchemaType::Type(Type::String))
            .description(Some(
                "What changed upstream. The kind decides which cached parts become stale.",
            ))
            .enum_values(Some(
                EventKind::ALL
                    .into_iter()
                    .filter(|kind| kind.names_items())
                    .map(EventKind::as_str),
            ))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for EventKind {}

/// A validated invalidation event. Every value of this type satisfies the contract: a valid id,
/// a version in `1 ..=` [`MAX_VERSION`], an `occurred_at` with whole-second precision (the wire
/// carries seconds, so encode/decode round-trips exactly), and
/// - for a kind that [names items](EventKind::names_items): one platform and 1 to
///   [`MAX_ITEMS_PER_EVENT`] distinct item ids;
/// - for `rules_changed`: neither platform nor items; its version is the rule set's.
///
/// Build one with [`InvalidationEvent::new`] or [`InvalidationEvent::rules_changed`], or receive
/// one from [`crate::decode_event`]; turn it into bytes with [`crate::encode_event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidationEvent {
    event_id: EventId,
    kind: EventKind,
    /// `None` exactly when the kind names no items.
    items: Option<Items>,
    version: u64,
    occurred_at: Timestamp,
}

/// The items an item event is about: all of one platform.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Items {
    platform: Platform,
    /// 1 to [`MAX_ITEMS_PER_EVENT`], distinct.
    ids: Vec<ItemId>,
}

impl InvalidationEvent {
    /// Validates and builds an event about items; `occurred_at` is truncated to whole seconds.
    /// A kind that names no items is refused: build those with their own constructor.
    pub fn new(
        event_id: EventId,
        kind: EventKind,
        platform: Platform,
        item_ids: Vec<ItemId>,
        version: u64,
        occurred_at: Timestamp,
    ) -> Result<Self, Rejection> {
        if !kind.names_items() {
            return Err(Rejection::FieldNotAllowed("platform"));
        }
        if item_ids.is_empty() {
            return Err(Rejection::NoItems);
        }
        if item_ids.len() > MAX_ITEMS_PER_EVENT {
            return Err(Rejection::TooManyItems {
                count: item_ids.len(),
            });
        }
        let mut seen = HashSet::with_capacity(item_ids.len());
        if let Some(duplicate) = item_ids.iter().find(|item_id| !seen.insert(**item_id)) {
            return Err(Rejection::DuplicateItemId(*duplicate));
        }
        check_version(version)?;
        Ok(Self {
            event_id,
            kind,
            items: Some(Items {
                platform,
                ids: item_ids,
            }),
            version,
            occurred_at: whole_seconds(occurred_at),
        })
    }

    /// The announcement that the live-rules set reached `version`; `occurred_at` is truncated
    /// to whole seconds. Names no platform and no item.
    pub fn rules_changed(
        event_id: EventId,
        version: u64,
        occurred_at: Timestamp,
    ) -> Result<Self, Rejection> {
        check_version(version)?;
        Ok(Self {
            event_id,
            kind: EventKind::RulesChanged,
            items: None,
            version,
            occurred_at: whole_seconds(occurred_at),
        })
    }

    pub fn event_id(&self) -> &EventId {
        &self.event_id
    }

    pub fn kind(&self) -> EventKind {
        self.kind
    }

    /// The platform of the items; `None` for a kind that names no items.
    pub fn platform(&self) -> Option<Platform> {
        self.items.as_ref().map(|items| items.platform)
    }

    /// Distinct, in the order the publisher gave them; empty for a kind that names no items.
    pub fn item_ids(&self) -> &[ItemId] {
        self.items
            .as_ref()
            .map_or(&[], |items| items.ids.as_slice())
    }

    /// The upstream data version after the change (for `rules_changed`, the rule set's
    /// version); compared to skip out-of-order events.
    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn occurred_at(&self) -> Timestamp {
        self.occurred_at
    }

    /// The cache keys this event is about (none for a kind that names no items).
    pub fn keys(&self) -> impl Iterator<Item = ItemKey> + '_ {
        self.items.iter().flat_map(|items| {
            items
                .ids
                .iter()
                .map(|item_id| ItemKey::new(items.platform, *item_id))
        })
    }

    /// Shorthand for `self.kind().affected_parts()`.
    pub fn affected_parts(&self) -> &'static [PartKind] {
        self.kind.affected_parts()
    }

    /// The fences this event sets, each in its part's own version space (docs/ARCHITECTURE.md,
    /// "Versions and fences"), `applied_at` being when this instance applies it:
    /// - the part the kind names (rate, product, coupons) at the event's version, which is that
    ///   part's row or document version;
    /// - for `item_created`: the product at the event's version, the rate at
    ///   [`FIRST_VERSION`] (past the not-found answer cached before the row existed, version 0),
    ///   and the extras at `applied_at` in milliseconds (extras carry the time they were
    ///   fetched: anything fetched before the event is refused);
    /// - for `rules_changed`: none.
    pub fn fences(&self, applied_at: Timestamp) -> impl Iterator<Item = Fence> + '_ {
        let fetched_before = u64::try_from(applied_at.as_millis()).unwrap_or(0);
        self.affected_parts().iter().map(move |part| Fence {
            part: *part,
            version: match (self.kind, part) {
                (EventKind::ItemCreated, PartKind::Rate) => FIRST_VERSION,
                (EventKind::ItemCreated, PartKind::Extras) => fetched_before,
                _ => self.version,
            },
        })
    }
}

/// Every event's version is in `1 ..=` [`MAX_VERSION`].
fn check_version(version: u64) -> Result<(), Rejection> {
    if version == 0 {
        return Err(Rejection::VersionZero);
    }
    if version > MAX_VERSION {
        return Err(Rejection::VersionTooLarge { version });
    }
    Ok(())
}

/// The wire carries whole seconds; so does every event, so that it round-trips exactly.
fn whole_seconds(occurred_at: Timestamp) -> Timestamp {
    let millis = occurred_at.as_millis();
    Timestamp::from_millis(millis - millis.rem_euclid(1_000))
}

/// The lowest version of a stored row or upstream document; version 0 is what a part records
/// for "not found" (a missing row, an API's 404 or a document without a version).
pub const FIRST_VERSION: u64 = 1;

/// One part an event makes stale and the version a load of it must reach to be cached again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub part: PartKind,
    pub version: u64,
}

/// Keeps echoed input short in dead-letter reasons and logs.
pub(crate) fn truncate_for_message(text: &str) -> String {
    rebate_domain::text::truncate_chars(text, 40)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(numbers: &[u64]) -> Vec<ItemId> {
        numbers
            .iter()
            .map(|number| ItemId::from_u64(*number))
            .collect()
    }

    #[test]
    fn event_id_accepts_the_documented_alphabet_only() {
        assert!(EventId::parse("ops:2026-11-30_1.a-B").is_ok());
        assert!(EventId::parse(&"a".repeat(64)).is_ok());
        assert!(matches!(
            EventId::parse(""),
            Err(Rejection::InvalidEventId(_))
        ));
        assert!(matches!(
            EventId::parse(&"a".repeat(65)),
            Err(Rejection::InvalidEventId(_))
        ));
        assert!(matches!(
            EventId::parse("a b"),
            Err(Rejection::InvalidEventId(_))
        ));
        assert!(matches!(
            EventId::parse("é"),
            Err(Rejection::InvalidEventId(_))
        ));
    }

    #[test]
    fn generated_ids_are_valid_and_distinct() {
        let first = EventId::generate();
        let second = EventId::generate();
        assert_eq!(first.as_str().len(), 32);
        assert!(EventId::parse(first.as_str()).is_ok());
        assert_ne!(first, second);
    }

    #[test]
    fn kinds_name_the_parts_they_affect() {
        use PartKind::*;
        assert_eq!(EventKind::RateChanged.affected_parts(), &[Rate]);
        assert_eq!(EventKind::ProductChanged.affected_parts(), &[Product]);
        assert_eq!(EventKind::CouponsChanged.affected_parts(), &[Coupons]);
        assert_eq!(
            EventKind::ItemCreated.affected_parts(),
            &[Product, Rate, Extras]
        );
        assert!(EventKind::ItemCreated.adds_to_bloom_filter());
        assert!(!EventKind::ItemDelisted.adds_to_bloom_filter());
        assert_eq!(EventKind::ItemDelisted.affected_parts(), &[Product]);
        assert_eq!(EventKind::RulesChanged.affected_parts(), &[]);
        assert!(!EventKind::RulesChanged.adds_to_bloom_filter());
        for kind in EventKind::ALL {
            assert_eq!(kind.as_str().parse::<EventKind>().unwrap(), kind);
            assert_eq!(
                kind.names_items(),
                kind != EventKind::RulesChanged,
                "{kind}"
            );
        }
    }

    #[cfg(feature = "openapi")]
    #[test]
    fn the_openapi_schema_lists_only_the_kinds_operators_may_publish() {
        let schema = serde_json::to_value(<EventKind as utoipa::PartialSchema>::schema()).unwrap();
        assert_eq!(
            schema,
            serde_json::json!({
                "description": "What changed upstream. The kind decides which cached parts become stale.",
                "enum": ["rate_changed", "product_changed", "coupons_changed", "item_created", "item_delisted"],
                "type": "string"
            })
        );
    }

    #[test]
    fn a_rules_announcement_names_no_items_and_sets_no_fence() {
        let event = InvalidationEvent::rules_changed(
            EventId::parse("rules-7").unwrap(),
            7,
            Timestamp::from_millis(1_700_000_000_999),
        )
        .unwrap();
        assert_eq!(event.kind(), EventKind::RulesChanged);
        assert_eq!(event.version(), 7);
        assert_eq!(event.occurred_at().as_millis(), 1_700_000_000_000);
        assert_eq!(event.platform(), None);
        assert!(event.item_ids().is_empty());
        assert_eq!(event.keys().count(), 0);
        assert_eq!(event.fences(Timestamp::from_millis(0)).count(), 0);

        let rules = |version| {
            InvalidationEvent::rules_changed(EventId::generate(), version, Timestamp::default())
        };
        assert_eq!(rules(0), Err(Rejection::VersionZero));
        assert_eq!(
            rules(MAX_VERSION + 1),
            Err(Rejection::VersionTooLarge {
                version: MAX_VERSION + 1
            })
        );
        // Items (or a platform) cannot be given to it through the item events' constructor.
        let with_items = InvalidationEvent::new(
            EventId::generate(),
            EventKind::RulesChanged,
            Platform::Jd,
            ids(&[1]),
            7,
            Timestamp::default(),
        );
        assert_eq!(with_items, Err(Rejection::FieldNotAllowed("platform")));
        assert_eq!(
            with_items.unwrap_err().to_string(),
            "`platform` is not allowed on a rules_changed event: it names no items"
        );
    }

    #[test]
    fn every_item_kind_still_requires_its_items() {
        for kind in EventKind::ALL.into_iter().filter(|kind| kind.names_items()) {
            let event = InvalidationEvent::new(
                EventId::generate(),
                kind,
                Platform::Pdd,
                vec![],
                1,
                Timestamp::default(),
            );
            assert_eq!(event, Err(Rejection::NoItems), "{kind}");
        }
    }

    #[test]
    fn each_fence_is_in_its_parts_own_version_space() {
        use PartKind::*;
        let event = |kind| {
            InvalidationEvent::new(
                EventId::generate(),
                kind,
                Platform::Jd,
                ids(&[7]),
                42,
                Timestamp::from_millis(0),
            )
            .unwrap()
        };
        let applied_at = Timestamp::from_millis(1_800_000_000_000);
        let fences = |kind| {
            event(kind)
                .fences(applied_at)
                .map(|fence| (fence.part, fence.version))
                .collect::<Vec<_>>()
        };
        assert_eq!(fences(EventKind::RateChanged), [(Rate, 42)]);
        assert_eq!(fences(EventKind::ProductChanged), [(Product, 42)]);
        assert_eq!(fences(EventKind::CouponsChanged), [(Coupons, 42)]);
        assert_eq!(fences(EventKind::ItemDelisted), [(Product, 42)]);
        assert_eq!(
            fences(EventKind::ItemCreated),
            [(Product, 42), (Rate, 1), (Extras, 1_800_000_000_000)]
        );
    }

    #[test]
    fn new_enforces_the_invariants() {
        let build = |items: Vec<ItemId>, version: u64| {
            InvalidationEvent::new(
                EventId::generate(),
                EventKind::RateChanged,
                Platform::Taobao,
                items,
                version,
                Timestamp::from_millis(1_700_000_000_123),
            )
        };
        let event = build(ids(&[1, 2]), 1).unwrap();
        assert_eq!(event.occurred_at().as_millis(), 1_700_000_000_000);
        let keys: Vec<ItemKey> = event.keys().collect();
        assert_eq!(keys[1], ItemKey::new(Platform::Taobao, ItemId::from_u64(2)));
        assert_eq!(build(vec![], 1), Err(Rejection::NoItems));
        assert_eq!(
            build(ids(&[1, 1]), 1),
            Err(Rejection::DuplicateItemId(ItemId::from_u64(1)))
        );
        assert_eq!(build(ids(&[1]), 0), Err(Rejection::VersionZero));
        assert_eq!(
            build(ids(&[1]), MAX_VERSION).unwrap().version(),
            MAX_VERSION
        );
        assert_eq!(
            build(ids(&[1]), MAX_VERSION + 1),
            Err(Rejection::VersionTooLarge {
                version: MAX_VERSION + 1
            })
        );
        assert_eq!(
            build(ids(&[1]), u64::MAX),
            Err(Rejection::VersionTooLarge { version: u64::MAX })
        );
        let too_many: Vec<u64> = (1..=101).collect();
        assert_eq!(
            build(ids(&too_many), 1),
            Err(Rejection::TooManyItems { count: 101 })
        );
    }
}
