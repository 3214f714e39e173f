//! The services rows go to, behind one interface: a planned batch in, one outcome per entry
//! out, and the destination's attributes read, whether an SQS queue or an SNS topic takes it;
//! and the S3 bucket large bodies go to first, in front of either.
//!
//! What differs between SQS and SNS (the SDK's entry and attribute value types, the batch call,
//! the attribute read and the names in its answers) is one [`Service`] impl per service, on its
//! SDK's client; what is common (each entry's outcome paired by its ID, a refused entry's
//! `SenderFault`, the attributes as the relay reads them, how a failed call reads, the guard on
//! a stuck call) is written once here, over that trait, as vector's `aws_s_s` sink writes SQS
//! and SNS once over its client trait. The relay holds one [`Sinks`], asks it for a
//! destination's [`Sink`] and calls that; which service answers is decided once, in
//! [`Sinks::of`].
//!
//! - [`sqs`]: queues (SendMessageBatch, GetQueueAttributes); the only owner of `aws_sdk_sqs`.
//! - [`sns`]: topics (PublishBatch, GetTopicAttributes); the only owner of `aws_sdk_sns`.
//! - [`s3`]: the offload bucket (PutObject) and how long an upload may take; the only owner of
//!   `aws_sdk_s3`.

pub mod s3;
pub mod sns;
pub mod sqs;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use futures_util::future::BoxFuture;

use crate::aws::request_failure;
use crate::batch::{BatchRequest, Entry};
use crate::destination::{Client, Destination};
use crate::retry::{RequestFailure, Transport};

use self::s3::S3;

/// What the service said about one entry of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryOutcome {
    /// Accepted; the message ID the service assigned.
    Sent { message_id: String },
    /// Refused. `sender_fault` means the entry itself is bad and must not be retried.
    Failed {
        sender_fault: bool,
        code: String,
        message: String,
    },
}

/// The attributes of a queue or topic that must agree with the relay's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    /// The largest message it accepts, in bytes; `None` if the server did not say (an older
    /// topic: SNS reports it since topics took up to 1 MiB, September 2026; an emulator).
    pub maximum_message_size: Option<usize>,
    pub fifo: bool,
    pub content_based_deduplication: bool,
}

impl Attributes {
    /// From an attribute read's answer, by attribute name; `fifo` is the service's name for
    /// its FIFO flag (`FifoQueue`, `FifoTopic`).
    fn read<'a>(fifo: &str, attribute: impl Fn(&str) -> Option<&'a str>) -> Attributes {
        Attributes {
            maximum_message_size: attribute("MaximumMessageSize").and_then(|v| v.parse().ok()),
            fifo: attribute(fifo) == Some("true"),
            content_based_deduplication: attribute("ContentBasedDeduplication") == Some("true"),
        }
    }
}

/// Each entry's answer by its entry ID, as a batch call lists them (accepted and refused alike).
pub type Answers = Vec<(String, EntryOutcome)>;

/// What a service's call gives back: `T`, or the request's failure (no entry can be assumed
/// either way).
pub type Reply<'a, T> = BoxFuture<'a, Result<T, RequestFailure>>;

/// What one batch service does its own way, implemented on its SDK's client.
pub trait Service: Send + Sync {
    /// The batch call to the queue or topic `request.destination` names: each entry's answer.
    fn batch<'a>(&'a self, request: &'a BatchRequest) -> Reply<'a, Answers>;
    /// The attribute read of the queue or topic at `address`; fails like a send would when it
    /// is missing or the credentials may not use it.
    fn attributes<'a>(&'a self, address: &'a str) -> Reply<'a, Attributes>;
}

/// Where each service is reached (`None`: AWS's own endpoint), and the offload bucket.
#[derive(Debug, Clone, Copy)]
pub struct Endpoints<'a> {
    pub sqs: Option<&'a str>,
    pub sns: Option<&'a str>,
    pub s3: Option<&'a str>,
    /// `--offload-bucket`, when set.
    pub offload: Option<&'a Destination>,
}

/// The relay's AWS clients, one per service, each call bounded by the send timeout.
#[derive(Clone)]
pub struct Sinks {
    sqs: Arc<dyn Service>,
    sns: Arc<dyn Service>,
    /// Where large message bodies go first (`--offload-bucket`), when set.
    offload: Option<S3>,
    /// What every call is given (the SDK enforces it); the guards here only cover a stuck future.
    timeout: Duration,
}

impl Sinks {
    /// The clients for these endpoints (`None`: AWS's own) and the offload bucket, if any;
    /// region and credentials come from the shared AWS configuration (`aws::shared_config`),
    /// and every call is bounded by `timeout`.
    pub async fn new(endpoints: Endpoints<'_>, timeout: Duration) -> Sinks {
        let sqs = sqs::client(endpoints.sqs, timeout).await;
        let sns = sns::client(endpoints.sns, timeout).await;
        let offload = match endpoints.offload {
            Some(bucket) => Some(S3::new(bucket, endpoints.s3, timeout).await),
            None => None,
        };
        Sinks {
            sqs: Arc::new(sqs),
            sns: Arc::new(sns),
            offload,
            timeout,
        }
    }

    /// The sink that takes `destination`'s messages.
    pub fn of(&self, destination: &Destination) -> Sink<'_> {
        let service = match destination.client() {
            Client::Sns => &self.sns,
            // Rows never name a bucket: their text is a queue's or a topic's.
            Client::Sqs | Client::S3 => &self.sqs,
        };
        Sink {
            service: service.as_ref(),
            timeout: self.timeout,
        }
    }

    /// The offload bucket's client, when `--offload-bucket` is set.
    pub fn offload(&self) -> Option<&S3> {
        self.offload.as_ref()
    }
}

/// One destination's service, as the relay calls it whatever the service is.
#[derive(Clone, Copy)]
pub struct Sink<'a> {
    service: &'a dyn Service,
    timeout: Duration,
}

impl Sink<'_> {
    /// Sends one batch. `Ok` carries an outcome for every entry, in the request's order;
    /// `Err` means the request as a whole failed and no entry can be assumed either way.
    pub async fn send(&self, request: &BatchRequest) -> Result<Vec<EntryOutcome>, RequestFailure> {
        // The SDK enforces the timeout; this guard only covers a stuck future.
        let answers = within(
            self.timeout + Duration::from_secs(1),
            self.service.batch(request),
        )
        .await?;
        Ok(outcomes(request, answers))
    }

    /// Reads the destination's attributes (`check`, and the relay for its size limit), within
    /// the send timeout.
    pub async fn attributes(
        &self,
        destination: &Destination,
    ) -> Result<Attributes, RequestFailure> {
        within(self.timeout, self.service.attributes(destination.address())).await
    }
}

/// `call`'s result, or a timeout failure once `limit` has passed without one.
async fn within<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, RequestFailure>>,
) -> Result<T, RequestFailure> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(RequestFailure {
            status: None,
            code: None,
            message: format!("no answer within {}", humantime::format_duration(limit)),
            transport: Transport::Timeout,
        }),
    }
}

/// `call`'s answer read by `read`, or its failure as `aws::request_failure` reads it, for
/// every service alike.
fn reply<'a, O, E, T>(
    call: impl Future<Output = Result<O, SdkError<E, HttpResponse>>> + Send + 'a,
    read: impl FnOnce(O) -> T + Send + 'a,
) -> Reply<'a, T>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    Box::pin(async move { call.await.map(read).map_err(request_failure) })
}

/// One entry of a batch call in its SDK's types: `$entry` the entry type, `$body` the body's
/// setter (`message_body`, `message`), `$value` the message attribute value type. A macro for
/// the reason `aws::client!` is one: each SDK generates its own types with the same setters.
macro_rules! sdk_entry {
    ($e:expr, $entry:ident, $body:ident, $value:ident) => {
        $entry::builder()
            .id(&$e.id)
            .$body(&$e.body)
            .set_message_group_id($e.group_id.clone())
            .set_message_deduplication_id($e.dedup_id.clone())
            .set_message_attributes($crate::sink::attributes($e, |data_type, value| {
                $value::builder()
                    .data_type(data_type)
                    .string_value(value)
                    .build()
                    .expect("data_type is set")
            }))
            .build()
            .expect("id and body are set")
    };
}
use sdk_entry;

/// An entry's message attributes as a service's SDK types them (`value` builds one from its
/// data type and text), or `None` for none: the same map SQS and SNS are given.
fn attributes<A>(entry: &Entry, value: impl Fn(&str, String) -> A) -> Option<HashMap<String, A>> {
    let attributes: HashMap<String, A> = entry
        .typed_attributes()
        .map(|(name, data_type, text)| (name.to_string(), value(data_type, text)))
        .collect();
    (!attributes.is_empty()).then_some(attributes)
}

/// A batch call's answers by entry ID: the accepted entries' (ID, message ID), and the refused
/// ones' (ID, SenderFault, code, message). `SenderFault` is the service's word that the entry
/// itself is bad, so it is quarantined without retries.
fn answers<'a>(
    accepted: impl Iterator<Item = (&'a str, &'a str)>,
    refused: impl Iterator<Item = (&'a str, bool, &'a str, Option<&'a str>)>,
) -> Answers {
    let sent = accepted.map(|(id, message_id)| {
        let outcome = EntryOutcome::Sent {
            message_id: message_id.to_string(),
        };
        (id.to_string(), outcome)
    });
    let failed = refused.map(|(id, sender_fault, code, message)| {
        let outcome = EntryOutcome::Failed {
            sender_fault,
            code: code.to_string(),
            message: message.unwrap_or_default().to_string(),
        };
        (id.to_string(), outcome)
    });
    sent.chain(failed).collect()
}

/// Each entry's outcome, in the request's order, from a batch call's answers by entry ID. An
/// entry in neither list is retryable: we cannot know whether it went, and a resend carries
/// the same event_id.
fn outcomes(request: &BatchRequest, answers: Answers) -> Vec<EntryOutcome> {
    let mut answers: HashMap<String, EntryOutcome> = answers.into_iter().collect();
    let call = request.destination.batch_call();
    request
        .entries
        .iter()
        .map(|e| {
            answers
                .remove(e.id.as_str())
                .unwrap_or_else(|| EntryOutcome::Failed {
                    sender_fault: false,
                    code: "MissingFromResponse".to_string(),
                    message: format!("entry absent from the {call} response"),
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(destination: &str, ids: &[&str]) -> BatchRequest {
        BatchRequest {
            destination: Destination::of_row(destination),
            entries: ids
                .iter()
                .enumerate()
                .map(|(row, id)| Entry {
                    row,
                    id: id.to_string(),
                    body: "{}".into(),
                    attributes: Vec::new(),
                    group_id: None,
                    dedup_id: None,
                    size: 2,
                    offload: None,
                })
                .collect(),
        }
    }

    #[test]
    fn answers_in_any_order_are_paired_by_id_and_a_missing_one_is_retryable() {
        let accepted = [("1", "m-1")].into_iter();
        let refused = [("3", true, "InvalidParameterValue", Some("bad"))].into_iter();
        let topic = "arn:aws:sns:eu-west-1:123456789012:orders";
        let got = outcomes(
            &request(topic, &["1", "2", "3"]),
            answers(accepted, refused),
        );
        let sent = EntryOutcome::Sent {
            message_id: "m-1".into(),
        };
        assert_eq!(got[0], sent);
        assert_eq!(
            got[1],
            EntryOutcome::Failed {
                sender_fault: false,
                code: "MissingFromResponse".into(),
                message: "entry absent from the PublishBatch response".into(),
            }
        );
        assert_eq!(
            got[2],
            EntryOutcome::Failed {
                sender_fault: true,
                code: "InvalidParameterValue".into(),
                message: "bad".into(),
            }
        );
        let got = outcomes(&request("http://q/1/orders", &["1"]), Vec::new());
        let absent = "entry absent from the SendMessageBatch response";
        assert!(matches!(&got[0], EntryOutcome::Failed { message, .. } if message == absent));
    }

    #[test]
    fn an_entry_without_attributes_is_given_none() {
        let mut entry = request("http://q", &["1"]).entries.remove(0);
        assert_eq!(attributes(&entry, |t, v| (t.to_string(), v)), None);
        entry.attributes = vec![("event_id".into(), "ev-1".into())];
        assert_eq!(
            attributes(&entry, |t, v| (t.to_string(), v)),
            Some(HashMap::from([(
                "event_id".to_string(),
                ("String".to_string(), "ev-1".to_string())
            )]))
        );
    }

    #[test]
    fn attributes_are_read_by_name_with_the_services_fifo_flag() {
        let answer = HashMap::from([
            ("MaximumMessageSize", "1048576"),
            ("FifoTopic", "true"),
            ("ContentBasedDeduplication", "false"),
        ]);
        let lookup = |name: &str| answer.get(name).copied();
        assert_eq!(
            Attributes::read("FifoTopic", lookup),
            Attributes {
                maximum_message_size: Some(1024 * 1024),
                fifo: true,
                content_based_deduplication: false,
            }
        );
        assert!(!Attributes::read("FifoQueue", lookup).fifo);
        assert_eq!(
            Attributes::read("FifoQueue", |_| None).maximum_message_size,
            None
        );
    }

    #[tokio::test]
    async fn a_call_that_never_answers_fails_as_a_timeout_naming_its_limit() {
        let never = std::future::pending::<Result<(), RequestFailure>>();
        let failure = within(Duration::from_millis(10), never).await.unwrap_err();
        assert_eq!(failure.transport, Transport::Timeout);
        assert_eq!(failure.message, "no answer within 10ms");
    }
}
