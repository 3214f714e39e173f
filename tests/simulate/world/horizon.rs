//! Issue 36 in the simulation: horizons held for part of the run, and writers whose rows
//! commit late with low ids. Each ends before the writers are done, so the fleet's settling
//! starts with nothing held and nothing pending: a row still unsent then was missed.

use super::*;
use crate::plan::{Held, Hold, Late, LateWriter, RowSpec};

/// Installed beside the trigger log: the table the horizon's writing transactions write to,
/// unrelated to the outbox.
pub(super) const SETUP_SQL: &str = "CREATE TABLE sim.scratch (n bigint NOT NULL, \
     at timestamptz NOT NULL DEFAULT clock_timestamp())";

/// Given before anything is written when a late writer caches ids: every session then takes
/// 50 ids at a time, the late writer's session its block at its first insert.
pub(super) const CACHE_SQL: &str = "ALTER TABLE public.outbox ALTER COLUMN id SET CACHE 50";

/// How long the end of a prepared transaction is tried (a database restart may be under way).
const FINISH_WITHIN: Duration = Duration::from_secs(60);

/// The global id of prepared transaction `n` of this seed's database (gids are cluster-wide).
pub(super) fn gid(db: &str, kind: &str, n: usize) -> String {
    format!("{db}-{kind}-{n}")
}

async fn insert_rows(
    tx: &impl tokio_postgres::GenericClient,
    rows: &[RowSpec],
) -> Result<(), tokio_postgres::Error> {
    for row in rows {
        let (payload, headers) = workload::row_values(&row.event_id, row.poison);
        tx.execute(
            "INSERT INTO public.outbox (event_id, aggregate_type, aggregate_id, event_type, \
             payload, headers) VALUES ($1, $2, $3, 'sim.event', $4::text::jsonb, $5::text::jsonb)",
            &[
                &row.event_id,
                &row.aggregate_type,
                &row.aggregate_id,
                &payload,
                &headers,
            ],
        )
        .await?;
    }
    Ok(())
}

/// Holds the horizon from `held.at_ms` for `held.ms`. A snapshot or an idle writer whose
/// session a database restart ended is taken again on a new one until the time is up.
pub(super) async fn hold(held: Held, start: Instant, url: &str, gid: String) {
    let from = start + Duration::from_millis(held.at_ms);
    let until = from + Duration::from_millis(held.ms);
    tokio::time::sleep_until(from.into()).await;
    if let Hold::Prepared { commit } = held.what {
        if let Some(c) = own_session_retrying(url, until).await {
            let _ = c
                .batch_execute(&format!(
                    "BEGIN; INSERT INTO sim.scratch (n) VALUES (1); PREPARE TRANSACTION '{gid}'"
                ))
                .await;
        }
        tokio::time::sleep_until(until.into()).await;
        finish_prepared(url, &gid, commit).await;
        return;
    }
    let begin = match held.what {
        Hold::Snapshot => "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class",
        _ => "BEGIN; INSERT INTO sim.scratch (n) VALUES (1)",
    };
    while Instant::now() < until {
        let Some(c) = own_session_retrying(url, until).await else {
            return;
        };
        if c.batch_execute(begin).await.is_err() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        while Instant::now() < until && !c.is_closed() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The idle writer's write is undone: what it wrote never mattered, its xid did.
        let _ = c.batch_execute("ROLLBACK").await;
    }
}

/// Commits or rolls back prepared transaction `gid`, from any session, if it exists (a
/// `PREPARE` that a restart cut may not have happened). None is ever left behind: a database
/// with one cannot be dropped, and it would hold the horizon of the next seeds.
pub(super) async fn finish_prepared(url: &str, gid: &str, commit: bool) {
    let deadline = Instant::now() + FINISH_WITHIN;
    let end = if commit { "COMMIT" } else { "ROLLBACK" };
    while Instant::now() < deadline {
        if let Some(c) = own_session(url).await {
            match c
                .query_one(
                    "SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1",
                    &[&gid],
                )
                .await
            {
                Ok(r) if r.get::<_, i64>(0) == 0 => return,
                Ok(_) => {
                    if c.batch_execute(&format!("{end} PREPARED '{gid}'"))
                        .await
                        .is_ok()
                    {
                        return;
                    }
                }
                Err(_) => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("  prepared transaction {gid} could not be ended in {FINISH_WITHIN:?}");
}

/// Rolls back every prepared transaction left in database `db`, saying so: a simulation
/// that left one has a bug of its own, and the database could not be dropped.
pub(super) async fn roll_back_left_behind(admin: &Client, db: &str) {
    let Ok(rows) = admin
        .query(
            "SELECT gid FROM pg_prepared_xacts WHERE database = $1",
            &[&db],
        )
        .await
    else {
        return;
    };
    for r in rows {
        let gid: String = r.get(0);
        println!("  prepared transaction {gid} was left behind: rolled back");
        let _ = admin
            .batch_execute(&format!("ROLLBACK PREPARED '{gid}'"))
            .await;
    }
}

/// A cached-ids writer's session, opened before anything else is written and given its
/// first insert there: the block of ids it took then lies below every row written since, as
/// with a session of an application's pool that took its block an hour ago.
pub(super) async fn prime(w: &LateWriter, url: &str) -> Option<Client> {
    let Late::Cached { inserts } = &w.what else {
        return None;
    };
    let mut c = own_session(url).await?;
    let tx = c.transaction().await.ok()?;
    insert_rows(&tx, inserts.first()?).await.ok()?;
    tx.commit().await.ok()?;
    Some(c)
}

/// Writes a late writer's rows as its plan says (a cached-ids writer the inserts after its
/// first, on the session [`prime`] gave it). A transaction a database restart cut
/// commits nothing (the trigger log says which rows exist).
pub(super) async fn write_late(
    w: LateWriter,
    start: Instant,
    url: &str,
    gid: String,
    primed: Option<Client>,
) {
    let from = start + Duration::from_millis(w.at_ms);
    let until = from + Duration::from_millis(w.ms);
    tokio::time::sleep_until(from.into()).await;
    match &w.what {
        Late::Long { rows, commit } => {
            let Some(mut c) = own_session_retrying(url, until).await else {
                return;
            };
            let attempt = async {
                let tx = c.transaction().await?;
                insert_rows(&tx, rows).await?;
                tokio::time::sleep_until(until.into()).await;
                if *commit {
                    tx.commit().await
                } else {
                    tx.rollback().await
                }
            };
            let _ = attempt.await;
        }
        Late::Savepoint { rows, discarded } => {
            let Some(mut c) = own_session_retrying(url, until).await else {
                return;
            };
            let attempt = async {
                let mut tx = c.transaction().await?;
                let kept = tx.savepoint("kept").await?;
                insert_rows(&kept, rows).await?;
                kept.commit().await?;
                if !discarded.is_empty() {
                    let void = tx.savepoint("void").await?;
                    insert_rows(&void, discarded).await?;
                    void.rollback().await?;
                }
                tokio::time::sleep_until(until.into()).await;
                tx.commit().await
            };
            let _ = attempt.await;
        }
        Late::Prepared { rows, commit } => {
            if let Some(c) = own_session_retrying(url, until).await {
                // Not a `Transaction`: once prepared, the session's transaction is over, and
                // one dropped would roll back nothing.
                let attempt = async {
                    c.batch_execute("BEGIN").await?;
                    insert_rows(&c, rows).await?;
                    c.batch_execute(&format!("PREPARE TRANSACTION '{gid}'"))
                        .await
                };
                let _ = attempt.await;
            }
            tokio::time::sleep_until(until.into()).await;
            finish_prepared(url, &gid, *commit).await;
        }
        Late::Cached { inserts } => {
            let pace = Duration::from_millis(w.ms) / inserts.len().max(1) as u32;
            let mut client = primed;
            for (k, rows) in inserts.iter().enumerate().skip(1) {
                tokio::time::sleep_until((from + pace * k as u32).into()).await;
                if client.as_ref().is_none_or(Client::is_closed) {
                    client = own_session_retrying(url, until).await;
                }
                let Some(c) = client.as_mut() else { return };
                let attempt = async {
                    let tx = c.transaction().await?;
                    insert_rows(&tx, rows).await?;
                    tx.commit().await
                };
                if attempt.await.is_err() {
                    client = None;
                }
            }
        }
    }
}
