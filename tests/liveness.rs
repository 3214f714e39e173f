//! Liveness means "the loop is alive", also while it waits on purpose: a relay backing off
//! through a database outage must not be restarted by its liveness probe.

use std::time::{Duration, Instant};

use crate::scenario::{count, events, insert, migrate, run_args, set_arg, wait_count};
use crate::support::pg::PrivatePg;
use crate::support::{create_queue, sqs, wait_until, RelayProcess};

/// Generous for a loaded 2-core machine; a bound on waiting only, never a measured time.
const WAIT: Duration = Duration::from_secs(90);

/// `/healthz` fails after 5 poll intervals, at least 10 s, without a loop iteration (src/main.rs).
const STUCK_AFTER: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_stays_up_while_the_relay_backs_off_through_a_database_outage() {
    let cluster = PrivatePg::start().await;
    let db = cluster.create_db().await;
    migrate(&db, "outbox").await;
    let queue = create_queue("liveness", &[]).await;
    // Every back-off after a failed claim is a uniform draw below 30 s (full jitter), so most
    // of them outlast the 10 s liveness threshold; a loop that slept them without ticking
    // failed /healthz within the outage below in all but a few percent of runs. The poll
    // interval keeps the threshold at its 10 s floor.
    let mut args = run_args(&db, &queue, sqs().endpoint(), &[]);
    set_arg(&mut args, "--retry-base", "30s");
    set_arg(&mut args, "--retry-max", "30s");
    let relay = RelayProcess::spawn(&args, &[]);
    let client = db.client().await;
    insert(&client, &events("before", 20, 4), Duration::ZERO).await;
    wait_count(&client, "sent_at IS NOT NULL", 20, WAIT).await;
    assert_eq!(relay.http_status("/healthz").await, 200);
    assert_eq!(relay.http_status("/readyz").await, 200);
    drop(client);

    cluster.stop_fast().await;
    wait_until("/readyz fails while the database is down", WAIT, || async {
        relay.http_status("/readyz").await == 503
    })
    .await;
    // Three times the threshold: several back-offs, most of them longer than it.
    let outage = STUCK_AFTER * 3;
    let until = Instant::now() + outage;
    let mut probes = 0;
    while Instant::now() < until {
        assert_eq!(
            relay.http_status("/healthz").await,
            200,
            "liveness failed {:?} into a database outage while the relay was backing off:\n{}",
            outage - (until - Instant::now()),
            relay.output()
        );
        assert_eq!(
            relay.http_status("/readyz").await,
            503,
            "not ready while the database is down"
        );
        probes += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(probes > 10, "probed throughout the outage ({probes} times)");
    assert!(
        relay.wait_exit(Duration::ZERO).await.is_none(),
        "the relay must not exit when its database goes away:\n{}",
        relay.output()
    );

    cluster.start_again().await;
    let client = db.client().await;
    insert(&client, &events("after", 20, 4), Duration::ZERO).await;
    // The back-off under way when the database came back ends within 30 s.
    wait_count(&client, "sent_at IS NOT NULL", 40, WAIT).await;
    assert_eq!(count(&client, "quarantined_at IS NOT NULL").await, 0);
    wait_until("/readyz passes again", WAIT, || async {
        relay.http_status("/readyz").await == 200
    })
    .await;
    assert_eq!(relay.http_status("/healthz").await, 200);
}
