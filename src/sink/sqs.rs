//! The only owner of `aws_sdk_sqs`: what SQS does its own way (its entry and attribute types,
//! SendMessageBatch, GetQueueAttributes); the rest is the sink's, shared with SNS.

use std::time::Duration;

use aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName, SendMessageBatchRequestEntry};

use super::{answers, reply, sdk_entry, Answers, Attributes, Reply, Service};
use crate::batch::{BatchRequest, Entry};

/// SQS's client for the relay (`aws::client!`); `endpoint` for local emulators.
pub async fn client(endpoint: Option<&str>, timeout: Duration) -> aws_sdk_sqs::Client {
    crate::aws::client!(aws_sdk_sqs, endpoint, timeout)
}

impl Service for aws_sdk_sqs::Client {
    fn batch<'a>(&'a self, request: &'a BatchRequest) -> Reply<'a, Answers> {
        let call = self
            .send_message_batch()
            .queue_url(request.destination.address())
            .set_entries(Some(request.entries.iter().map(entry).collect()));
        reply(call.send(), |output| {
            let accepted = output.successful().iter();
            let refused = output.failed().iter();
            answers(
                accepted.map(|ok| (ok.id(), ok.message_id())),
                refused.map(|f| (f.id(), f.sender_fault(), f.code(), f.message())),
            )
        })
    }

    /// `All` rather than a list: SQS refuses FIFO-only attribute names on some standard queues.
    fn attributes<'a>(&'a self, address: &'a str) -> Reply<'a, Attributes> {
        let call = self
            .get_queue_attributes()
            .queue_url(address)
            .attribute_names(QueueAttributeName::All);
        reply(call.send(), |output| {
            let attributes = output.attributes();
            Attributes::read("FifoQueue", |name| {
                Some(attributes?.get(&QueueAttributeName::from(name))?.as_str())
            })
        })
    }
}

/// One entry of SendMessageBatch.
fn entry(e: &Entry) -> SendMessageBatchRequestEntry {
    sdk_entry!(
        e,
        SendMessageBatchRequestEntry,
        message_body,
        MessageAttributeValue
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_the_sink_reads_are_the_queue_attributes_sqs_answers_with() {
        for (name, attribute) in [
            ("MaximumMessageSize", QueueAttributeName::MaximumMessageSize),
            ("FifoQueue", QueueAttributeName::FifoQueue),
            (
                "ContentBasedDeduplication",
                QueueAttributeName::ContentBasedDeduplication,
            ),
        ] {
            assert_eq!(QueueAttributeName::from(name), attribute);
        }
    }
}
