//! What a client asks about: a platform and an item id on it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a platform or item id was refused at the edge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("unknown platform {0:?}; expected one of taobao, jd, pdd")]
    UnknownPlatform(String),
    #[error("item id must not be empty")]
    EmptyItemId,
    /// Its length in bytes (the limit counts bytes; a digit is one byte).
    #[error("item id is {0} bytes long; at most {max} digits are allowed", max = ItemId::MAX_LEN)]
    ItemIdTooLong(usize),
    #[error("item id must contain only ASCII digits 0-9")]
    ItemIdNotDigits,
}

/// The shopping platforms the service knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Platform {
    Taobao,
    Jd,
    Pdd,
}

impl Platform {
    pub const ALL: [Platform; 3] = [Platform::Taobao, Platform::Jd, Platform::Pdd];

    pub const fn as_str(self) -> &'static str {
        match self {
            Platform::Taobao => "taobao",
            Platform::Jd => "jd",
            Platform::Pdd => "pdd",
        }
    }
}

impl FromStr for Platform {
    type Err = KeyError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "taobao" => Ok(Platform::Taobao),
            "jd" => Ok(Platform::Jd),
            "pdd" => Ok(Platform::Pdd),
            other => Err(KeyError::UnknownPlatform(crate::text::truncate_chars(
                other, 32,
            ))),
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

impl Serialize for Platform {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Platform {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// An item id: 1 to 20 ASCII digits, kept exactly as given (leading zeros included).
///
/// Stored inline so that it is `Copy` and hashing it on the cache hot path allocates nothing.
/// Twenty digits can exceed `u64`, which is why it is not stored as a number.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ItemId {
    len: u8,
    digits: [u8; ItemId::MAX_LEN],
}

impl ItemId {
    pub const MAX_LEN: usize = 20;

    pub fn parse(text: &str) -> Result<Self, KeyError> {
        let bytes = text.as_bytes();
        if bytes.is_empty() {
            return Err(KeyError::EmptyItemId);
        }
        if bytes.len() > Self::MAX_LEN {
            return Err(KeyError::ItemIdTooLong(bytes.len()));
        }
        if !bytes.iter().all(u8::is_ascii_digit) {
            return Err(KeyError::ItemIdNotDigits);
        }
        let mut digits = [0u8; Self::MAX_LEN];
        digits[..bytes.len()].copy_from_slice(bytes);
        Ok(Self {
            len: bytes.len() as u8,
            digits,
        })
    }

    /// An id from a number, for generated catalogues and tests.
    pub fn from_u64(number: u64) -> Self {
        Self::parse(&number.to_string()).expect("a u64 always prints as 1-20 digits")
    }

    pub fn as_str(&self) -> &str {
        let used = &self.digits[..usize::from(self.len)];
        debug_assert!(used.iter().all(u8::is_ascii_digit));
        // Only ASCII digits are ever stored, so this cannot fail.
        std::str::from_utf8(used).unwrap_or_default()
    }
}

impl FromStr for ItemId {
    type Err = KeyError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl fmt::Display for ItemId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

impl fmt::Debug for ItemId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "ItemId({})", self.as_str())
    }
}

impl Serialize for ItemId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ItemId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        ItemId::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// The identity of an item across the service: cache key, store key, upstream key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ItemKey {
    pub platform: Platform,
    pub item_id: ItemId,
}

impl ItemKey {
    pub fn new(platform: Platform, item_id: ItemId) -> Self {
        Self { platform, item_id }
    }

    /// Parses both halves, reporting the platform first when both are wrong.
    pub fn parse(platform: &str, item_id: &str) -> Result<Self, KeyError> {
        Ok(Self {
            platform: platform.parse()?,
            item_id: item_id.parse()?,
        })
    }
}

impl fmt::Display for ItemKey {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}:{}", self.platform, self.item_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn platforms_round_trip() {
        for platform in Platform::ALL {
            assert_eq!(platform.as_str().parse::<Platform>(), Ok(platform));
        }
        assert!(matches!(
            "Taobao".parse::<Platform>(),
            Err(KeyError::UnknownPlatform(_))
        ));
        assert!("".parse::<Platform>().is_err());
    }

    #[test]
    fn item_id_edges() {
        assert_eq!(ItemId::parse(""), Err(KeyError::EmptyItemId));
        assert_eq!(ItemId::parse("1").unwrap().as_str(), "1");
        let twenty = "12345678901234567890";
        assert_eq!(ItemId::parse(twenty).unwrap().as_str(), twenty);
        assert_eq!(
            ItemId::parse("123456789012345678901"),
            Err(KeyError::ItemIdTooLong(21))
        );
        assert_eq!(ItemId::parse("12a"), Err(KeyError::ItemIdNotDigits));
        assert_eq!(ItemId::parse("-1"), Err(KeyError::ItemIdNotDigits));
        assert_eq!(ItemId::parse("１２"), Err(KeyError::ItemIdNotDigits));
        assert_eq!(ItemId::parse("007").unwrap().as_str(), "007");
        assert_ne!(ItemId::parse("007").unwrap(), ItemId::parse("7").unwrap());
    }

    #[test]
    fn long_garbage_is_truncated_in_messages() {
        let garbage = "x".repeat(10_000);
        let message = garbage.parse::<Platform>().unwrap_err().to_string();
        assert!(message.len() < 120, "{message}");
    }

    #[test]
    fn serde_uses_plain_strings() {
        let key = ItemKey::parse("jd", "100001").unwrap();
        let json = serde_json::to_string(&key).unwrap();
        assert_eq!(json, r#"{"platform":"jd","item_id":"100001"}"#);
        assert_eq!(serde_json::from_str::<ItemKey>(&json).unwrap(), key);
        assert!(serde_json::from_str::<ItemKey>(r#"{"platform":"jd","item_id":"1x"}"#).is_err());
    }

    proptest! {
        #[test]
        fn any_digit_string_up_to_20_parses_and_round_trips(text in "[0-9]{1,20}") {
            let id = ItemId::parse(&text).unwrap();
            prop_assert_eq!(id.as_str(), text.as_str());
        }

        #[test]
        fn anything_with_a_non_digit_is_refused(prefix in "[0-9]{0,5}", bad in "[^0-9]", suffix in "[0-9]{0,5}") {
            let text = format!("{prefix}{bad}{suffix}");
            prop_assert!(ItemId::parse(&text).is_err());
        }

        #[test]
        fn more_than_20_digits_is_refused(text in "[0-9]{21,40}") {
            prop_assert!(matches!(ItemId::parse(&text), Err(KeyError::ItemIdTooLong(_))));
        }
    }
}
