//! `[change_capture]`: invalidation from the database's binlog (`crate::change_capture`).

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, Secret, ensure_in, invalid};

/// A catalogue table change capture follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Table {
    Products,
    RebateRates,
}

impl Table {
    pub const ALL: [Table; 2] = [Table::Products, Table::RebateRates];

    pub const fn name(self) -> &'static str {
        match self {
            Table::Products => "products",
            Table::RebateRates => "rebate_rates",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|table| table.name() == name)
    }

    /// Whether the reader needs its `status` column too (besides `platform`, `item_id` and
    /// `version`).
    pub fn has_status(self) -> bool {
        matches!(self, Table::Products)
    }
}

/// Where a reader with no stored position starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StartPosition {
    /// At the server's current end, after a fleet-wide resync: what the caches hold from
    /// before cannot be proven current.
    Resync,
    /// At the server's current end, trusting the caches (a first deployment whose caches were
    /// just emptied, say).
    End,
    /// At the oldest log the server still holds, replaying every change in it.
    Earliest,
}

/// `[change_capture]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangeCaptureSettings {
    pub enabled: bool,
    /// The replication account's URL; empty: `store.mysql.url` (the account then needs the
    /// replication grants too). Never logged.
    pub url: Secret,
    /// The catalogue tables whose changes are followed.
    pub tables: Vec<Table>,
    /// The id the reader registers with, as a replica does: unique among the server's
    /// replicas and readers, and not the server's own.
    pub server_id: u32,
    /// Where a reader with no stored position starts.
    pub start_position: StartPosition,
    /// How long the reader's lease lasts unless renewed (renewed every third of it): another
    /// instance takes over within about this long, plus `poll_ms`, of the reader's loss.
    pub lease_ttl_ms: u64,
    /// The server's heartbeat on an idle log; three missed heartbeats close the stream.
    pub heartbeat_ms: u64,
    /// How often every instance looks for a fleet-wide resync (and, unless it reads, for the
    /// lease).
    pub poll_ms: u64,
}

impl ChangeCaptureSettings {
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms)
    }

    pub fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.heartbeat_ms)
    }

    pub fn poll(&self) -> Duration {
        Duration::from_millis(self.poll_ms)
    }

    /// Checks the section alone; the other sections it needs are checked by
    /// `Settings::validate` (a MySQL store and Redis).
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.tables.is_empty() {
            return Err(invalid(
                "change_capture.tables",
                "name at least one of \"products\", \"rebate_rates\"",
            ));
        }
        for (index, table) in self.tables.iter().enumerate() {
            if self.tables[..index].contains(table) {
                return Err(invalid(
                    "change_capture.tables",
                    format!("{} is named twice", table.name()),
                ));
            }
        }
        ensure_in("change_capture.server_id", self.server_id, 1..=u32::MAX)?;
        ensure_in(
            "change_capture.lease_ttl_ms",
            self.lease_ttl_ms,
            500..=60_000,
        )?;
        ensure_in(
            "change_capture.heartbeat_ms",
            self.heartbeat_ms,
            100..=30_000,
        )?;
        ensure_in("change_capture.poll_ms", self.poll_ms, 50..=60_000)?;
        Ok(())
    }
}
