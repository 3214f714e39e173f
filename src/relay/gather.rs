//! Pure: when the next claim runs while events flow, under the latency budget (`--max-delay`).
//!
//! Every claim and its settlement cost the application's database two transactions whose
//! planning and commit do not depend on how many rows they carry: at 200 events/s with claims
//! made as soon as a row was seen, 1.5 rows rode in each claim and the relay's database time
//! was four times the application's own writes' (docs/benchmarks.md, "Rates"). So a claim that
//! found rows but had room to spare is followed by a wait, and the rows a stream writes
//! meanwhile ride in the next claim.
//!
//! The budget bounds the oldest row's wait, not the newest's: a row the next claim takes
//! committed after this claim's snapshot, which was taken when this claim started, so the next
//! claim starts at most the budget after this one started, whatever this one took.
//!
//! The wait shrinks as the rate rises: it is the time the stream takes to write
//! [`Gather::target`] rows (a quarter of `--batch-size`) at the rate the claims have seen, when
//! that is shorter than the budget. Past a few rows per claim the fixed cost is spread thin
//! already, and waiting longer would only add latency to a busy stream; a stream faster still
//! fills its claims, and a full claim is followed by the next at once (`claim_size`).

use std::time::{Duration, Instant};

/// How much a new measurement of the rate counts against the ones before: a stream's rate
/// changes over seconds, its claims' row counts jitter from one claim to the next.
const SMOOTHING: f64 = 0.3;

/// The stream's pace as the claim loop has seen it.
#[derive(Debug, Clone)]
pub struct Gather {
    /// `--max-delay`: the longest the oldest row waits for its claim to start.
    budget: Duration,
    /// Rows worth a claim of their own: past them, waiting longer saves little.
    target: usize,
    /// Rows per second, smoothed; `None` before two claims have been seen.
    rate: Option<f64>,
    /// When the last claim started (its snapshot).
    last_start: Option<Instant>,
}

impl Gather {
    pub fn new(budget: Duration, batch_size: usize) -> Gather {
        Gather {
            budget,
            target: batch_size.div_ceil(4).max(1),
            rate: None,
            last_start: None,
        }
    }

    /// Rows per second, as the claims have seen them.
    #[cfg(test)]
    pub fn rate(&self) -> Option<f64> {
        self.rate
    }

    /// A claim that started at `started` took `rows` rows: the rows that committed since the
    /// previous claim started.
    pub fn claimed(&mut self, started: Instant, rows: usize) {
        if let Some(previous) = self.last_start {
            let span = started.saturating_duration_since(previous).as_secs_f64();
            if span > 0.0 {
                let seen = rows as f64 / span;
                self.rate = Some(match self.rate {
                    Some(rate) => rate + SMOOTHING * (seen - rate),
                    None => seen,
                });
            }
        }
        self.last_start = Some(started);
    }

    /// How long to wait, at `now`, before the claim after one that started at `started`, found
    /// rows and had room to spare; or, with `started` the moment a logical wake-up rang, before the
    /// claim of the rows that rang it (they committed then at the earliest).
    pub fn wait(&self, started: Instant, now: Instant) -> Duration {
        let fill = match self.rate {
            Some(rate) if rate > 0.0 => Duration::from_secs_f64(self.target as f64 / rate),
            _ => self.budget,
        };
        (started + fill.min(self.budget)).saturating_duration_since(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Claims every `every` taking `rows` rows each, `n` times from `start`.
    fn stream(g: &mut Gather, start: Instant, every: Duration, rows: usize, n: u32) -> Instant {
        let mut at = start;
        for _ in 0..n {
            g.claimed(at, rows);
            at += every;
        }
        at - every
    }

    #[test]
    fn a_slow_stream_waits_the_whole_budget_counted_from_the_claims_start() {
        let start = Instant::now();
        let mut g = Gather::new(25 * MS, 100);
        let last = stream(&mut g, start, 25 * MS, 5, 10);
        // 200 rows/s: 25 rows would take 125 ms, longer than the budget.
        let rate = g.rate().unwrap();
        assert!((rate - 200.0).abs() < 1.0, "{rate}");
        assert_eq!(g.wait(last, last), 25 * MS);
        // The claim itself took 4 ms: the wait is what is left of the budget.
        assert_eq!(g.wait(last, last + 4 * MS), 21 * MS);
        // A claim that took longer than the budget is followed at once.
        assert_eq!(g.wait(last, last + 30 * MS), Duration::ZERO);
    }

    #[test]
    fn a_fast_stream_waits_only_as_long_as_a_quarter_batch_takes_to_write() {
        let start = Instant::now();
        let mut g = Gather::new(25 * MS, 100);
        // 5,000 rows/s: claims every 4 ms carry 20 rows.
        let last = stream(&mut g, start, 4 * MS, 20, 20);
        assert_eq!(g.wait(last, last), 5 * MS, "25 rows at 5,000/s");
    }

    #[test]
    fn before_the_rate_is_known_the_budget_is_the_wait() {
        let start = Instant::now();
        let mut g = Gather::new(40 * MS, 100);
        assert_eq!(g.wait(start, start), 40 * MS);
        g.claimed(start, 3);
        assert_eq!(g.rate(), None, "one claim says nothing of a rate");
        assert_eq!(g.wait(start, start + MS), 39 * MS);
    }

    #[test]
    fn the_rate_follows_a_stream_that_speeds_up() {
        let start = Instant::now();
        let mut g = Gather::new(25 * MS, 100);
        let last = stream(&mut g, start, 25 * MS, 5, 10);
        let faster = stream(&mut g, last + 5 * MS, 5 * MS, 25, 20);
        let rate = g.rate().unwrap();
        assert!((rate - 5000.0).abs() < 50.0, "{rate}");
        let wait = g.wait(faster, faster);
        assert!(
            wait.abs_diff(5 * MS) < Duration::from_micros(100),
            "{wait:?}"
        );
    }

    #[test]
    fn a_budget_of_zero_never_waits() {
        let start = Instant::now();
        let mut g = Gather::new(Duration::ZERO, 100);
        let last = stream(&mut g, start, 10 * MS, 1, 5);
        assert_eq!(g.wait(last, last), Duration::ZERO);
    }

    #[test]
    fn a_bell_is_waited_on_from_when_it_rang() {
        let start = Instant::now();
        let mut g = Gather::new(25 * MS, 100);
        stream(&mut g, start, 25 * MS, 5, 10);
        let rang = start + Duration::from_secs(1);
        assert_eq!(g.wait(rang, rang + 10 * MS), 15 * MS);
    }

    #[test]
    fn a_small_batch_size_gathers_at_least_one_row() {
        let g = Gather::new(25 * MS, 1);
        assert_eq!(g.target, 1);
        assert_eq!(Gather::new(25 * MS, 10).target, 3);
    }
}
