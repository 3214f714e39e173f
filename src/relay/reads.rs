//! What the relay last read of a table, exported as times rather than ages (Prometheus's
//! instrumentation guide, "timestamps, not time since"): the scraper computes `time() - x`
//! itself, so a value the relay stopped refreshing (the database down, a pooler refusing
//! logins, a dark link, a stuck connection) keeps ageing in the rules instead of freezing, and
//! `outbox_table_up` says whether the relay can read the table now. The age gauges stay beside
//! these, as of the last read.

use std::fmt::Write;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::metrics::{self as names, unix_seconds};

/// One successful read of a table's oldest unsent row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Read {
    /// When the read began, in seconds since the epoch, on the relay's clock: taken before the
    /// statement went out, so that nothing it saw is newer.
    pub at: f64,
    /// The oldest unsent row's `created_at` (rows parked in quarantine included), or `at` when
    /// none was unsent: every row created before this time had been sent or quarantined.
    pub oldest_unsent_at: f64,
}

impl Read {
    /// A read that began at `began` and found the oldest unsent row that old (0: none).
    pub fn new(began: SystemTime, oldest_unsent_age_seconds: f64) -> Read {
        let at = unix_seconds(began);
        Read {
            at,
            oldest_unsent_at: at - oldest_unsent_age_seconds.max(0.0),
        }
    }
}

/// A table's reads so far: the last that succeeded, and whether the latest failed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Seen {
    pub last: Option<Read>,
    /// The latest read failed, or row-level security hid rows from it (a count that leaves
    /// rows out is not a read of the table).
    pub failing: bool,
}

impl Seen {
    pub fn read(&mut self, read: Read) {
        self.last = Some(read);
        self.failing = false;
    }

    pub fn failed(&mut self) {
        self.failing = true;
    }

    /// The relay can read the table now: its latest read succeeded and the one after it is
    /// not overdue. A read that hangs (a dark link, a connection stuck behind a lock) neither
    /// succeeds nor fails until its deadline; past `overdue` it counts as failed.
    pub fn up(&self, now: f64, overdue: Duration) -> bool {
        !self.failing
            && self
                .last
                .is_some_and(|r| now - r.at <= overdue.as_secs_f64())
    }

    /// Two tables as one (the `(others)` series of a relay serving many): the older of each
    /// time, and down when either is, or was never read.
    pub fn merge(self, o: Seen) -> Seen {
        let last = match (self.last, o.last) {
            (Some(a), Some(b)) => Some(Read {
                at: a.at.min(b.at),
                oldest_unsent_at: a.oldest_unsent_at.min(b.oldest_unsent_at),
            }),
            (a, b) => a.or(b),
        };
        Seen {
            last,
            failing: self.failing || o.failing || self.last.is_none() || o.last.is_none(),
        }
    }
}

/// The least time a read may take before it counts as overdue: a loaded database or a slow
/// link make a read late by seconds without anything being wrong.
const READ_ALLOWANCE: Duration = Duration::from_secs(5);

/// Reads are due every `--stats-interval`; the next one is overdue when a whole interval more,
/// and at least [`READ_ALLOWANCE`], has passed without it (10 s with the default 5 s).
pub fn overdue_after(stats_interval: Duration) -> Duration {
    stats_interval + stats_interval.max(READ_ALLOWANCE)
}

/// The three series for each of `rows` (its label set, `""` or `{table="…"}`, and its reads),
/// `# HELP` and `# TYPE` included; `now` in seconds since the epoch. A table never read has no
/// timestamps yet, only `outbox_table_up 0`.
pub fn render(out: &mut String, rows: &[(String, Seen)], now: f64, overdue: Duration) {
    let series: [Series; 3] = [
        (
            names::OLDEST_UNSENT_TIMESTAMP,
            "created_at of the oldest unsent row (rows parked in quarantine included) at the relay's last read of the table, in seconds since the epoch; the time of that read when none was unsent. time() - this is the age, and keeps growing while the relay cannot read",
            |s, _, _| s.last.map(|r| r.oldest_unsent_at),
        ),
        (
            names::TABLE_LAST_READ,
            "when the relay's last successful read of the table began, in seconds since the epoch",
            |s, _, _| s.last.map(|r| r.at),
        ),
        (
            names::TABLE_UP,
            "1 while the relay can read the table: its latest read succeeded and the next is not overdue (--stats-interval, and at least 5 s, late); 0 otherwise",
            |s, now, overdue| Some(if s.up(now, overdue) { 1.0 } else { 0.0 }),
        ),
    ];
    for (name, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (labels, seen) in rows {
            if let Some(v) = value(seen, now, overdue) {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        }
    }
}

/// A series' name, its help text, and its value for a table's reads at a time (none: no
/// sample), given when a read is overdue.
type Series = (
    &'static str,
    &'static str,
    fn(&Seen, f64, Duration) -> Option<f64>,
);

/// The reads of the one table a single-table relay serves, rendered without a `table` label
/// like its other gauges. Exists from start-up: before the first read the table is down.
#[derive(Debug)]
pub struct Reads {
    seen: Mutex<Seen>,
    overdue: Duration,
}

impl Reads {
    pub fn new(stats_interval: Duration) -> Reads {
        Reads {
            seen: Mutex::new(Seen::default()),
            overdue: overdue_after(stats_interval),
        }
    }

    pub fn read(&self, read: Read) {
        self.seen.lock().expect("reads lock").read(read);
    }

    pub fn failed(&self) {
        self.seen.lock().expect("reads lock").failed();
    }

    pub fn render(&self) -> String {
        let seen = *self.seen.lock().expect("reads lock");
        let mut out = String::new();
        render(
            &mut out,
            &[(String::new(), seen)],
            unix_seconds(SystemTime::now()),
            self.overdue,
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    const OVERDUE: Duration = Duration::from_secs(10);

    fn at(secs: f64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs_f64(secs)
    }

    #[test]
    fn the_oldest_unsent_time_is_the_rows_and_the_reads_own_when_none_waits() {
        let waiting = Read::new(at(1_000.0), 40.0);
        assert_eq!((waiting.at, waiting.oldest_unsent_at), (1_000.0, 960.0));
        // Nothing unsent: time() - x is the time since the read, not since some old row.
        let none = Read::new(at(1_000.0), 0.0);
        assert_eq!(none.oldest_unsent_at, 1_000.0);
    }

    #[test]
    fn a_table_is_up_only_while_its_latest_read_succeeded_and_the_next_is_not_overdue() {
        let mut seen = Seen::default();
        assert!(!seen.up(1_000.0, OVERDUE), "never read");
        seen.read(Read::new(at(1_000.0), 0.0));
        assert!(seen.up(1_005.0, OVERDUE));
        assert!(seen.up(1_010.0, OVERDUE));
        assert!(
            !seen.up(1_010.5, OVERDUE),
            "a read that hangs counts as failed"
        );
        seen.read(Read::new(at(1_010.0), 3.0));
        seen.failed();
        assert!(!seen.up(1_011.0, OVERDUE));
        assert_eq!(
            seen.last.map(|r| r.oldest_unsent_at),
            Some(1_007.0),
            "a failure keeps what the last read saw"
        );
    }

    #[test]
    fn others_take_the_older_times_and_are_down_when_any_table_is() {
        let mut a = Seen::default();
        a.read(Read::new(at(100.0), 10.0));
        let mut b = Seen::default();
        b.read(Read::new(at(95.0), 0.0));
        let both = a.merge(b);
        assert_eq!(
            both.last,
            Some(Read {
                at: 95.0,
                oldest_unsent_at: 90.0
            })
        );
        assert!(both.up(96.0, OVERDUE));
        b.failed();
        assert!(!a.merge(b).up(96.0, OVERDUE));
        assert!(
            !a.merge(Seen::default()).up(96.0, OVERDUE),
            "one never read"
        );
    }

    #[test]
    fn a_table_never_read_has_no_timestamps_and_is_down() {
        let mut out = String::new();
        render(&mut out, &[(String::new(), Seen::default())], 5.0, OVERDUE);
        assert!(out.contains("\noutbox_table_up 0\n"), "{out}");
        assert!(
            !out.contains("\noutbox_oldest_unsent_timestamp_seconds "),
            "{out}"
        );
        let mut seen = Seen::default();
        seen.read(Read::new(at(1_000.0), 0.0));
        let mut out = String::new();
        render(
            &mut out,
            &[("{table=\"a.outbox\"}".into(), seen)],
            1_001.0,
            OVERDUE,
        );
        for line in [
            "outbox_oldest_unsent_timestamp_seconds{table=\"a.outbox\"} 1000\n",
            "outbox_table_last_read_timestamp_seconds{table=\"a.outbox\"} 1000\n",
            "outbox_table_up{table=\"a.outbox\"} 1\n",
        ] {
            assert!(out.contains(line), "{line} in {out}");
        }
    }
}
