//! What a destination is (an SQS queue, an SNS topic, an S3 bucket; FIFO or standard), parsed
//! once from its text, and every rule that follows from its kind.
//!
//! Configuration (`--queue-url`, `--route`, `--offload-bucket`) is parsed at validation and a
//! row's own `queue_url` where rows are decoded (`outbox/decode.rs`); past those two places no
//! code looks at a destination's text again. Its limits, the client that sends to it, its FIFO
//! fields, the key it is parked under and how logs and metric labels name it all live here.
//! Adding a kind of destination is a variant here, its service in `sink/` (like `sink/sns.rs`),
//! the one `match` on [`Client`] in `sink::Sinks::of`, and the flag that names it in `config/`.
//!
//! - [`parked`]: which destinations are refusing us, and until when their rows wait.

mod parked;

use std::fmt;
use std::sync::Arc;

pub use parked::{Destinations, Park};

/// The most entries one request takes, whatever its destination: SendMessageBatch and
/// PublishBatch both take ten. The relay sizes its row budget with it.
pub const MAX_ENTRIES: usize = 10;
/// What a topic takes, in one message and in one PublishBatch call altogether, when it does
/// not report its `MaximumMessageSize`: SNS's fixed limit before topics took up to 1 MiB
/// (September 2026), and what topics that report none (older ones, the local emulators) are
/// assumed to keep.
pub const SNS_UNREPORTED_MAX_BYTES: usize = 256 * 1024;

/// Where rows go, or where their large bodies go first. Cheap to clone (the text is shared),
/// and the destination itself is the key its park, its request slots and its learnt size limit
/// are kept under: a queue URL `s3://x` and the bucket `x` are different keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Destination {
    /// An SQS queue, by its URL.
    Queue {
        /// What SQS is called with, and how logs and labels name the queue.
        url: Arc<str>,
        /// The name ends in `.fifo`, as SQS requires of a FIFO queue: group and deduplication
        /// IDs are sent, and ordering is on under `--ordered auto`.
        fifo: bool,
    },
    /// An SNS topic, by its ARN (any partition: `aws`, `aws-cn`, `aws-us-gov`).
    Topic {
        /// What SNS is called with, and how logs and labels name the topic.
        arn: Arc<str>,
        /// The name ends in `.fifo`, as SNS requires of a FIFO topic: it takes the same group
        /// and deduplication IDs as a FIFO queue.
        fifo: bool,
    },
    /// The S3 bucket of `--offload-bucket`: large bodies are stored there before their pointer
    /// is sent. Rows never name one.
    Bucket {
        /// What S3 is called with; logs and labels show it as `s3://name`.
        name: Arc<str>,
    },
}

/// Which client sends to a destination; `sink::Sinks::of` matches on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    Sqs,
    Sns,
    S3,
}

/// What one request to a destination may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Entries in one batch call.
    pub entries: usize,
    /// Bytes in one message, and in one request altogether.
    pub bytes: usize,
}

/// Whether the relay reads a destination's `MaximumMessageSize`, and what a failed read means
/// (`relay::send` reads it on first use and again every `--stats-interval`: an operator may
/// raise it, then re-drive what it refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeRead {
    /// Not read: a standard queue, where SQS's own per-entry refusal quarantines a row too
    /// large for it just as well; a bucket.
    Never,
    /// Read, and one that cannot be read now is tried again with the next claim (meanwhile
    /// what it reported last, or `--max-request-bytes`, applies): an ordered queue, where a
    /// refused entry after accepted entries of its group would break the group's order.
    RetriedEachClaim,
    /// Read always, and one that cannot be read keeps what it reported last (256 KiB if
    /// nothing) and is not asked again before the next `--stats-interval`, with one warning:
    /// a topic, whose size decides which events go whole and which through S3 or into
    /// quarantine. Its rows come at every claim, and a relay whose credentials lack
    /// `sns:GetTopicAttributes` would otherwise make a refused call per claim.
    KeptOnFailure,
}

/// What a destination takes as `MessageGroupId`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageGroup {
    /// A FIFO queue or topic: every message needs one (the `--group-by` key), and it is what
    /// the destination keeps in order.
    Required,
    /// A standard SQS queue: the `--fair-by` key when `--fair-group-id` asks for it (SQS fair
    /// queues), else none.
    Fair,
    /// A standard topic (and a bucket): none; SNS refuses one on a standard topic.
    None,
}

/// Why a destination's text was refused, worded for the flag that named it (the caller puts
/// the flag in front).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DestinationError {
    /// `arn:<partition>:sns:...` without every one of its six parts.
    #[error("{0:?} is not a topic ARN: expected arn:aws:sns:<region>:<account>:<name>")]
    NotATopicArn(String),
    /// Neither an `http(s)://` URL nor an SNS ARN.
    #[error("{0:?} is neither a queue URL (https://sqs.<region>.amazonaws.com/<account>/<name>) nor a topic ARN (arn:aws:sns:<region>:<account>:<name>)")]
    Neither(String),
    /// A bucket given as a URL or a path.
    #[error("{0:?} is a bucket name, not a URL or path: put key prefixes in --offload-prefix")]
    NotABucketName(String),
}

impl Destination {
    /// A configured destination (`--queue-url`, `--route`): an SQS queue URL, or an SNS topic
    /// ARN with every part present.
    pub fn parse(text: &str) -> Result<Destination, DestinationError> {
        if names_topic(text) {
            let parts: Vec<&str> = text.split(':').collect();
            if parts.len() == 6 && parts.iter().all(|p| !p.is_empty()) {
                return Ok(Destination::of_row(text));
            }
            return Err(DestinationError::NotATopicArn(text.to_string()));
        }
        if text.starts_with("https://") || text.starts_with("http://") {
            return Ok(Destination::of_row(text));
        }
        Err(DestinationError::Neither(text.to_string()))
    }

    /// A row's own destination (its `queue_url` column): a topic if it has the shape of an SNS
    /// ARN, else a queue. Nothing is refused here: the application's text goes to the service
    /// it names, and one the service refuses parks only its own rows, as any refusing queue.
    pub fn of_row(text: &str) -> Destination {
        let fifo = text.trim_end_matches('/').ends_with(".fifo");
        if names_topic(text) {
            Destination::Topic {
                arn: text.into(),
                fifo,
            }
        } else {
            Destination::Queue {
                url: text.into(),
                fifo,
            }
        }
    }

    /// `--offload-bucket`: a bucket name (S3 key prefixes go in `--offload-prefix`).
    pub fn bucket(name: &str) -> Result<Destination, DestinationError> {
        if name.contains('/') {
            return Err(DestinationError::NotABucketName(name.to_string()));
        }
        Ok(Destination::Bucket { name: name.into() })
    }

    /// A FIFO queue or topic.
    pub fn is_fifo(&self) -> bool {
        match self {
            Destination::Queue { fifo, .. } | Destination::Topic { fifo, .. } => *fifo,
            Destination::Bucket { .. } => false,
        }
    }

    /// Which client sends to it.
    pub fn client(&self) -> Client {
        match self {
            Destination::Queue { .. } => Client::Sqs,
            Destination::Topic { .. } => Client::Sns,
            Destination::Bucket { .. } => Client::S3,
        }
    }

    /// What its service's API is called with: the queue URL, the topic ARN, the bucket name.
    pub fn address(&self) -> &str {
        match self {
            Destination::Queue { url, .. } => url,
            Destination::Topic { arn, .. } => arn,
            Destination::Bucket { name } => name,
        }
    }

    /// Its short name, as OpenTelemetry's `messaging.destination.name`: the last segment of a
    /// queue's URL, the last field of a topic's ARN, a bucket's name.
    pub fn name(&self) -> &str {
        match self {
            Destination::Queue { url, .. } => {
                url.trim_end_matches('/').rsplit('/').next().unwrap_or(url)
            }
            Destination::Topic { arn, .. } => arn.rsplit(':').next().unwrap_or(arn),
            Destination::Bucket { name } => name,
        }
    }

    /// What one request may carry under `--max-request-bytes`, given the `MaximumMessageSize`
    /// the destination reported (`None`: not read, or it reports none). A queue takes what it
    /// reported, else `--max-request-bytes`. A topic takes what it reported (up to 1 MiB since
    /// September 2026), else 256 KiB: an older topic or an emulator takes no more, and a
    /// guess above its limit would get a large event refused by SNS and quarantined where it
    /// should have gone through S3. The one-message limit also closes a request: a batch must
    /// be allowed at least one message of the largest size. Never more than
    /// `--max-request-bytes`. A bucket takes one body at a time, of any size the byte budget
    /// allows.
    pub fn limits(&self, max_request_bytes: usize, reported: Option<usize>) -> Limits {
        match self {
            Destination::Queue { .. } => Limits {
                entries: MAX_ENTRIES,
                bytes: reported.unwrap_or(max_request_bytes).min(max_request_bytes),
            },
            Destination::Topic { .. } => Limits {
                entries: MAX_ENTRIES,
                bytes: reported
                    .unwrap_or(SNS_UNREPORTED_MAX_BYTES)
                    .min(max_request_bytes),
            },
            Destination::Bucket { .. } => Limits {
                entries: 1,
                bytes: max_request_bytes,
            },
        }
    }

    /// Whether the relay reads its `MaximumMessageSize`, given whether the relay keeps the
    /// order of its rows.
    pub fn size_read(&self, ordered: bool) -> SizeRead {
        match self {
            Destination::Topic { .. } => SizeRead::KeptOnFailure,
            Destination::Queue { .. } if ordered => SizeRead::RetriedEachClaim,
            Destination::Queue { .. } | Destination::Bucket { .. } => SizeRead::Never,
        }
    }

    /// Whether its messages carry a `MessageGroupId`, and which.
    pub fn message_group(&self) -> MessageGroup {
        match self {
            _ if self.is_fifo() => MessageGroup::Required,
            Destination::Queue { .. } => MessageGroup::Fair,
            Destination::Topic { .. } | Destination::Bucket { .. } => MessageGroup::None,
        }
    }

    /// Whether its messages carry a `MessageDeduplicationId` (the event ID), so the destination
    /// drops our resends within its window: FIFO only.
    pub fn takes_dedup_id(&self) -> bool {
        self.is_fifo()
    }

    /// The service, for log lines: `SQS`, `SNS` or `S3`.
    pub fn service(&self) -> &'static str {
        match self {
            Destination::Queue { .. } => "SQS",
            Destination::Topic { .. } => "SNS",
            Destination::Bucket { .. } => "S3",
        }
    }

    /// The noun, for log lines and rows' `last_error`: `queue`, `topic` or `bucket`.
    pub fn noun(&self) -> &'static str {
        match self {
            Destination::Queue { .. } => "queue",
            Destination::Topic { .. } => "topic",
            Destination::Bucket { .. } => "bucket",
        }
    }

    /// What an operator fixes when it refuses us, for log lines.
    pub fn address_name(&self) -> &'static str {
        match self {
            Destination::Queue { .. } => "queue URL",
            Destination::Topic { .. } => "topic ARN",
            Destination::Bucket { .. } => "bucket name",
        }
    }

    /// The call that sends a request to it, for log lines.
    pub fn batch_call(&self) -> &'static str {
        match self {
            Destination::Queue { .. } => "SendMessageBatch",
            Destination::Topic { .. } => "PublishBatch",
            Destination::Bucket { .. } => "PutObject",
        }
    }
}

/// How log lines, rows' errors and the `destination` metric label name it: a queue's URL, a
/// topic's ARN, a bucket as `s3://name`.
impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::Queue { url, .. } => f.write_str(url),
            Destination::Topic { arn, .. } => f.write_str(arn),
            Destination::Bucket { name } => write!(f, "s3://{name}"),
        }
    }
}

/// `arn:<partition>:sns:...`, in any partition.
fn names_topic(text: &str) -> bool {
    let mut parts = text.split(':');
    parts.next() == Some("arn") && parts.nth(1) == Some("sns")
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUEUE: &str = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders";
    const TOPIC: &str = "arn:aws:sns:eu-west-1:123456789012:orders";

    fn parsed(text: &str) -> Destination {
        Destination::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn every_kind_is_parsed_with_its_fifo_suffix() {
        assert_eq!(
            parsed(QUEUE),
            Destination::Queue {
                url: QUEUE.into(),
                fifo: false
            }
        );
        assert_eq!(
            parsed("http://127.0.0.1:4566/000000000000/orders.fifo"),
            Destination::Queue {
                url: "http://127.0.0.1:4566/000000000000/orders.fifo".into(),
                fifo: true
            }
        );
        assert_eq!(
            parsed(TOPIC),
            Destination::Topic {
                arn: TOPIC.into(),
                fifo: false
            }
        );
        assert!(parsed("arn:aws:sns:eu-west-1:123456789012:orders.fifo").is_fifo());
        assert_eq!(
            Destination::bucket("events"),
            Ok(Destination::Bucket {
                name: "events".into()
            })
        );
        assert!(!Destination::bucket("events.fifo").unwrap().is_fifo());
    }

    #[test]
    fn a_fifo_suffix_counts_before_a_trailing_slash_and_nowhere_else() {
        assert!(parsed("http://q/1/orders.fifo/").is_fifo());
        assert!(parsed("http://q/1/orders.fifo//").is_fifo());
        assert!(!parsed("http://q/1/orders.fifo.old").is_fifo());
        assert!(!parsed("http://q/1.fifo/orders").is_fifo());
        assert_eq!(
            parsed("http://q/1/orders.fifo/").to_string(),
            "http://q/1/orders.fifo/",
            "kept as written"
        );
    }

    #[test]
    fn topic_arns_are_told_from_queue_urls_in_any_partition() {
        for arn in [
            "arn:aws-cn:sns:cn-north-1:123456789012:t",
            "arn:aws-us-gov:sns:us-gov-west-1:123456789012:t.fifo",
        ] {
            assert_eq!(parsed(arn).client(), Client::Sns, "{arn}");
        }
        assert_eq!(parsed(QUEUE).client(), Client::Sqs);
        assert_eq!(
            Destination::of_row("http://q/1/arn:aws:sns").client(),
            Client::Sqs,
            "an ARN-like path is still a URL"
        );
        assert_eq!(Destination::bucket("b").unwrap().client(), Client::S3);
    }

    #[test]
    fn garbage_is_refused_with_the_texts_config_prints() {
        assert_eq!(
            Destination::parse("arn:aws:sns:eu-west-1:orders")
                .unwrap_err()
                .to_string(),
            "\"arn:aws:sns:eu-west-1:orders\" is not a topic ARN: expected arn:aws:sns:<region>:<account>:<name>"
        );
        assert!(matches!(
            Destination::parse("arn:aws:sns::1:t"),
            Err(DestinationError::NotATopicArn(_))
        ));
        for text in [
            "orders",
            "arn:aws:sqs:eu-west-1:123456789012:orders",
            "",
            "sqs.eu-west-1.amazonaws.com/1/q",
        ] {
            assert_eq!(
                Destination::parse(text).unwrap_err().to_string(),
                format!("{text:?} is neither a queue URL (https://sqs.<region>.amazonaws.com/<account>/<name>) nor a topic ARN (arn:aws:sns:<region>:<account>:<name>)")
            );
        }
        assert_eq!(
            Destination::bucket("s3://events/x").unwrap_err().to_string(),
            "\"s3://events/x\" is a bucket name, not a URL or path: put key prefixes in --offload-prefix"
        );
    }

    #[test]
    fn a_rows_own_text_is_never_refused_and_goes_where_it_points() {
        assert_eq!(
            Destination::of_row("not a url"),
            Destination::Queue {
                url: "not a url".into(),
                fifo: false
            },
            "sent to SQS, whose refusal parks the row"
        );
        assert_eq!(
            Destination::of_row("arn:aws:sns::1:t").client(),
            Client::Sns,
            "a malformed topic ARN still goes to SNS"
        );
        assert_eq!(Destination::of_row(TOPIC), parsed(TOPIC));
    }

    #[test]
    fn limits_follow_the_service() {
        let max = 1024 * 1024;
        assert_eq!(
            parsed(QUEUE).limits(max, None),
            Limits {
                entries: 10,
                bytes: max
            }
        );
        assert_eq!(
            parsed(TOPIC).limits(max, None),
            Limits {
                entries: 10,
                bytes: SNS_UNREPORTED_MAX_BYTES
            },
            "a topic that reports no MaximumMessageSize takes 256 KiB"
        );
        assert_eq!(
            parsed(TOPIC).limits(4096, None).bytes,
            4096,
            "a lower setting holds for topics too"
        );
        assert_eq!(
            Destination::bucket("b").unwrap().limits(max, None).entries,
            1
        );
    }

    #[test]
    fn a_reported_maximum_message_size_holds_within_max_request_bytes() {
        let max = 1024 * 1024;
        for d in [parsed(QUEUE), parsed(TOPIC)] {
            assert_eq!(d.limits(max, Some(max)).bytes, max, "{d}: 1 MiB reported");
            assert_eq!(d.limits(max, Some(2048)).bytes, 2048, "{d}: a smaller one");
            assert_eq!(
                d.limits(512 * 1024, Some(max)).bytes,
                512 * 1024,
                "{d}: --max-request-bytes holds above what it reported"
            );
        }
        assert_eq!(
            parsed(TOPIC).limits(max, Some(300 * 1024)).bytes,
            300 * 1024,
            "above 256 KiB for a topic that says so"
        );
    }

    #[test]
    fn every_topic_and_only_ordered_queues_have_their_size_read() {
        for ordered in [false, true] {
            assert_eq!(parsed(TOPIC).size_read(ordered), SizeRead::KeptOnFailure);
            assert_eq!(
                Destination::bucket("b").unwrap().size_read(ordered),
                SizeRead::Never
            );
        }
        assert_eq!(parsed(QUEUE).size_read(true), SizeRead::RetriedEachClaim);
        assert_eq!(parsed(QUEUE).size_read(false), SizeRead::Never);
    }

    #[test]
    fn fifo_destinations_require_group_and_dedup_ids_standard_topics_take_none() {
        let fifo_queue = parsed("http://q/1/a.fifo");
        let fifo_topic = parsed("arn:aws:sns:eu-west-1:1:a.fifo");
        for d in [&fifo_queue, &fifo_topic] {
            assert_eq!(d.message_group(), MessageGroup::Required, "{d}");
            assert!(d.takes_dedup_id(), "{d}");
        }
        assert_eq!(parsed(QUEUE).message_group(), MessageGroup::Fair);
        assert_eq!(parsed(TOPIC).message_group(), MessageGroup::None);
        assert!(!parsed(QUEUE).takes_dedup_id() && !parsed(TOPIC).takes_dedup_id());
    }

    #[test]
    fn a_bucket_is_parked_under_a_key_no_queue_or_topic_can_have() {
        let bucket = Destination::bucket("events").unwrap();
        let lookalike = Destination::of_row("s3://events");
        assert_eq!(bucket.to_string(), lookalike.to_string(), "same text");
        assert_ne!(bucket, lookalike, "different keys");
        let keys: std::collections::HashSet<_> = [bucket, lookalike].into_iter().collect();
        assert_eq!(keys.len(), 2);
    }

    #[test]
    fn described_as_today() {
        let queue = parsed("http://q/1/orders/");
        let topic = parsed(TOPIC);
        let bucket = Destination::bucket("events").unwrap();
        type Described<'a> = (
            String,
            &'static str,
            &'static str,
            &'a str,
            &'a str,
            &'static str,
            &'static str,
        );
        fn described(d: &Destination) -> Described<'_> {
            (
                d.to_string(),
                d.service(),
                d.noun(),
                d.address(),
                d.name(),
                d.address_name(),
                d.batch_call(),
            )
        }
        assert_eq!(
            described(&queue),
            (
                "http://q/1/orders/".into(),
                "SQS",
                "queue",
                "http://q/1/orders/",
                "orders",
                "queue URL",
                "SendMessageBatch"
            )
        );
        assert_eq!(
            described(&topic),
            (
                TOPIC.into(),
                "SNS",
                "topic",
                TOPIC,
                "orders",
                "topic ARN",
                "PublishBatch"
            )
        );
        assert_eq!(
            described(&bucket),
            (
                "s3://events".into(),
                "S3",
                "bucket",
                "events",
                "events",
                "bucket name",
                "PutObject"
            )
        );
    }
}
