//! The AWS configuration (region, credential chain), loaded once per process: SQS, SNS and IAM
//! database authentication use the same one, so all act as the same principal. How every AWS
//! client of the relay is built (`client!`), and the one place an SDK error becomes the facts
//! `retry::classify` decides on, for every AWS service.

use std::time::Duration;

use aws_config::SdkConfig;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::display::DisplayErrorContext;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use aws_smithy_types::retry::RetryConfig;
use aws_smithy_types::timeout::TimeoutConfig;
use tokio::sync::OnceCell;

use crate::retry::{RequestFailure, Transport};

/// The standard chain's configuration: environment, profile, web identity, ECS and EC2 roles.
pub async fn shared_config() -> SdkConfig {
    static SHARED: OnceCell<SdkConfig> = OnceCell::const_new();
    SHARED
        .get_or_init(|| aws_config::defaults(aws_config::BehaviorVersion::latest()).load())
        .await
        .clone()
}

/// What every AWS client of the relay is built with: the SDK's own retries off (the relay
/// decides what a failure means for each row, and a hidden SDK retry after a timeout would only
/// add duplicates and delay that decision), each call bounded by `timeout`, a connection by at
/// most 3 s of it.
pub fn client_limits(timeout: Duration) -> (RetryConfig, TimeoutConfig) {
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(timeout.min(Duration::from_secs(3)))
        .operation_timeout(timeout)
        .build();
    (RetryConfig::disabled(), timeouts)
}

/// An SDK's client (`$sdk`: `aws_sdk_sqs`, ...) built as every AWS client of the relay is: the
/// shared configuration, [`client_limits`] for `$timeout`, and `$endpoint` when given, set on
/// the client so that it wins over the SDK's own resolution (`AWS_ENDPOINT_URL_*`); `$more` are
/// what a custom endpoint needs besides (S3's `force_path_style`). A macro because the SDKs'
/// config builders are separate types with the same methods and no trait over them.
macro_rules! client {
    ($sdk:ident, $endpoint:expr, $timeout:expr $(, $more:ident)*) => {{
        let shared = $crate::aws::shared_config().await;
        let (retry, timeouts) = $crate::aws::client_limits($timeout);
        let mut config = $sdk::config::Builder::from(&shared)
            .retry_config(retry)
            .timeout_config(timeouts);
        if let Some(endpoint) = $endpoint {
            config = config.endpoint_url(endpoint)$(.$more(true))*;
        }
        $sdk::Client::from_conf(config.build())
    }};
}
pub(crate) use client;

/// Flattens the SDK's error into the facts `retry::classify` decides on.
pub fn request_failure<E, R>(err: SdkError<E, R>) -> RequestFailure
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + HasStatus,
{
    // A service error's own message is what an operator needs; the SDK's full context for it
    // repeats the raw response (headers, body) several times over in every log line.
    let message = match &err {
        SdkError::ServiceError(s) => match s.err().message() {
            Some(m) => m.to_string(),
            None => DisplayErrorContext(&err).to_string(),
        },
        _ => DisplayErrorContext(&err).to_string(),
    };
    let (transport, status, code) = match &err {
        SdkError::ConstructionFailure(_) => (Transport::Construction, None, None),
        SdkError::TimeoutError(_) => (Transport::Timeout, None, None),
        SdkError::DispatchFailure(d) if d.is_timeout() => (Transport::Timeout, None, None),
        SdkError::DispatchFailure(d) if d.is_user() => (Transport::Construction, None, None),
        SdkError::DispatchFailure(_) => (Transport::Connection, None, None),
        SdkError::ResponseError(r) => (Transport::Response, Some(r.raw().status_code()), None),
        SdkError::ServiceError(s) => (
            Transport::Response,
            Some(s.raw().status_code()),
            s.err().code().map(str::to_string),
        ),
        _ => (Transport::Connection, None, None),
    };
    RequestFailure {
        status,
        code,
        message,
        transport,
    }
}

/// The raw HTTP response's status, without naming the SDK's HTTP types in signatures.
pub trait HasStatus {
    fn status_code(&self) -> u16;
}

impl HasStatus for HttpResponse {
    fn status_code(&self) -> u16 {
        self.status().as_u16()
    }
}
