//! [`CheckSource`]: what started a check, the `source` label of its counts.

use rebate_events::InvalidationEvent;
use serde::Serialize;

/// The id prefix of the events change capture derives from the database's binlog.
pub const BINLOG_EVENT_PREFIX: &str = "binlog:";

/// What started a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckSource {
    /// An event an operator (or a publishing service) sent.
    Event,
    /// An event change capture derived from the database's binlog.
    Binlog,
    /// The drift sampler: a key this instance holds, looked at without any event.
    Sample,
}

impl CheckSource {
    /// Every source, in the order of [`BySource`]'s fields.
    pub const ALL: [CheckSource; 3] =
        [CheckSource::Event, CheckSource::Binlog, CheckSource::Sample];

    /// The source of an applied event: change capture's ids start with `binlog:`; any other is
    /// an operator's.
    pub fn of(event: &InvalidationEvent) -> Self {
        if event.event_id().as_str().starts_with(BINLOG_EVENT_PREFIX) {
            CheckSource::Binlog
        } else {
            CheckSource::Event
        }
    }

    /// The name in the status and the metric's `source` label.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckSource::Event => "event",
            CheckSource::Binlog => "binlog",
            CheckSource::Sample => "sample",
        }
    }
}

/// One value per [`CheckSource`]; serialises as an object keyed by the sources' names.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BySource<T> {
    pub event: T,
    pub binlog: T,
    pub sample: T,
}

impl<T> BySource<T> {
    /// Builds every source's value from one function, so none can be forgotten.
    pub fn from_fn(mut make: impl FnMut(CheckSource) -> T) -> Self {
        Self {
            event: make(CheckSource::Event),
            binlog: make(CheckSource::Binlog),
            sample: make(CheckSource::Sample),
        }
    }

    pub fn get(&self, source: CheckSource) -> &T {
        match source {
            CheckSource::Event => &self.event,
            CheckSource::Binlog => &self.binlog,
            CheckSource::Sample => &self.sample,
        }
    }
}
