//! The only owner of `aws_sdk_sns`: what SNS does its own way (its entry and attribute types,
//! PublishBatch, GetTopicAttributes); the rest is the sink's, shared with SQS.

use std::time::Duration;

use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};
use futures_util::future::BoxFuture;

use super::{attributes, refused, sent, Answers, Attributes, Service};
use crate::aws::request_failure;
use crate::batch::{BatchRequest, Entry};
use crate::retry::RequestFailure;

/// An SNS client set up for the relay.
#[derive(Debug, Clone)]
pub struct Sns {
    client: aws_sdk_sns::Client,
}

impl Sns {
    /// Set up as [`super::sqs::Sqs::new`]: the shared AWS configuration, the SDK's retries off
    /// (the relay decides each row's fate), `endpoint` for local emulators.
    pub async fn new(endpoint: Option<&str>, send_timeout: Duration) -> Sns {
        let shared = crate::aws::shared_config().await;
        let (retry, timeouts) = crate::aws::client_limits(send_timeout);
        let mut config = aws_sdk_sns::config::Builder::from(&shared)
            .retry_config(retry)
            .timeout_config(timeouts);
        if let Some(endpoint) = endpoint {
            config = config.endpoint_url(endpoint);
        }
        Sns {
            client: aws_sdk_sns::Client::from_conf(config.build()),
        }
    }
}

impl Service for Sns {
    /// To the topic `request.destination` names by its ARN.
    fn batch<'a>(
        &'a self,
        request: &'a BatchRequest,
    ) -> BoxFuture<'a, Result<Answers, RequestFailure>> {
        Box::pin(async move {
            let output = self
                .client
                .publish_batch()
                .topic_arn(request.destination.address())
                .set_publish_batch_request_entries(Some(
                    request.entries.iter().map(entry).collect(),
                ))
                .send()
                .await
                .map_err(request_failure)?;
            // SNS's model leaves an accepted entry's fields optional; one without its ID
            // cannot be paired, and counts as missing from the response.
            let accepted = output.successful().iter().filter_map(|ok| {
                Some((
                    ok.id()?.to_string(),
                    sent(ok.message_id().unwrap_or_default()),
                ))
            });
            let failed = output.failed().iter().map(|f| {
                let outcome = refused(f.sender_fault(), f.code(), f.message());
                (f.id().to_string(), outcome)
            });
            Ok(accepted.chain(failed).collect())
        })
    }

    /// SNS names attributes by string, where SQS has an enum for them.
    fn attributes<'a>(
        &'a self,
        address: &'a str,
    ) -> BoxFuture<'a, Result<Attributes, RequestFailure>> {
        Box::pin(async move {
            let output = self
                .client
                .get_topic_attributes()
                .topic_arn(address)
                .send()
                .await
                .map_err(request_failure)?;
            let attribute = |name: &str| {
                output
                    .attributes()
                    .and_then(|attrs| attrs.get(name))
                    .map(String::as_str)
            };
            Ok(Attributes {
                maximum_message_size: attribute("MaximumMessageSize").and_then(|v| v.parse().ok()),
                fifo: attribute("FifoTopic") == Some("true"),
                content_based_deduplication: attribute("ContentBasedDeduplication") == Some("true"),
            })
        })
    }
}

/// One entry of PublishBatch.
fn entry(e: &Entry) -> PublishBatchRequestEntry {
    PublishBatchRequestEntry::builder()
        .id(&e.id)
        .message(&e.body)
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
        .expect("id and message are set")
}
