//! `run`'s flags (which `check` shares) in their groups, and [`RunConfig`], their validated form.
//!
//! Each group checks its own rules in a pure `validate`; a rule between groups takes the part
//! of the other group it needs as an argument, so [`RunArgs::validate`] reads as the order in
//! which the groups depend on each other.

use std::net::SocketAddr;

use clap::Args;

use super::delivery::{ClaimArgs, ClaimConfig, RetryArgs, RetryConfig, SendArgs, SendConfig};
use super::maintenance::{MaintenanceArgs, MaintenanceConfig};
use super::order::{FormatArgs, OffloadArgs, OffloadConfig, OrderArgs, OrderConfig};
use super::{DatabaseArgs, DatabaseConfig};
use crate::batch::{MessageFormat, PlanConfig};
use crate::destination::Destination;
use crate::outbox::{ClaimLimits, OrderBy, RelaySettings};
use crate::sink::Endpoints;

// `--help` lists the flags in the order of the groups here (docs/configuration.md follows it).
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Where the database is, which table, and how connections log in.
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// The default destination and the SQS and SNS endpoints.
    #[command(flatten)]
    pub destination: DestinationArgs,

    /// Where /metrics, /healthz and /readyz listen.
    #[arg(long, env = "OUTBOX_METRICS_ADDR", default_value = "0.0.0.0:9898")]
    pub metrics_addr: String,

    /// How many rows are claimed and worked on at once, and by whom.
    #[command(flatten)]
    pub claim: ClaimArgs,

    /// How long a send may take and how large requests and payloads may be.
    #[command(flatten)]
    pub send: SendArgs,

    /// How failures wait, and how long a database round trip may take.
    #[command(flatten)]
    pub retry: RetryArgs,

    /// Gauges and retention, and the timeout of their statements.
    #[command(flatten)]
    pub maintenance: MaintenanceArgs,

    /// Per-group order, fairness and routing.
    #[command(flatten)]
    pub order: OrderArgs,

    /// The message body's format.
    #[command(flatten)]
    pub format: FormatArgs,

    /// Large bodies through S3.
    #[command(flatten)]
    pub offload: OffloadArgs,

    /// Several tables in one relay.
    #[command(flatten)]
    pub many: ManyArgs,
}

/// How a relay serving several tables (`--tables`, or `--table` more than once) shares itself
/// between them.
#[derive(Debug, Clone, Args)]
pub struct ManyArgs {
    /// How often --tables patterns are looked up again: a table created or dropped since is
    /// served or let go without a restart.
    #[arg(long, env = "OUTBOX_DISCOVER_EVERY", default_value = "30s", value_parser = humantime::parse_duration)]
    pub discover_every: std::time::Duration,

    /// How many tables claim at once (turns). Each turn has a claims and a settlements
    /// connection of its own: the relay's connections are 2 x this + 2, whatever the number
    /// of tables.
    #[arg(long, env = "OUTBOX_ACTIVE_TABLES", default_value_t = 4)]
    pub active_tables: usize,

    /// A table with more to claim keeps claiming for this long before it gives way to a table
    /// waiting for a turn (it goes on while none waits).
    #[arg(long, env = "OUTBOX_TABLE_TURN", default_value = "250ms", value_parser = humantime::parse_duration)]
    pub table_turn: std::time::Duration,

    /// The table gauges carry a `table` label for at most this many tables, the worst ones;
    /// the others are summed into `table="(others)"`.
    #[arg(long, env = "OUTBOX_TABLE_SERIES", default_value_t = 20)]
    pub table_series: usize,
}

/// [`ManyArgs`], validated.
#[derive(Debug, Clone)]
pub struct ManyConfig {
    pub discover_every: std::time::Duration,
    pub active_tables: usize,
    pub table_turn: std::time::Duration,
    pub table_series: usize,
}

impl ManyArgs {
    pub fn validate(&self) -> Result<ManyConfig, String> {
        if self.active_tables == 0 {
            return Err("--active-tables must be at least 1".to_string());
        }
        if self.discover_every < std::time::Duration::from_secs(1) {
            return Err(
                "--discover-every must be at least 1s: each look reads the catalog".to_string(),
            );
        }
        Ok(ManyConfig {
            discover_every: self.discover_every,
            active_tables: self.active_tables,
            table_turn: self.table_turn,
            table_series: self.table_series,
        })
    }
}

/// Where messages go by default, and where the SQS and SNS APIs are reached.
#[derive(Debug, Clone, Args)]
pub struct DestinationArgs {
    /// Default destination: an SQS queue URL or an SNS topic ARN (arn:aws:sns:...); one ending
    /// in `.fifo` turns on FIFO fields.
    #[arg(long, env = "OUTBOX_QUEUE_URL")]
    pub queue_url: Option<String>,

    /// SQS endpoint override (local emulators). AWS_ENDPOINT_URL is honoured by the SDK too.
    #[arg(long, env = "AWS_ENDPOINT_URL_SQS")]
    pub sqs_endpoint_url: Option<String>,

    /// SNS endpoint override (local emulators), for topic destinations. AWS_ENDPOINT_URL is
    /// honoured by the SDK too.
    #[arg(long, env = "AWS_ENDPOINT_URL_SNS")]
    pub sns_endpoint_url: Option<String>,
}

/// Everything `run` needs, validated, in the groups of its flags.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Where the database is, which table, and how connections log in.
    pub database: DatabaseConfig,
    /// The default destination and the SQS and SNS endpoints.
    pub destination: DestinationConfig,
    /// Where /metrics, /healthz and /readyz listen.
    pub metrics_addr: SocketAddr,
    /// How many rows are claimed and worked on at once, and by whom.
    pub claim: ClaimConfig,
    /// How long a send may take and how large requests and payloads may be.
    pub send: SendConfig,
    /// How failed rows, the relay and its database connections wait before trying again.
    pub retry: RetryConfig,
    /// Gauges, retention and the timeout of their statements.
    pub maintenance: MaintenanceConfig,
    /// Per-group order, fairness and routing: which rows go where, and in which order.
    pub order: OrderConfig,
    /// The message body's format.
    pub format: MessageFormat,
    /// Large bodies through S3.
    pub offload: OffloadConfig,
    /// How a relay serving several tables shares itself between them.
    pub many: ManyConfig,
}

/// The destination group, validated.
#[derive(Debug, Clone)]
pub struct DestinationConfig {
    /// Where rows without their own `queue_url` or a route go: a queue URL or a topic ARN.
    pub queue_url: Destination,
    /// The SQS endpoint override; `None`: the SDK's own resolution.
    pub sqs_endpoint: Option<String>,
    /// For topic destinations (SNS); `None`: the SDK's own resolution.
    pub sns_endpoint: Option<String>,
}

impl RunArgs {
    /// Checks every rule that needs no I/O, group by group.
    pub fn validate(&self) -> Result<RunConfig, String> {
        let database = self.database.validate()?;
        let destination = self.destination.validate()?;
        let metrics_addr: SocketAddr = self.metrics_addr.parse().map_err(|_| {
            format!(
                "--metrics-addr {:?} is not an address: use host:port, e.g. 0.0.0.0:9898",
                self.metrics_addr
            )
        })?;
        let claim = self.claim.validate(database.pooler)?;
        let send = self.send.validate(claim.lease)?;
        let retry = self.retry.validate(&send, claim.lease)?;
        let maintenance = self.maintenance.validate()?;
        let order = self.order.validate(&destination)?;
        if database.adopted.is_some() && self.order.order_by == OrderBy::Transaction {
            return Err(crate::outbox::NOT_ON_ADOPTED.to_string());
        }
        let format = self.format.validate()?;
        let offload = self.offload.validate(send.max_request_bytes)?;
        let many = self.many.validate()?;
        if database.selection.single().is_none() && claim.wakeup != crate::outbox::Wakeup::Poll {
            return Err(format!(
                "--wakeup {} serves one table: with several (--tables, or --table more than once) use --wakeup poll, whose one look covers every table",
                claim.wakeup
            ));
        }
        Ok(RunConfig {
            many,
            database,
            destination,
            metrics_addr,
            claim,
            send,
            retry,
            maintenance,
            order,
            format,
            offload,
        })
    }
}

impl DestinationArgs {
    /// `--queue-url` is required and a destination; endpoints are URLs.
    pub fn validate(&self) -> Result<DestinationConfig, String> {
        let queue_url =
            match self.queue_url.as_deref().map(str::trim) {
                Some(url) if !url.is_empty() => Destination::parse(url),
                _ => return Err(
                    "--queue-url (or OUTBOX_QUEUE_URL) is required: the SQS queue URL to send to"
                        .to_string(),
                ),
            }
            .map_err(|e| format!("--queue-url {e}"))?;
        for (flag, endpoint) in [
            ("--sqs-endpoint-url", &self.sqs_endpoint_url),
            ("--sns-endpoint-url", &self.sns_endpoint_url),
        ] {
            if let Some(endpoint) = endpoint {
                if !(endpoint.starts_with("https://") || endpoint.starts_with("http://")) {
                    return Err(format!(
                        "{flag} {endpoint:?} must start with http:// or https://"
                    ));
                }
            }
        }
        Ok(DestinationConfig {
            queue_url,
            sqs_endpoint: self.sqs_endpoint_url.clone(),
            sns_endpoint: self.sns_endpoint_url.clone(),
        })
    }
}

impl RunConfig {
    /// How rows become messages and where they go: the planner's view of the destination,
    /// order, format and offload groups.
    pub fn plan(&self) -> PlanConfig {
        PlanConfig {
            default_queue_url: self.destination.queue_url.clone(),
            routes: self.order.routes.clone(),
            route_by: self.order.route_by.clone(),
            group_by: self.order.group_by.clone(),
            fair_group: self.order.fair_group.clone(),
            format: self.format.clone(),
            max_request_bytes: self.send.max_request_bytes,
            ordering: self.order.ordering,
            offload: self.offload.plan.clone(),
        }
    }

    /// Where the destinations' services and the offload bucket are reached.
    pub fn endpoints(&self) -> Endpoints<'_> {
        Endpoints {
            sqs: self.destination.sqs_endpoint.as_deref(),
            sns: self.destination.sns_endpoint.as_deref(),
            s3: self.offload.s3_endpoint.as_deref(),
            offload: self.offload.plan.as_ref().map(|plan| &plan.bucket),
        }
    }

    /// What `run` (and `check`, which tries what `run` will do) asks of the outbox.
    pub fn relay_settings(&self) -> RelaySettings {
        RelaySettings {
            delete_on_ack: self.maintenance.retention.deletes_on_ack(),
            round_trip: self.retry.db_timeout,
            limits: ClaimLimits {
                max_payload_bytes: i64::try_from(self.send.max_payload_bytes).unwrap_or(i64::MAX),
                max_attempts: i32::try_from(self.claim.max_attempts).unwrap_or(i32::MAX),
            },
            strategy: self.order.strategy.clone(),
        }
    }
}
