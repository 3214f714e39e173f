//! Pure planning: claimed rows -> SendMessageBatch requests within SQS's limits.
//!
//! A row that SQS would refuse whatever we do (too large, attributes it cannot carry) is
//! rejected here with its reason, before anything is sent, so it is quarantined instead of
//! retried.

use std::collections::{HashMap, HashSet};

pub use crate::destination::MAX_ENTRIES;
use crate::destination::{Destination, Limits, MessageGroup};
use crate::group::Group;
pub use crate::row::{fifo_id, KeyColumn};
use crate::row::{ClaimedRow, QuarantineReason};

/// SQS carries at most this many message attributes on one message.
const MAX_ATTRIBUTES: usize = 10;
/// Each message attribute is sent as a `String` attribute; its type name counts toward size.
const STRING_TYPE: &str = "String";

/// How the payload becomes the message body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageFormat {
    /// The payload JSON as it is.
    Raw,
    /// A CloudEvents 1.0 structured-mode JSON envelope with the payload as `data`.
    CloudEvents { source: String },
}

/// What the planner needs to know about the destination.
#[derive(Debug, Clone)]
pub struct PlanConfig {
    /// Where rows without their own `queue_url` or a route go.
    pub default_queue_url: Destination,
    /// `--route`: key value -> destination, for rows without their own `queue_url`.
    pub routes: Vec<(String, Destination)>,
    /// Which key `routes` match on.
    pub route_by: KeyColumn,
    /// FIFO `MessageGroupId`.
    pub group_by: KeyColumn,
    /// Standard queues: send this key as `MessageGroupId` (SQS fair queues).
    pub fair_group: Option<KeyColumn>,
    pub format: MessageFormat,
    /// SQS's limit on one message and on the sum of a batch's messages (1 MiB today); a setting
    /// so a deployment can follow a future change, or match a queue's smaller limit.
    pub max_request_bytes: usize,
    /// Ordered delivery, when on: a group's rows of one claim travel in one request, in order.
    pub ordering: Option<PlanOrdering>,
    /// Large bodies through S3 (`--offload-bucket`): what does not fit goes as a pointer.
    pub offload: Option<OffloadPlan>,
}

/// Where and above which size message bodies go to S3 instead of into the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffloadPlan {
    /// `--offload-bucket`: where the bodies go, and the name pointers carry.
    pub bucket: Destination,
    /// Put in front of every object key (`--offload-prefix`), e.g. `outbox/`.
    pub prefix: String,
    /// A message larger than this (body and attributes, as SQS counts it) goes through S3;
    /// `None`: only what would not fit its queue.
    pub threshold: Option<usize>,
}

/// The SQS Extended Client's reserved attribute: the offloaded body's size in bytes. Its
/// presence is what tells a consumer's library to fetch the body from S3.
pub const EXTENDED_PAYLOAD_SIZE: &str = "ExtendedPayloadSize";
/// The pointer class name the Extended Client libraries (Java 2.x, Python, JavaScript) expect
/// as the first element of the pointer body.
const POINTER_CLASS: &str = "software.amazon.payloadoffloading.PayloadS3Pointer";
/// `ExtendedPayloadSize` is a `Number` attribute; its type name counts toward size.
const NUMBER_TYPE: &str = "Number";

/// A message body that goes to S3 before its pointer goes to SQS.
#[derive(Debug, Clone, PartialEq)]
pub struct Offload {
    /// Object key: the prefix and a digest of the event ID, so a resend of the event writes the
    /// same object whatever characters the ID holds.
    pub key: String,
    /// The body as it would have been sent (raw payload or CloudEvents envelope).
    pub body: bytes::Bytes,
}

/// The object key of an event's offloaded body.
pub fn offload_key(prefix: &str, event_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(event_id.as_bytes());
    let mut key = String::with_capacity(prefix.len() + 64);
    key.push_str(prefix);
    for byte in digest {
        key.push_str(&format!("{byte:02x}"));
    }
    key
}

/// The Extended Client's pointer body: `[class, {"s3BucketName": .., "s3Key": ..}]`.
fn pointer_body(bucket: &str, key: &str) -> String {
    serde_json::json!([POINTER_CLASS, {"s3BucketName": bucket, "s3Key": key}]).to_string()
}

/// What the planner must keep for ordered delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanOrdering {
    /// Every destination is ordered (`--ordered on`, a FIFO default queue), not only FIFO ones.
    pub every_destination: bool,
    /// `--on-poison skip`: a rejected row does not hold the rest of its group back.
    pub skip_poison: bool,
}

impl PlanConfig {
    /// The queue a row goes to: its own `queue_url`, else its route, else the default.
    pub fn queue_for<'a>(&'a self, row: &'a ClaimedRow) -> &'a Destination {
        if let Some(own) = &row.queue_url {
            return own;
        }
        if !self.routes.is_empty() {
            if let Some(key) = self.route_by.value(row) {
                if let Some((_, url)) = self.routes.iter().find(|(k, _)| *k == key) {
                    return url;
                }
            }
        }
        &self.default_queue_url
    }

    /// Whether requests to `destination` carry ordered groups: every destination under
    /// `--ordered on` (or a FIFO default queue), else only FIFO ones.
    pub fn keeps_order(&self, destination: &Destination) -> bool {
        self.ordering
            .is_some_and(|o| o.every_destination || destination.is_fifo())
    }

    /// Whether `row` belongs to an ordered group: the claim holds its group-mates back until
    /// it is settled.
    pub fn keeps_order_of(&self, row: &ClaimedRow) -> bool {
        self.keeps_order(self.queue_for(row))
    }
}

/// One message of a batch, in our terms; `sink/sqs.rs` and `sink/sns.rs` turn it into their
/// SDK's entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Index of the row in the claimed slice, to settle the outcome against it.
    pub row: usize,
    /// Batch entry ID: the row's `id`, unique within a request and made only of digits.
    pub id: String,
    /// The payload JSON text.
    pub body: String,
    /// String message attributes, fixed ones first, then the row's headers.
    pub attributes: Vec<(String, String)>,
    /// FIFO only: the message group (the aggregate) that SQS keeps in order.
    pub group_id: Option<String>,
    /// FIFO only: the business event ID, so SQS drops our resends within its window.
    pub dedup_id: Option<String>,
    /// Size as SQS counts it: body plus attribute names, types and values.
    pub size: usize,
    /// Set when `body` is a pointer: what must be in S3 before the message is sent. The
    /// message then carries the `ExtendedPayloadSize` attribute too (a `Number`).
    pub offload: Option<Offload>,
}

impl Entry {
    /// The message attributes as (name, data type, value), as both SQS and SNS take them: the
    /// string attributes, then `ExtendedPayloadSize` (a `Number`) when the body went to S3.
    pub fn typed_attributes(&self) -> impl Iterator<Item = (&str, &'static str, String)> + '_ {
        let strings = self
            .attributes
            .iter()
            .map(|(name, value)| (name.as_str(), STRING_TYPE, value.clone()));
        let size = self
            .offload
            .as_ref()
            .map(|o| (EXTENDED_PAYLOAD_SIZE, NUMBER_TYPE, o.body.len().to_string()));
        strings.chain(size)
    }
}

/// One SendMessageBatch call.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRequest {
    /// Where it goes (a queue or a topic; rows never name a bucket).
    pub destination: Destination,
    pub entries: Vec<Entry>,
}

impl BatchRequest {
    pub fn size(&self) -> usize {
        self.entries.iter().map(|e| e.size).sum()
    }

    /// Splits a request in two halves, to isolate an entry that made the whole request fail.
    pub fn split(mut self) -> (BatchRequest, BatchRequest) {
        let tail = self.entries.split_off(self.entries.len() / 2);
        let other = BatchRequest {
            destination: self.destination.clone(),
            entries: tail,
        };
        (self, other)
    }
}

/// A row that must not be sent, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    pub row: usize,
    pub reason: QuarantineReason,
    pub error: String,
}

#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub requests: Vec<BatchRequest>,
    pub rejected: Vec<Rejected>,
    /// Rows of an ordered group that must not go now (behind a rejected row of their group):
    /// given back without counting an attempt, they come back behind it.
    pub released: Vec<usize>,
    /// Requests that go only once another was accepted entry by entry: the rest of a group too
    /// long for one request, keyed by the first entry `id` of the request it follows.
    pub follow_ups: Vec<(String, BatchRequest)>,
}

/// Groups rows into requests within their destination's [`Limits`] (entries, and bytes under
/// `max_request_bytes`),
/// keeping claim order within each queue.
///
/// Under ordered delivery a group's rows of one claim (its head and the rows claimed behind it)
/// go in one request, in id order: SQS keeps the order of one group's entries within a FIFO
/// `SendMessageBatch`, and a group never has two requests in flight. A row that does not fit its
/// group's request, or follows a rejected row of its group, is released instead.
pub fn plan(rows: &[ClaimedRow], config: &PlanConfig) -> Plan {
    plan_within(rows, config, &HashMap::new())
}

/// [`plan`], with the `MaximumMessageSize` each destination reported (destination -> bytes;
/// the rule that turns it into a limit is [`Destination::limits`]). A topic's decides which of
/// its events go through S3 and which are too large. A queue's matters where order is kept: a
/// queue whose limit is below `--max-request-bytes` would refuse a larger entry of a FIFO batch
/// after accepting the group's entries before it, and the group's order would be lost.
/// Validated here, the entry is quarantined and the rest of its group held.
pub fn plan_within(
    rows: &[ClaimedRow],
    config: &PlanConfig,
    reported: &HashMap<Destination, usize>,
) -> Plan {
    let limit_of = |destination: &Destination| {
        destination.limits(config.max_request_bytes, reported.get(destination).copied())
    };
    let mut plan = Plan::default();
    // First the units that must travel together, in claim order: an ordered group's entries
    // (its head and the rows claimed behind it), or one entry of an unordered row.
    let mut units: Vec<(Destination, Vec<Entry>)> = Vec::new();
    let mut group_unit: HashMap<Group, usize> = HashMap::new();
    let mut held: HashSet<Group> = HashSet::new();
    for (index, row) in rows.iter().enumerate() {
        let destination = config.queue_for(row);
        let group = config
            .keeps_order(destination)
            .then(|| Group::of(row, destination, &config.group_by))
            .flatten();
        if let Some(g) = &group {
            if held.contains(g) {
                plan.released.push(index);
                continue;
            }
        }
        let entry = match entry_for(index, row, destination, config, limit_of(destination).bytes) {
            Ok(entry) => entry,
            Err(rejected) => {
                plan.rejected.push(rejected);
                if let (Some(g), Some(o)) = (group, config.ordering) {
                    if !o.skip_poison {
                        held.insert(g);
                    }
                }
                continue;
            }
        };
        match group.and_then(|g| match group_unit.get(&g) {
            Some(&unit) => Some(unit),
            None => {
                group_unit.insert(g, units.len());
                None
            }
        }) {
            Some(unit) => units[unit].1.push(entry),
            None => units.push((destination.clone(), vec![entry])),
        }
    }
    // Then whole units into requests within their destination's count and size
    // limit. A unit that cannot fit one request alone goes as a chain of requests, each sent
    // once the one before was accepted: a group never has two requests in flight.
    let mut filling: HashMap<Destination, usize> = HashMap::new();
    for (destination, mut entries) in units {
        let Limits {
            entries: max_entries,
            bytes: max_bytes,
        } = limit_of(&destination);
        let total: usize = entries.iter().map(|e| e.size).sum();
        if entries.len() > max_entries || total > max_bytes {
            let mut chain: Vec<BatchRequest> = Vec::new();
            for entry in entries {
                let full = chain.last().is_none_or(|r| {
                    r.entries.len() == max_entries || r.size() + entry.size > max_bytes
                });
                if full {
                    chain.push(BatchRequest {
                        destination: destination.clone(),
                        entries: Vec::with_capacity(max_entries),
                    });
                }
                chain.last_mut().expect("pushed").entries.push(entry);
            }
            let mut chain = chain.into_iter();
            let first = chain.next().expect("a long unit");
            let mut previous = first.entries[0].id.clone();
            plan.requests.push(first);
            for request in chain {
                let next = request.entries[0].id.clone();
                plan.follow_ups.push((previous, request));
                previous = next;
            }
            continue;
        }
        let fits = |r: &BatchRequest, entries: &[Entry]| {
            r.entries.len() + entries.len() <= max_entries
                && r.size() + entries.iter().map(|e| e.size).sum::<usize>() <= max_bytes
        };
        let slot = match filling.get(&destination) {
            Some(&slot) if fits(&plan.requests[slot], &entries) => slot,
            _ => {
                plan.requests.push(BatchRequest {
                    destination: destination.clone(),
                    entries: Vec::with_capacity(max_entries),
                });
                filling.insert(destination.clone(), plan.requests.len() - 1);
                plan.requests.len() - 1
            }
        };
        // The unit fits one request (longer ones went as a chain above), so a fresh one holds it.
        plan.requests[slot].entries.append(&mut entries);
    }
    plan
}

fn entry_for(
    index: usize,
    row: &ClaimedRow,
    destination: &Destination,
    config: &PlanConfig,
    max_bytes: usize,
) -> Result<Entry, Rejected> {
    let invalid = |error: String| Rejected {
        row: index,
        reason: QuarantineReason::Invalid,
        error,
    };
    if let Some(unreadable) = &row.unreadable {
        return Err(invalid(unreadable.error.clone()));
    }
    let mut attributes = Vec::with_capacity(4);
    for (name, value) in [
        ("event_id", &row.event_id),
        ("event_type", &row.event_type),
        ("aggregate_type", &row.aggregate_type),
        ("aggregate_id", &row.aggregate_id),
    ] {
        check_attribute_value(name, value).map_err(invalid)?;
        attributes.push((name.to_string(), value.clone()));
    }
    for (name, value) in header_attributes(&row.headers).map_err(invalid)? {
        check_attribute_name(&name).map_err(invalid)?;
        if attributes.iter().any(|(n, _)| *n == name) {
            return Err(invalid(format!(
                "header {name:?} collides with an attribute the relay sets itself"
            )));
        }
        check_attribute_value(&name, &value).map_err(invalid)?;
        attributes.push((name, value));
    }
    if attributes.len() > MAX_ATTRIBUTES {
        return Err(invalid(format!(
            "{} message attributes (4 fixed + {} headers); SQS allows {MAX_ATTRIBUTES}",
            attributes.len(),
            attributes.len() - 4
        )));
    }
    let body = match &config.format {
        MessageFormat::Raw => row.payload.clone(),
        MessageFormat::CloudEvents { source } => {
            // A jsonb payload always is JSON; an adopted text column need not be, and spliced
            // in as `data` it would make the whole envelope unparseable for every consumer.
            if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&row.payload) {
                return Err(invalid(format!(
                    "payload is not JSON ({e}); CloudEvents carries it as `data`, declared application/json"
                )));
            }
            cloudevent(row, source)
        }
    };
    if let Some(bad) = body.chars().find(|c| !sqs_allows(*c)) {
        return Err(invalid(format!(
            "payload contains U+{:04X}, which SQS does not accept in a message body",
            bad as u32
        )));
    }
    let attributes_size = attributes
        .iter()
        .map(|(n, v)| n.len() + STRING_TYPE.len() + v.len())
        .sum::<usize>();
    let mut size = body.len() + attributes_size;
    let mut body = body;
    let mut offload = None;
    if let Some(plan) = &config.offload {
        if size > plan.threshold.unwrap_or(max_bytes).min(max_bytes) {
            if attributes.len() >= MAX_ATTRIBUTES {
                return Err(invalid(format!(
                    "{} message attributes leave no room for {EXTENDED_PAYLOAD_SIZE}, which a message through S3 needs; SQS allows {MAX_ATTRIBUTES}",
                    attributes.len()
                )));
            }
            let key = offload_key(&plan.prefix, &row.event_id);
            let pointer = pointer_body(plan.bucket.address(), &key);
            let payload_size = body.len().to_string();
            size = pointer.len()
                + attributes_size
                + EXTENDED_PAYLOAD_SIZE.len()
                + NUMBER_TYPE.len()
                + payload_size.len();
            offload = Some(Offload {
                key,
                body: bytes::Bytes::from(std::mem::replace(&mut body, pointer)),
            });
        }
    }
    if size > max_bytes {
        return Err(Rejected {
            row: index,
            reason: QuarantineReason::TooLarge,
            error: format!("message is {size} bytes with its attributes; the limit is {max_bytes}"),
        });
    }
    // Fair-queue group IDs are an SQS feature: a standard topic gets none (start-up refuses
    // --fair-group-id with a configured topic; a row's own topic just goes without).
    let group_key = match destination.message_group() {
        MessageGroup::Required => Some(&config.group_by),
        MessageGroup::Fair => config.fair_group.as_ref(),
        MessageGroup::None => None,
    };
    let group_id = match group_key {
        Some(key) => match key.value(row) {
            Some(value) if !value.is_empty() => Some(fifo_id(&value)),
            _ => {
                return Err(invalid(format!(
                    "no {key} on this row: it is the message group (--group-by / --fair-by)"
                )))
            }
        },
        None => None,
    };
    let dedup_id = destination
        .takes_dedup_id()
        .then(|| fifo_id(row.dedup_id.as_deref().unwrap_or(&row.event_id)));
    Ok(Entry {
        row: index,
        id: row.id.to_string(),
        body,
        attributes,
        group_id,
        dedup_id,
        size,
        offload,
    })
}

/// The CloudEvents 1.0 structured JSON envelope. The payload is spliced in as `data` without
/// re-parsing: it is already JSON text from PostgreSQL.
fn cloudevent(row: &ClaimedRow, source: &str) -> String {
    let text = |s: &str| serde_json::Value::from(s).to_string();
    format!(
        r#"{{"specversion":"1.0","id":{},"source":{},"type":{},"subject":{},"time":{},"datacontenttype":"application/json","data":{}}}"#,
        text(&row.event_id),
        text(source),
        text(&row.event_type),
        text(&row.aggregate_id),
        text(&row.created_at),
        row.payload
    )
}

/// Headers are a JSON object of string values; numbers and booleans are sent as their text.
fn header_attributes(headers: &serde_json::Value) -> Result<Vec<(String, String)>, String> {
    let map = match headers {
        serde_json::Value::Null => return Ok(Vec::new()),
        serde_json::Value::Object(map) => map,
        other => {
            return Err(format!(
                "headers must be a JSON object, found {}",
                kind(other)
            ))
        }
    };
    map.iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => Ok((k.clone(), s.clone())),
            serde_json::Value::Number(n) => Ok((k.clone(), n.to_string())),
            serde_json::Value::Bool(b) => Ok((k.clone(), b.to_string())),
            other => Err(format!(
                "header {k:?} must be a string, number or boolean, found {}",
                kind(other)
            )),
        })
        .collect()
}

fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// SQS's rule for attribute names: letters, digits, `_`, `-`, `.`; no `AWS.`/`Amazon.` prefix,
/// no leading, trailing or doubled period; at most 256 characters.
fn check_attribute_name(name: &str) -> Result<(), String> {
    let lower = name.to_ascii_lowercase();
    let ok = !name.is_empty()
        && name.len() <= 256
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
        && !lower.starts_with("aws.")
        && !lower.starts_with("amazon.");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "header name {name:?} is not a valid SQS attribute name (letters, digits, _ - . ; no AWS./Amazon. prefix)"
        ))
    }
}

fn check_attribute_value(name: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("{name} is empty; SQS attributes need a value"));
    }
    if let Some(bad) = value.chars().find(|c| !sqs_allows(*c)) {
        return Err(format!(
            "{name} contains U+{:04X}, which SQS does not accept",
            bad as u32
        ));
    }
    Ok(())
}

/// The characters SQS accepts in bodies and attribute values (XML 1.0's set). Rust strings
/// cannot hold surrogates, so only controls and the two non-characters remain to exclude.
fn sqs_allows(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && c != '\u{FFFE}' && c != '\u{FFFF}')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::destination::SNS_UNREPORTED_MAX_BYTES;
    use serde_json::json;

    /// A destination as a row or a flag names it.
    fn to(text: &str) -> Destination {
        Destination::of_row(text)
    }

    fn row(id: i64, payload: &str) -> ClaimedRow {
        ClaimedRow {
            id,
            event_id: format!("ev-{id}"),
            aggregate_type: "order".into(),
            aggregate_id: format!("{}", id % 3),
            event_type: "order.paid".into(),
            payload: payload.into(),
            headers: json!({}),
            queue_url: None,
            lease_token: 1,
            attempts: 1,
            created_at_epoch: 0.0,
            created_at: "2026-11-29T10:00:00.123456Z".into(),
            unreadable: None,
            dedup_id: None,
        }
    }

    fn config() -> PlanConfig {
        PlanConfig {
            default_queue_url: to("http://q/standard"),
            routes: Vec::new(),
            route_by: KeyColumn::AggregateType,
            group_by: KeyColumn::AggregateId,
            fair_group: None,
            format: MessageFormat::Raw,
            max_request_bytes: 1024 * 1024,
            ordering: None,
            offload: None,
        }
    }

    const TOPIC: &str = "arn:aws:sns:eu-west-1:123456789012:orders";
    const FIFO_TOPIC: &str = "arn:aws:sns:eu-west-1:123456789012:orders.fifo";

    #[test]
    fn a_topic_that_reports_no_size_takes_at_most_256_kib_per_message_and_per_request() {
        // 30 rows of ~40 KiB: a queue takes them in requests of 10 (under 1 MiB), a topic that
        // reports no MaximumMessageSize in requests of 6 (under 256 KiB); a 300 KiB row is too
        // large only for the topic.
        let body = format!("\"{}\"", "z".repeat(40 * 1024));
        let huge = format!("\"{}\"", "h".repeat(300 * 1024));
        let mut rows: Vec<_> = (1..=30).map(|i| row(i, &body)).collect();
        rows.push(row(31, &huge));
        let queue = plan(&rows, &config());
        assert!(queue.rejected.is_empty());
        assert_eq!(queue.requests[0].entries.len(), 10);
        let mut cfg = config();
        cfg.default_queue_url = to(TOPIC);
        let topic = plan(&rows, &cfg);
        assert_eq!(topic.rejected.len(), 1);
        assert_eq!(topic.rejected[0].reason, QuarantineReason::TooLarge);
        assert!(topic.rejected[0].error.contains("limit is 262144"));
        for r in &topic.requests {
            assert_eq!(r.destination, to(TOPIC));
            assert!(r.size() <= SNS_UNREPORTED_MAX_BYTES, "{} bytes", r.size());
        }
        assert_eq!(topic.requests[0].entries.len(), 6);
    }

    #[test]
    fn a_topic_that_reports_1_mib_takes_a_300_kib_event_whole_and_batches_up_to_it() {
        // The same rows as above, to a topic that reports MaximumMessageSize 1 MiB: the 300 KiB
        // row fits, and requests close at 1 MiB (10 entries of ~40 KiB) instead of 256 KiB.
        let body = format!("\"{}\"", "z".repeat(40 * 1024));
        let huge = format!("\"{}\"", "h".repeat(300 * 1024));
        let mut rows: Vec<_> = (1..=30).map(|i| row(i, &body)).collect();
        rows.push(row(31, &huge));
        let mut cfg = config();
        cfg.default_queue_url = to(TOPIC);
        let reported = HashMap::from([(to(TOPIC), 1024 * 1024)]);
        let topic = plan_within(&rows, &cfg, &reported);
        assert!(topic.rejected.is_empty(), "{:?}", topic.rejected);
        assert_eq!(topic.requests[0].entries.len(), 10);
        assert!(topic.requests.iter().all(|r| r.size() <= 1024 * 1024));
        // With a bucket, the 300 KiB row still goes whole; to a topic that reports nothing it
        // goes through S3.
        let mut to_topic = row(1, &huge);
        to_topic.queue_url = Some(to(TOPIC));
        let whole = plan_within(
            std::slice::from_ref(&to_topic),
            &offloading(None),
            &reported,
        );
        assert_eq!(whole.requests[0].entries[0].offload, None);
        let offloaded = plan(std::slice::from_ref(&to_topic), &offloading(None));
        assert!(offloaded.requests[0].entries[0].offload.is_some());
        // A topic that reports less than 256 KiB is held to it.
        let small = HashMap::from([(to(TOPIC), 64 * 1024)]);
        let held = plan_within(&rows[..1], &cfg, &small);
        assert!(held.rejected.is_empty());
        let held = plan_within(
            &[row(1, &format!("\"{}\"", "s".repeat(100 * 1024)))],
            &cfg,
            &small,
        );
        assert!(
            held.rejected[0].error.contains("limit is 65536"),
            "{:?}",
            held.rejected
        );
    }

    #[test]
    fn a_fifo_topic_gets_group_and_dedup_ids_and_a_standard_topic_no_fair_group() {
        let mut cfg = config();
        cfg.routes = vec![("fifo".into(), to(FIFO_TOPIC))];
        cfg.fair_group = Some(KeyColumn::AggregateType);
        let mut fifo_row = row(1, "{}");
        fifo_row.aggregate_type = "fifo".into();
        let mut topic_row = row(2, "{}");
        topic_row.queue_url = Some(to(TOPIC));
        let plan = plan(&[fifo_row, topic_row, row(3, "{}")], &cfg);
        let entry = |to: &str| {
            plan.requests
                .iter()
                .find(|r| r.destination.to_string() == to)
                .map(|r| r.entries[0].clone())
                .expect("a request")
        };
        let fifo = entry(FIFO_TOPIC);
        assert_eq!(fifo.group_id.as_deref(), Some("1"));
        assert_eq!(fifo.dedup_id.as_deref(), Some("ev-1"));
        let standard = entry(TOPIC);
        assert_eq!((standard.group_id, standard.dedup_id), (None, None));
        assert_eq!(
            entry("http://q/standard").group_id.as_deref(),
            Some("order")
        );
    }

    #[test]
    fn at_most_ten_entries_per_request_in_claim_order() {
        let rows: Vec<_> = (1..=25).map(|i| row(i, "{}")).collect();
        let plan = plan(&rows, &config());
        assert!(plan.rejected.is_empty());
        let sizes: Vec<_> = plan.requests.iter().map(|r| r.entries.len()).collect();
        assert_eq!(sizes, vec![10, 10, 5]);
        let ids: Vec<_> = plan
            .requests
            .iter()
            .flat_map(|r| r.entries.iter().map(|e| e.id.clone()))
            .collect();
        let expected: Vec<_> = (1..=25).map(|i| i.to_string()).collect();
        assert_eq!(ids, expected);
    }

    #[test]
    fn the_request_size_limit_closes_a_batch_early() {
        let big = format!("\"{}\"", "x".repeat(400));
        let rows: Vec<_> = (1..=6).map(|i| row(i, &big)).collect();
        let mut cfg = config();
        cfg.max_request_bytes = 1000;
        let plan = plan(&rows, &cfg);
        assert!(plan.rejected.is_empty());
        for r in &plan.requests {
            assert!(r.size() <= 1000, "request of {} bytes", r.size());
        }
        assert_eq!(plan.requests.len(), 3);
    }

    #[test]
    fn a_row_that_can_never_fit_is_rejected_too_large_and_others_flow() {
        let mut cfg = config();
        cfg.max_request_bytes = 500;
        let huge = format!("\"{}\"", "y".repeat(600));
        let rows = vec![row(1, "{}"), row(2, &huge), row(3, "{}")];
        let plan = plan(&rows, &cfg);
        assert_eq!(plan.rejected.len(), 1);
        assert_eq!(plan.rejected[0].row, 1);
        assert_eq!(plan.rejected[0].reason, QuarantineReason::TooLarge);
        assert!(plan.rejected[0].error.contains("limit is 500"));
        assert_eq!(plan.requests.len(), 1);
        assert_eq!(plan.requests[0].entries.len(), 2);
    }

    #[test]
    fn size_counts_body_and_attribute_names_types_and_values() {
        let mut r = row(7, "{\"a\":1}");
        r.headers = json!({"traceparent": "00-abc-def-01"});
        let plan = plan(&[r], &config());
        let e = &plan.requests[0].entries[0];
        let expected = 7
            + ("event_id".len() + 6 + "ev-7".len())
            + ("event_type".len() + 6 + "order.paid".len())
            + ("aggregate_type".len() + 6 + "order".len())
            + ("aggregate_id".len() + 6 + "1".len())
            + ("traceparent".len() + 6 + "00-abc-def-01".len());
        assert_eq!(e.size, expected);
    }

    #[test]
    fn attributes_follow_the_design_mapping() {
        let mut r = row(4, "{\"order_id\":4}");
        r.headers = json!({"traceparent": "00-1-2-01", "tenant": 42});
        let plan = plan(&[r], &config());
        let e = &plan.requests[0].entries[0];
        assert_eq!(e.body, "{\"order_id\":4}");
        assert_eq!(e.id, "4");
        let get = |n: &str| {
            e.attributes
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("event_id"), Some("ev-4"));
        assert_eq!(get("event_type"), Some("order.paid"));
        assert_eq!(get("aggregate_type"), Some("order"));
        assert_eq!(get("aggregate_id"), Some("1"));
        assert_eq!(get("traceparent"), Some("00-1-2-01"));
        assert_eq!(get("tenant"), Some("42"));
        assert_eq!(e.group_id, None);
        assert_eq!(e.dedup_id, None);
    }

    #[test]
    fn bad_headers_are_rejected_as_invalid_with_a_reason() {
        let cases = [
            (json!({"a": {"nested": true}}), "must be a string"),
            (json!({"AWS.trace": "x"}), "not a valid SQS attribute name"),
            (json!({"event_id": "x"}), "collides"),
            (json!({"h": ""}), "empty"),
            (json!([1, 2]), "JSON object"),
            (
                json!({"h1":"v","h2":"v","h3":"v","h4":"v","h5":"v","h6":"v","h7":"v"}),
                "SQS allows 10",
            ),
        ];
        for (headers, why) in cases {
            let mut r = row(1, "{}");
            r.headers = headers.clone();
            let plan = plan(&[r, row(2, "{}")], &config());
            assert_eq!(plan.rejected.len(), 1, "{headers}");
            assert_eq!(plan.rejected[0].reason, QuarantineReason::Invalid);
            assert!(
                plan.rejected[0].error.contains(why),
                "{}",
                plan.rejected[0].error
            );
            assert_eq!(plan.requests[0].entries.len(), 1, "the good row still goes");
        }
    }

    #[test]
    fn control_characters_in_attributes_are_invalid() {
        let mut r = row(1, "{}");
        r.aggregate_id = "a\u{1}b".into();
        let plan = plan(&[r], &config());
        assert_eq!(plan.rejected[0].reason, QuarantineReason::Invalid);
        assert!(plan.rejected[0].error.contains("U+0001"));
    }

    #[test]
    fn rows_go_to_their_own_queue_url_when_set() {
        let mut a = row(1, "{}");
        a.queue_url = Some(to("http://q/other"));
        let plan = plan(&[a, row(2, "{}"), row(3, "{}")], &config());
        assert_eq!(plan.requests.len(), 2);
        let other = plan
            .requests
            .iter()
            .find(|r| r.destination == to("http://q/other"))
            .unwrap();
        assert_eq!(other.entries.len(), 1);
        let default = plan
            .requests
            .iter()
            .find(|r| r.destination == to("http://q/standard"))
            .unwrap();
        assert_eq!(default.entries.len(), 2);
    }

    #[test]
    fn fifo_queues_get_group_and_dedup_ids() {
        let mut cfg = config();
        cfg.default_queue_url = to("http://q/000000000000/orders.fifo");
        let mut r = row(5, "{}");
        r.aggregate_id = "order-17".into();
        r.event_id = "order-17:paid".into();
        let plan = plan(&[r], &cfg);
        let e = &plan.requests[0].entries[0];
        assert_eq!(e.group_id.as_deref(), Some("order-17"));
        assert_eq!(e.dedup_id.as_deref(), Some("order-17:paid"));
    }

    #[test]
    fn a_replayed_row_carries_its_own_dedup_id_and_keeps_its_event_id() {
        let mut cfg = config();
        cfg.default_queue_url = to("http://q/000000000000/orders.fifo");
        let mut r = row(5, "{}");
        r.event_id = "order-17:paid".into();
        r.dedup_id = Some("order-17:paid:replay:1".into());
        let plan = plan(&[r], &cfg);
        let e = &plan.requests[0].entries[0];
        assert_eq!(e.dedup_id.as_deref(), Some("order-17:paid:replay:1"));
        let attribute = e.attributes.iter().find(|(k, _)| k == "event_id");
        assert_eq!(attribute.map(|(_, v)| v.as_str()), Some("order-17:paid"));
    }

    #[test]
    fn invalid_fifo_ids_become_their_sha256_hex() {
        // Known answer from `printf 'a b' | sha256sum`; the space is not allowed in an ID.
        assert_eq!(
            fifo_id("a b"),
            "c8687a08aa5d6ed2044328fa6a697ab8e96dc34291e8c2034ae8c38e6fcc6d65"
        );
        assert_eq!(fifo_id("a b").len(), 64);
        assert_eq!(fifo_id("a b"), fifo_id("a b"), "stable");
        assert_ne!(fifo_id("a b"), fifo_id("a c"));
        assert_eq!(fifo_id(&"x".repeat(128)), "x".repeat(128));
        assert_eq!(fifo_id(&"x".repeat(129)).len(), 64);
        assert_eq!(fifo_id("é").len(), 64);
        assert_eq!(fifo_id("").len(), 64);
        assert_eq!(fifo_id("ok-1:paid!"), "ok-1:paid!");
    }

    #[test]
    fn the_group_key_is_configurable_and_a_missing_one_is_invalid() {
        let mut cfg = config();
        cfg.default_queue_url = to("http://q/1/orders.fifo");
        cfg.group_by = "header:tenant".parse().unwrap();
        let mut with = row(1, "{}");
        with.headers = json!({"tenant": "acme"});
        let without = row(2, "{}");
        let plan = plan(&[with, without], &cfg);
        assert_eq!(
            plan.requests[0].entries[0].group_id.as_deref(),
            Some("acme")
        );
        assert_eq!(plan.rejected.len(), 1);
        assert!(
            plan.rejected[0].error.contains("no header:tenant"),
            "{}",
            plan.rejected[0].error
        );
        cfg.group_by = KeyColumn::AggregateType;
        let plan = super::plan(&[row(3, "{}")], &cfg);
        assert_eq!(
            plan.requests[0].entries[0].group_id.as_deref(),
            Some("order")
        );
    }

    #[test]
    fn key_names_are_checked() {
        assert_eq!(
            "aggregate_id".parse::<KeyColumn>(),
            Ok(KeyColumn::AggregateId)
        );
        assert_eq!(
            "header:x-tenant.id".parse::<KeyColumn>(),
            Ok(KeyColumn::Header("x-tenant.id".into()))
        );
        for bad in ["header:", "header:a'b", "payload", "header:a b"] {
            assert!(bad.parse::<KeyColumn>().is_err(), "{bad}");
        }
    }

    #[test]
    fn standard_queues_can_carry_the_fairness_key_as_group_id() {
        let mut cfg = config();
        cfg.fair_group = Some(KeyColumn::AggregateType);
        let plan = plan(&[row(1, "{}")], &cfg);
        let e = &plan.requests[0].entries[0];
        assert_eq!(e.group_id.as_deref(), Some("order"));
        assert_eq!(e.dedup_id, None);
    }

    #[test]
    fn routes_pick_the_queue_by_key_unless_the_row_names_its_own() {
        let mut cfg = config();
        cfg.routes = vec![
            ("order".into(), to("http://q/orders")),
            ("invoice".into(), to("http://q/invoices")),
        ];
        let mut invoice = row(2, "{}");
        invoice.aggregate_type = "invoice".into();
        let mut own = row(3, "{}");
        own.queue_url = Some(to("http://q/own"));
        let mut other = row(4, "{}");
        other.aggregate_type = "customer".into();
        let plan = plan(&[row(1, "{}"), invoice, own, other], &cfg);
        let queue_of = |id: &str| {
            plan.requests
                .iter()
                .find(|r| r.entries.iter().any(|e| e.id == id))
                .map(|r| r.destination.to_string())
                .unwrap()
        };
        assert_eq!(queue_of("1"), "http://q/orders");
        assert_eq!(queue_of("2"), "http://q/invoices");
        assert_eq!(queue_of("3"), "http://q/own");
        assert_eq!(queue_of("4"), "http://q/standard");
        cfg.route_by = KeyColumn::EventType;
        cfg.routes = vec![("order.paid".into(), to("http://q/paid"))];
        assert_eq!(cfg.queue_for(&row(9, "{}")), &to("http://q/paid"));
    }

    #[test]
    fn cloudevents_wrap_the_payload_in_a_structured_envelope() {
        let mut cfg = config();
        cfg.format = MessageFormat::CloudEvents {
            source: "/shop/orders".into(),
        };
        let plan = plan(&[row(5, "{\"order_id\": 5}")], &cfg);
        let e = &plan.requests[0].entries[0];
        let v: serde_json::Value = serde_json::from_str(&e.body).unwrap();
        assert_eq!(v["specversion"], "1.0");
        assert_eq!(v["id"], "ev-5");
        assert_eq!(v["type"], "order.paid");
        assert_eq!(v["source"], "/shop/orders");
        assert_eq!(v["subject"], "2");
        assert_eq!(v["time"], "2026-11-29T10:00:00.123456Z");
        assert_eq!(v["datacontenttype"], "application/json");
        assert_eq!(v["data"], json!({"order_id": 5}));
        let attrs: usize = e
            .attributes
            .iter()
            .map(|(n, v)| n.len() + 6 + v.len())
            .sum();
        assert_eq!(e.size, e.body.len() + attrs);
    }

    #[test]
    fn cloudevents_refuse_a_payload_that_is_not_json_and_raw_sends_it_as_stored() {
        let mut cfg = config();
        let text = row(6, "plain text, not JSON");
        let raw = plan(std::slice::from_ref(&text), &cfg);
        assert_eq!(raw.requests[0].entries[0].body, "plain text, not JSON");
        cfg.format = MessageFormat::CloudEvents {
            source: "/shop/orders".into(),
        };
        let plan = plan(&[text, row(7, "{\"ok\": true}")], &cfg);
        assert_eq!(plan.rejected.len(), 1);
        assert_eq!(plan.rejected[0].row, 0);
        assert_eq!(plan.rejected[0].reason, QuarantineReason::Invalid);
        assert!(
            plan.rejected[0].error.starts_with("payload is not JSON"),
            "{:?}",
            plan.rejected[0]
        );
        assert_eq!(plan.requests[0].entries.len(), 1);
    }

    #[test]
    fn split_halves_a_request() {
        let rows: Vec<_> = (1..=5).map(|i| row(i, "{}")).collect();
        let plan = plan(&rows, &config());
        let (a, b) = plan.requests[0].clone().split();
        assert_eq!(a.entries.len() + b.entries.len(), 5);
        assert_eq!(a.entries[0].id, "1");
        assert_eq!(b.entries[0].id, "3");
    }

    fn ordered_fifo() -> PlanConfig {
        let mut cfg = config();
        cfg.default_queue_url = to("http://q/1/orders.fifo");
        cfg.ordering = Some(PlanOrdering {
            every_destination: true,
            skip_poison: false,
        });
        cfg
    }

    /// Rows of one group, ids 1..=n.
    fn group(n: i64) -> Vec<ClaimedRow> {
        (1..=n)
            .map(|i| {
                let mut r = row(i, "{}");
                r.aggregate_id = "g".into();
                r
            })
            .collect()
    }

    #[test]
    fn a_groups_rows_of_one_claim_travel_in_one_request_in_order() {
        let mut rows = group(10);
        let mut other = row(11, "{}");
        other.aggregate_id = "h".into();
        rows.insert(3, other);
        let plan = plan(&rows, &ordered_fifo());
        assert!(plan.rejected.is_empty() && plan.released.is_empty());
        let of_g: Vec<&BatchRequest> = plan
            .requests
            .iter()
            .filter(|r| r.entries.iter().any(|e| e.group_id.as_deref() == Some("g")))
            .collect();
        assert_eq!(of_g.len(), 1, "one request for the group");
        let ids: Vec<&str> = of_g[0]
            .entries
            .iter()
            .filter(|e| e.group_id.as_deref() == Some("g"))
            .map(|e| e.id.as_str())
            .collect();
        assert_eq!(ids, ["1", "2", "3", "4", "5", "6", "7", "8", "9", "10"]);
    }

    #[test]
    fn a_rejected_row_holds_the_rest_of_its_group_unless_poison_is_skipped() {
        let mut rows = group(4);
        rows[1].aggregate_type = "bad\u{1}".into();
        let plan = plan(&rows, &ordered_fifo());
        assert_eq!(plan.rejected.len(), 1);
        assert_eq!(plan.rejected[0].row, 1);
        assert_eq!(plan.released, vec![2, 3], "behind the rejected row");
        assert_eq!(plan.requests.len(), 1);
        assert_eq!(plan.requests[0].entries.len(), 1);
        let mut skip = ordered_fifo();
        skip.ordering = Some(PlanOrdering {
            every_destination: true,
            skip_poison: true,
        });
        let plan = super::plan(&rows, &skip);
        assert!(plan.released.is_empty());
        assert_eq!(plan.requests[0].entries.len(), 3);
    }

    #[test]
    fn an_unreadable_row_is_rejected_in_its_place_and_holds_its_group_unless_poison_is_skipped() {
        let mut rows = group(3);
        rows[1].unreadable = Some(crate::row::Unreadable {
            error: "column \"headers\" is not a JSON object but an array".into(),
            columns: vec!["headers"],
        });
        let plan = plan(&rows, &ordered_fifo());
        assert_eq!(plan.rejected.len(), 1);
        assert_eq!(plan.rejected[0].row, 1);
        assert_eq!(plan.rejected[0].reason, QuarantineReason::Invalid);
        assert!(plan.rejected[0].error.contains("not a JSON object"));
        assert_eq!(plan.released, vec![2], "behind the unreadable row");
        let mut skip = ordered_fifo();
        skip.ordering = Some(PlanOrdering {
            every_destination: true,
            skip_poison: true,
        });
        let plan = super::plan(&rows, &skip);
        assert!(plan.released.is_empty());
        let sent: Vec<&str> = plan.requests[0]
            .entries
            .iter()
            .map(|e| e.id.as_str())
            .collect();
        assert_eq!(sent, ["1", "3"]);
        // A row whose group key cannot be read is in no group: it holds nothing.
        rows[1].unreadable = Some(crate::row::Unreadable {
            error: "column \"aggregate_id\" is NULL".into(),
            columns: vec!["aggregate_id"],
        });
        rows[1].aggregate_id = String::new();
        let plan = super::plan(&rows, &ordered_fifo());
        assert_eq!(plan.rejected.len(), 1);
        assert!(plan.released.is_empty());
    }

    #[test]
    fn the_same_key_on_two_destinations_is_two_groups() {
        let mut rows = group(3);
        rows[0].queue_url = Some(to("http://q/1/other.fifo"));
        rows[0].aggregate_type = "bad\u{1}".into();
        let plan = plan(&rows, &ordered_fifo());
        assert_eq!(plan.rejected.len(), 1);
        assert!(
            plan.released.is_empty(),
            "the default queue's group is not held"
        );
        assert_eq!(plan.requests[0].entries.len(), 2);
    }

    #[test]
    fn header_numbers_keep_their_json_text() {
        let headers: serde_json::Value = serde_json::from_str(
            r#"{"big": 12345678901234567890123, "exact": 0.1000000000000000055511151231257827, "neg": -7}"#,
        )
        .unwrap();
        let attributes: HashMap<String, String> =
            header_attributes(&headers).unwrap().into_iter().collect();
        assert_eq!(attributes["big"], "12345678901234567890123");
        assert_eq!(attributes["exact"], "0.1000000000000000055511151231257827");
        assert_eq!(attributes["neg"], "-7");
        let mut r = row(1, "{}");
        r.headers = headers;
        let key: KeyColumn = "header:big".parse().unwrap();
        assert_eq!(key.value(&r).unwrap(), "12345678901234567890123");
    }

    #[test]
    fn what_does_not_fit_a_groups_request_follows_it() {
        let big = format!("\"{}\"", "y".repeat(400));
        let rows: Vec<ClaimedRow> = group(4)
            .into_iter()
            .map(|mut r| {
                r.payload = big.clone();
                r
            })
            .collect();
        let mut cfg = ordered_fifo();
        cfg.max_request_bytes = 1000;
        let plan = plan(&rows, &cfg);
        assert_eq!(plan.requests.len(), 1);
        assert_eq!(plan.requests[0].entries.len(), 2);
        assert!(plan.released.is_empty());
        // The rest follows the first request, never beside it.
        assert_eq!(plan.follow_ups.len(), 1);
        assert_eq!(plan.follow_ups[0].0, "1");
        let ids: Vec<&str> = plan.follow_ups[0]
            .1
            .entries
            .iter()
            .map(|e| e.id.as_str())
            .collect();
        assert_eq!(ids, ["3", "4"]);
    }

    #[test]
    fn a_queues_own_smaller_limit_rejects_before_sending() {
        let rows = vec![row(1, &format!("\"{}\"", "z".repeat(600)))];
        let cfg = ordered_fifo();
        let limits = HashMap::from([(cfg.default_queue_url.clone(), 500usize)]);
        let plan = plan_within(&rows, &cfg, &limits);
        assert_eq!(plan.rejected[0].reason, QuarantineReason::TooLarge);
        assert!(plan.rejected[0].error.contains("limit is 500"));
    }

    #[test]
    fn only_fifo_bound_rows_are_grouped_when_the_default_queue_is_standard() {
        let mut cfg = config();
        cfg.ordering = Some(PlanOrdering {
            every_destination: false,
            skip_poison: false,
        });
        let mut rows = group(3);
        rows[0].aggregate_type = "bad\u{1}".into();
        // Standard destination: a rejected row holds nothing back.
        let plan = plan(&rows, &cfg);
        assert!(plan.released.is_empty());
        for r in &mut rows {
            r.queue_url = Some(to("http://q/1/own.fifo"));
        }
        let plan = super::plan(&rows, &cfg);
        assert_eq!(plan.released, vec![1, 2]);
    }

    #[test]
    fn order_is_kept_on_fifo_destinations_or_on_every_one_when_asked() {
        let fifo_queue = to("http://q/1/a.fifo");
        let fifo_topic = to("arn:aws:sns:eu-west-1:1:a.fifo");
        let standard = to("http://q/1/a");
        let mut cfg = config();
        assert!(!cfg.keeps_order(&fifo_queue), "ordering off");
        cfg.ordering = Some(PlanOrdering {
            every_destination: false,
            skip_poison: false,
        });
        assert!(cfg.keeps_order(&fifo_queue) && cfg.keeps_order(&fifo_topic));
        assert!(!cfg.keeps_order(&standard));
        cfg.ordering = Some(PlanOrdering {
            every_destination: true,
            skip_poison: false,
        });
        assert!(cfg.keeps_order(&standard));
    }

    fn offloading(threshold: Option<usize>) -> PlanConfig {
        let mut cfg = config();
        cfg.offload = Some(OffloadPlan {
            bucket: Destination::bucket("events").expect("a bucket name"),
            prefix: "outbox/".into(),
            threshold,
        });
        cfg
    }

    #[test]
    fn a_body_too_large_for_the_queue_goes_as_an_extended_client_pointer() {
        let big = format!("\"{}\"", "x".repeat(3 * 1024 * 1024));
        let mut r = row(1, &big);
        r.headers = json!({"tenant": "t1"});
        let plan = plan(&[r.clone(), row(2, "{}")], &offloading(None));
        assert!(plan.rejected.is_empty(), "{:?}", plan.rejected);
        let entries = &plan.requests[0].entries;
        let pointer = &entries[0];
        let offload = pointer.offload.as_ref().expect("offloaded");
        assert_eq!(offload.body.as_ref(), big.as_bytes());
        assert_eq!(offload.key, offload_key("outbox/", "ev-1"));
        let body: serde_json::Value = serde_json::from_str(&pointer.body).unwrap();
        assert_eq!(
            body,
            json!([
                "software.amazon.payloadoffloading.PayloadS3Pointer",
                {"s3BucketName": "events", "s3Key": offload.key}
            ])
        );
        // event_id and the headers stay on the pointer message.
        assert_eq!(pointer.attributes[0], ("event_id".into(), "ev-1".into()));
        assert!(pointer
            .attributes
            .contains(&("tenant".to_string(), "t1".to_string())));
        let digits = big.len().to_string().len();
        assert_eq!(
            pointer.size,
            pointer.body.len()
                + pointer
                    .attributes
                    .iter()
                    .map(|(n, v)| n.len() + STRING_TYPE.len() + v.len())
                    .sum::<usize>()
                + "ExtendedPayloadSize".len()
                + "Number".len()
                + digits
        );
        // What SQS and SNS are given: the strings, then the size as a Number, last.
        let typed: Vec<_> = pointer.typed_attributes().collect();
        assert_eq!(typed.len(), pointer.attributes.len() + 1);
        assert_eq!(typed[0], ("event_id", "String", "ev-1".to_string()));
        assert_eq!(
            typed.last().unwrap(),
            &("ExtendedPayloadSize", "Number", big.len().to_string())
        );
        // A small row goes inline.
        assert_eq!(entries[1].offload, None);
        assert_eq!(entries[1].body, "{}");
        assert!(entries[1].typed_attributes().all(|(_, t, _)| t == "String"));
    }

    #[test]
    fn the_threshold_offloads_smaller_bodies_and_without_a_bucket_they_are_too_large() {
        let body = format!("\"{}\"", "x".repeat(2000));
        let plan_with = plan(&[row(1, &body), row(2, "{}")], &offloading(Some(1024)));
        let entries = &plan_with.requests[0].entries;
        assert!(entries[0].offload.is_some());
        assert!(entries[1].offload.is_none());
        let mut cfg = config();
        cfg.max_request_bytes = 1024;
        let plan_without = plan(&[row(1, &body)], &cfg);
        assert_eq!(plan_without.rejected[0].reason, QuarantineReason::TooLarge);
    }

    #[test]
    fn for_a_topic_the_threshold_is_held_to_the_topics_limit() {
        // 300 KiB: inline to a queue even under a 512 KiB threshold, through S3 to a topic
        // that reports no MaximumMessageSize, where 256 KiB is the most a message may carry.
        let body = format!("\"{}\"", "m".repeat(300 * 1024));
        let mut to_topic = row(1, &body);
        to_topic.queue_url = Some(to(TOPIC));
        for threshold in [None, Some(512 * 1024)] {
            let plan = plan(&[to_topic.clone(), row(2, &body)], &offloading(threshold));
            assert!(
                plan.rejected.is_empty(),
                "{threshold:?}: {:?}",
                plan.rejected
            );
            let entry = |to: &str| {
                plan.requests
                    .iter()
                    .find(|r| r.destination.to_string() == to)
                    .map(|r| &r.entries[0])
                    .unwrap()
            };
            assert!(entry(TOPIC).offload.is_some(), "{threshold:?}");
            assert!(entry(TOPIC).size <= SNS_UNREPORTED_MAX_BYTES);
            assert!(
                entry("http://q/standard").offload.is_none(),
                "{threshold:?}"
            );
        }
        // A lower threshold applies to topics as to queues.
        let small = row(3, &format!("\"{}\"", "s".repeat(2000)));
        let mut small_to_topic = small.clone();
        small_to_topic.queue_url = Some(to(TOPIC));
        let plan = plan(&[small_to_topic, small], &offloading(Some(1024)));
        assert!(plan.requests.iter().all(|r| r.entries[0].offload.is_some()));
    }

    #[test]
    fn offload_keys_are_stable_valid_and_distinct_for_any_event_id() {
        let key = offload_key("p/", "ev/../ü \u{7}*?");
        assert_eq!(key, offload_key("p/", "ev/../ü \u{7}*?"));
        assert_eq!(key.len(), 2 + 64);
        assert!(key[2..].chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(key, offload_key("p/", "ev-2"));
    }

    #[test]
    fn a_pointer_needs_room_for_its_reserved_attribute() {
        let big = format!("\"{}\"", "x".repeat(2 * 1024 * 1024));
        let mut r = row(1, &big);
        r.headers = json!({"a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "f": "6"});
        let plan = plan(&[r], &offloading(None));
        assert_eq!(plan.rejected[0].reason, QuarantineReason::Invalid);
        assert!(plan.rejected[0].error.contains("ExtendedPayloadSize"));
    }

    #[test]
    fn fifo_pointers_keep_their_group_and_deduplication_ids() {
        let big = format!("\"{}\"", "x".repeat(2 * 1024 * 1024));
        let mut cfg = ordered_fifo();
        cfg.offload = offloading(None).offload;
        let plan = plan(&[row(1, &big)], &cfg);
        let e = &plan.requests[0].entries[0];
        assert!(e.offload.is_some());
        assert_eq!(e.dedup_id, Some(fifo_id("ev-1")));
        assert!(e.group_id.is_some());
    }
}
