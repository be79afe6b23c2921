//! One listener's connection table: which connections are open, which of them wait idle for a
//! next request, and the deadline each must meet; the admission of a new connection (closing
//! the oldest idle one when the listener is full) and the watchdog's sweep, which closes a
//! connection that overran its deadline when its own task was not run in time.
//!
//! Why a table beside each connection's own timers: a connection's timers are enforced by its
//! task, and under overload a woken task waits its turn in the runtime's queues (seconds, when
//! the instance is far past its capacity). The table is read by the listener's accept thread,
//! which runs whatever the runtime's queues hold, and closes a connection by shutting its socket
//! down: the client sees the close at the deadline, and the task finds the socket closed when it
//! runs.
//!
//! Costs: a request moves its connection's slot with a few atomic stores (deadline, idle since);
//! the table's lock is taken once per connection (admission, release) and by the scans (an
//! eviction, a sweep every [`SWEEP_EVERY`] that found something to close).

use std::collections::HashMap;
use std::io::Write as _;
use std::net::{IpAddr, Shutdown};
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use rebate_resilience::Ticker;
use tokio::net::TcpStream;

use super::ConnectionStats;

/// How often the watchdog sweeps the table (the accept thread's wait for a connection).
pub(super) const SWEEP_EVERY: Duration = Duration::from_millis(10);
/// How long past a deadline the watchdog waits for the connection's own task to act (and answer
/// a 408 where it would) before it closes the connection itself. A deadline is thus enforced at
/// most `GRACE + SWEEP_EVERY` late, however busy the runtime.
pub(super) const GRACE: Duration = Duration::from_millis(20);
/// Slots held past `max_connections + probe_slots` by connections closed by the table whose tasks
/// have not yet run to release them (the logical count frees at once; the slot when the task
/// ends): this share of the table, at least [`MIN_HEADROOM`].
const HEADROOM_DIVISOR: usize = 8;
const MIN_HEADROOM: usize = 64;
/// Slots are allocated in pages of this many, as the table first grows into them.
const PAGE: usize = 1024;
/// `idle_since` of a connection claimed for closing (evicted, timed out, past a deadline).
const CLOSED: u64 = u64::MAX;
/// The low bits of a deadline word say which deadline it is; the rest is the time.
const KIND_BITS: u64 = 0b11;

/// What a connection's current deadline bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Deadline {
    /// The request head (from the accept or from its first byte).
    Head = 1,
    /// The request body (from the head).
    Body = 2,
    /// A write that makes no progress (a client that stopped reading), or, due at once, the
    /// close after an answer that ends the connection.
    Write = 3,
}

impl Deadline {
    fn of(word: u64) -> Self {
        match word & KIND_BITS {
            1 => Self::Head,
            2 => Self::Body,
            _ => Self::Write,
        }
    }

    /// Its place in [`ConnectionStats::watchdog_closes`].
    pub(super) fn index(self) -> usize {
        self as usize - 1
    }
}

/// What a connection may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotKind {
    /// One of the listener's `max_connections`.
    Regular,
    /// One of the slots beyond them kept for health probes: one request, probe paths only.
    Probe,
}

/// The table's bounds, from the listener's [`super::ConnectionLimits`].
#[derive(Debug, Clone)]
pub(super) struct TableLimits {
    pub(super) max_connections: usize,
    pub(super) max_per_peer: usize,
    pub(super) probe_slots: usize,
    pub(super) header_timeout: Duration,
    pub(super) probe_header_timeout: Duration,
    pub(super) idle_timeout: Duration,
    pub(super) idle_timeout_floor: Duration,
    pub(super) idle_shrink_from: f64,
    /// For the 408 the watchdog answers at a body deadline.
    pub(super) body_timeout: Duration,
}

impl TableLimits {
    /// The idle timeout at `open` regular connections: the configured one up to
    /// `idle_shrink_from` of `max_connections`, then shrinking in a straight line to the floor
    /// at a full listener (Envoy's overload manager scales its idle timer the same way).
    pub(super) fn idle_timeout_at(&self, open: usize) -> Duration {
        let floor = self.idle_timeout_floor.min(self.idle_timeout);
        let fill = open as f64 / self.max_connections.max(1) as f64;
        if fill <= self.idle_shrink_from || self.idle_shrink_from >= 1.0 {
            return self.idle_timeout;
        }
        let pressure = ((fill - self.idle_shrink_from) / (1.0 - self.idle_shrink_from)).min(1.0);
        self.idle_timeout - (self.idle_timeout - floor).mul_f64(pressure)
    }
}

/// The outcome of [`ConnectionTable::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admission {
    Admitted { slot: u32, kind: SlotKind },
    ListenerFull,
    PeerFull,
}

/// One connection's slot. The atomics are written by the connection's task and read by the
/// sweep and the eviction scan; `owner` changes under the table's lock only.
#[derive(Debug, Default)]
struct Slot {
    /// Ticker nanoseconds at which the connection's current deadline passes, its kind in the
    /// low bits ([`Deadline`]); 0: none.
    deadline: AtomicU64,
    /// Since when (ticker nanoseconds) the connection has waited for a next request with its last
    /// response flushed and no byte of a next one read; 0: busy (or free); [`CLOSED`] once the
    /// table claimed it for closing.
    idle_since: AtomicU64,
    /// A key of the peer's address (exact for IPv4) for the per-address eviction scan.
    peer_key: AtomicU64,
    /// Who answers the request being served: nobody yet, its task ([`ANSWER_TASK`]), or the
    /// watchdog ([`ANSWER_WATCHDOG`], a 408 at the body deadline). One answer, never two
    /// interleaved.
    answer: AtomicU8,
    owner: Mutex<Option<Owner>>,
}

const ANSWER_TASK: u8 = 1;
const ANSWER_WATCHDOG: u8 = 2;

#[derive(Debug)]
struct Owner {
    /// Weak: the socket closes when the connection's task drops it, whatever the table holds.
    stream: Weak<TcpStream>,
    peer: IpAddr,
    kind: SlotKind,
    /// Still counted in the open counts: until the table closes it or its task ends.
    counted: bool,
}

/// What changes once per connection, under one lock.
#[derive(Debug, Default)]
struct Counts {
    regular: usize,
    probe: usize,
    per_peer: HashMap<IpAddr, usize>,
    /// Released slots, reused first (most recently released last).
    free: Vec<u32>,
    /// Slots below this index have been handed out at least once.
    used: u32,
}

/// The connection table of one listener.
#[derive(Debug)]
pub(super) struct ConnectionTable {
    limits: TableLimits,
    stats: Arc<ConnectionStats>,
    ticker: Arc<dyn Ticker>,
    pages: Box<[OnceLock<Box<[Slot]>>]>,
    capacity: u32,
    counts: Mutex<Counts>,
    /// Slots idle now (`idle_since` a time): an admission at a full listener scans the table for
    /// the oldest only when there is one, so a flood of connections at a table full of busy ones
    /// costs the accept thread no scan each.
    idle_count: AtomicUsize,
}

impl ConnectionTable {
    pub(super) fn new(
        limits: TableLimits,
        stats: Arc<ConnectionStats>,
        ticker: Arc<dyn Ticker>,
    ) -> Self {
        let logical = limits.max_connections + limits.probe_slots;
        let capacity = logical + (logical / HEADROOM_DIVISOR).max(MIN_HEADROOM);
        let capacity = u32::try_from(capacity).unwrap_or(u32::MAX);
        let pages = (capacity as usize).div_ceil(PAGE);
        stats
            .idle_timeout_ms
            .store(millis(limits.idle_timeout), Ordering::Relaxed);
        Self {
            limits,
            stats,
            ticker,
            pages: (0..pages).map(|_| OnceLock::new()).collect(),
            capacity,
            counts: Mutex::new(Counts::default()),
            idle_count: AtomicUsize::new(0),
        }
    }

    pub(super) fn now(&self) -> u64 {
        self.ticker.now_nanos()
    }

    /// The idle timeout a connection that goes idle now gets.
    pub(super) fn idle_timeout_now(&self) -> Duration {
        let open = self.stats.open.load(Ordering::Relaxed);
        self.limits
            .idle_timeout_at(usize::try_from(open).unwrap_or(usize::MAX))
    }

    fn slot(&self, index: u32) -> &Slot {
        let index = index as usize;
        let page = self.pages[index / PAGE].get_or_init(|| {
            (0..PAGE)
                .map(|_| Slot::default())
                .collect::<Vec<_>>()
                .into_boxed_slice()
        });
        &page[index % PAGE]
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.counts
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Admits a connection from `peer`: one of the regular slots, else (the listener full) the
    /// slot of the oldest idle connection, closed for it, else a probe slot, else none. At the
    /// per-address cap the oldest idle connection of the same address makes room, or none.
    pub(super) fn admit(&self, peer: IpAddr) -> Admission {
        let mut counts = self.lock();
        let limits = &self.limits;
        if limits.max_per_peer > 0
            && counts.per_peer.get(&peer).copied().unwrap_or(0) >= limits.max_per_peer
            && !self.evict_oldest_idle(&mut counts, Some(peer))
        {
            return Admission::PeerFull;
        }
        let kind = if counts.regular < limits.max_connections
            || self.evict_oldest_idle(&mut counts, None)
        {
            SlotKind::Regular
        } else if counts.probe < limits.probe_slots {
            SlotKind::Probe
        } else {
            return Admission::ListenerFull;
        };
        let index = match counts.free.pop() {
            Some(index) => index,
            None if counts.used < self.capacity => {
                counts.used += 1;
                counts.used - 1
            }
            // Every slot is held by a connection closed by the table whose task has not run
            // since: the runtime is far behind, and one more connection would only wait too.
            None => return Admission::ListenerFull,
        };
        match kind {
            SlotKind::Regular => counts.regular += 1,
            SlotKind::Probe => counts.probe += 1,
        }
        if limits.max_per_peer > 0 {
            *counts.per_peer.entry(peer).or_insert(0) += 1;
        }
        let now = self.now();
        let header_timeout = match kind {
            SlotKind::Regular => limits.header_timeout,
            SlotKind::Probe => limits.probe_header_timeout,
        };
        let slot = self.slot(index);
        slot.deadline.store(
            deadline_word(now, header_timeout, Deadline::Head),
            Ordering::Release,
        );
        slot.idle_since.store(0, Ordering::Release);
        slot.answer.store(0, Ordering::Release);
        slot.peer_key.store(peer_key(peer), Ordering::Relaxed);
        *lock_owner(slot) = Some(Owner {
            stream: Weak::new(),
            peer,
            kind,
            counted: true,
        });
        self.publish_open(&counts);
        Admission::Admitted { slot: index, kind }
    }

    /// Tells the table the socket of `index`, for closing it.
    pub(super) fn attach(&self, index: u32, stream: Weak<TcpStream>) {
        if let Some(owner) = lock_owner(self.slot(index)).as_mut() {
            owner.stream = stream;
        }
    }

    /// Frees `index`: its connection's task has ended.
    pub(super) fn release(&self, index: u32) {
        let mut counts = self.lock();
        let slot = self.slot(index);
        if let Some(owner) = lock_owner(slot).take()
            && owner.counted
        {
            uncount(&mut counts, &owner, self.limits.max_per_peer);
        }
        slot.deadline.store(0, Ordering::Release);
        let since = slot.idle_since.swap(0, Ordering::AcqRel);
        if since != 0 && since != CLOSED {
            self.idle_left();
        }
        slot.peer_key.store(0, Ordering::Relaxed);
        counts.free.push(index);
        self.publish_open(&counts);
    }

    /// Sets (or with `None` clears) the deadline of `index`: `after` from `since` (ticker
    /// nanoseconds; now when `None`).
    pub(super) fn set_deadline(
        &self,
        index: u32,
        deadline: Option<(Duration, Deadline)>,
        since: Option<u64>,
    ) {
        let word = deadline.map_or(0, |(after, kind)| {
            deadline_word(since.unwrap_or_else(|| self.now()), after, kind)
        });
        self.slot(index).deadline.store(word, Ordering::Release);
    }

    /// Clears the deadline of `index` if it is of `kind`.
    pub(super) fn clear_deadline(&self, index: u32, kind: Deadline) {
        let slot = self.slot(index);
        let word = slot.deadline.load(Ordering::Acquire);
        if word != 0 && Deadline::of(word) == kind {
            let _ = slot
                .deadline
                .compare_exchange(word, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// A new request on `index`: nobody answers it yet.
    pub(super) fn begin_request(&self, index: u32) {
        self.slot(index).answer.store(0, Ordering::Release);
    }

    /// The task begins the answer of the request on `index`: `false` when the watchdog has
    /// answered it already (then the task must not write).
    pub(super) fn claim_answer(&self, index: u32) -> bool {
        match self.slot(index).answer.compare_exchange(
            0,
            ANSWER_TASK,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => true,
            Err(holder) => holder == ANSWER_TASK,
        }
    }

    /// Marks `index` idle (evictable) from now, unless it already is or was closed.
    pub(super) fn publish_idle(&self, index: u32) {
        let published = self.slot(index).idle_since.compare_exchange(
            0,
            self.now(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        if published.is_ok() {
            self.idle_count.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// One slot fewer idle (it left idle, or was claimed while idle).
    fn idle_left(&self) {
        let before = self.idle_count.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before > 0, "more idle slots left than were idle");
    }

    /// `index` is no longer idle (a byte of a next request came): `false` when the table had
    /// already claimed it for closing, and it must close.
    pub(super) fn leave_idle(&self, index: u32) -> bool {
        let slot = self.slot(index);
        let since = slot.idle_since.load(Ordering::Acquire);
        if since == CLOSED {
            return false;
        }
        if since == 0 {
            return true;
        }
        let left = slot
            .idle_since
            .compare_exchange(since, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if left {
            self.idle_left();
        }
        left
    }

    /// Whether the table claimed `index` for closing.
    pub(super) fn is_closed(&self, index: u32) -> bool {
        self.slot(index).idle_since.load(Ordering::Acquire) == CLOSED
    }

    /// The connection's own idle timer fired: claims it (the close is counted once, by whoever
    /// claims it first).
    pub(super) fn claim_idle_timeout(&self, index: u32) {
        let since = self.slot(index).idle_since.swap(CLOSED, Ordering::AcqRel);
        if since != CLOSED {
            if since != 0 {
                self.idle_left();
            }
            self.stats
                .idle_timeout_closes
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The oldest idle connection (of `peer`, when given) and since when it is idle.
    fn oldest_idle(&self, peer: Option<IpAddr>) -> Option<(u32, u64)> {
        if self.idle_count.load(Ordering::Acquire) == 0 {
            return None;
        }
        let key = peer.map(peer_key);
        let used = self.scanned();
        let mut oldest: Option<(u32, u64)> = None;
        for index in 0..used {
            let slot = self.slot(index);
            let since = slot.idle_since.load(Ordering::Acquire);
            if since == 0 || since == CLOSED {
                continue;
            }
            if key.is_some_and(|key| slot.peer_key.load(Ordering::Relaxed) != key) {
                continue;
            }
            if oldest.is_none_or(|(_, oldest_since)| since < oldest_since) {
                oldest = Some((index, since));
            }
        }
        let (index, since) = oldest?;
        // The key of an IPv6 address is a hash: confirm the address.
        if let Some(peer) = peer
            && lock_owner(self.slot(index))
                .as_ref()
                .is_none_or(|owner| owner.peer != peer)
        {
            return None;
        }
        Some((index, since))
    }

    /// The slots a scan reads: those of the pages allocated so far (slots are handed out from
    /// the lowest index up, so pages fill in order; a slot handed out during a scan is not idle
    /// yet, nor near its deadline).
    fn scanned(&self) -> u32 {
        let pages = self
            .pages
            .iter()
            .take_while(|page| page.get().is_some())
            .count();
        u32::try_from((pages * PAGE).min(self.capacity as usize)).unwrap_or(u32::MAX)
    }

    /// Closes the oldest idle connection (of `peer`, when given) to make room; `false` when none
    /// is idle. Called with the lock held.
    fn evict_oldest_idle(&self, counts: &mut Counts, peer: Option<IpAddr>) -> bool {
        // A connection that leaves idle between the scan and the claim is skipped; bounded,
        // since a busy table must not hold the accept thread.
        for _ in 0..4 {
            let Some((index, since)) = self.oldest_idle(peer) else {
                return false;
            };
            if self
                .slot(index)
                .idle_since
                .compare_exchange(since, CLOSED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.idle_left();
                self.close_claimed(counts, index, Closing::EvictedForNew);
                return true;
            }
        }
        false
    }

    /// Uncounts a connection the table claimed, counts why, and shuts its socket down: the
    /// client sees the close now (after the counters say so), the connection's task sees it when
    /// it next runs.
    fn close_claimed(&self, counts: &mut Counts, index: u32, why: Closing) {
        // At a body deadline the client is owed a 408, as the edge would have answered, if the
        // task has not begun an answer of its own.
        let farewell = matches!(why, Closing::Late(Deadline::Body))
            && self
                .slot(index)
                .answer
                .compare_exchange(0, ANSWER_WATCHDOG, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        let stats = &self.stats;
        match why {
            Closing::EvictedForNew => {
                stats.evicted_for_new.fetch_add(1, Ordering::Relaxed);
            }
            Closing::IdleTimeout => {
                stats.idle_timeout_closes.fetch_add(1, Ordering::Relaxed);
                stats.watchdog_closes[WATCHDOG_IDLE].fetch_add(1, Ordering::Relaxed);
            }
            Closing::Late(deadline) => {
                stats.watchdog_closes[deadline.index()].fetch_add(1, Ordering::Relaxed);
            }
        }
        let slot = self.slot(index);
        slot.deadline.store(0, Ordering::Release);
        let mut owner = lock_owner(slot);
        let Some(owner) = owner.as_mut() else {
            return;
        };
        if owner.counted {
            owner.counted = false;
            uncount(counts, owner, self.limits.max_per_peer);
            self.publish_open(counts);
        }
        let Some(stream) = owner.stream.upgrade() else {
            return;
        };
        let socket = socket2::SockRef::from(&*stream);
        // Errors: the peer closed the socket already.
        if farewell {
            // Straight to the socket (never blocking: its send buffer is idle while a body is
            // awaited), then the end of the stream; the read side stays open, so that the
            // bytes the client is still sending do not turn the close into a reset that could
            // discard the answer. The task ends the connection when it runs.
            let _ = (&*socket).write_all(&request_timeout(self.limits.body_timeout));
            let _ = socket.shutdown(Shutdown::Write);
        } else {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }

    fn publish_open(&self, counts: &Counts) {
        self.stats
            .open
            .store((counts.regular + counts.probe) as u64, Ordering::Relaxed);
    }

    /// The watchdog: closes the connections past their deadline by [`GRACE`] (their task was
    /// not run in time) and the idle ones past the idle timeout of the moment (it shrinks as the
    /// listener fills, for connections already idle too); records the idle gauges.
    pub(super) fn sweep(&self) {
        let now = self.now();
        let idle_timeout = self.idle_timeout_now();
        let idle_limit = nanos(idle_timeout + GRACE);
        let grace = nanos(GRACE);
        let used = self.scanned();
        let mut idle = 0_u64;
        let mut due = Vec::new();
        for index in 0..used {
            let slot = self.slot(index);
            let since = slot.idle_since.load(Ordering::Acquire);
            if since == CLOSED {
                continue;
            }
            if since != 0 {
                idle += 1;
                if now.saturating_sub(since) >= idle_limit {
                    due.push((index, Due::Idle(since)));
                }
                continue;
            }
            let word = slot.deadline.load(Ordering::Acquire);
            if word != 0 && now >= (word & !KIND_BITS).saturating_add(grace) {
                due.push((index, Due::Deadline(word)));
            }
        }
        self.stats.idle.store(idle, Ordering::Relaxed);
        self.stats
            .idle_timeout_ms
            .store(millis(idle_timeout), Ordering::Relaxed);
        if due.is_empty() {
            return;
        }
        let mut counts = self.lock();
        for (index, due) in due {
            let slot = self.slot(index);
            match due {
                Due::Idle(since) => {
                    if slot
                        .idle_since
                        .compare_exchange(since, CLOSED, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                    {
                        self.idle_left();
                        self.close_claimed(&mut counts, index, Closing::IdleTimeout);
                    }
                }
                Due::Deadline(word) => {
                    let claimed = slot
                        .deadline
                        .compare_exchange(word, 0, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                        && slot
                            .idle_since
                            .compare_exchange(0, CLOSED, Ordering::AcqRel, Ordering::Relaxed)
                            .is_ok();
                    if claimed {
                        self.close_claimed(&mut counts, index, Closing::Late(Deadline::of(word)));
                    }
                }
            }
        }
    }
}

/// A connection's slot, held by its task and released when the task ends.
#[derive(Debug)]
pub(super) struct SlotGuard {
    table: Arc<ConnectionTable>,
    index: u32,
    /// When the connection was admitted (ticker nanoseconds).
    accepted_at: u64,
}

impl SlotGuard {
    pub(super) fn new(table: Arc<ConnectionTable>, index: u32) -> Self {
        let accepted_at = table.now();
        Self {
            table,
            index,
            accepted_at,
        }
    }

    pub(super) fn attach(&self, stream: Weak<TcpStream>) {
        self.table.attach(self.index, stream);
    }

    /// The connection's task has begun.
    pub(super) fn started(&self) {
        self.table.stats.started.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn idle_timeout_now(&self) -> Duration {
        self.table.idle_timeout_now()
    }

    pub(super) fn set_deadline(&self, deadline: Option<(Duration, Deadline)>) {
        self.table.set_deadline(self.index, deadline, None);
    }

    pub(super) fn begin_request(&self) {
        self.table.begin_request(self.index);
    }

    pub(super) fn claim_answer(&self) -> bool {
        self.table.claim_answer(self.index)
    }

    /// Sets a deadline `after` the ticker time `since`.
    pub(super) fn set_deadline_since(&self, since: u64, after: Duration, kind: Deadline) {
        self.table
            .set_deadline(self.index, Some((after, kind)), Some(since));
    }

    /// When the connection was admitted (ticker nanoseconds).
    pub(super) fn accepted_at(&self) -> u64 {
        self.accepted_at
    }

    /// The table's clock (ticker nanoseconds).
    pub(super) fn now(&self) -> u64 {
        self.table.now()
    }

    pub(super) fn ticker(&self) -> Arc<dyn Ticker> {
        Arc::clone(&self.table.ticker)
    }

    pub(super) fn clear_deadline(&self, kind: Deadline) {
        self.table.clear_deadline(self.index, kind);
    }

    pub(super) fn publish_idle(&self) {
        self.table.publish_idle(self.index);
    }

    pub(super) fn leave_idle(&self) -> bool {
        self.table.leave_idle(self.index)
    }

    pub(super) fn is_closed(&self) -> bool {
        self.table.is_closed(self.index)
    }

    pub(super) fn claim_idle_timeout(&self) {
        self.table.claim_idle_timeout(self.index);
    }

    /// A request on a probe slot was not a probe.
    pub(super) fn probe_refused(&self) {
        self.table
            .stats
            .probe_refused
            .fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.table.release(self.index);
    }
}

/// Index of the idle closes in [`ConnectionStats::watchdog_closes`], after the [`Deadline`]s.
pub(super) const WATCHDOG_IDLE: usize = 3;

enum Due {
    Idle(u64),
    Deadline(u64),
}

/// Why the table closes a connection.
#[derive(Debug, Clone, Copy)]
enum Closing {
    EvictedForNew,
    /// Idle past the idle timeout of the moment (shrunk, or its task late).
    IdleTimeout,
    /// Past a deadline by the grace, its task not having acted.
    Late(Deadline),
}

fn uncount(counts: &mut Counts, owner: &Owner, max_per_peer: usize) {
    match owner.kind {
        SlotKind::Regular => counts.regular -= 1,
        SlotKind::Probe => counts.probe -= 1,
    }
    if max_per_peer > 0
        && let Some(count) = counts.per_peer.get_mut(&owner.peer)
    {
        *count -= 1;
        if *count == 0 {
            counts.per_peer.remove(&owner.peer);
        }
    }
}

/// The `408 request_timeout` the watchdog answers at a body deadline: the edge's error shape
/// (`http::error`), with a trace id of its own.
fn request_timeout(timeout: Duration) -> Vec<u8> {
    let trace_id = rebate_telemetry::TraceId::generate();
    let body = serde_json::json!({
        "error": {
            "code": rebate_domain::ErrorCode::RequestTimeout,
            "message": format!("the request body did not arrive within {} ms", millis(timeout)),
        },
        "trace_id": trace_id,
    })
    .to_string();
    format!(
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nx-trace-id: {trace_id}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn lock_owner(slot: &Slot) -> MutexGuard<'_, Option<Owner>> {
    slot.owner
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
}

fn deadline_word(now: u64, after: Duration, kind: Deadline) -> u64 {
    // Never 0 (the ticker starts at 1 s), and the kind in the low bits.
    (now.saturating_add(nanos(after)) & !KIND_BITS) | kind as u64
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// An IPv4 address itself (tagged), an IPv6 address's hash.
fn peer_key(peer: IpAddr) -> u64 {
    match peer {
        IpAddr::V4(v4) => u64::from(u32::from(v4)) | 1 << 32,
        IpAddr::V6(v6) => {
            use std::hash::{BuildHasher as _, BuildHasherDefault};
            BuildHasherDefault::<std::hash::DefaultHasher>::default().hash_one(v6) | 1 << 63
        }
    }
}

#[cfg(test)]
mod tests {
    use rebate_resilience::ManualTicker;

    use super::*;

    fn table(max: usize, per_peer: usize) -> (Arc<ConnectionTable>, ManualTicker) {
        let ticker = ManualTicker::new();
        let limits = TableLimits {
            max_connections: max,
            max_per_peer: per_peer,
            probe_slots: 1,
            header_timeout: Duration::from_secs(5),
            probe_header_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(60),
            idle_timeout_floor: Duration::from_secs(2),
            idle_shrink_from: 0.5,
            body_timeout: Duration::from_secs(5),
        };
        let table = ConnectionTable::new(
            limits,
            Arc::new(ConnectionStats::default()),
            Arc::new(ticker.clone()),
        );
        (Arc::new(table), ticker)
    }

    fn admitted(table: &Arc<ConnectionTable>, peer: &str) -> SlotGuard {
        match table.admit(peer.parse().unwrap()) {
            Admission::Admitted {
                slot,
                kind: SlotKind::Regular,
            } => SlotGuard::new(Arc::clone(table), slot),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_idle_timeout_shrinks_in_a_straight_line_past_its_share() {
        let (table, _) = table(4, 0);
        let at = |open| table.limits.idle_timeout_at(open);
        assert_eq!(at(0), Duration::from_secs(60));
        assert_eq!(at(2), Duration::from_secs(60), "half full: not yet");
        assert_eq!(at(3), Duration::from_secs(31), "three quarters: half way");
        assert_eq!(at(4), Duration::from_secs(2), "full: the floor");
        assert_eq!(at(9), Duration::from_secs(2), "never below the floor");
    }

    #[test]
    fn a_full_table_closes_its_oldest_idle_connection_for_a_new_one() {
        let (table, ticker) = table(2, 0);
        let first = admitted(&table, "10.0.0.1");
        let second = admitted(&table, "10.0.0.2");
        second.publish_idle();
        ticker.advance(Duration::from_millis(1));
        first.publish_idle();
        let third = admitted(&table, "10.0.0.3");
        assert!(second.is_closed(), "the one idle longest made room");
        assert!(!first.is_closed());
        let snapshot = table.stats.snapshot();
        assert_eq!(snapshot.idle_closes.evicted_for_new, 1);
        assert_eq!(snapshot.open, 2, "the evicted one is uncounted at once");
        // No idle connection left: the fourth takes the probe slot, the fifth is refused.
        assert!(first.leave_idle());
        assert!(matches!(
            table.admit("10.0.0.4".parse().unwrap()),
            Admission::Admitted {
                kind: SlotKind::Probe,
                ..
            }
        ));
        assert_eq!(
            table.admit("10.0.0.5".parse().unwrap()),
            Admission::ListenerFull
        );
        drop((first, second, third));
    }

    #[test]
    fn a_busy_connection_is_never_evicted() {
        let (table, _) = table(1, 0);
        let busy = admitted(&table, "10.0.0.1");
        busy.publish_idle();
        // A byte of a next request came: no longer evictable.
        assert!(busy.leave_idle());
        assert!(matches!(
            table.admit("10.0.0.2".parse().unwrap()),
            Admission::Admitted {
                kind: SlotKind::Probe,
                ..
            }
        ));
        assert!(!busy.is_closed());
        assert_eq!(table.stats.snapshot().idle_closes.evicted_for_new, 0);
    }

    #[test]
    fn an_address_at_its_cap_replaces_its_own_oldest_idle_connection() {
        let (table, _) = table(10, 2);
        let first = admitted(&table, "10.0.0.1");
        let second = admitted(&table, "10.0.0.1");
        let other = admitted(&table, "10.0.0.2");
        other.publish_idle();
        assert_eq!(
            table.admit("10.0.0.1".parse().unwrap()),
            Admission::PeerFull,
            "none of its own idle: another address's idle one is not taken"
        );
        first.publish_idle();
        let third = admitted(&table, "10.0.0.1");
        assert!(first.is_closed() && !other.is_closed());
        assert_eq!(
            table.idle_count.load(Ordering::Acquire),
            1,
            "the other address's"
        );
        drop((first, second, third, other));
        assert_eq!(table.idle_count.load(Ordering::Acquire), 0);
        let counts = table.lock();
        assert!(counts.per_peer.is_empty(), "{:?}", counts.per_peer);
        assert_eq!((counts.regular, counts.probe), (0, 0));
    }

    /// A per-address cap of 0 is no cap (behind a load balancer): nothing is counted per
    /// address, so one address may take every slot.
    #[test]
    fn a_per_address_cap_of_zero_counts_nothing() {
        let (table, _) = table(3, 0);
        let held: Vec<_> = (0..3).map(|_| admitted(&table, "10.0.0.1")).collect();
        assert!(table.lock().per_peer.is_empty());
        drop(held);
        assert_eq!(table.lock().regular, 0);
    }

    #[test]
    fn the_watchdog_closes_past_the_deadline_and_grace_only() {
        let (table, ticker) = table(4, 0);
        let slot = admitted(&table, "10.0.0.1");
        // The head deadline set at admission: 5 s.
        ticker.advance(Duration::from_secs(5) + GRACE - Duration::from_millis(1));
        table.sweep();
        assert!(!slot.is_closed());
        ticker.advance(Duration::from_millis(2));
        table.sweep();
        assert!(slot.is_closed());
        let snapshot = table.stats.snapshot();
        assert_eq!(snapshot.watchdog_closes.head, 1);
        assert_eq!(snapshot.open, 0);

        // A body deadline cleared in time is never acted on.
        let slot = admitted(&table, "10.0.0.1");
        slot.set_deadline(Some((Duration::from_secs(5), Deadline::Body)));
        slot.clear_deadline(Deadline::Body);
        ticker.advance(Duration::from_secs(60));
        table.sweep();
        assert!(!slot.is_closed());
        assert_eq!(table.stats.snapshot().watchdog_closes.body, 0);
    }

    #[test]
    fn the_watchdog_closes_idle_connections_past_the_timeout_of_the_moment() {
        let (table, ticker) = table(4, 0);
        let idle = admitted(&table, "10.0.0.1");
        idle.set_deadline(None);
        idle.publish_idle();
        ticker.advance(Duration::from_secs(10));
        table.sweep();
        assert!(!idle.is_closed(), "60 s at one of four open");
        assert_eq!(table.stats.snapshot().idle, 1);
        // The listener fills: the idle timeout is 2 s now, and this one has idled 10.
        let others: Vec<_> = (2..5)
            .map(|last| admitted(&table, &format!("10.0.0.{last}")))
            .collect();
        table.sweep();
        assert!(idle.is_closed());
        assert_eq!(table.idle_count.load(Ordering::Acquire), 0);
        let snapshot = table.stats.snapshot();
        assert_eq!(snapshot.idle_closes.idle_timeout, 1);
        assert_eq!(snapshot.watchdog_closes.idle, 1);
        drop(others);
    }
}
