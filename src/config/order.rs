//! The order, format and offload groups of `run`'s flags: which rows go where, in which order,
//! and how they become messages.

use clap::builder::BoolishValueParser;
use clap::{Args, ValueEnum};

use super::parse::{parse_bytes, parse_route};
use super::run::DestinationConfig;
use crate::batch::{KeyColumn, MessageFormat, OffloadPlan, PlanOrdering};
use crate::destination::{Destination, MessageGroup};
use crate::outbox::{ClaimStrategy, OrderBy, OrderScope, Ordered};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    /// On when a destination queue is FIFO (`.fifo`), off otherwise.
    Auto,
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnPoison {
    /// A quarantined row holds back the rest of its group until it is re-driven.
    Block,
    /// A quarantined row is passed over; the rest of its group flows.
    Skip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The payload JSON as the body.
    Raw,
    /// A CloudEvents 1.0 structured JSON envelope around the payload.
    Cloudevents,
}

/// Per-group order, fairness across keys, and routing by key.
#[derive(Debug, Clone, Args)]
pub struct OrderArgs {
    /// Per-group ordered delivery: a group's next event is sent only after the previous one was
    /// acknowledged, across all replicas.
    #[arg(long, env = "OUTBOX_ORDERED", value_enum, default_value_t = Switch::Auto)]
    pub ordered: Switch,

    /// A group's order: id (insertion order) or transaction (the writing transactions' order;
    /// a row waits while an older transaction still runs; needs `migrate --order-by
    /// transaction`).
    #[arg(long, env = "OUTBOX_ORDER_BY", default_value = "id")]
    pub order_by: OrderBy,

    /// The group key: FIFO MessageGroupId and the unit of ordering (aggregate_id, aggregate_type,
    /// event_type or header:NAME).
    #[arg(long, env = "OUTBOX_GROUP_BY", default_value = "aggregate_id")]
    pub group_by: KeyColumn,

    /// With ordering, what a quarantined row does to the rest of its group.
    #[arg(long, env = "OUTBOX_ON_POISON", value_enum, default_value_t = OnPoison::Block)]
    pub on_poison: OnPoison,

    /// Claim round-robin across the values of this key (e.g. aggregate_type, header:tenant), so a
    /// burst under one value cannot starve the others.
    #[arg(long, env = "OUTBOX_FAIR_BY")]
    pub fair_by: Option<KeyColumn>,

    /// On standard queues, send the --fair-by key as MessageGroupId (SQS fair queues).
    #[arg(long, env = "OUTBOX_FAIR_GROUP_ID", value_parser = BoolishValueParser::new())]
    pub fair_group_id: bool,

    /// Route rows by key value to a queue or topic: KEY=QUEUE_URL or KEY=TOPIC_ARN, repeatable
    /// (env: comma-separated). A row's own queue_url wins; unrouted rows go to --queue-url.
    #[arg(long = "route", env = "OUTBOX_ROUTES", value_delimiter = ',', value_parser = parse_route)]
    pub routes: Vec<(String, Destination)>,

    /// The key --route matches on.
    #[arg(long, env = "OUTBOX_ROUTE_BY", default_value = "aggregate_type")]
    pub route_by: KeyColumn,
}

/// The message body's format.
#[derive(Debug, Clone, Args)]
pub struct FormatArgs {
    /// Message body format.
    #[arg(long, env = "OUTBOX_MESSAGE_FORMAT", value_enum, default_value_t = Format::Raw)]
    pub message_format: Format,

    /// CloudEvents `source` attribute (a URI reference naming the producer).
    #[arg(
        long,
        env = "OUTBOX_CLOUDEVENTS_SOURCE",
        default_value = "/outbox-relay"
    )]
    pub cloudevents_source: String,
}

/// Large message bodies through S3.
#[derive(Debug, Clone, Args)]
pub struct OffloadArgs {
    /// Large events through S3: message bodies above --offload-threshold are stored in this
    /// bucket and sent as a pointer in the SQS Extended Client format (docs/large-events.md).
    #[arg(long, env = "OUTBOX_OFFLOAD_BUCKET")]
    pub offload_bucket: Option<String>,

    /// Put in front of every object key in --offload-bucket, e.g. `outbox/`.
    #[arg(long, env = "OUTBOX_OFFLOAD_PREFIX")]
    pub offload_prefix: Option<String>,

    /// Messages larger than this (body and attributes) go through S3; default: those that do
    /// not fit their destination (an SNS topic's MaximumMessageSize, 256 KiB where it reports
    /// none, which also caps a larger value).
    /// Bytes, or with a KiB/MiB suffix.
    #[arg(long, env = "OUTBOX_OFFLOAD_THRESHOLD", value_parser = parse_bytes)]
    pub offload_threshold: Option<usize>,

    /// S3 endpoint override (local servers, S3-compatible stores); addressed path-style.
    #[arg(long, env = "AWS_ENDPOINT_URL_S3")]
    pub s3_endpoint_url: Option<String>,
}

/// The order group, validated.
#[derive(Debug, Clone)]
pub struct OrderConfig {
    /// How claims choose rows: ordered per group, fair across keys, both or neither.
    pub strategy: ClaimStrategy,
    /// What the planner keeps of the ordering; `None`: unordered.
    pub ordering: Option<PlanOrdering>,
    /// The group key: FIFO `MessageGroupId` and the unit of ordering.
    pub group_by: KeyColumn,
    /// `--route`: key value -> queue URL or topic ARN, for rows without their own `queue_url`.
    pub routes: Vec<(String, Destination)>,
    /// Which key `routes` match on.
    pub route_by: KeyColumn,
    /// Standard queues: send this key as `MessageGroupId` (SQS fair queues).
    pub fair_group: Option<KeyColumn>,
}

/// The offload group, validated.
#[derive(Debug, Clone)]
pub struct OffloadConfig {
    /// Where large bodies go and above which size; `None`: no offload.
    pub plan: Option<OffloadPlan>,
    /// Where S3 is reached when large bodies are offloaded; `None`: AWS's own endpoint.
    pub s3_endpoint: Option<String>,
}

impl OrderArgs {
    /// Ordering is decided per destination, so it needs the default one.
    pub fn validate(&self, destination: &DestinationConfig) -> Result<OrderConfig, String> {
        let queue_url = &destination.queue_url;
        // Ordering is decided per destination queue: with `auto` and a standard default queue,
        // the rows whose own queue_url or route is a FIFO queue are ordered, the others not.
        let scope = match self.ordered {
            Switch::On => Some(OrderScope::Every),
            Switch::Off => None,
            Switch::Auto if queue_url.is_fifo() => Some(OrderScope::Every),
            Switch::Auto => Some(OrderScope::FifoDestinations {
                route_by: self.route_by.clone(),
                fifo_routes: self
                    .routes
                    .iter()
                    .filter(|(_, destination)| destination.is_fifo())
                    .map(|(key, _)| key.clone())
                    .collect(),
            }),
        };
        if self.order_by == OrderBy::Transaction && scope != Some(OrderScope::Every) {
            return Err("--order-by transaction orders every group: it needs --ordered on, or --ordered auto with a FIFO --queue-url".to_string());
        }
        if self.fair_group_id && self.fair_by.is_none() {
            return Err(
                "--fair-group-id sends the --fair-by key as MessageGroupId: set --fair-by too"
                    .to_string(),
            );
        }
        if self.fair_group_id {
            let standard_topic = std::iter::once(queue_url)
                .chain(self.routes.iter().map(|(_, d)| d))
                .find(|d| d.message_group() == MessageGroup::None);
            if let Some(topic) = standard_topic {
                return Err(format!("--fair-group-id is for SQS fair queues; the standard topic {topic} takes no MessageGroupId: route it without --fair-group-id, or use a FIFO topic"));
            }
        }
        let ordered = scope.map(|scope| Ordered {
            key: self.group_by.clone(),
            routing: crate::group::Routing::new(queue_url, &self.routes, &self.route_by),
            skip_poison: self.on_poison == OnPoison::Skip,
            scope,
            by: self.order_by,
        });
        let ordering = ordered.as_ref().map(|o| PlanOrdering {
            every_destination: o.scope == OrderScope::Every,
            skip_poison: o.skip_poison,
        });
        Ok(OrderConfig {
            strategy: ClaimStrategy::new(ordered, self.fair_by.clone()),
            ordering,
            group_by: self.group_by.clone(),
            routes: self.routes.clone(),
            route_by: self.route_by.clone(),
            fair_group: self.fair_by.clone().filter(|_| self.fair_group_id),
        })
    }
}

impl FormatArgs {
    /// CloudEvents needs a source.
    pub fn validate(&self) -> Result<MessageFormat, String> {
        match self.message_format {
            Format::Raw => Ok(MessageFormat::Raw),
            Format::Cloudevents if self.cloudevents_source.trim().is_empty() => {
                Err("--message-format cloudevents needs --cloudevents-source (a URI reference such as /shop/orders)".to_string())
            }
            Format::Cloudevents => Ok(MessageFormat::CloudEvents {
                source: self.cloudevents_source.clone(),
            }),
        }
    }
}

impl OffloadArgs {
    /// `--offload-*`: where large bodies go. The object key is the prefix and a 64-character
    /// digest, within S3's 1024 bytes; a threshold within `max_request_bytes`.
    pub fn validate(&self, max_request_bytes: usize) -> Result<OffloadConfig, String> {
        Ok(OffloadConfig {
            plan: self.plan(max_request_bytes)?,
            s3_endpoint: self.s3_endpoint_url.clone(),
        })
    }

    /// `--offload-*`: where large bodies go. The object key is the prefix and a 64-character
    /// digest, within S3's 1024 bytes.
    fn plan(&self, max_request_bytes: usize) -> Result<Option<OffloadPlan>, String> {
        let prefix = self.offload_prefix.clone().unwrap_or_default();
        let bucket = match self.offload_bucket.as_deref().map(str::trim) {
            Some(bucket) if !bucket.is_empty() => {
                Destination::bucket(bucket).map_err(|e| format!("--offload-bucket {e}"))?
            }
            _ if self.offload_threshold.is_some() || !prefix.is_empty() => {
                return Err(
                    "--offload-threshold and --offload-prefix need --offload-bucket (the S3 bucket large bodies go to)"
                        .to_string(),
                )
            }
            _ => return Ok(None),
        };
        if prefix.len() > 1024 - 64 {
            return Err(format!(
                "--offload-prefix is {} bytes; S3 keys hold 1024 and the relay adds 64",
                prefix.len()
            ));
        }
        if let Some(threshold) = self.offload_threshold {
            if threshold == 0 || threshold > max_request_bytes {
                return Err(format!(
                    "--offload-threshold {threshold} is out of range: use 1 to --max-request-bytes ({})",
                    max_request_bytes
                ));
            }
        }
        if let Some(endpoint) = &self.s3_endpoint_url {
            if !(endpoint.starts_with("https://") || endpoint.starts_with("http://")) {
                return Err(format!(
                    "--s3-endpoint-url {endpoint:?} must start with http:// or https://"
                ));
            }
        }
        Ok(Some(OffloadPlan {
            bucket,
            prefix,
            threshold: self.offload_threshold,
        }))
    }
}
