//! One instance's share of a fleet quota while the fleet's bucket cannot be reached: turns on a
//! clock the instances share, so that the fleet together never exceeds the quota.
//!
//! A bucket per instance cut to `rate / N` cannot keep that promise: each instance's bucket
//! holds at least one call, so after a quiet spell N instances may all call at once, and a
//! fleet larger than the quota's burst goes over it. Instead the fleet's time is cut into
//! turns of `1 / per_second`, dealt round robin: turn `s` belongs to the instance of rank
//! `s mod N`. An instance may make one call in each of its turns, so the fleet makes at most
//! one call per turn, whatever N is: one call every N turns per instance, never rounded up.
//!
//! The burst is shared too. In any span of time the fleet's turns allow one call per turn that
//! starts in it, plus one for the turn already under way when it begins: that one is the
//! burst's first call. The other `burst − 1` are turns kept: instance `k` may keep
//! `(burst − 1) / N` turns it did not use (the first `(burst − 1) mod N` ranks one more), to
//! spend later. So in a second the fleet makes at most `burst + per_second` calls, as one
//! bucket allows, and nothing is rounded up however many instances there are.
//!
//! The shared clock is the hosts' wall clock ([`crate::FleetTokens::clock_offset_nanos`]: NTP
//! keeps hosts within milliseconds of each other, against turns of 1/per_second; hosts further
//! apart than a turn may each take a turn the other also takes), and the rank is this
//! instance's place in the fleet's registry as last seen, which holds while Redis is away:
//! when a share is used.

use std::time::Duration;

use rebate_resilience::RateConfig;

/// Where an instance stands in the fleet: how many share the quota, its place among them, and
/// what to add to its ticker to read the fleet's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetPosition {
    pub live: u32,
    pub rank: u32,
    pub clock_offset_nanos: i64,
}

impl FleetPosition {
    /// The fleet's time for a ticker reading.
    pub fn fleet_time(&self, ticker_nanos: u64) -> u64 {
        ticker_nanos.saturating_add_signed(self.clock_offset_nanos)
    }
}

/// One instance's turns; see the module documentation.
#[derive(Debug, Clone)]
pub struct TurnShare {
    rate: RateConfig,
    live: u64,
    rank: u64,
    /// Length of one turn of the fleet, in nanoseconds (at least 1).
    turn: u64,
    /// The first of this instance's turns not yet used or kept: its `j`-th own turn is the
    /// fleet's turn `j × live + rank`.
    next: u64,
    /// Turns kept to spend later, at most `keep`.
    kept: u64,
    keep: u64,
}

impl TurnShare {
    /// A share for `position` at fleet time `now`, its kept turns full (as a fresh bucket is).
    pub fn new(rate: RateConfig, position: FleetPosition, now: u64) -> Self {
        let live = u64::from(position.live.max(1));
        let rank = u64::from(position.rank) % live;
        let turn = (1e9 / rate.per_second).max(1.0) as u64;
        // The turn under way is the burst's first call; the rest are kept turns.
        let kept_in_fleet = u64::from(rate.burst.saturating_sub(1));
        let keep = kept_in_fleet / live + u64::from(rank < kept_in_fleet % live);
        let mut share = Self {
            rate,
            live,
            rank,
            turn,
            next: 0,
            kept: keep,
            keep,
        };
        // Turns already past belong to the time before the share: neither used nor kept.
        share.next = share.first_own_at_or_after(now / turn);
        share
    }

    /// Whether it was cut for this rate and position.
    pub fn cut_for(&self, rate: RateConfig, position: FleetPosition) -> bool {
        let live = u64::from(position.live.max(1));
        self.rate == rate && self.live == live && self.rank == u64::from(position.rank) % live
    }

    /// The share cut anew for a new rate or position at fleet time `now`: it keeps the turns it
    /// had kept (at most the new share's), and its next turn is the first that starts after
    /// `now`, since the turn it is in may have been used under the old cut.
    pub fn recut(&self, rate: RateConfig, position: FleetPosition, now: u64) -> Self {
        let mut share = Self::new(rate, position, now);
        share.kept = self.kept.min(share.keep);
        share.next = share.first_own_at_or_after(now / share.turn + 1);
        share
    }

    /// The index `j` of this instance's first own turn at or after the fleet's turn `fleet_turn`.
    fn first_own_at_or_after(&self, fleet_turn: u64) -> u64 {
        if fleet_turn <= self.rank {
            0
        } else {
            (fleet_turn - self.rank).div_ceil(self.live)
        }
    }

    fn start_of(&self, own: u64) -> u64 {
        own.saturating_mul(self.live)
            .saturating_add(self.rank)
            .saturating_mul(self.turn)
    }

    /// Keeps the own turns that ended before `now` unused; returns whether `now` is in an own
    /// turn not yet used.
    fn settle(&mut self, now: u64) -> bool {
        let fleet_turn = now / self.turn;
        let current = (fleet_turn >= self.rank
            && (fleet_turn - self.rank).is_multiple_of(self.live))
        .then(|| (fleet_turn - self.rank) / self.live);
        // Own turns that ended by now: those before the current one.
        let ended = self.first_own_at_or_after(fleet_turn);
        if ended > self.next {
            self.kept = (self.kept + (ended - self.next)).min(self.keep);
            self.next = ended;
        }
        current.is_some_and(|own| own == self.next)
    }

    /// Takes a call at fleet time `now`, or says how long until this instance's next turn.
    pub fn try_acquire(&mut self, now: u64) -> Result<(), Duration> {
        if self.settle(now) {
            self.next += 1;
            return Ok(());
        }
        if self.kept > 0 {
            self.kept -= 1;
            return Ok(());
        }
        Err(self.wait_settled(now))
    }

    /// How long from `now` until a call would be taken (zero when now).
    pub fn wait(&mut self, now: u64) -> Duration {
        if self.settle(now) || self.kept > 0 {
            return Duration::ZERO;
        }
        self.wait_settled(now)
    }

    fn wait_settled(&self, now: u64) -> Duration {
        Duration::from_nanos(self.start_of(self.next).saturating_sub(now).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const SECOND: u64 = 1_000 * MS;

    fn rate(per_second: f64, burst: u32) -> RateConfig {
        RateConfig { per_second, burst }
    }

    fn fleet(
        rate: RateConfig,
        live: u32,
        offsets: impl Fn(u32) -> i64,
        now: u64,
    ) -> Vec<(FleetPosition, TurnShare)> {
        (0..live)
            .map(|rank| {
                let position = FleetPosition {
                    live,
                    rank,
                    clock_offset_nanos: offsets(rank),
                };
                let share = TurnShare::new(rate, position, position.fleet_time(now));
                (position, share)
            })
            .collect()
    }

    /// Every instance asks for a call every `every` on its own ticker, from `from` for
    /// `seconds`; returns the calls granted, by the fleet's second they fell in.
    fn hammer(
        shares: &mut [(FleetPosition, TurnShare)],
        from: u64,
        seconds: u64,
        every: u64,
    ) -> Vec<u64> {
        let mut per_second = vec![0; seconds as usize + 1];
        let mut now = from;
        while now < from + seconds * SECOND {
            for (position, share) in shares.iter_mut() {
                let at = position.fleet_time(now);
                if share.try_acquire(at).is_ok() {
                    let second = (at.saturating_sub(from) / SECOND) as usize;
                    per_second[second.min(seconds as usize)] += 1;
                }
            }
            now += every;
        }
        per_second
    }

    /// The most calls in any window of one second, sliding by `step` (`calls` holds one count
    /// per step).
    fn peak_per_sliding_second(calls: &[u64], step: u64) -> u64 {
        let width = (SECOND / step) as usize;
        let mut inside: u64 = calls.iter().take(width).sum();
        let mut peak = inside;
        for end in width..calls.len() {
            inside = inside + calls[end] - calls[end - width];
            peak = peak.max(inside);
        }
        peak
    }

    #[test]
    fn a_hundred_instances_never_exceed_the_contract_in_any_second() {
        // The shipped coupon contract: 45/s with bursts of 5.
        let contract = rate(45.0, 5);
        for live in [1, 2, 3, 7, 45, 50, 100] {
            let start = 1_700_000_000 * SECOND;
            let mut shares = fleet(contract, live, |_| 0, start);
            // Each instance asks every millisecond: far more than the quota.
            let step = MS;
            let mut calls = vec![0_u64; 10_000];
            let mut now = start;
            for slot in calls.iter_mut() {
                for (position, share) in shares.iter_mut() {
                    if share.try_acquire(position.fleet_time(now)).is_ok() {
                        *slot += 1;
                    }
                }
                now += step;
            }
            let peak = peak_per_sliding_second(&calls, step);
            let total: u64 = calls.iter().sum();
            assert!(peak <= 50, "{live} instances: {peak} calls in one second");
            // The quota is spent, not starved: 10 s at 45/s plus the burst.
            assert!(
                (440..=455).contains(&total),
                "{live} instances: {total} calls in 10 s"
            );
        }
    }

    #[test]
    fn the_share_follows_the_fleet_as_instances_go_and_come() {
        let contract = rate(45.0, 5);
        let start = 1_700_000_000 * SECOND;
        let mut shares = fleet(contract, 100, |_| 0, start);
        let mut calls = hammer(&mut shares, start, 5, MS);
        calls.pop();
        // Half the fleet goes: the registry counts 50 and deals their ranks again.
        let at = start + 5 * SECOND;
        let mut half: Vec<(FleetPosition, TurnShare)> = shares
            .iter()
            .step_by(2)
            .enumerate()
            .map(|(rank, (_, share))| {
                let position = FleetPosition {
                    live: 50,
                    rank: rank as u32,
                    clock_offset_nanos: 0,
                };
                (position, share.recut(contract, position, at))
            })
            .collect();
        let after = hammer(&mut half, at, 5, MS);
        // Then 100 again (the others come back): recut once more.
        let back = start + 10 * SECOND;
        let mut all = fleet(contract, 100, |_| 0, back);
        let again = hammer(&mut all, back, 5, MS);
        for (phase, seconds) in [("100", &calls), ("50", &after), ("100 again", &again)] {
            let full: Vec<u64> = seconds[..5].to_vec();
            assert!(full.iter().all(|count| *count <= 50), "{phase}: {full:?}");
            // Each second after the first uses the fleet's 45 turns.
            assert!(
                full[1..].iter().all(|count| *count >= 44),
                "{phase}: {full:?}"
            );
        }
    }

    #[test]
    fn a_quiet_spell_does_not_let_the_fleet_burst_past_the_contract() {
        let contract = rate(45.0, 5);
        let start = 1_700_000_000 * SECOND;
        let mut shares = fleet(contract, 100, |_| 0, start);
        // Busy for a second, quiet for ten, then every instance at once.
        hammer(&mut shares, start, 1, MS);
        let calls = hammer(&mut shares, start + 11 * SECOND, 1, MS);
        // The burst (4 kept turns and the turn under way) and one call per turn after.
        assert!(
            calls[0] <= 50,
            "{} calls in the first second after",
            calls[0]
        );
        assert!(
            calls[0] >= 45,
            "{} calls: the fleet's turns are used",
            calls[0]
        );
    }

    #[test]
    fn the_burst_is_shared_never_rounded_up() {
        let contract = rate(2.0, 5);
        // A burst of 5: the turn under way, and 4 turns kept across the fleet.
        let keeps: Vec<u64> = fleet(contract, 3, |_| 0, 0)
            .iter()
            .map(|(_, share)| share.keep)
            .collect();
        assert_eq!(keeps, [2, 1, 1]);
        let keeps: Vec<u64> = fleet(contract, 100, |_| 0, 0)
            .iter()
            .map(|(_, share)| share.keep)
            .collect();
        assert_eq!(keeps.iter().sum::<u64>(), 4);
        assert_eq!(keeps.iter().filter(|keep| **keep > 0).count(), 4);
        // A burst of 1 keeps nothing.
        let keeps: Vec<u64> = fleet(rate(2.0, 1), 3, |_| 0, 0)
            .iter()
            .map(|(_, share)| share.keep)
            .collect();
        assert_eq!(keeps, [0, 0, 0]);
    }

    #[test]
    fn one_instance_waits_for_its_own_turn() {
        // 10/s over 4 instances: turns of 100 ms, rank 2 owns turns 2, 6, 10, …: one call
        // every 400 ms. A burst of 4: 3 kept turns over 4 instances, one for rank 2.
        let position = FleetPosition {
            live: 4,
            rank: 2,
            clock_offset_nanos: 0,
        };
        let mut share = TurnShare::new(rate(10.0, 4), position, 0);
        // Its kept turn first (a fresh share is full), then its own turn at 200 ms.
        assert_eq!(share.try_acquire(0), Ok(()));
        assert_eq!(share.try_acquire(10 * MS), Err(Duration::from_millis(190)));
        assert_eq!(share.wait(150 * MS), Duration::from_millis(50));
        assert_eq!(share.try_acquire(250 * MS), Ok(()));
        assert_eq!(share.try_acquire(260 * MS), Err(Duration::from_millis(340)));
        // Turn 6 passes unused and is kept: it can be spent any time after.
        assert_eq!(share.try_acquire(750 * MS), Ok(()));
        assert_eq!(share.try_acquire(760 * MS), Err(Duration::from_millis(240)));
        assert_eq!(share.try_acquire(1_000 * MS), Ok(()));
        // With a burst of 1 nothing is kept: only its turns.
        let mut lean = TurnShare::new(rate(10.0, 1), position, 0);
        assert_eq!(lean.try_acquire(0), Err(Duration::from_millis(200)));
        assert_eq!(lean.try_acquire(750 * MS), Err(Duration::from_millis(250)));
    }

    #[test]
    fn a_recut_keeps_what_was_kept_and_skips_the_turn_it_is_in() {
        let position = FleetPosition {
            live: 1,
            rank: 0,
            clock_offset_nanos: 0,
        };
        let mut share = TurnShare::new(rate(5.0, 2), position, 0);
        // Its turn and the one kept.
        for _ in 0..2 {
            assert_eq!(share.try_acquire(0), Ok(()));
        }
        assert!(share.try_acquire(0).is_err());
        let mut faster = share.recut(rate(10.0, 4), position, 10 * MS);
        assert_eq!(faster.wait(10 * MS), Duration::from_millis(90));
        assert_eq!(faster.try_acquire(100 * MS), Ok(()));
    }

    #[test]
    fn clocks_a_little_apart_overlap_turns_by_no_more_than_their_difference() {
        // Hosts' clocks 2 ms apart, against turns of 22 ms.
        let contract = rate(45.0, 5);
        let start = 1_700_000_000 * SECOND;
        let mut shares = fleet(
            contract,
            100,
            |rank| i64::from(rank % 3) * 1_000_000 - 1_000_000,
            start,
        );
        let calls = hammer(&mut shares, start, 10, MS);
        let peak = calls.iter().copied().max().unwrap();
        assert!(peak <= 51, "{peak} calls in a second");
    }
}
