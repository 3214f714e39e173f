//! The one integration-test binary: one link step, one PostgreSQL and one SQS server per run.

mod support;

mod harness_smoke;

mod scenario;

mod adopt;
mod chaos;
mod crash;
mod faults;
mod fifo;
mod ops_metrics;
mod outbox_sql;
mod retention;
mod sqs_contract;
mod startup;
