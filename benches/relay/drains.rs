//! Groups `drain`, `replicas`, `ordered`, `sweep`, `pooler` and `long-group`: drains of a
//! backlog under different relay settings, destinations and groupings.

use std::time::Duration;

use crate::drain::{drain, say_drain, spec, Destination, DrainRun, DrainSpec, SHORT_DRAIN_POLL};
use crate::settings::{Settings, SQS_LATENCY};
use crate::workload::{self, Backlog, Payload};

/// Long group: this many events, spread over [`workload::GROUPS`] groups, then all in one.
const LONG_GROUP_ROWS: u64 = 5_000;

/// The drains of groups `drain`, `replicas`, `ordered`, `sweep` and `pooler`, in this order;
/// a group `OUTBOX_BENCH_ONLY` leaves out has none.
pub fn specs(settings: &Settings, ordered_flag: bool) -> Vec<DrainSpec> {
    let sink0 = Destination::Sink(Duration::ZERO);
    let mut drains: Vec<DrainSpec> = Vec::new();
    if settings.runs("drain") {
        drains.push(spec(
            settings,
            "drain, sink 0 ms",
            sink0,
            1,
            settings.in_flight,
        ));
        // More requests in flight also means more claims in delivery at once (the relay
        // derives one from the other): does a sink that costs nothing gain from it, or lose?
        let other = if settings.in_flight >= 16 { 4 } else { 16 };
        drains.push(spec(
            settings,
            &format!("drain, sink 0 ms, in-flight {other}"),
            sink0,
            1,
            other,
        ));
        drains.push(spec(
            settings,
            "drain, fauxqs",
            Destination::Fauxqs,
            1,
            settings.in_flight,
        ));
    }
    if settings.runs("replicas") {
        for replicas in [2, 4] {
            drains.push(spec(
                settings,
                &format!("drain, sink 0 ms, {replicas} replicas"),
                sink0,
                replicas,
                settings.in_flight,
            ));
        }
    }
    if settings.runs("ordered") {
        // FIFO with per-group ordering, and FIFO without it, to tell the cost of ordering from
        // the cost of the FIFO fields. Builds before `--ordered` existed only had the latter.
        let modes: &[bool] = if ordered_flag {
            &[true, false]
        } else {
            &[false]
        };
        for &ordered in modes {
            let mut fifo = spec(
                settings,
                match (ordered_flag, ordered) {
                    (true, true) => "drain, sink 0 ms, FIFO, --ordered on",
                    (true, false) => "drain, sink 0 ms, FIFO, --ordered off",
                    (false, _) => "drain, sink 0 ms, FIFO (no --ordered flag)",
                },
                sink0,
                1,
                settings.in_flight,
            );
            fifo.fifo = true;
            fifo.ordered = ordered;
            if ordered_flag {
                fifo.flags = vec![
                    "--ordered".to_string(),
                    if ordered { "on" } else { "off" }.to_string(),
                ];
            }
            drains.push(fifo);
        }
    }
    if settings.runs("order-by") {
        for transaction in [false, true] {
            let mut fifo = spec(
                settings,
                if transaction {
                    "drain, sink 0 ms, FIFO, --ordered on, --order-by transaction"
                } else {
                    "drain, sink 0 ms, FIFO, --ordered on, --order-by id"
                },
                sink0,
                1,
                settings.in_flight,
            );
            fifo.fifo = true;
            fifo.ordered = true;
            fifo.flags = vec!["--ordered".to_string(), "on".to_string()];
            fifo.order_by_transaction = transaction;
            drains.push(fifo);
        }
    }
    if settings.runs("sweep") {
        for &in_flight in &settings.sweep {
            let mut s = spec(
                settings,
                &format!("drain, sink 15 ms, in-flight {in_flight}"),
                Destination::Sink(SQS_LATENCY),
                1,
                in_flight,
            );
            s.window = Some(settings.window);
            drains.push(s);
        }
    }
    if settings.runs("pooler") {
        // What --pooler transaction costs (unnamed statements, synchronous_commit per
        // transaction), on a direct connection and through PgBouncer, against the default.
        drains.push(spec(
            settings,
            "drain, sink 0 ms, --pooler none",
            sink0,
            1,
            settings.in_flight,
        ));
        let mut unnamed = spec(
            settings,
            "drain, sink 0 ms, --pooler transaction, direct",
            sink0,
            1,
            settings.in_flight,
        );
        unnamed.flags = vec!["--pooler".into(), "transaction".into()];
        drains.push(unnamed);
        let mut bounced = spec(
            settings,
            "drain, sink 0 ms, --pooler transaction, PgBouncer",
            sink0,
            1,
            settings.in_flight,
        );
        bounced.flags = vec!["--pooler".into(), "transaction".into()];
        bounced.pgbouncer = true;
        drains.push(bounced);
    }
    drains
}

/// Drains `specs` one after the other, a progress line each.
pub async fn run(settings: &Settings, specs: Vec<DrainSpec>) -> Vec<DrainRun> {
    let mut runs = Vec::new();
    for spec in specs {
        let run = drain(settings, spec).await;
        say_drain(&run);
        runs.push(run);
    }
    runs
}

/// Group `long-group`.
pub async fn long_group(settings: &Settings, ordered_flag: bool) -> Vec<DrainRun> {
    let sink0 = Destination::Sink(Duration::ZERO);
    let mut runs = Vec::new();
    // Ordered delivery sends up to 10 consecutive events of a group per FIFO request, one
    // request per group at a time: does one group's backlog drain at a fair share of the
    // rate of the same backlog spread over many groups? Each pair back to back, on the
    // sink (the relay's own limit) and on fauxqs (a real server's).
    for destination in [sink0, Destination::Fauxqs] {
        for groups in [workload::GROUPS, 1] {
            let mut s = spec(
                settings,
                &format!(
                    "long group, {}, {} group{}",
                    match destination {
                        Destination::Fauxqs => "fauxqs",
                        Destination::Sink(_) => "sink 0 ms",
                    },
                    groups,
                    if groups == 1 { "" } else { "s" }
                ),
                destination,
                1,
                settings.in_flight,
            );
            s.backlog = Backlog {
                rows: LONG_GROUP_ROWS,
                groups,
                payload: Payload::Order,
            };
            s.poll = SHORT_DRAIN_POLL;
            s.fifo = true;
            s.ordered = true;
            if ordered_flag {
                s.flags = vec!["--ordered".to_string(), "on".to_string()];
            }
            let run = drain(settings, s).await;
            say_drain(&run);
            runs.push(run);
        }
    }
    runs
}
