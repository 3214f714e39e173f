//! The look a relay serving several tables takes at all of them at once (sql/watch.sql): idle
//! tables cost one statement between them per look, not a probe each.

use std::sync::Arc;

use super::conn::Conn;
use super::error::{query_err, OutboxError};
use super::store::Outbox;
use super::template::{render, Value};
use crate::outbox::conn::Stmt;

/// What the look saw of one table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Look {
    /// A row is claimable now.
    pub claimable: bool,
    /// A full look (sql/watch.sql): the fields below are read; otherwise (sql/watch_fast.sql)
    /// only `claimable` is.
    pub full: bool,
    /// now − created_at of the oldest unsent row, rows parked in quarantine included; 0 when
    /// none.
    pub oldest_unsent_age_seconds: f64,
    /// Rows parked for their queue are due to be tried again.
    pub parked_due: bool,
    /// Sent rows are past retention.
    pub expired: bool,
}

impl Look {
    /// Whether the table needs a turn: rows to send, or maintenance only a turn does.
    pub fn needs_turn(&self) -> bool {
        self.claimable || self.parked_due || self.expired
    }
}

/// At most this many tables per statement: a statement of a hundred parts plans in about a
/// millisecond and is prepared once per connection, and one table that fails the statement
/// (dropped, locked, unreadable) costs its hundred a second look each, not the whole relay.
pub const PART_TABLES: usize = 100;

impl Outbox {
    /// This table's part of the look, as the `index`-th table: the full look or the fast one.
    /// Its floors are the `index`-th elements of the look's first two parameters.
    fn watch_part(&self, index: usize, full: bool) -> Result<String, OutboxError> {
        let element = |n: usize| format!("(${n}::bigint[])[{}]", index + 1);
        let (floor, claims_floor) = (element(1), element(2));
        let probe = super::statements::probe_sql_with(
            self.table(),
            self.strategy().order_by(),
            (&floor, &claims_floor),
        )?;
        let index = index.to_string();
        render(
            match full {
                true => include_str!("../../sql/watch.sql"),
                false => include_str!("../../sql/watch_fast.sql"),
            },
            &[
                ("index", Value::Sql(&index)),
                ("table", Value::Table(self.table())),
                ("probe", Value::Sql(&probe)),
                ("floor", Value::Sql(&floor)),
            ],
        )
        .map_err(OutboxError::Template)
    }
}

/// A look's statements over `tables`, prepared on one connection.
#[derive(Default)]
struct Parts {
    /// One statement per [`PART_TABLES`] tables.
    statements: Vec<(std::ops::Range<usize>, Stmt)>,
}

/// The look's statements over a set of tables, on a connection of its own.
pub struct Watch {
    tables: Vec<Arc<Outbox>>,
    /// Sent rows older than this many seconds are past retention; `None`: kept for ever.
    retention: Option<f64>,
    conn: Option<Conn>,
    /// The fast look's statements and the full look's, prepared on `conn` at first use.
    fast: Parts,
    full: Parts,
}

/// One table's answer: what the look saw, or why its part failed.
pub type Answer = Result<Look, OutboxError>;

impl Watch {
    pub fn new(tables: Vec<Arc<Outbox>>, retention: Option<f64>) -> Watch {
        Watch {
            tables,
            retention,
            conn: None,
            fast: Parts::default(),
            full: Parts::default(),
        }
    }

    /// Drops the connection (a look that got no answer): the next look opens a new one.
    pub fn reset(&mut self) {
        self.conn = None;
    }

    /// The tables looked at, in the order of [`Watch::look`]'s answers.
    pub fn tables(&self) -> &[Arc<Outbox>] {
        &self.tables
    }

    /// Looks at every table: the full look (every answer's fields) or the fast one
    /// (`claimable` only). `Err`: the connection failed (every table unknown); otherwise one
    /// answer per table, a table whose part failed (dropped, locked past the round-trip
    /// deadline, unreadable, an older schema) answering with its error alone.
    pub async fn look(&mut self, full: bool) -> Result<Vec<Answer>, OutboxError> {
        let Some(first) = self.tables.first().cloned() else {
            return Ok(Vec::new());
        };
        if self.conn.as_ref().is_none_or(Conn::is_closed) {
            self.fast = Parts::default();
            self.full = Parts::default();
            let conn = first.raw_connect().await?;
            // Planned once per connection: with the retention bound as a parameter the full
            // look was otherwise planned afresh now and then, a hundred tables at a time
            // (~100 ms each). Not the relay's other planner switches (`PLANS`): they made the
            // look's antijoin on the lease table a thousand times slower.
            if !conn.pooled() {
                conn.batch_execute("SET plan_cache_mode = force_generic_plan")
                    .await
                    .map_err(query_err("setting up the look's connection"))?;
            }
            self.conn = Some(conn);
        }
        let conn = self.conn.as_ref().expect("connected above");
        let retention = self.retention;
        // Each table's floors, read now (src/outbox/floors.rs).
        let floors: Vec<i64> = self.tables.iter().map(|t| t.floors().rows()).collect();
        let claims_floors: Vec<i64> = self.tables.iter().map(|t| t.floors().claims()).collect();
        let params: &[&(dyn tokio_postgres::types::ToSql + Sync)] = match full {
            true => &[&floors, &claims_floors, &retention],
            false => &[&floors, &claims_floors],
        };
        let parts = match full {
            true => &mut self.full,
            false => &mut self.fast,
        };
        if parts.statements.is_empty() {
            for start in (0..self.tables.len()).step_by(PART_TABLES) {
                let range = start..(start + PART_TABLES).min(self.tables.len());
                let Ok(sql) = sql(&self.tables, range.clone(), full) else {
                    continue;
                };
                match conn.statements(&[(&sql, false)]).await {
                    Ok(mut s) => parts.statements.push((range, s.remove(0))),
                    // A table in it failed the preparation: its tables are looked at one by
                    // one, below, each time.
                    Err(_) if !conn.is_closed() => {}
                    Err(e) => return Err(query_err("looking at the tables")(e)),
                }
            }
        }
        let read = |row: &tokio_postgres::Row| Look {
            claimable: row.get(1),
            full,
            oldest_unsent_age_seconds: row.get(2),
            parked_due: row.get(3),
            expired: row.get(4),
        };
        let mut answers: Vec<Option<Answer>> = (0..self.tables.len()).map(|_| None).collect();
        let mut failed = false;
        for (_, stmt) in &parts.statements {
            match conn.query(stmt, params).await {
                Ok(rows) => {
                    for row in rows {
                        let i: i32 = row.get(0);
                        answers[i as usize] = Some(Ok(read(&row)));
                    }
                }
                Err(e) if conn.is_closed() => return Err(query_err("looking at the tables")(e)),
                Err(_) => failed = true,
            }
        }
        if failed {
            // Prepared again next time: a table dropped since invalidates its statement.
            parts.statements.clear();
        }
        // Each table no statement answered, on its own: which of them failed, and why.
        for (i, answer) in answers.iter_mut().enumerate() {
            if answer.is_some() {
                continue;
            }
            let sql = sql(&self.tables, i..i + 1, full)?;
            *answer = Some(match conn.query(&sql, params).await {
                Ok(rows) => match rows.first() {
                    Some(row) => Ok(read(row)),
                    None => Err(OutboxError::Template("the look returned no row".into())),
                },
                Err(e) if conn.is_closed() => return Err(query_err("looking at the tables")(e)),
                Err(e) => Err(query_err("looking at the table")(e)),
            });
        }
        Ok(answers
            .into_iter()
            .map(|a| a.expect("every table answered"))
            .collect())
    }
}

/// The look's statement over `range` of `tables`: each table's part, the index being its place
/// in `tables`.
fn sql(
    tables: &[Arc<Outbox>],
    range: std::ops::Range<usize>,
    full: bool,
) -> Result<String, OutboxError> {
    let parts = range
        .map(|i| tables[i].watch_part(i, full))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(parts.join("\nUNION ALL\n"))
}
