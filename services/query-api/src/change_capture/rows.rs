//! From a catalogue row in the database's log to the invalidation event it calls for: where the
//! needed columns sit in each table ([`Layout`]), one row image decoded ([`RowImage`]), and the
//! event kind and version a change of it announces ([`plan`]). Pure: no connection, no clock.

use mysql_async::Value;
use rebate_domain::{ItemId, ItemKey, Platform};
use rebate_events::{EventKind, FIRST_VERSION, MAX_VERSION};

pub use crate::config::change_capture::Table;

/// Where the columns the reader needs sit in a table's rows, read from the server's
/// `information_schema.COLUMNS` (the log's row events carry positions, not names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub table: Table,
    /// How many columns a row has: a row event with another count was written under another
    /// layout (the table was altered), and is not read with this one.
    pub columns: usize,
    platform: usize,
    item_id: usize,
    version: usize,
    status: Option<usize>,
}

impl Layout {
    /// The layout of `table` whose columns, in ordinal order, are `names`.
    pub fn from_columns(table: Table, names: &[String]) -> Result<Self, String> {
        let position = |column: &str| {
            names
                .iter()
                .position(|name| name.eq_ignore_ascii_case(column))
                .ok_or_else(|| format!("table {} has no column `{column}`", table.name()))
        };
        Ok(Self {
            table,
            columns: names.len(),
            platform: position("platform")?,
            item_id: position("item_id")?,
            version: position("version")?,
            status: if table.has_status() {
                Some(position("status")?)
            } else {
                None
            },
        })
    }

    /// Decodes one row image (full row image: every column present).
    pub fn decode(&self, row: &[Option<Value>]) -> Result<RowImage, String> {
        if row.len() != self.columns {
            return Err(format!(
                "a row of {} has {} columns, the table has {}",
                self.table.name(),
                row.len(),
                self.columns
            ));
        }
        let column = |index: usize, name: &str| {
            row[index].as_ref().ok_or_else(|| {
                format!(
                    "column `{name}` of {} is missing from the row image (binlog_row_image must be FULL)",
                    self.table.name()
                )
            })
        };
        let platform = text(column(self.platform, "platform")?)
            .and_then(|text| text.parse::<Platform>().ok())
            .ok_or_else(|| format!("{}: platform is not a known platform", self.table.name()))?;
        let item_id = text(column(self.item_id, "item_id")?)
            .and_then(|text| text.parse::<ItemId>().ok())
            .ok_or_else(|| format!("{}: item_id is not an item id", self.table.name()))?;
        let version = unsigned(column(self.version, "version")?)
            .ok_or_else(|| format!("{}: version is not a whole number", self.table.name()))?;
        let delisted = match self.status {
            Some(index) => text(column(index, "status")?).as_deref() == Some("delisted"),
            None => false,
        };
        Ok(RowImage {
            key: ItemKey::new(platform, item_id),
            version,
            delisted,
        })
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::Bytes(bytes) => String::from_utf8(bytes.clone()).ok(),
        _ => None,
    }
}

fn unsigned(value: &Value) -> Option<u64> {
    match value {
        Value::Int(number) => u64::try_from(*number).ok(),
        Value::UInt(number) => Some(*number),
        Value::Bytes(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        _ => None,
    }
}

/// What the reader needs of one row image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowImage {
    pub key: ItemKey,
    pub version: u64,
    /// A product's `status` is `delisted` (always false for a rate).
    pub delisted: bool,
}

/// One changed row, as the log's row events give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowChange {
    Inserted(RowImage),
    Updated { before: RowImage, after: RowImage },
    Deleted(RowImage),
}

/// One invalidation the reader publishes: the event kind, for which key, at which version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    pub kind: EventKind,
    pub key: ItemKey,
    pub version: u64,
}

/// What a change of `table`'s row announces, and whether it broke the versioning contract
/// (`true` when an update kept the row's version: the fence it sets cannot displace a copy
/// cached at that version, see docs/OPERATIONS.md, "Change capture").
///
/// - An inserted product is an `item_created` (the Bloom filter learns it, and the not-found
///   markers cached before it existed fall); an inserted rate a `rate_changed`, whose fence
///   at version 1 or above displaces the rate's not-found marker (version 0).
/// - An updated product is an `item_delisted` when its status became `delisted`, else a
///   `product_changed`; an updated rate a `rate_changed`; both at the row's new version. An
///   update that moved the row to another key is a delete of the old key and an insert of the
///   new.
/// - A deleted row fences its part one version past the deleted row's: the copy of the row
///   falls, and the loads that find nothing are served, uncached, until the fence lapses.
pub fn plan(table: Table, change: RowChange) -> (Vec<Planned>, bool) {
    let changed = match table {
        Table::Products => EventKind::ProductChanged,
        Table::RebateRates => EventKind::RateChanged,
    };
    let inserted = |row: RowImage| Planned {
        kind: match table {
            Table::Products => EventKind::ItemCreated,
            Table::RebateRates => EventKind::RateChanged,
        },
        key: row.key,
        version: event_version(row.version),
    };
    let deleted = |row: RowImage| Planned {
        kind: changed,
        key: row.key,
        version: event_version(row.version.saturating_add(1)),
    };
    match change {
        RowChange::Inserted(row) => (vec![inserted(row)], false),
        RowChange::Deleted(row) => (vec![deleted(row)], false),
        RowChange::Updated { before, after } if before.key != after.key => {
            (vec![deleted(before), inserted(after)], false)
        }
        RowChange::Updated { before, after } => {
            let kind = if table == Table::Products && after.delisted && !before.delisted {
                EventKind::ItemDelisted
            } else {
                changed
            };
            let planned = Planned {
                kind,
                key: after.key,
                version: event_version(after.version),
            };
            (vec![planned], after.version == before.version)
        }
    }
}

/// A row's version as an event's: events start at [`FIRST_VERSION`] and end at
/// [`MAX_VERSION`].
fn event_version(version: u64) -> u64 {
    version.clamp(FIRST_VERSION, MAX_VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn columns(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    }

    fn rates() -> Layout {
        Layout::from_columns(
            Table::RebateRates,
            &columns(&[
                "platform",
                "item_id",
                "rate_bps",
                "version",
                "updated_at_ms",
            ]),
        )
        .unwrap()
    }

    fn products() -> Layout {
        Layout::from_columns(
            Table::Products,
            &columns(&[
                "platform",
                "item_id",
                "title",
                "price_cents",
                "image_url",
                "shop_name",
                "status",
                "version",
                "updated_at_ms",
            ]),
        )
        .unwrap()
    }

    fn bytes(text: &str) -> Option<Value> {
        Some(Value::Bytes(text.as_bytes().to_vec()))
    }

    fn rate_row(item: &str, version: i64) -> Vec<Option<Value>> {
        vec![
            bytes("jd"),
            bytes(item),
            Some(Value::Int(150)),
            Some(Value::Int(version)),
            Some(Value::Int(0)),
        ]
    }

    fn product_row(item: &str, status: &str, version: i64) -> Vec<Option<Value>> {
        vec![
            bytes("taobao"),
            bytes(item),
            bytes("A title"),
            Some(Value::Int(100)),
            bytes("https://img.example/1.jpg"),
            bytes("shop"),
            bytes(status),
            Some(Value::Int(version)),
            Some(Value::Int(0)),
        ]
    }

    fn key(platform: Platform, item: u64) -> ItemKey {
        ItemKey::new(platform, ItemId::from_u64(item))
    }

    #[test]
    fn a_layout_needs_its_columns_in_any_order_and_case() {
        let layout = Layout::from_columns(
            Table::RebateRates,
            &columns(&["VERSION", "item_id", "platform", "extra"]),
        )
        .unwrap();
        assert_eq!(layout.columns, 4);
        let missing = Layout::from_columns(Table::Products, &columns(&["platform", "item_id"]));
        assert_eq!(
            missing.unwrap_err(),
            "table products has no column `version`"
        );
        let no_status = Layout::from_columns(
            Table::Products,
            &columns(&["platform", "item_id", "version"]),
        );
        assert_eq!(
            no_status.unwrap_err(),
            "table products has no column `status`"
        );
    }

    #[test]
    fn rows_decode_or_say_why_not() {
        let row = rates().decode(&rate_row("100077", 7)).unwrap();
        assert_eq!(row.key, key(Platform::Jd, 100_077));
        assert_eq!(row.version, 7);
        assert!(!row.delisted);
        let delisted = products().decode(&product_row("5", "delisted", 3)).unwrap();
        assert!(delisted.delisted);

        let mut short = rate_row("1", 1);
        short.pop();
        assert_eq!(
            rates().decode(&short).unwrap_err(),
            "a row of rebate_rates has 4 columns, the table has 5"
        );
        let mut minimal = rate_row("1", 1);
        minimal[3] = None;
        assert!(
            rates()
                .decode(&minimal)
                .unwrap_err()
                .contains("binlog_row_image must be FULL")
        );
        let mut unknown = rate_row("1", 1);
        unknown[0] = bytes("amazon");
        assert_eq!(
            rates().decode(&unknown).unwrap_err(),
            "rebate_rates: platform is not a known platform"
        );
        let mut negative = rate_row("1", 1);
        negative[3] = Some(Value::Int(-1));
        assert_eq!(
            rates().decode(&negative).unwrap_err(),
            "rebate_rates: version is not a whole number"
        );
    }

    fn image(item: u64, version: u64, delisted: bool) -> RowImage {
        RowImage {
            key: key(Platform::Taobao, item),
            version,
            delisted,
        }
    }

    #[test]
    fn each_change_plans_the_event_an_operator_would_publish() {
        let one = |table, change| {
            let (planned, unversioned) = plan(table, change);
            assert_eq!(planned.len(), 1);
            (planned[0].kind, planned[0].version, unversioned)
        };
        use EventKind::*;
        assert_eq!(
            one(Table::Products, RowChange::Inserted(image(1, 4, false))),
            (ItemCreated, 4, false)
        );
        assert_eq!(
            one(Table::RebateRates, RowChange::Inserted(image(1, 0, false))),
            (RateChanged, 1, false),
            "a rate inserted at version 0 still fences past its not-found marker"
        );
        assert_eq!(
            one(
                Table::Products,
                RowChange::Updated {
                    before: image(1, 4, false),
                    after: image(1, 5, true)
                }
            ),
            (ItemDelisted, 5, false)
        );
        assert_eq!(
            one(
                Table::Products,
                RowChange::Updated {
                    before: image(1, 5, true),
                    after: image(1, 6, true)
                }
            ),
            (ProductChanged, 6, false)
        );
        assert_eq!(
            one(
                Table::RebateRates,
                RowChange::Updated {
                    before: image(1, 6, false),
                    after: image(1, 6, false)
                }
            ),
            (RateChanged, 6, true),
            "an update that kept its version is published and flagged"
        );
        assert_eq!(
            one(Table::RebateRates, RowChange::Deleted(image(1, 6, false))),
            (RateChanged, 7, false)
        );
        assert_eq!(
            one(
                Table::Products,
                RowChange::Deleted(image(1, MAX_VERSION, false))
            ),
            (ProductChanged, MAX_VERSION, false)
        );
    }

    #[test]
    fn a_row_moved_to_another_key_is_a_delete_and_an_insert() {
        let (planned, _) = plan(
            Table::Products,
            RowChange::Updated {
                before: image(1, 3, false),
                after: image(2, 4, false),
            },
        );
        assert_eq!(
            planned,
            [
                Planned {
                    kind: EventKind::ProductChanged,
                    key: key(Platform::Taobao, 1),
                    version: 4
                },
                Planned {
                    kind: EventKind::ItemCreated,
                    key: key(Platform::Taobao, 2),
                    version: 4
                },
            ]
        );
    }
}
