//! The data the simulated APIs serve: a pure function of the item key (and coupon version), so
//! every run, every instance and every test sees the same coupons and extras for an item.
//!
//! The hash is written here (FNV-1a, then splitmix64) rather than taken from `std`, whose
//! `DefaultHasher` may change between Rust releases and would silently change the data.

use rebate_domain::{Cents, Coupon, Extras, ItemId, ItemKey, Platform, Timestamp};
use serde::{Deserialize, Serialize};

/// The coupon data version every item starts at.
pub const INITIAL_COUPON_VERSION: u64 = 1;

/// Words popular searches are drawn from.
pub const SEARCH_WORDS: [&str; 16] = [
    "手机壳",
    "蓝牙耳机",
    "连衣裙",
    "运动鞋",
    "零食大礼包",
    "保温杯",
    "充电宝",
    "洗面奶",
    "抽纸",
    "猫粮",
    "机械键盘",
    "防晒霜",
    "纯棉T恤",
    "双肩包",
    "电动牙刷",
    "咖啡豆",
];

/// Body of `GET /v1/coupons/{platform}/{item_id}`, and each element of a `POST /v1/coupons:batch`
/// answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CouponsResponse {
    pub platform: Platform,
    pub item_id: ItemId,
    /// Version of this item's coupon data; a client must never let a lower version overwrite a
    /// higher one.
    pub version: u64,
    pub coupons: Vec<Coupon>,
}

/// Body of `GET /v1/extras/{platform}/{item_id}`, and each element of a `POST /v1/extras:batch`
/// answer: the key, then the [`Extras`] fields inline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtrasResponse {
    pub platform: Platform,
    pub item_id: ItemId,
    #[serde(flatten)]
    pub extras: Extras,
}

const MILLIS_PER_DAY: i64 = 86_400_000;
/// Keeps the extras stream independent of the coupon stream of the same item.
const EXTRAS_SALT: u64 = 0x6578_7472_6173_0001;

/// A stable 64-bit hash of an item key (FNV-1a over `platform:item_id`, then mixed).
pub fn item_hash(key: ItemKey) -> u64 {
    let bytes = key
        .platform
        .as_str()
        .bytes()
        .chain([b':'])
        .chain(key.item_id.as_str().bytes());
    mix(fnv1a(bytes))
}

/// 64-bit FNV-1a: tiny, and fixed by its specification.
fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.into_iter().fold(FNV_OFFSET, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME)
    })
}

/// The coupons of `key` at coupon data `version`, as seen at `now`.
///
/// 0 to 3 coupons; discounts 3 to 50 yuan in whole yuan; thresholds either 0 or whole yuan above
/// the discount; each expires at a UTC midnight 1 to 7 days ahead, so it is always in the future
/// and stable within a UTC day. A new version gives different coupons, as an operator's edit would.
pub fn coupons(key: ItemKey, version: u64, now: Timestamp) -> Vec<Coupon> {
    let mut stream = SplitMix64::new(mix(item_hash(key) ^ mix(version)));
    let count = stream.below(4);
    let next_midnight = (now.as_millis().div_euclid(MILLIS_PER_DAY) + 1) * MILLIS_PER_DAY;
    (1..=count)
        .map(|index| {
            let discount_yuan = 3 + stream.below(48);
            let threshold_yuan = if stream.below(4) == 0 {
                0
            } else {
                discount_yuan + 1 + stream.below(300)
            };
            let extra_days = stream.below(7) as i64;
            Coupon {
                coupon_id: coupon_id(key, version, index),
                discount_cents: Cents::new(discount_yuan * 100),
                threshold_cents: Cents::new(threshold_yuan * 100),
                expires_at: Timestamp::from_millis(next_midnight + extra_days * MILLIS_PER_DAY),
            }
        })
        .collect()
}

/// The extras of `key`: 30-day sales 0 to 100 000 and 2 to 4 distinct popular searches.
pub fn extras(key: ItemKey) -> Extras {
    let mut stream = SplitMix64::new(mix(item_hash(key) ^ EXTRAS_SALT));
    let sales_30d = stream.below(100_001);
    let count = 2 + stream.below(3) as usize;
    let mut words = SEARCH_WORDS;
    // Partial Fisher–Yates: the first `count` words end up a uniform distinct sample.
    for position in 0..count {
        let remaining = (words.len() - position) as u64;
        let pick = position + stream.below(remaining) as usize;
        words.swap(position, pick);
    }
    Extras {
        sales_30d,
        popular_searches: words[..count]
            .iter()
            .map(|word| (*word).to_owned())
            .collect(),
    }
}

/// `tb-100001-1` for the first version, `tb-100001-v2-1` after a bump, so ids change with data.
fn coupon_id(key: ItemKey, version: u64, index: u64) -> String {
    let prefix = match key.platform {
        Platform::Taobao => "tb",
        Platform::Jd => "jd",
        Platform::Pdd => "pdd",
    };
    if version == INITIAL_COUPON_VERSION {
        format!("{prefix}-{}-{index}", key.item_id)
    } else {
        format!("{prefix}-{}-v{version}-{index}", key.item_id)
    }
}

/// The splitmix64 finaliser: spreads every input bit over the whole output.
const fn mix(value: u64) -> u64 {
    let mut z = value;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A tiny deterministic generator, so one item hash yields as many values as needed.
struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    const fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.state)
    }

    /// A value in `0..bound`; the modulo bias is far below anything a test could notice.
    fn below(&mut self, bound: u64) -> u64 {
        debug_assert!(bound > 0);
        self.next_u64() % bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(platform: Platform, number: u64) -> ItemKey {
        ItemKey::new(platform, ItemId::from_u64(number))
    }

    fn all_keys() -> impl Iterator<Item = ItemKey> {
        Platform::ALL
            .into_iter()
            .flat_map(|platform| (100_000..102_000).map(move |number| key(platform, number)))
    }

    #[test]
    fn hash_is_pinned() {
        // Published FNV-1a test vectors.
        assert_eq!(fnv1a(*b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(*b"a"), 0xaf63_dc4c_8601_ec8c);
        // Pinned so that a change to the hash, which changes every item's data, is deliberate.
        let item = ItemKey::parse("taobao", "100001").unwrap();
        assert_eq!(item_hash(item), 14_343_653_713_625_095_560);
        assert_ne!(
            item_hash(item),
            item_hash(ItemKey::parse("jd", "100001").unwrap())
        );
        // Leading zeros are part of the id.
        assert_ne!(
            item_hash(ItemKey::parse("jd", "7").unwrap()),
            item_hash(ItemKey::parse("jd", "007").unwrap())
        );
    }

    #[test]
    fn coupon_rules_hold_for_many_items() {
        let now = Timestamp::parse_rfc3339("2026-11-30T12:34:56Z").unwrap();
        let next_midnight = Timestamp::parse_rfc3339("2026-12-01T00:00:00Z").unwrap();
        let mut counts = [0usize; 4];
        for item in all_keys() {
            let coupons = coupons(item, INITIAL_COUPON_VERSION, now);
            counts[coupons.len()] += 1;
            for (index, coupon) in coupons.iter().enumerate() {
                let discount = coupon.discount_cents.get();
                let threshold = coupon.threshold_cents.get();
                assert!((300..=5_000).contains(&discount), "{item}: {coupon:?}");
                assert_eq!(discount % 100, 0, "{item}: {coupon:?}");
                assert_eq!(threshold % 100, 0, "{item}: {coupon:?}");
                assert!(threshold == 0 || threshold > discount, "{item}: {coupon:?}");
                assert!(coupon.expires_at > now, "{item}: {coupon:?}");
                let days_ahead = coupon.expires_at.millis_since(next_midnight) / 86_400_000;
                assert!(coupon.expires_at >= next_midnight && days_ahead < 7);
                assert_eq!(coupon.expires_at.as_millis() % MILLIS_PER_DAY, 0);
                assert!(
                    coupon
                        .coupon_id
                        .ends_with(&format!("-{}-{}", item.item_id, index + 1))
                );
            }
        }
        // Every count from 0 to 3 occurs, roughly evenly.
        for count in counts {
            assert!(count > 1_000, "{counts:?}");
        }
    }

    #[test]
    fn coupons_are_stable_within_a_day_and_move_with_it() {
        let morning = Timestamp::parse_rfc3339("2026-11-30T00:00:01Z").unwrap();
        let evening = Timestamp::parse_rfc3339("2026-11-30T23:59:59Z").unwrap();
        let tomorrow = Timestamp::parse_rfc3339("2026-12-01T00:00:01Z").unwrap();
        let item_with_coupons = (100_000..)
            .map(|number| key(Platform::Jd, number))
            .find(|candidate| !coupons(*candidate, 1, morning).is_empty())
            .unwrap();
        let today = coupons(item_with_coupons, 1, morning);
        assert_eq!(today, coupons(item_with_coupons, 1, evening));
        let next_day = coupons(item_with_coupons, 1, tomorrow);
        assert_eq!(today.len(), next_day.len());
        for (first, second) in today.iter().zip(&next_day) {
            assert_eq!(second.expires_at.millis_since(first.expires_at), 86_400_000);
            assert_eq!(first.discount_cents, second.discount_cents);
        }
    }

    #[test]
    fn a_new_version_changes_the_coupons() {
        let now = Timestamp::now();
        let changed = all_keys()
            .filter(|item| coupons(*item, 1, now) != coupons(*item, 2, now))
            .count();
        // Items without coupons in both versions are the only ones that stay equal.
        assert!(changed > 5_000, "{changed}");
        let item = key(Platform::Pdd, 42);
        assert!(
            coupons(item, 2, now)
                .iter()
                .all(|coupon| coupon.coupon_id.contains("-v2-"))
        );
    }

    #[test]
    fn extras_rules_hold_for_many_items() {
        let mut distinct_sales = std::collections::HashSet::new();
        for item in all_keys() {
            let extras = extras(item);
            assert!(extras.sales_30d <= 100_000);
            distinct_sales.insert(extras.sales_30d);
            let searches = &extras.popular_searches;
            assert!((2..=4).contains(&searches.len()), "{item}: {searches:?}");
            for (position, word) in searches.iter().enumerate() {
                assert!(SEARCH_WORDS.contains(&word.as_str()));
                assert!(!searches[..position].contains(word), "{item}: {searches:?}");
            }
            assert_eq!(extras, super::extras(item));
        }
        assert!(distinct_sales.len() > 5_000);
    }

    #[test]
    fn wire_format_matches_the_contract() {
        let item = ItemKey::parse("taobao", "100001").unwrap();
        let body = CouponsResponse {
            platform: item.platform,
            item_id: item.item_id,
            version: 1,
            coupons: vec![Coupon {
                coupon_id: "tb-100001-1".into(),
                discount_cents: Cents::new(1000),
                threshold_cents: Cents::new(9900),
                expires_at: Timestamp::parse_rfc3339("2026-12-05T00:00:00Z").unwrap(),
            }],
        };
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"platform":"taobao","item_id":"100001","version":1,"coupons":[{"coupon_id":"tb-100001-1","discount_cents":1000,"threshold_cents":9900,"expires_at":"2026-12-05T00:00:00Z"}]}"#
        );
        let extras = ExtrasResponse {
            platform: Platform::Jd,
            item_id: item.item_id,
            extras: Extras {
                sales_30d: 1234,
                popular_searches: vec!["猫粮".into(), "抽纸".into()],
            },
        };
        let json = serde_json::to_string(&extras).unwrap();
        assert_eq!(
            json,
            r#"{"platform":"jd","item_id":"100001","sales_30d":1234,"popular_searches":["猫粮","抽纸"]}"#
        );
        assert_eq!(
            serde_json::from_str::<ExtrasResponse>(&json).unwrap(),
            extras
        );
    }
}
