//! The matrix's group cells: a group is (destination, group key) in the claim, the planner and
//! the parking alike, on both table kinds, with two relays. Three scenarios, each once broken
//! because one of those places defined a group apart: an unreadable row mid-group (it must
//! hold the rows behind it), the same key on two destinations (one's quarantine must not hold
//! the other), fair claiming on a FIFO queue whose backlog spans many groups (a quiet tenant's
//! event must ride in the first claims).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use super::{chosen, error_lines, panic_text, Table, PARALLEL};
use crate::scenario::{args, attr, migrate_with, run_args, set_arg};
use crate::support::{
    create_queue, fresh_db, receive_all, sqs, RelayProcess, TestDb, DEBEZIUM_COLUMNS,
    DEBEZIUM_OUTBOX_DDL,
};

/// Rows per claim in the fair cell, and the backlog it spans.
const BATCH: i64 = 100;
const BACKLOG: i32 = 10_000;
const BACKLOG_GROUPS: i32 = 2_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    UnreadableMidGroup,
    SameKeyTwoDestinations,
    FairFifoManyGroups,
}

#[derive(Clone, Copy, Debug)]
struct GroupCell {
    scenario: Scenario,
    table: Table,
}

impl fmt::Display for GroupCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scenario = match self.scenario {
            Scenario::UnreadableMidGroup => "unreadable-mid-group",
            Scenario::SameKeyTwoDestinations => "same-key-two-destinations",
            Scenario::FairFifoManyGroups => "fair-fifo-many-groups",
        };
        let table = match self.table {
            Table::Native => "native",
            Table::Adopted => "adopted",
        };
        write!(f, "groups/{scenario}/{table}")
    }
}

/// What is wrong with a row, as each table can hold it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Row {
    Good,
    /// Cannot be read: headers that are not an object (native), a NULL payload (adopted).
    Unreadable,
    /// Refused before sending: a header name SQS reserves (native), over 1 MiB (adopted).
    Refused,
}

/// Event `n`'s id, valid as Debezium's uuid too.
fn event_id(n: u32) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

impl GroupCell {
    fn base_table(&self) -> &'static str {
        match self.table {
            Table::Native => "outbox",
            Table::Adopted => "outboxevent",
        }
    }

    async fn database(&self, fair: &[&str]) -> TestDb {
        let db = fresh_db().await;
        match self.table {
            Table::Native => migrate_with(&db, fair).await,
            Table::Adopted => {
                db.client()
                    .await
                    .batch_execute(DEBEZIUM_OUTBOX_DDL)
                    .await
                    .unwrap();
                crate::adopt::adopt(&db, fair).await;
            }
        }
        db
    }

    /// Writes `rows` (event number, aggregate type, aggregate id, what is wrong) in one
    /// transaction, in order.
    async fn write(&self, client: &tokio_postgres::Client, rows: &[(u32, &str, &str, Row)]) {
        let values: Vec<String> = rows
            .iter()
            .map(|&(n, aggregate_type, aggregate_id, row)| {
                let payload = match (row, self.table) {
                    (Row::Unreadable, Table::Adopted) => "NULL".to_string(),
                    (Row::Refused, Table::Adopted) => {
                        "jsonb_build_object('blob', repeat('x', 1100000))".to_string()
                    }
                    _ => format!("jsonb_build_object('n', {n})"),
                };
                let headers = match row {
                    Row::Unreadable => "'[1]'",
                    Row::Refused => "'{\"AWS.trace\": \"x\"}'",
                    Row::Good => "'{}'",
                };
                match self.table {
                    Table::Native => format!(
                        "('{}', '{aggregate_type}', '{aggregate_id}', 'e', {payload}, {headers})",
                        event_id(n)
                    ),
                    Table::Adopted => format!(
                        "('{}', '{aggregate_type}', '{aggregate_id}', 'e', {payload})",
                        event_id(n)
                    ),
                }
            })
            .collect();
        let columns = match self.table {
            Table::Native => {
                "outbox (event_id, aggregate_type, aggregate_id, event_type, payload, headers)"
            }
            Table::Adopted => "outboxevent (id, aggregatetype, aggregateid, type, payload)",
        };
        client
            .batch_execute(&format!(
                "INSERT INTO {columns} VALUES {}",
                values.join(", ")
            ))
            .await
            .unwrap();
    }

    /// A backlog of `import` events spread over many groups.
    async fn write_backlog(&self, client: &tokio_postgres::Client) {
        let sql = match self.table {
            Table::Native => {
                "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload)
                 SELECT 'bulk-' || g, 'import', (g % $2::int)::text, 'e', jsonb_build_object('n', g)
                 FROM generate_series(1, $1::int) g"
            }
            Table::Adopted => {
                "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload)
                 SELECT gen_random_uuid(), 'import', (g % $2::int)::text, 'e', jsonb_build_object('n', g)
                 FROM generate_series(1, $1::int) g"
            }
        };
        client
            .execute(sql, &[&BACKLOG, &BACKLOG_GROUPS])
            .await
            .unwrap();
    }

    /// `(sent, quarantine_reason)` of event `n` once it is either.
    async fn settled(&self, client: &tokio_postgres::Client, n: u32) -> (bool, Option<String>) {
        let column = match self.table {
            Table::Native => "event_id",
            Table::Adopted => "id::text",
        };
        let sql = format!(
            "SELECT sent_at IS NOT NULL, quarantine_reason FROM {} WHERE {column} = $1",
            self.base_table()
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let row = client.query_one(&sql, &[&event_id(n)]).await.unwrap();
            let state: (bool, Option<String>) = (row.get(0), row.get(1));
            if state.0 || state.1.is_some() {
                return state;
            }
            assert!(
                Instant::now() < deadline,
                "{self}: event {n} neither sent nor quarantined within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Two relays on `queue` with `extra` flags.
    fn spawn(
        &self,
        db: &TestDb,
        queue: &str,
        extra: &[&str],
        relays: &Mutex<Vec<Arc<RelayProcess>>>,
    ) -> Vec<Arc<RelayProcess>> {
        (0..2)
            .map(|i| {
                let id = format!("{}-{i}", self.to_string().replace('/', "-"));
                // No relay is killed here: the default lease and send timeout, which a slow
                // SQS emulator on a busy machine needs.
                let mut a = run_args(db, queue, sqs().endpoint(), &["--relay-id", &id]);
                set_arg(&mut a, "--poll-interval", "20ms");
                a.extend(args(extra));
                if self.table == Table::Adopted {
                    a.extend(args(&["--table", "outboxevent"]));
                    a.extend(args(&DEBEZIUM_COLUMNS));
                }
                let relay = Arc::new(RelayProcess::spawn_named(&id, &a, &[]));
                relays.lock().unwrap().push(relay.clone());
                relay
            })
            .collect()
    }

    async fn run(self, relays: Arc<Mutex<Vec<Arc<RelayProcess>>>>) -> String {
        match self.scenario {
            Scenario::UnreadableMidGroup => self.unreadable_mid_group(&relays).await,
            Scenario::SameKeyTwoDestinations => self.same_key_two_destinations(&relays).await,
            Scenario::FairFifoManyGroups => self.fair_fifo_many_groups(&relays).await,
        }
    }

    async fn unreadable_mid_group(&self, relays: &Mutex<Vec<Arc<RelayProcess>>>) -> String {
        let db = self.database(&[]).await;
        let client = db.client().await;
        let queue = create_queue("groups-unreadable.fifo", &[]).await;
        self.write(
            &client,
            &[
                (1, "order", "A", Row::Good),
                (2, "order", "A", Row::Unreadable),
                (3, "order", "A", Row::Good),
            ],
        )
        .await;
        let _relays = self.spawn(&db, &queue, &[], relays);
        let third = self.settled(&client, 3).await;
        assert_eq!(
            third,
            (false, Some("blocked".to_string())),
            "{self}: the row behind the unreadable one is held"
        );
        assert_eq!(self.settled(&client, 2).await.1.as_deref(), Some("invalid"));
        assert_eq!(self.settled(&client, 1).await, (true, None));
        let received = receive_all(&queue, 1, Duration::from_secs(30)).await;
        let ids: Vec<&str> = received
            .iter()
            .map(|m| attr(m, "event_id").unwrap())
            .collect();
        assert_eq!(ids, [event_id(1)], "{self}");
        "the row behind the unreadable one parked".to_string()
    }

    async fn same_key_two_destinations(&self, relays: &Mutex<Vec<Arc<RelayProcess>>>) -> String {
        let db = self.database(&[]).await;
        let client = db.client().await;
        let b = create_queue("groups-b.fifo", &[]).await;
        let o = create_queue("groups-o.fifo", &[]).await;
        let route = format!("order={o}");
        let _relays = self.spawn(&db, &b, &["--route", &route], relays);
        self.write(&client, &[(1, "order", "17", Row::Refused)])
            .await;
        let (_, refused) = self.settled(&client, 1).await;
        assert!(refused.is_some(), "{self}");
        // A later claim: the same key, bound for the default queue.
        self.write(&client, &[(2, "customer", "17", Row::Good)])
            .await;
        assert_eq!(self.settled(&client, 2).await, (true, None), "{self}");
        let received = receive_all(&b, 1, Duration::from_secs(30)).await;
        assert_eq!(attr(&received[0], "event_id"), Some(event_id(2).as_str()));
        format!("key 17 quarantined on o.fifo ({refused:?}), sent on b.fifo")
    }

    async fn fair_fifo_many_groups(&self, relays: &Mutex<Vec<Arc<RelayProcess>>>) -> String {
        let fair = ["--fair-by", "aggregate_type"];
        let db = self.database(&fair).await;
        let client = db.client().await;
        self.write_backlog(&client).await;
        self.write(&client, &[(1, "order", "quiet", Row::Good)])
            .await;
        let queue = create_queue("groups-fair.fifo", &[]).await;
        let batch = BATCH.to_string();
        let running = self.spawn(
            &db,
            &queue,
            &[
                "--fair-by",
                "aggregate_type",
                "--batch-size",
                &batch,
                "--max-in-flight",
                "1",
            ],
            relays,
        );
        assert_eq!(self.settled(&client, 1).await, (true, None), "{self}");
        for relay in &running {
            relay.sigterm();
        }
        let column = match self.table {
            Table::Native => "event_id",
            Table::Adopted => "id::text",
        };
        let (table, kind) = (
            self.base_table(),
            match self.table {
                Table::Native => "aggregate_type",
                Table::Adopted => "aggregatetype",
            },
        );
        let ahead: i64 = client
            .query_one(
                &format!(
                    "SELECT count(*) FROM {table} WHERE {kind} = 'import'
                     AND sent_at <= (SELECT sent_at FROM {table} WHERE {column} = $1)"
                ),
                &[&event_id(1)],
            )
            .await
            .unwrap()
            .get(0);
        // Two relays, each with up to two claims in delivery: the quiet event rides in the
        // first claims, so at most those claims' other rows go before it.
        assert!(
            ahead < 6 * BATCH,
            "{self}: {ahead} backlog rows of {BACKLOG_GROUPS} groups went before the quiet tenant's"
        );
        format!("{ahead} backlog rows went before the quiet tenant's event")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_group_cell_keeps_destination_and_key_one_group() {
    let started = Instant::now();
    let cells = chosen(
        [
            Scenario::UnreadableMidGroup,
            Scenario::SameKeyTwoDestinations,
            Scenario::FairFifoManyGroups,
        ]
        .into_iter()
        .flat_map(|scenario| {
            [Table::Native, Table::Adopted].map(|table| GroupCell { scenario, table })
        })
        .collect(),
    );
    let outcomes: Vec<(GroupCell, Result<String, String>)> = futures_util::stream::iter(cells)
        .map(|cell| async move {
            let relays = Arc::new(Mutex::new(Vec::new()));
            let result = tokio::spawn(cell.run(relays.clone())).await;
            let result = result.map_err(|e| {
                let text = if e.is_panic() {
                    panic_text(e.into_panic())
                } else {
                    e.to_string()
                };
                let relays = relays.lock().unwrap().clone();
                format!("{text}\n{}", error_lines(&relays))
            });
            (cell, result)
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    for (cell, result) in &outcomes {
        if let Ok(seen) = result {
            println!("matrix: {cell}: ok, {seen}");
        }
    }
    let report: String = outcomes
        .iter()
        .filter_map(|(cell, r)| r.as_ref().err().map(|e| format!("  {cell}: {e}\n")))
        .collect();
    println!(
        "matrix: {} group cells in {:?}",
        outcomes.len(),
        started.elapsed()
    );
    assert!(report.is_empty(), "cells that failed:\n{report}");
}
