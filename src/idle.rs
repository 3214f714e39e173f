//! Pure: how long an idle relay waits before it looks for work again (`--wakeup poll`).
//!
//! Right after work the next row is likely close behind, so the relay looks again within
//! milliseconds; the longer nothing comes, the less often it looks, up to `--poll-interval`.
//! A look is a read-only probe (`Session::probe`), so even the fast phase costs the database
//! one short index scan per interval and the application's commits nothing.

use std::time::{Duration, Instant};

/// The first intervals after work.
pub const FAST: Duration = Duration::from_millis(2);
/// How long after the last work the relay keeps looking every [`FAST`].
pub const HOLD: Duration = Duration::from_millis(100);

/// When to look next, given how long the relay has been idle and its previous interval:
/// [`FAST`] during [`HOLD`], then doubling up to `max`.
pub fn next_interval(idle_for: Duration, previous: Duration, max: Duration) -> Duration {
    let next = if idle_for < HOLD {
        FAST
    } else {
        previous.max(FAST).saturating_mul(2)
    };
    next.min(max)
}

/// The idle schedule of one claim loop.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// When the last claim that returned rows ended.
    since: Instant,
    previous: Duration,
}

impl Schedule {
    pub fn new(now: Instant) -> Schedule {
        Schedule {
            since: now,
            previous: Duration::ZERO,
        }
    }

    /// A claim returned rows: look again at once, then quickly.
    pub fn worked(&mut self, now: Instant) {
        *self = Schedule::new(now);
    }

    /// The wait before the next look.
    pub fn next(&mut self, now: Instant, max: Duration) -> Duration {
        let interval = next_interval(
            now.saturating_duration_since(self.since),
            self.previous,
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
        let mut schedule = Schedule::new(start);
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
        let mut schedule = Schedule::new(start);
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
        assert_eq!(next_interval(Duration::ZERO, Duration::ZERO, tiny), tiny);
        assert_eq!(
            next_interval(Duration::from_secs(5), Duration::from_secs(5), tiny),
            tiny
        );
        let mut schedule = Schedule::new(start);
        assert!(schedule.next(start + Duration::from_secs(60), tiny) <= tiny);
    }
}
