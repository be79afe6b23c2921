//! [`RenderedQuotes`]: complete quotes kept as their JSON, so that a hot item is answered with one
//! lookup and a copy instead of four part lookups, an assembly and a serialisation.
//!
//! Only complete (non-degraded) quotes are kept, and each only for as long as every input it was
//! built from stays unchanged:
//! - until the earliest `fresh_until` of its four parts (an L1 part is replaced only once it is no
//!   longer fresh, or by an invalidation). That is the parts' stamp, so a rendering keeps it when
//!   the parts' lifetimes change at runtime, as the parts do; only its refresh ahead reads the
//!   engine's current lead;
//! - until the earliest coupon expiry still ahead (the estimate depends on which coupons are
//!   usable);
//! - until any of its parts is invalidated. An invalidation bumps an epoch *before* it removes
//!   the key; a rendering that began under an older epoch removes what it inserted, so a quote
//!   assembled from pre-change parts cannot outlive the change.
//!
//! Each rendering records the version of every part it was built from, set once when it is kept
//! ([`RenderedQuote::versions`]). A hit never reads them: they are for the consistency observer,
//! which looks at a rendering with [`RenderedQuotes::peek`] (no hit counted, nothing removed) and
//! compares those versions with the store.
//!
//! Lookups go to a `quick_cache` map (read-locked shards, no per-read bookkeeping queue) rather
//! than moka: this is the one lookup every hot request pays, and it must cost tens of
//! nanoseconds. The map is bounded by the bytes it holds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use quick_cache::Weighter;
use quick_cache::sync::Cache;
use rebate_domain::{ItemKey, PerPart, Timestamp};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::quote::Quote;

/// A complete quote as JSON, and until when it may be served as is.
#[derive(Debug)]
pub struct RenderedQuote {
    json: Box<RawValue>,
    /// [`entity_tag`] of the JSON, computed once.
    etag: http::HeaderValue,
    valid_until: Timestamp,
    /// The version of each part the quote was built from: what the consistency observer
    /// compares with the store. Four plain integers, written once when the rendering is kept.
    versions: PerPart<u64>,
    /// Set by the first read that starts the refresh of the parts this rendering ends with:
    /// one refresh per rendering, however many reads come near its end.
    refresh_claimed: AtomicBool,
}

impl RenderedQuote {
    /// Until when the rendering may be served: the earliest end of its parts' freshness, or its
    /// next coupon expiry.
    pub fn valid_until(&self) -> Timestamp {
        self.valid_until
    }

    /// The version of each part this rendering was built from.
    pub fn versions(&self) -> PerPart<u64> {
        self.versions
    }

    /// The strong entity tag of every body made from this rendering by
    /// [`RenderedQuote::with_members`] with only the trace id added: equal to [`entity_tag`] of
    /// such a body.
    pub fn etag(&self) -> &http::HeaderValue {
        &self.etag
    }

    /// True for the one caller that may start this rendering's refresh.
    pub fn claim_refresh(&self) -> bool {
        !self.refresh_claimed.swap(true, Ordering::Relaxed)
    }

    /// The quote's JSON object, exactly as [`Quote`] serialises.
    pub fn json(&self) -> &RawValue {
        &self.json
    }

    /// The quote's JSON object with more members appended: `extra` is inserted before the
    /// closing brace, after a comma (e.g. `"trace_id":"…"`). One allocation, one copy.
    pub fn with_members(&self, extra: &[u8]) -> Vec<u8> {
        let object = self.json.get().as_bytes();
        // A quote always has members, so the object ends in `}` after at least one of them.
        let open = &object[..object.len() - 1];
        let mut body = Vec::with_capacity(object.len() + extra.len() + 1);
        body.extend_from_slice(open);
        body.push(b',');
        body.extend_from_slice(extra);
        body.push(b'}');
        body
    }
}

/// A strong entity tag (`"` + 32 hex digits + `"`) for a JSON body whose last member is a
/// trace id, computed over `members`: the body's bytes before that member's comma (for a body
/// without one, the whole body but its closing brace). Two bodies that differ only in their
/// trace ids have the same tag; the hash (XXH3-128) is a fixed, published algorithm, so every
/// instance of the fleet tags the same answer alike, whatever its build.
pub fn entity_tag(members: &[u8]) -> http::HeaderValue {
    let hash = xxhash_rust::xxh3::xxh3_128(members).to_be_bytes();
    let mut tag = [b'"'; 34];
    tag[1..33].copy_from_slice(&rebate_telemetry::hex_128(hash));
    http::HeaderValue::from_bytes(&tag).expect("quotes and hex digits are a valid header value")
}

/// A quote as the engine answers it: just assembled, or served from its rendering.
#[derive(Debug, Clone)]
pub enum QuoteAnswer {
    /// The same quote as one assembled now, already rendered: never degraded.
    Rendered(Arc<RenderedQuote>),
    Assembled(Box<Quote>),
}

impl QuoteAnswer {
    pub fn degraded(&self) -> bool {
        match self {
            QuoteAnswer::Rendered(_) => false,
            QuoteAnswer::Assembled(quote) => quote.degraded,
        }
    }
}

/// Serialises as the quote's JSON object either way.
impl Serialize for QuoteAnswer {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            QuoteAnswer::Rendered(rendered) => rendered.json.serialize(serializer),
            QuoteAnswer::Assembled(quote) => quote.serialize(serializer),
        }
    }
}

#[derive(Debug, Clone)]
struct ByteWeighter;

impl Weighter<ItemKey, Arc<RenderedQuote>> for ByteWeighter {
    fn weight(&self, _key: &ItemKey, value: &Arc<RenderedQuote>) -> u64 {
        // The JSON plus the entry's own bookkeeping, roughly.
        value.json.get().len() as u64 + 64
    }
}

/// Counters of the rendered-quote map, for status pages and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RenderedStats {
    /// Requests answered from a rendering.
    pub hits: u64,
    /// Renderings stored.
    pub inserts: u64,
    /// Renderings dropped because an invalidation raced them.
    pub fenced: u64,
    pub entries: u64,
    pub bytes: u64,
    pub capacity_bytes: u64,
}

/// The map of rendered quotes. See the module documentation.
#[derive(Debug)]
pub struct RenderedQuotes {
    cache: Cache<ItemKey, Arc<RenderedQuote>, ByteWeighter>,
    capacity_bytes: u64,
    /// Bumped by every invalidation, before the key is removed.
    epoch: AtomicU64,
    /// Keys whose parts are being fenced right now ([`RenderedQuotes::invalidating`]), with how
    /// many invalidations of each are under way: no rendering of them is kept meanwhile.
    invalidating: Mutex<HashMap<ItemKey, u32>>,
    hits: AtomicU64,
    inserts: AtomicU64,
    fenced: AtomicU64,
}

/// An invalidation of one key under way ([`RenderedQuotes::invalidating`]).
#[must_use = "renderings of the key are refused only while this guard lives"]
#[derive(Debug)]
pub struct Invalidating<'a> {
    rendered: &'a RenderedQuotes,
    key: ItemKey,
}

impl Drop for Invalidating<'_> {
    fn drop(&mut self) {
        {
            let mut invalidating = self
                .rendered
                .invalidating
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(count) = invalidating.get_mut(&self.key) {
                *count -= 1;
                if *count == 0 {
                    invalidating.remove(&self.key);
                }
            }
        }
        self.rendered.invalidate(&self.key);
    }
}

/// What a rendering must carry from before its parts were read: see [`RenderedQuotes::begin`].
#[derive(Debug, Clone, Copy)]
pub struct RenderTicket {
    epoch: u64,
}

impl RenderedQuotes {
    /// A map holding at most about `capacity_bytes` of JSON. Typical quotes are 0.5–1 KiB.
    pub fn new(capacity_bytes: u64) -> Self {
        // quick_cache sizes its shards from an item estimate; 700 bytes is a typical quote.
        let estimated_items = usize::try_from(capacity_bytes / 700).unwrap_or(usize::MAX);
        Self {
            cache: Cache::with_weighter(estimated_items.max(16), capacity_bytes, ByteWeighter),
            capacity_bytes,
            epoch: AtomicU64::new(0),
            invalidating: Mutex::new(HashMap::new()),
            hits: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
            fenced: AtomicU64::new(0),
        }
    }

    /// The rendering of `key`'s quote if it is still valid at `now`.
    pub fn get(&self, key: &ItemKey, now: Timestamp) -> Option<Arc<RenderedQuote>> {
        let rendered = self.cache.get(key)?;
        if rendered.valid_until <= now {
            self.cache.remove(key);
            return None;
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(rendered)
    }

    /// The rendering of `key` if it is still valid at `now`, for inspection: unlike
    /// [`RenderedQuotes::get`] it counts no hit, leaves the entry's standing in the map as it
    /// is, and removes nothing (an expired rendering is simply not returned).
    pub fn peek(&self, key: &ItemKey, now: Timestamp) -> Option<Arc<RenderedQuote>> {
        self.cache
            .peek(key)
            .filter(|rendered| rendered.valid_until > now)
    }

    /// The keys that have a rendering now, in the map's own order, valid or not. Each step
    /// read-locks one shard briefly; a caller that wants a bounded cost stops early.
    pub fn keys(&self) -> impl Iterator<Item = ItemKey> + '_ {
        self.cache.iter().map(|(key, _)| key)
    }

    /// Call before reading the parts a rendering will be built from.
    pub fn begin(&self) -> RenderTicket {
        RenderTicket {
            epoch: self.epoch.load(Ordering::Acquire),
        }
    }

    /// Stores the rendering of a complete quote valid until `valid_until`, built from parts at
    /// `versions`; does nothing for a degraded quote, one already expired at `now`, or one whose
    /// parts an invalidation may have changed since `ticket` was taken.
    pub fn insert(
        &self,
        key: ItemKey,
        quote: &Quote,
        ticket: RenderTicket,
        valid_until: Timestamp,
        versions: PerPart<u64>,
        now: Timestamp,
    ) -> Option<Arc<RenderedQuote>> {
        if quote.degraded || valid_until <= now {
            return None;
        }
        let json = match serde_json::value::to_raw_value(quote) {
            Ok(json) => json,
            Err(error) => {
                tracing::error!(%error, %key, "cannot render a quote");
                return None;
            }
        };
        let object = json.get().as_bytes();
        let etag = entity_tag(&object[..object.len() - 1]);
        let rendered = Arc::new(RenderedQuote {
            json,
            etag,
            valid_until,
            versions,
            refresh_claimed: AtomicBool::new(false),
        });
        if self.epoch.load(Ordering::Acquire) != ticket.epoch {
            self.fenced.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if self.is_invalidating(&key) {
            self.fenced.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        self.cache.insert(key, Arc::clone(&rendered));
        // An invalidation may have bumped the epoch and removed the key between the check above
        // and the insert: then this rendering may hold pre-change data and must go.
        if self.epoch.load(Ordering::Acquire) != ticket.epoch {
            self.cache.remove(&key);
            self.fenced.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        self.inserts.fetch_add(1, Ordering::Relaxed);
        Some(rendered)
    }

    /// Drops `key`'s rendering after one of its parts changed, and fences renderings in flight.
    pub fn invalidate(&self, key: &ItemKey) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.cache.remove(key);
    }

    /// Brackets the fencing of `key`'s parts: drops its rendering *before* the parts change and
    /// keeps none until the returned guard drops (which drops any rendering once more). A reader
    /// that sees a part's fence can therefore never be answered from a rendering older than it:
    /// dropping the rendering only after the fence left a window (an L2 round trip on the
    /// shared path, or a preempted thread) in which the old quote was still served.
    pub fn invalidating(&self, key: ItemKey) -> Invalidating<'_> {
        *self
            .invalidating
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key)
            .or_default() += 1;
        self.invalidate(&key);
        Invalidating {
            rendered: self,
            key,
        }
    }

    fn is_invalidating(&self, key: &ItemKey) -> bool {
        self.invalidating
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(key)
    }

    /// Drops every rendering; renderings in progress are refused like after [`Self::invalidate`].
    pub fn invalidate_all(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.cache.clear();
    }

    pub fn stats(&self) -> RenderedStats {
        RenderedStats {
            hits: self.hits.load(Ordering::Relaxed),
            inserts: self.inserts.load(Ordering::Relaxed),
            fenced: self.fenced.load(Ordering::Relaxed),
            entries: self.cache.len() as u64,
            bytes: self.cache.weight(),
            capacity_bytes: self.capacity_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quote::{ItemView, RebateView, Served};
    use rebate_domain::{Cents, ItemId, Platform};

    fn key() -> ItemKey {
        ItemKey::new(Platform::Taobao, ItemId::from_u64(100_001))
    }

    fn quote(degraded: bool) -> Quote {
        Quote {
            item: ItemView {
                platform: Platform::Taobao,
                item_id: ItemId::from_u64(100_001),
                title: "耳机 \"Pro\"".to_owned(),
                price_cents: Cents::new(12_900),
                image_url: String::new(),
                shop_name: String::new(),
            },
            rebate: RebateView {
                rate_bps: None,
                estimated_cents: None,
                source: Served::Template,
                as_of: None,
            },
            coupons: Vec::new(),
            extras: None,
            degraded,
            degraded_parts: Vec::new(),
            notices: Vec::new(),
        }
    }

    const NOW: Timestamp = Timestamp::from_millis(1_000_000);
    const LATER: Timestamp = Timestamp::from_millis(2_000_000);
    const VERSIONS: PerPart<u64> = PerPart {
        product: 3,
        rate: 5,
        coupons: 7,
        extras: 11,
    };

    #[test]
    fn members_are_appended_inside_the_object() {
        let map = RenderedQuotes::new(1 << 20);
        let rendered = map
            .insert(key(), &quote(false), map.begin(), LATER, VERSIONS, NOW)
            .unwrap();
        let body = rendered.with_members(br#""trace_id":"4bf92f3577b34da6a3ce929d0e0e4736""#);
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let mut expected = serde_json::to_value(quote(false)).unwrap();
        expected["trace_id"] = "4bf92f3577b34da6a3ce929d0e0e4736".into();
        assert_eq!(value, expected);
    }

    #[test]
    fn nothing_is_kept_for_a_key_while_its_parts_are_being_fenced() {
        let map = RenderedQuotes::new(1 << 20);
        assert!(
            map.insert(key(), &quote(false), map.begin(), LATER, VERSIONS, NOW)
                .is_some()
        );
        let fencing = map.invalidating(key());
        assert!(
            map.get(&key(), NOW).is_none(),
            "gone before the parts change"
        );
        // A rendering begun while the parts are being fenced may have read them before.
        assert!(
            map.insert(key(), &quote(false), map.begin(), LATER, VERSIONS, NOW)
                .is_none()
        );
        let nested = map.invalidating(key());
        drop(fencing);
        assert!(
            map.insert(key(), &quote(false), map.begin(), LATER, VERSIONS, NOW)
                .is_none(),
            "another invalidation of the key is still under way"
        );
        drop(nested);
        assert!(
            map.insert(key(), &quote(false), map.begin(), LATER, VERSIONS, NOW)
                .is_some()
        );
        assert!(map.get(&key(), NOW).is_some());
    }

    #[test]
    fn an_invalidation_during_a_rendering_refuses_it() {
        let map = RenderedQuotes::new(1 << 20);
        let ticket = map.begin();
        map.invalidate(&key());
        assert!(
            map.insert(key(), &quote(false), ticket, LATER, VERSIONS, NOW)
                .is_none()
        );
        assert!(map.get(&key(), NOW).is_none());
        assert_eq!(map.stats().fenced, 1);
        // A rendering begun after the invalidation is kept.
        assert!(
            map.insert(key(), &quote(false), map.begin(), LATER, VERSIONS, NOW)
                .is_some()
        );
        assert!(map.get(&key(), NOW).is_some());
    }

    #[test]
    fn degraded_or_expired_quotes_are_not_kept_and_validity_ends_exactly() {
        let map = RenderedQuotes::new(1 << 20);
        assert!(
            map.insert(key(), &quote(true), map.begin(), LATER, VERSIONS, NOW)
                .is_none()
        );
        assert!(
            map.insert(key(), &quote(false), map.begin(), NOW, VERSIONS, NOW)
                .is_none()
        );
        map.insert(key(), &quote(false), map.begin(), LATER, VERSIONS, NOW)
            .unwrap();
        let just_before = Timestamp::from_millis(LATER.as_millis() - 1);
        assert!(map.get(&key(), just_before).is_some());
        assert!(map.get(&key(), LATER).is_none());
        assert_eq!(
            map.stats().entries,
            0,
            "an expired rendering is removed when found"
        );
    }

    #[test]
    fn a_peek_counts_no_hit_removes_nothing_and_shows_the_parts_versions() {
        let map = RenderedQuotes::new(1 << 20);
        map.insert(key(), &quote(false), map.begin(), LATER, VERSIONS, NOW)
            .unwrap();
        let peeked = map.peek(&key(), NOW).expect("valid at NOW");
        assert_eq!(peeked.versions(), VERSIONS);
        assert_eq!(map.stats().hits, 0, "a peek is not a hit");
        assert!(map.peek(&key(), LATER).is_none(), "expired at LATER");
        assert_eq!(map.stats().entries, 1, "a peek removes nothing");
        assert_eq!(map.keys().collect::<Vec<_>>(), [key()]);
        assert!(map.get(&key(), NOW).is_some());
        assert_eq!(map.stats().hits, 1);
    }

    #[test]
    fn the_map_is_bounded_by_bytes() {
        let map = RenderedQuotes::new(64 * 1024);
        for id in 0..1_000 {
            let key = ItemKey::new(Platform::Jd, ItemId::from_u64(100_000 + id));
            map.insert(key, &quote(false), map.begin(), LATER, VERSIONS, NOW);
        }
        let stats = map.stats();
        assert!(stats.bytes <= 64 * 1024, "{stats:?}");
        assert!(stats.entries > 10 && stats.entries < 1_000, "{stats:?}");
    }
}
