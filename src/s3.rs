//! The only owner of `aws_sdk_s3`: large message bodies go to S3 before their pointer message
//! goes to SQS (the claim-check format of the SQS Extended Client libraries, see
//! docs/large-events.md).
//!
//! The relay only ever writes: an event's object is overwritten by a resend of the same event,
//! never deleted (a bucket lifecycle rule expires objects).

use std::time::Duration;

use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;

use crate::batch::Offload;
use crate::retry::RequestFailure;

/// The key `check` writes to prove the bucket takes objects; the only object that is not an
/// event's, overwritten by every check.
pub const PROBE_KEY: &str = "outbox-relay-check";

/// An S3 client set up for the relay.
#[derive(Debug, Clone)]
pub struct S3 {
    client: aws_sdk_s3::Client,
    /// The bucket every offloaded body goes to (`--offload-bucket`).
    bucket: String,
}

impl S3 {
    /// Region and credentials come from the shared AWS configuration, as for SQS. A custom
    /// `endpoint` (local servers, S3-compatible stores) is addressed path-style: a virtual-host
    /// name `bucket.127.0.0.1` does not resolve. SDK retries are off for the reason given in
    /// `sqs.rs`: the relay classifies failures itself.
    pub async fn new(bucket: &str, endpoint: Option<&str>, timeout: Duration) -> S3 {
        let shared = crate::aws::shared_config().await;
        let (retry, timeouts) = crate::aws::client_limits(timeout);
        let mut config = aws_sdk_s3::config::Builder::from(&shared)
            .retry_config(retry)
            .timeout_config(timeouts);
        if let Some(endpoint) = endpoint {
            config = config.endpoint_url(endpoint).force_path_style(true);
        }
        S3 {
            client: aws_sdk_s3::Client::from_conf(config.build()),
            bucket: bucket.to_string(),
        }
    }

    /// The bucket bodies go to.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// Stores one message body under its event's key; a second call for the same event
    /// replaces the object with the same bytes.
    pub async fn put(&self, offload: &Offload) -> Result<(), RequestFailure> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(&offload.key)
            .content_type("application/json")
            .body(ByteStream::from(offload.body.clone()))
            .send()
            .await
            .map_err(request_failure)?;
        Ok(())
    }

    /// `check`'s proof that offloading will work: a small object under the prefix, with the
    /// only permission the relay needs (s3:PutObject).
    pub async fn probe(&self, prefix: &str) -> Result<(), RequestFailure> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(format!("{prefix}{PROBE_KEY}"))
            .body(ByteStream::from_static(b"written by outbox-relay check"))
            .send()
            .await
            .map_err(request_failure)?;
        Ok(())
    }
}

/// The shared classification (`aws::request_failure`: S3's codes `SlowDown`, `NoSuchBucket`,
/// `AccessDenied`, `EntityTooLarge` sit in the same lists as SQS's), naming the call.
fn request_failure<E>(err: SdkError<E, aws_sdk_s3::config::http::HttpResponse>) -> RequestFailure
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let mut failure = crate::aws::request_failure(err);
    failure.message = format!("S3 PutObject: {}", failure.message);
    failure
}
