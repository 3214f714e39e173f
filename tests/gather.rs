//! Claims gather under the latency budget (`--max-delay`): rows a stream commits one by one
//! within the budget ride in one claim, whether the relay polls or a logical wake-up wakes it; and
//! every row still arrives. Which claim took which rows is read from the lease table itself: a
//! trigger of the test's records the size of every claim the relay inserts.

use std::time::Duration;

use crate::scenario::{events, insert, migrated_db, relay_command, run_args, set_arg};
use crate::support::{create_queue, receive_all, sqs, wait_until, RelayProcess, TestDb};

/// A budget far above what ten commits 50 ms apart take, even on a busy machine (with 2 s, a
/// loaded CI run once split them 8 + 2).
const BUDGET: &str = "5s";

/// Records the number of rows of each claim the relay makes (`outbox_claims` rows it inserts).
async fn record_claim_sizes(db: &TestDb) {
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE claim_sizes (at timestamptz NOT NULL DEFAULT clock_timestamp(), rows int NOT NULL);
             CREATE FUNCTION record_claim_size() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO claim_sizes (rows) VALUES (cardinality(NEW.ids));
                 RETURN NEW;
             END $$;
             CREATE TRIGGER record_claim_size AFTER INSERT ON outbox_claims
                 FOR EACH ROW EXECUTE FUNCTION record_claim_size();",
        )
        .await
        .unwrap();
}

async fn claim_sizes(client: &tokio_postgres::Client) -> Vec<i32> {
    client
        .query("SELECT rows FROM claim_sizes ORDER BY at", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// One row, claimed alone; then ten rows committed one by one, 50 ms apart, right after that
/// claim: all ten ride in the next claim, which waits the budget for them.
async fn ten_commits_within_the_budget_ride_in_one_claim(wakeup: &str) {
    let db = migrated_db().await;
    if wakeup != "poll" {
        relay_command(&["migrate", "--database-url", &db.url, "--wakeup", wakeup]).await;
    }
    record_claim_sizes(&db).await;
    let queue = create_queue(&format!("gather-{wakeup}"), &[]).await;
    let mut args = run_args(&db, &queue, sqs().endpoint(), &["--wakeup", wakeup]);
    set_arg(&mut args, "--poll-interval", "10s");
    set_arg(&mut args, "--max-delay", BUDGET);
    let relay = RelayProcess::spawn(&args, &[]);
    relay.metrics_addr(Duration::from_secs(30)).await;
    let client = db.client().await;
    // The relay's first claim (empty) runs at start; the rate it measures from the next one is
    // one row over the time between them. Right after start that time can be a few tens of ms
    // on a loaded machine: a rate of tens of rows a second, which shrinks the wait to the time
    // such a stream takes for a quarter batch, shorter than ten commits 50 ms apart
    // (`relay::gather`; a loaded CI run split them 7 + 3). Two seconds after that claim it is
    // a stream of half a row a second, whose wait is the whole budget.
    wait_until(
        "the relay's first claim",
        Duration::from_secs(30),
        || async {
            relay
                .metric("outbox_claim_duration_seconds_count")
                .await
                .is_some_and(|n| n >= 1.0)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    insert(&client, &events("first", 1, 1), Duration::ZERO).await;
    wait_until("the first row claimed", Duration::from_secs(30), || async {
        !claim_sizes(&client).await.is_empty()
    })
    .await;
    for i in 0..10 {
        insert(&client, &events(&format!("next-{i}"), 1, 1), Duration::ZERO).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let received = receive_all(&queue, 11, Duration::from_secs(60)).await;
    assert_eq!(received.len(), 11, "{}", relay.output());
    assert_eq!(
        claim_sizes(&client).await,
        vec![1, 10],
        "the ten rows committed within --max-delay {BUDGET} of the first claim ride in one claim\n{}",
        relay.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_gathers_a_streams_rows_into_one_claim_within_the_budget() {
    ten_commits_within_the_budget_ride_in_one_claim("poll").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logical_wakeup_gathers_a_streams_rows_into_one_claim_within_the_budget() {
    ten_commits_within_the_budget_ride_in_one_claim("notify").await;
}
