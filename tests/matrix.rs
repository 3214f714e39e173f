//! Every supported combination of destination (standard queue, FIFO queue, rows carrying their
//! own FIFO `queue_url`), fair claiming, table (native, adopted Debezium), retention (kept an
//! hour, deleted on acknowledgement) and message format (raw, CloudEvents) runs one end-to-end
//! scenario: events written while two relays run, one acknowledgement lost, a relay killed
//! with SIGKILL mid-send and replaced, three poisoned rows (two the relay refuses, one ending
//! its group and one in the middle of another; one SQS refuses). Each cell must end with every
//! row sent (or deleted) or quarantined with a reason (the rows behind the middle one `blocked`
//! where that group is ordered), per-group order on FIFO queues, no undelivered row missing
//! from the gauges, and no relay that exited on its own. Contradictory flags are refused at
//! start-up with one line. The group cells (`groups`) check that a group is (destination, key)
//! on both table kinds.

mod groups;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::json;

use crate::fifo::order_violations;
use crate::scenario::{
    args, attr, copies, events, insert, message_group, migrate_with, relay_args_for, set_arg,
    Event, EventColumns,
};
use crate::startup::assert_one_clear_line;
use crate::support::{
    create_queue, fresh_db, metric_value, receive_all, run_to_end, sqs, FaultProxy, Mode,
    RelayProcess, DEBEZIUM_COLUMNS, DEBEZIUM_OUTBOX_DDL,
};

const EVENTS: usize = 200;
const GROUPS: usize = 20;
/// Written before the relays start and held back (`available_at`) until the gauges show them.
const EARLY: usize = 40;
/// Rows per INSERT once the relays run.
const CHUNK: usize = 20;
/// The chunk during whose send a relay is killed and replaced.
const KILL_AFTER_CHUNK: usize = 3;
/// Cells at once: each runs two relays, a proxy and receivers on the suite's two cores.
const PARALLEL: usize = 4;
/// The last event of group agg-0: no row is behind it, so with ordered delivery and
/// `--on-poison block` none is parked.
const POISONED_LAST: usize = EVENTS - GROUPS;
/// The sixth of the ten events of group agg-2: where agg-2 is ordered (a FIFO queue, its own
/// or the default) the four behind it are parked `blocked`; elsewhere they are sent.
const POISONED_HEAD: usize = 5 * GROUPS + 2;
/// The last event of group agg-4, too big for the cell's queues but not for `--max-request-bytes`:
/// on a standard queue SQS refuses it (`sender_fault`); on a FIFO queue the relay reads the
/// queue's own limit and refuses it before sending (`too_large`), so that no later entry of its
/// group could be accepted before it. Last of its group, so both outcomes are well defined.
const REFUSED_BY_SQS: usize = EVENTS - GROUPS + 4;
const POISONED: [usize; 3] = [POISONED_LAST, POISONED_HEAD, REFUSED_BY_SQS];
/// The cell's queues take messages up to this size, so [`REFUSED_BY_SQS`] gets to SQS.
const QUEUE_MESSAGE_SIZE: &str = "8192";
/// Values of `aggregate_type`, the key of fair claims: each group belongs to one.
const TENANTS: [&str; 4] = ["order", "invoice", "customer", "refund"];
const CLOUDEVENTS_SOURCE: &str = "/matrix";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Destination {
    Standard,
    Fifo,
    /// A standard `--queue-url`; the even groups' rows name a FIFO queue of their own.
    RowFifo,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Table {
    Native,
    Adopted,
}

#[derive(Clone, Copy, Debug)]
struct Cell {
    destination: Destination,
    fair: bool,
    table: Table,
    delete_on_ack: bool,
    cloudevents: bool,
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let destination = match self.destination {
            Destination::Standard => "standard",
            Destination::Fifo => "fifo",
            Destination::RowFifo => "row-fifo",
        };
        let fair = if self.fair { "fair" } else { "unfair" };
        let table = match self.table {
            Table::Native => "native",
            Table::Adopted => "adopted",
        };
        let retention = if self.delete_on_ack {
            "delete"
        } else {
            "keep-1h"
        };
        let format = if self.cloudevents {
            "cloudevents"
        } else {
            "raw"
        };
        write!(f, "{destination}/{fair}/{table}/{retention}/{format}")
    }
}

fn cells() -> Vec<Cell> {
    let mut cells = Vec::new();
    for destination in [
        Destination::Standard,
        Destination::Fifo,
        Destination::RowFifo,
    ] {
        for fair in [false, true] {
            for table in [Table::Native, Table::Adopted] {
                for delete_on_ack in [false, true] {
                    for cloudevents in [false, true] {
                        cells.push(Cell {
                            destination,
                            fair,
                            table,
                            delete_on_ack,
                            cloudevents,
                        });
                    }
                }
            }
        }
    }
    cells
}

impl Cell {
    /// The table the application writes and the relay settles in.
    fn base_table(&self) -> &'static str {
        match self.table {
            Table::Native => "outbox",
            Table::Adopted => "outboxevent",
        }
    }

    /// The lease table beside the table (or view) the relay reads: `<relay table>_claims`.
    fn claims_table(&self) -> &'static str {
        match self.table {
            Table::Native => "outbox_claims",
            Table::Adopted => "outboxevent_relay_claims",
        }
    }

    /// What the relay reads: the table, or the view over an adopted one (standard names).
    fn relay_table(&self) -> &'static str {
        match self.table {
            Table::Native => "outbox",
            Table::Adopted => "outboxevent_relay",
        }
    }

    fn event_id_column(&self) -> &'static str {
        match self.table {
            Table::Native => "event_id",
            Table::Adopted => "id::text",
        }
    }

    /// Debezium's table gets a `queue_url` column only where rows need one; the view then
    /// exposes it under the standard name without a `--column` flag.
    fn row_queue_column(&self) -> bool {
        self.destination == Destination::RowFifo
    }

    /// Why poisoned event `i` is quarantined.
    fn poison_reason(&self, i: usize) -> &'static str {
        match (i, self.table) {
            (REFUSED_BY_SQS, _) if self.destination == Destination::Standard => "sender_fault",
            (REFUSED_BY_SQS, _) => "too_large",
            (_, Table::Native) => "invalid",
            (_, Table::Adopted) => "too_large",
        }
    }

    /// The cell's events: uuids as event ids (Debezium's `id` is a uuid), groups spread over
    /// the tenants, the even groups on `row_queue` when there is one, and the poisoned rows.
    fn events(&self, row_queue: Option<&str>) -> Vec<Event> {
        let mut written = events("matrix", EVENTS, GROUPS);
        for (i, e) in written.iter_mut().enumerate() {
            let group = i % GROUPS;
            e.event_id = format!("00000000-0000-4000-8000-{i:012}");
            e.aggregate_type = TENANTS[group % TENANTS.len()].to_string();
            if self.table == Table::Adopted {
                // Debezium's table has no headers column.
                e.headers = json!({});
            }
            if group % 2 == 0 {
                e.queue_url = row_queue.map(str::to_string);
            }
        }
        written[REFUSED_BY_SQS].payload = json!({"blob": "y".repeat(10_000)});
        for i in [POISONED_LAST, POISONED_HEAD] {
            let poisoned = &mut written[i];
            match self.table {
                // A header name SQS reserves: refused before sending.
                Table::Native => poisoned.headers = json!({"AWS.trace": "x"}),
                // Over SQS's 1 MiB: refused before sending.
                Table::Adopted => poisoned.payload = json!({"blob": "x".repeat(1 << 20)}),
            }
        }
        written
    }

    /// The events parked behind [`POISONED_HEAD`]: its group's later ones where the group's
    /// queue is FIFO (ordered by `--ordered auto`), none elsewhere.
    fn blocked(&self, written: &[Event], default_queue: &str) -> Vec<usize> {
        let head = &written[POISONED_HEAD];
        let queue = head.queue_url.as_deref().unwrap_or(default_queue);
        if !queue.ends_with(".fifo") {
            return Vec::new();
        }
        (POISONED_HEAD + 1..EVENTS)
            .filter(|&i| written[i].aggregate_id == head.aggregate_id)
            .collect()
    }

    /// Writes `events` the way the application of this table does, available after `delay`.
    async fn write(&self, client: &tokio_postgres::Client, events: &[Event], delay: Duration) {
        if self.table == Table::Native {
            return insert(client, events, delay).await;
        }
        let c = EventColumns::of(events);
        let delay = delay.as_secs_f64();
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
            &c.event_ids,
            &c.aggregate_types,
            &c.aggregate_ids,
            &c.event_types,
            &c.payloads,
            &delay,
        ];
        let (column, value, array) = if self.row_queue_column() {
            params.push(&c.queue_urls);
            (", queue_url", ", q", ", $7::text[]")
        } else {
            ("", "", "")
        };
        let sql = format!(
            "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload, available_at{column})
             SELECT e::uuid, t, a, k, p::jsonb, now() + make_interval(secs => $6){value}
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]{array})
                  WITH ORDINALITY AS u(e, t, a, k, p{value}, n)
             ORDER BY n"
        );
        client
            .execute(&sql, &params)
            .await
            .expect("insert into the Debezium table");
    }

    fn relay_args(
        &self,
        db: &crate::support::TestDb,
        queue: &str,
        endpoint: &str,
        id: &str,
    ) -> Vec<String> {
        let mut a = relay_args_for(db, queue, endpoint, id);
        set_arg(&mut a, "--poll-interval", "20ms");
        if self.delete_on_ack {
            set_arg(&mut a, "--retention", "0");
        }
        if self.fair {
            a.extend(args(&["--fair-by", "aggregate_type"]));
        }
        if self.cloudevents {
            a.extend(args(&[
                "--message-format",
                "cloudevents",
                "--cloudevents-source",
                CLOUDEVENTS_SOURCE,
            ]));
        }
        if self.table == Table::Adopted {
            a.extend(args(&["--table", "outboxevent"]));
            a.extend(args(&DEBEZIUM_COLUMNS));
        }
        a
    }
}

/// Rows by state: (neither sent nor quarantined, sent, quarantined, all).
async fn row_states(client: &tokio_postgres::Client, table: &str) -> (i64, i64, i64, i64) {
    let row = client
        .query_one(
            &format!(
                "SELECT count(*) FILTER (WHERE sent_at IS NULL AND quarantined_at IS NULL),
                        count(*) FILTER (WHERE sent_at IS NOT NULL),
                        count(*) FILTER (WHERE quarantined_at IS NOT NULL),
                        count(*)
                 FROM {table}"
            ),
            &[],
        )
        .await
        .expect("count rows by state");
    (row.get(0), row.get(1), row.get(2), row.get(3))
}

/// Polls `check` every 50 ms; after `timeout`, panics with the cell, `what` and the last
/// state `check` described.
async fn wait_for<F, Fut>(cell: Cell, what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(()) => return,
            Err(state) if Instant::now() >= deadline => {
                panic!("{cell}: {what} not within {timeout:?}; last seen: {state}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// One run of the scenario; returns what it saw worth a line. Every relay started goes into
/// `relays`, so a failure can be reported with their logs.
async fn run_cell(cell: Cell, relays: Arc<Mutex<Vec<Arc<RelayProcess>>>>) -> String {
    let db = fresh_db().await;
    let client = db.client().await;
    let fair: &[&str] = if cell.fair {
        &["--fair-by", "aggregate_type"]
    } else {
        &[]
    };
    match cell.table {
        Table::Native => migrate_with(&db, fair).await,
        Table::Adopted => {
            client.batch_execute(DEBEZIUM_OUTBOX_DDL).await.unwrap();
            if cell.row_queue_column() {
                client
                    .batch_execute("ALTER TABLE outboxevent ADD COLUMN queue_url text")
                    .await
                    .unwrap();
            }
            crate::adopt::adopt(&db, fair).await;
        }
    }
    let size = [("MaximumMessageSize", QUEUE_MESSAGE_SIZE)];
    let default_queue = match cell.destination {
        Destination::Fifo => create_queue("matrix.fifo", &size).await,
        Destination::Standard | Destination::RowFifo => create_queue("matrix", &size).await,
    };
    let row_queue = match cell.destination {
        Destination::RowFifo => Some(create_queue("matrix-rows.fifo", &size).await),
        Destination::Standard | Destination::Fifo => None,
    };
    let written = cell.events(row_queue.as_deref());
    let table = cell.base_table();
    let proxy = FaultProxy::start(sqs().endpoint());
    let spawn = |n: usize| {
        let id = format!("{}-{n}", cell.to_string().replace('/', "-"));
        let relay = Arc::new(RelayProcess::spawn_named(
            &id,
            &cell.relay_args(&db, &default_queue, proxy.endpoint(), &id),
            &[],
        ));
        relays.lock().unwrap().push(relay.clone());
        relay
    };

    // Rows the relays cannot take yet: every one must show on the gauges, with its age.
    cell.write(&client, &written[..EARLY], Duration::from_secs(3600))
        .await;
    let first = spawn(0);
    let second = spawn(1);
    wait_for(
        cell,
        "the pending rows on the gauges",
        Duration::from_secs(30),
        || async {
            let metrics = first.scrape().await;
            let unsent = metric_value(&metrics, "outbox_unsent_rows");
            let age = metric_value(&metrics, "outbox_oldest_unsent_age_seconds");
            match (unsent, age) {
                (Some(n), Some(a)) if n == EARLY as f64 && a > 0.0 => Ok(()),
                _ => Err(format!(
                    "outbox_unsent_rows={unsent:?} outbox_oldest_unsent_age_seconds={age:?}"
                )),
            }
        },
    )
    .await;

    // The first send after the early rows are released reaches SQS; its answer is lost.
    proxy.fault_next(Mode::DropResponse, 1);
    client
        .execute(
            &format!("UPDATE {table} SET available_at = now() WHERE available_at > now()"),
            &[],
        )
        .await
        .unwrap();
    wait_for(
        cell,
        "the lost acknowledgement",
        Duration::from_secs(30),
        || async {
            match proxy.faulted() {
                1 => Ok(()),
                n => Err(format!("{n} requests faulted")),
            }
        },
    )
    .await;

    // The rest arrives while the relays run; halfway, a relay is killed while its rows are
    // leased and their send is in flight (the proxy holds SQS's answers meanwhile).
    let mut live = vec![first, second];
    let mut killed = None;
    for (n, chunk) in written[EARLY..].chunks(CHUNK).enumerate() {
        if n == KILL_AFTER_CHUNK {
            proxy.set_mode(Mode::Hold);
        }
        cell.write(&client, chunk, Duration::ZERO).await;
        if n == KILL_AFTER_CHUNK {
            let owner = leaseholder_mid_send(cell, &client, &proxy).await;
            let victim = live
                .iter()
                .position(|r| r.name() == owner)
                .unwrap_or_else(|| panic!("{cell}: {owner} is not a running relay"));
            let victim = live.remove(victim);
            victim.kill9();
            killed = Some(victim);
            live.push(spawn(2));
            proxy.set_mode(Mode::Pass);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed = killed.expect("a relay was killed");

    // Every row ends sent (or deleted) or quarantined.
    let blocked = cell.blocked(&written, &default_queue);
    let undelivered = POISONED.len() + blocked.len();
    let kept = if cell.delete_on_ack {
        undelivered as i64
    } else {
        EVENTS as i64
    };
    wait_for(cell, "every row sent or quarantined", Duration::from_secs(120), || async {
        match row_states(&client, table).await {
            (0, _, _, all) if all == kept => Ok(()),
            (pending, sent, quarantined, all) => Err(format!(
                "pending={pending} sent={sent} quarantined={quarantined} rows={all} (expected {kept})"
            )),
        }
    })
    .await;
    let (_, sent, _, _) = row_states(&client, table).await;
    let expected_sent = if cell.delete_on_ack {
        0
    } else {
        (EVENTS - undelivered) as i64
    };
    assert_eq!(sent, expected_sent, "{cell}: rows marked sent");
    let quarantined: Vec<(String, String, String)> = client
        .query(
            &format!(
                "SELECT {}, quarantine_reason, coalesce(last_error, '') FROM {table}
                 WHERE quarantined_at IS NOT NULL",
                cell.event_id_column()
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let mut expected_reasons: Vec<(&str, &str)> = POISONED
        .iter()
        .map(|&i| (written[i].event_id.as_str(), cell.poison_reason(i)))
        .chain(
            blocked
                .iter()
                .map(|&i| (written[i].event_id.as_str(), "blocked")),
        )
        .collect();
    expected_reasons.sort();
    let mut reasons: Vec<(&str, &str)> = quarantined
        .iter()
        .map(|(id, reason, _)| (id.as_str(), reason.as_str()))
        .collect();
    reasons.sort();
    assert_eq!(
        reasons, expected_reasons,
        "{cell}: only the poisoned rows are quarantined with their reason, and the rows behind \
         an ordered one are blocked: {quarantined:?}"
    );

    // Every other event arrived where it was sent, as it was written.
    let position: HashMap<String, i64> = written
        .iter()
        .enumerate()
        .map(|(i, e)| (e.event_id.clone(), i as i64))
        .collect();
    let mut by_queue: HashMap<&str, Vec<&Event>> = HashMap::new();
    for (i, e) in written.iter().enumerate() {
        if !POISONED.contains(&i) && !blocked.contains(&i) {
            let queue = e.queue_url.as_deref().unwrap_or(&default_queue);
            by_queue.entry(queue).or_default().push(e);
        }
    }
    let mut resent = 0;
    for (queue, expected) in &by_queue {
        let received = receive_all(queue, expected.len(), Duration::from_secs(60)).await;
        let by_id = copies(&received);
        resent += received.len() - by_id.len();
        let arrived: HashSet<&str> = by_id.keys().map(String::as_str).collect();
        let wanted: HashSet<&str> = expected.iter().map(|e| e.event_id.as_str()).collect();
        assert!(
            arrived == wanted,
            "{cell}: {queue}: missing {:?}, unexpected {:?}",
            wanted.difference(&arrived).collect::<Vec<_>>(),
            arrived.difference(&wanted).collect::<Vec<_>>()
        );
        let fifo = queue.ends_with(".fifo");
        if fifo {
            let twice: Vec<_> = by_id.iter().filter(|(_, &n)| n > 1).collect();
            assert!(
                twice.is_empty(),
                "{cell}: {queue}: FIFO deduplication: {twice:?}"
            );
            let (violations, by_group) = order_violations(&received, &position);
            assert_eq!(
                violations, 0,
                "{cell}: {queue}: order within groups: {by_group:?}"
            );
        }
        for m in &received {
            let e = written
                .iter()
                .find(|e| Some(e.event_id.as_str()) == attr(m, "event_id"))
                .expect("arrived events were written");
            check_message(cell, m, e, fifo);
        }
    }

    // Nothing undelivered is missing from the gauges: the blocked rows are unsent, and aged.
    let parked = blocked.len() as f64;
    wait_for(
        cell,
        "the gauges at rest",
        Duration::from_secs(10),
        || async {
            let metrics = live[0].scrape().await;
            let v = |series| metric_value(&metrics, series);
            let (unsent, age, quarantined, blocked) = (
                v("outbox_unsent_rows"),
                v("outbox_oldest_unsent_age_seconds"),
                v("outbox_quarantined_rows"),
                v("outbox_blocked_rows"),
            );
            let aged = age.is_some_and(|a| if parked > 0.0 { a > 0.0 } else { a == 0.0 });
            if unsent == Some(parked)
                && aged
                && quarantined == Some(POISONED.len() as f64 + parked)
                && blocked == Some(parked)
            {
                Ok(())
            } else {
                Err(format!(
                    "unsent={unsent:?} oldest_unsent_age={age:?} quarantined={quarantined:?} \
                     blocked={blocked:?} (parked: {parked})"
                ))
            }
        },
    )
    .await;

    // Besides its sends the relay only reads FIFO queues' size limits, which the proxy never
    // faults: the lost answer was a send's.
    let actions = proxy.actions();
    assert!(
        actions
            .iter()
            .all(|a| a == "AmazonSQS.SendMessageBatch" || a == "AmazonSQS.GetQueueAttributes"),
        "{cell}: the relay made calls other than sends and size-limit reads: {actions:?}"
    );
    let status = killed.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(
        status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s)),
        Some(libc::SIGKILL),
        "{cell}: {} was killed",
        killed.name()
    );
    for relay in &live {
        assert_eq!(
            relay.wait_exit(Duration::ZERO).await,
            None,
            "{cell}: {} exited on its own",
            relay.name()
        );
    }
    for relay in &live {
        relay.sigterm();
    }
    for relay in &live {
        let status = relay.wait_exit(Duration::from_secs(30)).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "{cell}: {} after SIGTERM: {status:?}",
            relay.name()
        );
    }
    format!("{resent} copies sent again, {} rows blocked", blocked.len())
}

/// The relay (its id) that holds a lease on an unsent row while a send is held by the proxy.
async fn leaseholder_mid_send(
    cell: Cell,
    client: &tokio_postgres::Client,
    proxy: &FaultProxy,
) -> String {
    let sql = format!(
        "SELECT l.owner FROM {} AS l JOIN {} AS o ON o.id = ANY (l.ids)
         WHERE o.sent_at IS NULL AND o.quarantined_at IS NULL AND l.until > now() LIMIT 1",
        cell.claims_table(),
        cell.relay_table()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let owner: Option<String> = client
            .query_opt(&sql, &[])
            .await
            .unwrap()
            .and_then(|r| r.get(0));
        match owner {
            Some(owner) if proxy.held() > 0 => return owner,
            _ if Instant::now() >= deadline => {
                panic!(
                    "{cell}: no relay held leased rows in a send; held={}",
                    proxy.held()
                )
            }
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// The message as the consumer sees it: the fixed attributes and the row's headers, and the
/// payload as the body or as the CloudEvents envelope's `data`.
fn check_message(cell: Cell, m: &aws_sdk_sqs::types::Message, e: &Event, fifo: bool) {
    let id = &e.event_id;
    for (name, value) in [
        ("event_type", &e.event_type),
        ("aggregate_type", &e.aggregate_type),
        ("aggregate_id", &e.aggregate_id),
    ] {
        assert_eq!(attr(m, name), Some(value.as_str()), "{cell}: {id}: {name}");
    }
    let headers = e.headers.as_object().expect("headers are an object");
    for (name, value) in headers {
        assert_eq!(attr(m, name), value.as_str(), "{cell}: {id}: header {name}");
    }
    let attributes = m.message_attributes().map_or(0, |a| a.len());
    assert_eq!(attributes, 4 + headers.len(), "{cell}: {id}: attributes");
    if fifo {
        assert_eq!(
            message_group(m),
            Some(e.aggregate_id.as_str()),
            "{cell}: {id}: MessageGroupId"
        );
    }
    let body: serde_json::Value =
        serde_json::from_str(m.body().unwrap_or_default()).expect("the body is JSON");
    if cell.cloudevents {
        assert_eq!(body["specversion"], "1.0", "{cell}: {id}: {body}");
        assert_eq!(body["id"], id.as_str(), "{cell}: {id}: {body}");
        assert_eq!(body["source"], CLOUDEVENTS_SOURCE, "{cell}: {id}: {body}");
        assert_eq!(body["type"], e.event_type.as_str(), "{cell}: {id}: {body}");
        assert_eq!(
            body["subject"],
            e.aggregate_id.as_str(),
            "{cell}: {id}: {body}"
        );
        assert_eq!(body["data"], e.payload, "{cell}: {id}: {body}");
    } else {
        assert_eq!(body, e.payload, "{cell}: {id}: body");
    }
}

/// The text of a panic caught at a task's boundary.
fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => payload.downcast_ref::<&str>().map_or_else(
            || "a panic without a message".to_string(),
            |s| s.to_string(),
        ),
    }
}

/// The last lines a failing cell's relays logged at WARN and ERROR (the first ones are the
/// faults the scenario injects).
fn error_lines(relays: &[Arc<RelayProcess>]) -> String {
    let mut out = String::new();
    for relay in relays {
        let output = relay.output();
        let lines: Vec<&str> = output
            .lines()
            .filter(|l| l.contains("ERROR") || l.contains("WARN"))
            .collect();
        for line in &lines[lines.len().saturating_sub(20)..] {
            out.push_str(&format!("    [{}] {line}\n", relay.name()));
        }
    }
    out
}

/// The cells whose name contains `OUTBOX_TEST_MATRIX` (e.g. `fifo/fair`, to reproduce one),
/// every cell without it. A filter that matches none fails here, naming the cells there are:
/// otherwise the test would run nothing and pass.
pub(crate) fn chosen<C: fmt::Display>(cells: Vec<C>) -> Vec<C> {
    let only = std::env::var("OUTBOX_TEST_MATRIX").unwrap_or_default();
    let names: Vec<String> = cells.iter().map(ToString::to_string).collect();
    let chosen: Vec<C> = cells
        .into_iter()
        .filter(|c| c.to_string().contains(&only))
        .collect();
    assert!(
        !chosen.is_empty(),
        "OUTBOX_TEST_MATRIX={only:?} matches none of this test's cells: {}",
        names.join(", ")
    );
    chosen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_combination_delivers_through_a_kill_9_a_lost_acknowledgement_and_poisoned_rows() {
    let started = Instant::now();
    let chosen = chosen(cells());
    let outcomes: Vec<(Cell, Duration, Result<String, String>)> =
        futures_util::stream::iter(chosen)
            .map(|cell| async move {
                let relays = Arc::new(Mutex::new(Vec::new()));
                let began = Instant::now();
                let result = tokio::spawn(run_cell(cell, relays.clone())).await;
                let result = result.map_err(|e| {
                    let text = if e.is_panic() {
                        panic_text(e.into_panic())
                    } else {
                        e.to_string()
                    };
                    let relays = relays.lock().unwrap().clone();
                    format!("{text}\n{}", error_lines(&relays))
                });
                (cell, began.elapsed(), result)
            })
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
    for (cell, took, result) in &outcomes {
        if let Ok(seen) = result {
            println!("matrix: {cell}: ok in {took:?}, {seen}");
        }
    }
    let failed: Vec<_> = outcomes.iter().filter(|(_, _, r)| r.is_err()).collect();
    let slowest = outcomes
        .iter()
        .map(|(_, d, _)| *d)
        .max()
        .unwrap_or_default();
    println!(
        "matrix: {} cells, {} failed, {:?} in all, slowest cell {slowest:?}",
        outcomes.len(),
        failed.len(),
        started.elapsed()
    );
    let report: String = failed
        .iter()
        .map(|(cell, _, r)| format!("  {cell}: {}\n", r.as_ref().unwrap_err()))
        .collect();
    assert!(failed.is_empty(), "cells that failed:\n{report}");
}

/// Every cell of the matrix is a supported combination; what start-up refuses are flags that
/// contradict each other, each with one line that names the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contradictory_flags_are_refused_at_start_up_with_one_line() {
    let base = args(&[
        "run",
        "--database-url",
        "postgres://relay@127.0.0.1:1/app",
        "--queue-url",
        "http://127.0.0.1:1/000000000000/matrix.fifo",
    ]);
    for (extra, fix) in [
        (
            &["--retention", "1h", "--delete-on-ack"][..],
            "--delete-on-ack deletes rows when sent; it contradicts --retention",
        ),
        (
            &["--fair-group-id"][..],
            "--fair-group-id sends the --fair-by key as MessageGroupId: set --fair-by too",
        ),
        (
            &[
                "--message-format",
                "cloudevents",
                "--cloudevents-source",
                " ",
            ][..],
            "--message-format cloudevents needs --cloudevents-source",
        ),
    ] {
        let command = [base.clone(), args(extra)].concat();
        let (status, output) = run_to_end(&command, &[], Duration::from_secs(20)).await;
        assert_eq!(status.code(), Some(2), "{extra:?}: {output}");
        assert_one_clear_line(&output, fix);
        assert_eq!(
            output.lines().count(),
            1,
            "{extra:?}: nothing but the verdict: {output}"
        );
    }
}
