//! The one integration-test binary: one link step, one PostgreSQL and one SQS server per run.

mod support;

mod harness_smoke;

use support::scenario;

mod adopt;
mod alerts;
mod chaos;
mod claim_races;
mod console;
mod crash;
mod dashboard;
mod dbauth;
mod destination;
mod failover;
mod faults;
mod fifo;
mod gather;
mod groups;
mod horizon;
mod large_events;
mod liveness;
mod maintenance;
mod many;
mod many_admin;
mod matrix;
mod migrate_online;
mod ops_check;
mod ops_config_doc;
mod ops_gauges;
mod ops_metrics;
mod ops_secrets;
mod ops_status;
mod ops_tls;
mod ops_tls_client;
mod order_by;
mod otel;
mod outbox_sql;
mod partition;
mod plans;
mod pooler;
mod replay;
mod retention;
mod rows_that_kill;
mod settings;
mod slow_destination;
mod sns;
mod sqs_contract;
mod startup;
mod undone;
mod upgrade;
mod wakeup;
mod wakeup_logical;
