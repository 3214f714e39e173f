//! The only owner of `aws_sdk_s3`: large message bodies go to S3 before their pointer message
//! goes to the queue or topic (the claim-check format of the SQS Extended Client libraries, see
//! docs/large-events.md).
//!
//! The relay only ever writes: an event's object is overwritten by a resend of the same event,
//! never deleted (a bucket lifecycle rule expires objects).

use std::time::Duration;

use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;

use crate::batch::Offload;
use crate::destination::Destination;
use crate::retry::RequestFailure;

/// The key `check` writes to prove the bucket takes objects; the only object that is not an
/// event's, overwritten by every check.
pub const PROBE_KEY: &str = "outbox-relay-check";

/// An S3 client set up for the relay.
#[derive(Debug, Clone)]
pub struct S3 {
    client: aws_sdk_s3::Client,
    /// The bucket every offloaded body goes to (`--offload-bucket`).
    bucket: Destination,
}

impl S3 {
    /// Region and credentials come from the shared AWS configuration, as for SQS. A custom
    /// `endpoint` (local servers, S3-compatible stores) is addressed path-style: a virtual-host
    /// name `bucket.127.0.0.1` does not resolve. SDK retries are off for the reason given in
    /// `aws::client_limits`: the relay classifies failures itself.
    pub async fn new(bucket: &Destination, endpoint: Option<&str>, timeout: Duration) -> S3 {
        S3 {
            client: crate::aws::client!(aws_sdk_s3, endpoint, timeout, force_path_style),
            bucket: bucket.clone(),
        }
    }

    /// The bucket bodies go to.
    pub fn bucket(&self) -> &Destination {
        &self.bucket
    }

    /// Stores one message body under its event's key within `deadline` (see
    /// [`upload_deadline`]); a second call for the same event replaces the object with the
    /// same bytes.
    pub async fn put(&self, offload: &Offload, deadline: Duration) -> Result<(), RequestFailure> {
        let (_, timeouts) = crate::aws::client_limits(deadline);
        let put = async {
            self.client
                .put_object()
                .bucket(self.bucket.address())
                .key(&offload.key)
                .content_type("application/json")
                .body(ByteStream::from(offload.body.clone()))
                .customize()
                .config_override(aws_sdk_s3::config::Builder::default().timeout_config(timeouts))
                .send()
                .await
                .map_err(request_failure)?;
            Ok(())
        };
        // The SDK enforces the deadline; this guard only covers a stuck future.
        super::within(deadline + Duration::from_secs(1), put)
            .await
            .map_err(named)
    }

    /// `check`'s proof that offloading will work: a small object under the prefix, with the
    /// only permission the relay needs (s3:PutObject).
    pub async fn probe(&self, prefix: &str) -> Result<(), RequestFailure> {
        self.client
            .put_object()
            .bucket(self.bucket.address())
            .key(format!("{prefix}{PROBE_KEY}"))
            .body(ByteStream::from_static(b"written by outbox-relay check"))
            .send()
            .await
            .map_err(|err| named(request_failure(err)))?;
        Ok(())
    }
}

/// The slowest upload the relay waits for: 1 MiB/s (8 Mbit/s), far below what S3 takes in a
/// region, so only a path that is failing runs out of it.
pub const MIN_UPLOAD_BYTES_PER_SECOND: u64 = 1024 * 1024;

/// How long one upload of a `bytes`-byte body may take, or `None`: not now. It needs
/// `--send-timeout` for the round trip and the body's time at [`MIN_UPLOAD_BYTES_PER_SECOND`]
/// on top, and must end in time for the send after it: `lease_left` is what the row's lease
/// leaves now for the upload (once the send and the settlement are set aside), `lease_window`
/// what a fresh claim's lease leaves. A claim that lost more than half of that waiting for a
/// request slot gives the row back for a fresh one (`None`, not the row's fault); otherwise
/// the upload gets at most what is left, and its timeout spends one of the row's attempts
/// (`retry::upload_spends_attempt`), so a body that always outlasts its deadline ends in
/// quarantine instead of going back for ever.
pub fn upload_deadline(
    bytes: usize,
    send_timeout: Duration,
    lease_left: Duration,
    lease_window: Duration,
) -> Option<Duration> {
    let needed =
        send_timeout + Duration::from_secs_f64(bytes as f64 / MIN_UPLOAD_BYTES_PER_SECOND as f64);
    if needed <= lease_left {
        Some(needed)
    } else if lease_left < lease_window / 2 {
        None
    } else {
        Some(lease_left)
    }
}

/// The shared classification (`aws::request_failure`: S3's codes `SlowDown`, `NoSuchBucket`,
/// `AccessDenied`, `EntityTooLarge` sit in the same lists as SQS's).
fn request_failure<E>(err: SdkError<E, aws_sdk_s3::config::http::HttpResponse>) -> RequestFailure
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    // S3 names the bucket's own region on a redirect (`PermanentRedirect` has no other
    // hint that reaches the SDK's error): the operator's fix.
    let region = err
        .raw_response()
        .and_then(|r| r.headers().get("x-amz-bucket-region"))
        .map(str::to_string);
    let mut failure = crate::aws::request_failure(err);
    if let Some(region) = region {
        failure.message = format!("{} (the bucket is in {region})", failure.message);
    }
    failure
}

/// A failure as logs and rows' `last_error` show it: naming the call, which S3's own messages
/// do not.
fn named(mut failure: RequestFailure) -> RequestFailure {
    failure.message = format!("S3 PutObject: {}", failure.message);
    failure
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upload_gets_the_send_timeout_and_a_second_per_mib_within_the_lease() {
        let send = Duration::from_secs(10);
        let long = Duration::from_secs(600);
        let mib = |n: usize| n * 1024 * 1024;
        assert_eq!(upload_deadline(0, send, long, long), Some(send));
        assert_eq!(
            upload_deadline(mib(32), send, long, long),
            Some(Duration::from_secs(42))
        );
        assert_eq!(
            upload_deadline(mib(1) / 2, send, long, long),
            Some(Duration::from_millis(10_500))
        );
        // The lease leaves less than the body needs: what is left, and a timeout spends an
        // attempt (a body no lease fits ends in quarantine)...
        let window = Duration::from_secs(15);
        let left = Duration::from_secs(14);
        assert_eq!(upload_deadline(mib(32), send, left, window), Some(left));
        assert_eq!(
            upload_deadline(mib(5), send, left, window),
            Some(left),
            "a body needing 15 s of a 15 s window is tried, not given back for ever"
        );
        // ...unless this claim lost most of its window waiting for a slot: a fresh one gets more.
        assert_eq!(
            upload_deadline(mib(32), send, Duration::from_secs(5), window),
            None
        );
        assert_eq!(
            upload_deadline(0, send, Duration::from_secs(5), window),
            None,
            "not even the round trip fits"
        );
    }
}
