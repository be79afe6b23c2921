//! Change capture: invalidation from the database's binlog, the backstop behind operators'
//! events.
//!
//! Contract: one instance of the fleet at a time — the holder of a lease in Redis, with a
//! fencing token — reads the row events of the followed catalogue tables and publishes, for
//! each changed row, the invalidation event an operator would ([`rows::plan`]), with an id
//! derived from the row's place in the log, so that reading a stretch again is harmless. It
//! stores the position it has published up to only after those events are published (at least
//! once), only while its token still holds the lease, and resumes there. Whatever it cannot
//! prove it has not missed — a position the server no longer has, a stored position of another
//! server, a statement that changed a followed table without row events, rows it cannot map,
//! no stored position under `start_position = "resync"` — it answers with a fleet-wide resync:
//! a record in Redis that every instance applies within `poll_ms` (L1 and the kept renderings
//! dropped, every L2 copy fetched before it ignored, the Bloom filter rebuilt). Every resync is
//! logged, counted and shown in the status and the `/readyz` body.
//!
//! Events stay the fast path: a write that also publishes an operator's event is fenced by
//! whichever arrives first, and the other changes nothing (fences compare versions), so an
//! inserted item whose not-found marker was cached answers at once after its own event.
//!
//! # Layout
//! - `rows`: tables, their layouts and what a row change announces (pure).
//! - `binlog`: the server side: settings checks, positions, the stream as transactions.
//! - this file: the lease, publishing, positions and resyncs ([`ChangeCapture`]).

pub mod binlog;
pub mod rows;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use rebate_domain::Timestamp;
use rebate_engine::QueryEngine;
use rebate_events::{EventId, InvalidationEvent};
use rebate_redis_tier::{CaptureLease, CaptureRecord, LeaseAttempt, RedisTier};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

pub use binlog::Position;
use binlog::{Anchored, CaptureError, Source, Step};
pub use rows::Table;

use crate::config::change_capture::{ChangeCaptureSettings, StartPosition};
use crate::event_bus::EventBus;

/// The prefix of the ids of the events change capture publishes
/// (`binlog:<server_id>:<file>:<offset>:<row>`):
/// how the consistency observer tells them from operators'.
pub const EVENT_ID_PREFIX: &str = "binlog:";

/// Events published at once (each waits for the broker's confirm).
const PUBLISH_CONCURRENCY: usize = 64;
/// Steps of the log (transactions, mostly) published together, then stored as one position;
/// also the queue between the stream and the publisher, so that at most about
/// `2 × MAX_BATCH × binlog::MAX_PENDING_ROWS` changes are held.
const MAX_BATCH: usize = 64;
/// A position is stored at least this often while the log moves on without followed changes.
const IDLE_POSITION_EVERY: Duration = Duration::from_secs(1);
/// The longest wait between two attempts after a failure.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A fleet-wide resync as stored in Redis: every L2 copy fetched before `floor_ms` is ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResyncRecord {
    /// The deciding reader's fencing token and its count of resyncs under it: the order of
    /// resyncs (a later holder has a larger token), whatever the clocks say.
    pub token: u64,
    pub sequence: u64,
    /// Milliseconds since the epoch, on the reader's clock, plus the margin of a load in flight
    /// (see [`ChangeCapture::new`]).
    pub floor_ms: i64,
    pub reason: String,
    /// The instance that decided it.
    pub by: String,
}

/// Whether this instance reads the log now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Another instance holds the lease (or nobody, between two tries).
    #[default]
    Standby,
    Reader,
}

/// What the status page and `/readyz` show.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CaptureStatus {
    pub role: Role,
    /// The instance that held the lease when last looked at.
    pub reader: Option<String>,
    /// The position this instance, as the reader, has published every change up to.
    pub position: Option<String>,
    /// When this instance last published a transaction's events.
    pub last_published_at: Option<Timestamp>,
    pub events_published: u64,
    /// Changed rows of followed tables read.
    pub rows: u64,
    /// Rows updated without a new version (their fence cannot displace a copy cached at that
    /// version: the writer broke the versioning contract).
    pub unversioned_rows: u64,
    /// Resyncs this instance decided, as the reader.
    pub resyncs_started: u64,
    /// Fleet-wide resyncs this instance applied (its own included).
    pub resyncs_applied: u64,
    pub last_resync: Option<ResyncRecord>,
    /// The last failure, until reading works again.
    pub error: Option<String>,
}

/// The change-capture task of one instance: every instance follows resyncs and stands by for
/// the lease; the lease's holder reads.
#[derive(Debug)]
pub struct ChangeCapture {
    settings: ChangeCaptureSettings,
    instance: String,
    source: Source,
    tier: RedisTier,
    events: EventBus,
    engine: QueryEngine,
    status: Mutex<CaptureStatus>,
    /// The last resync applied here, as (token, sequence); (0, 0): none.
    applied: Mutex<(u64, u64)>,
    /// Resyncs this instance decided under its current lease.
    sequence: AtomicU64,
    /// How far past the moment it is decided a resync's floor lies: a load that read the store
    /// before then may finish (and stamp its copy) until then.
    resync_margin: Duration,
    /// Whether the current lead stored a position: a lead that did has made progress, and the
    /// next failure starts the back-off afresh.
    progressed: std::sync::atomic::AtomicBool,
    events_published: AtomicU64,
}

impl ChangeCapture {
    /// `url` is the replication account's (the settings' or the store's); `resync_margin` the
    /// longest a store load may take (the floor of a resync lies that far ahead, so that a copy
    /// read from the store before the gap and stamped after it is ignored too).
    pub fn new(
        settings: ChangeCaptureSettings,
        url: &str,
        instance: String,
        tier: RedisTier,
        events: EventBus,
        engine: QueryEngine,
        resync_margin: Duration,
    ) -> anyhow::Result<Self> {
        let source = Source::new(
            url,
            settings.tables.clone(),
            settings.server_id,
            settings.heartbeat(),
        )
        .map_err(|error| anyhow::anyhow!("change_capture: {error}"))?;
        Ok(Self {
            settings,
            instance,
            source,
            tier,
            events,
            engine,
            status: Mutex::default(),
            applied: Mutex::new((0, 0)),
            sequence: AtomicU64::new(0),
            resync_margin,
            progressed: std::sync::atomic::AtomicBool::new(false),
            events_published: AtomicU64::new(0),
        })
    }

    pub fn status(&self) -> CaptureStatus {
        let mut status = self.lock().clone();
        status.events_published = self.events_published.load(Ordering::Relaxed);
        status
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CaptureStatus> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs until `shutdown`: follows the fleet's resyncs every `poll_ms` (a task of its own,
    /// never slowed by the reader's back-off), and reads whenever this instance holds the
    /// lease. A lead that failed before storing any position is tried again after a back-off
    /// (`poll_ms` doubling up to 30 s); one that made progress is tried again at once.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let follower = {
            let capture = Arc::clone(&self);
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let mut first_look = true;
                loop {
                    capture.follow_resyncs(first_look).await;
                    first_look = false;
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(capture.settings.poll()) => {}
                    }
                }
            })
        };
        let _follower = AbortOnDrop(follower);
        let mut failures = 0u32;
        loop {
            match self
                .tier
                .take_capture_lease(&self.instance, self.settings.lease_ttl())
                .await
            {
                Ok(LeaseAttempt::Taken(lease)) => {
                    self.progressed.store(false, Ordering::Relaxed);
                    self.sequence.store(0, Ordering::Relaxed);
                    let outcome = self.lead(&lease, &shutdown).await;
                    let _ = self.tier.release_capture_lease(&lease).await;
                    self.lock().role = Role::Standby;
                    if self.progressed.load(Ordering::Relaxed) {
                        failures = 0;
                    }
                    if let Err(error) = outcome {
                        failures = failures.saturating_add(1);
                        tracing::warn!(%error, token = lease.token, "change capture stopped reading; it retries");
                        self.lock().error = Some(error);
                    }
                }
                Ok(LeaseAttempt::HeldBy(holder)) => {
                    self.lock().reader = holder.map(|holder| holder.instance);
                }
                Err(error) => {
                    tracing::debug!(%error, "change capture lease unreadable");
                }
            }
            let wait = if failures <= 1 {
                self.settings.poll()
            } else {
                (self.settings.poll() * 2u32.saturating_pow(failures.min(8))).min(MAX_BACKOFF)
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Applies the fleet's last resync if this instance has not yet. At the first look, a
    /// resync from before this instance started only sets the L2 floor: there is nothing local
    /// to drop.
    async fn follow_resyncs(&self, first_look: bool) {
        let record = match self.tier.read_capture_record(CaptureRecord::Resync).await {
            Ok(Some(text)) => match serde_json::from_str::<ResyncRecord>(&text) {
                Ok(record) => record,
                Err(error) => {
                    tracing::warn!(%error, "the fleet's resync record does not parse; ignored");
                    return;
                }
            },
            Ok(None) => return,
            Err(error) => {
                tracing::debug!(%error, "the fleet's resync record is unreadable");
                return;
            }
        };
        if first_look {
            let mut applied = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
            if (record.token, record.sequence) > *applied {
                *applied = (record.token, record.sequence);
                for (_, part) in self.engine.parts().views().iter() {
                    part.set_l2_floor(Timestamp::from_millis(record.floor_ms));
                }
                drop(applied);
                self.lock().last_resync = Some(record);
            }
            return;
        }
        self.apply_resync(record);
    }

    /// Applies `record` unless this instance applied it (or a later one) already.
    fn apply_resync(&self, record: ResyncRecord) {
        {
            let mut applied = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
            if (record.token, record.sequence) <= *applied {
                return;
            }
            *applied = (record.token, record.sequence);
        }
        self.engine.resync(Timestamp::from_millis(record.floor_ms));
        tracing::warn!(
            reason = record.reason.as_str(),
            by = record.by.as_str(),
            floor_ms = record.floor_ms,
            "fleet-wide resync applied: L1 and the kept renderings dropped, older L2 copies ignored"
        );
        let mut status = self.lock();
        status.resyncs_applied += 1;
        status.last_resync = Some(record);
    }

    /// Reads under `lease` until it is lost, reading fails or `shutdown`.
    async fn lead(&self, lease: &CaptureLease, shutdown: &CancellationToken) -> Result<(), String> {
        {
            let mut status = self.lock();
            status.role = Role::Reader;
            status.reader = Some(self.instance.clone());
        }
        tracing::info!(
            token = lease.token,
            "change capture lease taken: this instance reads the binlog"
        );
        let lost = CancellationToken::new();
        let renewing = tokio::spawn(keep_lease(
            self.tier.clone(),
            lease.clone(),
            self.settings.lease_ttl(),
            lost.clone(),
        ));
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => Ok(()),
            _ = lost.cancelled() => Err("the lease was lost".to_owned()),
            outcome = self.read(lease) => outcome,
        };
        lost.cancel();
        let _ = renewing.await;
        outcome
    }

    /// Finds where to start, then reads and publishes. Returns only on failure.
    async fn read(&self, lease: &CaptureLease) -> Result<(), String> {
        let mut conn = self
            .source
            .connect()
            .await
            .map_err(|error| error.to_string())?;
        let server_id = self
            .source
            .check(&mut conn)
            .await
            .map_err(|error| error.to_string())?;
        let stored = self
            .tier
            .read_capture_record(CaptureRecord::Position)
            .await
            .map_err(|error| format!("the stored position is unreadable: {error}"))?;
        let stored = stored.map(|text| serde_json::from_str::<Position>(&text));
        let mut from = match stored {
            Some(Ok(position)) if position.server_id == server_id => position,
            Some(Err(error)) => {
                let reason = format!("the stored position does not parse: {error}");
                self.restart_at_end(lease, &mut conn, server_id, reason)
                    .await?
            }
            Some(Ok(position)) => {
                let reason = format!(
                    "the stored position {position} is server {}'s, the server is {server_id}",
                    position.server_id
                );
                self.restart_at_end(lease, &mut conn, server_id, reason)
                    .await?
            }
            None => match self.settings.start_position {
                StartPosition::Resync => {
                    self.restart_at_end(
                        lease,
                        &mut conn,
                        server_id,
                        "no stored position".to_owned(),
                    )
                    .await?
                }
                StartPosition::End => self.store_start(lease, &mut conn, server_id, false).await?,
                StartPosition::Earliest => {
                    self.store_start(lease, &mut conn, server_id, true).await?
                }
            },
        };
        drop(conn);
        let mut gone_at_once = false;
        loop {
            let gone = match self.source.tail(&from).await {
                Ok(tail) => match self.follow(lease, tail).await? {
                    Some(gone) => gone,
                    None => return Ok(()),
                },
                Err(CaptureError::PositionGone(message)) => (from.clone(), message),
                Err(error) => return Err(error.to_string()),
            };
            // What the reader had not read is lost to it: resync, and go on from the end. Twice
            // in a row from the end itself is not a purged log: back off instead.
            let (position, message) = gone;
            if gone_at_once && position == from {
                return Err(format!(
                    "the server refuses its own end {position}: {message}"
                ));
            }
            gone_at_once = true;
            let mut conn = self
                .source
                .connect()
                .await
                .map_err(|error| error.to_string())?;
            let reason = format!("position {position} is gone from the server: {message}");
            from = self
                .restart_at_end(lease, &mut conn, server_id, reason)
                .await?;
        }
    }

    /// Reads and publishes until reading fails; `Ok(Some((position, message)))` when the server
    /// no longer has the log at `position` (purged while the reader lagged, say).
    ///
    /// The stream is read by a task of its own into a bounded queue; each round takes what the
    /// queue holds (up to [`MAX_BATCH`] steps), publishes the changes of every transaction in
    /// it at once, and then stores the position after the last whole transaction: a backlog (a
    /// takeover, a bulk import) is published at the broker's pace, not one confirm per
    /// transaction.
    async fn follow(
        &self,
        lease: &CaptureLease,
        mut tail: binlog::Tail,
    ) -> Result<Option<(Position, String)>, String> {
        self.lock().error = None;
        tracing::info!(position = %tail.at(), "change capture reading");
        let (sender, mut steps) = tokio::sync::mpsc::channel(MAX_BATCH);
        let reading = tokio::spawn(async move {
            loop {
                let step = tail
                    .next()
                    .await
                    .map_err(|error| (error, tail.at().clone()));
                let failed = step.is_err();
                if sender.send(step).await.is_err() || failed {
                    return;
                }
            }
        });
        let _stop_reading = AbortOnDrop(reading);
        let mut stored_at = tokio::time::Instant::now();
        loop {
            let Some(first) = steps.recv().await else {
                return Err("the binlog reading task ended".to_owned());
            };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match steps.try_recv() {
                    Ok(step) => batch.push(step),
                    Err(_) => break,
                }
            }
            let mut changes = Vec::new();
            let mut reached = None;
            for step in batch {
                match step {
                    Ok(Step::Committed { changes: more, at }) => {
                        changes.extend(more);
                        reached = Some(at);
                    }
                    Ok(Step::Rows(more)) => changes.extend(more),
                    Ok(Step::Moved(at)) => reached = Some(at),
                    Ok(Step::Gap { reason, at }) => {
                        self.flush(lease, &mut changes, reached.take(), &mut stored_at)
                            .await?;
                        self.resync(lease, reason).await?;
                        self.store_position(lease, &at).await?;
                        stored_at = tokio::time::Instant::now();
                    }
                    Err((error, at)) => {
                        self.flush(lease, &mut changes, reached.take(), &mut stored_at)
                            .await?;
                        return match error {
                            CaptureError::PositionGone(message) => Ok(Some((at, message))),
                            error => Err(error.to_string()),
                        };
                    }
                }
            }
            self.flush(lease, &mut changes, reached, &mut stored_at)
                .await?;
        }
    }

    /// Publishes `changes`, then stores `reached` (when the batch ended a transaction). With no
    /// change, stores `reached` only when the last store is [`IDLE_POSITION_EVERY`] old.
    async fn flush(
        &self,
        lease: &CaptureLease,
        changes: &mut Vec<Anchored>,
        reached: Option<Position>,
        stored_at: &mut tokio::time::Instant,
    ) -> Result<(), String> {
        let published = !changes.is_empty();
        if published {
            self.publish(changes).await?;
            changes.clear();
            self.lock().last_published_at = Some(Timestamp::now());
        }
        let Some(reached) = reached else {
            return Ok(());
        };
        if published || stored_at.elapsed() >= IDLE_POSITION_EVERY {
            self.store_position(lease, &reached).await?;
            *stored_at = tokio::time::Instant::now();
        }
        Ok(())
    }

    /// The server's current end, stored as the position, after a resync for `reason`: the
    /// end is read first, so every change after it is read, and every change before it is
    /// covered by the resync.
    async fn restart_at_end(
        &self,
        lease: &CaptureLease,
        conn: &mut mysql_async::Conn,
        server_id: u32,
        reason: String,
    ) -> Result<Position, String> {
        let end = self
            .source
            .end(conn, server_id)
            .await
            .map_err(|error| error.to_string())?;
        self.resync(lease, reason).await?;
        self.store_position(lease, &end).await?;
        Ok(end)
    }

    /// The server's current end (or its oldest log), stored as the position without a resync.
    async fn store_start(
        &self,
        lease: &CaptureLease,
        conn: &mut mysql_async::Conn,
        server_id: u32,
        earliest: bool,
    ) -> Result<Position, String> {
        let start = if earliest {
            self.source.earliest(conn, server_id).await
        } else {
            self.source.end(conn, server_id).await
        }
        .map_err(|error| error.to_string())?;
        tracing::info!(position = %start, "change capture starts with no stored position");
        self.store_position(lease, &start).await?;
        Ok(start)
    }

    /// Announces a fleet-wide resync and applies it here.
    async fn resync(&self, lease: &CaptureLease, reason: String) -> Result<(), String> {
        let margin = i64::try_from(self.resync_margin.as_millis()).unwrap_or(i64::MAX);
        let record = ResyncRecord {
            token: lease.token,
            sequence: self.sequence.fetch_add(1, Ordering::Relaxed) + 1,
            floor_ms: self.engine.now().as_millis().saturating_add(margin),
            reason,
            by: self.instance.clone(),
        };
        let text = serde_json::to_string(&record).expect("a resync record serializes");
        match self
            .tier
            .write_capture_record(lease, CaptureRecord::Resync, &text)
            .await
        {
            Ok(true) => {}
            Ok(false) => return Err("the lease was lost before the resync".to_owned()),
            Err(error) => return Err(format!("the resync could not be announced: {error}")),
        }
        tracing::warn!(
            reason = record.reason.as_str(),
            "change capture cannot prove no change was missed: fleet-wide resync announced"
        );
        self.lock().resyncs_started += 1;
        self.apply_resync(record);
        Ok(())
    }

    async fn store_position(&self, lease: &CaptureLease, at: &Position) -> Result<(), String> {
        let text = serde_json::to_string(at).expect("a position serializes");
        match self
            .tier
            .write_capture_record(lease, CaptureRecord::Position, &text)
            .await
        {
            Ok(true) => {
                self.progressed.store(true, Ordering::Relaxed);
                self.lock().position = Some(at.to_string());
                Ok(())
            }
            Ok(false) => Err("the lease was lost; the position is the next reader's".to_owned()),
            Err(error) => Err(format!("the position could not be stored: {error}")),
        }
    }

    /// Publishes the events of a batch's changes; fails if any is refused (the batch is read
    /// and published again from the stored position).
    async fn publish(&self, changes: &[Anchored]) -> Result<(), String> {
        let mut events = Vec::with_capacity(changes.len());
        let mut unversioned = 0u64;
        for change in changes {
            let (planned, kept_version) = rows::plan(change.table, change.change);
            if kept_version {
                unversioned += 1;
                tracing::warn!(
                    table = change.table.name(),
                    anchor = change.anchor.as_str(),
                    "a row changed without a new version: its fence cannot displace a copy cached at that version"
                );
            }
            for (index, planned) in planned.into_iter().enumerate() {
                let id = event_id(&change.anchor, index);
                let event = InvalidationEvent::new(
                    id,
                    planned.kind,
                    planned.key.platform,
                    vec![planned.key.item_id],
                    planned.version,
                    Timestamp::now(),
                )
                .map_err(|error| format!("an event for {} is invalid: {error}", planned.key))?;
                events.push(event);
            }
        }
        let count = events.len();
        let outcomes: Vec<Result<(), String>> = futures::stream::iter(events)
            .map(|event| {
                let bus = self.events.clone();
                async move {
                    bus.publisher()
                        .publish(&event)
                        .await
                        .map_err(|error| error.to_string())
                }
            })
            .buffer_unordered(PUBLISH_CONCURRENCY)
            .collect()
            .await;
        let failures: Vec<String> = outcomes.into_iter().filter_map(Result::err).collect();
        if let Some(first) = failures.first() {
            return Err(format!(
                "{} of {} events not published: {first}",
                failures.len(),
                count
            ));
        }
        self.events_published
            .fetch_add(count as u64, Ordering::Relaxed);
        let mut status = self.lock();
        status.rows += changes.len() as u64;
        status.unversioned_rows += unversioned;
        Ok(())
    }
}

/// Aborts the task when dropped: the stream's reader ends with its follower.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Renews `lease` every third of `ttl`; cancels `lost` when it is no longer held, or when no
/// renewal succeeded for a whole `ttl` (Redis away: another instance may hold it by then).
async fn keep_lease(tier: RedisTier, lease: CaptureLease, ttl: Duration, lost: CancellationToken) {
    let mut renewed = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = lost.cancelled() => return,
            _ = tokio::time::sleep(ttl / 3) => {}
        }
        match tier.renew_capture_lease(&lease, ttl).await {
            Ok(true) => renewed = tokio::time::Instant::now(),
            Ok(false) => {
                tracing::warn!(
                    token = lease.token,
                    "change capture lease lost to another instance"
                );
                lost.cancel();
                return;
            }
            Err(error) => {
                if renewed.elapsed() >= ttl {
                    tracing::warn!(%error, "change capture lease not renewed for its whole life; reading stops");
                    lost.cancel();
                    return;
                }
            }
        }
    }
}

/// `binlog:<server_id>:<file>:<offset>:<row>[.<n>]`, the event id of the `n`th event of a row
/// change; a server and file that would not fit the id's alphabet or length are replaced by
/// their hash.
fn event_id(anchor: &str, index: usize) -> EventId {
    let suffix = if index == 0 {
        String::new()
    } else {
        format!(".{index}")
    };
    let plain = format!("{EVENT_ID_PREFIX}{anchor}{suffix}");
    EventId::parse(&plain).unwrap_or_else(|_| {
        use std::hash::{Hash, Hasher};
        let mut parts = anchor.rsplitn(3, ':');
        let (row, offset, file) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        file.hash(&mut hasher);
        let hashed = format!(
            "{EVENT_ID_PREFIX}{:016x}:{offset}:{row}{suffix}",
            hasher.finish()
        );
        EventId::parse(&hashed).unwrap_or_else(|_| EventId::generate())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_follow_the_log_and_fit_the_alphabet() {
        assert_eq!(
            event_id("1:mariadb-bin.000003:1654:2", 0).as_str(),
            "binlog:1:mariadb-bin.000003:1654:2"
        );
        assert_eq!(
            event_id("1:mariadb-bin.000003:1654:2", 1).as_str(),
            "binlog:1:mariadb-bin.000003:1654:2.1"
        );
        let odd = event_id("1:my log/with spaces.000001:99:0", 0);
        assert!(odd.as_str().starts_with("binlog:"), "{odd}");
        assert!(odd.as_str().ends_with(":99:0"), "{odd}");
        assert_eq!(odd, event_id("1:my log/with spaces.000001:99:0", 0));
        assert_ne!(odd, event_id("2:my log/with spaces.000001:99:0", 0));
        let long = event_id(&format!("1:{}:1:0", "x".repeat(80)), 0);
        assert!(long.as_str().len() <= EventId::MAX_LEN);
    }
}
