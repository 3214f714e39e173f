//! Statistics and maintenance on a connection of their own, so that they never delay claims
//! and settlements: the table gauges, retention deletes, unparking. Opened on first use.
//!
//! Each statement runs in a transaction of its own with a `statement_timeout` set for that
//! transaction only (`set_config(…, true)`, which is `SET LOCAL`), so nothing stays behind on a
//! server connection that a transaction pooler hands to the application next; statements are
//! unnamed (`query_typed`), which a pooler cannot mix up between clients either. A client-side
//! deadline a little past the server's catches a connection that stopped answering: it is
//! dropped and the next pass opens another.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::Mutex;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use super::conn::{timeouts, Access, Conn};

use super::claim::OrderScope;
use super::error::hidden_by_row_security;
use super::error::{query_err, OutboxError};
use super::store::Outbox;

/// Gauges read from the table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    /// now − created_at of the oldest undelivered row, rows parked in quarantine included.
    pub oldest_unsent_age_seconds: f64,
    /// Undelivered rows: claimable or leased, and those parked in quarantine (`blocked`,
    /// `destination`), which are waiting rather than refused.
    pub unsent: i64,
    pub quarantined: i64,
    /// Quarantined rows parked behind a quarantined row of their group (ordered delivery).
    pub blocked: i64,
    /// The smallest unsent id at or above the rows' floor (0 when none): no claim needs to
    /// look below it (src/outbox/floors.rs).
    pub claim_floor: i64,
    /// Unsent rows counted from the floor on: `claim_floor` is one of them.
    pub counted_unsent: i64,
    /// now − quarantined_at of the row longest in quarantine, any reason; 0 when none.
    pub oldest_quarantined_age_seconds: f64,
    /// Some count was extrapolated past `maintenance::STATS_EXACT_UP_TO` rows rather than counted.
    pub estimated: bool,
    /// `--order-by transaction`: unsent rows (of the first counted) held back because an older
    /// transaction still runs, and now − created_at of the oldest of them; 0 otherwise.
    pub held_back: i64,
    pub oldest_held_back_age_seconds: f64,
}

/// Up to this many rows the gauges count exactly; past it they are extrapolated (see
/// [`extrapolate`]). Counting this many index entries takes a few milliseconds.
pub const STATS_EXACT_UP_TO: i64 = 10_000;

/// Rows parked for their destination made unsent again per statement.
pub const UNPARK_BATCH: i64 = 1_000;

/// How long past the server's `statement_timeout` the client waits before it gives the
/// connection up: the server's own cancellation normally answers first.
const CLIENT_GRACE: Duration = Duration::from_secs(2);

/// The maintenance transaction's settings besides its timeouts (`--maintenance-timeout`, for
/// statements, lock waits and an idle transaction: the parking pass holds the claims' lock),
/// for that transaction only, so that nothing stays on a server connection a pooler hands to
/// the application next. The relay's own writes here (retention deletes, unparking) need not
/// wait for their WAL flush: a lost one is done again next pass. Nor are they worth JIT
/// compiling (see session.rs).
const UPKEEP_SETTINGS: &str = "SET LOCAL synchronous_commit = off; SET LOCAL jit = off";

/// A count read from the lowest `bound` entries of an index over ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    pub rows: i64,
    /// Extrapolated past the bound rather than counted.
    pub estimated: bool,
}

/// How many entries an index over ids holds, from the `counted` lowest of them (at most
/// `bound`), which lie between ids `first` and `last`, and the highest id in the index,
/// `top`. Fewer than `bound` counted: that was all of them. Otherwise the rest, between `last`
/// and `top`, is taken to be as dense as the part counted: a backlog is mostly consecutive ids
/// (rows are claimed in id order), so the estimate is close to the truth, and it is as fresh
/// as the index, unlike the planner's statistics, which wait for the next ANALYZE.
pub fn extrapolate(counted: i64, bound: i64, first: i64, last: i64, top: i64) -> Count {
    if counted < bound || top <= last {
        return Count {
            rows: counted,
            estimated: false,
        };
    }
    let span = (last - first + 1).max(counted) as f64;
    let density = counted as f64 / span;
    Count {
        rows: counted + ((top - last) as f64 * density).round() as i64,
        estimated: true,
    }
}

/// `part` of the `counted` rows, scaled to an estimated `total`.
fn scale(part: i64, counted: i64, total: Count) -> i64 {
    if !total.estimated || counted == 0 {
        return part;
    }
    (part as f64 * total.rows as f64 / counted as f64).round() as i64
}

impl Stats {
    /// The lowest unsent id the statistics saw at or above the floor, if any.
    pub fn lowest_unsent(&self) -> Option<i64> {
        (self.counted_unsent > 0).then_some(self.claim_floor)
    }

    /// The gauges from a row of stats.sql run with `bound` ([`STATS_EXACT_UP_TO`]).
    pub(super) fn from_row(row: &Row, bound: i64) -> Stats {
        let unsent = extrapolate(row.get(1), bound, row.get(2), row.get(3), row.get(4));
        let counted_q: i64 = row.get(5);
        let quarantined = extrapolate(counted_q, bound, row.get(8), row.get(9), row.get(10));
        let parked = scale(row.get(7), counted_q, quarantined);
        Stats {
            oldest_unsent_age_seconds: row.get(0),
            unsent: unsent.rows + parked,
            quarantined: quarantined.rows,
            blocked: scale(row.get(6), counted_q, quarantined),
            claim_floor: row.get(2),
            counted_unsent: row.get(1),
            oldest_quarantined_age_seconds: row.get(11),
            estimated: unsent.estimated || quarantined.estimated,
            held_back: row.get(12),
            oldest_held_back_age_seconds: row.get(13),
        }
    }
}

impl OutboxError {
    /// The server cancelled the statement at its `statement_timeout` (SQLSTATE 57014).
    pub fn timed_out(&self) -> bool {
        matches!(self, OutboxError::Query { source, .. }
            if source.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED))
    }
}

/// What a sweep below the rows' floor found (sql/sweep.sql).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Swept {
    /// The lowest unsent row below the floor, which the floor was lowered to.
    pub found: Option<i64>,
    /// The time the server spent on the sweep, the round trip aside: what spaces the next one.
    pub took: Duration,
}

/// The statistics and maintenance connection, opened on first use and again after a failure.
#[derive(Debug)]
pub struct Maintenance {
    outbox: Arc<Outbox>,
    /// Every statement's `statement_timeout` (`--maintenance-timeout`).
    timeout: Duration,
    /// `None` until first used, and after a failure that may have left it unusable. Shared
    /// by every table of a relay that serves several ([`Maintenance::for_table`]).
    client: Arc<Mutex<Option<Conn>>>,
}

impl Maintenance {
    pub fn new(outbox: Arc<Outbox>, timeout: Duration) -> Self {
        Maintenance {
            outbox,
            timeout,
            client: Arc::new(Mutex::new(None)),
        }
    }

    /// Another table's maintenance on this one's connection: its statements are text, so one
    /// connection serves every table, one statement at a time.
    pub fn for_table(&self, outbox: Arc<Outbox>) -> Maintenance {
        Maintenance {
            outbox,
            timeout: self.timeout,
            client: Arc::clone(&self.client),
        }
    }

    /// Runs one statement in a transaction of its own under the timeout.
    async fn run(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        context: &'static str,
    ) -> Result<Vec<Row>, OutboxError> {
        self.run_locked(sql, params, context, false).await
    }

    /// [`Maintenance::run`]; with `after_claims`, once the claims before it are done and while no
    /// other claim runs (sql/claim_lock.sql): a statement that must see every lease.
    async fn run_locked(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        context: &'static str,
        after_claims: bool,
    ) -> Result<Vec<Row>, OutboxError> {
        let mut slot = self.client.lock().await;
        let work = async {
            if slot.as_ref().is_none_or(Conn::is_closed) {
                *slot = Some(self.outbox.raw_connect().await?);
            }
            let client = slot.as_ref().expect("connected above");
            // Claims write no outbox row a statement here could conflict with: it sees their
            // leases only through its snapshot, which must be taken after the claims' lock
            // below. The transaction states READ COMMITTED (each statement its own snapshot);
            // the REPEATABLE READ or SERIALIZABLE a database or role may default to would take
            // it at the first statement, before the lock, and miss a lease committed while it
            // waited.
            //
            // Its start, settings and lock leave in one message, with the statement and the
            // COMMIT behind it: a link that goes dark after a BEGIN of its own would leave the
            // server connection idle in a transaction that no timeout ends, for as long as TCP
            // takes to tell (hours); behind PgBouncer in transaction pooling that connection
            // is the pool's, and a pool of one was held from every relay and the application
            // (simulation seed 12172163297347410868).
            let mut begin = format!(
                "{}; {UPKEEP_SETTINGS}; {}",
                Access::Write.begin(),
                timeouts("SET LOCAL", Some(self.timeout))
            );
            if after_claims {
                begin = format!("{begin}; {}", self.outbox.statements().claim_lock);
            }
            let rows = client
                .query_typed_in_transaction(&begin, sql, params)
                .await
                .map_err(query_err(context))?;
            Ok::<_, OutboxError>(rows)
        };
        match tokio::time::timeout(self.timeout + CLIENT_GRACE, work).await {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(e)) => {
                // A cancelled statement leaves the connection fine; anything else may not.
                if !e.timed_out() {
                    *slot = None;
                }
                Err(e)
            }
            Err(_) => {
                *slot = None;
                Err(OutboxError::Connect {
                    target: self.outbox.connector().target(),
                    reason: format!(
                        "{context}: no answer within {} (--maintenance-timeout); the connection was dropped",
                        humantime::format_duration(self.timeout + CLIENT_GRACE)
                    ),
                })
            }
        }
    }

    /// The table gauges, exact up to [`STATS_EXACT_UP_TO`] rows and estimated past it.
    pub async fn stats(&self) -> Result<Stats, OutboxError> {
        let floors = self.outbox.floors();
        let read = floors.reading();
        let rows = self
            .run(
                &self.outbox.statements().stats,
                &[(&STATS_EXACT_UP_TO, Type::INT8), (&read.rows, Type::INT8)],
                "reading outbox statistics",
            )
            .await?;
        let row = rows.first().expect("stats.sql returns one row");
        let stats = Stats::from_row(row, STATS_EXACT_UP_TO);
        floors.raise(read, stats.lowest_unsent());
        Ok(stats)
    }

    /// Removes the claims of `owner` that it does not hold (`held`: the tokens of the claims
    /// whose rows it is delivering) after a claim it gave up on (sql/release_orphans.sql),
    /// once the claims before it are done; returns how many. The claim loop waits for it, so
    /// it gets `within` (a claim's round-trip deadline), the wait for this connection
    /// included: a connection that does not answer in that time is dropped, as a claim's is.
    pub async fn release_orphans(
        &self,
        owner: &str,
        held: &[i64],
        within: Duration,
    ) -> Result<u64, OutboxError> {
        const WHAT: &str = "releasing the claims the relay gave up on";
        let floor = self.outbox.floors().claims();
        let held = held.to_vec();
        let params: [(&(dyn ToSql + Sync), Type); 3] = [
            (&owner, Type::TEXT),
            (&held, Type::INT8_ARRAY),
            (&floor, Type::INT8),
        ];
        let work = self.run_locked(
            &self.outbox.statements().release_orphans,
            &params,
            WHAT,
            true,
        );
        match tokio::time::timeout(within, work).await {
            Ok(rows) => Ok(rows?.len() as u64),
            Err(_) => {
                // Cut off while it ran: the connection may have gone dark. Not while another
                // statement holds it (then it is that statement's to judge).
                if let Ok(mut slot) = self.client.try_lock() {
                    *slot = None;
                }
                Err(OutboxError::Unanswered {
                    what: WHAT,
                    after: within,
                })
            }
        }
    }

    /// Row-level security that applies to the relay's role without a policy that lets it see
    /// and settle every row (sql/row_security.sql, as checked at every new connection): the
    /// refusal, if the table turned it on since. Asked every statistics pass, whose counts
    /// would otherwise leave out the rows the policies hide.
    pub async fn row_security(&self) -> Result<Option<OutboxError>, OutboxError> {
        let table = self.outbox.base_or_table().quoted();
        let rows = self
            .run(
                include_str!("../../sql/row_security.sql"),
                &[(&table, Type::TEXT)],
                "reading the table's row-level security",
            )
            .await?;
        Ok(rows
            .first()
            .and_then(|row| hidden_by_row_security(row, table)))
    }

    /// The floors' safety net (sql/sweep.sql): lowers the rows' floor to an unsent row below
    /// it, one that committed after the floor passed it. Returns that row's id, and the time
    /// the server spent looking.
    pub async fn sweep(&self) -> Result<Swept, OutboxError> {
        let floors = self.outbox.floors();
        let floor = floors.rows();
        // Ids start at 1: below a floor of 1 there is nothing to find.
        if floor <= 1 {
            return Ok(Swept::default());
        }
        let rows = self
            .run(
                &self.outbox.statements().sweep,
                &[(&floor, Type::INT8)],
                "looking for rows below the claims' floor",
            )
            .await?;
        let found: Option<i64> = rows.first().and_then(|r| r.get(0));
        let took: f64 = rows.first().map_or(0.0, |r| r.get(1));
        floors.lower(found);
        Ok(Swept {
            found,
            took: Duration::try_from_secs_f64(took).unwrap_or_default(),
        })
    }

    /// Deletes up to `limit` sent rows older than `retention`, from `sent_at` `from` on
    /// (`None`: from the first); returns how many went and the newest `sent_at` among them.
    pub async fn delete_expired(
        &self,
        retention: Duration,
        limit: i64,
        from: Option<SystemTime>,
    ) -> Result<(u64, Option<SystemTime>), OutboxError> {
        let rows = self
            .run(
                &self.outbox.statements().delete_expired,
                &[
                    (&retention.as_secs_f64(), Type::FLOAT8),
                    (&limit, Type::INT8),
                    (&from, Type::TIMESTAMPTZ),
                ],
                "deleting sent rows past retention",
            )
            .await?;
        let newest = rows.iter().map(|r| r.get::<_, SystemTime>(1)).max();
        self.outbox.floors().retention_deleted(newest);
        Ok((rows.len() as u64, newest))
    }

    /// Makes rows parked for their destination unsent again once their time has come, in
    /// batches of [`UNPARK_BATCH`]; returns how many.
    pub async fn unpark_destinations(&self) -> Result<u64, OutboxError> {
        let mut total = 0;
        loop {
            let rows = self
                .run(
                    &self.outbox.statements().unpark_destination,
                    &[(&UNPARK_BATCH, Type::INT8)],
                    "unparking rows whose destination is due a retry",
                )
                .await?;
            self.unsent_again(&rows);
            let n = rows.len() as u64;
            total += n;
            if n < UNPARK_BATCH as u64 {
                return Ok(total);
            }
        }
    }

    /// Rows made unsent again keep their ids, which may be below the rows' floor: it goes down
    /// to them now rather than at the next sweep.
    fn unsent_again(&self, rows: &[Row]) {
        let lowest = rows.iter().map(|r| r.get::<_, i64>(0)).min();
        self.outbox.floors().lower(lowest);
    }

    /// Ordered delivery with poison blocking: parks rows behind quarantined heads and unparks
    /// those whose head was re-driven. Nothing in other modes.
    pub async fn maintain_blocked_groups(&self) -> Result<BlockedGroups, OutboxError> {
        let (Some(park), Some(unpark)) = (
            &self.outbox.statements().park_blocked,
            &self.outbox.statements().unpark_blocked,
        ) else {
            return Ok(BlockedGroups::default());
        };
        let rows = self
            .run(unpark, &[], "unparking rows of re-driven groups")
            .await?;
        self.unsent_again(&rows);
        let unparked = rows.len() as u64;
        // Parking applies to ordered rows only: with a standard default queue, those bound for a
        // FIFO queue (the FIFO routes' keys are the statement's one parameter).
        let routes = match self.outbox.strategy().ordered().map(|o| &o.scope) {
            Some(OrderScope::FifoDestinations { fifo_routes, .. }) => Some(fifo_routes),
            _ => None,
        };
        // It leaves leased rows alone: it must see every claim's.
        let context = "parking rows behind quarantined heads";
        let rows = match routes {
            Some(routes) => {
                let params = [(routes as &(dyn ToSql + Sync), Type::TEXT_ARRAY)];
                self.run_locked(park, &params, context, true).await
            }
            None => self.run_locked(park, &[], context, true).await,
        }?;
        let (parked, not_parked) = match rows.first() {
            Some(row) => (
                row.try_get::<_, i64>("parked")
                    .map_err(query_err(context))? as u64,
                row.try_get("not_parked").map_err(query_err(context))?,
            ),
            None => (0, Vec::new()),
        };
        Ok(BlockedGroups {
            parked,
            unparked,
            not_parked,
        })
    }
}

/// What a pass over blocked groups did (sql/park_blocked.sql, sql/unpark_blocked.sql).
#[derive(Debug, Default, PartialEq)]
pub struct BlockedGroups {
    /// Rows it parked behind a quarantined head.
    pub parked: u64,
    /// Parked rows it made unsent again: their head was re-driven.
    pub unparked: u64,
    /// Rows it meant to park and did not: the caller looks whether they are still unsent and
    /// unparked, which only something on the table that undoes the relay's updates explains.
    pub not_parked: Vec<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_below_the_bound_are_exact() {
        assert_eq!(
            extrapolate(0, 100, 0, 0, 0),
            Count {
                rows: 0,
                estimated: false
            }
        );
        assert_eq!(
            extrapolate(99, 100, 5, 400, 400),
            Count {
                rows: 99,
                estimated: false
            }
        );
        // Exactly the bound, and nothing above it: all of them were counted.
        assert!(!extrapolate(100, 100, 1, 100, 100).estimated);
    }

    #[test]
    fn past_the_bound_the_rest_is_as_dense_as_the_counted_part() {
        // Consecutive ids 1..=1,000,000, the lowest 100 counted.
        assert_eq!(
            extrapolate(100, 100, 1, 100, 1_000_000),
            Count {
                rows: 1_000_000,
                estimated: true
            }
        );
        // Every other id is unsent (the others were sent, or rolled back): 1,000 odd ids up
        // to 2,000, the lowest 100 counted, the rest within 1 %.
        let every_other = extrapolate(100, 100, 1, 199, 2_000);
        assert!(every_other.estimated);
        assert!((every_other.rows - 1_000).abs() <= 10, "{every_other:?}");
    }

    #[test]
    fn parts_scale_with_an_estimated_total() {
        let total = Count {
            rows: 1_000,
            estimated: true,
        };
        assert_eq!(scale(10, 100, total), 100);
        let exact = Count {
            rows: 100,
            estimated: false,
        };
        assert_eq!(scale(10, 100, exact), 10);
        assert_eq!(scale(0, 0, total), 0);
    }
}
