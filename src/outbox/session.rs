//! One connection with the relay's prepared statements: claims, settlements, statistics.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_postgres::{Client, Statement};

use super::claim::ordered_window;
use super::{query_err, Outbox, OutboxError};
use crate::row::{ClaimedRow, Settled, Settlement};

/// Gauges read from the table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub oldest_unsent_age_seconds: f64,
    pub unsent: i64,
    pub quarantined: i64,
    /// Quarantined rows parked behind a quarantined row of their group (ordered delivery).
    pub blocked: i64,
    /// The smallest unsent id (0 when none): no claim needs to look below it.
    pub claim_floor: i64,
}

impl Outbox {
    /// A working connection with the relay's statements prepared.
    pub async fn connect(&self) -> Result<Session, OutboxError> {
        let client = self.raw_connect().await?;
        // A claim prepared while the table is small gets a generic plan that later scans and
        // sorts the whole table (measured: 880 ms per claim at 100k rows). Custom plans cost a
        // planning step per call and stay on the index.
        //
        // The relay's own commits (claims, settlements, retention) do not wait for their WAL
        // flush: waiting made each of them queue with the application's commits for the same
        // flushes, and made the relay's connection, not the database, its limit on durable
        // clusters (docs/benchmarks.md). Nothing the relay writes needs to survive a database
        // crash: a lost claim or settlement only means the row is sent again, with the same
        // event_id, which at-least-once delivery allows. The application's commits are
        // untouched.
        client
            .batch_execute("SET plan_cache_mode = force_custom_plan; SET synchronous_commit = off")
            .await
            .map_err(query_err("setting up the relay's session"))?;
        self.resolve_channel(&client).await?;
        self.check_key_indexes(&client).await?;
        let settle_sent = if self.delete_on_ack {
            &self.sql.delete_sent
        } else {
            &self.sql.mark_sent
        };
        let (claim, mark_sent, reschedule, quarantine, stats, probe, delete_expired, unpark_destination) = tokio::try_join!(
            client.prepare(&self.sql.claim),
            client.prepare(settle_sent),
            client.prepare(&self.sql.reschedule),
            client.prepare(&self.sql.quarantine),
            client.prepare(&self.sql.stats),
            client.prepare(&self.sql.probe),
            client.prepare(&self.sql.delete_expired),
            client.prepare(&self.sql.unpark_destination),
        )
        .map_err(query_err("preparing the relay's statements (is the table at the current schema version? run `outbox-relay migrate`)"))?;
        let park = match (&self.sql.park_blocked, &self.sql.unpark_blocked) {
            (Some(park), Some(unpark)) => Some((
                client
                    .prepare(park)
                    .await
                    .map_err(query_err("preparing park_blocked"))?,
                client
                    .prepare(unpark)
                    .await
                    .map_err(query_err("preparing unpark_blocked"))?,
            )),
            _ => None,
        };
        Ok(Session {
            client,
            statements: Statements {
                claim,
                mark_sent,
                reschedule,
                quarantine,
                stats,
                probe,
                delete_expired,
                unpark_destination,
                park,
            },
            delete_on_ack: self.delete_on_ack,
            ordered: self.mode.ordered.is_some(),
            fair: self.mode.fair.is_some(),
        })
    }
}

#[derive(Debug)]
struct Statements {
    claim: Statement,
    /// mark_sent.sql, or delete_sent.sql with --delete-on-ack.
    mark_sent: Statement,
    reschedule: Statement,
    quarantine: Statement,
    stats: Statement,
    probe: Statement,
    delete_expired: Statement,
    unpark_destination: Statement,
    /// park_blocked and unpark_blocked, with ordered delivery and poison blocking.
    park: Option<(Statement, Statement)>,
}

/// One connection with the relay's prepared statements.
#[derive(Debug)]
pub struct Session {
    client: Client,
    statements: Statements,
    /// Which statement `mark_sent` is; their parameters differ.
    delete_on_ack: bool,
    /// The ordered claim also takes the floor and the window size; the fair one the floor.
    ordered: bool,
    fair: bool,
}

impl Session {
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// Claims up to `limit` rows for `owner` for `lease`, in `id` order. Commits before
    /// returning: nothing is sent while a row lock is held.
    pub async fn claim(
        &self,
        owner: &str,
        lease: Duration,
        limit: i64,
        floor: i64,
    ) -> Result<Vec<ClaimedRow>, OutboxError> {
        let lease = lease.as_secs_f64();
        let window = ordered_window(limit);
        let rows = match (self.ordered, self.fair) {
            (true, _) => {
                self.client
                    .query(
                        &self.statements.claim,
                        &[&limit, &owner, &lease, &floor, &window],
                    )
                    .await
            }
            (false, true) => {
                self.client
                    .query(&self.statements.claim, &[&limit, &owner, &lease, &floor])
                    .await
            }
            (false, false) => {
                self.client
                    .query(&self.statements.claim, &[&limit, &owner, &lease])
                    .await
            }
        }
        .map_err(query_err("claiming rows"))?;
        let mut claimed: Vec<ClaimedRow> = rows
            .iter()
            .map(|r| ClaimedRow {
                id: r.get(0),
                event_id: r.get(1),
                aggregate_type: r.get(2),
                aggregate_id: r.get(3),
                event_type: r.get(4),
                payload: r.get(5),
                headers: r.get(6),
                queue_url: r.get(7),
                lease_token: r.get(8),
                attempts: r.get(9),
                created_at_epoch: r.get(10),
                created_at: r.get(11),
            })
            .collect();
        // UPDATE ... RETURNING does not keep the CTE's order.
        claimed.sort_unstable_by_key(|r| r.id);
        Ok(claimed)
    }

    /// Applies a claim's outcomes, fenced by (id, owner, lease_token). The three statements
    /// are pipelined on the connection; each commits on its own, which is safe because each
    /// row appears in exactly one of them.
    pub async fn settle(&self, owner: &str, s: &Settlement) -> Result<Settled, OutboxError> {
        let sent = async {
            if s.sent.is_empty() {
                return Ok(0);
            }
            let ids: Vec<i64> = s.sent.iter().map(|r| r.id).collect();
            let tokens: Vec<i64> = s.sent.iter().map(|r| r.lease_token).collect();
            if self.delete_on_ack {
                return self
                    .client
                    .execute(&self.statements.mark_sent, &[&owner, &ids, &tokens])
                    .await
                    .map_err(query_err("deleting acknowledged rows"));
            }
            let message_ids: Vec<&str> = s.sent.iter().map(|r| r.message_id.as_str()).collect();
            self.client
                .execute(
                    &self.statements.mark_sent,
                    &[&owner, &ids, &tokens, &message_ids],
                )
                .await
                .map_err(query_err("marking rows sent"))
        };
        let rescheduled = async {
            if s.reschedule.is_empty() {
                return Ok(0);
            }
            let r = &s.reschedule;
            let ids: Vec<i64> = r.iter().map(|r| r.id).collect();
            let tokens: Vec<i64> = r.iter().map(|r| r.lease_token).collect();
            let delays: Vec<f64> = r.iter().map(|r| r.delay.as_secs_f64()).collect();
            let errors: Vec<Option<&str>> = r.iter().map(|r| r.error.as_deref()).collect();
            let refunds: Vec<i32> = r.iter().map(|r| i32::from(r.refund)).collect();
            self.client
                .execute(
                    &self.statements.reschedule,
                    &[&owner, &ids, &tokens, &delays, &errors, &refunds],
                )
                .await
                .map_err(query_err("rescheduling rows"))
        };
        let quarantined = async {
            if s.quarantine.is_empty() {
                return Ok(Vec::new());
            }
            let q = &s.quarantine;
            let ids: Vec<i64> = q.iter().map(|r| r.id).collect();
            let tokens: Vec<i64> = q.iter().map(|r| r.lease_token).collect();
            let reasons: Vec<&str> = q.iter().map(|r| r.reason.as_str()).collect();
            let errors: Vec<&str> = q.iter().map(|r| r.error.as_str()).collect();
            let delays: Vec<Option<f64>> = q
                .iter()
                .map(|r| r.retry_in.map(|d| d.as_secs_f64()))
                .collect();
            // Quarantines are rare; returning their ids tells which reasons really landed.
            let changed = self
                .client
                .query(
                    &self.statements.quarantine,
                    &[&owner, &ids, &tokens, &reasons, &errors, &delays],
                )
                .await
                .map_err(query_err("quarantining rows"))?;
            Ok(changed
                .iter()
                .filter_map(|r| {
                    let id: i64 = r.get(0);
                    q.iter().find(|x| x.id == id).map(|x| x.reason)
                })
                .collect())
        };
        let (sent, rescheduled, quarantined_reasons) =
            tokio::try_join!(sent, rescheduled, quarantined)?;
        let expected = (s.sent.len() + s.reschedule.len() + s.quarantine.len()) as u64;
        let applied = sent + rescheduled + quarantined_reasons.len() as u64;
        Ok(Settled {
            sent,
            rescheduled,
            quarantined_reasons,
            lost: expected - applied,
        })
    }

    /// Deletes up to `limit` sent rows older than `retention`; returns how many went.
    pub async fn delete_expired(
        &self,
        retention: Duration,
        limit: i64,
    ) -> Result<u64, OutboxError> {
        self.client
            .execute(
                &self.statements.delete_expired,
                &[&retention.as_secs_f64(), &limit],
            )
            .await
            .map_err(query_err("deleting sent rows past retention"))
    }

    /// Whether a claim now would find a row: a read-only look that takes no lock, for an
    /// idle relay to decide whether to claim.
    pub async fn probe(&self) -> Result<bool, OutboxError> {
        let row = self
            .client
            .query_one(&self.statements.probe, &[])
            .await
            .map_err(query_err("looking for claimable rows"))?;
        Ok(row.get(0))
    }

    /// Gauges for `/metrics`, from partial indexes only.
    pub async fn stats(&self) -> Result<Stats, OutboxError> {
        let row = self
            .client
            .query_one(&self.statements.stats, &[])
            .await
            .map_err(query_err("reading outbox statistics"))?;
        Ok(Stats {
            oldest_unsent_age_seconds: row.get(0),
            unsent: row.get(1),
            quarantined: row.get(2),
            blocked: row.get(3),
            claim_floor: row.get(4),
        })
    }

    /// Makes rows parked for their destination unsent again once their time has come;
    /// returns how many.
    pub async fn unpark_destinations(&self) -> Result<u64, OutboxError> {
        self.client
            .execute(&self.statements.unpark_destination, &[])
            .await
            .map_err(query_err("unparking rows whose destination is due a retry"))
    }

    /// Ordered delivery with poison blocking: parks rows behind quarantined heads and unparks
    /// those whose head was re-driven. Returns (parked, unparked); (0, 0) in other modes.
    pub async fn maintain_blocked_groups(&self) -> Result<(u64, u64), OutboxError> {
        let Some((park, unpark)) = &self.statements.park else {
            return Ok((0, 0));
        };
        let unparked = self
            .client
            .execute(unpark, &[])
            .await
            .map_err(query_err("unparking rows of re-driven groups"))?;
        let parked = self
            .client
            .execute(park, &[])
            .await
            .map_err(query_err("parking rows behind quarantined heads"))?;
        Ok((parked, unparked))
    }
}

/// A session that reconnects on demand after the connection is lost; shared by the claim loop,
/// the settling tasks and the statistics task.
#[derive(Debug)]
pub struct SharedSession {
    outbox: Arc<Outbox>,
    current: Mutex<Option<Arc<Session>>>,
}

impl SharedSession {
    pub fn new(outbox: Arc<Outbox>, first: Session) -> Self {
        SharedSession {
            outbox,
            current: Mutex::new(Some(Arc::new(first))),
        }
    }

    /// The live session, reconnecting once if the last one is closed. Callers that get an
    /// error back decide how long to wait before asking again.
    pub async fn get(&self) -> Result<Arc<Session>, OutboxError> {
        let mut current = self.current.lock().await;
        if let Some(session) = current.as_ref() {
            if !session.is_closed() {
                return Ok(Arc::clone(session));
            }
        }
        *current = None;
        let session = Arc::new(self.outbox.connect().await?);
        *current = Some(Arc::clone(&session));
        tracing::info!(target = %self.outbox.target(), "database connection established");
        Ok(session)
    }
}
