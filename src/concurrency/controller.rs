//! The rule: how many requests one destination gets at once, from what its answers did.
//!
//! Vector's Adaptive Request Concurrency (`vectordotdev/vector`,
//! `src/sinks/util/adaptive_concurrency/controller.rs`) is the reference: requests are grouped
//! into windows one mean round trip long; at each window's end the mean RTT of its answers is
//! compared with an EWMA of the windows before. Back-pressure, or an RTT above that average by
//! more than a few deviations, lowers the limit multiplicatively; a window that used the whole
//! limit with an RTT no higher than the average raises it by one. Two changes: the limit starts
//! at one and doubles while the destination shows no sign of load (TCP's slow start), so a fast
//! queue reaches `--max-in-flight` within a few round trips instead of one step per round trip;
//! explicit back-pressure (a timeout, throttling, a 5xx) halves the limit instead of taking a
//! tenth off, since a server that lets requests time out has a queue far longer than a tenth;
//! and the limit rises only while the RTT is below twice the lowest RTT of the last windows (TCP
//! Vegas's base RTT). Without that gate vector's rule creeps upwards on a server that answers one
//! request at a time (moto's one Python core): its reference is an average of the RTTs the last
//! increase caused, so each increase becomes the new normal (a unit test below showed 1 -> 6
//! within 200 windows). With it, more requests are let in only while each waits there less
//! than the destination takes to answer one. The same gate holds the decrease on a rise: jitter
//! around a constant latency (a proxy, a loaded machine) is not load, and took a quarter off the
//! limit of a 50 ms destination, 40 % of its throughput, before it did.
//!
//! No I/O and no clock: the caller passes the time and each request's outcome.

use std::time::{Duration, Instant};

/// What a mean of equal RTTs may differ from them by: a rounding, not a rise.
const ROUNDING: f64 = 1e-9;

/// Limit the rule may not leave: `1 ..= ceiling`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// `--max-in-flight`.
    pub ceiling: usize,
    /// The limit after a window whose RTT rose: vector's 0.9.
    pub decrease_ratio: f64,
    /// The limit after a window with back-pressure.
    pub back_off_ratio: f64,
    /// Weight of the newest window in the RTT average: vector's 0.4.
    pub ewma_alpha: f64,
    /// How many standard deviations above the average count as a rise: vector's 2.5.
    pub rtt_deviation_scale: f64,
    /// The least rise that counts, as a fraction of the average. While the average has no
    /// deviation yet (the first windows, or a destination answering in constant time) any rise
    /// would count, even the rounding of a mean; vector rounds its test RTTs for that.
    pub rtt_tolerance: f64,
    /// The limit rises only while a window's RTT is below the base RTT times this.
    pub base_rtt_ratio: f64,
    /// ... and only while it is less than this above the base RTT. A destination answering in
    /// a fraction of a millisecond (a queue in the same zone, the local emulators) has its RTT
    /// doubled by any scheduling hiccup of a loaded host; without this slack the drain at
    /// `--max-in-flight 4` was 0.77-0.85 of the fixed limit's on a loaded host, with it 1.04
    /// (docs/benchmarks.md). A few milliseconds of queueing there is no reason to send less.
    pub base_rtt_slack: Duration,
    /// The base RTT is the lowest window RTT of the last this many to twice as many windows,
    /// so that it follows a destination that became slower for good.
    pub base_rtt_windows: u32,
}

impl Settings {
    pub fn new(ceiling: usize) -> Settings {
        Settings {
            ceiling: ceiling.max(1),
            decrease_ratio: 0.9,
            back_off_ratio: 0.5,
            ewma_alpha: 0.4,
            rtt_deviation_scale: 2.5,
            rtt_tolerance: 0.05,
            base_rtt_ratio: 2.0,
            base_rtt_slack: Duration::from_millis(5),
            base_rtt_windows: 100,
        }
    }
}

/// What one request told us about its destination's load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// The destination answered after `rtt` (whatever it said of each entry).
    Answered(Duration),
    /// It asked for less: no answer in time, throttling, a server error, a dropped connection.
    BackPressure,
    /// Nothing about load: not sent after all, refused for its configuration or its input.
    Unmeasured,
}

/// The adaptive limit of one destination.
#[derive(Debug, Clone)]
pub struct Controller {
    settings: Settings,
    limit: usize,
    in_flight: usize,
    /// Doubling until the first window with a rise or back-pressure.
    slow_start: bool,
    /// EWMA of the windows' mean RTTs, in seconds, and its variance.
    past: Option<MeanVariance>,
    /// The lowest window RTT since the last window count multiple of `base_rtt_windows`, and
    /// the one before: the base is the lower of the two.
    base: [f64; 2],
    windows: u32,
    window: Window,
    /// When the current window ends; `None` until the first answer.
    window_ends: Option<Instant>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct MeanVariance {
    mean: f64,
    variance: f64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Window {
    rtt_sum: f64,
    answers: u32,
    back_pressure: bool,
    /// Some request found the whole limit in use: only then is there evidence for more.
    reached_limit: bool,
}

impl Window {
    fn mean(&self) -> Option<f64> {
        (self.answers > 0).then(|| self.rtt_sum / f64::from(self.answers))
    }
}

impl Controller {
    pub fn new(settings: Settings) -> Controller {
        Controller {
            settings,
            limit: 1,
            in_flight: 0,
            slow_start: true,
            past: None,
            base: [f64::INFINITY; 2],
            windows: 0,
            window: Window::default(),
            window_ends: None,
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A request got a slot and is sent now.
    pub fn started(&mut self) {
        self.in_flight += 1;
        if self.in_flight >= self.limit {
            self.window.reached_limit = true;
        }
    }

    /// A request started with [`Controller::started`] ended at `now`. Returns the new limit
    /// when it changed.
    pub fn finished(&mut self, outcome: Outcome, now: Instant) -> Option<usize> {
        self.in_flight = self.in_flight.saturating_sub(1);
        match outcome {
            Outcome::Answered(rtt) => {
                self.window.rtt_sum += rtt.as_secs_f64();
                self.window.answers += 1;
            }
            Outcome::BackPressure => self.window.back_pressure = true,
            Outcome::Unmeasured => {}
        }
        if self.window_ends.is_some_and(|end| now < end) {
            return None;
        }
        let before = self.limit;
        let current = self.window.mean();
        let s = self.settings;
        if self.window.back_pressure {
            self.decrease(s.back_off_ratio);
        } else if let (Some(current), Some(past)) = (current, self.past) {
            let threshold =
                (past.variance.sqrt() * s.rtt_deviation_scale).max(past.mean * s.rtt_tolerance);
            let queueing = self.queueing(current);
            if current > past.mean + threshold && queueing {
                self.decrease(s.decrease_ratio);
            } else if !self.window.reached_limit || queueing {
                // No evidence that more would be used, or more would only wait there.
            } else if self.slow_start {
                self.limit = (self.limit * 2).min(s.ceiling);
            } else if current <= past.mean * (1.0 + ROUNDING) {
                self.limit = (self.limit + 1).min(s.ceiling);
            }
        }
        if let Some(current) = current {
            self.windows += 1;
            if self.windows % s.base_rtt_windows.max(1) == 0 {
                self.base = [self.base[1], f64::INFINITY];
            }
            self.base[0] = self.base[0].min(current);
            self.base[1] = self.base[1].min(current);
        }
        if let Some(current) = current {
            self.past = Some(match self.past {
                None => MeanVariance {
                    mean: current,
                    variance: 0.0,
                },
                Some(past) => {
                    let diff = current - past.mean;
                    let step = s.ewma_alpha * diff;
                    MeanVariance {
                        mean: past.mean + step,
                        variance: (1.0 - s.ewma_alpha) * (past.variance + diff * step),
                    }
                }
            });
        }
        // Without an answer yet there is no round trip to size the window by: the next answer
        // ends it.
        self.window_ends = self
            .past
            .map(|past| now + Duration::from_secs_f64(past.mean));
        self.window = Window::default();
        (self.limit != before).then_some(self.limit)
    }

    fn base_rtt(&self) -> f64 {
        self.base[0].min(self.base[1])
    }

    /// Whether answers taking `rtt` seconds waited at the destination behind other requests,
    /// rather than jittered around what it takes to answer one.
    fn queueing(&self, rtt: f64) -> bool {
        let base = self.base_rtt();
        rtt >= base * self.settings.base_rtt_ratio
            && rtt >= base + self.settings.base_rtt_slack.as_secs_f64()
    }

    fn decrease(&mut self, ratio: f64) {
        self.slow_start = false;
        self.limit = ((self.limit as f64 * ratio) as usize).max(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Runs rounds of `limit` requests started at once and answered with the RTT `rtt(limit)`,
    /// their answers spread over the round (as a server answers them); returns the limit after
    /// each round.
    fn windows(
        c: &mut Controller,
        now: &mut Instant,
        count: usize,
        mut rtt: impl FnMut(usize) -> Duration,
    ) -> Vec<usize> {
        let mut limits = Vec::new();
        for _ in 0..count {
            let n = c.limit();
            let took = rtt(n);
            for _ in 0..n {
                c.started();
            }
            let start = *now;
            for i in 1..=n {
                *now = start + took * i as u32 / n as u32;
                c.finished(Outcome::Answered(took), *now);
            }
            limits.push(c.limit());
        }
        limits
    }

    #[test]
    fn a_destination_that_answers_in_constant_time_gets_the_ceiling_within_a_few_round_trips() {
        let mut c = Controller::new(Settings::new(32));
        let mut now = Instant::now();
        let limits = windows(&mut c, &mut now, 8, |_| 15 * MS);
        assert_eq!(limits, [1, 2, 4, 8, 16, 32, 32, 32]);
    }

    #[test]
    fn a_server_that_answers_one_request_at_a_time_keeps_a_low_limit() {
        // Each request waits for all before it: RTT grows with the requests in flight.
        let mut c = Controller::new(Settings::new(32));
        let mut now = Instant::now();
        let limits = windows(&mut c, &mut now, 200, |n| 100 * MS * n as u32);
        assert!(
            limits.iter().all(|&l| l <= 2),
            "more requests only queue there: {limits:?}"
        );
    }

    #[test]
    fn rising_latency_lowers_the_limit_and_back_pressure_halves_it() {
        let mut c = Controller::new(Settings::new(32));
        let mut now = Instant::now();
        windows(&mut c, &mut now, 8, |_| 15 * MS);
        assert_eq!(c.limit(), 32);
        // The destination slows down: 15 ms -> 150 ms.
        let limits = windows(&mut c, &mut now, 1, |_| 150 * MS);
        assert_eq!(limits, [28], "32 x 0.9");
        c.started();
        now += 10 * Duration::from_secs(1);
        assert_eq!(c.finished(Outcome::BackPressure, now), Some(14));
    }

    #[test]
    fn a_destination_that_became_slower_for_good_gets_its_limit_back() {
        let mut c = Controller::new(Settings::new(32));
        let mut now = Instant::now();
        windows(&mut c, &mut now, 8, |_| 15 * MS);
        // Now 150 ms however many requests wait (a queue in another region): the old base RTT
        // holds the limit down for a while, then ages out.
        let limits = windows(&mut c, &mut now, 300, |_| 150 * MS);
        assert!(limits[0] < 32, "{limits:?}");
        assert_eq!(limits.last(), Some(&32), "{limits:?}");
    }

    #[test]
    fn jitter_around_a_constant_latency_does_not_lower_the_limit() {
        let mut c = Controller::new(Settings::new(32));
        let mut now = Instant::now();
        let mut jitter = [50u32, 55, 48, 70, 52, 60, 47, 75, 50, 58]
            .into_iter()
            .cycle();
        let limits = windows(&mut c, &mut now, 60, |_| {
            Duration::from_millis(jitter.next().unwrap().into())
        });
        assert!(limits[10..].iter().all(|&l| l == 32), "{limits:?}");
    }

    #[test]
    fn a_sub_millisecond_destination_reaches_the_ceiling_through_scheduling_jitter() {
        let mut c = Controller::new(Settings::new(32));
        let mut now = Instant::now();
        // 0.3 ms answers, some of them doubled or worse by a busy host.
        let mut jitter = [300u64, 900, 350, 2_000, 300, 700, 1_500, 320]
            .into_iter()
            .cycle();
        let limits = windows(&mut c, &mut now, 40, |_| {
            Duration::from_micros(jitter.next().unwrap())
        });
        assert_eq!(limits.last(), Some(&32), "{limits:?}");
    }

    #[test]
    fn a_limit_is_not_raised_without_requests_waiting_for_it() {
        let mut c = Controller::new(Settings::new(32));
        let mut now = Instant::now();
        windows(&mut c, &mut now, 3, |_| 15 * MS);
        assert_eq!(c.limit(), 4);
        // A trickle: one request at a time, never the whole limit in use.
        for _ in 0..20 {
            c.started();
            now += 15 * MS;
            assert_eq!(c.finished(Outcome::Answered(15 * MS), now), None);
        }
        assert_eq!(c.limit(), 4);
    }

    #[test]
    fn after_a_fall_the_limit_climbs_back_one_step_per_healthy_window() {
        let mut c = Controller::new(Settings::new(32));
        let mut now = Instant::now();
        windows(&mut c, &mut now, 8, |_| 15 * MS);
        now += 20 * MS;
        c.started();
        assert_eq!(c.finished(Outcome::BackPressure, now), Some(16));
        let limits = windows(&mut c, &mut now, 4, |_| 15 * MS);
        assert_eq!(limits, [17, 18, 19, 20], "additive, not slow start again");
    }

    #[test]
    fn the_limit_stays_between_one_and_the_ceiling() {
        let mut c = Controller::new(Settings::new(3));
        let mut now = Instant::now();
        assert_eq!(windows(&mut c, &mut now, 4, |_| MS), [1, 2, 3, 3]);
        for _ in 0..5 {
            c.started();
            now += Duration::from_secs(1);
            c.finished(Outcome::BackPressure, now);
        }
        assert_eq!(c.limit(), 1);
    }

    #[test]
    fn outcomes_that_say_nothing_of_load_change_nothing() {
        let mut c = Controller::new(Settings::new(32));
        let mut now = Instant::now();
        windows(&mut c, &mut now, 4, |_| 15 * MS);
        // The first round closes the window of the answers before it.
        c.started();
        c.finished(Outcome::Unmeasured, now + Duration::from_secs(1));
        now += Duration::from_secs(1);
        let before = c.limit();
        for _ in 0..10 {
            for _ in 0..before {
                c.started();
            }
            now += Duration::from_secs(1);
            for _ in 0..before {
                assert_eq!(c.finished(Outcome::Unmeasured, now), None);
            }
        }
        assert_eq!(c.limit(), before);
    }

    #[test]
    fn the_window_is_one_mean_round_trip_long() {
        let mut c = Controller::new(Settings::new(32));
        let start = Instant::now();
        c.started();
        assert_eq!(c.finished(Outcome::Answered(100 * MS), start), None);
        // Two requests inside the next 100 ms window: the limit moves only at its end.
        c.started();
        c.started();
        assert_eq!(
            c.finished(Outcome::Answered(100 * MS), start + 50 * MS),
            None
        );
        assert_eq!(
            c.finished(Outcome::Answered(100 * MS), start + 100 * MS),
            Some(2)
        );
    }
}
