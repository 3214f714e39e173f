//! Pure rules for failures: which class an SQS failure belongs to, and how long to wait.
//!
//! Nothing here does I/O. `aws::request_failure` turns an SDK error into a [`RequestFailure`];
//! this module decides what it means, so the decision is unit-tested without a server.

use std::time::Duration;

/// What a failed SendMessageBatch call (the whole request, not one entry) tells us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFailure {
    /// HTTP status, when a response arrived at all.
    pub status: Option<u16>,
    /// The SQS/AWS error code (`QueueDoesNotExist`, `ThrottlingException`, ...).
    pub code: Option<String>,
    /// Human-readable message from the service or the transport; never contains credentials.
    pub message: String,
    /// How the call failed before or around the response.
    pub transport: Transport,
}

/// The transport-level shape of a failure, independent of the SDK's types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The service answered with an error response.
    Response,
    /// The call timed out (connect, read or the whole operation).
    Timeout,
    /// The connection failed or was dropped (refused, reset, closed before the response).
    Connection,
    /// The request could not even be built: usually missing credentials or region.
    Construction,
}

/// What the relay does about a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureClass {
    /// The queue asks us to slow down: back off as a whole, do not blame the rows.
    Throttled,
    /// The queue or the path to it is unwell: back off, rows keep their attempts.
    Transient,
    /// The relay as a whole cannot reach SQS (credentials missing, invalid or expired, the
    /// request cannot be signed): rows are not at fault, every send pauses and readiness
    /// fails until a request succeeds again.
    Config,
    /// One destination refuses us (its queue is missing, its policy or KMS key denies us):
    /// only the rows for that queue are held back; other queues are unaffected.
    Destination,
    /// The request was refused because of its input: some entry is bad. Split the batch to
    /// find it; a single rejected entry is quarantined.
    BadRequest,
}

impl FailureClass {
    /// The `kind` label of `outbox_send_failures_total` for this class.
    pub fn metric_kind(self) -> &'static str {
        match self {
            FailureClass::Throttled => "throttled",
            FailureClass::Transient => "transient",
            FailureClass::Config => "config",
            // A queue of the relay's own configuration (`--queue-url`, `--route`) counts as
            // `config` instead: the relay decides, since only it knows which queues those are.
            FailureClass::Destination => "destination",
            FailureClass::BadRequest => "permanent",
        }
    }
}

const THROTTLE_CODES: &[&str] = &[
    "ThrottlingException",
    "Throttling",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "SlowDown",
    "KmsThrottled",
    "KmsThrottlingException",
    "OverLimit",
    // SNS's spellings.
    "Throttled",
    "ThrottledException",
    "KMSThrottling",
    "KMSThrottlingException",
];

/// Failures of the caller's identity: whatever queue we send to, it fails the same way.
const CREDENTIAL_CODES: &[&str] = &[
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "MissingAuthenticationToken",
    "ExpiredToken",
    "ExpiredTokenException",
    "RequestExpired",
    "InvalidSecurity",
];

/// Failures that belong to the queue named in the request: it does not exist (yet), its policy
/// or its own KMS key denies us, its URL is not one SQS knows. Another queue may work fine.
/// AccessDenied is here because SQS authorises SendMessage per queue (IAM resource, queue
/// policy); a role without any SQS right fails on every queue and so holds every destination,
/// which is still right, only one destination at a time.
const DESTINATION_CODES: &[&str] = &[
    "QueueDoesNotExist",
    "NonExistentQueue",
    "QueueDeletedRecently",
    "AccessDenied",
    "AccessDeniedException",
    "InvalidAddress",
    "KmsAccessDenied",
    "KmsDisabled",
    "KmsNotFound",
    "KmsInvalidState",
    "KmsInvalidKeyUsage",
    "KmsOptInRequired",
    "UnsupportedOperation",
    // SNS: the topic does not exist, or its policy (SNS authorises Publish per topic) or its
    // KMS key denies us.
    "NotFound",
    "NotFoundException",
    "AuthorizationError",
    "AuthorizationErrorException",
    "KMSAccessDenied",
    "KMSDisabled",
    "KMSNotFound",
    "KMSInvalidState",
    "KMSOptInRequired",
    // S3, for large bodies (--offload-bucket): the bucket is missing or its owner's rules
    // refuse us; its rows wait like a missing queue's.
    "NoSuchBucket",
    "AllAccessDisabled",
];

/// The destination is in another region than the relay's (AWS_REGION, or the endpoint): S3
/// redirects to the bucket's region (301 `PermanentRedirect`), or refuses a signature made for
/// the wrong one (`AuthorizationHeaderMalformed`: "the region 'us-east-1' is wrong; expecting
/// 'eu-west-1'"). Retrying cannot help and the rows are not at fault: configuration, held like a
/// missing bucket.
const WRONG_REGION_CODES: &[&str] = &["PermanentRedirect", "AuthorizationHeaderMalformed"];

/// SNS's `InvalidParameter` names the parameter it refuses: "Invalid parameter: TopicArn" is
/// what a topic in another region (or a mistyped ARN) gets, whatever the entries hold; bad
/// input in an entry names another parameter ("Invalid parameter: Message too long",
/// "Invalid parameter: The MessageGroupId parameter is required for FIFO topics").
fn refuses_the_topic(code: &str, message: &str) -> bool {
    matches!(code, "InvalidParameter" | "InvalidParameterException")
        && message
            .trim_start()
            .strip_prefix("Invalid parameter:")
            .map(str::trim_start)
            .is_some_and(|p| p.starts_with("TopicArn") || p.starts_with("TargetArn"))
}

/// Whether the failure says the destination is in another region than the relay (or, for a
/// topic, that its ARN is not one this region knows): configuration to fix, not rows to retry.
pub fn is_wrong_region(failure: &RequestFailure) -> bool {
    if failure.transport != Transport::Response {
        return false;
    }
    match failure.code.as_deref().map(bare_code) {
        Some(code) => {
            WRONG_REGION_CODES.contains(&code) || refuses_the_topic(code, &failure.message)
        }
        // A redirect without a body (S3 answers HEAD so): only a region does that.
        None => failure.status == Some(301),
    }
}

/// What an operator reads of a failure: the service's code and message, and where the failure
/// is a misconfigured region, what to set.
pub fn describe(failure: &RequestFailure) -> String {
    let said = match &failure.code {
        Some(code) => format!("{code}: {}", failure.message),
        None => failure.message.clone(),
    };
    if is_wrong_region(failure) {
        format!("{said} (the destination is in another region than the relay: set AWS_REGION to its region, or its endpoint)")
    } else {
        said
    }
}

/// Whether a failed upload of a large body counts against its row. A timeout does: the body
/// may be what outlasts every deadline, and given back unchanged it would be retried for ever;
/// after `--max-attempts` of them the row is quarantined. Other failures are S3's or the
/// path's, and keep the row's attempts.
pub fn upload_spends_attempt(failure: &RequestFailure) -> bool {
    failure.transport == Transport::Timeout
}

const BAD_REQUEST_CODES: &[&str] = &[
    "InvalidParameterValue",
    "InvalidParameterCombination",
    "BatchRequestTooLong",
    "InvalidMessageContents",
    "InvalidAttributeName",
    "InvalidAttributeValue",
    "TooManyEntriesInBatchRequest",
    "BatchEntryIdsNotDistinct",
    "InvalidBatchEntryId",
    "EmptyBatchRequest",
    "MissingParameter",
    "ValidationError",
    "ValidationException",
    "MessageTooLong",
    // SNS's spellings.
    "InvalidParameter",
    "InvalidParameterException",
    "InvalidParameterValueException",
    // S3: the object itself is refused.
    "EntityTooLarge",
    "KeyTooLongError",
    "InvalidArgument",
];

/// Strips the namespaces SQS puts in front of codes (`AWS.SimpleQueueService.NonExistentQueue`,
/// `com.amazonaws.sqs#QueueDoesNotExist`) so one list serves the query and JSON protocols.
fn bare_code(code: &str) -> &str {
    let code = code.rsplit('#').next().unwrap_or(code);
    code.rsplit('.').next().unwrap_or(code)
}

/// Is this code one SQS uses to ask for less traffic? Also used for per-entry failures.
pub fn is_throttle_code(code: &str) -> bool {
    THROTTLE_CODES.contains(&bare_code(code))
}

/// Decides what a whole-request failure means. Unknown errors are transient: retrying a row
/// that is fine costs a delay, while calling a fine row bad would quarantine it for nothing.
pub fn classify(failure: &RequestFailure) -> FailureClass {
    match failure.transport {
        Transport::Timeout | Transport::Connection => return FailureClass::Transient,
        Transport::Construction => return FailureClass::Config,
        Transport::Response => {}
    }
    if let Some(code) = failure.code.as_deref() {
        let code = bare_code(code);
        if THROTTLE_CODES.contains(&code) {
            return FailureClass::Throttled;
        }
        if CREDENTIAL_CODES.contains(&code) {
            return FailureClass::Config;
        }
        if DESTINATION_CODES.contains(&code) || is_wrong_region(failure) {
            return FailureClass::Destination;
        }
        if BAD_REQUEST_CODES.contains(&code) {
            return FailureClass::BadRequest;
        }
    }
    match failure.status {
        Some(301) => FailureClass::Destination,
        Some(429) => FailureClass::Throttled,
        Some(401) | Some(403) => FailureClass::Config,
        Some(413) => FailureClass::BadRequest,
        _ => FailureClass::Transient,
    }
}

/// What one entry's failure in an answered SendMessageBatch means for its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryDecision {
    /// The queue asks for less traffic: give the row back with its attempt and slow the whole
    /// relay down.
    Throttled,
    /// SQS says the entry itself is bad (`SenderFault`): quarantine it, never retry.
    SenderFault,
    /// Try the row again after its own back-off; the attempt counts.
    Retry,
    /// Retryable, but `--max-attempts` is spent: quarantine it.
    OutOfAttempts,
}

impl EntryDecision {
    /// The `kind` label of `outbox_send_failures_total` for this entry.
    pub fn metric_kind(self) -> &'static str {
        match self {
            EntryDecision::Throttled => "throttled",
            EntryDecision::SenderFault => "permanent",
            EntryDecision::Retry | EntryDecision::OutOfAttempts => "transient",
        }
    }
}

/// Decides a failed entry's fate from SQS's per-entry answer and the row's attempts so far
/// (this claim's included).
pub fn entry_decision(
    sender_fault: bool,
    code: &str,
    attempts: u32,
    max_attempts: u32,
) -> EntryDecision {
    // Throttling first: SQS may flag a throttled entry as the sender's fault, and a busy queue
    // is no reason to quarantine a good row.
    if is_throttle_code(code) {
        EntryDecision::Throttled
    } else if sender_fault {
        EntryDecision::SenderFault
    } else if attempts >= max_attempts {
        EntryDecision::OutOfAttempts
    } else {
        EntryDecision::Retry
    }
}

/// What the relay does about a request that failed as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestReaction {
    /// Some entry made SQS refuse the whole request (moto does this for one oversized body):
    /// halve it until the culprit stands alone; the halves of a request carrying ordered
    /// groups go one after the other.
    Split { one_after_the_other: bool },
    /// A request of one entry refused as bad input: that row is quarantined (`rejected`).
    QuarantineTheEntry,
    /// The destination queue refused the relay: its rows are parked on that queue's own
    /// back-off; other queues are untouched.
    ParkTheQueue,
    /// Not the rows' fault: they go back with their attempts and the whole relay pauses;
    /// `not_ready` when the relay's credentials were refused (readiness fails until a request
    /// succeeds again).
    PauseAndRelease { not_ready: bool },
}

/// Decides [`RequestReaction`] from the failure's class, the request's size and whether it
/// carries ordered groups.
pub fn request_reaction(class: FailureClass, entries: usize, ordered: bool) -> RequestReaction {
    match class {
        FailureClass::BadRequest if entries > 1 => RequestReaction::Split {
            one_after_the_other: ordered,
        },
        FailureClass::BadRequest => RequestReaction::QuarantineTheEntry,
        FailureClass::Destination => RequestReaction::ParkTheQueue,
        FailureClass::Config => RequestReaction::PauseAndRelease { not_ready: true },
        FailureClass::Throttled | FailureClass::Transient => {
            RequestReaction::PauseAndRelease { not_ready: false }
        }
    }
}

/// Capped exponential backoff with full jitter: a uniformly random wait in
/// `[0, min(cap, base * 2^(attempt-1)))`. `jitter` is the random draw in `[0, 1)`, passed in so
/// tests can pin it; callers use `fastrand::f64()`.
pub fn backoff(attempt: u32, base: Duration, cap: Duration, jitter: f64) -> Duration {
    let exp = attempt.saturating_sub(1).min(30);
    let ceiling = base.saturating_mul(1u32 << exp).min(cap);
    ceiling.mul_f64(jitter.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, code: &str) -> RequestFailure {
        RequestFailure {
            status: Some(status),
            code: Some(code.to_string()),
            message: "m".into(),
            transport: Transport::Response,
        }
    }

    #[test]
    fn throttling_codes_are_pressure_not_row_faults() {
        for code in [
            "ThrottlingException",
            "RequestThrottled",
            "AWS.SimpleQueueService.RequestThrottled",
        ] {
            assert_eq!(
                classify(&response(400, code)),
                FailureClass::Throttled,
                "{code}"
            );
        }
        let mut no_code = response(429, "x");
        no_code.code = None;
        assert_eq!(classify(&no_code), FailureClass::Throttled);
    }

    #[test]
    fn a_missing_or_forbidden_queue_belongs_to_its_destination() {
        for code in [
            "AWS.SimpleQueueService.NonExistentQueue",
            "QueueDoesNotExist",
            "com.amazonaws.sqs#QueueDoesNotExist",
            "QueueDeletedRecently",
            "AccessDenied",
            "AccessDeniedException",
            "InvalidAddress",
            "KmsAccessDenied",
            "KmsNotFound",
            "KmsDisabled",
            "UnsupportedOperation",
        ] {
            assert_eq!(
                classify(&response(400, code)),
                FailureClass::Destination,
                "{code}"
            );
        }
        assert_eq!(FailureClass::Destination.metric_kind(), "destination");
    }

    #[test]
    fn sns_codes_are_classified_like_their_sqs_counterparts() {
        for (code, class) in [
            ("Throttled", FailureClass::Throttled),
            ("KMSThrottling", FailureClass::Throttled),
            ("NotFound", FailureClass::Destination),
            ("AuthorizationError", FailureClass::Destination),
            ("KMSAccessDenied", FailureClass::Destination),
            ("InvalidParameter", FailureClass::BadRequest),
            ("BatchRequestTooLong", FailureClass::BadRequest),
        ] {
            assert_eq!(classify(&response(400, code)), class, "{code}");
        }
        assert_eq!(
            entry_decision(true, "Throttled", 1, 5),
            EntryDecision::Throttled
        );
        assert_eq!(
            entry_decision(true, "InvalidParameter", 1, 5),
            EntryDecision::SenderFault
        );
    }

    #[test]
    fn a_destination_in_another_region_is_parked_not_retried_or_blamed_on_the_rows() {
        let failure = |status: u16, code: Option<&str>, message: &str| RequestFailure {
            status: Some(status),
            code: code.map(str::to_string),
            message: message.into(),
            transport: Transport::Response,
        };
        let s3_redirect = failure(
            301,
            Some("PermanentRedirect"),
            "The bucket you are attempting to access must be addressed using the specified endpoint. Please send all future requests to this endpoint.",
        );
        let s3_signed_for_another = failure(
            400,
            Some("AuthorizationHeaderMalformed"),
            "The authorization header is malformed; the region 'us-east-1' is wrong; expecting 'eu-west-1'",
        );
        let head_redirect = failure(301, None, "moved");
        let sns_topic = failure(400, Some("InvalidParameter"), "Invalid parameter: TopicArn");
        for f in [
            &s3_redirect,
            &s3_signed_for_another,
            &head_redirect,
            &sns_topic,
        ] {
            assert_eq!(classify(f), FailureClass::Destination, "{f:?}");
            assert!(is_wrong_region(f), "{f:?}");
            assert!(describe(f).contains("set AWS_REGION"), "{}", describe(f));
            assert_eq!(
                request_reaction(classify(f), 10, false),
                RequestReaction::ParkTheQueue,
                "a batch is not split for it"
            );
        }
        assert!(describe(&sns_topic).starts_with("InvalidParameter: Invalid parameter: TopicArn"));
        let target = failure(
            400,
            Some("InvalidParameterException"),
            "Invalid parameter: TargetArn",
        );
        assert_eq!(classify(&target), FailureClass::Destination);
        // Bad input in an entry still splits the batch down to the entry and quarantines it.
        for message in [
            "Invalid parameter: Message too long",
            "Invalid parameter: The MessageGroupId parameter is required for FIFO topics",
            "Invalid parameter: MessageAttributes",
            "Invalid parameter: Topic Name",
        ] {
            let f = failure(400, Some("InvalidParameter"), message);
            assert_eq!(classify(&f), FailureClass::BadRequest, "{message}");
            assert!(!is_wrong_region(&f));
            assert!(!describe(&f).contains("AWS_REGION"));
        }
        // The same text from a timeout is no answer from the service.
        let mut timeout = sns_topic.clone();
        timeout.transport = Transport::Timeout;
        assert!(!is_wrong_region(&timeout));
    }

    #[test]
    fn only_an_upload_timeout_spends_the_rows_attempt() {
        let with = |transport: Transport, code: Option<&str>| RequestFailure {
            status: None,
            code: code.map(str::to_string),
            message: "m".into(),
            transport,
        };
        assert!(upload_spends_attempt(&with(Transport::Timeout, None)));
        for f in [
            with(Transport::Connection, None),
            with(Transport::Response, Some("SlowDown")),
            with(Transport::Response, Some("InternalError")),
            with(Transport::Construction, None),
        ] {
            assert!(!upload_spends_attempt(&f), "{f:?}");
        }
    }

    #[test]
    fn credential_errors_hold_the_whole_relay() {
        for code in [
            "InvalidClientTokenId",
            "UnrecognizedClientException",
            "SignatureDoesNotMatch",
            "IncompleteSignature",
            "MissingAuthenticationToken",
            "ExpiredToken",
            "ExpiredTokenException",
            "RequestExpired",
            "InvalidSecurity",
        ] {
            assert_eq!(
                classify(&response(400, code)),
                FailureClass::Config,
                "{code}"
            );
        }
        let mut forbidden = response(403, "Something");
        forbidden.code = None;
        assert_eq!(classify(&forbidden), FailureClass::Config);
        let construction = RequestFailure {
            status: None,
            code: None,
            message: "no credentials".into(),
            transport: Transport::Construction,
        };
        assert_eq!(classify(&construction), FailureClass::Config);
    }

    #[test]
    fn input_errors_are_bad_requests() {
        for code in [
            "InvalidParameterValue",
            "AWS.SimpleQueueService.BatchRequestTooLong",
            "InvalidMessageContents",
        ] {
            assert_eq!(
                classify(&response(400, code)),
                FailureClass::BadRequest,
                "{code}"
            );
        }
    }

    #[test]
    fn server_errors_timeouts_and_unknowns_are_transient() {
        assert_eq!(
            classify(&response(500, "InternalError")),
            FailureClass::Transient
        );
        assert_eq!(
            classify(&response(503, "ServiceUnavailable")),
            FailureClass::Transient
        );
        assert_eq!(
            classify(&response(400, "SomethingNew")),
            FailureClass::Transient
        );
        for transport in [Transport::Timeout, Transport::Connection] {
            let f = RequestFailure {
                status: None,
                code: None,
                message: "io".into(),
                transport,
            };
            assert_eq!(classify(&f), FailureClass::Transient);
        }
    }

    #[test]
    fn a_failed_request_is_split_quarantined_parked_or_paused_by_its_class() {
        use RequestReaction::*;
        let r = request_reaction;
        assert_eq!(
            r(FailureClass::BadRequest, 10, true),
            Split {
                one_after_the_other: true
            }
        );
        assert_eq!(
            r(FailureClass::BadRequest, 2, false),
            Split {
                one_after_the_other: false
            }
        );
        assert_eq!(r(FailureClass::BadRequest, 1, true), QuarantineTheEntry);
        assert_eq!(r(FailureClass::Destination, 10, true), ParkTheQueue);
        assert_eq!(
            r(FailureClass::Config, 10, false),
            PauseAndRelease { not_ready: true }
        );
        for class in [FailureClass::Throttled, FailureClass::Transient] {
            assert_eq!(r(class, 1, true), PauseAndRelease { not_ready: false });
        }
    }

    #[test]
    fn backoff_grows_exponentially_up_to_the_cap() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(5);
        // jitter just below 1 shows the ceiling of each attempt.
        let top = |a| backoff(a, base, cap, 0.999_999);
        assert!(top(1) <= base && top(1) > base.mul_f64(0.99));
        assert!(top(2) <= base * 2 && top(2) > base.mul_f64(1.99));
        assert!(top(4) <= base * 8 && top(4) > base.mul_f64(7.99));
        assert!(top(7) <= cap);
        assert!(top(1000) <= cap && top(1000) > cap.mul_f64(0.99));
        assert_eq!(backoff(0, base, cap, 0.5), base / 2);
    }

    #[test]
    fn full_jitter_spans_zero_to_the_ceiling() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(60);
        assert_eq!(backoff(3, base, cap, 0.0), Duration::ZERO);
        assert_eq!(backoff(3, base, cap, 0.5), Duration::from_millis(200));
        // Out-of-range draws are clamped rather than trusted.
        assert_eq!(backoff(3, base, cap, 7.0), Duration::from_millis(400));
        for _ in 0..1000 {
            let d = backoff(5, base, cap, fastrand::f64());
            assert!(d < Duration::from_millis(1600));
        }
    }

    #[test]
    fn a_throttled_entry_is_released_even_when_flagged_as_the_senders_fault() {
        // SQS marks some throttling answers SenderFault; quarantining them would drop good
        // rows for good because the queue was busy.
        for code in [
            "RequestThrottled",
            "AWS.SimpleQueueService.RequestThrottled",
            "ThrottlingException",
        ] {
            for sender_fault in [false, true] {
                assert_eq!(
                    entry_decision(sender_fault, code, 1, 10),
                    EntryDecision::Throttled,
                    "{code} sender_fault={sender_fault}"
                );
            }
        }
        // Throttling spends no attempt, so it never runs out of them either.
        assert_eq!(
            entry_decision(false, "RequestThrottled", 10, 10),
            EntryDecision::Throttled
        );
        assert_eq!(EntryDecision::Throttled.metric_kind(), "throttled");
    }

    #[test]
    fn a_senders_fault_is_quarantined_at_once_and_other_failures_retry_until_max_attempts() {
        assert_eq!(
            entry_decision(true, "InvalidMessageContents", 1, 10),
            EntryDecision::SenderFault
        );
        assert_eq!(
            entry_decision(true, "InvalidMessageContents", 10, 10),
            EntryDecision::SenderFault,
            "bad input is bad input, whatever the attempts"
        );
        assert_eq!(
            entry_decision(false, "InternalError", 1, 10),
            EntryDecision::Retry
        );
        assert_eq!(
            entry_decision(false, "InternalError", 9, 10),
            EntryDecision::Retry
        );
        assert_eq!(
            entry_decision(false, "InternalError", 10, 10),
            EntryDecision::OutOfAttempts
        );
        assert_eq!(
            entry_decision(false, "InternalError", 11, 10),
            EntryDecision::OutOfAttempts
        );
        assert_eq!(EntryDecision::SenderFault.metric_kind(), "permanent");
        assert_eq!(EntryDecision::Retry.metric_kind(), "transient");
        assert_eq!(EntryDecision::OutOfAttempts.metric_kind(), "transient");
    }

    #[test]
    fn throttle_codes_are_recognised_per_entry() {
        assert!(is_throttle_code("RequestThrottled"));
        assert!(!is_throttle_code("InternalError"));
    }
}
