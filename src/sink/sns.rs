//! The only owner of `aws_sdk_sns`: what SNS does its own way (its entry and attribute types,
//! PublishBatch, GetTopicAttributes); the rest is the sink's, shared with SQS.

use std::time::Duration;

use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};

use super::{answers, reply, sdk_entry, Answers, Attributes, Reply, Service};
use crate::batch::{BatchRequest, Entry};

/// SNS's client for the relay (`aws::client!`); `endpoint` for local emulators.
pub async fn client(endpoint: Option<&str>, timeout: Duration) -> aws_sdk_sns::Client {
    crate::aws::client!(aws_sdk_sns, endpoint, timeout)
}

impl Service for aws_sdk_sns::Client {
    /// To the topic `request.destination` names by its ARN.
    fn batch<'a>(&'a self, request: &'a BatchRequest) -> Reply<'a, Answers> {
        let call = self
            .publish_batch()
            .topic_arn(request.destination.address())
            .set_publish_batch_request_entries(Some(request.entries.iter().map(entry).collect()));
        reply(call.send(), |output| {
            // SNS's model leaves an accepted entry's fields optional; one without its ID
            // cannot be paired, and counts as missing from the response.
            let accepted = output
                .successful()
                .iter()
                .filter_map(|ok| Some((ok.id()?, ok.message_id().unwrap_or_default())));
            let refused = output.failed().iter();
            answers(
                accepted,
                refused.map(|f| (f.id(), f.sender_fault(), f.code(), f.message())),
            )
        })
    }

    /// SNS names attributes by string, where SQS has an enum for them.
    fn attributes<'a>(&'a self, address: &'a str) -> Reply<'a, Attributes> {
        let call = self.get_topic_attributes().topic_arn(address);
        reply(call.send(), |output| {
            let attributes = output.attributes();
            Attributes::read("FifoTopic", |name| Some(attributes?.get(name)?.as_str()))
        })
    }
}

/// One entry of PublishBatch.
fn entry(e: &Entry) -> PublishBatchRequestEntry {
    sdk_entry!(e, PublishBatchRequestEntry, message, MessageAttributeValue)
}
