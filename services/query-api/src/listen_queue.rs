//! The kernel's accept queue of a listening socket, read through the socket diagnostics netlink
//! interface (what `ss -lnt` shows as Recv-Q and Send-Q for a listener).
//!
//! Contract: [`ListenQueue::open`] finds the listener by its socket inode; [`ListenQueue::read`]
//! answers how many connections have completed their handshake and wait for the service's
//! `accept`, the backlog the kernel holds them up to and how many handshakes it dropped at a full
//! queue, in one request and one reply (a few microseconds: the kernel looks the listener up by
//! its address, as for an incoming connection). Linux only: elsewhere `open` answers
//! `Unsupported` and the caller does without.
//!
//! Why it matters: a connection in that queue waits where nothing in the process can see it.
//! When the service's own threads are saturated, new connections pile up there while the
//! requests the runtime has already taken in finish in a millisecond; the queue's length over
//! the accept rate is the time they wait (see `background::probe_queue_delay`).
//!
//! Written here rather than taken from the netlink crates (`netlink-sys`,
//! `netlink-packet-sock-diag` and their packet-core crates): one fixed-layout 72-byte request and
//! a fixed-layout reply do not need five crates, and `socket2` (already in the tree through
//! tokio) opens the netlink socket without `unsafe`.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::server::ConnectionStats;

/// The longest wait an estimate reports: past it the figure says nothing more.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// A client whose SYN the kernel dropped sends it again this long later (Linux's initial
/// retransmission timeout; RFC 6298 allows 1 s): the least a dropped connection waits.
const SYN_RETRY: Duration = Duration::from_secs(1);

/// One reading of a listener's accept queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueReading {
    /// Connections whose handshake completed, waiting for `accept`.
    pub queued: u32,
    /// The most the kernel queues before it drops new handshakes (the backlog asked for, capped
    /// by `net.core.somaxconn`).
    pub backlog: u32,
    /// Handshakes the kernel dropped because the queue was full, since the listener opened
    /// (the socket's drop counter; it wraps at 2³²). Each such client retries its SYN a second
    /// later (then 3 s, 7 s, …).
    pub dropped: u32,
}

/// A netlink socket that reads one listener's accept queue.
#[derive(Debug)]
pub struct ListenQueue {
    #[cfg(target_os = "linux")]
    inner: linux::Reader,
}

impl ListenQueue {
    /// Finds `listener` for later readings. Fails where the netlink socket cannot be opened
    /// (not Linux, a sandbox without `AF_NETLINK`) or the listener's inode cannot be read.
    pub fn open(listener: &TcpListener) -> io::Result<Self> {
        #[cfg(target_os = "linux")]
        {
            Ok(Self {
                inner: linux::Reader::open(listener)?,
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = listener;
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the accept queue is read through Linux's socket diagnostics",
            ))
        }
    }

    /// The listener's queue now. `NotFound` when the kernel no longer lists it (closed).
    pub fn read(&self) -> io::Result<QueueReading> {
        #[cfg(target_os = "linux")]
        {
            self.inner.read()
        }
        #[cfg(not(target_os = "linux"))]
        {
            Err(io::Error::from(io::ErrorKind::Unsupported))
        }
    }
}

/// The time connections wait to be accepted, estimated at each reading and recorded in the
/// listener's [`ConnectionStats`] (see [`estimated_wait`]) or, for a second after the kernel
/// last dropped a handshake because the queue was full, a second: the dropped clients' SYNs
/// come back no sooner. Under overload the queue fills, overflows and drains in waves as those retries
/// arrive together; the drops keep the wait standing between the waves.
///
/// The listener's accept thread (`crate::server`) takes connections off the kernel's queue at
/// once, whatever the runtime's load: a saturated instance's new connections then wait in the
/// runtime's queue for their task's first poll instead. That second queue (accepted, not yet
/// started) is estimated the same way, and the larger of the two waits is the one reported.
#[derive(Debug)]
pub struct AcceptWait {
    queue: ListenQueue,
    connections: Arc<ConnectionStats>,
    dequeued: u64,
    read_at: Instant,
    /// The queue's length at the last reading.
    queued: u32,
    /// How long the queue had stood with nothing taken off it, up to the last reading.
    stalled: Duration,
    /// The kernel's drop counter at the last reading (`None` before the first).
    dropped: Option<u32>,
    /// Drops seen since this probe started.
    total_dropped: u64,
    last_drop_at: Option<Instant>,
    failing: bool,
    /// Accepted connections whose task had not begun, and those whose task had, at the last
    /// reading; and how long that queue had stood with none begun.
    awaiting_start: u64,
    started: u64,
    start_stalled: Duration,
}

impl AcceptWait {
    /// `connections` must be the stats of the loop that accepts from `queue`'s listener. Takes
    /// a first reading, so the stats show the queue from the start.
    pub fn new(queue: ListenQueue, connections: Arc<ConnectionStats>) -> Self {
        let mut wait = Self {
            dequeued: connections.dequeued(),
            read_at: Instant::now(),
            queued: 0,
            stalled: Duration::ZERO,
            queue,
            connections,
            dropped: None,
            total_dropped: 0,
            last_drop_at: None,
            failing: false,
            awaiting_start: 0,
            started: 0,
            start_stalled: Duration::ZERO,
        };
        wait.sample();
        wait
    }

    /// Reads the queue and returns the estimated wait, or `None` when the read failed (logged
    /// once until a read succeeds again).
    pub fn sample(&mut self) -> Option<Duration> {
        let now = Instant::now();
        let dequeued = self.connections.dequeued();
        let reading = match self.queue.read() {
            Ok(reading) => reading,
            Err(error) => {
                if !self.failing {
                    tracing::warn!(%error, "cannot read the listener's accept queue");
                }
                self.failing = true;
                return None;
            }
        };
        if self.failing {
            tracing::info!("the listener's accept queue reads again");
            self.failing = false;
        }
        let (queued_wait, stalled) = estimated_wait(
            Period {
                queued_before: self.queued,
                queued: reading.queued,
                dequeued: dequeued.saturating_sub(self.dequeued),
                elapsed: now.saturating_duration_since(self.read_at),
            },
            self.stalled,
        );
        self.queued = reading.queued;
        self.stalled = stalled;
        let new_drops = self
            .dropped
            .map_or(0, |before| reading.dropped.wrapping_sub(before));
        self.dropped = Some(reading.dropped);
        if new_drops > 0 {
            self.total_dropped += u64::from(new_drops);
            self.last_drop_at = Some(now);
        }
        let retrying = self
            .last_drop_at
            .is_some_and(|at| now.saturating_duration_since(at) < SYN_RETRY);
        let (awaiting_start, started) = self.connections.awaiting_start();
        let (start_wait, start_stalled) = estimated_wait(
            Period {
                queued_before: saturating_u32(self.awaiting_start),
                queued: saturating_u32(awaiting_start),
                dequeued: started.saturating_sub(self.started),
                elapsed: now.saturating_duration_since(self.read_at),
            },
            self.start_stalled,
        );
        (self.awaiting_start, self.started, self.start_stalled) =
            (awaiting_start, started, start_stalled);
        let wait = if retrying {
            queued_wait.max(SYN_RETRY)
        } else {
            queued_wait
        }
        .max(start_wait);
        self.dequeued = dequeued;
        self.read_at = now;
        self.connections.record_listen_queue(
            reading.queued,
            reading.backlog,
            self.total_dropped,
            wait,
        );
        Some(wait)
    }
}

fn saturating_u32(count: u64) -> u32 {
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// One period between two readings of the accept queue.
#[derive(Debug, Clone, Copy)]
pub struct Period {
    /// The queue's length at the reading before.
    pub queued_before: u32,
    /// Its length now.
    pub queued: u32,
    /// Connections the service took off it in the period.
    pub dequeued: u64,
    pub elapsed: Duration,
}

/// The wait of the connections in the queue at the end of `period`, and how long the queue has
/// stood with nothing taken off it (`stalled`: the last call's, then this one's):
/// - an empty queue: none;
/// - connections taken off it: Little's law, `queued × elapsed ÷ dequeued` (the last of them
///   waits that long at the rate the service took them);
/// - nothing taken off a queue that was empty at the reading before: its connections arrived in
///   the period, half of it ago on average;
/// - nothing taken off a queue that already stood: the time it has stood with nothing taken off,
///   which its oldest connection waited at least.
///
/// At most 60 s.
pub fn estimated_wait(period: Period, stalled: Duration) -> (Duration, Duration) {
    let Period {
        queued_before,
        queued,
        dequeued,
        elapsed,
    } = period;
    let (wait, stalled) = if queued == 0 {
        (Duration::ZERO, Duration::ZERO)
    } else if dequeued > 0 {
        let per_connection = elapsed.as_secs_f64() / dequeued as f64;
        let wait = (per_connection * f64::from(queued)).min(MAX_WAIT.as_secs_f64());
        (Duration::from_secs_f64(wait), Duration::ZERO)
    } else if queued_before == 0 {
        (elapsed / 2, elapsed / 2)
    } else {
        let stood = stalled.saturating_add(elapsed);
        (stood, stood)
    };
    (wait.min(MAX_WAIT), stalled.min(MAX_WAIT))
}

#[cfg(target_os = "linux")]
mod linux {
    use std::io::{self, Read as _};
    use std::os::fd::AsRawFd as _;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use socket2::{Domain, Protocol, Socket, Type};
    use tokio::net::TcpListener;

    use super::QueueReading;

    // From linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h and netinet/tcp.h.
    const NETLINK_SOCK_DIAG: i32 = 4;
    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const NLM_F_REQUEST: u16 = 0x1;
    const NLMSG_ERROR: u16 = 2;
    const TCP_LISTEN: u32 = 10;
    const NLMSG_HEADER_LEN: usize = 16;
    /// `struct inet_diag_req_v2`: family, protocol, extensions, pad, states, and the 48-byte
    /// `inet_diag_sockid`.
    const REQUEST_LEN: usize = 8 + 48;
    /// `struct inet_diag_msg` up to and including `idiag_inode`.
    const REPLY_LEN: usize = 4 + 48 + 20;
    /// The extension asked for: the socket's memory counters (`INET_DIAG_SKMEMINFO`, an
    /// attribute of `SK_MEMINFO_VARS` u32s), whose `SK_MEMINFO_DROPS` counts a listener's drops.
    const INET_DIAG_SKMEMINFO: u16 = 7;
    const SK_MEMINFO_DROPS: usize = 8;
    const RTATTR_HEADER_LEN: usize = 4;
    /// Offsets in `inet_diag_msg` of the receive queue (for a listener: the accept queue), the
    /// send queue (the backlog) and the inode.
    const RQUEUE_AT: usize = 56;
    const WQUEUE_AT: usize = 60;
    const INODE_AT: usize = 68;
    /// Late answers to earlier requests skipped before this one's, at most.
    const MAX_DATAGRAMS: usize = 16;
    const READ_TIMEOUT: Duration = Duration::from_millis(100);

    #[derive(Debug)]
    pub(super) struct Reader {
        socket: Socket,
        local: std::net::SocketAddr,
        inode: u32,
        sequence: AtomicU32,
    }

    impl Reader {
        pub(super) fn open(listener: &TcpListener) -> io::Result<Self> {
            let local = listener.local_addr()?;
            let inode = socket_inode(listener.as_raw_fd())?;
            let socket = Socket::new(
                Domain::from(libc::AF_NETLINK),
                Type::DGRAM,
                Some(Protocol::from(NETLINK_SOCK_DIAG)),
            )?;
            socket.set_read_timeout(Some(READ_TIMEOUT))?;
            let reader = Self {
                socket,
                local,
                inode,
                sequence: AtomicU32::new(1),
            };
            // Fail at startup, not at the first probe, where the kernel does not answer.
            reader.read()?;
            Ok(reader)
        }

        pub(super) fn read(&self) -> io::Result<QueueReading> {
            let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
            let request = request(self.local, sequence);
            let sent = self.socket.send(&request)?;
            if sent != request.len() {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "short netlink send",
                ));
            }
            let not_found = || {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    "the kernel has no such listening socket",
                )
            };
            // The answer is one record (or an error); a late answer to an earlier request that
            // timed out is skipped.
            let mut buffer = [0_u8; 1024];
            for _ in 0..MAX_DATAGRAMS {
                let received = (&self.socket).read(&mut buffer)?;
                match parse(&buffer[..received], sequence, self.inode) {
                    Ok(Parsed::Reading(reading)) => return Ok(reading),
                    // Another socket at the address (the listener is gone and another took it).
                    Ok(Parsed::OtherSocket) => return Err(not_found()),
                    Ok(Parsed::Skipped) => {}
                    Err(error) if error.kind() == io::ErrorKind::NotFound => {
                        return Err(not_found());
                    }
                    Err(error) => return Err(error),
                }
            }
            Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "no socket diagnostics answer to the request",
            ))
        }
    }

    /// The inode of a socket, from `/proc/self/fd` (`socket:[12345]`), as the diagnostics
    /// report it: its low 32 bits (`idiag_inode` is a `__u32`).
    fn socket_inode(fd: i32) -> io::Result<u32> {
        let link = std::fs::read_link(format!("/proc/self/fd/{fd}"))?;
        let link = link.to_string_lossy();
        let inode: u64 = link
            .strip_prefix("socket:[")
            .and_then(|rest| rest.strip_suffix(']'))
            .and_then(|inode| inode.parse().ok())
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, format!("not a socket: {link}"))
            })?;
        Ok(u32::try_from(inode & u64::from(u32::MAX)).expect("masked to 32 bits"))
    }

    /// A request for the one TCP socket bound to `local` with no peer — the listener — with
    /// its memory counters: the kernel looks it up as it would for an incoming connection (a
    /// listener bound to the unspecified address matches), so the cost does not grow with the
    /// host's other sockets, as a dump's would.
    pub(super) fn request(
        local: std::net::SocketAddr,
        sequence: u32,
    ) -> [u8; NLMSG_HEADER_LEN + REQUEST_LEN] {
        let mut message = [0_u8; NLMSG_HEADER_LEN + REQUEST_LEN];
        let length = u32::try_from(message.len()).expect("72 bytes");
        message[0..4].copy_from_slice(&length.to_ne_bytes());
        message[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        message[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
        message[8..12].copy_from_slice(&sequence.to_ne_bytes());
        // nlmsg_pid 0: the kernel fills in the sender.
        let family = match local {
            std::net::SocketAddr::V4(_) => libc::AF_INET,
            std::net::SocketAddr::V6(_) => libc::AF_INET6,
        };
        message[16] = u8::try_from(family).expect("address families fit a byte");
        message[17] = u8::try_from(libc::IPPROTO_TCP).expect("6");
        // The memory counters' extension bit, pad 0, then the state mask.
        message[18] = 1 << (INET_DIAG_SKMEMINFO - 1);
        message[20..24].copy_from_slice(&(1_u32 << TCP_LISTEN).to_ne_bytes());
        // inet_diag_sockid: source port and address (network order), no peer, no interface,
        // and INET_DIAG_NOCOOKIE.
        message[24..26].copy_from_slice(&local.port().to_be_bytes());
        match local.ip() {
            std::net::IpAddr::V4(ip) => message[28..32].copy_from_slice(&ip.octets()),
            std::net::IpAddr::V6(ip) => message[28..44].copy_from_slice(&ip.octets()),
        }
        message[64..72].fill(0xff);
        message
    }

    #[derive(Debug, PartialEq, Eq)]
    pub(super) enum Parsed {
        /// The record of the socket `inode`.
        Reading(QueueReading),
        /// The answer is another socket's record.
        OtherSocket,
        /// Nothing for this request (another request's late answer).
        Skipped,
    }

    /// Reads one datagram for the answer to `sequence`, the record of the socket `inode`; the
    /// kernel's errors come back as `io::Error`s with their errno.
    pub(super) fn parse(datagram: &[u8], sequence: u32, inode: u32) -> io::Result<Parsed> {
        let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
        let mut rest = datagram;
        while rest.len() >= NLMSG_HEADER_LEN {
            let length = u32_at(rest, 0) as usize;
            if length < NLMSG_HEADER_LEN || length > rest.len() {
                return Err(invalid("a netlink message's length is out of range"));
            }
            let kind = u16::from_ne_bytes([rest[4], rest[5]]);
            let body = &rest[NLMSG_HEADER_LEN..length];
            // Another request's late answer (one that timed out) is skipped, not misread.
            if u32_at(rest, 8) == sequence {
                match kind {
                    NLMSG_ERROR => {
                        let code = if body.len() >= 4 {
                            i32::from_ne_bytes([body[0], body[1], body[2], body[3]])
                        } else {
                            0
                        };
                        return Err(if code < 0 {
                            io::Error::from_raw_os_error(-code)
                        } else {
                            invalid("a netlink error without a code")
                        });
                    }
                    SOCK_DIAG_BY_FAMILY if body.len() >= REPLY_LEN => {
                        if u32_at(body, INODE_AT) != inode {
                            return Ok(Parsed::OtherSocket);
                        }
                        return Ok(Parsed::Reading(QueueReading {
                            queued: u32_at(body, RQUEUE_AT),
                            backlog: u32_at(body, WQUEUE_AT),
                            dropped: drops(&body[REPLY_LEN..]).unwrap_or(0),
                        }));
                    }
                    _ => return Err(invalid("an unexpected netlink message")),
                }
            }
            // Messages are aligned to 4 bytes.
            let next = length.next_multiple_of(4).min(rest.len());
            rest = &rest[next..];
        }
        Ok(Parsed::Skipped)
    }

    /// The drop counter in a record's attributes (`struct rtattr`s, 4-byte aligned), if the
    /// kernel sent the memory counters.
    fn drops(mut attributes: &[u8]) -> Option<u32> {
        while attributes.len() >= RTATTR_HEADER_LEN {
            let length = usize::from(u16::from_ne_bytes([attributes[0], attributes[1]]));
            let kind = u16::from_ne_bytes([attributes[2], attributes[3]]);
            if length < RTATTR_HEADER_LEN || length > attributes.len() {
                return None;
            }
            let payload = &attributes[RTATTR_HEADER_LEN..length];
            if kind == INET_DIAG_SKMEMINFO && payload.len() >= (SK_MEMINFO_DROPS + 1) * 4 {
                return Some(u32_at(payload, SK_MEMINFO_DROPS * 4));
            }
            attributes = &attributes[length.next_multiple_of(4).min(attributes.len())..];
        }
        None
    }

    fn u32_at(bytes: &[u8], at: usize) -> u32 {
        u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::linux::{Parsed, parse, request};
    use super::*;

    /// Against the kernel: connections that complete their handshake and are not accepted are
    /// counted, and accepting one takes it off the queue.
    #[tokio::test]
    async fn counts_the_connections_waiting_for_accept() {
        let listener = crate::server::bind("127.0.0.1:0".parse().unwrap(), 64).unwrap();
        let address = listener.local_addr().unwrap();
        let queue = ListenQueue::open(&listener).unwrap();
        assert_eq!(
            queue.read().unwrap(),
            QueueReading {
                queued: 0,
                backlog: 64.min(somaxconn()),
                dropped: 0,
            }
        );
        let mut clients = Vec::new();
        for _ in 0..5 {
            clients.push(tokio::net::TcpStream::connect(address).await.unwrap());
        }
        assert_eq!(queue.read().unwrap().queued, 5);
        let (_accepted, _) = listener.accept().await.unwrap();
        assert_eq!(queue.read().unwrap().queued, 4);
    }

    /// A full queue makes the kernel drop handshakes; the drops are counted, and for the second
    /// the dropped clients wait before they retry, the wait reads at least that second.
    #[tokio::test]
    async fn handshakes_dropped_at_a_full_queue_are_counted_and_read_as_a_second_of_wait() {
        let listener = crate::server::bind("127.0.0.1:0".parse().unwrap(), 1).unwrap();
        let address = listener.local_addr().unwrap();
        let stats = Arc::new(ConnectionStats::default());
        let mut wait = AcceptWait::new(ListenQueue::open(&listener).unwrap(), Arc::clone(&stats));
        // A backlog of 1 holds two completed handshakes; the rest are dropped and retried.
        let connecting: Vec<_> = (0..6)
            .map(|_| {
                tokio::spawn(tokio::time::timeout(
                    Duration::from_secs(5),
                    tokio::net::TcpStream::connect(address),
                ))
            })
            .collect();
        let mut reading = wait.queue.read().unwrap();
        for _ in 0..200 {
            if reading.dropped > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            reading = wait.queue.read().unwrap();
        }
        assert!(reading.dropped > 0, "{reading:?}");
        let sampled = wait.sample().unwrap();
        assert!(sampled >= SYN_RETRY, "{sampled:?}");
        let snapshot = stats.snapshot().listen_queue.unwrap();
        assert!(snapshot.dropped > 0, "{snapshot:?}");
        drop(listener);
        for connect in connecting {
            connect.abort();
        }
    }

    #[tokio::test]
    async fn a_listener_on_the_unspecified_address_is_found() {
        let listener = crate::server::bind("0.0.0.0:0".parse().unwrap(), 16).unwrap();
        let queue = ListenQueue::open(&listener).unwrap();
        let port = listener.local_addr().unwrap().port();
        let _client = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        assert_eq!(queue.read().unwrap().queued, 1);
    }

    #[tokio::test]
    async fn an_ipv6_listener_is_found() {
        let Ok(listener) = crate::server::bind("[::1]:0".parse().unwrap(), 16) else {
            return; // no IPv6 loopback on this host
        };
        let queue = ListenQueue::open(&listener).unwrap();
        let _client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        assert_eq!(queue.read().unwrap().queued, 1);
    }

    #[tokio::test]
    async fn a_closed_listener_is_not_found() {
        let listener = crate::server::bind("127.0.0.1:0".parse().unwrap(), 16).unwrap();
        let queue = ListenQueue::open(&listener).unwrap();
        drop(listener);
        assert_eq!(queue.read().unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn the_wait_is_the_queue_over_the_accept_rate_or_the_time_it_stood() {
        let ms = Duration::from_millis;
        let period = |queued_before, queued, dequeued| Period {
            queued_before,
            queued,
            dequeued,
            elapsed: ms(10),
        };
        assert_eq!(estimated_wait(period(5, 0, 0), ms(40)), (ms(0), ms(0)));
        assert_eq!(estimated_wait(period(0, 0, 500), ms(0)), (ms(0), ms(0)));
        // 100 waiting, 50 taken in 10 ms (5,000 a second): the last waits 20 ms.
        assert_eq!(estimated_wait(period(80, 100, 50), ms(30)), (ms(20), ms(0)));
        // Arrived in the period, nothing taken: half the period.
        assert_eq!(estimated_wait(period(0, 3, 0), ms(0)), (ms(5), ms(5)));
        // A queue that stands with nothing taken off: the time it has stood.
        assert_eq!(estimated_wait(period(3, 3, 0), ms(5)), (ms(15), ms(15)));
        assert_eq!(estimated_wait(period(3, 4, 0), ms(15)), (ms(25), ms(25)));
        assert_eq!(
            estimated_wait(period(1, 1, 0), Duration::from_secs(3600)).0,
            MAX_WAIT
        );
        let huge = Period {
            queued_before: 1,
            queued: u32::MAX,
            dequeued: 1,
            elapsed: Duration::from_secs(1),
        };
        assert_eq!(estimated_wait(huge, ms(0)).0, MAX_WAIT);
    }

    /// The estimate follows the queue: connections nobody accepts wait ever longer, by the time
    /// that passes; once accepted, none waits.
    #[tokio::test(start_paused = true)]
    async fn a_queue_nobody_accepts_reads_as_a_growing_wait_and_an_accepted_one_as_none() {
        let listener = crate::server::bind("127.0.0.1:0".parse().unwrap(), 64).unwrap();
        let address = listener.local_addr().unwrap();
        let stats = Arc::new(ConnectionStats::default());
        let mut wait = AcceptWait::new(ListenQueue::open(&listener).unwrap(), Arc::clone(&stats));
        assert_eq!(wait.sample(), Some(Duration::ZERO));
        let mut clients = Vec::new();
        for _ in 0..10 {
            clients.push(tokio::net::TcpStream::connect(address).await.unwrap());
        }
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(wait.sample(), Some(Duration::from_millis(5)));
        for _ in 0..9 {
            tokio::time::advance(Duration::from_millis(10)).await;
            wait.sample();
        }
        assert_eq!(wait.sample(), Some(Duration::from_millis(95)));
        let snapshot = stats.snapshot().listen_queue.unwrap();
        assert_eq!((snapshot.queued, snapshot.wait_ms), (10, 95.0));
        let mut accepted = Vec::new();
        for _ in 0..10 {
            accepted.push(listener.accept().await.unwrap());
        }
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(wait.sample(), Some(Duration::ZERO));
    }

    #[test]
    fn records_are_read_by_inode_malformed_datagrams_are_errors_and_other_sequences_skipped() {
        // A length that runs past the datagram.
        let mut message = request("127.0.0.1:80".parse().unwrap(), 7).to_vec();
        message[0..4].copy_from_slice(&1000_u32.to_ne_bytes());
        assert!(parse(&message, 7, 1).is_err());
        // A message under another sequence (a timed-out request's late answer) is skipped; one
        // under ours that is too short for a socket's record is refused.
        let other = request("127.0.0.1:80".parse().unwrap(), 8);
        assert_eq!(parse(&other, 7, 1).unwrap(), Parsed::Skipped);
        assert!(parse(&request("127.0.0.1:80".parse().unwrap(), 7), 7, 1).is_err());
        // A record under our sequence: ours (by inode), or another socket's.
        let mut record = [0_u8; 16 + 72];
        record[0..4].copy_from_slice(&88_u32.to_ne_bytes());
        record[4..6].copy_from_slice(&20_u16.to_ne_bytes());
        record[8..12].copy_from_slice(&7_u32.to_ne_bytes());
        record[16 + 56..16 + 60].copy_from_slice(&3_u32.to_ne_bytes());
        record[16 + 60..16 + 64].copy_from_slice(&128_u32.to_ne_bytes());
        record[16 + 68..16 + 72].copy_from_slice(&42_u32.to_ne_bytes());
        assert_eq!(
            parse(&record, 7, 42).unwrap(),
            Parsed::Reading(QueueReading {
                queued: 3,
                backlog: 128,
                dropped: 0,
            })
        );
        assert_eq!(parse(&record, 7, 41).unwrap(), Parsed::OtherSocket);
        // An error reply carries the errno.
        let mut error = [0_u8; 36];
        error[0..4].copy_from_slice(&36_u32.to_ne_bytes());
        error[4..6].copy_from_slice(&2_u16.to_ne_bytes());
        error[8..12].copy_from_slice(&7_u32.to_ne_bytes());
        error[16..20].copy_from_slice(&(-libc::EPERM).to_ne_bytes());
        assert_eq!(
            parse(&error, 7, 1).unwrap_err().raw_os_error(),
            Some(libc::EPERM)
        );
    }

    fn somaxconn() -> u32 {
        std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(4096)
    }
}
