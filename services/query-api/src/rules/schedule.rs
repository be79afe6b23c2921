//! Scheduled rule sets: active from `from` until `until` (UTC), then the version that was
//! active when the window opened comes back.
//!
//! [`due`] says what the store's rows need at an instant; the manager carries it out with
//! compare-and-set transitions, so any instance may and only one does. Windows may not overlap
//! ([`check`]).

use rebate_domain::Timestamp;
use rebate_store::{RuleSetRow, RuleState};
use serde::{Deserialize, Serialize};

use super::RuleError;

/// The longest a window may last, and how far ahead it may open.
const MAX_LENGTH_MS: i64 = 31 * 86_400_000;
const MAX_AHEAD_MS: i64 = 366 * 86_400_000;

/// A window as a `POST /admin/v1/rules` body gives it (RFC 3339).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    pub from: Timestamp,
    pub until: Timestamp,
}

impl Window {
    pub fn of(row: &RuleSetRow) -> Option<Self> {
        Some(Self {
            from: row.schedule_from?,
            until: row.schedule_until?,
        })
    }

    fn overlaps(&self, other: &Window) -> bool {
        self.from < other.until && other.from < self.until
    }
}

/// A window must end after it opens and after `now`, last at most 31 days, open within a year,
/// and overlap no other window still to come or under way (`rows`: scheduled rows and the active
/// one).
pub fn check(window: &Window, now: Timestamp, rows: &[RuleSetRow]) -> Result<(), RuleError> {
    if window.until <= window.from {
        return Err(RuleError::new(
            "schedule.until",
            "must be after schedule.from",
        ));
    }
    if window.until <= now {
        return Err(RuleError::new(
            "schedule.until",
            format!("{} has passed", window.until.to_rfc3339()),
        ));
    }
    if window.until.as_millis() - window.from.as_millis() > MAX_LENGTH_MS {
        return Err(RuleError::new("schedule", "a window lasts at most 31 days"));
    }
    if window.from.as_millis() - now.as_millis() > MAX_AHEAD_MS {
        return Err(RuleError::new(
            "schedule.from",
            "must be within a year from now",
        ));
    }
    let taken = rows
        .iter()
        .filter(|row| matches!(row.state, RuleState::Scheduled | RuleState::Active))
        .filter_map(|row| Window::of(row).map(|other| (row.version, other)))
        .find(|(_, other)| other.until > now && window.overlaps(other));
    if let Some((version, other)) = taken {
        return Err(RuleError::new(
            "schedule",
            format!(
                "overlaps version {version}'s window {} – {}; windows may not overlap",
                other.from.to_rfc3339(),
                other.until.to_rfc3339()
            ),
        ));
    }
    Ok(())
}

/// What a scheduled row needs at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Its window is open: make it active (remembering what was).
    Open(u64),
    /// Its window closed while it was active: bring back the version that was active when it
    /// opened, at `opened_at` (none: the file's values).
    Close {
        version: u64,
        opened_at: Option<Timestamp>,
    },
    /// Its window passed before it ever opened (every instance was down): mark it expired.
    Expire(u64),
}

/// What `rows` (scheduled rows and the active one) need at `now`, windows closing first.
pub fn due(rows: &[RuleSetRow], now: Timestamp) -> Vec<Due> {
    let mut actions = Vec::new();
    for row in rows {
        let Some(window) = Window::of(row) else {
            continue;
        };
        match row.state {
            RuleState::Active if window.until <= now => actions.push(Due::Close {
                version: row.version,
                opened_at: row.activated_at,
            }),
            RuleState::Scheduled if window.until <= now => actions.push(Due::Expire(row.version)),
            _ => {}
        }
    }
    for row in rows {
        if row.state == RuleState::Scheduled
            && let Some(window) = Window::of(row)
            && window.from <= now
            && now < window.until
        {
            actions.push(Due::Open(row.version));
        }
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        Timestamp::parse_rfc3339(text).unwrap()
    }

    fn row(version: u64, state: RuleState, from: &str, until: &str) -> RuleSetRow {
        RuleSetRow {
            version,
            document: "{}".to_owned(),
            author: "ops".to_owned(),
            reason: "sale".to_owned(),
            created_at: at("2026-12-01T00:00:00Z"),
            activated_at: None,
            state,
            rollout: None,
            schedule_from: Some(at(from)),
            schedule_until: Some(at(until)),
            previous_version: Some(version - 1),
            verdict: None,
            updated_at: at("2026-12-01T00:00:00Z"),
        }
    }

    fn window(from: &str, until: &str) -> Window {
        Window {
            from: at(from),
            until: at(until),
        }
    }

    #[test]
    fn a_sale_window_opens_and_closes_on_the_clock() {
        let sale = row(
            7,
            RuleState::Scheduled,
            "2026-12-12T19:55:00Z",
            "2026-12-12T23:30:00Z",
        );
        assert!(due(std::slice::from_ref(&sale), at("2026-12-12T19:54:59Z")).is_empty());
        assert_eq!(
            due(std::slice::from_ref(&sale), at("2026-12-12T19:55:00Z")),
            vec![Due::Open(7)]
        );
        let open = RuleSetRow {
            state: RuleState::Active,
            activated_at: Some(at("2026-12-12T19:55:01Z")),
            ..sale.clone()
        };
        assert!(due(std::slice::from_ref(&open), at("2026-12-12T23:29:59Z")).is_empty());
        assert_eq!(
            due(std::slice::from_ref(&open), at("2026-12-12T23:30:00Z")),
            vec![Due::Close {
                version: 7,
                opened_at: Some(at("2026-12-12T19:55:01Z"))
            }]
        );
        assert_eq!(
            due(std::slice::from_ref(&sale), at("2026-12-13T00:00:00Z")),
            vec![Due::Expire(7)]
        );
    }

    #[test]
    fn windows_may_not_overlap_or_be_malformed() {
        let now = at("2026-12-06T00:00:00Z");
        let rows = [row(
            7,
            RuleState::Scheduled,
            "2026-12-12T19:55:00Z",
            "2026-12-12T23:30:00Z",
        )];
        let overlap = check(
            &window("2026-12-12T23:00:00Z", "2026-12-13T01:00:00Z"),
            now,
            &rows,
        )
        .unwrap_err();
        assert_eq!(overlap.field, "schedule");
        assert!(overlap.reason.contains("overlaps version 7"), "{overlap}");
        // Touching windows do not overlap.
        check(
            &window("2026-12-12T23:30:00Z", "2026-12-13T01:00:00Z"),
            now,
            &rows,
        )
        .unwrap();
        assert_eq!(
            check(
                &window("2026-12-13T01:00:00Z", "2026-12-13T00:00:00Z"),
                now,
                &rows
            )
            .unwrap_err()
            .field,
            "schedule.until"
        );
        assert_eq!(
            check(
                &window("2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z"),
                now,
                &rows
            )
            .unwrap_err()
            .field,
            "schedule.until"
        );
        assert_eq!(
            check(
                &window("2026-12-07T00:00:00Z", "2027-02-07T00:00:00Z"),
                now,
                &rows
            )
            .unwrap_err()
            .field,
            "schedule"
        );
        // A window that closed, or a row no longer scheduled, takes no room.
        let past = [row(
            3,
            RuleState::Expired,
            "2026-12-12T19:55:00Z",
            "2026-12-12T23:30:00Z",
        )];
        check(
            &window("2026-12-12T20:00:00Z", "2026-12-12T21:00:00Z"),
            now,
            &past,
        )
        .unwrap();
    }
}
