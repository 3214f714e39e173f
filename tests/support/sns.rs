//! Topics on the same local server as the queues (fauxqs serves SNS too), each test its own,
//! with SQS queues subscribed the way consumers subscribe them.

use super::sqs::{sqs, sqs_client, test_sdk_config};
use super::unique;
use aws_sdk_sqs::types::QueueAttributeName;

/// SDK client for the test side, talking straight to the server.
pub fn sns_client() -> aws_sdk_sns::Client {
    aws_sdk_sns::Client::new(&test_sdk_config(sqs().endpoint()))
}

/// A topic name unique in this run; a `.fifo` prefix makes a FIFO topic name.
pub fn topic_name(prefix: &str) -> String {
    match prefix.strip_suffix(".fifo") {
        Some(base) => format!("{base}-{}-{}.fifo", unique(), std::process::id()),
        None => format!("{prefix}-{}-{}", unique(), std::process::id()),
    }
}

/// Creates the topic `name` (FIFO when it ends in `.fifo`) and returns its ARN.
pub async fn create_topic_named(name: &str) -> String {
    create_topic_with(name, &[]).await
}

/// Creates the topic `name` with CreateTopic's `attributes` (FIFO when it ends in `.fifo`) and
/// returns its ARN. fauxqs keeps any attribute given here and reports it (SetTopicAttributes
/// refuses `MaximumMessageSize`); moto accepts it but does not report it.
pub async fn create_topic_with(name: &str, attributes: &[(&str, &str)]) -> String {
    let mut request = sns_client().create_topic().name(name);
    for (attribute, value) in attributes {
        request = request.attributes(*attribute, *value);
    }
    if name.ends_with(".fifo") {
        request = request.attributes("FifoTopic", "true");
    }
    request
        .send()
        .await
        .unwrap_or_else(|e| panic!("create topic {name}: {e:?}"))
        .topic_arn
        .expect("CreateTopic returned no TopicArn")
}

/// Creates a topic named after `prefix`, unique in this run, and returns its ARN.
pub async fn create_topic(prefix: &str) -> String {
    create_topic_named(&topic_name(prefix)).await
}

/// Subscribes `queue_url` to `topic_arn`; `raw` turns on raw message delivery (the payload as
/// the body, the attributes as message attributes) instead of the SNS JSON envelope.
pub async fn subscribe_queue(topic_arn: &str, queue_url: &str, raw: bool) {
    let queue_arn = sqs_client()
        .await
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .expect("GetQueueAttributes")
        .attributes
        .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
        .expect("QueueArn");
    let mut request = sns_client()
        .subscribe()
        .topic_arn(topic_arn)
        .protocol("sqs")
        .endpoint(queue_arn);
    if raw {
        request = request.attributes("RawMessageDelivery", "true");
    }
    request
        .send()
        .await
        .unwrap_or_else(|e| panic!("subscribe {queue_url} to {topic_arn}: {e:?}"));
}
