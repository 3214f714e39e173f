//! A queue that refuses the relay (here: one that does not exist yet) holds only its own rows:
//! they are parked with reason `destination`, retried on that queue's own schedule and sent
//! once it exists, while every other queue keeps flowing and the relay stays ready.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::scenario::{
    attr, copies, count, events, insert_to, migrated_db, relay_command, run_args, set_arg,
    wait_count, Event,
};
use crate::support::{create_queue, receive_all, sqs, wait_until, RelayProcess};

/// Generous for a loaded 2-core machine; a bound on waiting only, never a measured time.
const WAIT: Duration = Duration::from_secs(60);

/// A URL in the server's own shape for a queue that does not exist yet, and its name.
pub(crate) fn missing_queue(sibling: &str, prefix: &str) -> (String, String) {
    let (base, _) = sibling.rsplit_once('/').expect("queue URL has a path");
    let name = format!(
        "{prefix}-{}-{}",
        crate::support::unique(),
        std::process::id()
    );
    (format!("{base}/{name}"), name)
}

pub(crate) async fn create_named(name: &str, expected_url: &str) {
    let mut request = crate::support::sqs_client()
        .await
        .create_queue()
        .queue_name(name);
    if name.ends_with(".fifo") {
        request = request.attributes(aws_sdk_sqs::types::QueueAttributeName::FifoQueue, "true");
    }
    let created = request
        .send()
        .await
        .expect("create the missing queue")
        .queue_url
        .expect("QueueUrl");
    assert_eq!(created, expected_url);
}

async fn failures(relay: &RelayProcess, kind: &str) -> f64 {
    relay
        .metric(&format!("outbox_send_failures_total{{kind=\"{kind}\"}}"))
        .await
        .unwrap_or_else(|| panic!("no outbox_send_failures_total{{kind=\"{kind}\"}} series"))
}

/// The ids the consumer received, in order, per group; and how many pairs are out of order.
async fn order_violations(
    client: &tokio_postgres::Client,
    received: &[aws_sdk_sqs::types::Message],
) -> (usize, HashMap<String, Vec<i64>>) {
    let ids: HashMap<String, i64> = client
        .query("SELECT event_id, id FROM outbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut by_group: HashMap<String, Vec<i64>> = HashMap::new();
    for m in received {
        let group = attr(m, "aggregate_id").unwrap().to_string();
        by_group
            .entry(group)
            .or_default()
            .push(ids[attr(m, "event_id").unwrap()]);
    }
    let violations = by_group
        .values()
        .map(|seq| seq.windows(2).filter(|w| w[0] >= w[1]).count())
        .sum();
    (violations, by_group)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_row_queue_parks_only_its_rows_the_rest_flow_and_they_follow_once_it_exists() {
    let db = migrated_db().await;
    let client = db.client().await;
    let good = create_queue("d-good", &[]).await;
    let (missing, name) = missing_queue(&good, "d-missing");
    // Every tenth row names the missing queue; the others go to the default queue.
    let to = |written: &[Event]| -> Vec<Option<String>> {
        (0..written.len())
            .map(|i| (i % 10 == 3).then(|| missing.clone()))
            .collect()
    };
    let first = events("d-first", 200, 20);
    insert_to(&client, &first, &to(&first)).await;
    let relay = RelayProcess::spawn(&run_args(&db, &good, sqs().endpoint(), &[]), &[]);
    wait_count(&client, "quarantine_reason = 'destination'", 20, WAIT).await;

    // Written while the queue is parked: its rows are parked without a request, the rest flow.
    let second = events("d-second", 200, 20);
    insert_to(&client, &second, &to(&second)).await;
    wait_count(&client, "sent_at IS NOT NULL", 360, WAIT).await;
    wait_count(&client, "quarantine_reason = 'destination'", 40, WAIT).await;
    assert_eq!(
        count(&client, "sent_at IS NOT NULL AND queue_url IS NOT NULL").await,
        0
    );
    assert_eq!(
        count(&client, "quarantined_at IS NOT NULL AND queue_url IS NULL").await,
        0,
        "no row of the default queue is held"
    );
    assert_eq!(
        count(&client, "attempts > 1").await,
        0,
        "a missing queue is not the rows' fault: parking costs no attempt"
    );
    let with_error = format!(
        "queue_url IS NOT NULL AND last_error LIKE '%{name}%' \
         AND (last_error LIKE '%NonExistentQueue%' OR last_error LIKE '%QueueDoesNotExist%')"
    );
    assert_eq!(
        count(&client, &with_error).await,
        40,
        "each parked row names its queue and SQS's error"
    );
    let (ready, why) = relay.http_get("/readyz").await;
    assert_eq!(
        ready, 200,
        "a row's own queue is the application's data, not the relay's configuration: {why}"
    );
    // Counted per entry of each refused request; how many requests reach the queue before it
    // is parked (the rest are parked without one) depends on timing, so at least one did.
    assert!(failures(&relay, "destination").await >= 1.0);
    assert_eq!(failures(&relay, "config").await, 0.0);

    // Visible where operators look. The rows come back for a moment each time their queue is
    // tried again, so each view is awaited rather than read once.
    let parked_ids: HashSet<String> = first
        .iter()
        .chain(&second)
        .enumerate()
        .filter(|(i, _)| i % 10 == 3)
        .map(|(_, e)| e.event_id.clone())
        .collect();
    assert_eq!(parked_ids.len(), 40);
    wait_until("quarantine list shows the 40 parked rows", WAIT, || async {
        let listed = relay_command(&[
            "quarantine",
            "list",
            "--json",
            "--reason",
            "destination",
            "--database-url",
            &db.url,
        ])
        .await;
        // Pretty-printed over several lines; the first value from the opening bracket on.
        let json: serde_json::Value = listed
            .find("[")
            .and_then(|start| {
                serde_json::Deserializer::from_str(&listed[start..])
                    .into_iter()
                    .next()?
                    .ok()
            })
            .unwrap_or_else(|| panic!("no JSON array in:\n{listed}"));
        let listed: HashSet<String> = json
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["event_id"].as_str().unwrap().to_string())
            .collect();
        listed == parked_ids
    })
    .await;
    wait_until("status counts them under destination", WAIT, || async {
        let status = relay_command(&["status", "--database-url", &db.url]).await;
        status
            .lines()
            .any(|l| l.trim_start().starts_with("destination ") && l.ends_with(" 40"))
    })
    .await;

    // No operator action: the queue's next try finds it.
    create_named(&name, &missing).await;
    wait_count(&client, "sent_at IS NOT NULL", 400, WAIT).await;
    assert_eq!(count(&client, "quarantined_at IS NOT NULL").await, 0);
    assert_eq!(count(&client, "attempts <> 1").await, 0);
    let arrived = copies(&receive_all(&missing, 40, WAIT).await);
    assert_eq!(
        arrived.keys().cloned().collect::<HashSet<_>>(),
        parked_ids,
        "every parked row arrives on its own queue"
    );
    assert_eq!(copies(&receive_all(&good, 360, WAIT).await).len(), 360);
    assert_eq!(relay.http_status("/readyz").await, 200);
}

/// FIFO default queue, one group whose rows name a FIFO queue that does not exist yet.
struct Held {
    db: crate::support::TestDb,
    client: tokio_postgres::Client,
    default: String,
    missing: String,
    name: String,
}

const GROUPS: usize = 6;
const PER_GROUP: usize = 10;
const HELD_GROUP: &str = "agg-2";

/// `held` rows of group `HELD_GROUP` name the missing queue; the other groups have `PER_GROUP`.
async fn held_group(prefix: &str, held: usize) -> Held {
    let db = migrated_db().await;
    let client = db.client().await;
    let default = create_queue(&format!("{prefix}.fifo"), &[]).await;
    let (missing, name) = missing_queue(&default, prefix);
    let (missing, name) = (format!("{missing}.fifo"), format!("{name}.fifo"));
    let mut written = events(prefix, GROUPS * PER_GROUP, GROUPS);
    let mut kept = 0;
    written.retain(|e| {
        let keep = e.aggregate_id != HELD_GROUP || kept < held;
        kept += usize::from(e.aggregate_id == HELD_GROUP && keep);
        keep
    });
    let queues: Vec<Option<String>> = written
        .iter()
        .map(|e| (e.aggregate_id == HELD_GROUP).then(|| missing.clone()))
        .collect();
    insert_to(&client, &written, &queues).await;
    Held {
        db,
        client,
        default,
        missing,
        name,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_fifo_head_holds_its_group_and_the_group_follows_in_order_once_its_queue_exists() {
    let h = held_group("d-block", PER_GROUP).await;
    let relay = RelayProcess::spawn(&run_args(&h.db, &h.default, sqs().endpoint(), &[]), &[]);
    let others = ((GROUPS - 1) * PER_GROUP) as i64;
    wait_count(&h.client, "sent_at IS NOT NULL", others, WAIT).await;
    // The head is parked for its queue, and so are the rows claimed behind it in the same
    // request (a run of up to 10); with --on-poison block (the default) any further row of the
    // group is parked behind them. Nothing of the group is left claimable. Seen in one read:
    // the rows parked for their queue are tried again every --retry-base or so, and come back
    // unsent for a moment each time, which two reads once fell between on a loaded machine.
    wait_until(
        "the held group is parked behind its head, the head for its queue",
        WAIT,
        || async {
            h.client
                .query_one(
                    "SELECT count(*) FILTER (WHERE quarantine_reason IN ('destination', 'blocked')) = $2
                        AND coalesce(bool_or(quarantine_reason = 'destination' AND id = (
                                SELECT min(id) FROM outbox WHERE aggregate_id = $1)), false)
                     FROM outbox",
                    &[&HELD_GROUP, &(PER_GROUP as i64)],
                )
                .await
                .unwrap()
                .get::<_, bool>(0)
        },
    )
    .await;
    assert_eq!(relay.http_status("/readyz").await, 200);

    create_named(&h.name, &h.missing).await;
    wait_count(
        &h.client,
        "sent_at IS NOT NULL",
        (GROUPS * PER_GROUP) as i64,
        WAIT,
    )
    .await;
    assert_eq!(count(&h.client, "quarantined_at IS NOT NULL").await, 0);
    let received = receive_all(&h.missing, PER_GROUP, WAIT).await;
    let (violations, by_group) = order_violations(&h.client, &received).await;
    assert_eq!(by_group[HELD_GROUP].len(), PER_GROUP, "{by_group:?}");
    assert_eq!(violations, 0, "the group keeps its order: {by_group:?}");
}

/// With `--on-poison skip` a quarantined row no longer holds its group, but a row parked for
/// its queue is not poison: it must still hold the rows behind it. The row written after the
/// queue appears is claimable at once if the claim takes a `destination` row for done, and then
/// overtakes the parked head (it comes back only at the next statistics refresh, 3 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_on_poison_skip_a_row_parked_for_its_queue_still_holds_its_group() {
    let h = held_group("d-skip", 1).await;
    let mut args = run_args(
        &h.db,
        &h.default,
        sqs().endpoint(),
        &["--on-poison", "skip"],
    );
    set_arg(&mut args, "--stats-interval", "3s");
    // Parks of a millisecond: the late row meets no park of its queue in the relay's memory,
    // only the parked rows in the table, which the claim alone must respect.
    set_arg(&mut args, "--retry-base", "1ms");
    set_arg(&mut args, "--retry-max", "1ms");
    let _relay = RelayProcess::spawn(&args, &[]);
    let others = ((GROUPS - 1) * PER_GROUP) as i64;
    wait_count(&h.client, "sent_at IS NOT NULL", others, WAIT).await;
    wait_count(&h.client, "quarantine_reason = 'destination'", 1, WAIT).await;

    create_named(&h.name, &h.missing).await;
    let late = Event {
        event_id: "d-skip-late".into(),
        aggregate_id: HELD_GROUP.into(),
        ..events("d-skip-late", 1, 1).remove(0)
    };
    insert_to(&h.client, &[late], &[Some(h.missing.clone())]).await;
    wait_count(&h.client, "sent_at IS NOT NULL", others + 2, WAIT).await;
    let received = receive_all(&h.missing, 2, WAIT).await;
    let (violations, by_group) = order_violations(&h.client, &received).await;
    assert_eq!(by_group[HELD_GROUP].len(), 2, "{by_group:?}");
    assert_eq!(violations, 0, "the group keeps its order: {by_group:?}");
}

/// A row's own destination is parsed once, where rows are read: an empty `queue_url` names
/// none, so the row goes to the default queue like a NULL one, and a row that names the
/// default queue's URL itself lands there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_row_destination_means_the_default_queue() {
    let db = migrated_db().await;
    let client = db.client().await;
    let default = create_queue("d-default", &[]).await;
    let written = events("d-empty", 30, 5);
    let to: Vec<Option<String>> = (0..written.len())
        .map(|i| match i % 3 {
            0 => Some(String::new()),
            1 => Some(default.clone()),
            _ => None,
        })
        .collect();
    insert_to(&client, &written, &to).await;
    let _relay = RelayProcess::spawn(&run_args(&db, &default, sqs().endpoint(), &[]), &[]);
    wait_count(&client, "sent_at IS NOT NULL", 30, WAIT).await;
    let arrived = copies(&receive_all(&default, 30, WAIT).await);
    assert_eq!(arrived.len(), 30, "every row reached the default queue");
    assert_eq!(count(&client, "quarantined_at IS NOT NULL").await, 0);
}
