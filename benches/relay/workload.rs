//! The database side of the benchmark: a fresh outbox per run, the backlog, the ceiling loop
//! (the relay's own claim and settle SQL with no queue), and the steady producer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_relay::batch::KeyColumn;
use outbox_relay::outbox::{
    ClaimRequest, ClaimStrategy, KeyIndex, OrderBy, OrderScope, Ordered, Outbox, Wakeup,
};
use outbox_relay::row::{SentRow, Settlement};

use crate::cluster;
use crate::support::pg::PrivatePg;
use crate::support::{self, TestDb};

/// Message groups (distinct `aggregate_id`s) in the steady producers' events and in every
/// backlog but the long-group one, so the ordered FIFO run and the unordered runs drain the
/// same rows.
pub const GROUPS: u64 = 1000;

/// What a backlog holds: event n (from 1) goes to group `n % groups`.
#[derive(Clone, Copy, Debug)]
pub struct Backlog {
    /// Events written before the relays start.
    pub rows: u64,
    /// Distinct `aggregate_id`s (FIFO message groups); 1 puts every event in one group.
    pub groups: u64,
    /// What each event carries.
    pub payload: Payload,
}

/// The payload of every event of a backlog.
#[derive(Clone, Copy, Debug)]
pub enum Payload {
    /// An order event of about 300 bytes ([`PAYLOAD_SQL`]).
    Order,
    /// An order number and a string of about this many bytes: large events, near SQS's 1 MiB
    /// message limit, to see what bounds the relay's memory.
    Blob(usize),
}

impl Backlog {
    /// `rows` order events over [`GROUPS`] groups: the backlog of the ceilings and drains.
    pub fn orders(rows: u64) -> Backlog {
        Backlog {
            rows,
            groups: GROUPS,
            payload: Payload::Order,
        }
    }

    fn payload_sql(&self, n: &str) -> String {
        match self.payload {
            Payload::Order => with_n(PAYLOAD_SQL, n),
            // md5 hex is 32 characters; built by PostgreSQL like the order events. Repeated
            // text compresses well in TOAST, which changes nothing for the relay: it reads
            // the JSON text.
            Payload::Blob(bytes) => format!(
                "jsonb_build_object('order_id', {n}, 'blob', repeat(md5({n}::text), {}))",
                bytes.div_ceil(32)
            ),
        }
    }
}

/// A JSON order event of about 300 bytes, built by PostgreSQL from the event number `{n}`,
/// so the backlog is written with one INSERT … SELECT and never crosses the wire.
const PAYLOAD_SQL: &str = "jsonb_build_object(\
    'order_id', {n}, \
    'customer_id', 'cus_' || lpad(({n} * 7919 % 1000000)::text, 8, '0'), \
    'status', 'paid', \
    'amount', jsonb_build_object('value', {n} * 37 % 100000, 'currency', 'EUR'), \
    'lines', jsonb_build_array(\
        jsonb_build_object('sku', 'sku-' || ({n} % 500), 'qty', 1 + {n} % 3, 'unit_price', 1999), \
        jsonb_build_object('sku', 'sku-' || ({n} % 311), 'qty', 1, 'unit_price', 499)), \
    'shipping', jsonb_build_object('country', 'DE', 'postcode', lpad(({n} % 99999)::text, 5, '0')), \
    'paid_at', '2025-01-01T00:00:00Z')";

/// Applications usually propagate a trace context; it becomes one more message attribute.
const HEADERS_SQL: &str = "jsonb_build_object('traceparent', \
    '00-' || lpad(to_hex({n}), 32, '0') || '-' || lpad(to_hex({n} * 31), 16, '0') || '-01')";

/// The ~300-byte order event of event number `n` (an SQL expression), as SQL.
pub fn order_payload_sql(n: &str) -> String {
    with_n(PAYLOAD_SQL, n)
}

/// The `traceparent` header of event number `n` (an SQL expression), as SQL.
pub fn headers_sql(n: &str) -> String {
    with_n(HEADERS_SQL, n)
}

fn with_n(template: &str, n: &str) -> String {
    template.replace("{n}", n)
}

/// A fresh database with a migrated outbox table, dropped when the run ends.
pub struct Database {
    /// The database and its URL, for the relays and the samplers.
    pub db: TestDb,
    /// The relay library's handle on its outbox table, for the ceilings and the fill.
    pub outbox: Arc<Outbox>,
    /// Of the cluster holding it, to drop it at the end.
    admin_url: String,
}

impl Database {
    /// On the shared cluster (`fsync=off`): backlogs and ceilings.
    pub async fn create() -> Database {
        Database::migrated(support::fresh_db().await, support::pg().admin_url()).await
    }

    /// On a cluster of the benchmark's own, e.g. the durable one.
    pub async fn create_in(cluster: &PrivatePg) -> Database {
        Database::migrated(cluster.create_db().await, cluster.admin_url()).await
    }

    async fn migrated(db: TestDb, admin_url: String) -> Database {
        let outbox = Outbox::new(
            &db.url,
            "outbox".parse().expect("table name"),
            Duration::from_secs(10),
        )
        .expect("outbox settings");
        outbox.migrate(&[]).await.expect("migrate the outbox table");
        // As `outbox-relay migrate` does: the default wake-up, and nothing another mode needs
        // (the migration alone still creates the NOTIFY trigger).
        outbox
            .set_up_wakeup(Wakeup::default())
            .await
            .expect("set up the default wake-up");
        Database {
            db,
            outbox: Arc::new(outbox),
            admin_url,
        }
    }

    /// What `migrate --order-by transaction` adds: the xact_id column and the default group
    /// key's indexes in that order.
    pub async fn order_by_transaction(&self) {
        let keys = KeyIndex::for_groups(OrderBy::Transaction).map(|k| (KeyColumn::AggregateId, k));
        self.outbox
            .migrate(&keys)
            .await
            .expect("migrate --order-by transaction");
    }

    /// Writes the backlog's unsent events `bench-1` … `bench-{rows}` in one statement, then
    /// VACUUM ANALYZE so that every run starts from the same state instead of racing
    /// autovacuum. Returns the mean payload size in bytes (of the JSON text, as the relay
    /// measures it).
    pub async fn fill(&self, backlog: &Backlog) -> f64 {
        let client = self.db.client().await;
        client
            .execute(
                &format!(
                    "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload, headers) \
                     SELECT 'bench-' || g, 'order', (g % $2::bigint)::text, 'order.paid', {}, {} \
                     FROM generate_series(1, $1::bigint) AS g",
                    backlog.payload_sql("g"),
                    with_n(HEADERS_SQL, "g"),
                ),
                &[&(backlog.rows as i64), &(backlog.groups.max(1) as i64)],
            )
            .await
            .expect("fill the backlog");
        client
            .batch_execute("VACUUM ANALYZE outbox")
            .await
            .expect("vacuum the backlog");
        client
            .query_one(
                "SELECT coalesce(avg(length(payload::text)), 0)::float8 FROM outbox",
                &[],
            )
            .await
            .expect("payload size")
            .get(0)
    }

    /// The relay's statements in `--ordered on` mode (group key aggregate_id, the default),
    /// for the ordered ceiling.
    pub fn ordered_outbox(&self) -> Arc<Outbox> {
        let outbox = Outbox::new(
            &self.db.url,
            "outbox".parse().expect("table name"),
            Duration::from_secs(10),
        )
        .expect("outbox settings")
        .claim_strategy(ClaimStrategy::Ordered(Ordered {
            key: KeyColumn::AggregateId,
            routing: Default::default(),
            skip_poison: false,
            scope: OrderScope::Every,
            by: Default::default(),
        }))
        .expect("claim statement");
        Arc::new(outbox)
    }

    pub async fn unsent(&self) -> i64 {
        self.db
            .client()
            .await
            .query_one(
                "SELECT count(*) FROM outbox WHERE sent_at IS NULL AND quarantined_at IS NULL",
                &[],
            )
            .await
            .expect("count unsent rows")
            .get(0)
    }

    /// Size of the table with its indexes, in MiB.
    pub async fn size_mib(&self) -> f64 {
        self.db
            .client()
            .await
            .query_one(
                "SELECT pg_total_relation_size('outbox')::float8 / 1048576",
                &[],
            )
            .await
            .expect("table size")
            .get(0)
    }

    /// Drops the database so that the next run's disk and cache are not shared with this one.
    pub async fn drop_now(self) {
        cluster::drop_database(&self.admin_url, &self.db.name).await;
    }
}

/// One ceiling measurement: claim + mark sent in a tight loop on `workers` connections.
pub struct Ceiling {
    /// Claimed with the ordered statement (one row per group, a group's next row only after
    /// the previous one is sent).
    pub ordered: bool,
    /// The minimal claim + mark of [`minimal_ceiling`], not the relay's SQL.
    pub minimal: bool,
    /// Rows per claim.
    pub batch: i64,
    /// Connections claiming at once.
    pub workers: usize,
    /// Rows claimed and marked sent.
    pub rows: u64,
    /// Time to drain them.
    pub seconds: f64,
    /// Mean time of one claim statement, and of one settle (mark sent), in milliseconds.
    pub claim_ms: f64,
    /// See `claim_ms`.
    pub settle_ms: f64,
    /// Mean claim time in each tenth of the drain (by rows already claimed): a claim that
    /// gets slower as the drain goes on is walking what the earlier claims left behind.
    pub claim_ms_by_tenth: Vec<f64>,
}

impl Ceiling {
    pub fn rows_per_second(&self) -> f64 {
        self.rows as f64 / self.seconds
    }
}

/// What one ceiling worker did: rows settled, and for each claim, the rows claimed before it
/// (by every worker) and how long it took.
struct WorkerLog {
    /// Rows the worker settled.
    rows: u64,
    /// For each claim: rows claimed before it by every worker, and how long it took.
    claims: Vec<(u64, Duration)>,
    /// Time the worker spent marking rows sent.
    settle_time: Duration,
}

/// Drains the table with the relay's own statements and nothing else: each worker claims
/// `batch` rows under a lease and marks them all sent, as if SQS had accepted them at once.
/// `backlog` is the number of rows in the table.
pub async fn ceiling(
    outbox: Arc<Outbox>,
    ordered: bool,
    batch: i64,
    workers: usize,
    backlog: u64,
) -> Ceiling {
    let started = Instant::now();
    let progress = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..workers {
        let (outbox, progress) = (Arc::clone(&outbox), Arc::clone(&progress));
        tasks.spawn(async move {
            let session = outbox.connect().await.expect("connect a ceiling worker");
            let owner = format!("ceiling-{worker}");
            let lease = Duration::from_secs(300);
            let mut log = WorkerLog {
                rows: 0,
                claims: Vec::new(),
                settle_time: Duration::ZERO,
            };
            // The relay raises its floors with its statistics every few seconds; do the same
            // here so the ceiling runs the relay's SQL as the relay runs it.
            let mut cursor: Option<String> = None;
            let mut floor_read = Instant::now() - Duration::from_secs(60);
            loop {
                if floor_read.elapsed() >= Duration::from_secs(5) {
                    session.stats().await.expect("ceiling stats");
                    floor_read = Instant::now();
                }
                let t = Instant::now();
                let request = ClaimRequest {
                    limit: batch,
                    owner: owner.clone(),
                    lease,
                    budget_bytes: i64::MAX,
                    cursor: cursor.take(),
                    catching_up: false,
                };
                let claimed = session.claim(&request).await.expect("ceiling claim");
                cursor = claimed.cursor;
                let claimed = claimed.rows;
                let took = t.elapsed();
                if claimed.is_empty() {
                    break;
                }
                let before = progress.fetch_add(claimed.len() as u64, Ordering::Relaxed);
                log.claims.push((before, took));
                let settlement = Settlement {
                    sent: claimed
                        .iter()
                        .map(|r| SentRow {
                            id: r.id,
                            lease_token: r.lease_token,
                            // As long as an SQS MessageId.
                            message_id: format!("00000000-0000-4000-8000-{:012x}", r.id),
                        })
                        .collect(),
                    ..Settlement::default()
                };
                let t = Instant::now();
                let settled = session
                    .write_settlement(&owner, &settlement, false)
                    .await
                    .expect("ceiling settle");
                log.settle_time += t.elapsed();
                assert_eq!(
                    settled.sent,
                    claimed.len() as u64,
                    "every claimed row settles"
                );
                log.rows += settled.sent;
            }
            log
        });
    }
    let (mut rows, mut settle_time) = (0u64, Duration::ZERO);
    let mut claims: Vec<(u64, Duration)> = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let log = done.expect("ceiling worker");
        rows += log.rows;
        settle_time += log.settle_time;
        claims.extend(log.claims);
    }
    let seconds = started.elapsed().as_secs_f64();
    let mean_ms = |durations: &[Duration]| {
        durations.iter().sum::<Duration>().as_secs_f64() * 1000.0 / durations.len().max(1) as f64
    };
    let mut tenths: Vec<Vec<Duration>> = vec![Vec::new(); 10];
    for &(before, took) in &claims {
        let tenth = (before * 10 / backlog.max(1)).min(9) as usize;
        tenths[tenth].push(took);
    }
    let all: Vec<Duration> = claims.iter().map(|&(_, took)| took).collect();
    Ceiling {
        ordered,
        minimal: false,
        batch,
        workers,
        rows,
        seconds,
        claim_ms: mean_ms(&all),
        settle_ms: settle_time.as_secs_f64() * 1000.0 / claims.len().max(1) as f64,
        claim_ms_by_tenth: tenths.iter().map(|t| mean_ms(t)).collect(),
    }
}

/// The least PostgreSQL allows a relay with a lease: lease up to `batch` unsent rows in id
/// order (`FOR UPDATE SKIP LOCKED`), then mark them sent by id, on one connection, until the
/// backlog is gone. Same table, indexes and backlog as the relay's own ceiling; no fencing
/// token, no attempts, no ordering by the claim's RETURNING.
pub async fn minimal_ceiling(db: &TestDb, batch: i64, backlog: u64) -> Ceiling {
    let client = db.client().await;
    // As the relay does, so neither ceiling pays for a generic plan (MEASURED.md trap 1).
    client
        .batch_execute("SET plan_cache_mode = force_custom_plan")
        .await
        .expect("plan cache mode");
    let claim = client
        .prepare(
            "UPDATE outbox SET lease_owner = $2, lease_until = now() + interval '5 minutes' \
             WHERE id IN (SELECT id FROM outbox \
                          WHERE sent_at IS NULL AND quarantined_at IS NULL \
                            AND (lease_until IS NULL OR lease_until < now()) \
                          ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) \
             RETURNING id, event_id, aggregate_id, event_type, payload::text, headers",
        )
        .await
        .expect("prepare the minimal claim");
    let mark = client
        .prepare("UPDATE outbox SET sent_at = now() WHERE id = ANY($1)")
        .await
        .expect("prepare the minimal mark");
    let started = Instant::now();
    let (mut rows, mut claims, mut claim_time, mut settle_time) =
        (0u64, Vec::new(), Duration::ZERO, Duration::ZERO);
    loop {
        let t = Instant::now();
        let claimed = client
            .query(&claim, &[&batch, &"minimal"])
            .await
            .expect("minimal claim");
        let took = t.elapsed();
        if claimed.is_empty() {
            break;
        }
        claims.push((rows, took));
        claim_time += took;
        let ids: Vec<i64> = claimed.iter().map(|r| r.get(0)).collect();
        let t = Instant::now();
        let marked = client.execute(&mark, &[&ids]).await.expect("minimal mark");
        settle_time += t.elapsed();
        assert_eq!(marked, ids.len() as u64, "every claimed row is marked");
        rows += marked;
    }
    let seconds = started.elapsed().as_secs_f64();
    let n = claims.len().max(1) as f64;
    let mut tenths: Vec<Vec<Duration>> = vec![Vec::new(); 10];
    for &(before, took) in &claims {
        tenths[(before * 10 / backlog.max(1)).min(9) as usize].push(took);
    }
    let mean_ms =
        |d: &[Duration]| d.iter().sum::<Duration>().as_secs_f64() * 1000.0 / d.len().max(1) as f64;
    Ceiling {
        ordered: false,
        minimal: true,
        batch,
        workers: 1,
        rows,
        seconds,
        claim_ms: claim_time.as_secs_f64() * 1000.0 / n,
        settle_ms: settle_time.as_secs_f64() * 1000.0 / n,
        claim_ms_by_tenth: tenths.iter().map(|t| mean_ms(t)).collect(),
    }
}

/// An open-loop schedule: event n (from 1) is due at `start + (n - 1) / rate`, whatever
/// happened to the ones before it, until `start + duration`.
#[derive(Clone, Copy, Debug)]
pub struct Pacing {
    /// When event 1 is due.
    pub start: Instant,
    /// Events per second.
    pub rate: f64,
    /// How long events keep coming due.
    pub duration: Duration,
}

impl Pacing {
    /// When event `n` (from 1) is due.
    pub fn due(&self, n: u64) -> Instant {
        self.start + Duration::from_secs_f64(n.saturating_sub(1) as f64 / self.rate)
    }

    /// How many events come due.
    pub fn events(&self) -> u64 {
        (self.rate * self.duration.as_secs_f64()).round() as u64
    }

    /// When the last one is due at the latest.
    pub fn end(&self) -> Instant {
        self.start + self.duration
    }
}

/// What a steady producer did: when each event's transaction had committed.
pub struct Produced {
    /// `commits[n - 1]` is when `INSERT … event n` returned (autocommit: after COMMIT).
    pub commits: Vec<Option<Instant>>,
    /// From the first due event to the last commit.
    pub seconds: f64,
    /// Event n was due at `start + (n - 1) / rate`: a commit long after that says the producers,
    /// not the relay, could not keep the rate.
    pub start: Instant,
    /// Events/s the producer aimed at.
    pub rate: u64,
}

impl Produced {
    /// How late each committed event's INSERT returned after it was due, in milliseconds,
    /// sorted.
    pub fn lateness_ms(&self) -> Vec<f64> {
        let mut late: Vec<f64> = self
            .commits
            .iter()
            .enumerate()
            .filter_map(|(i, at)| {
                let due = self.start + Duration::from_secs_f64(i as f64 / self.rate as f64);
                Some(at.as_ref()?.saturating_duration_since(due).as_secs_f64() * 1000.0)
            })
            .collect();
        late.sort_by(f64::total_cmp);
        late
    }
}

/// `application_name` of the producers' and writers' connections, so samplers can tell them
/// from the relay's.
pub const WRITER_APP: &str = "bench-writer";

/// The application's single-row INSERT: a ~300-byte event built by PostgreSQL from `$3`.
pub fn insert_sql() -> String {
    insert_sql_into("outbox")
}

/// [`insert_sql`] into `table` (an SQL name, quoted where it needs to be).
pub fn insert_sql_into(table: &str) -> String {
    format!(
        "INSERT INTO {table} (event_id, aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES ($1, 'order', $2, 'order.paid', {}, {})",
        with_n(PAYLOAD_SQL, "$3::bigint"),
        with_n(HEADERS_SQL, "$3::bigint"),
    )
}

/// A connection for a producer or writer, named [`WRITER_APP`].
pub async fn writer_client(db: &TestDb) -> tokio_postgres::Client {
    let client = db.client().await;
    client
        .batch_execute(&format!("SET application_name = '{WRITER_APP}'"))
        .await
        .expect("name the writer connection");
    client
}

/// Inserts events `{prefix}-1` … at `rate` per second for `duration`, one row per
/// transaction, spread over `connections` so that a commit's round trip does not cap the
/// rate. Open loop: event n is due at start + n / rate whatever happened to the ones before
/// it. `committed` counts commits as they happen, for samplers.
pub async fn produce(
    db: &TestDb,
    prefix: &str,
    rate: u64,
    duration: Duration,
    connections: usize,
    committed: Arc<AtomicU64>,
) -> Produced {
    let next = Arc::new(AtomicU64::new(1));
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(writer_client(db).await);
    }
    let start = Instant::now() + Duration::from_millis(20);
    let pacing = Pacing {
        start,
        rate: rate as f64,
        duration,
    };
    let total = pacing.events();
    // Producers that cannot keep the rate (e.g. commits serialized by NOTIFY) stop here
    // rather than stretching the run; events never started are not counted.
    let give_up = start + duration + duration / 5 + Duration::from_secs(1);
    let insert = insert_sql();
    let mut tasks = tokio::task::JoinSet::new();
    for client in clients {
        let (next, insert, committed) = (Arc::clone(&next), insert.clone(), Arc::clone(&committed));
        let prefix = prefix.to_string();
        tasks.spawn(async move {
            let statement = client.prepare(&insert).await.expect("prepare insert");
            let mut done = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n > total || Instant::now() > give_up {
                    return done;
                }
                tokio::time::sleep_until(pacing.due(n).into()).await;
                let event_id = format!("{prefix}-{n}");
                let group = (n % GROUPS).to_string();
                client
                    .execute(&statement, &[&event_id, &group, &(n as i64)])
                    .await
                    .expect("steady insert");
                committed.fetch_add(1, Ordering::Relaxed);
                done.push((n, Instant::now()));
            }
        });
    }
    let mut commits = vec![None; total as usize];
    while let Some(done) = tasks.join_next().await {
        for (n, at) in done.expect("producer") {
            commits[(n - 1) as usize] = Some(at);
        }
    }
    // Events never started (given up) are not part of the run.
    while commits.last().is_some_and(Option::is_none) {
        commits.pop();
    }
    Produced {
        commits,
        seconds: start.elapsed().as_secs_f64(),
        start,
        rate,
    }
}

/// Writers inserting events `{prefix}-1` … on a [`Pacing`], one row per transaction, over
/// several connections so that a commit's round trip does not cap the rate.
pub struct PacedWriters {
    /// Their schedule.
    pub pacing: Pacing,
    /// One task per connection; each returns its commits, and its client, so that the
    /// connection (and its backend, whose CPU a window counts) lives until [`Self::finish`].
    tasks: tokio::task::JoinSet<(Vec<(u64, Instant)>, tokio_postgres::Client)>,
}

impl PacedWriters {
    /// Connects `connections` writers, then starts the schedule of `rate` events/s for
    /// `duration`. No event is started after the schedule's end, so writers that cannot keep
    /// the rate write fewer events rather than stretching the run.
    pub async fn start(
        db: &TestDb,
        prefix: &str,
        connections: usize,
        rate: f64,
        duration: Duration,
    ) -> PacedWriters {
        let mut clients = Vec::new();
        for _ in 0..connections.max(1) {
            let client = writer_client(db).await;
            let statement = client.prepare(&insert_sql()).await.expect("prepare insert");
            clients.push((client, statement));
        }
        let pacing = Pacing {
            // A little ahead, so that the first event is not already late when the tasks start.
            start: Instant::now() + Duration::from_millis(20),
            rate,
            duration,
        };
        let next = Arc::new(AtomicU64::new(1));
        let mut tasks = tokio::task::JoinSet::new();
        for (client, statement) in clients {
            let (next, prefix) = (Arc::clone(&next), prefix.to_string());
            tasks.spawn(async move {
                let mut done = Vec::new();
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n > pacing.events() || Instant::now() > pacing.end() {
                        return (done, client);
                    }
                    tokio::time::sleep_until(pacing.due(n).into()).await;
                    let event_id = format!("{prefix}-{n}");
                    let group = (n % GROUPS).to_string();
                    client
                        .execute(&statement, &[&event_id, &group, &(n as i64)])
                        .await
                        .expect("paced insert");
                    done.push((n, Instant::now()));
                }
            });
        }
        PacedWriters { pacing, tasks }
    }

    /// Every commit (event number, when its INSERT returned), once all writers are done.
    pub async fn finish(mut self) -> Vec<(u64, Instant)> {
        let mut commits = Vec::new();
        while let Some(done) = self.tasks.join_next().await {
            commits.extend(done.expect("paced writer").0);
        }
        commits
    }
}

/// What closed-loop writers did.
pub struct Written {
    /// (event number, when its INSERT returned) of every commit, also those after the end.
    pub commits: Vec<(u64, Instant)>,
    /// Commits that returned within the measured time.
    pub committed_in_time: u64,
    /// The measured time.
    pub seconds: f64,
}

impl Written {
    pub fn commits_per_second(&self) -> f64 {
        self.committed_in_time as f64 / self.seconds
    }
}

/// `writers` connections each inserting one row per transaction (autocommit) as fast as
/// their commits return, like pgbench, for `duration`. Events are `{prefix}-1`, `{prefix}-2`,
/// … in the order they were started.
pub async fn closed_loop(db: &TestDb, prefix: &str, writers: usize, duration: Duration) -> Written {
    let mut clients = Vec::new();
    for _ in 0..writers {
        let client = writer_client(db).await;
        let statement = client.prepare(&insert_sql()).await.expect("prepare insert");
        clients.push((client, statement));
    }
    let next = Arc::new(AtomicU64::new(1));
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for (client, statement) in clients {
        let next = Arc::clone(&next);
        let prefix = prefix.to_string();
        tasks.spawn(async move {
            let mut done = Vec::new();
            while Instant::now() < end {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let event_id = format!("{prefix}-{n}");
                let group = (n % GROUPS).to_string();
                client
                    .execute(&statement, &[&event_id, &group, &(n as i64)])
                    .await
                    .expect("writer insert");
                done.push((n, Instant::now()));
            }
            done
        });
    }
    let mut commits = Vec::new();
    while let Some(done) = tasks.join_next().await {
        commits.extend(done.expect("writer"));
    }
    let committed_in_time = commits.iter().filter(|(_, at)| *at <= end).count() as u64;
    Written {
        commits,
        committed_in_time,
        seconds: duration.as_secs_f64(),
    }
}

/// Events `{prefix}-1` … `{prefix}-{rows}`, each the application's single-row INSERT in a
/// transaction of its own, over `connections` writers as fast as their commits return.
pub async fn insert_events(db: &TestDb, prefix: &str, rows: u64, connections: usize) {
    let next = Arc::new(AtomicU64::new(1));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let client = writer_client(db).await;
        let statement = client.prepare(&insert_sql()).await.expect("prepare insert");
        let (next, prefix) = (Arc::clone(&next), prefix.to_string());
        tasks.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n > rows {
                    return;
                }
                let event_id = format!("{prefix}-{n}");
                let group = (n % GROUPS).to_string();
                client
                    .execute(&statement, &[&event_id, &group, &(n as i64)])
                    .await
                    .expect("insert an event");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("writer");
    }
}

// Run by selftest.rs (`cargo test --bench relay`): the bench has no libtest harness.
pub mod tests {
    use std::time::{Duration, Instant};

    use super::Pacing;

    pub fn pacing_is_by_schedule_from_the_start() {
        let start = Instant::now();
        let p = Pacing {
            start,
            rate: 200.0,
            duration: Duration::from_secs(22),
        };
        assert_eq!(p.events(), 4400);
        assert_eq!(p.due(1), start);
        assert_eq!(p.due(201), start + Duration::from_secs(1));
        // Due times are from the start, not from the one before: no drift from rounding.
        assert_eq!(p.due(4401), start + Duration::from_secs(22));
        assert!(p.due(4400) < p.end());
        assert_eq!(p.end(), start + Duration::from_secs(22));
        let odd = Pacing {
            rate: 3.0,
            duration: Duration::from_millis(1500),
            ..p
        };
        assert_eq!(
            odd.events(),
            5,
            "4.5 rounds to 5 (as the steady producer counts)"
        );
    }
}
