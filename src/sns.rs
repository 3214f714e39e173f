//! The only owner of `aws_sdk_sns`: one planned batch for a topic in, one outcome per entry out,
//! in the same terms as `sqs.rs`, so settlement, quarantine and back-off are shared.

use std::time::Duration;

use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};

use crate::aws::request_failure;
use crate::batch::BatchRequest;
use crate::retry::RequestFailure;
use crate::sqs::{outcomes, refused, sent, EntryOutcome};

/// An SNS client set up for the relay.
#[derive(Debug, Clone)]
pub struct Sns {
    client: aws_sdk_sns::Client,
}

impl Sns {
    /// Set up as [`crate::sqs::Sqs::new`]: the shared AWS configuration, the SDK's retries off
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

    /// Publishes one batch to the topic named by `request.queue_url` (a topic ARN). `Ok`
    /// carries an outcome for every entry, in the request's order; `Err` means the request as
    /// a whole failed and no entry can be assumed either way.
    pub async fn publish(
        &self,
        request: &BatchRequest,
    ) -> Result<Vec<EntryOutcome>, RequestFailure> {
        let entries = request
            .entries
            .iter()
            .map(|e| {
                let mut entry = PublishBatchRequestEntry::builder()
                    .id(&e.id)
                    .message(&e.body)
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
                entry.build().expect("id and message are set")
            })
            .collect();
        let output = self
            .client
            .publish_batch()
            .topic_arn(request.destination.address())
            .set_publish_batch_request_entries(Some(entries))
            .send()
            .await
            .map_err(request_failure)?;
        let accepted = output
            .successful()
            .iter()
            .filter_map(|ok| Some((ok.id()?, sent(ok.message_id().unwrap_or_default()))));
        let failed = output.failed().iter().map(|f| {
            let outcome = refused(f.sender_fault(), f.code(), f.message());
            (f.id(), outcome)
        });
        Ok(outcomes(request, accepted.chain(failed), "PublishBatch"))
    }

    /// Reads the topic's attributes (`check`, and the relay for the topic's size limit); fails
    /// like a publish would when the topic is missing or the credentials may not use it.
    pub async fn topic_attributes(&self, topic_arn: &str) -> Result<TopicInfo, RequestFailure> {
        let output = self
            .client
            .get_topic_attributes()
            .topic_arn(topic_arn)
            .send()
            .await
            .map_err(request_failure)?;
        let attribute = |name: &str| {
            output
                .attributes()
                .and_then(|attrs| attrs.get(name))
                .map(String::as_str)
        };
        Ok(TopicInfo {
            maximum_message_size: attribute("MaximumMessageSize").and_then(|v| v.parse().ok()),
            fifo: attribute("FifoTopic") == Some("true"),
            content_based_deduplication: attribute("ContentBasedDeduplication") == Some("true"),
        })
    }
}

/// The attributes of a topic that must agree with the relay's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    /// The largest message the topic accepts, in bytes (SNS reports it since topics took up to
    /// 1 MiB, September 2026); `None` if the server did not say: an older topic, an emulator.
    pub maximum_message_size: Option<usize>,
    pub fifo: bool,
    pub content_based_deduplication: bool,
}
