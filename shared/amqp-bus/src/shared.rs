//! The state the supervisor, the consumers and the publishers share: settings, counters, the
//! connection status and the live connection's publish channel.

use std::sync::{Mutex, PoisonError};

use chrono::Utc;
use lapin::Channel;

use crate::AmqpSettings;
use crate::status::{BusStatus, CatchUp, Counters};

/// State shared by the supervisor, the consumers and the publishers.
pub(crate) struct Shared {
    pub(crate) settings: AmqpSettings,
    pub(crate) counters: Counters,
    status: Mutex<BusStatus>,
    /// The confirm-mode channel of the live connection; `None` while disconnected.
    publish_channel: Mutex<Option<Channel>>,
}

impl Shared {
    /// Disconnected, with no publish channel until the supervisor's first connection.
    pub(crate) fn new(settings: AmqpSettings) -> Self {
        Self {
            settings,
            counters: Counters::default(),
            status: Mutex::new(BusStatus {
                connected: false,
                since: None,
                reconnects: 0,
                last_error: None,
                last_catch_up: None,
            }),
            publish_channel: Mutex::new(None),
        }
    }

    pub(crate) fn publish_channel(&self) -> Option<Channel> {
        self.publish_channel
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn status(&self) -> BusStatus {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn mark_connected(&self, channel: Channel, is_reconnect: bool) {
        *self
            .publish_channel
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(channel);
        let mut status = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        status.connected = true;
        status.since = Some(Utc::now());
        if is_reconnect {
            status.reconnects += 1;
        }
    }

    pub(crate) fn record_catch_up(&self, catch_up: CatchUp) {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last_catch_up = Some(catch_up);
    }

    pub(crate) fn mark_disconnected(&self, error: Option<String>) {
        *self
            .publish_channel
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        let mut status = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        if status.connected || status.since.is_none() {
            status.since = Some(Utc::now());
        }
        status.connected = false;
        if error.is_some() {
            status.last_error = error;
        }
    }
}
