//! Cost that follows the work, not the history (docs/guarantees.md, "Seek, never walk").
//!
//! While anything holds the vacuum horizon back, the index entries of settled rows and claims
//! stay, unremovable and unmarkable. The relay's claims, looks and statistics start at its
//! floors (src/outbox/floors.rs) and so read what is there now, not what was settled since the
//! horizon was taken; measured here in buffers, beside the same statement from the start of the
//! index, which must read the history (so the test can tell the two apart).
//!
//! And the floors must never lose a row that commits late below them: a transaction open
//! across many claims, a row under a released savepoint, a prepared transaction, ids a session
//! cached from the sequence. Each is delivered by the sweep; with the sweep out of the way
//! (`--sweep-interval 1h`) each of these tests fails, the late row never sent.

use std::time::Duration;

use outbox_relay::outbox::{ClaimRequest, Maintenance, Outbox, Registration, Session, PLANS};
use outbox_relay::row::{SentRow, Settlement};

use crate::scenario::{
    count, events, insert, migrate_with, migrated_db, run_args, set_arg, wait_count,
};
use crate::support::pg::PrivatePg;
use crate::support::{create_queue, pg, sqs, RelayProcess, TcpProxy, TestDb};

/// Buffers (shared, hit or read) the statement `sql` touched, run with `params` (SQL
/// literals) under the relay's planner settings, inside a transaction that is rolled back.
async fn buffers(client: &tokio_postgres::Client, sql: &str, params: &[String]) -> i64 {
    touched(&analyzed(client, sql, params).await)
}

/// Buffers (shared, hit or read) an EXPLAIN ANALYZE node and its children touched.
fn touched(node: &serde_json::Value) -> i64 {
    node["Shared Hit Blocks"].as_i64().unwrap() + node["Shared Read Blocks"].as_i64().unwrap()
}

/// The node of `plan` that computes the CTE `name`.
fn cte<'a>(plan: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    if plan["Subplan Name"].as_str() == Some(&format!("CTE {name}")) {
        return Some(plan);
    }
    plan["Plans"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|p| cte(p, name))
}

/// The plan EXPLAIN (ANALYZE, BUFFERS) shows for the statement `sql` run as [`buffers`] runs it.
async fn analyzed(
    client: &tokio_postgres::Client,
    sql: &str,
    params: &[String],
) -> serde_json::Value {
    client.batch_execute(PLANS).await.unwrap();
    client.batch_execute("BEGIN").await.unwrap();
    client
        .batch_execute(&format!("PREPARE measured AS {sql}"))
        .await
        .unwrap();
    let explain = format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE measured({})",
        params.join(", ")
    );
    let row = client.query_one(&explain, &[]).await.unwrap();
    client.batch_execute("ROLLBACK").await.unwrap();
    client.batch_execute("DEALLOCATE ALL").await.unwrap();
    let plan: serde_json::Value = row.get(0);
    plan[0]["Plan"].clone()
}

/// What pg_dump does: a session holding one read-only snapshot open, no transaction id. It
/// holds the vacuum horizon until the caller commits on it.
async fn hold_snapshot(db: &TestDb) -> tokio_postgres::Client {
    let dump = db.client().await;
    dump.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class")
        .await
        .unwrap();
    dump
}

/// 5,000 rows sent and settled (deleted) and 500 claims made and settled while a read-only
/// snapshot is held: their entries stay. Returns the session holding it (commit to release).
async fn settle_under_a_held_snapshot(db: &TestDb) -> tokio_postgres::Client {
    let app = db.client().await;
    let dump = hold_snapshot(db).await;
    insert(&app, &events("settled", 5_000, 50), Duration::ZERO).await;
    app.batch_execute("DELETE FROM outbox").await.unwrap();
    app.batch_execute(
        "INSERT INTO outbox_claims (owner, until, ids) \
         SELECT 'gone', now() + interval '1 hour', ARRAY[g::bigint] FROM generate_series(1, 500) AS g; \
         DELETE FROM outbox_claims",
    )
    .await
    .unwrap();
    dump
}

/// Three rows wait past `settled_rows` settled rows and `settled_claims` settled claims: the
/// statistics raise `outbox`'s rows' floor to the first of them, and a claim of one row its
/// claims' floor to its own claim. Returns the session (its claim still live).
async fn raise_floors(outbox: &Outbox, settled_rows: i64, settled_claims: i64) -> Session {
    let session = outbox.connect().await.unwrap();
    let stats = session.stats().await.unwrap();
    assert_eq!(stats.unsent, 3);
    let claimed = session
        .claim(&ClaimRequest {
            limit: 1,
            owner: "horizon".into(),
            lease: Duration::from_secs(60),
            budget_bytes: i64::MAX,
            cursor: None,
            catching_up: false,
        })
        .await
        .unwrap();
    assert_eq!(claimed.rows.len(), 1);
    let (floor, claims_floor) = (outbox.floors().rows(), outbox.floors().claims());
    assert!(
        floor > settled_rows,
        "the rows' floor is past the settled rows: {floor}"
    );
    assert!(
        claims_floor > settled_claims,
        "the claims' floor is past the settled claims: {claims_floor}"
    );
    session
}

/// The relay's statement named `name`, as its session prepares it.
fn statement(outbox: &Outbox, name: &str) -> String {
    outbox
        .relay_statements()
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no statement {name}"))
        .sql
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_looks_and_statistics_seek_past_what_a_held_horizon_keeps() {
    let db = migrated_db().await;
    let dump = settle_under_a_held_snapshot(&db).await;
    assert_claims_and_looks_seek(&db, 5_000, 500).await;
    dump.batch_execute("COMMIT").await.unwrap();
}

/// `status` reads from the floors the live relays published at their last renewal (the
/// registry's `unsent_floor` and `claims_floor`): the same numbers as from the start, a few
/// buffers where the start reads what 5,000 settled rows and 500 claims left. A live relay
/// that published none (older than schema version 5), or one that does not claim, sends it
/// back to the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reads_from_the_floors_the_live_relays_published() {
    let db = migrated_db().await;
    let app = db.client().await;
    let dump = settle_under_a_held_snapshot(&db).await;
    insert(&app, &events("waiting", 3, 3), Duration::ZERO).await;

    // A relay's statistics and a claim raise its floors; its renewal publishes them.
    let relay = Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(5)).unwrap();
    let session = raise_floors(&relay, 5_000, 500).await;
    let (floor, claims_floor) = (relay.floors().rows(), relay.floors().claims());
    relay
        .renew(
            &session,
            &Registration::starting("horizon", Duration::from_secs(60)),
        )
        .await
        .unwrap();

    let admin = Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(5)).unwrap();
    let status = admin.status().await.unwrap();
    assert_eq!(
        (status.unsent, status.leased, status.unsent_counted_from_id),
        (3, 1, floor),
        "status counts the waiting rows from the published floor"
    );
    assert!(status.oldest_unsent_age_seconds > 0.0);

    let measure = db.client().await;
    let sql = admin.status_sql().unwrap();
    let from_floors = buffers(
        &measure,
        &sql,
        &[floor.to_string(), claims_floor.to_string()],
    )
    .await;
    let from_start = buffers(&measure, &sql, &["0".into(), "0".into()]).await;
    println!(
        "status: {from_floors} buffers from the published floors, {from_start} from the start"
    );
    assert!(
        from_start >= 60 && from_floors * 5 < from_start,
        "status: from the floors it read {from_floors} buffers, from the start {from_start}"
    );

    // A live relay that publishes no floor, or one that does not claim (row-level security
    // may hide rows below its floor from it): status reads from the start, and counts the same.
    for (publishes, claiming) in [(false, true), (true, false)] {
        app.batch_execute(&format!(
            "DELETE FROM outbox_relays WHERE relay_id = 'other'; \
             INSERT INTO outbox_relays (relay_id, version, host, started_at, claiming, seen_until, \
                                        unsent_floor, claims_floor) \
             VALUES ('other', '0.2.0', 'h', now(), {claiming}, now() + interval '1 minute', \
                     {floor}, {floor})",
            floor = if publishes { "100000" } else { "NULL" },
        ))
        .await
        .unwrap();
        let status = admin.status().await.unwrap();
        assert_eq!(
            (status.unsent, status.leased, status.unsent_counted_from_id),
            (3, 1, 0),
            "another live relay publishing a floor: {publishes}, claiming: {claiming}"
        );
    }
    dump.batch_execute("COMMIT").await.unwrap();
}

/// The walks over a key's values start at the rows' floor too: the ordered claim's `others`
/// (the group key's values after its cursor) and the fair claims' values of the fair key
/// (sql/fair_values.sql). A held horizon keeps the index entries of settled rows, and they come
/// first in each key's (key, id) order, so a step from one key to the next read each of them
/// and its heap tuple to learn it was dead; from the floor they are turned away in the index.
/// Measured per CTE of the claim, beside the same claim with the floor at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_walks_turn_away_the_settled_rows_entries_from_the_floor() {
    use outbox_relay::outbox::{ClaimStrategy, OrderBy, OrderScope, Ordered};
    use outbox_relay::row::KeyColumn;
    let db = migrated_db().await;
    migrate_with(&db, &["--fair-by", "event_type"]).await;
    let app = db.client().await;
    let dump = hold_snapshot(&db).await;
    // 5,000 rows of 50 groups and two event types, settled while the snapshot is held; then
    // three waiting rows, in three of those groups.
    insert(&app, &events("settled", 5_000, 50), Duration::ZERO).await;
    app.batch_execute("DELETE FROM outbox").await.unwrap();
    insert(&app, &events("waiting", 3, 3), Duration::ZERO).await;
    let floor: i64 = app
        .query_one("SELECT min(id) FROM outbox", &[])
        .await
        .unwrap()
        .get(0);
    let ordered = Ordered {
        key: KeyColumn::AggregateId,
        routing: Default::default(),
        skip_poison: false,
        scope: OrderScope::Every,
        by: OrderBy::Id,
    };
    let cases = [
        (
            "fair",
            ClaimStrategy::Fair {
                key: KeyColumn::EventType,
            },
            vec!["keys"],
        ),
        (
            "ordered fair",
            ClaimStrategy::OrderedFair {
                ordered,
                fair: KeyColumn::EventType,
            },
            vec!["keys", "fair_values"],
        ),
    ];
    let measure = db.client().await;
    for (name, strategy, walks) in cases {
        let outbox = Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(5))
            .unwrap()
            .claim_strategy(strategy)
            .unwrap();
        let claim = statement(&outbox, "claim");
        // limit, owner, lease, budget, the rows' floor, [window, cursor, keys per claim,]
        // largest payload, attempts, the claims' floor.
        let params = |floor: i64| {
            let mut p: Vec<String> = ["10", "'horizon'", "60", "1000000"]
                .map(String::from)
                .to_vec();
            p.push(floor.to_string());
            if name == "ordered fair" {
                p.extend(["1000", "NULL", "100"].map(String::from));
            }
            p.extend(["1000000", "100", "0"].map(String::from));
            p
        };
        let (from_floor, from_start) = (
            analyzed(&measure, &claim, &params(floor)).await,
            analyzed(&measure, &claim, &params(0)).await,
        );
        for walk in walks {
            let (f, s) = (
                touched(cte(&from_floor, walk).unwrap_or_else(|| panic!("{name}: no CTE {walk}"))),
                touched(cte(&from_start, walk).unwrap()),
            );
            println!("{name}, {walk}: {f} buffers from the floor, {s} from the start");
            // From the start each settled row's entry sends the walk to its heap tuple; from
            // the floor only the index pages are read.
            assert!(
                s >= 300 && f * 5 < s,
                "{name}, {walk}: from the floor the walk read {f} buffers, from the start {s}"
            );
        }
    }
    dump.batch_execute("COMMIT").await.unwrap();
}

/// Retention (`--retention`) under a held horizon: each pass starts a margin below the newest
/// `sent_at` it deleted (src/outbox/floors.rs), so the entries of the 5,000 rows it deleted
/// before are not read again (measured in buffers beside the same statement from the first
/// sent row); a row whose `sent_at` is older than where a pass starts (its settlement
/// committed late) is deleted by the pass that starts from the first row, one in ten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_seeks_past_the_rows_it_deleted_and_a_pass_from_the_first_row_takes_what_is_below(
) {
    use outbox_relay::outbox::FULL_RETENTION_PASS;
    let db = migrated_db().await;
    let app = db.client().await;
    let dump = hold_snapshot(&db).await;
    // `rows` events named `name`, sent at `sent_at` plus `step` per id.
    let sent = |name: &'static str, rows: i64, sent_at: &'static str, step: &'static str| {
        let app = &app;
        async move {
            insert(app, &events(name, rows as usize, 10), Duration::ZERO).await;
            app.execute(
                &format!(
                    "UPDATE outbox SET sent_at = {sent_at} + id * interval '{step}'
                     WHERE event_id LIKE $1 || '%'"
                ),
                &[&name],
            )
            .await
            .unwrap();
        }
    };
    // Sent over 14 hours, far more than the margin the next pass starts below the newest.
    sent("old", 5_000, "now() - interval '20 hours'", "10 seconds").await;
    let outbox = std::sync::Arc::new(
        Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(5)).unwrap(),
    );
    let maintenance = Maintenance::new(outbox.clone(), Duration::from_secs(30));
    let retention = Duration::from_secs(3600);
    // One pass as the relay runs it (src/relay/maintenance.rs): batches, each from where the one
    // before got to.
    let pass = || async {
        let mut from = outbox.floors().retention_start();
        let mut deleted = 0;
        loop {
            let (n, newest) = maintenance
                .delete_expired(retention, 1_000, from)
                .await
                .unwrap();
            deleted += n;
            from = newest.or(from);
            if n < 1_000 {
                return deleted;
            }
        }
    };
    assert_eq!(pass().await, 5_000);

    sent("new", 10, "now() - interval '2 hours'", "1 ms").await;
    // Sent long ago by a settlement that committed only now.
    sent("late", 1, "now() - interval '21 hours'", "1 ms").await;
    let sql = include_str!("../sql/delete_expired.sql").replace("{table}", "\"outbox\"");
    let measure = db.client().await;
    let start = outbox.floors().retention_start();
    let start_sql = |t: Option<std::time::SystemTime>| match t {
        Some(t) => format!(
            "to_timestamp({})",
            t.duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs_f64()
        ),
        None => "NULL".to_string(),
    };
    let params = |t| vec!["3600".to_string(), "1000".to_string(), start_sql(t)];
    let (from_floor, from_first) = (
        buffers(&measure, &sql, &params(start)).await,
        buffers(&measure, &sql, &params(None)).await,
    );
    println!("retention: {from_floor} buffers from its floor, {from_first} from the first row");
    assert!(start.is_some(), "the second pass starts at a floor");
    assert!(
        // From its floor: the index pages, the new rows' and the last margin's deleted rows'.
        from_first >= 300 && from_floor * 5 < from_first,
        "from its floor the pass read {from_floor} buffers, from the first row {from_first}"
    );
    // The pass from that floor: the new rows go, the late one stays.
    let mut from = start;
    let (n, newest) = maintenance
        .delete_expired(retention, 1_000, from)
        .await
        .unwrap();
    from = newest.or(from);
    assert_eq!(n, 10);
    assert_eq!(count(&app, "event_id LIKE 'late%'").await, 1);
    assert_eq!(
        maintenance
            .delete_expired(retention, 1_000, from)
            .await
            .unwrap()
            .0,
        0
    );
    // Up to the pass from the first row, which takes it.
    for _ in 2..FULL_RETENTION_PASS {
        assert_eq!(pass().await, 0);
    }
    assert_eq!(pass().await, 1, "the pass from the first row");
    assert_eq!(count(&app, "true").await, 0);
    dump.batch_execute("COMMIT").await.unwrap();
}

/// A standby with `hot_standby_feedback = on` running a long query holds the primary's horizon
/// as a snapshot on the primary would: the relay delivers 3,000 rows meanwhile, and what it
/// left behind costs its claims and looks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standbys_long_query_under_hot_standby_feedback_costs_the_claims_nothing() {
    let primary = PrivatePg::start_with(&["hot_standby_feedback=on"]).await;
    let db = primary.create_db().await;
    crate::scenario::migrate(&db, "outbox").await;
    let standby = primary.standby().await;
    let report = crate::support::pg::connect(&standby.url(&db.name)).await;
    let admin = db.client().await;
    crate::support::wait_until("the standby streams", Duration::from_secs(30), || async {
        report
            .query_one("SELECT count(*) FROM outbox", &[])
            .await
            .is_ok()
    })
    .await;
    report
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM outbox")
        .await
        .unwrap();
    crate::support::wait_until(
        "the standby's feedback holds the primary's horizon",
        Duration::from_secs(30),
        || async {
            admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_replication WHERE backend_xmin IS NOT NULL",
                    &[],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
                == 1
        },
    )
    .await;
    let queue = create_queue("horizon-standby", &[]).await;
    let relay = RelayProcess::spawn(&run_args(&db, &queue, sqs().endpoint(), &[]), &[]);
    relay.metrics_addr(Duration::from_secs(30)).await;
    for batch in 0..30 {
        insert(
            &admin,
            &events(&format!("standby-{batch}"), 100, 20),
            Duration::ZERO,
        )
        .await;
    }
    wait_count(
        &admin,
        "sent_at IS NOT NULL",
        3_000,
        Duration::from_secs(60),
    )
    .await;
    relay.sigterm();
    relay.wait_exit(Duration::from_secs(30)).await;
    // The horizon is held: VACUUM removes none of the 3,000 sent rows' old versions.
    admin.batch_execute("VACUUM outbox").await.unwrap();
    let dead: i64 = admin
        .query_one(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        dead >= 2_900,
        "the standby's feedback holds {dead} dead rows"
    );
    assert_claims_and_looks_seek(&db, 3_000, 1).await;
    report.batch_execute("COMMIT").await.unwrap();
}

/// Three rows wait behind `settled_rows` rows (and `settled_claims` claims) settled under a
/// held horizon. A relay's floors, raised by its statistics and a claim of one row, let its
/// claim, probe and statistics read a few buffers, where the same statements from the start of
/// the indexes read the settled rows' pages: measured side by side.
async fn assert_claims_and_looks_seek(db: &TestDb, settled_rows: i64, settled_claims: i64) {
    let app = db.client().await;
    insert(&app, &events("waiting", 3, 3), Duration::ZERO).await;
    let outbox = Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(5)).unwrap();
    let _session = raise_floors(&outbox, settled_rows, settled_claims).await;
    let (floor, claims_floor) = (outbox.floors().rows(), outbox.floors().claims());

    let measure = db.client().await;
    let probe = statement(&outbox, "probe");
    let stats_sql = statement(&outbox, "stats");
    let claim = statement(&outbox, "claim");
    let claim_params = |floor: i64, claims_floor: i64| {
        [
            "10",
            "'horizon'",
            "60",
            "1000000",
            &floor.to_string(),
            "1000000",
            "100",
            &claims_floor.to_string(),
        ]
        .map(String::from)
        .to_vec()
    };
    let cases = [
        (
            "probe",
            buffers(
                &measure,
                &probe,
                &[floor.to_string(), claims_floor.to_string()],
            )
            .await,
            buffers(&measure, &probe, &["0".into(), "0".into()]).await,
        ),
        (
            "stats",
            buffers(&measure, &stats_sql, &["10000".into(), floor.to_string()]).await,
            buffers(&measure, &stats_sql, &["10000".into(), "0".into()]).await,
        ),
        (
            "claim",
            buffers(&measure, &claim, &claim_params(floor, claims_floor)).await,
            buffers(&measure, &claim, &claim_params(0, 0)).await,
        ),
    ];
    for (name, from_floors, from_start) in cases {
        println!("{name}: {from_floors} buffers from the floors, {from_start} from the start");
        // From the start, the statement reads the pages of the settled rows (about a
        // hundred); from the floors, a few index pages and the waiting rows'.
        assert!(
            from_start >= 60,
            "{name}: from the start of the index it should read the settled rows' pages: {from_start} buffers"
        );
        // The claim read 38 buffers from its floors alone and 42 with the whole suite running
        // beside it (the lease table's pages vary with the claims made meanwhile): the bound is
        // a few index pages and the waiting rows', against the hundreds from the start.
        assert!(
            from_floors * 5 < from_start && from_floors <= 60,
            "{name}: from the floors it read {from_floors} buffers, from the start {from_start}"
        );
    }
}

/// How a row comes to commit late, below ids the relay has already sent.
#[derive(Clone, Copy, Debug)]
enum Late {
    /// A transaction that inserts its row and stays open across many claims.
    OpenTransaction,
    /// The row inserted under a savepoint released long before the commit.
    ReleasedSavepoint,
    /// A two-phase transaction, prepared, then committed later.
    Prepared,
    /// A session that cached 50 ids of the sequence inserts again after others were sent.
    CachedSequence,
}

/// Writes the late row `late-0` on `late` without committing it, or (cached ids) commits a
/// first row and takes the sequence's next ids into the session's cache.
async fn start_late(late: &tokio_postgres::Client, kind: Late) {
    let row = "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload) \
               VALUES ('late-0', 'order', 'late', 'order.late', '{\"late\":true}')";
    match kind {
        Late::OpenTransaction | Late::Prepared => {
            late.batch_execute(&format!("BEGIN; {row}")).await.unwrap();
        }
        Late::ReleasedSavepoint => {
            late.batch_execute(&format!("BEGIN; SAVEPOINT s; {row}; RELEASE SAVEPOINT s"))
                .await
                .unwrap();
        }
        Late::CachedSequence => {
            late.batch_execute(
                "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload) \
                 VALUES ('late-first', 'order', 'late', 'order.late', '{}')",
            )
            .await
            .unwrap();
        }
    }
    if let Late::Prepared = kind {
        late.batch_execute("PREPARE TRANSACTION 'outbox-late-row'")
            .await
            .unwrap();
    }
}

/// Commits the late row: it is now below the ids the relay sent meanwhile.
async fn commit_late(late: &tokio_postgres::Client, kind: Late) {
    match kind {
        Late::OpenTransaction | Late::ReleasedSavepoint => {
            late.batch_execute("COMMIT").await.unwrap()
        }
        Late::Prepared => late
            .batch_execute("COMMIT PREPARED 'outbox-late-row'")
            .await
            .unwrap(),
        Late::CachedSequence => late
            .batch_execute(
                "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload) \
                 VALUES ('late-0', 'order', 'late', 'order.late', '{\"late\":true}')",
            )
            .await
            .unwrap(),
    }
}

/// A relay sends 60 rows written after the late row began; once its floor has passed the late
/// row's id, the late row commits, and must be sent.
async fn a_late_row_is_delivered(kind: Late) {
    a_late_row_is_delivered_over(kind, None).await;
}

/// [`a_late_row_is_delivered`], the relay's database answering `answer_delay` late (our TCP
/// proxy) when given.
async fn a_late_row_is_delivered_over(kind: Late, answer_delay: Option<Duration>) {
    let db: TestDb = migrated_db().await;
    let app = db.client().await;
    if let Late::CachedSequence = kind {
        app.batch_execute("ALTER TABLE outbox ALTER COLUMN id SET CACHE 50")
            .await
            .unwrap();
    }
    let queue = create_queue("late", &[]).await;
    let proxy = answer_delay.map(|delay| {
        let proxy = TcpProxy::start(pg().port());
        proxy.set_answer_delay(delay);
        proxy
    });
    let relayed = match &proxy {
        Some(proxy) => TestDb {
            name: db.name.clone(),
            url: proxy.url_through(&db.url),
        },
        None => TestDb {
            name: db.name.clone(),
            url: db.url.clone(),
        },
    };
    let mut args = run_args(&relayed, &queue, sqs().endpoint(), &[]);
    set_arg(&mut args, "--sweep-interval", "1s");
    if proxy.is_some() {
        set_arg(&mut args, "--db-timeout", "5s");
    }
    let relay = RelayProcess::spawn(&args, &[]);
    relay.metrics_addr(Duration::from_secs(30)).await;
    let late = db.client().await;
    start_late(&late, kind).await;
    for batch in 0..6 {
        insert(
            &app,
            &events(&format!("on-time-{batch}"), 10, 5),
            Duration::ZERO,
        )
        .await;
    }
    // Over the slow link every round trip takes the delay, the relay's start-up's too (18 s
    // seen on a loaded machine), so the rows get longer to go and the statistics longer to
    // pass them; the late row gets the same 30 s either way.
    let slow = proxy.is_some();
    wait_count(
        &app,
        "event_id LIKE 'on-time-%' AND sent_at IS NOT NULL",
        60,
        Duration::from_secs(if slow { 120 } else { 30 }),
    )
    .await;
    // The relay's floor is past every row sent, so the late row commits below it: the floor
    // the relay publishes in its registry at each renewal, read rather than waited for.
    crate::support::wait_until(
        "the relay's published floor is past the rows sent",
        Duration::from_secs(if slow { 120 } else { 60 }),
        || async {
            app.query_one(
                "SELECT coalesce(max(unsent_floor), 0) > (SELECT max(id) FROM outbox \
                 WHERE event_id LIKE 'on-time-%') FROM outbox_relays",
                &[],
            )
            .await
            .unwrap()
            .get::<_, bool>(0)
        },
    )
    .await;
    commit_late(&late, kind).await;
    let late_id: i64 = app
        .query_one("SELECT id FROM outbox WHERE event_id = 'late-0'", &[])
        .await
        .unwrap()
        .get(0);
    let sent_after: i64 = app
        .query_one(
            "SELECT count(*) FROM outbox WHERE id > $1 AND sent_at IS NOT NULL",
            &[&late_id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        sent_after >= 50,
        "{kind:?}: the late row's id {late_id} is below the rows sent before it ({sent_after})"
    );
    crate::support::wait_until(
        &format!("{kind:?}: the late row sent"),
        Duration::from_secs(30),
        || async { count(&app, "event_id = 'late-0' AND sent_at IS NOT NULL").await == 1 },
    )
    .await;
    assert_eq!(
        count(&app, "sent_at IS NULL").await,
        0,
        "{}",
        relay.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_of_a_transaction_open_across_many_claims_is_sent_when_it_commits() {
    a_late_row_is_delivered(Late::OpenTransaction).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_under_a_savepoint_released_before_the_commit_is_sent() {
    a_late_row_is_delivered(Late::ReleasedSavepoint).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_of_a_prepared_transaction_is_sent_once_committed() {
    a_late_row_is_delivered(Late::Prepared).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_a_session_cached_from_the_sequence_below_rows_already_sent_is_sent() {
    a_late_row_is_delivered(Late::CachedSequence).await;
}

/// The sweep is spaced by the time the database spends on it (at most 1 % of a backend), not
/// by its round trip: over a link whose answers arrive 400 ms late, a hundred round trips
/// were 40 s and more, and a late row waited that long (simulation seed 3831506209721748964:
/// ten rows of two groups still unsent when the run ended, 48 s after the last claim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_row_over_a_slow_link_waits_for_the_sweep_interval_not_a_hundred_round_trips() {
    a_late_row_is_delivered_over(Late::OpenTransaction, Some(Duration::from_millis(400))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writing_transaction_held_open_holds_back_no_other_row_and_its_rollback_nothing() {
    let db = migrated_db().await;
    let app = db.client().await;
    let queue = create_queue("late-rollback", &[]).await;
    let mut args = run_args(&db, &queue, sqs().endpoint(), &[]);
    set_arg(&mut args, "--sweep-interval", "1s");
    let relay = RelayProcess::spawn(&args, &[]);
    relay.metrics_addr(Duration::from_secs(30)).await;
    let open = db.client().await;
    open.batch_execute(
        "BEGIN; INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('rolled-back', 'order', 'x', 'order.x', '{}')",
    )
    .await
    .unwrap();
    insert(&app, &events("beside", 30, 3), Duration::ZERO).await;
    // Every other row goes while the writing transaction is open.
    wait_count(&app, "sent_at IS NOT NULL", 30, Duration::from_secs(30)).await;
    open.batch_execute("ROLLBACK").await.unwrap();
    insert(&app, &events("after", 10, 3), Duration::ZERO).await;
    wait_count(&app, "sent_at IS NOT NULL", 40, Duration::from_secs(30)).await;
    assert_eq!(count(&app, "event_id = 'rolled-back'").await, 0);
    assert_eq!(
        count(&app, "sent_at IS NULL").await,
        0,
        "{}",
        relay.output()
    );
}

/// A cluster of its own (these tests restart it) with a migrated table holding `written`, the
/// application's connection, and the relay's table.
async fn a_cluster_of_its_own(
    written: &[crate::scenario::Event],
) -> (PrivatePg, TestDb, tokio_postgres::Client, Outbox) {
    let cluster = PrivatePg::start().await;
    let db = cluster.create_db().await;
    migrate_with(&db, &[]).await;
    let app = db.client().await;
    insert(&app, written, Duration::ZERO).await;
    let outbox = Outbox::new(&db.url, "outbox".parse().unwrap(), Duration::from_secs(5)).unwrap();
    (cluster, db, app, outbox)
}

/// A claim of up to `limit` rows by the relay `relay`, leased for a minute.
fn relay_request(limit: i64) -> ClaimRequest {
    ClaimRequest {
        limit,
        owner: "relay".into(),
        lease: Duration::from_secs(60),
        budget_bytes: i64::MAX,
        cursor: None,
        catching_up: false,
    }
}

/// The claims' floor assumes tokens only grow, which holds until the server loses
/// transactions: the relay commits its own asynchronously, so a crash (or a promoted standby)
/// can lose its last settlements and claims, and the identity's advance with them: a row the
/// relay settled is unsent again below the rows' floor, and tokens come back below the claims'
/// floor. Here that loss is made by hand, with a claim of a relay that died since holding the
/// row under a token handed out again, and the server restarts: the relay's next claims must
/// read both tables from their start again, take the ended claim over and claim its row. With
/// the floors kept, the row is never claimed (the sweep, which these sessions do not run,
/// would find it below the rows' floor, but then count it free: its claim is below the
/// claims' floor too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_restarted_sends_the_floors_back_to_the_start() {
    let (cluster, _db, app, outbox) = a_cluster_of_its_own(&events("restart", 4, 1)).await;
    let session = outbox.connect().await.unwrap();
    for _ in 0..3 {
        assert_eq!(
            session.claim(&relay_request(1)).await.unwrap().rows.len(),
            1
        );
    }
    // Settled as --retention settles them, then the fourth row claimed: both floors pass
    // the first three rows and their claims.
    app.batch_execute("UPDATE outbox SET sent_at = now() WHERE id <= 3; DELETE FROM outbox_claims")
        .await
        .unwrap();
    let fourth = session.claim(&relay_request(1)).await.unwrap();
    assert_eq!(fourth.rows.iter().map(|r| r.id).collect::<Vec<_>>(), [4]);
    let (floor, claims_floor) = (outbox.floors().rows(), outbox.floors().claims());
    assert!(
        floor > 3 && claims_floor > 3,
        "floors past the first three: {floor}, {claims_floor}"
    );
    drop(session);

    // What a crash that lost the third row's settlement and every claim leaves, and a claim
    // made after it by a relay that died: the identity hands out token 1 again.
    app.batch_execute(
        "UPDATE outbox SET sent_at = NULL WHERE id = 3;
         DELETE FROM outbox_claims;
         ALTER TABLE outbox_claims ALTER COLUMN token RESTART WITH 1;
         INSERT INTO outbox_claims (owner, until, ids) VALUES ('died', now() - interval '1 second', ARRAY[3::bigint])",
    )
    .await
    .unwrap();
    drop(app);
    cluster.restart().await;

    let session = outbox.connect().await.unwrap();
    let mut ids = Vec::new();
    // The first claim after the restart finds it and reads from the old floors; the next
    // ones from the start. Bounded: with the floors kept, no claim finds the third row.
    for _ in 0..5 {
        let claimed = crate::support::claim_taking_over(&session, &relay_request(10)).await;
        ids.extend(claimed.rows.iter().map(|r| r.id));
        if ids.contains(&3) {
            break;
        }
    }
    ids.sort_unstable();
    assert_eq!(
        ids,
        [3, 4],
        "the rows unsent after the restart claimed, the dead relay's included"
    );
}

/// The other half of tokens handed out again after a crash: a settlement of a claim the
/// server lost, written after the restart (a retry, a delivery that was in flight), meets a
/// later claim of the same relay under the same token. It must settle nothing of it: the
/// settlement is fenced by the server its claim was made on too (sql/settle.sql). Without
/// that it would delete the later claim and free its other rows while they are being sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_of_a_claim_the_server_lost_leaves_the_claim_that_took_its_token_alone() {
    let (cluster, db, app, outbox) = a_cluster_of_its_own(&events("lost", 2, 2)).await;
    let session = outbox.connect().await.unwrap();
    let before = session.claim(&relay_request(1)).await.unwrap();
    let (row, token) = (before.rows[0].id, before.rows[0].lease_token);
    let lost = Settlement {
        sent: vec![SentRow {
            id: row,
            lease_token: token,
            message_id: "m".into(),
        }],
        server: before.server,
        lease: Duration::from_secs(60),
        ..Settlement::default()
    };
    drop(session);
    // What a crash that lost the claim leaves: no claim, and its token to be handed out again.
    app.batch_execute(&format!(
        "DELETE FROM outbox_claims;
         ALTER TABLE outbox_claims ALTER COLUMN token RESTART WITH {token}"
    ))
    .await
    .unwrap();
    cluster.restart().await;
    let app = db.client().await;

    let session = outbox.connect().await.unwrap();
    let after = session.claim(&relay_request(10)).await.unwrap();
    assert_eq!(after.rows.len(), 2, "both rows claimed again");
    assert!(
        after.rows.iter().all(|r| r.lease_token == token),
        "under the token handed out again"
    );
    let settled = session
        .write_settlement("relay", &lost, true)
        .await
        .unwrap();
    assert_eq!(settled.sent, 0, "{settled:?}");
    assert_eq!(
        crate::support::count_claims(&app, "true").await,
        1,
        "the later claim still holds its rows"
    );
    assert_eq!(count(&app, "true").await, 2, "no row settled");
}

/// And a clean restart loses nothing: a settlement of a claim made before it, written after
/// it (a delivery in flight across the restart), applies to that claim, which is still there:
/// its row made before the server started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_across_a_clean_restart_settles_its_claim() {
    let (cluster, db, _, outbox) = a_cluster_of_its_own(&events("clean", 2, 2)).await;
    let session = outbox.connect().await.unwrap();
    let before = session.claim(&relay_request(1)).await.unwrap();
    let settlement = Settlement {
        sent: vec![SentRow {
            id: before.rows[0].id,
            lease_token: before.rows[0].lease_token,
            message_id: "m".into(),
        }],
        server: before.server,
        lease: Duration::from_secs(60),
        ..Settlement::default()
    };
    drop(session);
    cluster.restart().await;
    let app = db.client().await;
    let session = outbox.connect().await.unwrap();
    let settled = session
        .write_settlement("relay", &settlement, true)
        .await
        .unwrap();
    assert_eq!((settled.sent, settled.lost), (1, 0), "{settled:?}");
    assert_eq!(crate::support::count_claims(&app, "true").await, 0);
    assert_eq!(
        count(&app, "sent_at IS NULL").await,
        1,
        "the other row waits"
    );
}
