//! The only owner of `aws_sdk_sqs`: what SQS does its own way (its entry and attribute types,
//! SendMessageBatch, GetQueueAttributes); the rest is the sink's, shared with SNS.

use std::time::Duration;

use aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName, SendMessageBatchRequestEntry};
use futures_util::future::BoxFuture;

use super::{attributes, refused, sent, Answers, Attributes, Service};
use crate::aws::request_failure;
use crate::batch::{BatchRequest, Entry};
use crate::retry::RequestFailure;

/// An SQS client set up for the relay.
#[derive(Debug, Clone)]
pub struct Sqs {
    client: aws_sdk_sqs::Client,
}

impl Sqs {
    /// Region and credentials come from the standard AWS chain; `endpoint` overrides the
    /// service endpoint (local emulators); the SDK's own retries are off and each call is
    /// bounded by `send_timeout` (`aws::client_limits` says why).
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
}

impl Service for Sqs {
    fn batch<'a>(
        &'a self,
        request: &'a BatchRequest,
    ) -> BoxFuture<'a, Result<Answers, RequestFailure>> {
        Box::pin(async move {
            let output = self
                .client
                .send_message_batch()
                .queue_url(request.destination.address())
                .set_entries(Some(request.entries.iter().map(entry).collect()))
                .send()
                .await
                .map_err(request_failure)?;
            let sent = output
                .successful()
                .iter()
                .map(|ok| (ok.id().to_string(), sent(ok.message_id())));
            let failed = output.failed().iter().map(|f| {
                let outcome = refused(f.sender_fault(), f.code(), f.message());
                (f.id().to_string(), outcome)
            });
            Ok(sent.chain(failed).collect())
        })
    }

    /// `All` rather than a list: SQS refuses FIFO-only attribute names on some standard queues.
    fn attributes<'a>(
        &'a self,
        address: &'a str,
    ) -> BoxFuture<'a, Result<Attributes, RequestFailure>> {
        Box::pin(async move {
            let output = self
                .client
                .get_queue_attributes()
                .queue_url(address)
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
            Ok(Attributes {
                maximum_message_size: attribute(QueueAttributeName::MaximumMessageSize)
                    .and_then(|v| v.parse().ok()),
                fifo: attribute(QueueAttributeName::FifoQueue) == Some("true"),
                content_based_deduplication: attribute(
                    QueueAttributeName::ContentBasedDeduplication,
                ) == Some("true"),
            })
        })
    }
}

/// One entry of SendMessageBatch.
fn entry(e: &Entry) -> SendMessageBatchRequestEntry {
    SendMessageBatchRequestEntry::builder()
        .id(&e.id)
        .message_body(&e.body)
        .set_message_group_id(e.group_id.clone())
        .set_message_deduplication_id(e.dedup_id.clone())
        .set_message_attributes(attributes(e, |data_type, value| {
            MessageAttributeValue::builder()
                .data_type(data_type)
                .string_value(value)
                .build()
                .expect("data_type is set")
        }))
        .build()
        .expect("id and body are set")
}
