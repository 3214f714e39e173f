//! Pure: how long an idle relay waits before it looks for work again (`--wakeup poll`).
//!
//! Right after work the next row is likely close behind, so the relay looks again within the
//! latency budget (`--max-delay`: a row that commits just after a look waits one interval for
//! the next); the longer nothing comes, the less often it looks, up to `--poll-interval`. A
//! look is a read-only probe (`Session::probe`), so even the fast phase costs the database one
//! short index scan per interval and the application's commits nothing. Looking more often
//! than the budget asks would only cost the database more: with a look every 2 ms after work,
//! a stream of 200 events/s made the relay probe 500 times a second.

use std::time::{Duration, Instant};

/// The shortest interval between looks, whatever the budget (`--max-delay 0`).
pub const FAST: Duration = Duration::from_millis(2);
/// How long after the last work the relay keeps looking every [`FAST`].
pub const HOLD: Duration = Duration::from_millis(100);

/// When to look next, given how long the relay has been idle and its previous interval:
/// every `budget` (at least [`FAST`]) during [`HOLD`], then doubling up to `max`.
pub fn next_interval(
    idle_for: Duration,
    previous: Duration,
    budget: Duration,
    max: Duration,
) -> Duration {
    let fast = budget.max(FAST);
    let next = if idle_for < HOLD {
        fast
    } else {
        previous.max(fast).saturating_mul(2)
    };
    next.min(max)
}

/// The idle schedule of one claim loop.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// When the last claim that returned rows ended.
    since: Instant,
    previous: Duration,
    /// `--max-delay`: the interval right after work.
    budget: Duration,
}

impl Schedule {
    pub fn new(now: Instant, budget: Duration) -> Schedule {
        Schedule {
            since: now,
            previous: Duration::ZERO,
            budget,
        }
    }

    /// A claim returned rows: look again within the budget.
    pub fn worked(&mut self, now: Instant) {
        *self = Schedule::new(now, self.budget);
    }

    /// The wait before the next look.
    pub fn next(&mut self, now: Instant, max: Duration) -> Duration {
        let interval = next_interval(
            now.saturating_duration_since(self.since),
            self.previous,
            self.budget,
            max,
        );
        self.previous = interval;
        interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_secs(1);

    #[test]
    fn looks_quickly_right_after_work_then_backs_off_to_the_poll_interval() {
        let start = Instant::now();
        let mut schedule = Schedule::new(start, Duration::ZERO);
        let mut now = start;
        let mut waits = Vec::new();
        while now.duration_since(start) < Duration::from_secs(10) {
            let wait = schedule.next(now, MAX);
            waits.push(wait);
            now += wait;
        }
        assert!(waits[..10].iter().all(|w| *w == FAST), "{waits:?}");
        assert!(
            waits.windows(2).all(|w| w[0] <= w[1]),
            "never shorter: {waits:?}"
        );
        assert_eq!(*waits.last().unwrap(), MAX);
        // Idle cost: after the first seconds, one look per --poll-interval.
        let looks_in_first_3s = waits
            .iter()
            .scan(Duration::ZERO, |t, w| {
                *t += *w;
                Some(*t)
            })
            .filter(|t| *t <= Duration::from_secs(3))
            .count();
        assert!(looks_in_first_3s < 70, "{looks_in_first_3s} looks");
    }

    #[test]
    fn work_resets_the_schedule() {
        let start = Instant::now();
        let mut schedule = Schedule::new(start, Duration::ZERO);
        let later = start + Duration::from_secs(30);
        for _ in 0..20 {
            schedule.next(later, MAX);
        }
        assert_eq!(schedule.next(later, MAX), MAX);
        schedule.worked(later);
        assert_eq!(schedule.next(later, MAX), FAST);
    }

    #[test]
    fn a_short_poll_interval_caps_every_wait() {
        let tiny = Duration::from_millis(1);
        let start = Instant::now();
        let budget = Duration::from_millis(30);
        assert_eq!(
            next_interval(Duration::ZERO, Duration::ZERO, budget, tiny),
            tiny
        );
        assert_eq!(
            next_interval(Duration::from_secs(5), Duration::from_secs(5), budget, tiny),
            tiny
        );
        let mut schedule = Schedule::new(start, budget);
        assert!(schedule.next(start + Duration::from_secs(60), tiny) <= tiny);
    }

    #[test]
    fn right_after_work_it_looks_once_per_budget_then_backs_off() {
        let budget = Duration::from_millis(30);
        let start = Instant::now();
        let mut schedule = Schedule::new(start, budget);
        let mut now = start;
        let mut waits = Vec::new();
        while now.duration_since(start) < Duration::from_secs(2) {
            let wait = schedule.next(now, MAX);
            waits.push(wait);
            now += wait;
        }
        // 100 ms of looks every 30 ms (at 0, 30, 60, 90), then doubling from there.
        assert_eq!(waits[..4], [budget; 4], "{waits:?}");
        assert_eq!(waits[4], 2 * budget, "{waits:?}");
        assert_eq!(*waits.last().unwrap(), MAX);
        schedule.worked(now);
        assert_eq!(schedule.next(now, MAX), budget);
    }
}
