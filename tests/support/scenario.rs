//! Steps the relay tests, the simulation and the benchmarks share: a migrated database, events
//! written the way an application writes them, the relay's command line, and reading back what
//! arrived on the queue.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::types::Message;

use crate::support::{run_to_end, TestDb};

/// A fresh database with the outbox table created by the real `migrate` command.
pub async fn migrated_db() -> TestDb {
    let db = crate::support::fresh_db().await;
    migrate(&db, "outbox").await;
    db
}

pub async fn migrate(db: &TestDb, table: &str) {
    migrate_with(db, &["--table", table]).await;
}

/// `migrate` with more flags, e.g. `--fair-by` for the key index fair claims walk.
pub async fn migrate_with(db: &TestDb, extra: &[&str]) {
    let mut command = args(&["migrate", "--database-url", &db.url]);
    command.extend(args(extra));
    // A bound, not a wait: a migration takes a second; a loaded machine (the simulation's
    // faults, the benchmarks' durable clusters) may take longer.
    let (status, output) = run_to_end(&command, &[], Duration::from_secs(120)).await;
    assert!(status.success(), "migrate {extra:?} failed: {output}");
}

pub fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// `run` with test-friendly timings: quick polls and gauges, a metrics port of its own.
pub fn run_args(db: &TestDb, queue_url: &str, endpoint: &str, extra: &[&str]) -> Vec<String> {
    let mut a = args(&[
        "run",
        "--database-url",
        &db.url,
        "--queue-url",
        queue_url,
        "--sqs-endpoint-url",
        endpoint,
        "--metrics-addr",
        "127.0.0.1:0",
        "--poll-interval",
        "200ms",
        "--stats-interval",
        "200ms",
        // Rows made unsent again below the floor (replays, re-drives) wait for the sweep.
        "--sweep-interval",
        "1s",
        "--retry-base",
        "100ms",
        "--retry-max",
        "1s",
    ]);
    // Most tests read `sent_at` to see what was delivered, so sent rows stay an hour; the
    // default (deleted when SQS acknowledged them) runs in tests/retention.rs and tests/wakeup.rs.
    if !extra
        .iter()
        .any(|a| *a == "--retention" || *a == "--delete-on-ack")
    {
        a.extend(args(&["--retention", "1h"]));
    }
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// [`run_args`] for replicas that crash: a short lease (a killed relay's rows are taken over
/// within seconds) and an id of their own.
pub fn relay_args_for(db: &TestDb, queue: &str, endpoint: &str, id: &str) -> Vec<String> {
    run_args(
        db,
        queue,
        endpoint,
        &[
            "--relay-id",
            id,
            "--lease",
            "3s",
            "--send-timeout",
            "1s",
            "--settle-margin",
            "1s",
        ],
    )
}

/// One event as the application writes it.
#[derive(Debug, Clone)]
pub struct Event {
    pub event_id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub payload: serde_json::Value,
    pub headers: serde_json::Value,
    /// The row's own destination; `None` sends it to its route or the default queue.
    pub queue_url: Option<String>,
}

/// `n` events spread over `aggregates` aggregates; every third carries a traceparent header.
pub fn events(prefix: &str, n: usize, aggregates: usize) -> Vec<Event> {
    (0..n)
        .map(|i| {
            let aggregate = i % aggregates;
            let headers = if i % 3 == 0 {
                serde_json::json!({"traceparent": format!("00-{:032x}-{:016x}-01", i + 1, i + 7)})
            } else {
                serde_json::json!({})
            };
            Event {
                event_id: format!("{prefix}-{i}"),
                aggregate_type: "order".to_string(),
                aggregate_id: format!("agg-{aggregate}"),
                event_type: if i % 2 == 0 {
                    "order.placed"
                } else {
                    "order.paid"
                }
                .to_string(),
                payload: serde_json::json!({
                    "order_id": i,
                    "amount": i * 100 + 7,
                    "note": format!("event {i} of {n} \u{e9}\"quoted\""),
                    "items": [{"sku": format!("sku-{}", i % 11), "qty": i % 4 + 1}],
                }),
                headers,
                queue_url: None,
            }
        })
        .collect()
}

/// Writes events in one transaction, as plain SQL with parameters, like an application.
/// `delay` makes them available only later (they count as unsent meanwhile).
pub async fn insert(client: &tokio_postgres::Client, events: &[Event], delay: Duration) {
    write(client, events, delay).await.expect("insert events");
}

/// `events` as one array per column, in order: the parameters of an INSERT that selects
/// `FROM unnest(...) WITH ORDINALITY ... ORDER BY` the ordinality, so ids follow the slice.
pub struct EventColumns<'a> {
    pub event_ids: Vec<&'a str>,
    pub aggregate_types: Vec<&'a str>,
    pub aggregate_ids: Vec<&'a str>,
    pub event_types: Vec<&'a str>,
    pub payloads: Vec<String>,
    pub headers: Vec<String>,
    pub queue_urls: Vec<Option<&'a str>>,
}

impl<'a> EventColumns<'a> {
    pub fn of(events: &'a [Event]) -> EventColumns<'a> {
        EventColumns {
            event_ids: events.iter().map(|e| e.event_id.as_str()).collect(),
            aggregate_types: events.iter().map(|e| e.aggregate_type.as_str()).collect(),
            aggregate_ids: events.iter().map(|e| e.aggregate_id.as_str()).collect(),
            event_types: events.iter().map(|e| e.event_type.as_str()).collect(),
            payloads: events.iter().map(|e| e.payload.to_string()).collect(),
            headers: events.iter().map(|e| e.headers.to_string()).collect(),
            queue_urls: events.iter().map(|e| e.queue_url.as_deref()).collect(),
        }
    }
}

async fn write(
    client: &tokio_postgres::Client,
    events: &[Event],
    delay: Duration,
) -> Result<u64, tokio_postgres::Error> {
    let c = EventColumns::of(events);
    client
        .execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload, headers, queue_url, available_at)
             SELECT e, t, a, k, p::jsonb, h::jsonb, q, now() + make_interval(secs => $8)
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
                  WITH ORDINALITY AS u(e, t, a, k, p, h, q, n)
             ORDER BY n",
            &[
                &c.event_ids,
                &c.aggregate_types,
                &c.aggregate_ids,
                &c.event_types,
                &c.payloads,
                &c.headers,
                &c.queue_urls,
                &delay.as_secs_f64(),
            ],
        )
        .await
}

pub async fn count(client: &tokio_postgres::Client, condition: &str) -> i64 {
    client
        .query_one(
            &format!("SELECT count(*) FROM outbox WHERE {condition}"),
            &[],
        )
        .await
        .expect("count")
        .get(0)
}

pub async fn wait_count(
    client: &tokio_postgres::Client,
    condition: &str,
    expected: i64,
    timeout: Duration,
) {
    let what = format!("{expected} rows where {condition}");
    crate::support::wait_until(&what, timeout, || async {
        count(client, condition).await == expected
    })
    .await;
}

/// The `event_id` message attribute of a received message.
pub fn attr<'a>(m: &'a Message, name: &str) -> Option<&'a str> {
    m.message_attributes()?.get(name)?.string_value()
}

/// A FIFO message's `MessageGroupId` (received with system attribute `All`).
pub fn message_group(m: &Message) -> Option<&str> {
    m.attributes()?
        .get(&aws_sdk_sqs::types::MessageSystemAttributeName::MessageGroupId)
        .map(String::as_str)
}

/// How many copies of each event_id arrived.
pub fn copies(messages: &[Message]) -> HashMap<String, usize> {
    let mut by_id = HashMap::new();
    for m in messages {
        let id = attr(m, "event_id")
            .expect("every message carries event_id")
            .to_string();
        *by_id.entry(id).or_insert(0) += 1;
    }
    by_id
}

/// Runs `outbox-relay ARGS` to its end and returns its stdout and stderr, asserting success.
pub async fn relay_command(parts: &[&str]) -> String {
    let (status, output) = run_to_end(&args(parts), &[], Duration::from_secs(30)).await;
    assert!(status.success(), "outbox-relay {parts:?} failed: {output}");
    output
}

/// [`insert`] that hands back the error, for writers that must ride out a database outage.
pub async fn try_insert(
    client: &tokio_postgres::Client,
    events: &[Event],
) -> Result<u64, tokio_postgres::Error> {
    write(client, events, Duration::ZERO).await
}

/// An application writing batches of events, one transaction each, that keeps going through
/// database outages: a failed batch is retried on a new connection until it is in the table.
pub struct Producer {
    committed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<ProducerReport>,
}

pub struct ProducerReport {
    /// Every event written, each committed exactly once.
    pub events: Vec<Event>,
    /// Attempts that failed and were retried.
    pub retries: usize,
}

impl Producer {
    /// Writes `batches` batches of `batch_size` events (`{prefix}-{batch}-{i}`) to the outbox
    /// at `url`, `pause` apart.
    pub fn start(
        url: &str,
        prefix: &str,
        batches: usize,
        batch_size: usize,
        pause: Duration,
    ) -> Producer {
        let committed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (url, prefix, done) = (url.to_string(), prefix.to_string(), committed.clone());
        let task = tokio::spawn(async move {
            let mut client = None;
            let mut report = ProducerReport {
                events: Vec::with_capacity(batches * batch_size),
                retries: 0,
            };
            for b in 0..batches {
                let mut batch = events(&format!("{prefix}-{b}"), batch_size, 10);
                // `events` derives payloads from the index alone; with the batch in it, a body
                // names its row on its own, so a copy carrying the wrong event_id shows.
                for e in &mut batch {
                    e.payload["batch"] = b.into();
                }
                loop {
                    let attempt = write_batch(&url, &mut client, &batch);
                    match tokio::time::timeout(Duration::from_secs(10), attempt).await {
                        Ok(Ok(())) => break,
                        Ok(Err(_)) | Err(_) => {
                            report.retries += 1;
                            client = None;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
                report.events.extend(batch);
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(pause).await;
            }
            report
        });
        Producer { committed, task }
    }

    /// Batches in the table so far.
    pub fn committed_batches(&self) -> usize {
        self.committed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits until every batch is in the table.
    pub async fn finish(self) -> ProducerReport {
        self.task.await.expect("producer task")
    }
}

/// `Ok` once the batch is in the table: written now, or by an earlier attempt that committed
/// although its answer was lost (the retry then hits the `event_id` unique key; the batch is
/// one statement, so it is all there).
async fn write_batch(
    url: &str,
    client: &mut Option<tokio_postgres::Client>,
    batch: &[Event],
) -> Result<(), tokio_postgres::Error> {
    let live = match client.take() {
        Some(c) if !c.is_closed() => c,
        _ => {
            let (c, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            c
        }
    };
    match try_insert(&live, batch).await {
        Ok(_) => {}
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {}
        Err(e) => return Err(e),
    }
    *client = Some(live);
    Ok(())
}

/// Sets `flag` to `value` in a command line, replacing the value already there (clap refuses a
/// flag given twice), or appending both.
pub fn set_arg(args: &mut Vec<String>, flag: &str, value: &str) {
    match args.iter().position(|a| a == flag) {
        Some(i) => args[i + 1] = value.to_string(),
        None => args.extend([flag.to_string(), value.to_string()]),
    }
}

/// Writes events in one transaction, each with its own `queue_url` (or none).
pub async fn insert_to(
    client: &tokio_postgres::Client,
    events: &[Event],
    queues: &[Option<String>],
) {
    let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    let aggs: Vec<&str> = events.iter().map(|e| e.aggregate_id.as_str()).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    let payloads: Vec<String> = events.iter().map(|e| e.payload.to_string()).collect();
    let queues: Vec<Option<&str>> = queues.iter().map(|q| q.as_deref()).collect();
    client
        .execute(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload, queue_url)
             SELECT e, 'order', a, k, p::jsonb, q
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
                  WITH ORDINALITY AS u(e, a, k, p, q, n)
             ORDER BY n",
            &[&ids, &aggs, &kinds, &payloads, &queues],
        )
        .await
        .expect("insert events");
}
