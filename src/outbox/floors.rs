//! Where a relay's scans of one table start, so that they seek past what settled rows left
//! behind instead of walking it (docs/guarantees.md, "Seek, never walk").
//!
//! A settled row's index entries stay until VACUUM removes them, and while anything holds the
//! vacuum horizon back (a `pg_dump`, a report, a standby's feedback) nothing can remove them,
//! nor even mark them dead for the scans that pass over them. A scan from the start of the
//! unsent index then reads every row settled since the horizon was taken: a claim that cost
//! 0.1 ms costs tens of milliseconds after minutes, and more each minute. Each relay keeps two
//! floors per table and starts its scans there:
//!
//! - **rows**: no unsent row it can see has a smaller id. Raised by each claim that took rows,
//!   and by the statistics pass (every `--stats-interval`), to the lowest unsent id at or above
//!   it, which a seek finds. A row that
//!   commits late below it (a long transaction, a prepared one, ids a session cached from a
//!   sequence) is found by the *sweep*, the one statement that still reads from the start of
//!   the index, every `--sweep-interval`: it lowers the floor to that row. The sweep is the
//!   safety net: between two sweeps a late row waits, never longer.
//! - **claims**: no live claim in the lease table has a smaller token. Claims are inserted
//!   one at a time under the claim lock, so tokens only grow; each claim reports the lowest
//!   live token it saw (its own included), and the next claim reads the lease table from
//!   there. Nothing needs a sweep: a claim with a smaller token cannot appear later, but after
//!   the server lost transactions. The relay commits its own asynchronously, so a server that
//!   restarted after a crash (or a standby promoted in its place) may have lost the last claims
//!   and the identity's advance with them, and hands their tokens out again, below the floor.
//!   Each claim reads when the server started; when that changes, both floors go back to the
//!   start ([`Floors::server_started`]).
//!
//! - **sent rows** (`--retention`): the retention pass deletes sent rows oldest `sent_at`
//!   first; the next pass starts a margin ([`SENT_MARGIN`]) below the newest `sent_at` it
//!   deleted, and one pass in [`FULL_RETENTION_PASS`] starts from the first sent row. A row
//!   whose `sent_at` is older than where a pass starts (its settlement committed more than the
//!   margin after its transaction began, or another statement held it locked) is deleted by
//!   that full pass: later than its retention, never lost.
//!
//! All are lower bounds: a stale one costs a longer scan, never a missed row. Each relay keeps
//! its own; replicas need not agree.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// How far below the newest `sent_at` it deleted the next retention pass starts: a
/// settlement's `sent_at` is its transaction's start, and the relay's settlements end within
/// `--db-timeout` (a statement and its transaction are bounded by it), far less than this.
pub const SENT_MARGIN: Duration = Duration::from_secs(600);

/// One retention pass in this many starts from the first sent row.
pub const FULL_RETENTION_PASS: u64 = 10;

/// One table's floors, shared by a relay's connections to it.
#[derive(Debug, Default)]
pub struct Floors {
    /// No unsent row below this id, but rows that committed since the last sweep.
    rows: AtomicI64,
    /// No live claim below this token.
    claims: AtomicI64,
    /// The highest id this relay has claimed: a statistics pass that finds no unsent row at or
    /// above the floor raises it past this (every row up to it was seen settled).
    claimed: AtomicI64,
    /// When the server the last claim ran on started (microseconds since the epoch; 0 before
    /// the first claim).
    server_started: AtomicI64,
    /// The newest `sent_at` a retention pass deleted.
    sent: Mutex<Option<SystemTime>>,
    /// Retention passes started.
    retention_passes: AtomicU64,
}

/// What a claim or a statistics pass read before its statement ran; the floor moves only from
/// there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    pub rows: i64,
    pub claimed: i64,
}

impl Floors {
    /// Where claims, the idle look and the statistics start in the outbox.
    pub fn rows(&self) -> i64 {
        self.rows.load(Ordering::Relaxed)
    }

    /// Where claims and the idle look start in the lease table.
    pub fn claims(&self) -> i64 {
        self.claims.load(Ordering::Relaxed)
    }

    /// What a claim or a statistics pass starts from; read before its statement.
    pub fn reading(&self) -> Reading {
        Reading {
            claimed: self.claimed.load(Ordering::Relaxed),
            rows: self.rows(),
        }
    }

    /// A claim ran on a server that started at `started` (microseconds since the epoch):
    /// whether it is another start than the last claim's. Then the server may have lost the
    /// relay's last transactions (see the module's docs), and the floors go back to the start:
    /// the claim that found it reports neither (it read from the old ones), the next one reads
    /// both tables whole once and raises them again.
    pub fn server_started(&self, started: i64) -> bool {
        let before = self.server_started.swap(started, Ordering::Relaxed);
        let restarted = before != 0 && before != started;
        if restarted {
            self.claims.store(0, Ordering::Relaxed);
            self.rows.store(0, Ordering::Relaxed);
        }
        restarted
    }

    /// When the server the last claim ran on started, if a claim ran.
    pub fn server(&self) -> Option<i64> {
        Some(self.server_started.load(Ordering::Relaxed)).filter(|s| *s != 0)
    }

    /// A claim took rows up to `highest_id` and saw no live claim below `live_from`.
    pub fn claimed(&self, highest_id: Option<i64>, live_from: Option<i64>) {
        if let Some(id) = highest_id {
            self.claimed.fetch_max(id, Ordering::Relaxed);
        }
        if let Some(token) = live_from {
            self.claims.fetch_max(token, Ordering::Relaxed);
        }
    }

    /// A claim or a statistics pass that started from `read` found `lowest` to be the lowest
    /// unsent id at or above the floor. A sweep that lowered the floor meanwhile wins: the
    /// answer is about rows above where the sweep found one.
    pub fn raise(&self, read: Reading, lowest: Option<i64>) {
        let next = raised(read, lowest);
        if next > read.rows {
            let _ =
                self.rows
                    .compare_exchange(read.rows, next, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// A sweep found `found`, the lowest unsent id below the floor it was given (a row that
    /// committed late), or the relay made rows unsent again (unparked): the floor goes down to
    /// it.
    pub fn lower(&self, found: Option<i64>) {
        if let Some(id) = found {
            self.rows.fetch_min(id, Ordering::Relaxed);
        }
    }
}

impl Floors {
    /// Where a retention pass starts in the sent rows (`None`: from the first), and counts it.
    pub fn retention_start(&self) -> Option<SystemTime> {
        let pass = self.retention_passes.fetch_add(1, Ordering::Relaxed);
        let sent = *self.sent.lock().expect("sent floor");
        retention_start(pass, sent)
    }

    /// A retention batch deleted rows sent up to `newest`.
    pub fn retention_deleted(&self, newest: Option<SystemTime>) {
        let mut sent = self.sent.lock().expect("sent floor");
        *sent = (*sent).max(newest);
    }
}

/// Where retention pass number `pass` starts, given the newest `sent_at` deleted so far.
pub fn retention_start(pass: u64, sent: Option<SystemTime>) -> Option<SystemTime> {
    if pass % FULL_RETENTION_PASS == 0 {
        return None;
    }
    sent.and_then(|t| t.checked_sub(SENT_MARGIN))
}

/// The rows' floor after a statistics pass from `read` that found `lowest`: that row, or with
/// no unsent row at or above the floor, past every row this relay had claimed before the pass
/// (each was seen settled by it). Never lower than it was.
pub fn raised(read: Reading, lowest: Option<i64>) -> i64 {
    match lowest {
        Some(id) => id.max(read.rows),
        None => read.rows.max(read.claimed.saturating_add(1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_server_start_sends_both_floors_back_to_the_start() {
        let floors = Floors::default();
        assert!(
            !floors.server_started(1_000),
            "the first claim knows no start before it"
        );
        floors.claimed(Some(40), Some(7));
        floors.raise(floors.reading(), Some(30));
        assert_eq!((floors.rows(), floors.claims()), (30, 7));
        assert!(
            !floors.server_started(1_000),
            "the same start: nothing lost"
        );
        assert_eq!((floors.rows(), floors.claims()), (30, 7));
        assert!(floors.server_started(2_000));
        assert_eq!((floors.rows(), floors.claims()), (0, 0));
        assert!(!floors.server_started(2_000));
    }

    #[test]
    fn the_floor_rises_to_the_lowest_unsent_row_and_never_falls_by_statistics() {
        let read = Reading {
            rows: 10,
            claimed: 50,
        };
        assert_eq!(raised(read, Some(42)), 42);
        assert_eq!(
            raised(read, Some(3)),
            10,
            "statistics never lower the floor"
        );
        assert_eq!(raised(read, None), 51, "past every row claimed");
        let idle = Reading {
            rows: 80,
            claimed: 50,
        };
        assert_eq!(raised(idle, None), 80);
    }

    #[test]
    fn a_sweep_that_found_a_late_row_wins_over_a_pass_that_read_the_floor_before_it() {
        let f = Floors::default();
        f.raise(f.reading(), Some(100));
        assert_eq!(f.rows(), 100);
        let read = f.reading();
        f.lower(Some(7));
        f.raise(read, Some(120));
        assert_eq!(f.rows(), 7, "the late row stays reachable");
        f.raise(f.reading(), Some(7));
        assert_eq!(f.rows(), 7);
        f.lower(None);
        assert_eq!(f.rows(), 7);
    }

    #[test]
    fn retention_starts_a_margin_below_what_it_deleted_and_from_the_first_row_every_tenth_pass() {
        let f = Floors::default();
        assert_eq!(
            f.retention_start(),
            None,
            "the first pass: from the first row"
        );
        assert_eq!(f.retention_start(), None, "nothing deleted yet");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(100_000);
        f.retention_deleted(Some(t));
        f.retention_deleted(Some(t - Duration::from_secs(5)));
        f.retention_deleted(None);
        for _ in 2..FULL_RETENTION_PASS {
            assert_eq!(f.retention_start(), Some(t - SENT_MARGIN));
        }
        assert_eq!(f.retention_start(), None, "every tenth pass");
        assert_eq!(f.retention_start(), Some(t - SENT_MARGIN));
    }

    #[test]
    fn claims_raise_their_floors_only() {
        let f = Floors::default();
        f.claimed(Some(30), Some(5));
        f.claimed(Some(20), Some(3));
        assert_eq!(f.claims(), 5);
        assert_eq!(f.reading().claimed, 30);
        f.claimed(None, None);
        assert_eq!(f.claims(), 5);
    }
}
