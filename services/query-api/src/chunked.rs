//! The chunk-size check: a request body sent `Transfer-Encoding: chunked` whose chunk announces
//! more bytes than the listener takes is refused (413) as soon as the size line arrives, as a
//! declared `Content-Length` over the limit is, instead of waiting for bytes the client may
//! never send until the body timeout.
//!
//! Contract: nothing here allocates or blocks; the state per connection is a few words. The check
//! never refuses a request hyper frames differently from the [`FramingSniffer`]: where the two
//! could disagree the sniffer stops ([`FramingSniffer::is_lost`]) and the body timeout is the
//! bound again, as before. Depends on nothing else in the crate.
//!
//! # A chunked body, byte by byte
//! - hyper decodes chunked bodies without showing their chunk sizes, and reads as much as the
//!   socket holds: a body's first size line (and pipelined requests after it) usually arrives in
//!   the same read as its head, before hyper has parsed that head and handed it to the service.
//!   So no part of the server learns in time where a body starts except a parser that has
//!   followed every byte since the connection opened.
//! - [`FramingSniffer`] is that parser: it follows the connection's bytes as `BoundedIo` (in
//!   `crate::server`) reads them — request heads to their empty line, noting `Content-Length`
//!   and `Transfer-Encoding` lines as hyper does, `Content-Length` bodies skipped whole, chunked
//!   bodies through size lines, data, the last chunk and trailers — and notes the first chunked
//!   request (by its ordinal among the connection's chunked requests) with a chunk size over the
//!   limit, as soon as the size's digits pass it.
//! - [`ChunkedRequests`] counts the requests with a `Transfer-Encoding` header the service has
//!   been handed; hyper hands a request over before it reads its body. When that count reaches
//!   the noted ordinal, the request hyper is serving is the one with the oversized chunk:
//!   [`ChunkGuard::check`] fails the connection's next read with [`ChunkTooLarge`] instead of
//!   waiting on the socket. hyper passes the error to the request's body, and the edge
//!   (`http::edge`) finds it there ([`is_chunk_too_large`]) and answers `413 payload_too_large`
//!   with `connection: close`.
//!
//! The limit is the listener's largest body limit (`ConnectionLimits::body_limit_bytes`): the
//! connection does not know which route a request will take, so a route with a smaller limit
//! (the admin listener's routes other than the warm-job submission) still gets its own 413 from
//! the edge's body read, once the data passes its limit or at the body timeout.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::{HeaderMap, header};

/// The error a connection's read fails with when the request being served announced a chunk
/// over the limit. Zero-sized: the edge only asks whether it is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a chunk of the request body announces more bytes than the body limit")]
pub struct ChunkTooLarge;

/// Whether `error` or one of its causes is [`ChunkTooLarge`] (as the body of a request whose
/// connection read failed with it reports it: wrapped by hyper, then by axum).
pub fn is_chunk_too_large(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(current) = cause {
        if current.is::<ChunkTooLarge>() {
            return true;
        }
        // `io::Error::source` skips the error it wraps; `get_ref` is that error.
        if let Some(io_error) = current.downcast_ref::<io::Error>()
            && io_error
                .get_ref()
                .is_some_and(|inner| inner.is::<ChunkTooLarge>())
        {
            return true;
        }
        cause = current.source();
    }
    false
}

/// The requests with a `Transfer-Encoding` header the service has been handed on one
/// connection, counted by the service as hyper hands them over (before it reads their bodies).
#[derive(Debug, Default)]
pub struct ChunkedRequests {
    handed: AtomicU64,
}

impl ChunkedRequests {
    /// Counts the request whose head is `headers`, if hyper frames its body as chunked: a
    /// request with a `Transfer-Encoding` header whose last coding is not `chunked` never
    /// reaches the service (hyper answers 400 itself).
    pub fn request_started(&self, headers: &HeaderMap) {
        if headers.contains_key(header::TRANSFER_ENCODING) {
            self.handed.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn handed(&self) -> u64 {
        self.handed.load(Ordering::Relaxed)
    }
}

/// What a connection's reads carry for the check: the sniffer over its bytes and the service's
/// count of chunked requests.
#[derive(Debug)]
pub struct ChunkGuard {
    sniffer: FramingSniffer,
    requests: Arc<ChunkedRequests>,
}

impl ChunkGuard {
    /// A guard for a new connection whose largest acceptable body is `body_limit_bytes`.
    pub fn new(body_limit_bytes: usize) -> Self {
        Self {
            sniffer: FramingSniffer::new(u64::try_from(body_limit_bytes).unwrap_or(u64::MAX)),
            requests: Arc::default(),
        }
    }

    /// The count the service keeps (see [`ChunkedRequests::request_started`]).
    pub fn requests(&self) -> Arc<ChunkedRequests> {
        Arc::clone(&self.requests)
    }

    /// `Err(ChunkTooLarge)` once the service has been handed the request that announced a chunk
    /// over the limit: its body must fail now rather than wait for the rest of the chunk.
    pub fn check(&self) -> io::Result<()> {
        match self.sniffer.oversized() {
            Some(ordinal) if ordinal == self.requests.handed() => {
                Err(io::Error::new(io::ErrorKind::InvalidData, ChunkTooLarge))
            }
            _ => Ok(()),
        }
    }

    /// Follows `bytes`, just read from the connection, then [`ChunkGuard::check`]s.
    pub fn inspect(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.sniffer.feed(bytes);
        self.check()
    }
}

/// The two header names that frame a request body, lowercase (names compare ASCII
/// case-insensitively).
const CONTENT_LENGTH: &[u8] = b"content-length";
const TRANSFER_ENCODING: &[u8] = b"transfer-encoding";
/// [`State::Name`]'s candidates: the framing headers the name read so far may still be.
const MAYBE_CONTENT_LENGTH: u8 = 1;
const MAYBE_TRANSFER_ENCODING: u8 = 2;

/// Where in the HTTP/1.1 byte stream the sniffer is. The head states follow httparse as hyper
/// configures it, leniently where the difference cannot move a message boundary (hyper refuses
/// such input and closes the connection); the body states follow hyper's decoders exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before a request line: empty lines are skipped (as httparse does).
    BetweenRequests,
    /// In the request line, up to its LF.
    RequestLine,
    /// At the start of a header line, or of the empty line that ends the head.
    LineStart,
    /// A CR at a line start: an LF makes the empty line that ends the head.
    LineStartCr,
    /// In a header name that may still be one of the framing headers: `matched` bytes of it.
    Name {
        matched: u8,
        candidates: u8,
    },
    /// The rest of a line that does not frame the body, up to its LF.
    SkipLine,
    /// A `Content-Length` value: its digits so far (`None` before the first), and whether
    /// whitespace has followed them (no digit may come after it).
    LengthValue {
        value: Option<u64>,
        ended: bool,
    },
    /// A CR in a `Content-Length` value: the line's LF must follow.
    LengthValueCr {
        value: Option<u64>,
    },
    /// A `Content-Length` body: bytes left.
    LengthBody {
        remaining: u64,
    },
    /// A chunk size line's first hex digit.
    ChunkSizeStart,
    /// More hex digits, whitespace, an extension or the line's CR.
    ChunkSize {
        size: u64,
    },
    /// Whitespace after the size: more of it, an extension or the CR.
    ChunkSizeSpace {
        size: u64,
    },
    /// A chunk extension, up to the CR.
    ChunkExtension {
        size: u64,
    },
    /// The size line's LF.
    ChunkSizeLf {
        size: u64,
    },
    /// A chunk's data: bytes left.
    ChunkData {
        remaining: u64,
    },
    /// The CR, then the LF, after a chunk's data.
    ChunkDataCr,
    ChunkDataLf,
    /// After the last chunk or a trailer line: a CR (the end) or a trailer line.
    TrailerLineStart,
    /// In a trailer line, up to its CR.
    Trailer,
    /// The LF after a trailer line.
    TrailerLf,
    /// The LF that ends a chunked body.
    BodyEndLf,
    /// Input hyper refuses (and closes the connection on): nothing more is followed.
    Lost,
}

/// Follows the HTTP/1.1 framing of a connection's bytes as they are read, in any split, and
/// notes the first chunked request that announces a chunk over `limit`. See the module docs.
#[derive(Debug, Clone)]
pub struct FramingSniffer {
    limit: u64,
    state: State,
    /// The head being read has a `Transfer-Encoding` line: its body is chunked (hyper frames
    /// it so, or refuses the request).
    transfer_encoding: bool,
    /// The head's `Content-Length` (ignored after a `Transfer-Encoding` line, as hyper does).
    content_length: Option<u64>,
    /// Heads read to their end.
    heads: u64,
    /// Of those, chunked ones: the ordinal of the chunked request being read.
    chunked_heads: u64,
    /// The ordinal of the first chunked request with a chunk size over `limit`.
    oversized: Option<u64>,
}

impl FramingSniffer {
    /// A sniffer at the start of a connection.
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            state: State::BetweenRequests,
            transfer_encoding: false,
            content_length: None,
            heads: 0,
            chunked_heads: 0,
            oversized: None,
        }
    }

    /// The ordinal (1 for the connection's first chunked request) of the first chunked request
    /// that announced a chunk over the limit.
    pub fn oversized(&self) -> Option<u64> {
        self.oversized
    }

    /// Request heads read to their end.
    pub fn heads(&self) -> u64 {
        self.heads
    }

    /// Of those, heads with a `Transfer-Encoding` line.
    pub fn chunked_heads(&self) -> u64 {
        self.chunked_heads
    }

    /// Whether the sniffer stopped at input hyper refuses.
    pub fn is_lost(&self) -> bool {
        self.state == State::Lost
    }

    /// Whether the bytes so far end between two requests.
    pub fn is_between_requests(&self) -> bool {
        self.state == State::BetweenRequests
    }

    /// Follows the next `bytes` of the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        let mut at = 0;
        while at < bytes.len() {
            let (next, taken) = self.step(&bytes[at..]);
            debug_assert!(taken > 0, "every step consumes a byte");
            self.state = next;
            at += taken;
        }
    }

    /// The state after the first bytes of the non-empty `bytes`, and how many it took (at least
    /// one: runs of bytes that change nothing are taken at once).
    fn step(&mut self, bytes: &[u8]) -> (State, usize) {
        let byte = bytes[0];
        let next = match self.state {
            State::Lost => return (State::Lost, bytes.len()),
            State::LengthBody { remaining } => {
                let taken = remaining.min(bytes.len() as u64);
                let next = match remaining - taken {
                    0 => State::BetweenRequests,
                    remaining => State::LengthBody { remaining },
                };
                return (next, taken as usize);
            }
            State::ChunkData { remaining } => {
                let taken = remaining.min(bytes.len() as u64);
                let next = match remaining - taken {
                    0 => State::ChunkDataCr,
                    remaining => State::ChunkData { remaining },
                };
                return (next, taken as usize);
            }
            State::RequestLine | State::SkipLine => {
                return match bytes.iter().position(|&next| next == b'\n') {
                    Some(lf) => (State::LineStart, lf + 1),
                    None => (self.state, bytes.len()),
                };
            }
            State::Trailer => {
                return match bytes.iter().position(|&next| next == b'\r') {
                    Some(cr) => (State::TrailerLf, cr + 1),
                    None => (State::Trailer, bytes.len()),
                };
            }
            State::BetweenRequests => match byte {
                b'\r' | b'\n' => State::BetweenRequests,
                // The request line's first byte.
                _ => {
                    self.transfer_encoding = false;
                    self.content_length = None;
                    State::RequestLine
                }
            },
            State::LineStart => match byte {
                b'\r' => State::LineStartCr,
                b'\n' => self.head_ended(),
                _ => self.name(0, MAYBE_CONTENT_LENGTH | MAYBE_TRANSFER_ENCODING, byte),
            },
            State::LineStartCr => match byte {
                b'\n' => self.head_ended(),
                // A line that starts with a CR is no header httparse takes; it frames nothing.
                _ => State::SkipLine,
            },
            State::Name {
                matched,
                candidates,
            } => self.name(matched, candidates, byte),
            State::LengthValue { value, ended } => match byte {
                b' ' | b'\t' => State::LengthValue {
                    value,
                    ended: value.is_some(),
                },
                b'0'..=b'9' if !ended => {
                    let digit = u64::from(byte - b'0');
                    let tens = value.unwrap_or(0).checked_mul(10);
                    match tens.and_then(|tens| tens.checked_add(digit)) {
                        Some(value) => State::LengthValue {
                            value: Some(value),
                            ended,
                        },
                        None => State::Lost,
                    }
                }
                b'\r' => State::LengthValueCr { value },
                b'\n' => self.length_line_ended(value),
                _ => State::Lost,
            },
            State::LengthValueCr { value } => match byte {
                b'\n' => self.length_line_ended(value),
                _ => State::Lost,
            },
            State::ChunkSizeStart => match hex_digit(byte) {
                Some(digit) => self.chunk_size(digit),
                None => State::Lost,
            },
            State::ChunkSize { size } => match byte {
                b' ' | b'\t' => State::ChunkSizeSpace { size },
                b';' => State::ChunkExtension { size },
                b'\r' => State::ChunkSizeLf { size },
                _ => match hex_digit(byte)
                    .and_then(|digit| size.checked_mul(16)?.checked_add(digit))
                {
                    Some(size) => self.chunk_size(size),
                    None => State::Lost,
                },
            },
            State::ChunkSizeSpace { size } => match byte {
                b' ' | b'\t' => State::ChunkSizeSpace { size },
                b';' => State::ChunkExtension { size },
                b'\r' => State::ChunkSizeLf { size },
                _ => State::Lost,
            },
            State::ChunkExtension { size } => match byte {
                b'\r' => State::ChunkSizeLf { size },
                b'\n' => State::Lost,
                _ => State::ChunkExtension { size },
            },
            State::ChunkSizeLf { size } => match (byte, size) {
                (b'\n', 0) => State::TrailerLineStart,
                (b'\n', size) => State::ChunkData { remaining: size },
                _ => State::Lost,
            },
            State::ChunkDataCr => match byte {
                b'\r' => State::ChunkDataLf,
                _ => State::Lost,
            },
            State::ChunkDataLf => match byte {
                b'\n' => State::ChunkSizeStart,
                _ => State::Lost,
            },
            State::TrailerLineStart => match byte {
                b'\r' => State::BodyEndLf,
                _ => State::Trailer,
            },
            State::TrailerLf => match byte {
                b'\n' => State::TrailerLineStart,
                _ => State::Lost,
            },
            State::BodyEndLf => match byte {
                b'\n' => State::BetweenRequests,
                _ => State::Lost,
            },
        };
        (next, 1)
    }

    /// The state after `byte` of a header name of which `matched` bytes may still be one of
    /// `candidates`.
    fn name(&mut self, matched: u8, candidates: u8, byte: u8) -> State {
        if byte == b':' {
            let matched = usize::from(matched);
            if candidates & MAYBE_TRANSFER_ENCODING != 0 && matched == TRANSFER_ENCODING.len() {
                self.transfer_encoding = true;
                return State::SkipLine;
            }
            // After a `Transfer-Encoding` line hyper skips `Content-Length` lines unread.
            if candidates & MAYBE_CONTENT_LENGTH != 0
                && matched == CONTENT_LENGTH.len()
                && !self.transfer_encoding
            {
                return State::LengthValue {
                    value: None,
                    ended: false,
                };
            }
            return State::SkipLine;
        }
        if byte == b'\n' {
            // A line without a colon (httparse refuses it): it frames nothing.
            return State::LineStart;
        }
        let lower = byte.to_ascii_lowercase();
        let index = usize::from(matched);
        let mut still = 0;
        if candidates & MAYBE_CONTENT_LENGTH != 0 && CONTENT_LENGTH.get(index) == Some(&lower) {
            still |= MAYBE_CONTENT_LENGTH;
        }
        if candidates & MAYBE_TRANSFER_ENCODING != 0 && TRANSFER_ENCODING.get(index) == Some(&lower)
        {
            still |= MAYBE_TRANSFER_ENCODING;
        }
        match still {
            0 => State::SkipLine,
            // At most 17 (the longer name's length): a u8 holds it.
            _ => State::Name {
                matched: matched + 1,
                candidates: still,
            },
        }
    }

    /// The state after a `Content-Length` line whose digits were `value`: hyper refuses an
    /// empty value and two lines that differ.
    fn length_line_ended(&mut self, value: Option<u64>) -> State {
        match (value, self.content_length) {
            (None, _) => State::Lost,
            (Some(value), Some(earlier)) if value != earlier => State::Lost,
            (Some(value), _) => {
                self.content_length = Some(value);
                State::LineStart
            }
        }
    }

    /// The state after a head's empty line: its body's first.
    fn head_ended(&mut self) -> State {
        self.heads += 1;
        if self.transfer_encoding {
            self.chunked_heads += 1;
            return State::ChunkSizeStart;
        }
        match self.content_length {
            Some(length) if length > 0 => State::LengthBody { remaining: length },
            _ => State::BetweenRequests,
        }
    }

    /// Notes a chunk size (its digits so far: more only make it larger) and reads on.
    fn chunk_size(&mut self, size: u64) -> State {
        if size > self.limit && self.oversized.is_none() {
            self.oversized = Some(self.chunked_heads);
        }
        State::ChunkSize { size }
    }
}

fn hex_digit(byte: u8) -> Option<u64> {
    char::from(byte).to_digit(16).map(u64::from)
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::time::Duration;

    use http_body_util::BodyExt;
    use proptest::prelude::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// What a sniffer made of a stream.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    struct Outcome {
        heads: u64,
        chunked_heads: u64,
        oversized: Option<u64>,
        lost: bool,
        between_requests: bool,
    }

    /// The sniffer's outcome with `stream` read in pieces, cut at `cuts` (offsets, any order).
    fn sniffed(stream: &[u8], cuts: &[usize], limit: u64) -> Outcome {
        let mut cuts: Vec<usize> = cuts.iter().map(|cut| cut % (stream.len() + 1)).collect();
        cuts.push(0);
        cuts.push(stream.len());
        cuts.sort_unstable();
        let mut sniffer = FramingSniffer::new(limit);
        for piece in cuts.windows(2) {
            sniffer.feed(&stream[piece[0]..piece[1]]);
        }
        Outcome {
            heads: sniffer.heads(),
            chunked_heads: sniffer.chunked_heads(),
            oversized: sniffer.oversized(),
            lost: sniffer.is_lost(),
            between_requests: sniffer.is_between_requests(),
        }
    }

    /// How the reference parser stopped.
    #[derive(Debug, PartialEq, Eq)]
    enum Halt {
        BetweenRequests,
        Incomplete,
        Lost,
    }

    /// The reference: the sniffer's language parsed from the whole stream at once, message by
    /// message and line by line, written without the state machine.
    fn reference(stream: &[u8], limit: u64) -> Outcome {
        let mut outcome = Outcome::default();
        let halt = reference_messages(stream, limit, &mut outcome);
        outcome.lost = halt == Halt::Lost;
        outcome.between_requests = halt == Halt::BetweenRequests;
        outcome
    }

    fn find(bytes: &[u8], wanted: u8) -> Option<usize> {
        bytes.iter().position(|&byte| byte == wanted)
    }

    fn starts_with_ignore_case(line: &[u8], name: &[u8]) -> bool {
        line.len() >= name.len() && line[..name.len()].eq_ignore_ascii_case(name)
    }

    /// A `Content-Length` value (the line after the colon, its LF excluded): `Ok(None)` while
    /// the line may still become valid.
    fn reference_length(value: &[u8], complete: bool) -> Result<Option<u64>, ()> {
        let value = match value.split_last() {
            Some((b'\r', before)) => before,
            _ => value,
        };
        if value.contains(&b'\r') {
            return Err(());
        }
        let is_space = |byte: &u8| *byte == b' ' || *byte == b'\t';
        let start = value
            .iter()
            .position(|byte| !is_space(byte))
            .unwrap_or(value.len());
        let digits_end = value[start..]
            .iter()
            .position(|byte| !byte.is_ascii_digit())
            .map_or(value.len(), |end| start + end);
        if !value[digits_end..].iter().all(is_space) {
            return Err(());
        }
        let mut number = 0u64;
        for digit in &value[start..digits_end] {
            number = number
                .checked_mul(10)
                .and_then(|tens| tens.checked_add(u64::from(digit - b'0')))
                .ok_or(())?;
        }
        match (complete, digits_end > start) {
            (false, _) => Ok(None),
            (true, true) => Ok(Some(number)),
            (true, false) => Err(()),
        }
    }

    fn reference_messages(mut rest: &[u8], limit: u64, outcome: &mut Outcome) -> Halt {
        loop {
            while let [b'\r' | b'\n', tail @ ..] = rest {
                rest = tail;
            }
            if rest.is_empty() {
                return Halt::BetweenRequests;
            }
            let Some(request_line_end) = find(rest, b'\n') else {
                return Halt::Incomplete;
            };
            rest = &rest[request_line_end + 1..];
            let mut chunked = false;
            let mut length: Option<u64> = None;
            loop {
                let (line, complete) = match find(rest, b'\n') {
                    Some(lf) => (&rest[..lf], true),
                    None => (rest, false),
                };
                if complete && (line.is_empty() || line == b"\r") {
                    rest = &rest[line.len() + 1..];
                    break;
                }
                if starts_with_ignore_case(line, TRANSFER_ENCODING)
                    && line.get(TRANSFER_ENCODING.len()) == Some(&b':')
                {
                    chunked = true;
                } else if !chunked
                    && starts_with_ignore_case(line, CONTENT_LENGTH)
                    && line.get(CONTENT_LENGTH.len()) == Some(&b':')
                {
                    match reference_length(&line[CONTENT_LENGTH.len() + 1..], complete) {
                        Err(()) => return Halt::Lost,
                        Ok(None) => {}
                        Ok(Some(value)) => {
                            if length.is_some_and(|earlier| earlier != value) {
                                return Halt::Lost;
                            }
                            length = Some(value);
                        }
                    }
                }
                if !complete {
                    return Halt::Incomplete;
                }
                rest = &rest[line.len() + 1..];
            }
            outcome.heads += 1;
            if chunked {
                outcome.chunked_heads += 1;
                match reference_chunked(rest, limit, outcome) {
                    Ok(after) => rest = after,
                    Err(halt) => return halt,
                }
            } else {
                let length = usize::try_from(length.unwrap_or(0)).unwrap_or(usize::MAX);
                if rest.len() < length {
                    return Halt::Incomplete;
                }
                rest = &rest[length..];
            }
        }
    }

    /// `rest` must start with `expected`.
    fn expect(rest: &[u8], expected: u8) -> Result<&[u8], Halt> {
        match rest.split_first() {
            None => Err(Halt::Incomplete),
            Some((&byte, after)) if byte == expected => Ok(after),
            Some(_) => Err(Halt::Lost),
        }
    }

    /// A chunked body at the start of `rest`; what follows it.
    fn reference_chunked<'a>(
        mut rest: &'a [u8],
        limit: u64,
        outcome: &mut Outcome,
    ) -> Result<&'a [u8], Halt> {
        loop {
            let digits = rest
                .iter()
                .position(|byte| !byte.is_ascii_hexdigit())
                .unwrap_or(rest.len());
            if digits == 0 {
                return Err(if rest.is_empty() {
                    Halt::Incomplete
                } else {
                    Halt::Lost
                });
            }
            let mut size = 0u64;
            for digit in &rest[..digits] {
                let value = u64::from(char::from(*digit).to_digit(16).unwrap());
                size = size
                    .checked_mul(16)
                    .and_then(|sixteens| sixteens.checked_add(value))
                    .ok_or(Halt::Lost)?;
                if size > limit && outcome.oversized.is_none() {
                    outcome.oversized = Some(outcome.chunked_heads);
                }
            }
            rest = &rest[digits..];
            let spaces = rest
                .iter()
                .position(|byte| *byte != b' ' && *byte != b'\t')
                .unwrap_or(rest.len());
            rest = &rest[spaces..];
            match rest.first() {
                None => return Err(Halt::Incomplete),
                Some(b';') => {
                    let end = rest
                        .iter()
                        .position(|byte| *byte == b'\r' || *byte == b'\n');
                    match end.map(|end| rest[end]) {
                        None => return Err(Halt::Incomplete),
                        Some(b'\n') => return Err(Halt::Lost),
                        Some(_) => rest = &rest[end.unwrap() + 1..],
                    }
                }
                Some(b'\r') => rest = &rest[1..],
                Some(_) => return Err(Halt::Lost),
            }
            rest = expect(rest, b'\n')?;
            if size == 0 {
                break;
            }
            let size = usize::try_from(size).unwrap_or(usize::MAX);
            if rest.len() < size {
                return Err(Halt::Incomplete);
            }
            rest = expect(expect(&rest[size..], b'\r')?, b'\n')?;
        }
        // Trailer lines, then the empty line.
        loop {
            match rest.first() {
                None => return Err(Halt::Incomplete),
                Some(b'\r') => return expect(&rest[1..], b'\n'),
                Some(_) => {
                    let Some(cr) = find(&rest[1..], b'\r') else {
                        return Err(Halt::Incomplete);
                    };
                    rest = expect(&rest[1 + cr + 1..], b'\n')?;
                }
            }
        }
    }

    const CHUNKED_HEAD: &[u8] = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";

    #[test]
    fn a_size_over_the_limit_is_noted_as_its_digits_pass_it() {
        let mut sniffer = FramingSniffer::new(0xffff);
        sniffer.feed(CHUNKED_HEAD);
        sniffer.feed(b"fff");
        assert_eq!(sniffer.oversized(), None);
        sniffer.feed(b"f");
        assert_eq!(sniffer.oversized(), None, "0xffff is the limit itself");
        sniffer.feed(b"0");
        assert_eq!(sniffer.oversized(), Some(1), "before the line's end");
    }

    #[test]
    fn only_chunked_requests_count_and_bodies_are_skipped_whole() {
        let mut sniffer = FramingSniffer::new(100);
        // A GET, a body that looks like a chunked request, then a chunked request of small
        // chunks with an extension and a trailer, then one announcing too much.
        sniffer.feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        let fake = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nFFFF\r\n";
        sniffer
            .feed(format!("POST / HTTP/1.1\r\ncontent-length: {}\r\n\r\n", fake.len()).as_bytes());
        sniffer.feed(fake);
        sniffer.feed(CHUNKED_HEAD);
        sniffer.feed(b"5;a=b\r\nhello\r\n0\r\nx-trailer: 1\r\n\r\n");
        assert!(sniffer.is_between_requests());
        assert_eq!((sniffer.heads(), sniffer.chunked_heads()), (3, 1));
        sniffer.feed(CHUNKED_HEAD);
        sniffer.feed(b"65\r\n");
        assert_eq!(sniffer.oversized(), Some(2));
    }

    #[test]
    fn input_hyper_refuses_stops_the_sniffer_for_good() {
        let mut sniffer = FramingSniffer::new(100);
        sniffer.feed(b"POST / HTTP/1.1\r\ncontent-length: 5x\r\n\r\n");
        assert!(sniffer.is_lost());
        sniffer.feed(CHUNKED_HEAD);
        sniffer.feed(b"FFFFFFFF\r\n");
        assert_eq!(sniffer.oversized(), None);
    }

    #[test]
    fn the_guard_fails_reads_once_the_oversized_request_is_being_served() {
        let mut guard = ChunkGuard::new(10);
        let requests = guard.requests();
        let chunked = HeaderMap::from_iter([(
            header::TRANSFER_ENCODING,
            axum::http::HeaderValue::from_static("chunked"),
        )]);
        // The first chunked request is fine; the second announces 16 bytes, in the same read.
        let mut stream = CHUNKED_HEAD.to_vec();
        stream.extend_from_slice(b"1\r\na\r\n0\r\n\r\n");
        stream.extend_from_slice(CHUNKED_HEAD);
        stream.extend_from_slice(b"10\r\n");
        guard.inspect(&stream).unwrap();
        requests.request_started(&HeaderMap::new());
        requests.request_started(&chunked);
        guard.check().unwrap();
        requests.request_started(&chunked);
        let error = guard.check().unwrap_err();
        assert!(is_chunk_too_large(&error));
    }

    // ---- Generated streams -------------------------------------------------------------------

    /// One chunk of a generated chunked body.
    #[derive(Debug, Clone)]
    struct Chunk {
        data: Vec<u8>,
        uppercase: bool,
        leading_zeros: usize,
        space: bool,
        extension: Option<String>,
    }

    #[derive(Debug, Clone)]
    enum Body {
        None,
        Length(Vec<u8>),
        Chunked {
            chunks: Vec<Chunk>,
            trailers: Vec<String>,
            /// A last size line that announces this many bytes, none of which follow.
            announced: Option<u64>,
        },
    }

    #[derive(Debug, Clone)]
    struct Message {
        empty_lines_before: usize,
        lf_only: bool,
        headers: Vec<(String, String)>,
        body: Body,
        /// The framing header's name with its letters' case flipped where `true`.
        name_case: Vec<bool>,
    }

    fn flip_case(name: &str, flips: &[bool]) -> String {
        name.chars()
            .zip(flips.iter().chain(std::iter::repeat(&false)))
            .map(|(letter, flip)| {
                if *flip {
                    letter.to_ascii_uppercase()
                } else {
                    letter
                }
            })
            .collect()
    }

    fn render(message: &Message) -> Vec<u8> {
        let eol = if message.lf_only { "\n" } else { "\r\n" };
        let mut text = eol.repeat(message.empty_lines_before);
        text.push_str(&format!(
            "POST /api/v1/items:batch HTTP/1.1{eol}host: x{eol}"
        ));
        let mut bytes = text.into_bytes();
        let line = |bytes: &mut Vec<u8>, name: &str, value: &str| {
            bytes.extend_from_slice(format!("{name}:{value}{eol}").as_bytes());
        };
        for (name, value) in &message.headers {
            line(&mut bytes, name, value);
        }
        match &message.body {
            Body::None => bytes.extend_from_slice(eol.as_bytes()),
            Body::Length(data) => {
                let name = flip_case("content-length", &message.name_case);
                line(&mut bytes, &name, &format!(" {}", data.len()));
                bytes.extend_from_slice(eol.as_bytes());
                bytes.extend_from_slice(data);
            }
            Body::Chunked {
                chunks,
                trailers,
                announced,
            } => {
                let name = flip_case("transfer-encoding", &message.name_case);
                line(&mut bytes, &name, " chunked");
                bytes.extend_from_slice(eol.as_bytes());
                for chunk in chunks {
                    let size = if chunk.uppercase {
                        format!("{:X}", chunk.data.len())
                    } else {
                        format!("{:x}", chunk.data.len())
                    };
                    bytes.extend_from_slice("0".repeat(chunk.leading_zeros).as_bytes());
                    bytes.extend_from_slice(size.as_bytes());
                    if chunk.space {
                        bytes.extend_from_slice(b" \t");
                    }
                    if let Some(extension) = &chunk.extension {
                        bytes.extend_from_slice(format!(";{extension}").as_bytes());
                    }
                    bytes.extend_from_slice(b"\r\n");
                    bytes.extend_from_slice(&chunk.data);
                    bytes.extend_from_slice(b"\r\n");
                }
                match announced {
                    Some(size) => bytes.extend_from_slice(format!("{size:X}\r\n").as_bytes()),
                    None => {
                        bytes.extend_from_slice(b"0\r\n");
                        for trailer in trailers {
                            bytes.extend_from_slice(format!("{trailer}\r\n").as_bytes());
                        }
                        bytes.extend_from_slice(b"\r\n");
                    }
                }
            }
        }
        bytes
    }

    /// Bytes that look like framing to a careless parser.
    fn tricky_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(
            prop_oneof![
                Just(b"\r\n\r\n".to_vec()),
                Just(b"0\r\n\r\n".to_vec()),
                Just(b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFF\r\n".to_vec()),
                Just(b"content-length: 99\r\n".to_vec()),
                prop::collection::vec(any::<u8>(), 0..12),
            ],
            1..4,
        )
        .prop_map(|pieces| pieces.concat())
    }

    fn chunk() -> impl Strategy<Value = Chunk> {
        (
            tricky_bytes(),
            any::<bool>(),
            0..3usize,
            any::<bool>(),
            prop::option::of("[a-z]{1,4}(=[a-z0-9]{0,3})?"),
        )
            .prop_map(|(mut data, uppercase, leading_zeros, space, extension)| {
                // A chunk of size 0 is the last one.
                if data.is_empty() {
                    data.push(b'x');
                }
                Chunk {
                    data,
                    uppercase,
                    leading_zeros,
                    space,
                    extension,
                }
            })
    }

    fn body(announce: bool) -> impl Strategy<Value = Body> {
        let announced = if announce {
            prop::option::weighted(0.3, any::<u64>().prop_map(|size| size.max(1))).boxed()
        } else {
            Just(None).boxed()
        };
        prop_oneof![
            Just(Body::None),
            tricky_bytes().prop_map(Body::Length),
            (
                prop::collection::vec(chunk(), 0..4),
                prop::collection::vec("x-[a-z]{1,5}: [a-z0-9]{0,5}", 0..3),
                announced,
            )
                .prop_map(|(chunks, trailers, announced)| Body::Chunked {
                    chunks,
                    trailers,
                    announced,
                }),
        ]
    }

    /// Headers that do not frame the body, some of them close to the names that do.
    fn other_header() -> impl Strategy<Value = (String, String)> {
        (
            prop_oneof![
                Just("content-type"),
                Just("x-content-length"),
                Just("content-lengths"),
                Just("transfer-encodings"),
                Just("content"),
                Just("transfer"),
                Just("te"),
            ],
            "[ ]{0,2}[a-z0-9:;, ]{0,8}",
        )
            .prop_map(|(name, value)| (name.to_owned(), value))
    }

    /// Framing headers besides the one the body needs: hyper serves them, but closes the
    /// connection after a request with both `Content-Length` and `Transfer-Encoding`.
    fn extra_framing_header() -> impl Strategy<Value = (String, String)> {
        (
            prop_oneof![Just("Content-Length"), Just("transfer-encoding")],
            prop_oneof![
                Just(" 0".to_owned()),
                Just("3 ".to_owned()),
                Just(" chunked".to_owned()),
                "[ \t]{0,2}[0-9]{0,3}[ \t]{0,2}[0-9]?",
            ],
        )
            .prop_map(|(name, value)| (name.to_owned(), value))
    }

    /// A message; `all_framing`: with extra framing headers (not for the comparison with hyper).
    fn message(announce: bool, all_framing: bool) -> impl Strategy<Value = Message> {
        let header = if all_framing {
            prop_oneof![3 => other_header(), 1 => extra_framing_header()].boxed()
        } else {
            other_header().boxed()
        };
        (
            0..3usize,
            any::<bool>(),
            prop::collection::vec(header, 0..3),
            body(announce),
            prop::collection::vec(any::<bool>(), 17),
        )
            .prop_map(
                |(empty_lines_before, lf_only, headers, body, name_case)| Message {
                    empty_lines_before,
                    lf_only,
                    headers,
                    body,
                    name_case,
                },
            )
    }

    /// Pipelined requests, the stream ending at the first whose chunk is announced only.
    fn stream(announce: bool, all_framing: bool) -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(message(announce, all_framing), 1..5).prop_map(|messages| {
            let mut bytes = Vec::new();
            for message in &messages {
                bytes.extend_from_slice(&render(message));
                if matches!(
                    message.body,
                    Body::Chunked {
                        announced: Some(_),
                        ..
                    }
                ) {
                    break;
                }
            }
            bytes
        })
    }

    /// A stream with a few of its bytes replaced: input the sniffer must give up on exactly as
    /// the reference does.
    fn damaged_stream() -> impl Strategy<Value = Vec<u8>> {
        (
            stream(true, true),
            prop::collection::vec(
                (
                    any::<prop::sample::Index>(),
                    prop::sample::select(b"\r\n: 0f;xX\t-".to_vec()),
                ),
                0..4,
            ),
        )
            .prop_map(|(mut bytes, damage)| {
                if !bytes.is_empty() {
                    for (index, byte) in damage {
                        let at = index.index(bytes.len());
                        bytes[at] = byte;
                    }
                }
                bytes
            })
    }

    fn limit() -> impl Strategy<Value = u64> {
        prop_oneof![0..64u64, Just(65_536u64), Just(u64::MAX - 1), any::<u64>()]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// However the stream is cut into reads, the sniffer ends where the reference parser
        /// does: the same heads, chunked heads, oversized request, and the same place (between
        /// requests, inside one, or given up).
        #[test]
        fn the_sniffer_agrees_with_the_reference_for_any_split(
            stream in damaged_stream(),
            cuts in prop::collection::vec(any::<usize>(), 0..12),
            limit in limit(),
        ) {
            prop_assert_eq!(sniffed(&stream, &cuts, limit), reference(&stream, limit));
        }

        /// Read a byte at a time, and at random cuts of a generated (undamaged) stream: the same
        /// outcome, never lost.
        #[test]
        fn byte_by_byte_is_the_same_as_all_at_once(
            stream in stream(true, false),
            cuts in prop::collection::vec(any::<usize>(), 0..12),
            limit in limit(),
        ) {
            let every_byte: Vec<usize> = (0..stream.len()).collect();
            let whole = sniffed(&stream, &[], limit);
            prop_assert_eq!(sniffed(&stream, &every_byte, limit), whole);
            prop_assert_eq!(sniffed(&stream, &cuts, limit), whole);
            prop_assert!(!whole.lost, "{:?}", String::from_utf8_lossy(&stream));
        }
    }

    // ---- Against hyper ----------------------------------------------------------------------

    /// What hyper made of `stream` on one server connection: how many requests it handed to the
    /// service and how many of those had a `Transfer-Encoding` header (every body read whole).
    async fn hyper_requests(stream: Vec<u8>) -> (u64, u64) {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let service = {
            let counts = Arc::clone(&counts);
            hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let counts = Arc::clone(&counts);
                async move {
                    counts.0.fetch_add(1, Ordering::Relaxed);
                    if request.headers().contains_key(header::TRANSFER_ENCODING) {
                        counts.1.fetch_add(1, Ordering::Relaxed);
                    }
                    request
                        .into_body()
                        .collect()
                        .await
                        .expect("hyper reads the body");
                    let empty = http_body_util::Empty::<hyper::body::Bytes>::new();
                    Ok::<_, Infallible>(hyper::Response::new(empty))
                }
            })
        };
        // Half-close: the client sends everything, then ends its side; the answers still go out.
        let connection = hyper::server::conn::http1::Builder::new()
            .half_close(true)
            .serve_connection(hyper_util::rt::TokioIo::new(server), service);
        let client_side = async move {
            client.write_all(&stream).await.unwrap();
            client.shutdown().await.unwrap();
            let mut answers = Vec::new();
            client.read_to_end(&mut answers).await.unwrap();
        };
        let (served, ()) = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(connection, client_side)
        })
        .await
        .expect("hyper serves the stream");
        served.expect("hyper accepts every generated request");
        (
            counts.0.load(Ordering::Relaxed),
            counts.1.load(Ordering::Relaxed),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// hyper frames every generated stream as the sniffer does: the same requests, the same
        /// chunked ones, and the sniffer ends between requests where hyper read everything.
        #[test]
        fn hyper_frames_requests_as_the_sniffer_does(stream in stream(false, false)) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let (requests, chunked) = runtime.block_on(hyper_requests(stream.clone()));
            let sniffed = sniffed(&stream, &[], u64::MAX);
            prop_assert_eq!((sniffed.heads, sniffed.chunked_heads), (requests, chunked));
            prop_assert!(sniffed.between_requests, "{:?}", sniffed);
        }
    }
}
