//! Log lines captured in tests: a subscriber for the current thread that keeps each event's
//! message and fields as one line of text (`tokio::test`'s runtime runs spawned tasks on the
//! test's thread, so their lines are caught too).

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::DefaultGuard;
use tracing::{Event, Metadata, Subscriber};

/// The lines logged on this thread while the guard lives.
#[derive(Debug, Clone, Default)]
pub(crate) struct CapturedLines(Arc<Mutex<Vec<String>>>);

impl CapturedLines {
    /// Captures every event on this thread until the guard is dropped.
    pub(crate) fn start() -> (Self, DefaultGuard) {
        let lines = Self::default();
        let guard = tracing::subscriber::set_default(Capture(lines.clone()));
        (lines, guard)
    }

    pub(crate) fn lines(&self) -> Vec<String> {
        self.0.lock().expect("not poisoned").clone()
    }

    /// The lines whose text contains `needle`.
    pub(crate) fn containing(&self, needle: &str) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|line| line.contains(needle))
            .collect()
    }
}

struct Capture(CapturedLines);

/// `message field=value …`, Debug-formatted values.
struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _metadata: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(format!("{} ", event.metadata().level()));
        event.record(&mut fields);
        self.0.0.lock().expect("not poisoned").push(fields.0);
    }

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}
