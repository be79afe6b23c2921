//! Raw-TCP attackers for the chaos suite: connections that an HTTP client library would never
//! open, because the point is to misbehave at the connection level — a slowloris dripping one
//! header byte every few seconds, a stalled body (`content-length: 1000`, then a byte a
//! second), a wall of large headers that never ends, an idle keep-alive connection.
//!
//! Each connection is one task on plain [`tokio::net::TcpStream`]s, bound to a source address
//! of its own on the loopback (127.0.0.3 by default, so that a per-peer limit of the service
//! tells the attacker from the ordinary load on 127.0.0.1). A task writes its prefix, then
//! drips bytes (or holds), and reads whatever the server sends until the server closes the
//! connection or the attack's time bound runs out. The outcome says, per connection, when and
//! how it ended and what status the server answered, if any, and how many were open over time.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// The loopback source address attackers connect from.
pub const ATTACKER_SOURCE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 3));

/// What one attack does.
#[derive(Clone)]
pub struct AttackSpec {
    pub connections: usize,
    pub source: IpAddr,
    pub target: SocketAddr,
    /// Bytes written at once after connecting, by connection index.
    pub prefix: Arc<dyn Fn(usize) -> Vec<u8> + Send + Sync>,
    /// Bytes written one at a time after the prefix (cycled), one every `drip_every`.
    pub drip: Option<(Vec<u8>, Duration)>,
    /// Connections are opened evenly over this time.
    pub ramp: Duration,
    /// Each connection gives up (is counted as still open) this long after it connected.
    pub hold: Duration,
}

impl std::fmt::Debug for AttackSpec {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("AttackSpec")
            .field("connections", &self.connections)
            .field("source", &self.source)
            .field("target", &self.target)
            .field("hold", &self.hold)
            .finish_non_exhaustive()
    }
}

/// How one connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// The server closed it (read returned end of stream).
    ClosedByServer,
    /// The server reset it, or a write failed because it was gone.
    Reset,
    /// Still open when the attack's bound ran out (the harness closed it).
    StillOpen,
    /// The connection was never established.
    ConnectFailed,
}

/// One connection's fate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Fate {
    pub ending: Ending,
    /// From its connect to its end, in ms (`None` when it never connected).
    pub lifetime_ms: Option<f64>,
    /// From the last byte the server sent to the end (for the idle probe), in ms.
    pub after_last_response_byte_ms: Option<f64>,
    /// The status of the server's first answer on it, if any.
    pub status: Option<u16>,
    pub bytes_written: usize,
}

/// What an attack measured.
#[derive(Debug, Clone, Serialize)]
pub struct AttackOutcome {
    pub fates: Vec<Fate>,
    /// (seconds since the attack began, connections open), every 250 ms.
    pub open_timeline: Vec<(f64, usize)>,
}

/// Counts of an outcome, for the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttackSummary {
    pub connections: usize,
    pub connect_failed: usize,
    pub closed_by_server: usize,
    pub reset: usize,
    pub still_open_at_bound: usize,
    /// Lifetime of the connections the server ended (closed or reset), ms.
    pub lifetime_p50_ms: Option<f64>,
    pub lifetime_max_ms: Option<f64>,
    pub lifetime_min_ms: Option<f64>,
    /// Statuses answered on the attack's connections, `status → count`.
    pub statuses: std::collections::BTreeMap<String, usize>,
    pub max_open: usize,
}

impl AttackOutcome {
    pub fn summary(&self) -> AttackSummary {
        let count = |ending: Ending| self.fates.iter().filter(|f| f.ending == ending).count();
        let mut ended: Vec<f64> = self
            .fates
            .iter()
            .filter(|fate| matches!(fate.ending, Ending::ClosedByServer | Ending::Reset))
            .filter_map(|fate| fate.lifetime_ms)
            .collect();
        ended.sort_by(f64::total_cmp);
        let mut statuses = std::collections::BTreeMap::new();
        for fate in &self.fates {
            let key = fate
                .status
                .map_or_else(|| "none".to_owned(), |status| status.to_string());
            *statuses.entry(key).or_insert(0) += 1;
        }
        AttackSummary {
            connections: self.fates.len(),
            connect_failed: count(Ending::ConnectFailed),
            closed_by_server: count(Ending::ClosedByServer),
            reset: count(Ending::Reset),
            still_open_at_bound: count(Ending::StillOpen),
            lifetime_p50_ms: ended.get(ended.len() / 2).copied(),
            lifetime_max_ms: ended.last().copied(),
            lifetime_min_ms: ended.first().copied(),
            statuses,
            max_open: self
                .open_timeline
                .iter()
                .map(|(_, open)| *open)
                .max()
                .unwrap_or(0),
        }
    }
}

/// The status code of an HTTP/1.x status line at the start of `bytes`.
pub fn parse_status(bytes: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(bytes.get(..12)?).ok()?;
    let rest = text.strip_prefix("HTTP/1.")?;
    rest.get(2..5)?.parse().ok()
}

/// [`run`] on a thread and runtime of its own: the harness's runtime also drives the load, and
/// a close it noticed late would be measured as the server's lateness (the chaos suite holds the
/// server to 100 ms).
pub async fn run_apart(spec: AttackSpec) -> std::io::Result<AttackOutcome> {
    let (done, outcome) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("rebate-attack".to_owned())
        .spawn(move || {
            let outcome = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|runtime| runtime.block_on(run(&spec)));
            let _ = done.send(outcome);
        })?;
    outcome
        .await
        .map_err(|_| std::io::Error::other("the attack thread ended without an outcome"))?
}

/// Runs `spec` to its end: every connection ended or the bound reached. Bounded by
/// `spec.ramp + spec.hold + 3 s`.
pub async fn run(spec: &AttackSpec) -> AttackOutcome {
    let started = Instant::now();
    let open = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for index in 0..spec.connections {
        let offset = if spec.connections > 1 {
            spec.ramp.mul_f64(index as f64 / spec.connections as f64)
        } else {
            Duration::ZERO
        };
        let (spec, open) = (spec.clone(), open.clone());
        tasks.spawn(async move {
            tokio::time::sleep_until(started + offset).await;
            (index, one_connection(&spec, index, &open).await)
        });
    }
    let bound = started + spec.ramp + spec.hold + Duration::from_secs(3);
    let mut fates = vec![
        Fate {
            ending: Ending::StillOpen,
            lifetime_ms: None,
            after_last_response_byte_ms: None,
            status: None,
            bytes_written: 0,
        };
        spec.connections
    ];
    let mut timeline = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                Some(Ok((index, fate))) => fates[index] = fate,
                Some(Err(_)) => {}
                None => break,
            },
            _ = tick.tick() => {
                timeline.push((started.elapsed().as_secs_f64(), open.load(Ordering::Relaxed)));
                if Instant::now() >= bound {
                    tasks.abort_all();
                    break;
                }
            }
        }
    }
    timeline.push((
        started.elapsed().as_secs_f64(),
        open.load(Ordering::Relaxed),
    ));
    AttackOutcome {
        fates,
        open_timeline: timeline,
    }
}

async fn one_connection(spec: &AttackSpec, index: usize, open: &AtomicUsize) -> Fate {
    let mut fate = Fate {
        ending: Ending::ConnectFailed,
        lifetime_ms: None,
        after_last_response_byte_ms: None,
        status: None,
        bytes_written: 0,
    };
    let connect = async {
        let socket = if spec.source.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.bind(SocketAddr::new(spec.source, 0))?;
        socket.connect(spec.target).await
    };
    let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(3), connect).await else {
        return fate;
    };
    let _ = stream.set_nodelay(true);
    let connected = Instant::now();
    let deadline = connected + spec.hold;
    open.fetch_add(1, Ordering::Relaxed);
    let (mut reader, mut writer) = stream.into_split();
    let mut first_bytes = Vec::with_capacity(16);
    let mut last_read: Option<Instant> = None;
    let prefix = (spec.prefix)(index);
    let ending = match tokio::time::timeout(Duration::from_secs(3), writer.write_all(&prefix)).await
    {
        Ok(Ok(())) => {
            fate.bytes_written = prefix.len();
            hold(
                spec,
                &mut reader,
                &mut writer,
                deadline,
                &mut fate,
                &mut first_bytes,
                &mut last_read,
            )
            .await
        }
        // The server may close while a large prefix is still being written.
        Ok(Err(_)) => drain_after_failed_write(&mut reader, &mut first_bytes, &mut last_read).await,
        Err(_) => Ending::StillOpen,
    };
    open.fetch_sub(1, Ordering::Relaxed);
    let ended = Instant::now();
    fate.ending = ending;
    fate.lifetime_ms = Some(ended.duration_since(connected).as_secs_f64() * 1000.0);
    fate.after_last_response_byte_ms =
        last_read.map(|at| ended.duration_since(at).as_secs_f64() * 1000.0);
    fate.status = parse_status(&first_bytes);
    fate
}

/// After the prefix: drip (or hold) and read until the server ends the connection or the
/// deadline.
async fn hold(
    spec: &AttackSpec,
    reader: &mut tokio::net::tcp::OwnedReadHalf,
    writer: &mut tokio::net::tcp::OwnedWriteHalf,
    deadline: Instant,
    fate: &mut Fate,
    first_bytes: &mut Vec<u8>,
    last_read: &mut Option<Instant>,
) -> Ending {
    let mut buffer = [0_u8; 4096];
    let (drip_bytes, drip_every) = spec
        .drip
        .clone()
        .unwrap_or((Vec::new(), Duration::from_secs(3600)));
    let mut next_drip = Instant::now() + drip_every;
    let mut dripped = 0_usize;
    loop {
        tokio::select! {
            read = reader.read(&mut buffer) => match read {
                Ok(0) => return Ending::ClosedByServer,
                Ok(count) => {
                    remember(first_bytes, &buffer[..count]);
                    *last_read = Some(Instant::now());
                }
                Err(_) => return Ending::Reset,
            },
            () = tokio::time::sleep_until(next_drip), if !drip_bytes.is_empty() => {
                let byte = drip_bytes[dripped % drip_bytes.len()];
                if writer.write_all(&[byte]).await.is_err() {
                    return drain_after_failed_write(reader, first_bytes, last_read).await;
                }
                dripped += 1;
                fate.bytes_written += 1;
                next_drip += drip_every;
            }
            () = tokio::time::sleep_until(deadline) => return Ending::StillOpen,
        }
    }
}

/// A write failed: read what the server still sent (e.g. a 408 or 431) for a moment, then call
/// it a reset.
async fn drain_after_failed_write(
    reader: &mut tokio::net::tcp::OwnedReadHalf,
    first_bytes: &mut Vec<u8>,
    last_read: &mut Option<Instant>,
) -> Ending {
    let mut buffer = [0_u8; 4096];
    let until = Instant::now() + Duration::from_millis(200);
    while let Ok(Ok(count)) = tokio::time::timeout_at(until, reader.read(&mut buffer)).await {
        if count == 0 {
            return Ending::ClosedByServer;
        }
        remember(first_bytes, &buffer[..count]);
        *last_read = Some(Instant::now());
    }
    Ending::Reset
}

fn remember(first_bytes: &mut Vec<u8>, bytes: &[u8]) {
    let room = 16_usize.saturating_sub(first_bytes.len());
    first_bytes.extend_from_slice(&bytes[..room.min(bytes.len())]);
}

/// A GET request line and Host header, not yet ended by the blank line.
fn request_head(target: SocketAddr, path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nhost: {target}\r\nuser-agent: rebate-loadgen-attacker\r\n")
}

/// Slowloris: a request head, then one more header byte every `every` (`x-a: b\r\n` over and
/// over: lines end, the header block never does).
pub fn slowloris(
    target: SocketAddr,
    connections: usize,
    every: Duration,
    ramp: Duration,
    hold: Duration,
) -> AttackSpec {
    AttackSpec {
        connections,
        source: ATTACKER_SOURCE,
        target,
        prefix: Arc::new(move |_| request_head(target, "/api/v1/items/jd/100002/rebate").into()),
        drip: Some((b"x-a: b\r\n".to_vec(), every)),
        ramp,
        hold,
    }
}

/// Stalled body: a complete batch POST head with `content-length: 1000`, then one body byte
/// every `every`. `rotate_client_id` gives each connection its own `x-client-id`.
pub fn stalled_body(
    target: SocketAddr,
    connections: usize,
    rotate_client_id: bool,
    every: Duration,
    ramp: Duration,
    hold: Duration,
) -> AttackSpec {
    AttackSpec {
        connections,
        source: ATTACKER_SOURCE,
        target,
        prefix: Arc::new(move |index| {
            let client_id = if rotate_client_id {
                format!("attacker-{index}")
            } else {
                "attacker".to_owned()
            };
            format!(
                "POST /api/v1/items:batch HTTP/1.1\r\nhost: {target}\r\n\
                 content-type: application/json\r\ncontent-length: 1000\r\n\
                 x-client-id: {client_id}\r\n\r\n"
            )
            .into()
        }),
        drip: Some((b"{\"items\":[".to_vec(), every)),
        ramp,
        hold,
    }
}

/// Header bytes of large-header connection `index`: 8 KiB to 16 KiB, spread over the indexes.
pub fn large_header_size(index: usize) -> usize {
    8 * 1024 + (index * 7_919) % (8 * 1024)
}

/// Large headers: a request head and then `large_header_size(index)` bytes of 1 KiB headers,
/// written at once, never ended by the blank line; then the connection is held silently.
pub fn large_headers(
    target: SocketAddr,
    connections: usize,
    ramp: Duration,
    hold: Duration,
) -> AttackSpec {
    AttackSpec {
        connections,
        source: ATTACKER_SOURCE,
        target,
        prefix: Arc::new(move |index| {
            let mut head = request_head(target, "/api/v1/items/jd/100002/rebate");
            let size = large_header_size(index);
            let mut number = 0;
            while head.len() < size {
                let value_length = (size - head.len()).clamp(1, 1000);
                head.push_str(&format!(
                    "x-fill-{number}: {}\r\n",
                    "v".repeat(value_length)
                ));
                number += 1;
            }
            head.into_bytes()
        }),
        drip: None,
        ramp,
        hold,
    }
}

/// One keep-alive connection: a complete GET, its answer read, then silence until the server
/// closes it ([`Fate::after_last_response_byte_ms`] is the idle time it allowed).
pub fn idle_keep_alive(target: SocketAddr, source: IpAddr, hold: Duration) -> AttackSpec {
    AttackSpec {
        connections: 1,
        source,
        target,
        prefix: Arc::new(move |_| {
            let mut head = request_head(target, "/api/v1/items/jd/100002/rebate");
            head.push_str("x-client-id: idle-probe\r\n\r\n");
            head.into_bytes()
        }),
        drip: None,
        ramp: Duration::ZERO,
        hold,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[test]
    fn status_lines_are_parsed() {
        assert_eq!(parse_status(b"HTTP/1.1 408 Request Timeout\r\n"), Some(408));
        assert_eq!(parse_status(b"HTTP/1.0 431 x"), Some(431));
        assert_eq!(parse_status(b"garbage that is long"), None);
        assert_eq!(parse_status(b"HTTP/1.1"), None);
    }

    #[test]
    fn large_headers_are_between_8_and_16_kib() {
        let target: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let spec = large_headers(target, 1000, Duration::ZERO, Duration::ZERO);
        for index in [0, 1, 17, 999] {
            let bytes = (spec.prefix)(index);
            assert!(
                (8 * 1024..=16 * 1024 + 64).contains(&bytes.len()),
                "{}",
                bytes.len()
            );
            assert!(!bytes.windows(4).any(|w| w == b"\r\n\r\n"), "never ends");
        }
        let stalled = stalled_body(
            target,
            2,
            true,
            Duration::ZERO,
            Duration::ZERO,
            Duration::ZERO,
        );
        let head = String::from_utf8((stalled.prefix)(1)).unwrap();
        assert!(head.contains("content-length: 1000\r\n") && head.contains("attacker-1"));
        assert!(head.ends_with("\r\n\r\n"));
    }

    /// A server that reads headers for `timeout`, then answers 408 and closes.
    async fn timing_out_server(timeout: Duration) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0_u8; 1024];
                    let _ = tokio::time::timeout(timeout, async {
                        while stream.read(&mut buffer).await.is_ok_and(|n| n > 0) {}
                    })
                    .await;
                    let _ = stream
                        .write_all(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n\r\n")
                        .await;
                });
            }
        });
        address
    }

    #[tokio::test]
    async fn connections_closed_by_the_server_are_timed_and_the_rest_bounded() {
        let address = timing_out_server(Duration::from_millis(300)).await;
        let mut spec = slowloris(
            address,
            5,
            Duration::from_millis(50),
            Duration::ZERO,
            Duration::from_secs(3),
        );
        spec.source = "127.0.0.1".parse().unwrap();
        let outcome = run(&spec).await;
        let summary = outcome.summary();
        assert_eq!(summary.connections, 5);
        assert_eq!(summary.closed_by_server + summary.reset, 5, "{summary:?}");
        assert_eq!(summary.statuses.get("408"), Some(&5));
        let lifetime = summary.lifetime_max_ms.unwrap();
        assert!((250.0..1500.0).contains(&lifetime), "{lifetime}");

        // A server that never closes: the bound ends the attack, counted as still open.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let mut spec = idle_keep_alive(
            silent,
            "127.0.0.1".parse().unwrap(),
            Duration::from_millis(400),
        );
        spec.connections = 2;
        let started = std::time::Instant::now();
        let summary = run(&spec).await.summary();
        assert_eq!(summary.still_open_at_bound, 2);
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
