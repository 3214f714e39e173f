//! The table gauges of a relay serving several tables: each table's latest values, and which
//! of them become series with a `table` label. Past `--table-series` tables only the worst
//! ones do, plus one series per gauge for all the others together (`table="(others)"`), so a
//! thousand tables do not make a thousand series of every gauge; the set is chosen anew at
//! every scrape, and a table that leaves it leaves no stale series behind.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Mutex;

use std::time::{Duration, SystemTime};

use super::reads::{self, Read, Seen};
use crate::metrics as names;
use crate::outbox::{Look, Stats};

/// The label value of the aggregate of the tables not shown on their own.
pub const OTHERS: &str = "(others)";

/// One table's gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Gauges {
    pub oldest_unsent_age_seconds: f64,
    pub unsent: f64,
    pub quarantined: f64,
    pub blocked: f64,
    pub oldest_quarantined_age_seconds: f64,
    pub held_back: f64,
    pub oldest_held_back_age_seconds: f64,
    /// The reads behind the ages, exported as times.
    pub seen: Seen,
}

impl Gauges {
    fn from_stats(s: &Stats, seen: Seen) -> Gauges {
        Gauges {
            seen,
            oldest_unsent_age_seconds: s.oldest_unsent_age_seconds,
            unsent: s.unsent as f64,
            quarantined: s.quarantined as f64,
            blocked: s.blocked as f64,
            oldest_quarantined_age_seconds: s.oldest_quarantined_age_seconds,
            held_back: s.held_back as f64,
            oldest_held_back_age_seconds: s.oldest_held_back_age_seconds,
        }
    }

    /// Two tables' gauges as one: the oldest of the ages, the sum of the counts.
    fn merge(self, o: Gauges) -> Gauges {
        Gauges {
            oldest_unsent_age_seconds: self
                .oldest_unsent_age_seconds
                .max(o.oldest_unsent_age_seconds),
            unsent: self.unsent + o.unsent,
            quarantined: self.quarantined + o.quarantined,
            blocked: self.blocked + o.blocked,
            oldest_quarantined_age_seconds: self
                .oldest_quarantined_age_seconds
                .max(o.oldest_quarantined_age_seconds),
            held_back: self.held_back + o.held_back,
            oldest_held_back_age_seconds: self
                .oldest_held_back_age_seconds
                .max(o.oldest_held_back_age_seconds),
            seen: self.seen.merge(o.seen),
        }
    }

    /// Worse first: the older oldest unsent row, then more unsent rows, then more quarantined.
    fn worse_first(a: &(String, Gauges), b: &(String, Gauges)) -> std::cmp::Ordering {
        let key = |g: &Gauges| (g.oldest_unsent_age_seconds, g.unsent, g.quarantined);
        key(&b.1)
            .partial_cmp(&key(&a.1))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.0.cmp(&b.0))
    }
}

/// What a scrape shows: the tables with series of their own, worst first, and the aggregate of
/// the others (how many, and their gauges together), if any.
#[derive(Debug, Clone, PartialEq)]
pub struct BoardView {
    pub tables: Vec<(String, Gauges)>,
    pub others: Option<(usize, Gauges)>,
}

/// Pure: the worst `limit` tables on their own, the rest as one.
pub fn show(mut tables: Vec<(String, Gauges)>, limit: usize) -> BoardView {
    tables.sort_by(Gauges::worse_first);
    if tables.len() <= limit {
        return BoardView {
            tables,
            others: None,
        };
    }
    let rest = tables.split_off(limit);
    let count = rest.len();
    let merged = rest
        .into_iter()
        .map(|(_, g)| g)
        .reduce(Gauges::merge)
        .expect("at least one");
    BoardView {
        tables,
        others: Some((count, merged)),
    }
}

/// Every table's latest gauges, as turns and looks report them.
#[derive(Debug)]
pub struct Board {
    tables: Mutex<HashMap<String, Gauges>>,
    /// Tables skipped now (dropped, locked, unreadable, refused), each with `outbox_table_skipped`.
    skipped: Mutex<std::collections::BTreeSet<String>>,
    limit: usize,
    /// When a table's next read is overdue (`reads::overdue_after`).
    overdue: Duration,
}

impl Board {
    pub fn new(limit: usize, stats_interval: Duration) -> Board {
        Board {
            tables: Mutex::new(HashMap::new()),
            skipped: Mutex::new(std::collections::BTreeSet::new()),
            limit,
            overdue: reads::overdue_after(stats_interval),
        }
    }

    /// A turn read the table's statistics (its read itself is recorded by [`Board::read`]).
    pub fn stats(&self, table: &str, stats: &Stats) {
        let mut tables = self.tables.lock().expect("board lock");
        let g = tables.entry(table.to_string()).or_default();
        *g = Gauges::from_stats(stats, g.seen);
    }

    /// A read of the table's oldest unsent row that began at its time, or (`None`) failed.
    pub fn read(&self, table: &str, read: Option<Read>) {
        let mut tables = self.tables.lock().expect("board lock");
        let seen = &mut tables.entry(table.to_string()).or_default().seen;
        match read {
            Some(read) => seen.read(read),
            None => seen.failed(),
        }
    }

    /// The look at every table failed as a whole (the database, the connection).
    pub fn failed_all(&self) {
        for g in self.tables.lock().expect("board lock").values_mut() {
            g.seen.failed();
        }
    }

    /// The look, begun at `began`, saw the table: its oldest unsent row's age is current; with
    /// none unsent, no row is (quarantined rows keep their last counts: only a turn reads those).
    pub fn look(&self, table: &str, look: &Look, began: SystemTime) {
        let mut tables = self.tables.lock().expect("board lock");
        let g = tables.entry(table.to_string()).or_default();
        g.seen
            .read(Read::new(began, look.oldest_unsent_age_seconds));
        g.oldest_unsent_age_seconds = look.oldest_unsent_age_seconds;
        if look.oldest_unsent_age_seconds == 0.0 {
            g.unsent = 0.0;
            g.blocked = 0.0;
            g.held_back = 0.0;
            g.oldest_held_back_age_seconds = 0.0;
        }
    }

    /// The table is no longer served (dropped, no longer selected): its series go.
    pub fn forget(&self, table: &str) {
        self.tables.lock().expect("board lock").remove(table);
        self.skipped.lock().expect("board lock").remove(table);
    }

    /// The table is skipped (`true`) or served again. A skipped table is not read: it is down
    /// until a look reads it again.
    pub fn skipped(&self, table: &str, skipped: bool) {
        if skipped {
            self.read(table, None);
        }
        let mut set = self.skipped.lock().expect("board lock");
        match skipped {
            true => set.insert(table.to_string()),
            false => set.remove(table),
        };
    }

    /// The series as Prometheus text.
    pub fn render(&self) -> String {
        let tables: Vec<(String, Gauges)> = self
            .tables
            .lock()
            .expect("board lock")
            .iter()
            .map(|(t, g)| (t.clone(), *g))
            .collect();
        let total = tables.len();
        let shown = show(tables, self.limit);
        let mut rows: Vec<(String, Gauges)> = shown.tables;
        if let Some((_, g)) = shown.others {
            rows.push((OTHERS.to_string(), g));
        }
        let mut out = String::new();
        let gauges: [Series; 7] = [
            (names::OLDEST_UNSENT_AGE, "now - created_at of the oldest unsent row of the table (rows parked in quarantine included); 0 when none", |g| g.oldest_unsent_age_seconds),
            (names::UNSENT_ROWS, "unsent rows of the table, leased ones and rows parked in quarantine included", |g| g.unsent),
            (names::QUARANTINED_ROWS, "rows of the table in quarantine", |g| g.quarantined),
            (names::BLOCKED_ROWS, "quarantined rows parked behind a quarantined event of their group", |g| g.blocked),
            (names::OLDEST_QUARANTINED_AGE, "now - quarantined_at of the table's row longest in quarantine; 0 when none", |g| g.oldest_quarantined_age_seconds),
            (names::WATERMARK_HELD_ROWS, "--order-by transaction: committed unsent rows held back", |g| g.held_back),
            (names::WATERMARK_AGE, "--order-by transaction: age of the oldest committed row held back", |g| g.oldest_held_back_age_seconds),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            for (table, g) in &rows {
                let _ = writeln!(out, "{name}{{table=\"{}\"}} {}", escape(table), value(g));
            }
        }
        let labelled: Vec<(String, Seen)> = rows
            .iter()
            .map(|(table, g)| (format!("{{table=\"{}\"}}", escape(table)), g.seen))
            .collect();
        reads::render(
            &mut out,
            &labelled,
            names::unix_seconds(SystemTime::now()),
            self.overdue,
        );
        let skipped = self.skipped.lock().expect("board lock").clone();
        let _ = writeln!(
            out,
            "# HELP {} tables this relay serves, by state (serving, skipped: failing on their own)",
            names::TABLES
        );
        let _ = writeln!(out, "# TYPE {} gauge", names::TABLES);
        let _ = writeln!(
            out,
            "{}{{state=\"serving\"}} {}",
            names::TABLES,
            total.saturating_sub(skipped.len())
        );
        let _ = writeln!(
            out,
            "{}{{state=\"skipped\"}} {}",
            names::TABLES,
            skipped.len()
        );
        let _ = writeln!(
            out,
            "# HELP {} 1 for a table skipped now (dropped, locked, unreadable, or its schema refuses this relay); at most --table-series of them",
            names::TABLE_SKIPPED
        );
        let _ = writeln!(out, "# TYPE {} gauge", names::TABLE_SKIPPED);
        for table in skipped.iter().take(self.limit.max(1)) {
            let _ = writeln!(
                out,
                "{}{{table=\"{}\"}} 1",
                names::TABLE_SKIPPED,
                escape(table)
            );
        }
        out
    }
}

/// A gauge's name, its help text, and its value of a table's gauges.
type Series = (&'static str, &'static str, fn(&Gauges) -> f64);

/// A label value as the exposition format needs it.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(age: f64, unsent: f64) -> Gauges {
        Gauges {
            oldest_unsent_age_seconds: age,
            unsent,
            ..Gauges::default()
        }
    }

    #[test]
    fn past_the_limit_the_worst_tables_are_shown_and_the_rest_as_one() {
        let tables = vec![
            ("a".to_string(), g(1.0, 10.0)),
            ("b".to_string(), g(30.0, 5.0)),
            ("c".to_string(), g(0.0, 0.0)),
            ("d".to_string(), g(1.0, 20.0)),
        ];
        let shown = show(tables.clone(), 2);
        let names: Vec<&str> = shown.tables.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(names, ["b", "d"]);
        // Neither was read: together they are down, as each alone.
        let never_read = Seen {
            last: None,
            failing: true,
        };
        assert_eq!(
            shown.others,
            Some((
                2,
                Gauges {
                    seen: never_read,
                    ..g(1.0, 10.0)
                }
            ))
        );
        let all = show(tables, 10);
        assert_eq!(all.tables.len(), 4);
        assert_eq!(all.others, None);
    }

    #[test]
    fn the_rendered_series_are_the_shown_tables_and_the_others() {
        let board = Board::new(1, Duration::from_secs(5));
        let stats = |age: f64, unsent: i64| Stats {
            oldest_unsent_age_seconds: age,
            unsent,
            quarantined: 0,
            blocked: 0,
            claim_floor: 0,
            counted_unsent: unsent,
            oldest_quarantined_age_seconds: 0.0,
            estimated: false,
            held_back: 0,
            oldest_held_back_age_seconds: 0.0,
        };
        board.stats("t1.outbox", &stats(5.0, 3));
        board.stats("t2.outbox", &stats(50.0, 1));
        board.stats("t3.\"x\"", &stats(0.5, 7));
        let text = board.render();
        assert!(
            text.contains("outbox_oldest_unsent_age_seconds{table=\"t2.outbox\"} 50\n"),
            "{text}"
        );
        assert!(
            text.contains("outbox_unsent_rows{table=\"(others)\"} 10\n"),
            "{text}"
        );
        assert!(!text.contains("t1.outbox"), "{text}");
        assert!(
            text.contains("outbox_tables{state=\"serving\"} 3\n"),
            "{text}"
        );
        board.skipped("t3.\"x\"", true);
        let text = board.render();
        assert!(
            text.contains("outbox_tables{state=\"skipped\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("outbox_table_skipped{table=\"t3.\\\"x\\\"\"} 1\n"),
            "{text}"
        );
        board.forget("t2.outbox");
        let text = board.render();
        assert!(!text.contains("t2.outbox"), "{text}");
        assert!(
            text.contains("outbox_oldest_unsent_age_seconds{table=\"t1.outbox\"} 5\n"),
            "{text}"
        );
    }

    #[test]
    fn a_look_that_finds_nothing_unsent_clears_the_age_and_count() {
        let board = Board::new(5, Duration::from_secs(5));
        board.look(
            "t",
            &Look {
                claimable: true,
                full: true,
                oldest_unsent_age_seconds: 9.0,
                parked_due: false,
                expired: false,
            },
            SystemTime::now(),
        );
        board.tables.lock().unwrap().get_mut("t").unwrap().unsent = 4.0;
        board.look(
            "t",
            &Look {
                claimable: false,
                full: true,
                oldest_unsent_age_seconds: 0.0,
                parked_due: false,
                expired: false,
            },
            SystemTime::now(),
        );
        let shown = board.tables.lock().unwrap()["t"];
        assert_eq!((shown.oldest_unsent_age_seconds, shown.unsent), (0.0, 0.0));
    }
}
