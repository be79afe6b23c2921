//! Process-level set-up shared by the rebate binaries: the tracing subscriber (logs, and
//! OpenTelemetry export when configured), the trace id every response carries, a request's own
//! timeline of stages, and the shutdown signal.
//!
//! Contract: [`TraceId`] is a W3C trace id (16 bytes, 32 lowercase hex characters, never all
//! zeros), taken from an incoming `traceparent` header when one is valid and generated otherwise;
//! with OTLP export on, it is also the exported trace's id ([`otel::link_to_trace`]). [`init`]
//! installs the process-wide subscriber once. [`Timeline`] records where one request's time went
//! without any backend. [`shutdown_signal`] resolves on ctrl-c or SIGTERM. This crate knows
//! nothing of HTTP frameworks, caches or stores.
//!
//! # Layout
//! - [`otel`]: OTLP/HTTP export with tail-based keeping, trace-id linking, outgoing
//!   `traceparent`.
//! - [`timeline`]: [`Timeline`], [`Stage`].
//! - [`lines`]: the log lines' event format, which names the request in scope by its trace id.

pub mod lines;
pub mod otel;
pub mod timeline;

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;
use tracing::level_filters::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use otel::OtlpConfig;
pub use timeline::{Stage, Timeline, record_stage};

/// A W3C trace id.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId([u8; 16]);

/// 16 bytes as 32 lowercase hex digits, without allocating (trace ids, entity tags).
pub fn hex_128(bytes: [u8; 16]) -> [u8; 32] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = [0u8; 32];
    for (index, byte) in bytes.into_iter().enumerate() {
        text[2 * index] = DIGITS[usize::from(byte >> 4)];
        text[2 * index + 1] = DIGITS[usize::from(byte & 0x0f)];
    }
    text
}

impl TraceId {
    /// A fresh random trace id, from a small per-thread generator seeded by the operating
    /// system's (through `rand::rng()`). A trace id must be unique, not unpredictable (it grants
    /// nothing: the slow-request log is behind the admin token), so it need not pay a
    /// cryptographic generator's cost on every request — the choice OpenTelemetry's SDK makes.
    pub fn generate() -> Self {
        use rand::{Rng, SeedableRng, rngs::SmallRng};
        thread_local! {
            static IDS: std::cell::RefCell<SmallRng> =
                std::cell::RefCell::new(SmallRng::from_rng(&mut rand::rng()));
        }
        IDS.with(|ids| {
            let mut ids = ids.borrow_mut();
            loop {
                let id: u128 = ids.random();
                if id != 0 {
                    return Self(id.to_be_bytes());
                }
            }
        })
    }

    /// The trace id of a W3C `traceparent` header value, if the header is well formed.
    ///
    /// `version-traceid-parentid-flags`: version is two hex digits other than `ff`; version `00`
    /// has exactly four fields, later versions may append more (the spec asks us to parse the
    /// first four). An all-zero trace id or parent id is invalid.
    pub fn from_traceparent(header: &str) -> Option<Self> {
        let header = header.trim();
        let mut fields = header.split('-');
        let version = fields.next()?;
        let trace_id = fields.next()?;
        let parent_id = fields.next()?;
        let flags = fields.next()?;
        let has_more = fields.next().is_some();
        if version.len() != 2 || !is_lower_hex(version) || version == "ff" {
            return None;
        }
        if version == "00" && has_more {
            return None;
        }
        if parent_id.len() != 16 || !is_lower_hex(parent_id) || parent_id == "0000000000000000" {
            return None;
        }
        if flags.len() != 2 || !is_lower_hex(flags) {
            return None;
        }
        trace_id.parse().ok()
    }

    /// The parent span id of a valid `traceparent` header (the caller's span).
    pub fn parent_of_traceparent(header: &str) -> Option<[u8; 8]> {
        Self::from_traceparent(header)?;
        let parent = header.trim().split('-').nth(2)?;
        let mut bytes = [0u8; 8];
        for (index, chunk) in parent.as_bytes().chunks_exact(2).enumerate() {
            let pair = std::str::from_utf8(chunk).ok()?;
            bytes[index] = u8::from_str_radix(pair, 16).ok()?;
        }
        Some(bytes)
    }

    pub fn to_hex(self) -> String {
        self.hex().to_string()
    }

    /// The 32 lowercase hex digits, without allocating: [`TraceId::hex`] borrows from it.
    pub fn hex_digits(self) -> [u8; 32] {
        hex_128(self.0)
    }

    /// The id as text, in a stack buffer (every request sends it at least once).
    pub fn hex(self) -> HexTraceId {
        HexTraceId(self.hex_digits())
    }

    pub fn to_bytes(self) -> [u8; 16] {
        self.0
    }
}

/// A trace id's 32 hex digits on the stack; derefs to `str`.
#[derive(Clone, Copy)]
pub struct HexTraceId([u8; 32]);

impl fmt::Debug for HexTraceId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self)
    }
}

impl std::ops::Deref for HexTraceId {
    type Target = str;

    fn deref(&self) -> &str {
        // Only ASCII hex digits are ever written into it.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

fn is_lower_hex(text: &str) -> bool {
    text.bytes()
        .all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
}

/// Why a trace id string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a trace id is 32 lowercase hex characters, not all zero")]
pub struct InvalidTraceId;

impl FromStr for TraceId {
    type Err = InvalidTraceId;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.len() != 32 || !is_lower_hex(text) {
            return Err(InvalidTraceId);
        }
        let mut bytes = [0u8; 16];
        for (index, chunk) in text.as_bytes().chunks_exact(2).enumerate() {
            let pair = std::str::from_utf8(chunk).map_err(|_| InvalidTraceId)?;
            bytes[index] = u8::from_str_radix(pair, 16).map_err(|_| InvalidTraceId)?;
        }
        if bytes == [0; 16] {
            return Err(InvalidTraceId);
        }
        Ok(Self(bytes))
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.hex())
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "TraceId({self})")
    }
}

impl serde::Serialize for TraceId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.hex())
    }
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines, the default for a terminal.
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Installs the global subscriber. `RUST_LOG` overrides `default_filter` when set. With
/// `otlp`, spans are also exported (see [`otel`]); the returned [`Telemetry`] flushes them on
/// [`Telemetry::shutdown`]. Must be called inside a tokio runtime when `otlp` is set.
///
/// Returns an error instead of panicking when a subscriber is already installed (tests start
/// several applications in one process).
pub fn init(
    format: LogFormat,
    default_filter: &str,
    otlp: Option<&OtlpConfig>,
) -> Result<Telemetry, TelemetryError> {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(default_filter))
        .map_err(|error| TelemetryError::Filter(error.to_string()))?;
    // Colours only for a person at a terminal; log files and shippers get plain text.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let logs = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(colour)
            .event_format(lines::WithTraceId::new(
                tracing_subscriber::fmt::format()
                    .with_target(false)
                    .with_ansi(colour),
                lines::Shape::Text,
            ))
            .fmt_fields(plain_fields())
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .event_format(lines::WithTraceId::new(
                tracing_subscriber::fmt::format()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true),
                lines::Shape::Json,
            ))
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .with_filter(filter)
            .boxed(),
    };
    let provider = match otlp {
        Some(settings) => Some(otel::provider(
            settings,
            tokio::runtime::Handle::try_current()
                .map_err(|error| TelemetryError::Otlp(error.to_string()))?,
        )?),
        None => None,
    };
    let spans = provider.as_ref().map(|provider| {
        // Our own crates' spans down to debug (parts, tiers, dependency calls); others' from info.
        let ours = tracing_subscriber::filter::filter_fn(|metadata| {
            let target = metadata.target();
            let own = target.starts_with("rebate_") || target.starts_with("query_api");
            *metadata.level()
                <= if own {
                    LevelFilter::DEBUG
                } else {
                    LevelFilter::INFO
                }
        });
        tracing_opentelemetry::layer()
            .with_tracer(otel::tracer(provider))
            .with_filter(ours)
    });
    tracing_subscriber::registry()
        .with(logs)
        .with(spans)
        .try_init()
        .map_err(|error| TelemetryError::AlreadyInstalled(error.to_string()))?;
    if provider.is_some() {
        otel::mark_active();
    }
    Ok(Telemetry { provider })
}

/// Fields as `name=value` (the message bare), space-separated: the default field formatter's
/// text without its styling pass. The log layer formats a span's fields when the span opens,
/// whether or not a line is ever written in it — once per request for the request span — and
/// the styling wrappers were most of that cost.
fn plain_fields() -> impl for<'writer> tracing_subscriber::fmt::FormatFields<'writer> + 'static {
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|writer, field, value| {
        if field.name() == "message" {
            write!(writer, "{value:?}")
        } else {
            write!(writer, "{field}={value:?}")
        }
    })
    .delimited(" ")
}

/// The installed pipeline; flush it before the process exits.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Exports what is queued (bounded by the exporter's timeout) and stops the exporter.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(error) = provider.shutdown()
        {
            tracing::warn!(%error, "trace export did not shut down cleanly");
        }
    }

    /// Exports what is queued now (tests).
    pub fn flush(&self) {
        if let Some(provider) = &self.provider {
            let _ = provider.force_flush();
        }
    }
}

/// Resolves on ctrl-c or, on Unix, SIGTERM (what container runtimes send), logging which.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("ctrl-c received"),
        () = terminate => tracing::info!("SIGTERM received"),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("invalid log filter: {0}")]
    Filter(String),
    #[error("a tracing subscriber is already installed: {0}")]
    AlreadyInstalled(String),
    #[error("cannot set up OTLP export: {0}")]
    Otlp(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn honours_a_valid_traceparent() {
        let trace_id = TraceId::from_traceparent(SAMPLE).unwrap();
        assert_eq!(trace_id.to_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn refuses_malformed_traceparents() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceId::from_traceparent(bad), None, "{bad}");
        }
    }

    #[test]
    fn future_versions_may_carry_more_fields() {
        let header = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later";
        assert!(TraceId::from_traceparent(header).is_some());
    }

    #[test]
    fn hex_keeps_leading_zeros_and_every_digit() {
        let text = "00010a0f10a0ff7f0123456789abcdef";
        let trace_id: TraceId = text.parse().unwrap();
        assert_eq!(&*trace_id.hex(), text);
        assert_eq!(trace_id.to_string(), text);
        assert_eq!(
            serde_json::to_string(&trace_id).unwrap(),
            format!("\"{text}\"")
        );
    }

    #[test]
    fn generated_ids_are_valid_and_distinct() {
        let first = TraceId::generate();
        let second = TraceId::generate();
        assert_ne!(first, second);
        // Each thread's generator has a seed of its own.
        let elsewhere = std::thread::spawn(TraceId::generate).join().unwrap();
        assert_ne!(elsewhere, first);
        assert_ne!(elsewhere, second);
        let many: std::collections::HashSet<TraceId> =
            (0..10_000).map(|_| TraceId::generate()).collect();
        assert_eq!(many.len(), 10_000);
        assert_eq!(first.to_hex().parse::<TraceId>(), Ok(first));
        assert_eq!(first.to_hex().len(), 32);
    }
}
