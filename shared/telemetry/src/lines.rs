//! Log lines that name their request: every line written while a request's [`Timeline`] is in
//! scope carries that request's trace id, without a span per request.
//!
//! A `request` span whose one field is the trace id would do the same through the log layer's
//! span context, but the layer pays for a span on every request whether or not a line is ever
//! written in it: a slot in the registry, the filter's per-span bookkeeping, the field formatted
//! into the span's extensions when it opens, an enter and an exit on every poll — about a tenth
//! of a cached request's instructions. The timeline is there anyway (the slow-request log's
//! stages), and loads in tasks of their own and shared upstream calls already carry it (see
//! [`Timeline`]), so the id is read from it only when a line is actually written.
//!
//! [`WithTraceId`] wraps the log layer's event format: it formats the line as usual, then puts
//! `trace_id=<32 hex>` before the newline (text) or `"trace_id":"<32 hex>"` first in the object
//! (JSON). An event that names a `trace_id` field itself is left as it is.

use std::fmt::{self, Write as _};

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::timeline::Timeline;

/// Where the trace id goes in a formatted line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `… fields trace_id=<hex>\n`
    Text,
    /// `{"trace_id":"<hex>",…}\n`
    Json,
}

/// An event format that adds the trace id of the request in scope (see the module docs).
#[derive(Debug)]
pub struct WithTraceId<F> {
    inner: F,
    shape: Shape,
}

impl<F> WithTraceId<F> {
    pub fn new(inner: F, shape: Shape) -> Self {
        Self { inner, shape }
    }
}

impl<S, N, F> FormatEvent<S, N> for WithTraceId<F>
where
    S: Subscriber + for<'lookup> LookupSpan<'lookup>,
    N: for<'writer> FormatFields<'writer> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let trace_id = Timeline::current_trace_id()
            .filter(|_| event.metadata().fields().field("trace_id").is_none());
        let Some(trace_id) = trace_id else {
            return self.inner.format_event(ctx, writer, event);
        };
        // The inner format decides colours itself (`Format::with_ansi`), so formatting into a
        // string of our own keeps them.
        let mut line = String::with_capacity(256);
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        writer.write_str(&splice(&line, &trace_id.hex(), self.shape))
    }
}

/// `line` with the trace id `hex` added in `shape`'s place. A line that does not look like its
/// shape (no object, no trailing newline) gets the id appended as text rather than lost.
fn splice(line: &str, hex: &str, shape: Shape) -> String {
    let mut out = String::with_capacity(line.len() + 48);
    match shape {
        Shape::Json if line.starts_with('{') => {
            let rest = &line[1..];
            let _ = write!(out, "{{\"trace_id\":\"{hex}\"");
            if !rest.trim_start().starts_with('}') {
                out.push(',');
            }
            out.push_str(rest);
        }
        _ => {
            let body = line.strip_suffix('\n').unwrap_or(line);
            let _ = write!(out, "{body} trace_id={hex}");
            if line.ends_with('\n') {
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use crate::TraceId;

    #[test]
    fn text_lines_end_with_the_trace_id() {
        let hex = "4bf92f3577b34da6a3ce929d0e0e4736";
        assert_eq!(
            splice("2026 INFO request failed status=503\n", hex, Shape::Text),
            format!("2026 INFO request failed status=503 trace_id={hex}\n")
        );
        assert_eq!(
            splice("no newline", hex, Shape::Text),
            format!("no newline trace_id={hex}")
        );
    }

    #[test]
    fn json_lines_lead_with_the_trace_id_and_stay_json() {
        let hex = "4bf92f3577b34da6a3ce929d0e0e4736";
        let line = splice("{\"level\":\"WARN\",\"message\":\"x\"}\n", hex, Shape::Json);
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["trace_id"], hex);
        assert_eq!(value["message"], "x");
        let empty: serde_json::Value =
            serde_json::from_str(&splice("{}\n", hex, Shape::Json)).unwrap();
        assert_eq!(empty["trace_id"], hex);
    }

    /// A `MakeWriter` into a shared buffer.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn subscriber(captured: &Captured, shape: Shape) -> impl Subscriber + Send + Sync {
        let format = tracing_subscriber::fmt::format()
            .with_target(false)
            .with_ansi(false);
        let layer = tracing_subscriber::fmt::layer().with_writer(captured.clone());
        let layer = match shape {
            Shape::Text => layer.event_format(WithTraceId::new(format, shape)).boxed(),
            Shape::Json => layer
                .event_format(WithTraceId::new(format.json().flatten_event(true), shape))
                .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
                .boxed(),
        };
        tracing_subscriber::registry().with(layer)
    }

    use tracing_subscriber::Layer as _;

    #[tokio::test]
    async fn lines_in_a_requests_scope_and_its_spawned_loads_carry_its_trace_id() {
        let captured = Captured::default();
        let _guard = tracing::subscriber::set_default(subscriber(&captured, Shape::Text));
        let trace_id = TraceId::generate();
        let timeline = Timeline::new(trace_id);
        tracing::info!("outside any request");
        Arc::clone(&timeline)
            .scope(async {
                tracing::warn!(dependency = "coupons", "call failed");
                // A load in its own task is handed the request's timeline (as the cache does).
                let timeline = Timeline::current().unwrap();
                tokio::spawn(timeline.scope(async { tracing::warn!("load failed") }))
                    .await
                    .unwrap();
                tracing::warn!(%trace_id, "names its own trace id");
            })
            .await;
        let text = captured.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        let tag = format!("trace_id={}", trace_id.to_hex());
        assert!(!lines[0].contains("trace_id"), "{}", lines[0]);
        assert!(
            lines[1].ends_with(&tag) && lines[1].contains("dependency=\"coupons\""),
            "{}",
            lines[1]
        );
        assert!(lines[2].ends_with(&tag), "{}", lines[2]);
        assert_eq!(lines[3].matches("trace_id").count(), 1, "{}", lines[3]);
    }

    #[tokio::test]
    async fn json_lines_in_a_requests_scope_carry_its_trace_id() {
        let captured = Captured::default();
        let _guard = tracing::subscriber::set_default(subscriber(&captured, Shape::Json));
        let trace_id = TraceId::generate();
        Timeline::new(trace_id)
            .scope(async { tracing::warn!(attempt = 2, "call failed") })
            .await;
        let value: serde_json::Value = serde_json::from_str(captured.text().trim()).unwrap();
        assert_eq!(value["trace_id"], trace_id.to_hex());
        assert_eq!(value["attempt"], 2);
        assert_eq!(value["message"], "call failed");
    }
}
