//! The server side of change capture: checking that the server logs what the reader needs,
//! finding positions in its log, and turning its binlog stream into committed transactions of
//! catalogue row changes ([`Tail`]).
//!
//! On MariaDB, `mysql_async` does not parse GTID events, so the reader resumes by file and
//! offset ([`Position`]); without the replica capability announced, MariaDB sends its GTID
//! events as dummy statements, which the tail passes over.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use mysql_async::binlog::events::{EventData, RowsEventData};
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn, Opts, Value};
use serde::{Deserialize, Serialize};

use super::rows::{Layout, RowChange, Table};

/// A place in the server's log: a file and the offset of the next event in it. The server's id
/// comes along: a position means nothing on another server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub file: String,
    pub offset: u64,
    pub server_id: u32,
}

impl std::fmt::Display for Position {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}:{}", self.file, self.offset)
    }
}

/// Why reading stopped.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The server cannot serve the position asked for (a purged log, an offset past a file's
    /// end): the changes from there on are lost to the reader.
    #[error("the server no longer has the log position: {0}")]
    PositionGone(String),
    /// The server does not log what the reader needs (no binlog, not ROW, not FULL).
    #[error("the server is not set up for change capture: {0}")]
    Misconfigured(String),
    /// The server went away, stopped answering or refused the reader; retried.
    #[error("the binlog server is unavailable: {0}")]
    Unavailable(String),
}

impl From<mysql_async::Error> for CaptureError {
    fn from(error: mysql_async::Error) -> Self {
        match &error {
            // ER_MASTER_FATAL_ERROR_READING_BINLOG: a purged or unknown file, or an offset the
            // file does not have.
            mysql_async::Error::Server(server)
                if server.code == 1236 && position_gone(&server.message) =>
            {
                CaptureError::PositionGone(server.message.clone())
            }
            _ => CaptureError::Unavailable(error.to_string()),
        }
    }
}

/// Whether an ER_MASTER_FATAL_ERROR_READING_BINLOG (1236) says the position asked for is not
/// on the server (a purged or unknown file, an offset past a file's end), as opposed to a
/// failure worth retrying at the same position (a checksum, a packet too large, I/O).
fn position_gone(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    [
        "first log file",
        "position > file size",
        "purged",
        "could not find",
    ]
    .iter()
    .any(|sign| message.contains(sign))
}

/// How to reach the server and what to follow on it.
#[derive(Debug, Clone)]
pub struct Source {
    opts: Opts,
    /// The catalogue's database: the path of the URL.
    database: String,
    tables: Vec<Table>,
    /// The id the reader registers with.
    reader_id: u32,
    heartbeat: Duration,
}

/// A transaction's changes held at most before they are handed on: a bulk import of a million
/// rows in one transaction is published in pieces, not held whole.
pub const MAX_PENDING_ROWS: usize = 1_024;

/// The answer of a query that may take no longer than this.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

impl Source {
    pub fn new(
        url: &str,
        tables: Vec<Table>,
        reader_id: u32,
        heartbeat: Duration,
    ) -> Result<Self, String> {
        // Never echo the URL: it may hold a password.
        let opts = Opts::from_url(url)
            .map_err(|_| "the change capture URL is not a valid mysql:// URL".to_owned())?;
        let database = opts
            .db_name()
            .filter(|name| !name.is_empty())
            .ok_or("the change capture URL names no database (the catalogue's)")?
            .to_owned();
        Ok(Self {
            opts,
            database,
            tables,
            reader_id,
            heartbeat,
        })
    }

    /// A connection for queries.
    pub async fn connect(&self) -> Result<Conn, CaptureError> {
        bounded(Conn::new(self.opts.clone())).await
    }

    /// Checks the server's binlog settings and returns its `server_id`.
    pub async fn check(&self, conn: &mut Conn) -> Result<u32, CaptureError> {
        let row: Option<(u64, String, String, u32)> = bounded(
            conn.query_first("SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@server_id"),
        )
        .await?;
        let (log_bin, format, image, server_id) =
            row.ok_or_else(|| CaptureError::Unavailable("no answer to the settings".into()))?;
        let mut wrong = Vec::new();
        if log_bin != 1 {
            wrong.push("log_bin is OFF".to_owned());
        }
        if !format.eq_ignore_ascii_case("ROW") {
            wrong.push(format!("binlog_format is {format}, not ROW"));
        }
        if !image.eq_ignore_ascii_case("FULL") {
            wrong.push(format!("binlog_row_image is {image}, not FULL"));
        }
        // MariaDB's compressed events carry rows this reader cannot read (MySQL has no such
        // variable: no row).
        let compressed: Option<(String, String)> =
            bounded(conn.query_first("SHOW VARIABLES LIKE 'log_bin_compress'")).await?;
        if compressed.is_some_and(|(_, value)| value.eq_ignore_ascii_case("ON")) {
            wrong.push("log_bin_compress is ON".to_owned());
        }
        if server_id == self.reader_id {
            wrong.push(format!(
                "the server's server_id is {server_id}, the reader's own (change_capture.server_id)"
            ));
        }
        if wrong.is_empty() {
            Ok(server_id)
        } else {
            Err(CaptureError::Misconfigured(wrong.join("; ")))
        }
    }

    /// The server's current end of log.
    pub async fn end(&self, conn: &mut Conn, server_id: u32) -> Result<Position, CaptureError> {
        // MariaDB and MySQL before 8.4; MySQL 8.4 renamed it.
        let row: Option<mysql_async::Row> =
            match bounded(conn.query_first("SHOW MASTER STATUS")).await {
                Ok(row) => row,
                Err(_) => bounded(conn.query_first("SHOW BINARY LOG STATUS")).await?,
            };
        let row = row.ok_or_else(|| {
            CaptureError::Misconfigured("SHOW MASTER STATUS is empty: log_bin is OFF".into())
        })?;
        let file: Option<String> = row.get(0);
        let offset: Option<u64> = row.get(1);
        match (file, offset) {
            (Some(file), Some(offset)) => Ok(Position {
                file,
                offset,
                server_id,
            }),
            _ => Err(CaptureError::Unavailable(
                "SHOW MASTER STATUS gave no file and position".into(),
            )),
        }
    }

    /// The start of the oldest log the server holds.
    pub async fn earliest(
        &self,
        conn: &mut Conn,
        server_id: u32,
    ) -> Result<Position, CaptureError> {
        let rows: Vec<mysql_async::Row> = bounded(conn.query("SHOW BINARY LOGS")).await?;
        let file: Option<String> = rows.first().and_then(|row| row.get(0));
        let file = file.ok_or_else(|| {
            CaptureError::Misconfigured("SHOW BINARY LOGS lists no log: log_bin is OFF".into())
        })?;
        Ok(Position {
            file,
            offset: 4,
            server_id,
        })
    }

    /// The layout of every followed table, from `information_schema`.
    pub async fn layouts(&self, conn: &mut Conn) -> Result<HashMap<Table, Layout>, String> {
        let mut layouts = HashMap::new();
        for table in &self.tables {
            let names: Vec<String> = bounded(conn.exec(
                "SELECT COLUMN_NAME FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
                (self.database.as_str(), table.name()),
            ))
            .await
            .map_err(|error| error.to_string())?;
            if names.is_empty() {
                return Err(format!(
                    "table {}.{} does not exist",
                    self.database,
                    table.name()
                ));
            }
            layouts.insert(*table, Layout::from_columns(*table, &names)?);
        }
        Ok(layouts)
    }

    /// Follows the log from `from`, with the server's heartbeat on.
    pub async fn tail(&self, from: &Position) -> Result<Tail, CaptureError> {
        let mut conn = self.connect().await?;
        let mut query = self.connect().await?;
        let layouts = self
            .layouts(&mut query)
            .await
            .map_err(CaptureError::Unavailable)?;
        let period = u64::try_from(self.heartbeat.as_nanos()).unwrap_or(u64::MAX);
        bounded(conn.query_drop(format!("SET @master_heartbeat_period = {period}"))).await?;
        let request = BinlogStreamRequest::new(self.reader_id)
            .with_filename(from.file.as_bytes())
            .with_pos(from.offset);
        let stream = bounded(conn.get_binlog_stream(request)).await?;
        Ok(Tail {
            source: self.clone(),
            stream,
            query,
            layouts,
            at: from.clone(),
            pending: Vec::new(),
            silence: self.heartbeat * 3,
            started: false,
        })
    }
}

/// `operation`, cut off at [`QUERY_TIMEOUT`].
async fn bounded<T>(
    operation: impl Future<Output = Result<T, mysql_async::Error>>,
) -> Result<T, CaptureError> {
    match tokio::time::timeout(QUERY_TIMEOUT, operation).await {
        Ok(result) => result.map_err(CaptureError::from),
        Err(_) => Err(CaptureError::Unavailable(format!(
            "the server did not answer within {} s",
            QUERY_TIMEOUT.as_secs()
        ))),
    }
}

/// One row change where the log holds it: `anchor` (`file:offset:row`) is unique in the log,
/// so that the event published for it has the same id when read again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anchored {
    pub table: Table,
    pub change: RowChange,
    pub anchor: String,
}

/// What the log said next.
#[derive(Debug)]
pub enum Step {
    /// A transaction committed with these changes of followed tables (possibly none); `at` is
    /// the position after it, where a reader may resume.
    Committed {
        changes: Vec<Anchored>,
        at: Position,
    },
    /// [`MAX_PENDING_ROWS`] changes of a transaction still being read (a bulk import): the log
    /// holds only committed transactions, so they may be published now; no position to resume
    /// at comes with them (that comes with the transaction's end).
    Rows(Vec<Anchored>),
    /// The log moved on between transactions (a rotation, a heartbeat, a statement of no
    /// followed table).
    Moved(Position),
    /// The log changed a followed table in a way no row tells (TRUNCATE, ALTER, a statement
    /// logged as a statement), or holds rows the reader cannot map: what the caches hold of it
    /// can no longer be proven current. Reading goes on after it.
    Gap { reason: String, at: Position },
}

/// A binlog stream read up to `at`.
pub struct Tail {
    source: Source,
    stream: BinlogStream,
    /// A second connection, for the layouts when a table changes under the reader.
    query: Conn,
    layouts: HashMap<Table, Layout>,
    at: Position,
    /// The current transaction's row changes.
    pending: Vec<Anchored>,
    /// No event for this long (three heartbeats) and the stream is taken for dead.
    silence: Duration,
    /// Whether the stream's first event (an artificial rotation) has been seen.
    started: bool,
}

impl std::fmt::Debug for Tail {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "Tail(at {})", self.at)
    }
}

impl Tail {
    /// Where the log has been read up to.
    pub fn at(&self) -> &Position {
        &self.at
    }

    /// The next step. Not cancel-safe between its events: a caller that drops it drops the tail
    /// and resumes from a stored position.
    pub async fn next(&mut self) -> Result<Step, CaptureError> {
        loop {
            let event = match tokio::time::timeout(self.silence, self.stream.next()).await {
                Ok(Some(Ok(event))) => event,
                Ok(Some(Err(error))) => return Err(error.into()),
                Ok(None) => {
                    return Err(CaptureError::Unavailable(
                        "the server ended the stream".into(),
                    ));
                }
                Err(_) => {
                    return Err(CaptureError::Unavailable(format!(
                        "no event or heartbeat for {} ms",
                        self.silence.as_millis()
                    )));
                }
            };
            let header = event.header();
            let end = u64::from(header.log_pos());
            // MariaDB's compressed events (165 to 171) carry rows and statements this reader
            // cannot read.
            if (165..=171).contains(&header.event_type_raw()) {
                self.advance(end);
                return Ok(Step::Gap {
                    reason:
                        "the server writes compressed binlog events (log_bin_compress must be OFF)"
                            .into(),
                    at: self.at.clone(),
                });
            }
            let data = match event.read_data() {
                Ok(Some(data)) => data,
                Ok(None) => {
                    self.advance(end);
                    continue;
                }
                Err(error) => {
                    return Err(CaptureError::Unavailable(format!(
                        "an event at {} did not parse: {error}",
                        self.at
                    )));
                }
            };
            match data {
                EventData::RotateEvent(rotate) => {
                    // The stream's first event is an artificial rotation naming the file asked
                    // for, read before the format (and so the checksum) is known: the parser
                    // leaves the checksum's bytes on the name, and the file asked for is the
                    // one. Every later rotation names the next file: a real one at a file's
                    // end, an artificial one (offset 0 in its header) where the file ended
                    // without one (a server restart).
                    if !self.started {
                        self.started = true;
                        self.at.offset = rotate.position().max(self.at.offset);
                        continue;
                    }
                    self.at.file = rotate.name().into_owned();
                    self.at.offset = rotate.position();
                    return Ok(Step::Moved(self.at.clone()));
                }
                EventData::IncidentEvent(_) => {
                    self.advance(end);
                    return Ok(Step::Gap {
                        reason: "the server logged an incident: events may be missing from its log"
                            .into(),
                        at: self.at.clone(),
                    });
                }
                EventData::HeartbeatEvent => {
                    if self.pending.is_empty() {
                        return Ok(Step::Moved(self.at.clone()));
                    }
                }
                EventData::QueryEvent(query) => {
                    self.advance(end);
                    let text = query.query();
                    let statement = text.trim();
                    if statement.eq_ignore_ascii_case("BEGIN") {
                        if !self.pending.is_empty() {
                            // Rows with no end: an XA transaction, whose commit comes later.
                            self.pending.clear();
                            return Ok(Step::Gap {
                                reason: "rows of followed tables in a transaction that did not end (XA?)"
                                    .into(),
                                at: self.at.clone(),
                            });
                        }
                        continue;
                    }
                    if statement.eq_ignore_ascii_case("COMMIT") {
                        return Ok(self.commit());
                    }
                    if let Some((verb, table)) = self.changed_by(&query.schema(), statement) {
                        // Read the layouts again: an ALTER may have changed them.
                        self.reload_layouts().await?;
                        return Ok(Step::Gap {
                            reason: format!(
                                "a statement changed {} without row events ({verb})",
                                table.name()
                            ),
                            at: self.at.clone(),
                        });
                    }
                    if self.pending.is_empty() {
                        return Ok(Step::Moved(self.at.clone()));
                    }
                }
                EventData::XidEvent(_) => {
                    self.advance(end);
                    return Ok(self.commit());
                }
                EventData::RowsEvent(rows) => {
                    self.advance(end);
                    if let Some(reason) = self.take_rows(&rows, end).await? {
                        return Ok(Step::Gap {
                            reason,
                            at: self.at.clone(),
                        });
                    }
                    if self.pending.len() >= MAX_PENDING_ROWS {
                        return Ok(Step::Rows(std::mem::take(&mut self.pending)));
                    }
                }
                _ => self.advance(end),
            }
        }
    }

    fn advance(&mut self, end: u64) {
        if end > 0 {
            self.at.offset = end;
        }
    }

    fn commit(&mut self) -> Step {
        Step::Committed {
            changes: std::mem::take(&mut self.pending),
            at: self.at.clone(),
        }
    }

    /// The verb and the followed table of a statement that changes a followed table's rows or
    /// shape without row events (`TRUNCATE`, `ALTER`, `DROP`, `RENAME`, `CREATE`, and DML
    /// logged as a statement), if any: a word match of the table's name, qualified with the
    /// catalogue's database or not (then only in the catalogue's schema), quotes ignored.
    /// Statements that change no rows (`ANALYZE`, `GRANT`, …) are not gaps.
    fn changed_by(&self, schema: &str, statement: &str) -> Option<(String, Table)> {
        const CHANGING: [&str; 10] = [
            "truncate", "alter", "drop", "rename", "create", "insert", "update", "delete",
            "replace", "load",
        ];
        let lower: String = statement
            .to_ascii_lowercase()
            .chars()
            .filter(|c| !matches!(c, '`' | '"'))
            .collect();
        let words: Vec<&str> = lower
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '$'))
            .filter(|word| !word.is_empty())
            .collect();
        let verb = (*words.first()?).to_owned();
        if !CHANGING.contains(&verb.as_str()) {
            return None;
        }
        let database = self.source.database.to_ascii_lowercase();
        let in_catalogue = schema.eq_ignore_ascii_case(&database);
        let table = self.layouts.keys().copied().find(|table| {
            let qualified = format!("{database}.{}", table.name());
            words
                .iter()
                .any(|word| *word == qualified || (*word == table.name() && in_catalogue))
        })?;
        Some((verb.to_ascii_uppercase(), table))
    }

    /// Reads the layouts again, on a new connection if the old one went away (it idles between
    /// schema changes, past the server's `wait_timeout`).
    async fn reload_layouts(&mut self) -> Result<(), CaptureError> {
        match self.source.layouts(&mut self.query).await {
            Ok(layouts) => {
                self.layouts = layouts;
                return Ok(());
            }
            Err(error) => tracing::debug!(%error, "reading the layouts again on a new connection"),
        }
        self.query = self.source.connect().await?;
        self.layouts = self
            .source
            .layouts(&mut self.query)
            .await
            .map_err(CaptureError::Unavailable)?;
        Ok(())
    }

    /// Adds a rows event's changes of followed tables to the transaction; `Ok(Some(reason))`
    /// when they cannot be read (a gap).
    async fn take_rows(
        &mut self,
        rows: &RowsEventData<'_>,
        end: u64,
    ) -> Result<Option<String>, CaptureError> {
        let Some(tme) = self.stream.get_tme(rows.table_id()) else {
            return Ok(Some(format!(
                "a rows event at {} has no table map",
                self.at
            )));
        };
        if !tme
            .database_name()
            .eq_ignore_ascii_case(&self.source.database)
        {
            return Ok(None);
        }
        let Some(table) = Table::from_name(&tme.table_name()) else {
            return Ok(None);
        };
        let Some(layout) = self.layouts.get(&table).copied() else {
            return Ok(None);
        };
        let columns = usize::try_from(tme.columns_count()).unwrap_or(usize::MAX);
        let layout = if columns == layout.columns {
            layout
        } else {
            // The table changed since the layouts were read: read them again, once.
            self.reload_layouts().await?;
            match self.layouts.get(&table) {
                Some(layout) if layout.columns == columns => *layout,
                _ => {
                    return Ok(Some(format!(
                        "{} has {columns} columns in the log and another count in the schema",
                        table.name()
                    )));
                }
            }
        };
        let Some(tme) = self.stream.get_tme(rows.table_id()) else {
            return Ok(Some(format!(
                "a rows event at {} has no table map",
                self.at
            )));
        };
        let mut taken = Vec::new();
        for (index, row) in rows.rows(tme).enumerate() {
            let (before, after) = match row {
                Ok(images) => images,
                Err(error) => {
                    return Ok(Some(format!(
                        "a {} row did not parse: {error}",
                        table.name()
                    )));
                }
            };
            let decode = |image: Option<mysql_async::binlog::row::BinlogRow>| {
                image
                    .map(|image| layout.decode(&values(&image)))
                    .transpose()
            };
            let (before, after) = match (decode(before), decode(after)) {
                (Ok(before), Ok(after)) => (before, after),
                (Err(error), _) | (_, Err(error)) => return Ok(Some(error)),
            };
            let change = match (before, after) {
                (None, Some(after)) => RowChange::Inserted(after),
                (Some(before), Some(after)) => RowChange::Updated { before, after },
                (Some(before), None) => RowChange::Deleted(before),
                (None, None) => continue,
            };
            taken.push(Anchored {
                table,
                change,
                anchor: format!("{}:{}:{end}:{index}", self.at.server_id, self.at.file),
            });
        }
        self.pending.extend(taken);
        Ok(None)
    }
}

/// A row image's values by column; `None` for a column the image lacks or holds as JSON.
fn values(row: &mysql_async::binlog::row::BinlogRow) -> Vec<Option<Value>> {
    (0..row.len())
        .map(|index| match row.as_ref(index) {
            Some(mysql_async::binlog::value::BinlogValue::Value(value)) => Some(value.clone()),
            _ => None,
        })
        .collect()
}
