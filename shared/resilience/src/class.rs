//! Request classes: which requests give way first when the service sheds load.
//!
//! A user opening an item page waits for the answer; a list page can show its items a moment
//! later or from cache; a prefetch can be dropped. At each measured shed level the lower classes
//! are served as if the level were higher, and a prefetch is refused once the level is 2 or
//! more:
//!
//! | measured level | `page` | `list` | `prefetch` |
//! | --- | --- | --- | --- |
//! | 0 | 0 | 0 | 0 |
//! | 1 (drop extras) | 1 | 2 | 3 (cache only) |
//! | 2 (short timeouts) | 2 | 3 | refused |
//! | 3 (cache only) | 3 | 3 | refused |

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::shedder::ShedLevel;

/// How much a request matters to the person waiting for it, highest last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RequestClass {
    /// Background or speculative work: nobody waits for it.
    Prefetch,
    /// A list page's items.
    List,
    /// An item page: a person waits for exactly this answer.
    Page,
}

impl RequestClass {
    /// Lowest first.
    pub const ALL: [Self; 3] = [Self::Prefetch, Self::List, Self::Page];

    /// The name in the `x-request-class` header, metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Prefetch => "prefetch",
            Self::List => "list",
            Self::Page => "page",
        }
    }

    /// The class named `text` (exactly as [`RequestClass::as_str`] writes it).
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|class| class.as_str() == text)
    }

    /// How many levels above the measured one this class is served at.
    const fn steps_down(self) -> u8 {
        match self {
            Self::Page => 0,
            Self::List => 1,
            Self::Prefetch => 2,
        }
    }

    /// The level a request of this class is served at when the service measures `level`, or
    /// `None` when it is refused (see the module's table).
    pub fn served_at(self, level: ShedLevel) -> Option<ShedLevel> {
        if level == ShedLevel::Normal {
            return Some(ShedLevel::Normal);
        }
        let raised = level.as_u8() + self.steps_down();
        match self {
            // Lists are cheap at cache only, and a list page without them shows nothing.
            Self::List | Self::Page => ShedLevel::from_u8(raised.min(3)),
            Self::Prefetch => ShedLevel::from_u8(raised),
        }
    }
}

impl fmt::Display for RequestClass {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_classes_give_way_first_at_every_level() {
        use ShedLevel::{CacheOnly, DropExtras, Normal, ShortTimeouts};
        let table = [
            (Normal, [Some(Normal), Some(Normal), Some(Normal)]),
            (
                DropExtras,
                [Some(CacheOnly), Some(ShortTimeouts), Some(DropExtras)],
            ),
            (ShortTimeouts, [None, Some(CacheOnly), Some(ShortTimeouts)]),
            (CacheOnly, [None, Some(CacheOnly), Some(CacheOnly)]),
        ];
        for (level, served) in table {
            let actual = RequestClass::ALL.map(|class| class.served_at(level));
            assert_eq!(actual, served, "at {level:?}");
            // A higher class is never served worse than a lower one.
            let rank = |served: Option<ShedLevel>| served.map_or(4, ShedLevel::as_u8);
            assert!(actual.windows(2).all(|pair| rank(pair[0]) >= rank(pair[1])));
        }
    }

    #[test]
    fn names_round_trip_and_nothing_else_parses() {
        for class in RequestClass::ALL {
            assert_eq!(RequestClass::parse(class.as_str()), Some(class));
        }
        for text in ["", "Page", "page ", "background", "pagex"] {
            assert_eq!(RequestClass::parse(text), None, "{text:?}");
        }
        assert!(RequestClass::Prefetch < RequestClass::List);
        assert!(RequestClass::List < RequestClass::Page);
    }
}
