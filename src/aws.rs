//! The AWS configuration (region, credential chain), loaded once per process: SQS and IAM
//! database authentication use the same one, so both act as the same principal.

use aws_config::SdkConfig;
use tokio::sync::OnceCell;

/// The standard chain's configuration: environment, profile, web identity, ECS and EC2 roles.
pub async fn shared_config() -> SdkConfig {
    static SHARED: OnceCell<SdkConfig> = OnceCell::const_new();
    SHARED
        .get_or_init(|| aws_config::defaults(aws_config::BehaviorVersion::latest()).load())
        .await
        .clone()
}
