//! The in-process slow-request log: the last N requests that were slow, failed or degraded, each
//! with its stage-by-stage breakdown, looked up by trace id without any tracing backend.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use rebate_domain::Timestamp;
use rebate_resilience::RequestClass;
use rebate_telemetry::{Stage, TraceId};
use serde::Serialize;

/// Why a request was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SlowReason {
    /// At least `observability.slow_request_ms`.
    Slow,
    /// Answered 5xx.
    Failed,
    /// Answered, with at least one part stale or template.
    Degraded,
}

/// One recorded request.
#[derive(Debug, Clone, Serialize)]
pub struct SlowRequest {
    pub trace_id: TraceId,
    pub instance: Arc<str>,
    /// When the request ended.
    pub at: Timestamp,
    pub method: String,
    pub path: String,
    pub status: u16,
    pub latency_ms: f64,
    /// The load-shedding level it was served at (0–3).
    pub shed_level: u8,
    /// Its class (`page`, `list`, `prefetch`), when it got as far as the shedder.
    pub class: Option<RequestClass>,
    pub reasons: Vec<SlowReason>,
    /// Where the time went: parts that did not come from L1, cache-tier reads, leases and every
    /// dependency call (with attempt numbers), in the order they ended. Parts absent here were
    /// L1 hits.
    pub stages: Vec<Stage>,
}

/// A bounded ring of [`SlowRequest`]s, newest last.
#[derive(Debug)]
pub struct SlowLog {
    capacity: usize,
    entries: Mutex<VecDeque<Arc<SlowRequest>>>,
}

impl SlowLog {
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            entries: Mutex::new(VecDeque::with_capacity(capacity)),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Adds a record, dropping the oldest when full.
    pub fn push(&self, request: SlowRequest) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() == self.capacity {
            entries.pop_front();
        }
        entries.push_back(Arc::new(request));
    }

    /// The newest `limit` records, newest first.
    pub fn recent(&self, limit: usize) -> Vec<Arc<SlowRequest>> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.iter().rev().take(limit).cloned().collect()
    }

    /// The newest record of `trace_id`.
    pub fn find(&self, trace_id: TraceId) -> Option<Arc<SlowRequest>> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .iter()
            .rev()
            .find(|entry| entry.trace_id == trace_id)
            .cloned()
    }

    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(trace_id: TraceId, status: u16) -> SlowRequest {
        SlowRequest {
            trace_id,
            instance: Arc::from("test-1"),
            at: Timestamp::now(),
            method: "GET".to_owned(),
            path: "/api/v1/items/jd/100001/rebate".to_owned(),
            status,
            latency_ms: 512.0,
            shed_level: 0,
            class: Some(RequestClass::Page),
            reasons: vec![SlowReason::Slow],
            stages: Vec::new(),
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_and_finds_by_trace_id() {
        let log = SlowLog::new(3);
        let ids: Vec<TraceId> = (0..10).map(|_| TraceId::generate()).collect();
        for (index, id) in ids.iter().enumerate() {
            log.push(request(*id, 200 + index as u16));
        }
        assert_eq!(log.len(), 3);
        assert!(log.find(ids[6]).is_none());
        assert_eq!(log.find(ids[8]).unwrap().status, 208);
        let recent: Vec<u16> = log.recent(2).iter().map(|entry| entry.status).collect();
        assert_eq!(recent, [209, 208]);
    }
}
