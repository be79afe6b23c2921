//! The deterministic demo catalogue: 10,000 items on each platform, the same on every machine.
//!
//! Everything here is a pure function of `(platform, item id)` through a small, stable hash
//! (FNV-1a folded through a splitmix64 finaliser), never `std`'s `DefaultHasher`, whose output may
//! change between Rust releases. Tests, benchmarks and the demo can therefore name an item and
//! know what the store returns for it. Nothing here touches a database, so every store (SQLite
//! now, MySQL later) seeds from the same [`demo_items`].

use std::time::Duration;

use rebate_domain::{
    Cents, ItemId, ItemKey, Platform, Product, ProductStatus, RateBps, RebateRate, Timestamp,
};

use crate::Versioned;

/// The first demo item id on every platform.
pub const DEMO_FIRST_ID: u64 = 100_001;
/// The last demo item id on every platform (inclusive).
pub const DEMO_LAST_ID: u64 = 110_000;
/// How many items the demo catalogue holds on each platform.
pub const DEMO_ITEMS_PER_PLATFORM: u64 = DEMO_LAST_ID - DEMO_FIRST_ID + 1;
/// How many items per platform go into `hot_items`: ids `DEMO_FIRST_ID ..` in rank order.
pub const DEMO_HOT_ITEMS_PER_PLATFORM: u64 = 100;
/// When every demo row was last "changed": 2026-11-01T00:00:00Z. Fixed so that reseeding writes
/// identical rows.
pub const DEMO_UPDATED_AT: Timestamp = Timestamp::from_millis(1_793_491_200_000);

/// Ids below this are never delisted, so tests and demos can rely on `100001..=100999` answering.
const DELISTED_FROM_ID: u64 = 101_000;
const DELISTED_EVERY: u64 = 500;
const DELISTED_REMAINDER: u64 = 123;

const TITLE_PREFIXES: [&str; 12] = [
    "2026新款",
    "官方正品",
    "爆款",
    "限时特惠",
    "加厚",
    "便携",
    "大容量",
    "轻薄",
    "家用",
    "升级版",
    "北欧风",
    "国潮",
];

const TITLE_GOODS: [&str; 24] = [
    "无线蓝牙耳机",
    "保温杯",
    "电动牙刷",
    "双肩包",
    "运动鞋",
    "机械键盘",
    "空气炸锅",
    "羽绒服",
    "护手霜",
    "数据线",
    "充电宝",
    "收纳盒",
    "四件套",
    "洗面奶",
    "咖啡豆",
    "猫粮",
    "抽纸",
    "登山杖",
    "台灯",
    "保鲜盒",
    "瑜伽垫",
    "电热水壶",
    "儿童绘本",
    "防晒霜",
];

const TITLE_SUFFIXES: [&str; 10] = [
    "男女通用",
    "学生款",
    "送礼佳品",
    "黑色",
    "白色",
    "套装",
    "旗舰版",
    "大号",
    "家庭装",
    "包邮",
];

const SHOP_NAMES: [&str; 12] = [
    "星河数码专营店",
    "暖居家居旗舰店",
    "悦享生活馆",
    "青木服饰",
    "鲜果时光",
    "极客装备站",
    "萌宠之家",
    "好物优选",
    "云端美妆",
    "山野户外",
    "书香童年",
    "厨房小当家",
];

/// One demo item: its product row and its rate row, with independent versions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoItem {
    pub product: Versioned<Product>,
    pub rate: Versioned<RebateRate>,
}

impl DemoItem {
    pub fn key(&self) -> ItemKey {
        ItemKey::new(self.product.value.platform, self.product.value.item_id)
    }
}

/// What one seeding run did. Counts are rows this run inserted: rows already present (from an
/// earlier seed or changed by an operator since) are left alone, so a second run reports zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeedReport {
    pub products: u64,
    pub rates: u64,
    pub hot_items: u64,
    pub elapsed: Duration,
}

/// Every demo item: each platform in [`Platform::ALL`] order, ids ascending.
pub fn demo_items() -> impl Iterator<Item = DemoItem> {
    Platform::ALL
        .into_iter()
        .flat_map(|platform| (DEMO_FIRST_ID..=DEMO_LAST_ID).map(move |id| generate(platform, id)))
}

/// The demo item `id` on `platform`, or `None` outside `DEMO_FIRST_ID..=DEMO_LAST_ID`.
pub fn demo_item(platform: Platform, id: u64) -> Option<DemoItem> {
    (DEMO_FIRST_ID..=DEMO_LAST_ID)
        .contains(&id)
        .then(|| generate(platform, id))
}

/// Whether demo item `id` is delisted (on every platform): ids from 101000 on whose remainder
/// mod 500 is 123, i.e. 101123, 101623, … 109623: 18 per platform, 54 in all.
pub fn is_demo_delisted(id: u64) -> bool {
    (DELISTED_FROM_ID..=DEMO_LAST_ID).contains(&id) && id % DELISTED_EVERY == DELISTED_REMAINDER
}

/// The warm-up list: the first [`DEMO_HOT_ITEMS_PER_PLATFORM`] ids of every platform with their
/// rank (1 = hottest), matching traffic generators that favour low ids. All of them are on sale.
pub fn demo_hot_items() -> impl Iterator<Item = (ItemKey, u32)> {
    Platform::ALL.into_iter().flat_map(|platform| {
        (1..=DEMO_HOT_ITEMS_PER_PLATFORM).map(move |rank| {
            let key = ItemKey::new(platform, ItemId::from_u64(DEMO_FIRST_ID + rank - 1));
            // At most `DEMO_HOT_ITEMS_PER_PLATFORM`, far below `u32::MAX`.
            (key, rank as u32)
        })
    })
}

fn generate(platform: Platform, id: u64) -> DemoItem {
    let mut draws = Draws::new(platform, id);
    let title = format!(
        "{}{} {}",
        draws.pick(&TITLE_PREFIXES),
        draws.pick(&TITLE_GOODS),
        draws.pick(&TITLE_SUFFIXES)
    );
    let shop_name = draws.pick(&SHOP_NAMES).to_owned();
    // Whole yuan 10..=1999, then a shop-like ending: ¥y.00, ¥(y−1).90 or ¥(y−1).99. The range is
    // therefore 9.90 (990 cents) to 1999.00 (199_900 cents).
    let yuan = 10 + draws.below(1_990);
    let discount_cents = [0, 10, 1][draws.below(3) as usize];
    let price_cents = yuan * 100 - discount_cents;
    // 50..=2500 bps in steps of 10 (0.5 % to 25 %).
    let rate_bps = 50 + draws.below(246) * 10;
    let product_version = 1 + draws.below(3);
    let rate_version = 1 + draws.below(3);

    let status = if is_demo_delisted(id) {
        ProductStatus::Delisted
    } else {
        ProductStatus::OnSale
    };
    let product = Product {
        platform,
        item_id: ItemId::from_u64(id),
        title,
        price_cents: Cents::new(price_cents),
        image_url: format!("https://img.example.com/{platform}/{id}.jpg"),
        shop_name,
        status,
    };
    let rate = RebateRate {
        rate_bps: RateBps::try_from(rate_bps).expect("50..=2500 bps is always a valid rate"),
    };
    DemoItem {
        product: Versioned {
            value: product,
            version: product_version,
            updated_at: DEMO_UPDATED_AT,
        },
        rate: Versioned {
            value: rate,
            version: rate_version,
            updated_at: DEMO_UPDATED_AT,
        },
    }
}

/// A splitmix64 stream seeded from FNV-1a of `"{platform}:{id}"`: each draw is independent of how
/// many draws came before in other items, and the sequence is fixed forever.
struct Draws {
    state: u64,
}

impl Draws {
    fn new(platform: Platform, id: u64) -> Self {
        let mut seed = fnv1a64(platform.as_str().as_bytes(), FNV_OFFSET_BASIS);
        seed = fnv1a64(b":", seed);
        seed = fnv1a64(id.to_string().as_bytes(), seed);
        Self { state: seed }
    }

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut mixed = self.state;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        mixed ^ (mixed >> 31)
    }

    /// A value in `0..bound`. The modulo bias is irrelevant for demo data.
    fn below(&mut self, bound: u64) -> u64 {
        debug_assert!(bound > 0);
        self.next() % bound
    }

    fn pick<'a>(&mut self, words: &[&'a str]) -> &'a str {
        words[self.below(words.len() as u64) as usize]
    }
}

const FNV_OFFSET_BASIS: u64 = 0xCBF2_9CE4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01B3;

fn fnv1a64(bytes: &[u8], mut hash: u64) -> u64 {
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        // From the FNV reference test suite; pins the hash so the demo data never drifts.
        assert_eq!(fnv1a64(b"", FNV_OFFSET_BASIS), 0xCBF2_9CE4_8422_2325);
        assert_eq!(fnv1a64(b"a", FNV_OFFSET_BASIS), 0xAF63_DC4C_8601_EC8C);
        assert_eq!(fnv1a64(b"foobar", FNV_OFFSET_BASIS), 0x8594_4171_F739_67E8);
    }

    #[test]
    fn demo_data_is_identical_across_calls() {
        let first: Vec<DemoItem> = demo_items().collect();
        let second: Vec<DemoItem> = demo_items().collect();
        assert_eq!(first.len(), 30_000);
        assert_eq!(first, second);
        let sample = demo_item(Platform::Jd, 104_321).unwrap();
        assert_eq!(sample, first[10_000 + (104_321 - 100_001)]);
    }

    #[test]
    fn platforms_differ_for_the_same_id() {
        // The platform is part of the hash, so the three catalogues are not copies of each other.
        let differing = (DEMO_FIRST_ID..DEMO_FIRST_ID + 100)
            .filter(|&id| {
                let taobao = demo_item(Platform::Taobao, id).unwrap().product.value;
                let jd = demo_item(Platform::Jd, id).unwrap().product.value;
                (taobao.title, taobao.price_cents) != (jd.title, jd.price_cents)
            })
            .count();
        assert!(differing > 90, "only {differing} of 100 differ");
    }

    #[test]
    fn every_item_is_within_the_documented_ranges() {
        let mut keys = std::collections::HashSet::new();
        let mut delisted = 0;
        for item in demo_items() {
            let product = &item.product.value;
            let id: u64 = product.item_id.as_str().parse().unwrap();
            assert!((DEMO_FIRST_ID..=DEMO_LAST_ID).contains(&id));
            assert!(keys.insert(item.key()), "duplicate {}", item.key());
            assert!(
                (990..=199_900).contains(&product.price_cents.get()),
                "{product:?}"
            );
            assert!((50..=2_500).contains(&item.rate.value.rate_bps.get()));
            assert!((1..=3).contains(&item.product.version));
            assert!((1..=3).contains(&item.rate.version));
            assert_eq!(item.product.updated_at, DEMO_UPDATED_AT);
            assert_eq!(
                product.image_url,
                format!("https://img.example.com/{}/{id}.jpg", product.platform)
            );
            assert!(product.title.chars().count() >= 4);
            assert!(!product.shop_name.is_empty());
            let expect_delisted = is_demo_delisted(id);
            assert_eq!(product.status == ProductStatus::Delisted, expect_delisted);
            if expect_delisted {
                delisted += 1;
                assert!(id >= 101_000 && id % 500 == 123);
            }
        }
        assert_eq!(keys.len(), 30_000);
        assert_eq!(delisted, 54);
    }

    #[test]
    fn the_first_999_ids_are_never_delisted() {
        assert!((100_001..=100_999).all(|id| !is_demo_delisted(id)));
        assert!(is_demo_delisted(101_123));
        assert!(is_demo_delisted(109_623));
        assert!(!is_demo_delisted(100_123));
        assert!(!is_demo_delisted(110_123), "outside the catalogue");
        assert_eq!(demo_item(Platform::Pdd, 100_000), None);
        assert_eq!(demo_item(Platform::Pdd, 110_001), None);
    }

    #[test]
    fn hot_items_are_the_first_hundred_on_sale_ids_ranked_per_platform() {
        let hot: Vec<(ItemKey, u32)> = demo_hot_items().collect();
        assert_eq!(hot.len(), 300);
        assert_eq!(hot[0], (ItemKey::parse("taobao", "100001").unwrap(), 1));
        assert_eq!(hot[299], (ItemKey::parse("pdd", "100100").unwrap(), 100));
        assert!(hot.iter().all(|(key, _)| {
            let id: u64 = key.item_id.as_str().parse().unwrap();
            !is_demo_delisted(id)
        }));
    }
}
