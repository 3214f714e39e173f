//! `migrate` and `migrate --adopt` online: interrupted runs are completed by the next one, a
//! step waiting for a lock lets the application's inserts through, and runs are idempotent.

use outbox_relay::version::NEEDS_SCHEMA;
use std::time::Duration;

use crate::scenario::{args, migrated_db};
use crate::support::{run_to_end, RelayProcess, TestDb};

use crate::support::DEBEZIUM_COLUMNS as COLUMNS;

/// Debezium's outbox-router table with `rows` rows of ~1.5 kB, about five to a page, so that
/// the backfill takes several page ranges.
async fn debezium_table(client: &tokio_postgres::Client, rows: i32) {
    client
        .batch_execute(crate::support::DEBEZIUM_OUTBOX_DDL)
        .await
        .unwrap();
    app_insert(client, rows).await;
}

/// The application's write, which never names the relay's columns.
async fn app_insert(client: &tokio_postgres::Client, rows: i32) -> u64 {
    app_insert_as(client, "order", rows).await
}

async fn app_insert_as(client: &tokio_postgres::Client, aggregate_type: &str, rows: i32) -> u64 {
    client
        .execute(
            "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload)
             SELECT gen_random_uuid(), $2, (g % 7)::text, 'OrderCreated',
                    jsonb_build_object('order', g, 'pad', repeat('x', 1500))
             FROM generate_series(1, $1::int) g",
            &[&rows, &aggregate_type],
        )
        .await
        .unwrap()
}

fn adopt_args(db: &TestDb, extra: &[&str]) -> Vec<String> {
    let mut a = args(&[
        "migrate",
        "--adopt",
        "--database-url",
        &db.url,
        "--table",
        "outboxevent",
    ]);
    a.extend(COLUMNS.iter().map(|s| s.to_string()));
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

async fn scalar_i64(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

async fn scalar_bool(client: &tokio_postgres::Client, sql: &str) -> bool {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

/// The adoption is complete: every row numbered once, the column NOT NULL, its unique index
/// valid, and the relay's view shows every row.
async fn assert_adopted(client: &tokio_postgres::Client) {
    let total = scalar_i64(client, "SELECT count(*) FROM outboxevent").await;
    assert_eq!(
        scalar_i64(client, "SELECT count(DISTINCT outbox_seq) FROM outboxevent").await,
        total,
        "every row has a sequence value of its own"
    );
    assert!(
        scalar_bool(
            client,
            "SELECT attnotnull FROM pg_attribute
             WHERE attrelid = 'outboxevent'::regclass AND attname = 'outbox_seq'"
        )
        .await
    );
    assert!(
        scalar_bool(
            client,
            "SELECT bool_and(indisvalid) AND count(*) = 6 FROM pg_index
             WHERE indrelid = 'outboxevent'::regclass
               AND indexrelid::regclass::text LIKE 'outboxevent_relay_%'"
        )
        .await,
        "the relay's four indexes and the group key's two are valid"
    );
    assert_eq!(
        scalar_i64(client, "SELECT count(*) FROM outboxevent_relay").await,
        total
    );
    assert!(
        !scalar_bool(
            client,
            "SELECT EXISTS (SELECT FROM pg_constraint
                            WHERE conname = 'outboxevent_relay_seq_not_null')"
        )
        .await,
        "the temporary check is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adoption_killed_in_the_backfill_is_completed_by_the_next_run() {
    let db = crate::support::fresh_db().await;
    let client = db.client().await;
    debezium_table(&client, 3000).await;
    // A test device standing in for "the process died here": numbering the table's last row
    // waits for an advisory lock this test holds, so the first page ranges are committed and
    // the last one cannot be.
    let last: String = client
        .query_one(
            "SELECT id::text FROM outboxevent ORDER BY ctid DESC LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    client
        .batch_execute(&format!(
            "CREATE FUNCTION hold_last() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF OLD.id = '{last}' THEN PERFORM pg_advisory_xact_lock(4242); END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER hold_last BEFORE UPDATE ON outboxevent
                 FOR EACH ROW EXECUTE FUNCTION hold_last();"
        ))
        .await
        .unwrap();
    let holder = db.client().await;
    holder
        .batch_execute("SELECT pg_advisory_lock(4242)")
        .await
        .unwrap();

    let migrate = RelayProcess::spawn(&adopt_args(&db, &["--lock-attempts", "1000"]), &[]);
    migrate
        .wait_for_line("trying again", Duration::from_secs(60))
        .await
        .unwrap_or_else(|| panic!("the backfill never waited:\n{}", migrate.output()));
    let numbered = scalar_i64(
        &client,
        "SELECT count(*) FROM outboxevent WHERE outbox_seq IS NOT NULL",
    )
    .await;
    assert!(
        numbered > 0 && numbered < 3000,
        "stopped half-way: {numbered} of 3000 numbered"
    );
    migrate.kill9();
    migrate.wait_exit(Duration::from_secs(10)).await.unwrap();
    assert!(
        scalar_bool(&client, "SELECT to_regclass('outboxevent_relay') IS NULL").await,
        "no view before the adoption is complete: the relay cannot see unnumbered rows"
    );

    // The application keeps writing; its rows are numbered by the default, after every
    // existing row.
    assert_eq!(app_insert_as(&client, "late", 20).await, 20);
    holder
        .batch_execute("SELECT pg_advisory_unlock(4242)")
        .await
        .unwrap();
    client
        .batch_execute("DROP TRIGGER hold_last ON outboxevent")
        .await
        .unwrap();

    let (status, output) = run_to_end(&adopt_args(&db, &[]), &[], Duration::from_secs(120)).await;
    assert!(status.success(), "the second run completes: {output}");
    assert_adopted(&client).await;
    assert!(
        scalar_bool(
            &client,
            "SELECT max(outbox_seq) FILTER (WHERE aggregatetype = 'order')
                  < min(outbox_seq) FILTER (WHERE aggregatetype = 'late')
             FROM outboxevent"
        )
        .await,
        "rows that were there before the adoption come before the ones written during it"
    );
    let (status, output) = run_to_end(&adopt_args(&db, &[]), &[], Duration::from_secs(60)).await;
    assert!(status.success(), "adopt is idempotent: {output}");
    assert!(output.contains("up to date"), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_migrate_waits_for_a_lock_the_applications_inserts_go_through() {
    let db = crate::support::fresh_db().await;
    let client = db.client().await;
    debezium_table(&client, 50).await;
    // A long reader: it blocks the ALTER TABLE (ACCESS EXCLUSIVE), not the inserts.
    let blocker = db.client().await;
    blocker
        .batch_execute("BEGIN; SELECT count(*) FROM outboxevent")
        .await
        .unwrap();

    // Out of tries: one clear line, nothing changed.
    let (status, output) = run_to_end(
        &adopt_args(&db, &["--lock-timeout", "50ms", "--lock-attempts", "2"]),
        &[],
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(status.code(), Some(1), "{output}");
    let error = output
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line: {output}"));
    assert!(
        error.contains("lock was not granted within 50ms in 2 tries"),
        "{error}"
    );
    assert!(
        scalar_bool(
            &client,
            "SELECT NOT EXISTS (SELECT FROM pg_attribute
                                WHERE attrelid = 'outboxevent'::regclass AND attname = 'outbox_seq')"
        )
        .await
    );

    let migrate = RelayProcess::spawn(
        &adopt_args(&db, &["--lock-timeout", "200ms", "--lock-attempts", "1000"]),
        &[],
    );
    migrate
        .wait_for_line("trying again", Duration::from_secs(60))
        .await
        .unwrap_or_else(|| panic!("migrate never waited:\n{}", migrate.output()));
    // Issued while migrate keeps trying: it may queue behind one try, never behind the
    // blocker.
    let insert = tokio::time::timeout(Duration::from_secs(20), app_insert(&client, 5)).await;
    assert_eq!(
        insert.expect("the application's insert completed while the blocker was open"),
        5
    );
    assert!(
        scalar_bool(
            &client,
            "SELECT EXISTS (SELECT FROM pg_stat_activity
                            WHERE state = 'idle in transaction' AND query LIKE 'BEGIN; SELECT count(*)%')"
        )
        .await,
        "the blocker was still open"
    );
    assert!(
        migrate.wait_exit(Duration::ZERO).await.is_none(),
        "migrate keeps trying"
    );

    blocker.batch_execute("COMMIT").await.unwrap();
    let status = migrate
        .wait_exit(Duration::from_secs(120))
        .await
        .expect("migrate finishes once the blocker is gone");
    assert!(status.success(), "{}", migrate.output());
    assert_adopted(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_index_left_by_an_interrupted_build_is_rebuilt() {
    let db = migrated_db().await;
    let client = db.client().await;
    // An interrupted CREATE INDEX CONCURRENTLY leaves an INVALID index under its name; a
    // failed unique build does the same, deterministically.
    client
        .batch_execute(
            "DROP INDEX outbox_unsent_idx;
             INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload)
             VALUES ('a', 't', 'same', 'e', '{}'), ('b', 't', 'same', 'e', '{}');",
        )
        .await
        .unwrap();
    let failed = client
        .batch_execute(
            "CREATE UNIQUE INDEX CONCURRENTLY outbox_unsent_idx ON outbox (aggregate_id)",
        )
        .await;
    assert!(failed.is_err());
    assert!(
        !scalar_bool(
            &client,
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_unsent_idx'::regclass"
        )
        .await
    );

    for _ in 0..2 {
        let (status, output) = run_to_end(
            &args(&["migrate", "--database-url", &db.url]),
            &[],
            Duration::from_secs(60),
        )
        .await;
        assert!(status.success(), "{output}");
        assert!(output.contains("up to date"), "{output}");
    }
    let definition: String = client
        .query_one(
            "SELECT i.indisvalid::text || ' ' || pg_get_indexdef(i.indexrelid)
             FROM pg_index i WHERE i.indexrelid = 'outbox_unsent_idx'::regclass",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        definition,
        "true CREATE INDEX outbox_unsent_idx ON public.outbox USING btree (id) \
         WHERE ((sent_at IS NULL) AND (quarantined_at IS NULL))"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn print_sql_changes_nothing_and_a_table_adopted_the_old_way_is_upgraded_in_place() {
    let db = crate::support::fresh_db().await;
    let client = db.client().await;
    debezium_table(&client, 30).await;
    // The previous adoption: an identity column (a table rewrite) and a view without filter.
    client
        .batch_execute(
            "ALTER TABLE outboxevent
                 ADD COLUMN outbox_seq bigint GENERATED ALWAYS AS IDENTITY,
                 ADD COLUMN created_at timestamptz NOT NULL DEFAULT now(),
                 ADD COLUMN available_at timestamptz NOT NULL DEFAULT now(),
                 ADD COLUMN attempts integer NOT NULL DEFAULT 0,
                 ADD COLUMN lease_owner text, ADD COLUMN lease_until timestamptz,
                 ADD COLUMN lease_token bigint NOT NULL DEFAULT 0,
                 ADD COLUMN sent_at timestamptz, ADD COLUMN message_id text,
                 ADD COLUMN quarantined_at timestamptz, ADD COLUMN quarantine_reason text,
                 ADD COLUMN last_error text;
             CREATE UNIQUE INDEX outboxevent_relay_seq_idx ON outboxevent (outbox_seq);
             CREATE TABLE outbox_relay_schema (table_name text PRIMARY KEY, version integer NOT NULL,
                                               migrated_at timestamptz NOT NULL DEFAULT now());
             INSERT INTO outbox_relay_schema VALUES ('outboxevent_relay', 1);",
        )
        .await
        .unwrap();
    let before = scalar_i64(&client, "SELECT sum(outbox_seq)::bigint FROM outboxevent").await;

    let (status, sql) = run_to_end(
        &adopt_args(&db, &["--print-sql"]),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert!(status.success(), "{sql}");
    // Only what is missing: of the relay's columns, the one schema version 3 added (the
    // others are there, so the statement's IF NOT EXISTS skips them).
    assert!(
        sql.contains("ADD COLUMN IF NOT EXISTS dedup_id text"),
        "only what is missing: {sql}"
    );
    assert!(!sql.contains("UPDATE \"outboxevent\""), "{sql}");
    assert!(
        sql.contains("CREATE INDEX CONCURRENTLY IF NOT EXISTS \"outboxevent_relay_unsent_idx\"")
    );
    assert!(
        scalar_bool(
            &client,
            "SELECT to_regclass('outboxevent_relay_unsent_idx') IS NULL"
        )
        .await,
        "--print-sql created nothing"
    );

    let (status, output) = run_to_end(&adopt_args(&db, &[]), &[], Duration::from_secs(60)).await;
    assert!(status.success(), "{output}");
    assert_eq!(
        scalar_i64(&client, "SELECT sum(outbox_seq)::bigint FROM outboxevent").await,
        before,
        "the identity values stay"
    );
    assert_adopted(&client).await;
}

/// A table name with a backslash and a quote reaches DDL as an escape-string literal (the
/// sequences' `nextval`, the size for `setval`, the recorded version, the migration lock), so
/// it names the same object whatever the server's `standard_conforming_strings`: with it off,
/// a plain `'…\…'` literal would lose the backslash and name another table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_with_a_backslash_and_a_quote_is_adopted_without_standard_conforming_strings() {
    let db = crate::support::fresh_db().await;
    let client = db.client().await;
    let base = r"back\slash'q";
    client
        .batch_execute(crate::support::DEBEZIUM_OUTBOX_DDL)
        .await
        .unwrap();
    app_insert(&client, 3).await;
    client
        .batch_execute(r#"ALTER TABLE outboxevent RENAME TO "back\slash'q""#)
        .await
        .unwrap();
    let url = format!("{}?options=-c%20standard_conforming_strings%3Doff", db.url);
    let mut adopt = args(&[
        "migrate",
        "--adopt",
        "--database-url",
        &url,
        "--table",
        base,
    ]);
    adopt.extend(COLUMNS.iter().map(|s| s.to_string()));
    for _ in 0..2 {
        let (status, output) = run_to_end(&adopt, &[], Duration::from_secs(60)).await;
        assert!(status.success(), "{output}");
    }
    let recorded: Vec<String> = client
        .query("SELECT table_name FROM outbox_relay_schema", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(recorded, [format!("{base}_relay")]);
    assert_eq!(
        scalar_i64(
            &client,
            r#"SELECT count(DISTINCT id) FROM "back\slash'q_relay""#
        )
        .await,
        3,
        "every row numbered and seen through the view"
    );
    // New rows take their numbers from the relay's sequence, found by its literal name.
    client
        .execute(
            r#"INSERT INTO "back\slash'q" (id, aggregatetype, aggregateid, type, payload)
               VALUES (gen_random_uuid(), 'order', '1', 'OrderCreated', '{}')"#,
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        scalar_i64(
            &client,
            r#"SELECT count(*) FROM "back\slash'q_relay" WHERE id > 1000000"#
        )
        .await,
        1
    );
}

/// The key indexes of earlier installs are replaced under new names, concurrently, and then
/// dropped: schema version 1's fair-key index (`<table>_key_<KEY>_idx`) held quarantined rows,
/// and 0.2.0's `order_` and `pending_` indexes held rows of no key, so that statements which
/// never compare the key could read them whole (`KeyIndex::predicate`). Run twice, as a resumed
/// run would be; `check` then finds the new indexes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_indexes_of_an_existing_install_are_replaced_by_ones_only_key_lookups_use() {
    let db = crate::support::fresh_db().await;
    let client = db.client().await;
    let migrate = args(&[
        "migrate",
        "--database-url",
        &db.url,
        "--fair-by",
        "aggregate_type",
    ]);
    let (status, output) = run_to_end(&migrate, &[], Duration::from_secs(60)).await;
    assert!(status.success(), "{output}");
    // The install as 0.2.0 left it, with version 1's fair index for the fair key.
    client
        .batch_execute(
            "DROP INDEX outbox_ordered_aggregate_id_idx, outbox_unsent_aggregate_id_idx,
                 outbox_unsent_aggregate_type_idx;
             CREATE INDEX outbox_order_aggregate_id_idx ON outbox (aggregate_id, id);
             CREATE INDEX outbox_pending_aggregate_id_idx ON outbox (aggregate_id, id)
                 WHERE sent_at IS NULL AND quarantined_at IS NULL;
             CREATE INDEX outbox_key_aggregate_type_idx ON outbox (aggregate_type, id)
                 WHERE sent_at IS NULL;",
        )
        .await
        .unwrap();
    for _ in 0..2 {
        let (status, output) = run_to_end(&migrate, &[], Duration::from_secs(60)).await;
        assert!(status.success(), "{output}");
    }
    let indexes: Vec<String> = client
        .query(
            "SELECT i.indisvalid::text || ' ' || pg_get_indexdef(i.indexrelid)
             FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
             WHERE c.relname LIKE 'outbox\\_%\\_aggregate\\_%\\_idx'
             ORDER BY c.relname",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        indexes,
        [
            "true CREATE INDEX outbox_ordered_aggregate_id_idx ON public.outbox USING btree (aggregate_id, id) \
             WHERE (aggregate_id IS NOT NULL)",
            "true CREATE INDEX outbox_unsent_aggregate_id_idx ON public.outbox USING btree (aggregate_id, id) \
             WHERE ((sent_at IS NULL) AND (quarantined_at IS NULL) AND (aggregate_id IS NOT NULL))",
            "true CREATE INDEX outbox_unsent_aggregate_type_idx ON public.outbox USING btree (aggregate_type, id) \
             WHERE ((sent_at IS NULL) AND (quarantined_at IS NULL) AND (aggregate_type IS NOT NULL))",
        ]
    );
    let queue = crate::support::create_queue("fair-index.fifo", &[]).await;
    let mut check = crate::scenario::run_args(
        &db,
        &queue,
        crate::support::sqs().endpoint(),
        &["--fair-by", "aggregate_type"],
    );
    check[0] = "check".to_string();
    let check: Vec<&str> = check.iter().map(String::as_str).collect();
    let output = crate::scenario::relay_command(&check).await;
    assert!(!output.contains("FAIL"), "{output}");
}

/// An install of schema version 1 (leases on the outbox rows, no lease table): a relay of
/// this version refuses to run on it, with one line naming `migrate`, and touches no row.
/// `migrate` then adds the lease table beside it while the application goes on writing: no
/// rewrite of the outbox table, and no lock its writes wait for (it completes while an
/// application transaction that inserted a row is still open). The relay then delivers every
/// row, those from before the upgrade and those written during it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_install_is_refused_by_run_until_migrate_adds_the_lease_table_online() {
    use crate::scenario::{copies, count, events, insert, run_args, wait_count, Producer};

    let db = migrated_db().await;
    let client = db.client().await;
    // The install as version 1 left it: the same outbox table, no lease table, version 1.
    client
        .batch_execute(
            "DROP TABLE outbox_claims;
             UPDATE outbox_relay_schema SET version = 1;",
        )
        .await
        .unwrap();
    let before = events("v1-before", 20, 4);
    insert(&client, &before, Duration::ZERO).await;
    let queue = crate::support::create_queue("v1-upgrade", &[]).await;
    let run = run_args(&db, &queue, crate::support::sqs().endpoint(), &[]);

    let (status, output) = run_to_end(&run, &[], Duration::from_secs(60)).await;
    assert!(
        !status.success(),
        "run refuses a version 1 install:\n{output}"
    );
    let errors: Vec<&str> = output.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one line:\n{output}");
    assert!(
        errors[0].contains(&format!(
            "needs schema version {NEEDS_SCHEMA} of \"outbox\", which is at version 1"
        )) && errors[0].contains("outbox-relay migrate"),
        "{}",
        errors[0]
    );
    assert_eq!(
        count(&client, "sent_at IS NOT NULL OR attempts > 0").await,
        0,
        "nothing was claimed or sent"
    );

    let filenode = "SELECT pg_relation_filenode('outbox')::bigint";
    let filenode_before = scalar_i64(&client, filenode).await;
    // An application transaction that wrote a row and stays open through the migration: its
    // ROW EXCLUSIVE lock would hold up any step that locks the table against writes.
    let open = db.client().await;
    open.batch_execute("BEGIN").await.unwrap();
    let during = events("v1-open", 1, 1);
    insert(&open, &during, Duration::ZERO).await;
    let producer = Producer::start(&db.url, "v1-during", 20, 5, Duration::from_millis(50));
    crate::support::wait_until(
        "the application writing",
        Duration::from_secs(30),
        || async { producer.committed_batches() >= 2 },
    )
    .await;

    let (status, output) = run_to_end(
        &args(&["migrate", "--database-url", &db.url]),
        &[],
        Duration::from_secs(60),
    )
    .await;
    assert!(status.success(), "{output}");
    assert!(
        output.contains(&format!(
            "migrated \"outbox\" from schema version 1 to {NEEDS_SCHEMA}"
        )),
        "{output}"
    );
    assert!(
        scalar_bool(
            &client,
            "SELECT EXISTS (SELECT FROM pg_stat_activity
                            WHERE state = 'idle in transaction' AND backend_xid IS NOT NULL
                              AND datname = current_database())"
        )
        .await,
        "the application's transaction was open all along"
    );
    open.batch_execute("COMMIT").await.unwrap();
    let report = producer.finish().await;
    assert_eq!(
        report.retries, 0,
        "no write of the application failed or waited 10 s"
    );
    assert_eq!(
        scalar_i64(&client, filenode).await,
        filenode_before,
        "the outbox table was not rewritten"
    );
    assert!(
        scalar_bool(
            &client,
            &format!(
                "SELECT to_regclass('outbox_claims') IS NOT NULL
                    AND (SELECT version FROM outbox_relay_schema) = {NEEDS_SCHEMA}"
            )
        )
        .await
    );

    let mut written: Vec<String> = before
        .iter()
        .chain(&during)
        .chain(&report.events)
        .map(|e| e.event_id.clone())
        .collect();
    written.sort();
    let total = written.len();
    let relay = RelayProcess::spawn(&run, &[]);
    wait_count(
        &client,
        "sent_at IS NOT NULL",
        total as i64,
        Duration::from_secs(60),
    )
    .await;
    let received = crate::support::receive_all(&queue, total, Duration::from_secs(60)).await;
    let mut delivered: Vec<String> = copies(&received).into_keys().collect();
    delivered.sort();
    assert_eq!(delivered, written, "every row, old and new, delivered");
    relay.sigterm();
    let status = relay
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("relay stops");
    assert!(status.success(), "{}", relay.output());
}
