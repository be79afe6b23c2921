//! The load's own HTTP/1.1 client: keep-alive connections pooled per source address, each
//! request written into the connection's reused buffer and each response parsed in place with
//! `httparse`, read only as far as the harness needs (status, `Retry-After`, `x-shed-level`, the
//! body for a byte scan).
//!
//! Why not reqwest for the load: the generator shares this machine's cores with the service, so
//! what it spends per request decides whether an "overload" reaches the service at all. reqwest
//! (hyper's pooled client) parses a URL, builds a header map and hands every request to a
//! connection task over a channel, and its body comes back in chunks; here one task writes and
//! reads its own connection into buffers the connection keeps, and the body handed back is the
//! one copy per response.
//! The measured difference is in docs/BENCHMARKS.md ("The generator's own cost"). reqwest stays
//! for everything that is not the load (status sampling, faults, set-up).
//!
//! Contract: a connection goes back to its pool only after a complete response that did not
//! say `connection: close`; a pooled connection the server closed while idle is retried once
//! on a new one (the request never reached the server); every read and connect is bounded by
//! the caller's timeout, and a response is bounded in size ([`MAX_RESPONSE`]).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

/// The largest response head plus body the harness reads (a 50-item batch answer is ~40 KiB).
pub const MAX_RESPONSE: usize = 4 << 20;
/// Headers the harness parses at most; the service sends about a dozen.
const MAX_HEADERS: usize = 48;
/// How much a read asks the kernel for at once.
const READ_CHUNK: usize = 16 << 10;

/// A failure below HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportError {
    /// No answer within the client's per-attempt timeout.
    Timeout,
    /// The connection could not be made (refused, reset before a response).
    Connect,
    /// Anything else (body cut off, protocol error).
    Other,
    /// Not sent: the harness's own bound on attempts on the wire (each holds a connection, and
    /// the open-files limit caps connections) was reached. The harness's limit, not the
    /// target's: counted as client overflow.
    Overflow,
}

/// One request as the harness sends it: method, path, the client id, its class when the route's
/// is not the one meant, and a body for POSTs.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub post: bool,
    pub path: &'a str,
    pub client_id: &'a str,
    /// Sent as `x-request-class` when set (`prefetch`): a static string, so that the head is
    /// still written without an allocation.
    pub class: Option<&'static str>,
    /// Sent with `content-type: application/json` when `post`.
    pub body: &'a [u8],
}

/// What the harness keeps of a response: the parts of the head it reads, and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub retry_after_secs: Option<u64>,
    pub shed_level: Option<u8>,
    /// The admission wait the service reported (`Server-Timing: admission;…`).
    pub queued: Option<Queued>,
    pub body: Vec<u8>,
}

/// A request that queued for admission, from the service's
/// `Server-Timing: admission;desc=OUTCOME;dur=MILLISECONDS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    pub outcome: QueueOutcome,
    pub wait: Duration,
}

/// How a wait for admission ended (the service's `desc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueOutcome {
    /// Let in after waiting.
    Admitted,
    /// The class's wait ran out: a 503.
    TimedOut,
    /// The queue was full: a 503 at once.
    Full,
}

impl Queued {
    /// The `admission` metric of a `Server-Timing` value (`None` without one, or when its
    /// `desc` or `dur` is missing or unknown). Other metrics in the value are skipped.
    pub fn of_server_timing(value: &str) -> Option<Self> {
        value.split(',').find_map(|metric| {
            let mut parts = metric.split(';').map(str::trim);
            if parts.next()? != "admission" {
                return None;
            }
            let (mut outcome, mut wait) = (None, None);
            for parameter in parts {
                let (name, value) = parameter.split_once('=')?;
                let value = value.trim().trim_matches('"');
                match name.trim() {
                    "desc" => {
                        outcome = Some(match value {
                            "admitted" => QueueOutcome::Admitted,
                            "timed_out" => QueueOutcome::TimedOut,
                            "full" => QueueOutcome::Full,
                            _ => return None,
                        });
                    }
                    "dur" => {
                        let millis: f64 = value.parse().ok()?;
                        wait = Duration::try_from_secs_f64(millis / 1e3).ok();
                    }
                    _ => {}
                }
            }
            Some(Self {
                outcome: outcome?,
                wait: wait?,
            })
        })
    }
}

/// Keep-alive connections from one source address (or the system's choice) to any server.
#[derive(Debug)]
pub struct Pool {
    source: Option<IpAddr>,
    connect_timeout: Duration,
    /// Idle longer than this and a connection is dropped instead of reused: keep it below the
    /// server's idle timeout, or a request may meet a connection the server is closing.
    idle_timeout: Duration,
    /// Most recently used last: the hottest connections are reused first and the rest age out.
    idle: Mutex<Vec<Connection>>,
}

#[derive(Debug)]
struct Connection {
    server: SocketAddr,
    stream: TcpStream,
    /// The request being written, reused.
    out: Vec<u8>,
    /// What was read of the response, reused.
    input: Vec<u8>,
    idle_since: Instant,
}

impl Pool {
    pub fn new(source: Option<IpAddr>, connect_timeout: Duration, idle_timeout: Duration) -> Self {
        Self {
            source,
            connect_timeout,
            idle_timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Idle connections held now.
    pub fn idle_connections(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Connection>> {
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sends `request` to `server` and reads the whole response. The caller bounds the time.
    pub async fn send(
        &self,
        server: SocketAddr,
        host: &str,
        request: Request<'_>,
    ) -> Result<Response, TransportError> {
        if let Some(mut connection) = self.checkout(server) {
            match connection.exchange(host, request).await {
                Ok((response, reusable)) => {
                    if reusable {
                        self.checkin(connection);
                    }
                    return Ok(response);
                }
                // The server closed it while it sat idle: the request never arrived.
                Err(Failure::ClosedBeforeAnswer) => {}
                Err(Failure::Transport(error)) => return Err(error),
            }
        }
        let mut connection = self.connect(server).await?;
        match connection.exchange(host, request).await {
            Ok((response, reusable)) => {
                if reusable {
                    self.checkin(connection);
                }
                Ok(response)
            }
            Err(Failure::ClosedBeforeAnswer) => Err(TransportError::Connect),
            Err(Failure::Transport(error)) => Err(error),
        }
    }

    fn checkout(&self, server: SocketAddr) -> Option<Connection> {
        let now = Instant::now();
        let mut idle = self.lock();
        // Connections past their idle time are at the bottom (least recently used first).
        let fresh_from = idle
            .iter()
            .position(|connection| now.duration_since(connection.idle_since) < self.idle_timeout)
            .unwrap_or(idle.len());
        let stale: Vec<Connection> = idle.drain(..fresh_from).collect();
        let found = idle
            .iter()
            .rposition(|connection| connection.server == server)
            .map(|index| idle.remove(index));
        drop(idle);
        drop(stale); // closed outside the lock
        found
    }

    fn checkin(&self, mut connection: Connection) {
        connection.idle_since = Instant::now();
        self.lock().push(connection);
    }

    async fn connect(&self, server: SocketAddr) -> Result<Connection, TransportError> {
        let socket = match server {
            SocketAddr::V4(_) => TcpSocket::new_v4(),
            SocketAddr::V6(_) => TcpSocket::new_v6(),
        }
        .map_err(|_| TransportError::Other)?;
        if let Some(source) = self.source {
            socket
                .bind(SocketAddr::new(source, 0))
                .map_err(|_| TransportError::Connect)?;
        }
        let stream = match tokio::time::timeout(self.connect_timeout, socket.connect(server)).await
        {
            Ok(Ok(stream)) => stream,
            Ok(Err(_)) | Err(_) => return Err(TransportError::Connect),
        };
        stream
            .set_nodelay(true)
            .map_err(|_| TransportError::Other)?;
        Ok(Connection {
            server,
            stream,
            out: Vec::with_capacity(512),
            input: Vec::with_capacity(READ_CHUNK),
            idle_since: Instant::now(),
        })
    }
}

/// Why an exchange failed.
#[derive(Debug)]
enum Failure {
    /// The connection ended before one byte of the answer: on a pooled connection, the server
    /// had closed it while idle.
    ClosedBeforeAnswer,
    Transport(TransportError),
}

/// What the head said, copied out of the parse so that the buffer can grow.
#[derive(Debug, Clone, Copy)]
struct Head {
    length: usize,
    status: u16,
    retry_after_secs: Option<u64>,
    shed_level: Option<u8>,
    queued: Option<Queued>,
    body: BodyLength,
    close: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyLength {
    Exactly(usize),
    Chunked,
    UntilClose,
}

impl Connection {
    /// Writes the request, reads one whole response; `true` when the connection can be reused.
    async fn exchange(
        &mut self,
        host: &str,
        request: Request<'_>,
    ) -> Result<(Response, bool), Failure> {
        write_request(&mut self.out, host, request);
        if let Err(error) = self.stream.write_all(&self.out).await {
            return Err(if is_reset(&error) {
                Failure::ClosedBeforeAnswer
            } else {
                Failure::Transport(TransportError::Other)
            });
        }
        self.input.clear();
        let head = loop {
            if let Some(head) = parse_head(&self.input)? {
                break head;
            }
            if self.fill().await? == 0 {
                return Err(if self.input.is_empty() {
                    Failure::ClosedBeforeAnswer
                } else {
                    Failure::Transport(TransportError::Other)
                });
            }
        };
        let body = match head.body {
            BodyLength::Exactly(length) => {
                let end = head
                    .length
                    .checked_add(length)
                    .filter(|end| *end <= MAX_RESPONSE);
                let end = end.ok_or(Failure::Transport(TransportError::Other))?;
                while self.input.len() < end {
                    if self.fill().await? == 0 {
                        return Err(Failure::Transport(TransportError::Other));
                    }
                }
                if self.input.len() > end {
                    // Bytes past the answer: the exchange is out of step; never reuse it.
                    return Err(Failure::Transport(TransportError::Other));
                }
                self.input[head.length..end].to_vec()
            }
            BodyLength::Chunked => self.read_chunked(head.length).await?,
            BodyLength::UntilClose => {
                while self.fill().await? > 0 {}
                self.input[head.length..].to_vec()
            }
        };
        let reusable = !head.close && head.body != BodyLength::UntilClose;
        Ok((
            Response {
                status: head.status,
                retry_after_secs: head.retry_after_secs,
                shed_level: head.shed_level,
                queued: head.queued,
                body,
            },
            reusable,
        ))
    }

    /// Reads more into `input`'s spare capacity (nothing zeroed, nothing copied); 0 at the end
    /// of the stream. Errors once `input` holds [`MAX_RESPONSE`].
    async fn fill(&mut self) -> Result<usize, Failure> {
        if self.input.len() >= MAX_RESPONSE {
            return Err(Failure::Transport(TransportError::Other));
        }
        let was_empty = self.input.is_empty();
        self.input.reserve(READ_CHUNK);
        match self.stream.read_buf(&mut self.input).await {
            Ok(read) => Ok(read),
            Err(error) if is_reset(&error) && was_empty => Err(Failure::ClosedBeforeAnswer),
            Err(_) => Err(Failure::Transport(TransportError::Other)),
        }
    }

    /// Decodes a chunked body that starts at `from` in `input`, reading as needed.
    async fn read_chunked(&mut self, from: usize) -> Result<Vec<u8>, Failure> {
        let mut body = Vec::new();
        let mut at = from;
        loop {
            let (size_end, size) = loop {
                match httparse::parse_chunk_size(&self.input[at..]) {
                    Ok(httparse::Status::Complete((used, size))) => break (at + used, size),
                    Ok(httparse::Status::Partial) => {
                        if self.fill().await? == 0 {
                            return Err(Failure::Transport(TransportError::Other));
                        }
                    }
                    Err(_) => return Err(Failure::Transport(TransportError::Other)),
                }
            };
            let size = usize::try_from(size)
                .ok()
                .filter(|size| {
                    body.len()
                        .checked_add(*size)
                        .is_some_and(|total| total <= MAX_RESPONSE)
                })
                .ok_or(Failure::Transport(TransportError::Other))?;
            // The chunk, then its CRLF (after the last, empty chunk: the final CRLF, no
            // trailers from the service).
            let chunk_end = size_end + size + 2;
            while self.input.len() < chunk_end {
                if self.fill().await? == 0 {
                    return Err(Failure::Transport(TransportError::Other));
                }
            }
            if &self.input[chunk_end - 2..chunk_end] != b"\r\n" {
                return Err(Failure::Transport(TransportError::Other));
            }
            if size == 0 {
                if self.input.len() > chunk_end {
                    return Err(Failure::Transport(TransportError::Other));
                }
                return Ok(body);
            }
            body.extend_from_slice(&self.input[size_end..size_end + size]);
            at = chunk_end;
        }
    }
}

fn is_reset(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
    )
}

fn write_request(out: &mut Vec<u8>, host: &str, request: Request<'_>) {
    out.clear();
    out.extend_from_slice(if request.post { b"POST " } else { b"GET " });
    out.extend_from_slice(request.path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\nx-client-id: ");
    out.extend_from_slice(request.client_id.as_bytes());
    if let Some(class) = request.class {
        out.extend_from_slice(b"\r\nx-request-class: ");
        out.extend_from_slice(class.as_bytes());
    }
    if request.post {
        out.extend_from_slice(b"\r\ncontent-type: application/json\r\ncontent-length: ");
        out.extend_from_slice(request.body.len().to_string().as_bytes());
    }
    out.extend_from_slice(b"\r\n\r\n");
    if request.post {
        out.extend_from_slice(request.body);
    }
}

/// The head, once `input` holds all of it; `None` while it is partial.
fn parse_head(input: &[u8]) -> Result<Option<Head>, Failure> {
    let malformed = Failure::Transport(TransportError::Other);
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let length = match response.parse(input) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(malformed),
    };
    let status = response
        .code
        .ok_or(Failure::Transport(TransportError::Other))?;
    let mut head = Head {
        length,
        status,
        retry_after_secs: None,
        shed_level: None,
        queued: None,
        body: BodyLength::UntilClose,
        close: response.version == Some(0),
    };
    for header in response.headers.iter() {
        let value = std::str::from_utf8(header.value).unwrap_or("").trim();
        if header.name.eq_ignore_ascii_case("content-length") {
            let length = value
                .parse()
                .map_err(|_| Failure::Transport(TransportError::Other))?;
            if head.body != BodyLength::Chunked {
                head.body = BodyLength::Exactly(length);
            }
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            if value.eq_ignore_ascii_case("chunked") {
                head.body = BodyLength::Chunked;
            }
        } else if header.name.eq_ignore_ascii_case("connection") {
            head.close |= value.eq_ignore_ascii_case("close");
        } else if header.name.eq_ignore_ascii_case("retry-after") {
            head.retry_after_secs = value.parse().ok();
        } else if header.name.eq_ignore_ascii_case("x-shed-level") {
            head.shed_level = value.parse().ok();
        } else if header.name.eq_ignore_ascii_case("server-timing") {
            head.queued = head.queued.or_else(|| Queued::of_server_timing(value));
        }
    }
    // No body for these, whatever the headers say.
    if status == 204 || status == 304 || (100..200).contains(&status) {
        head.body = BodyLength::Exactly(0);
    }
    Ok(Some(head))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncBufReadExt, BufReader};
    use tokio::net::TcpListener;

    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    /// A server that answers each connection's requests with `answers` in turn (raw bytes),
    /// then closes it; counts connections.
    async fn scripted(answers: Vec<&'static [u8]>) -> (SocketAddr, tokio::task::JoinHandle<u32>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let handle = tokio::spawn(async move {
            let mut connections = 0;
            let mut answers = answers.into_iter();
            while let Ok(Ok((stream, _))) =
                tokio::time::timeout(Duration::from_millis(500), listener.accept()).await
            {
                connections += 1;
                let mut reader = BufReader::new(stream);
                loop {
                    // Read one request head (and a content-length body).
                    let mut length = 0;
                    let mut line = String::new();
                    let mut got_any = false;
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                            break;
                        }
                        got_any = true;
                        if let Some(value) =
                            line.to_ascii_lowercase().strip_prefix("content-length:")
                        {
                            length = value.trim().parse().unwrap();
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    if !got_any {
                        break;
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).await.unwrap();
                    let Some(answer) = answers.next() else { break };
                    if answer.is_empty() {
                        break; // close without answering
                    }
                    reader.get_mut().write_all(answer).await.unwrap();
                    if answers.len() == 0 {
                        break; // the script is over: close after the last answer
                    }
                }
            }
            connections
        });
        (address, handle)
    }

    fn get(path: &str) -> Request<'_> {
        Request {
            post: false,
            path,
            client_id: "app-ios-1",
            class: None,
            body: b"",
        }
    }

    #[test]
    fn the_head_names_a_class_only_when_one_is_given() {
        let mut out = Vec::new();
        let prefetch = Request {
            class: Some("prefetch"),
            ..get("/api/v1/items/jd/100002/rebate")
        };
        write_request(&mut out, "127.0.0.1:8080", prefetch);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "GET /api/v1/items/jd/100002/rebate HTTP/1.1\r\nhost: 127.0.0.1:8080\r\n\
             x-client-id: app-ios-1\r\nx-request-class: prefetch\r\n\r\n"
        );
        // The reused buffer holds only the next head, without the class.
        write_request(&mut out, "h", get("/a"));
        assert_eq!(
            String::from_utf8_lossy(&out),
            "GET /a HTTP/1.1\r\nhost: h\r\nx-client-id: app-ios-1\r\n\r\n"
        );
        let list = Request {
            post: true,
            body: b"[1]",
            ..get("/b")
        };
        write_request(&mut out, "h", list);
        assert!(!String::from_utf8_lossy(&out).contains("x-request-class"));
    }

    #[tokio::test]
    async fn keep_alive_reuses_one_connection_and_reads_the_head() {
        let answer: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 2\r\nx-shed-level: 3\r\nserver-timing: admission;desc=timed_out;dur=250.125\r\ncontent-length: 7\r\n\r\n{\"a\":1}";
        let (server, connections) = scripted(vec![answer, answer, answer]).await;
        let pool = Pool::new(None, SECOND, SECOND);
        for _ in 0..3 {
            let response = pool.send(server, "x", get("/a")).await.unwrap();
            assert_eq!(response.status, 503);
            assert_eq!(response.retry_after_secs, Some(2));
            assert_eq!(response.shed_level, Some(3));
            assert_eq!(
                response.queued,
                Some(Queued {
                    outcome: QueueOutcome::TimedOut,
                    wait: Duration::from_micros(250_125),
                })
            );
            assert_eq!(response.body, b"{\"a\":1}");
        }
        assert_eq!(pool.idle_connections(), 1);
        drop(pool);
        assert_eq!(connections.await.unwrap(), 1);
    }

    #[test]
    fn the_admission_metric_is_read_from_server_timing_and_anything_else_is_not() {
        let queued = |outcome, micros| {
            Some(Queued {
                outcome,
                wait: Duration::from_micros(micros),
            })
        };
        let cases = [
            (
                "admission;desc=admitted;dur=12.5",
                queued(QueueOutcome::Admitted, 12_500),
            ),
            (
                "db;dur=3, admission; dur=0.000 ;desc=\"full\"",
                queued(QueueOutcome::Full, 0),
            ),
            (
                "admission;desc=timed_out;dur=1",
                queued(QueueOutcome::TimedOut, 1_000),
            ),
            ("db;dur=3", None),
            ("admission;desc=admitted", None),
            ("admission;dur=4", None),
            ("admission;desc=maybe;dur=4", None),
            ("admission;desc=admitted;dur=-1", None),
            ("admission;desc=admitted;dur=x", None),
            ("", None),
        ];
        for (value, expected) in cases {
            assert_eq!(Queued::of_server_timing(value), expected, "{value:?}");
        }
    }

    #[tokio::test]
    async fn a_chunked_body_is_decoded_and_the_connection_kept() {
        let answer: &[u8] =
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        let (server, _) = scripted(vec![answer]).await;
        let pool = Pool::new(None, SECOND, SECOND);
        let response = pool.send(server, "x", get("/")).await.unwrap();
        assert_eq!(
            (response.status, response.body.as_slice()),
            (200, &b"abcde"[..])
        );
        assert_eq!(pool.idle_connections(), 1);
    }

    #[tokio::test]
    async fn connection_close_and_a_body_until_close_are_not_pooled() {
        let close: &[u8] = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok";
        let (server, _) = scripted(vec![close]).await;
        let pool = Pool::new(None, SECOND, SECOND);
        assert_eq!(pool.send(server, "x", get("/")).await.unwrap().body, b"ok");
        assert_eq!(pool.idle_connections(), 0);

        let until_close: &[u8] = b"HTTP/1.1 200 OK\r\n\r\nall of it";
        let (server, _) = scripted(vec![until_close]).await;
        let response = pool.send(server, "x", get("/")).await.unwrap();
        assert_eq!(response.body, b"all of it");
        assert_eq!(pool.idle_connections(), 0);
    }

    #[tokio::test]
    async fn a_pooled_connection_the_server_closed_is_retried_once_on_a_new_one() {
        let ok: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        // First connection: one answer, then closed without answering the second request.
        let (server, connections) = scripted(vec![ok, b"", ok]).await;
        let pool = Pool::new(None, SECOND, SECOND);
        assert_eq!(pool.send(server, "x", get("/")).await.unwrap().status, 200);
        assert_eq!(pool.send(server, "x", get("/")).await.unwrap().status, 200);
        drop(pool);
        assert_eq!(connections.await.unwrap(), 2);
    }

    #[tokio::test]
    async fn a_fresh_connection_closed_before_an_answer_is_a_connect_failure() {
        let (server, _) = scripted(vec![b""]).await;
        let pool = Pool::new(None, SECOND, SECOND);
        assert_eq!(
            pool.send(server, "x", get("/")).await,
            Err(TransportError::Connect)
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_failure() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = listener.local_addr().unwrap();
        drop(listener);
        let pool = Pool::new(None, SECOND, SECOND);
        assert_eq!(
            pool.send(server, "x", get("/")).await,
            Err(TransportError::Connect)
        );
    }

    #[tokio::test]
    async fn a_body_cut_short_or_bytes_past_the_answer_are_other_failures_never_pooled() {
        let short: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc";
        let (server, _) = scripted(vec![short]).await;
        let pool = Pool::new(None, SECOND, SECOND);
        assert_eq!(
            pool.send(server, "x", get("/")).await,
            Err(TransportError::Other)
        );

        let extra: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1";
        let (server, _) = scripted(vec![extra]).await;
        assert_eq!(
            pool.send(server, "x", get("/")).await,
            Err(TransportError::Other)
        );
        assert_eq!(pool.idle_connections(), 0);
    }

    #[tokio::test]
    async fn an_oversized_body_is_refused_before_it_is_read() {
        let huge: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 999999999999\r\n\r\n";
        let (server, _) = scripted(vec![huge]).await;
        let pool = Pool::new(None, SECOND, SECOND);
        assert_eq!(
            pool.send(server, "x", get("/")).await,
            Err(TransportError::Other)
        );
    }

    #[tokio::test]
    async fn a_chunk_size_past_the_bound_is_refused_without_overflow() {
        let huge: &[u8] =
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\nffffffffffffffff\r\n";
        let (server, _) = scripted(vec![huge]).await;
        let pool = Pool::new(None, SECOND, SECOND);
        assert_eq!(
            pool.send(server, "x", get("/")).await,
            Err(TransportError::Other)
        );
    }

    #[tokio::test]
    async fn a_post_carries_its_body_and_the_client_id() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = listener.local_addr().unwrap();
        let seen = tokio::spawn(async move {
            let (mut stream, peer) = listener.accept().await.unwrap();
            let mut request = vec![0; 4096];
            let mut filled = 0;
            while !request[..filled].ends_with(b"[1]") {
                filled += stream.read(&mut request[filled..]).await.unwrap();
            }
            stream
                .write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
                .await
                .unwrap();
            (String::from_utf8(request[..filled].to_vec()).unwrap(), peer)
        });
        let source: IpAddr = "127.0.1.7".parse().unwrap();
        let pool = Pool::new(Some(source), SECOND, SECOND);
        let request = Request {
            post: true,
            path: "/b",
            client_id: "h5-web-9",
            class: None,
            body: b"[1]",
        };
        let response = pool.send(server, "h:1", request).await.unwrap();
        assert_eq!((response.status, response.body.len()), (204, 0));
        let (text, peer) = seen.await.unwrap();
        assert!(
            text.starts_with("POST /b HTTP/1.1\r\nhost: h:1\r\n"),
            "{text}"
        );
        assert!(text.contains("x-client-id: h5-web-9\r\n"), "{text}");
        assert!(text.contains("content-type: application/json\r\ncontent-length: 3\r\n\r\n[1]"));
        assert_eq!(peer.ip(), source);
    }

    #[tokio::test]
    async fn connections_idle_past_the_idle_timeout_are_dropped_not_reused() {
        let ok: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let (server, connections) = scripted(vec![ok, ok]).await;
        // Every pooled connection is past an idle timeout of zero.
        let pool = Pool::new(None, SECOND, Duration::ZERO);
        pool.send(server, "x", get("/")).await.unwrap();
        assert_eq!(pool.idle_connections(), 1);
        pool.send(server, "x", get("/")).await.unwrap();
        drop(pool);
        assert_eq!(connections.await.unwrap(), 2);
    }
}
