//! Which items the generator asks for: the demo catalogue, Zipf-distributed.
//!
//! Keys are ranked by a fixed-seed shuffle of the catalogue; rank *r* (1-based) is drawn with
//! probability ∝ 1/rᵉ, the exponent *e* calibrated so that the top `top_fraction` of keys get
//! `top_share` of the draws (10 % → 90 % by default). The shuffle spreads the hot keys over
//! platforms and id ranges, as real popularity would.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rand::Rng;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand_distr::{Distribution, Zipf};

/// The platforms of the demo catalogue.
pub const PLATFORMS: [&str; 3] = ["taobao", "jd", "pdd"];
/// First and last id of the demo catalogue (README "Ids to try").
pub const FIRST_ID: u32 = 100_001;
pub const LAST_ID: u32 = 110_000;
/// The service's own warm-up list: ids 100001–100100 on every platform.
pub const SERVICE_HOT_LAST_ID: u32 = 100_100;

/// One item of the catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ItemKey {
    pub platform: &'static str,
    pub item_id: u32,
}

impl fmt::Display for ItemKey {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}:{}", self.platform, self.item_id)
    }
}

/// Delisted demo items answer 404; the generator never asks for them.
pub fn is_delisted(item_id: u32) -> bool {
    item_id >= 101_000 && item_id % 500 == 123
}

/// Every listed key with an id in `first..=last`, on every platform.
pub fn catalogue_keys(first: u32, last: u32) -> Vec<ItemKey> {
    (first..=last)
        .filter(|item_id| !is_delisted(*item_id))
        .flat_map(|item_id| {
            PLATFORMS
                .iter()
                .map(move |platform| ItemKey { platform, item_id })
        })
        .collect()
}

/// Share of the draws that go to the top `top_count` of `n` ranks at exponent `exponent`.
pub fn top_share(n: usize, top_count: usize, exponent: f64) -> f64 {
    let weight = |rank: usize| (rank as f64).powf(-exponent);
    let top: f64 = (1..=top_count).map(weight).sum();
    let rest: f64 = (top_count + 1..=n).map(weight).sum();
    top / (top + rest)
}

/// The Zipf exponent at which the top `top_fraction` of `n` ranks get `share` of the draws
/// (bisection; the share grows with the exponent).
pub fn calibrate_exponent(n: usize, top_fraction: f64, share: f64) -> f64 {
    debug_assert!(n >= 2 && (0.0..1.0).contains(&top_fraction) && (0.0..1.0).contains(&share));
    let top_count = ((n as f64 * top_fraction).round() as usize).clamp(1, n - 1);
    let (mut low, mut high) = (0.0_f64, 4.0_f64);
    for _ in 0..60 {
        let middle = (low + high) / 2.0;
        if top_share(n, top_count, middle) < share {
            low = middle;
        } else {
            high = middle;
        }
    }
    (low + high) / 2.0
}

/// Draws keys: Zipf over a fixed ranking, or (see [`KeyPicker::sweep`]) a walk through the keys
/// that asks for each one once, in order, with some draws revisiting a key already asked for.
#[derive(Debug, Clone)]
pub struct KeyPicker {
    /// Keys by rank, hottest first.
    ranked: Vec<ItemKey>,
    zipf: Zipf<f64>,
    exponent: f64,
    /// Ranks below this are "the top 10 %": the report counts how many draws land there.
    top_count: usize,
    /// Set for a sweep: every clone shares the cursor, so the keys never repeat across runs.
    sweep: Option<Arc<Sweep>>,
}

/// The state of a sweep: the next new key, and the share of draws that revisit an earlier one.
#[derive(Debug)]
struct Sweep {
    cursor: AtomicUsize,
    revisit_share: f64,
}

/// A key picker could not be built.
#[derive(Debug, thiserror::Error)]
pub enum KeyPickerError {
    #[error("need at least 2 keys, got {0}")]
    TooFewKeys(usize),
    #[error("Zipf distribution: {0}")]
    Zipf(String),
}

impl KeyPicker {
    /// `keys` shuffled with `seed`, Zipf calibrated so `top_fraction` of keys get `share`.
    pub fn new(
        mut keys: Vec<ItemKey>,
        top_fraction: f64,
        share: f64,
        seed: u64,
    ) -> Result<Self, KeyPickerError> {
        if keys.len() < 2 {
            return Err(KeyPickerError::TooFewKeys(keys.len()));
        }
        keys.shuffle(&mut SmallRng::seed_from_u64(seed));
        let exponent = calibrate_exponent(keys.len(), top_fraction, share);
        let zipf = Zipf::new(keys.len() as f64, exponent)
            .map_err(|error| KeyPickerError::Zipf(error.to_string()))?;
        let top_count = ((keys.len() as f64 * top_fraction).round() as usize).max(1);
        Ok(Self {
            ranked: keys,
            zipf,
            exponent,
            top_count,
            sweep: None,
        })
    }

    /// A sweep over `keys` (shuffled with `seed`): a draw is, with probability
    /// `revisit_share`, a uniformly chosen key among those already asked for (likely cached),
    /// else the next key never asked for. So `n` draws touch about `n·(1 − revisit_share)`
    /// distinct keys, and keys that were never asked for are cold (chaos: loads that must hit
    /// the store; soak: a key space larger than every cache budget). After the last key it
    /// wraps around. "Hot" in [`KeyPicker::pick`] means a revisit.
    pub fn sweep(
        mut keys: Vec<ItemKey>,
        revisit_share: f64,
        seed: u64,
    ) -> Result<Self, KeyPickerError> {
        if keys.len() < 2 {
            return Err(KeyPickerError::TooFewKeys(keys.len()));
        }
        keys.shuffle(&mut SmallRng::seed_from_u64(seed));
        let zipf = Zipf::new(keys.len() as f64, 1.0)
            .map_err(|error| KeyPickerError::Zipf(error.to_string()))?;
        Ok(Self {
            top_count: keys.len(),
            ranked: keys,
            zipf,
            exponent: 0.0,
            sweep: Some(Arc::new(Sweep {
                cursor: AtomicUsize::new(0),
                revisit_share: revisit_share.clamp(0.0, 1.0),
            })),
        })
    }

    /// Distinct keys a sweep has handed out so far (0 for a Zipf picker).
    pub fn swept(&self) -> usize {
        self.sweep.as_ref().map_or(0, |sweep| {
            sweep.cursor.load(Ordering::Relaxed).min(self.ranked.len())
        })
    }

    /// The whole demo catalogue (100001–110000 on three platforms, delisted ids left out),
    /// top 10 % → 90 %.
    pub fn catalogue(seed: u64) -> Result<Self, KeyPickerError> {
        Self::new(catalogue_keys(FIRST_ID, LAST_ID), 0.1, 0.9, seed)
    }

    /// The service's hot list (100001–100100 on three platforms, what it warms at start),
    /// top 10 % → 90 %: the hot-path scenario asks only for keys it can warm completely.
    pub fn service_hot_list(seed: u64) -> Result<Self, KeyPickerError> {
        Self::new(
            catalogue_keys(FIRST_ID, SERVICE_HOT_LAST_ID),
            0.1,
            0.9,
            seed,
        )
    }

    /// One key and whether it is in the top 10 % of ranks.
    pub fn pick(&self, rng: &mut impl Rng) -> (ItemKey, bool) {
        if let Some(sweep) = &self.sweep {
            let swept = sweep.cursor.load(Ordering::Relaxed);
            if swept > 0 && rng.random::<f64>() < sweep.revisit_share {
                let index = rng.random_range(0..swept.min(self.ranked.len()));
                return (self.ranked[index], true);
            }
            let next = sweep.cursor.fetch_add(1, Ordering::Relaxed);
            return (self.ranked[next % self.ranked.len()], false);
        }
        let rank = self.zipf.sample(rng) as usize; // 1..=n
        let index = rank.clamp(1, self.ranked.len()) - 1;
        (self.ranked[index], index < self.top_count)
    }

    /// The hottest `count` keys, hottest first (for warm-up passes).
    pub fn hottest(&self, count: usize) -> &[ItemKey] {
        &self.ranked[..count.min(self.ranked.len())]
    }

    pub fn len(&self) -> usize {
        self.ranked.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranked.is_empty()
    }

    pub fn exponent(&self) -> f64 {
        self.exponent
    }

    pub fn top_count(&self) -> usize {
        self.top_count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_leaves_out_delisted_ids() {
        let keys = catalogue_keys(FIRST_ID, LAST_ID);
        // 10,000 ids, 18 delisted (101123, 101623, …, 109623), on 3 platforms.
        assert_eq!(keys.len(), (10_000 - 18) * 3);
        assert!(keys.iter().all(|key| !is_delisted(key.item_id)));
        assert!(is_delisted(101_123) && is_delisted(109_623));
        assert!(!is_delisted(100_123), "below 101000 nothing is delisted");
    }

    #[test]
    fn calibrated_exponent_gives_the_asked_share() {
        for n in [300, 29_946] {
            let exponent = calibrate_exponent(n, 0.1, 0.9);
            let share = top_share(n, (n as f64 * 0.1).round() as usize, exponent);
            assert!((share - 0.9).abs() < 1e-6, "n={n}: {share}");
        }
    }

    #[test]
    fn sampled_share_of_top_ten_percent_is_about_ninety_percent() {
        let picker = KeyPicker::catalogue(7).unwrap();
        let mut rng = SmallRng::seed_from_u64(11);
        let draws = 200_000;
        let in_top = (0..draws).filter(|_| picker.pick(&mut rng).1).count();
        let share = in_top as f64 / draws as f64;
        assert!((share - 0.9).abs() < 0.01, "share {share}");

        let hot = KeyPicker::service_hot_list(7).unwrap();
        assert_eq!(hot.len(), 300);
        let in_top = (0..draws).filter(|_| hot.pick(&mut rng).1).count();
        let share = in_top as f64 / draws as f64;
        assert!((share - 0.9).abs() < 0.01, "hot-list share {share}");
    }

    #[test]
    fn a_sweep_asks_for_each_key_once_before_revisiting_and_shares_its_cursor() {
        let keys = catalogue_keys(FIRST_ID, FIRST_ID + 99);
        let picker = KeyPicker::sweep(keys.clone(), 0.0, 5).unwrap();
        let clone = picker.clone();
        let mut rng = SmallRng::seed_from_u64(1);
        let mut seen = std::collections::HashSet::new();
        for index in 0..keys.len() {
            let source = if index % 2 == 0 { &picker } else { &clone };
            let (key, revisit) = source.pick(&mut rng);
            assert!(!revisit);
            assert!(seen.insert(key), "{key} asked for twice");
        }
        assert_eq!(picker.swept(), keys.len());
        // With revisits, new keys come at about (1 − share) of the draws, revisits only from
        // the keys already handed out.
        let picker = KeyPicker::sweep(keys, 0.5, 5).unwrap();
        let mut new = std::collections::HashSet::new();
        for _ in 0..200 {
            let (key, revisit) = picker.pick(&mut rng);
            if revisit {
                assert!(new.contains(&key));
            } else {
                assert!(new.insert(key));
            }
        }
        assert!((70..=130).contains(&new.len()), "{} new keys", new.len());
    }

    #[test]
    fn ranking_is_reproducible_and_spread() {
        let first = KeyPicker::catalogue(3).unwrap();
        let second = KeyPicker::catalogue(3).unwrap();
        assert_eq!(first.hottest(50), second.hottest(50));
        let platforms: std::collections::HashSet<_> =
            first.hottest(30).iter().map(|key| key.platform).collect();
        assert_eq!(platforms.len(), 3, "hot keys span every platform");
    }
}
