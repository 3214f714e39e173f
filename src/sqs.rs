//! The only owner of `aws_sdk_sqs`: one planned batch in, one outcome per entry out.

use std::time::Duration;

use aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName, SendMessageBatchRequestEntry};

use crate::aws::request_failure;
use crate::batch::BatchRequest;
use crate::destination::Destination;
use crate::retry::RequestFailure;

/// What SQS said about one entry of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryOutcome {
    /// Accepted; the message ID SQS assigned.
    Sent { message_id: String },
    /// Refused. `sender_fault` means the entry itself is bad and must not be retried.
    Failed {
        sender_fault: bool,
        code: String,
        message: String,
    },
}

/// An SQS client set up for the relay.
#[derive(Debug, Clone)]
pub struct Sqs {
    client: aws_sdk_sqs::Client,
}

impl Sqs {
    /// Region and credentials come from the standard AWS chain; `endpoint` overrides the
    /// service endpoint (local emulators). The SDK's own retries are off: the relay decides
    /// what a failure means for each row, and a hidden SDK retry after a timeout would only
    /// add duplicates and delay that decision.
    pub async fn new(endpoint: Option<&str>, send_timeout: Duration) -> Sqs {
        let shared = crate::aws::shared_config().await;
        let (retry, timeouts) = crate::aws::client_limits(send_timeout);
        let mut config = aws_sdk_sqs::config::Builder::from(&shared)
            .retry_config(retry)
            .timeout_config(timeouts);
        if let Some(endpoint) = endpoint {
            config = config.endpoint_url(endpoint);
        }
        Sqs {
            client: aws_sdk_sqs::Client::from_conf(config.build()),
        }
    }

    /// Sends one batch. `Ok` carries an outcome for every entry, in the request's order;
    /// `Err` means the request as a whole failed and no entry can be assumed either way.
    pub async fn send(&self, request: &BatchRequest) -> Result<Vec<EntryOutcome>, RequestFailure> {
        let entries = request
            .entries
            .iter()
            .map(|e| {
                let mut entry = SendMessageBatchRequestEntry::builder()
                    .id(&e.id)
                    .message_body(&e.body)
                    .set_message_group_id(e.group_id.clone())
                    .set_message_deduplication_id(e.dedup_id.clone());
                for (name, data_type, value) in e.typed_attributes() {
                    entry = entry.message_attributes(
                        name,
                        MessageAttributeValue::builder()
                            .data_type(data_type)
                            .string_value(value)
                            .build()
                            .expect("data_type is set"),
                    );
                }
                entry.build().expect("id and body are set")
            })
            .collect();
        let output = self
            .client
            .send_message_batch()
            .queue_url(request.destination.address())
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(request_failure)?;
        let sent = output
            .successful()
            .iter()
            .map(|ok| (ok.id(), sent(ok.message_id())));
        let failed = output.failed().iter().map(|f| {
            let outcome = refused(f.sender_fault(), f.code(), f.message());
            (f.id(), outcome)
        });
        Ok(outcomes(request, sent.chain(failed), "SendMessageBatch"))
    }
}

/// An accepted entry's outcome.
pub fn sent(message_id: &str) -> EntryOutcome {
    EntryOutcome::Sent {
        message_id: message_id.to_string(),
    }
}

/// A refused entry's outcome, as the batch call's result lists it.
pub fn refused(sender_fault: bool, code: &str, message: Option<&str>) -> EntryOutcome {
    EntryOutcome::Failed {
        sender_fault,
        code: code.to_string(),
        message: message.unwrap_or_default().to_string(),
    }
}

/// Each entry's outcome, in the request's order, from a batch call's answers by entry ID
/// (SQS's and SNS's results read alike). An entry in neither list is retryable: we cannot know
/// whether it went, and a resend carries the same event_id.
pub fn outcomes<'a>(
    request: &BatchRequest,
    answers: impl IntoIterator<Item = (&'a str, EntryOutcome)>,
    call: &str,
) -> Vec<EntryOutcome> {
    let mut answers: std::collections::HashMap<&str, EntryOutcome> = answers.into_iter().collect();
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

/// The attributes of a queue that must agree with the relay's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    /// The largest message the queue accepts, in bytes; `None` if the server did not say.
    pub maximum_message_size: Option<usize>,
    pub fifo: bool,
    pub content_based_deduplication: bool,
}

impl Sqs {
    /// Reads the queue's attributes; fails like a send would when the queue is missing or the
    /// credentials may not use it. `All` rather than a list: SQS refuses FIFO-only attribute
    /// names on some standard queues.
    pub async fn queue_attributes(&self, queue: &Destination) -> Result<QueueInfo, RequestFailure> {
        let output = self
            .client
            .get_queue_attributes()
            .queue_url(queue.address())
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .map_err(request_failure)?;
        let attribute = |name: QueueAttributeName| {
            output
                .attributes()
                .and_then(|attrs| attrs.get(&name))
                .map(String::as_str)
        };
        Ok(QueueInfo {
            maximum_message_size: attribute(QueueAttributeName::MaximumMessageSize)
                .and_then(|v| v.parse().ok()),
            fifo: attribute(QueueAttributeName::FifoQueue) == Some("true"),
            content_based_deduplication: attribute(QueueAttributeName::ContentBasedDeduplication)
                == Some("true"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Entry;

    fn request(ids: &[&str]) -> BatchRequest {
        BatchRequest {
            destination: Destination::of_row("http://q"),
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
        let answers = vec![
            ("3", refused(true, "InvalidParameterValue", Some("bad"))),
            ("1", sent("m-1")),
        ];
        let got = outcomes(&request(&["1", "2", "3"]), answers, "PublishBatch");
        assert_eq!(got[0], sent("m-1"));
        assert_eq!(
            got[1],
            EntryOutcome::Failed {
                sender_fault: false,
                code: "MissingFromResponse".into(),
                message: "entry absent from the PublishBatch response".into(),
            }
        );
        assert_eq!(got[2], refused(true, "InvalidParameterValue", Some("bad")));
    }
}
