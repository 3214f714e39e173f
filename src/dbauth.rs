//! Where a new database connection's password comes from: the connection string, a file read
//! again for every connection (`--database-password-file`), or a fresh RDS IAM auth token
//! (`--database-iam-auth`). Fetched when a connection is opened, so a rotated secret or a new
//! token is used without a restart. The only owner of `aws-sigv4`.
//!
//! Nothing here puts a password, a file's content or a token into an error or a log line.

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use aws_credential_types::provider::ProvideCredentials;
use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    self, SignableBody, SignableRequest, SignatureLocation, SigningSettings,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use tokio_postgres::config::Host;

use crate::tls::SslMode;

/// What RDS accepts at most, and what every SDK's token generator asks for.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(900);

/// The IAM action and signing name of a database login.
const ACTION: &str = "connect";
const SERVICE: &str = "rds-db";

/// Credentials that expire sooner than this are fetched anew before signing, so a token is
/// never signed with credentials about to lapse (a token dies with its credentials).
const CREDENTIALS_MARGIN: Duration = Duration::from_secs(5 * 60);

/// Which password a new connection uses; chosen once from the flags by [`choose`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PasswordSource {
    /// The connection string's own password, if it has one.
    #[default]
    Url,
    /// The content of this file, read at each new connection, trailing newline removed.
    File(PathBuf),
    /// A fresh RDS IAM auth token per connection, for the URL's host, port and user.
    Iam,
}

impl fmt::Display for PasswordSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PasswordSource::Url => f.write_str("the connection string"),
            PasswordSource::File(path) => write!(f, "the password file {}", path.display()),
            PasswordSource::Iam => f.write_str("RDS IAM authentication"),
        }
    }
}

/// The source the flags ask for, or one line saying which flags contradict each other.
/// `pg` is the parsed connection string, `ssl` its effective `sslmode`.
pub fn choose(
    pg: &tokio_postgres::Config,
    ssl: SslMode,
    file: Option<&Path>,
    iam: bool,
) -> Result<PasswordSource, String> {
    let url_password = pg.get_password().is_some();
    match (file, iam) {
        (Some(_), true) => Err("--database-iam-auth and --database-password-file are two password sources: choose one".to_string()),
        (Some(_), false) if url_password => Err("--database-password-file and a password in --database-url are two password sources: remove the password from the URL".to_string()),
        (Some(path), false) if path.as_os_str().is_empty() => Err("--database-password-file must not be empty".to_string()),
        (Some(path), false) => Ok(PasswordSource::File(path.to_path_buf())),
        (None, false) => Ok(PasswordSource::Url),
        (None, true) => {
            if url_password {
                return Err("--database-iam-auth logs in with a token instead of a password: remove the password from --database-url".to_string());
            }
            // A token is a bearer credential for 15 minutes; RDS only accepts it over TLS.
            if ssl == SslMode::Disable {
                return Err("--database-iam-auth needs TLS (RDS accepts tokens only over TLS, and a token is a credential for 15 minutes): use sslmode=verify-full (or require), not sslmode=disable".to_string());
            }
            let one_tcp_host = matches!(pg.get_hosts(), [Host::Tcp(_)]);
            if !one_tcp_host || pg.get_ports().len() > 1 {
                return Err("--database-iam-auth signs its token for one host name: give --database-url exactly one TCP host (the RDS endpoint) and port".to_string());
            }
            if pg.get_user().is_none() {
                return Err("--database-iam-auth needs the database user in --database-url: the token is signed for that user".to_string());
            }
            Ok(PasswordSource::Iam)
        }
    }
}

/// Why no password could be had for a connection. Names files, never their content.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("cannot read the password file {path}: {reason}")]
    FileUnreadable { path: String, reason: String },
    #[error("the password file {path} is empty")]
    FileEmpty { path: String },
    #[error("IAM database authentication needs an AWS region: set AWS_REGION (or a region in the AWS profile)")]
    NoRegion,
    #[error("IAM database authentication has no AWS credentials: {0}")]
    NoCredentials(String),
    #[error("IAM database authentication needs {0} in the connection string")]
    Incomplete(&'static str),
    #[error("cannot sign the IAM auth token: {0}")]
    Sign(String),
}

/// The password in `path`: its content without the trailing line break a secret file or an
/// editor adds. An empty password is refused here rather than by the server, whose answer
/// would not name the file.
pub fn read_password_file(path: &Path) -> Result<String, AuthError> {
    let shown = || path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| AuthError::FileUnreadable {
        path: shown(),
        reason: io_reason(&e),
    })?;
    let text = String::from_utf8(bytes).map_err(|_| AuthError::FileUnreadable {
        path: shown(),
        reason: "it is not UTF-8 text".to_string(),
    })?;
    let password = text.trim_end_matches(['\n', '\r']);
    if password.is_empty() {
        return Err(AuthError::FileEmpty { path: shown() });
    }
    Ok(password.to_string())
}

/// The OS's reason without the path (which the message gives once) and never any content.
fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_string(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        _ => e.to_string(),
    }
}

/// An error and its causes on one line: the chain's own message is only "failed to load".
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Fetches each new connection's password from its source. One per `Outbox`, shared by all of
/// its connections.
#[derive(Default)]
pub struct Passwords {
    source: PasswordSource,
    /// The last credentials IAM tokens were signed with, reused until close to their expiry.
    /// The SDK keeps such a cache inside its clients only; without this, a web-identity or
    /// container role would cost an STS or metadata call per database connection.
    credentials: tokio::sync::Mutex<Option<Credentials>>,
}

impl fmt::Debug for Passwords {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Passwords")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Passwords {
    pub fn new(source: PasswordSource) -> Self {
        Passwords {
            source,
            credentials: tokio::sync::Mutex::new(None),
        }
    }

    pub fn source(&self) -> &PasswordSource {
        &self.source
    }

    /// The settings for one new connection: `pg`, with the source's password in it.
    pub async fn apply<'a>(
        &self,
        pg: &'a tokio_postgres::Config,
    ) -> Result<Cow<'a, tokio_postgres::Config>, AuthError> {
        let password = match &self.source {
            PasswordSource::Url => return Ok(Cow::Borrowed(pg)),
            PasswordSource::File(path) => read_password_file(path)?,
            PasswordSource::Iam => self.iam_token(pg).await?,
        };
        let mut pg = pg.clone();
        pg.password(password);
        Ok(Cow::Owned(pg))
    }

    /// A token for the connection string's host, port and user, signed now.
    async fn iam_token(&self, pg: &tokio_postgres::Config) -> Result<String, AuthError> {
        let host = match pg.get_hosts().first() {
            Some(Host::Tcp(host)) => host.as_str(),
            _ => return Err(AuthError::Incomplete("a TCP host name")),
        };
        let port = pg.get_ports().first().copied().unwrap_or(5432);
        let user = pg.get_user().ok_or(AuthError::Incomplete("a user"))?;
        let aws = crate::aws::shared_config().await;
        let region = aws.region().ok_or(AuthError::NoRegion)?.to_string();
        let credentials = self.credentials(&aws).await?;
        let now = aws
            .time_source()
            .map(|t| t.now())
            .unwrap_or_else(SystemTime::now);
        rds_auth_token(host, port, user, &region, credentials, now)
    }

    async fn credentials(&self, aws: &aws_config::SdkConfig) -> Result<Credentials, AuthError> {
        let mut cached = self.credentials.lock().await;
        let fresh_enough = |c: &Credentials| {
            c.expiry()
                .is_some_and(|at| at > SystemTime::now() + CREDENTIALS_MARGIN)
        };
        if let Some(c) = cached.as_ref().filter(|c| fresh_enough(c)) {
            return Ok(c.clone());
        }
        let provider = aws.credentials_provider().ok_or_else(|| {
            AuthError::NoCredentials("the AWS credential chain is not configured".to_string())
        })?;
        let credentials = provider
            .provide_credentials()
            .await
            .map_err(|e| AuthError::NoCredentials(with_causes(&e)))?;
        *cached = Some(credentials.clone());
        Ok(credentials)
    }
}

/// An RDS IAM auth token: the presigned URL `https://HOST:PORT/?Action=connect&DBUser=USER`
/// (SigV4 in the query string, service `rds-db`, valid [`TOKEN_LIFETIME`]) without its scheme,
/// as every AWS SDK's generator makes it. Signed by `aws-sigv4`.
pub fn rds_auth_token(
    host: &str,
    port: u16,
    user: &str,
    region: &str,
    credentials: Credentials,
    now: SystemTime,
) -> Result<String, AuthError> {
    let identity: Identity = credentials.into();
    let mut settings = SigningSettings::default();
    settings.expires_in = Some(TOKEN_LIFETIME);
    settings.signature_location = SignatureLocation::QueryParams;
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(SERVICE)
        .time(now)
        .settings(settings)
        .build()
        .map_err(|e| AuthError::Sign(e.to_string()))?
        .into();
    let user: String = form_urlencoded::byte_serialize(user.as_bytes()).collect();
    let mut url = format!("https://{host}:{port}/?Action={ACTION}&DBUser={user}");
    let request = SignableRequest::new("GET", &url, std::iter::empty(), SignableBody::empty())
        .map_err(|e| AuthError::Sign(e.to_string()))?;
    let (instructions, _signature) = http_request::sign(request, &params)
        .map_err(|e| AuthError::Sign(e.to_string()))?
        .into_parts();
    for (name, value) in instructions.params() {
        url.push('&');
        url.push_str(name);
        url.push('=');
        url.extend(form_urlencoded::byte_serialize(value.as_bytes()));
    }
    Ok(url.split_off("https://".len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn at(unix_seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(unix_seconds)
    }

    /// The vector of aws-sdk-rust's own generator (awslabs/aws-sdk-rust,
    /// sdk/rds/src/auth_token.rs, test `signing_works`): the exact token, byte for byte.
    #[test]
    fn the_token_matches_aws_sdk_rust_s_vector() {
        let credentials = Credentials::new("akid", "secret", None, None, "test");
        let token = rds_auth_token(
            "prod-instance.us-east-1.rds.amazonaws.com",
            3306,
            "peccy",
            "us-east-1",
            credentials,
            at(1_724_709_600),
        )
        .unwrap();
        assert_eq!(
            token,
            "prod-instance.us-east-1.rds.amazonaws.com:3306/?Action=connect&DBUser=peccy&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=akid%2F20240826%2Fus-east-1%2Frds-db%2Faws4_request&X-Amz-Date=20240826T220000Z&X-Amz-Expires=900&X-Amz-SignedHeaders=host&X-Amz-Signature=dd0cba843009474347af724090233265628ace491ea17ce3eb3da098b983ad89"
        );
    }

    /// botocore's vector (boto/botocore, tests/unit/test_signers.py,
    /// `TestGenerateDBAuthToken.test_generate_db_auth_token`), which compares the query as a
    /// set of pairs: the same pairs, the same signature, from another SDK's signer.
    #[test]
    fn the_token_matches_botocore_s_vector() {
        let credentials = Credentials::new("akid", "skid", None, None, "test");
        // 2016-11-07T17:39:33Z
        let token = rds_auth_token(
            "prod-instance.us-east-1.rds.amazonaws.com",
            3306,
            "someusername",
            "us-east-1",
            credentials,
            at(1_478_540_373),
        )
        .unwrap();
        let (authority, query) = token.split_once("/?").unwrap();
        assert_eq!(authority, "prod-instance.us-east-1.rds.amazonaws.com:3306");
        let mut pairs: Vec<&str> = query.split('&').collect();
        pairs.sort_unstable();
        let mut expected = vec![
            "Action=connect",
            "DBUser=someusername",
            "X-Amz-Algorithm=AWS4-HMAC-SHA256",
            "X-Amz-Date=20161107T173933Z",
            "X-Amz-SignedHeaders=host",
            "X-Amz-Expires=900",
            "X-Amz-Credential=akid%2F20161107%2Fus-east-1%2Frds-db%2Faws4_request",
            "X-Amz-Signature=d1138cdbc0ca63eec012ec0fc6c2267e03642168f5884a7795320d4c18374c61",
        ];
        expected.sort_unstable();
        assert_eq!(pairs, expected);
    }

    #[test]
    fn the_token_carries_a_session_token_and_encodes_the_user() {
        let credentials = Credentials::new("AKID", "secret", Some("se/ss+ion=".into()), None, "t");
        let token = rds_auth_token(
            "db.example",
            5432,
            "app user",
            "eu-west-1",
            credentials,
            at(1_700_000_000),
        )
        .unwrap();
        assert!(
            token.starts_with("db.example:5432/?Action=connect&DBUser=app+user&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKID%2F20231114%2Feu-west-1%2Frds-db%2Faws4_request&X-Amz-Date=20231114T221320Z&X-Amz-Expires=900&"),
            "{token}"
        );
        assert!(
            token.contains("X-Amz-Security-Token=se%2Fss%2Bion%3D"),
            "{token}"
        );
        assert!(!token.contains("secret"));
        let signature = token
            .split('&')
            .find_map(|p| p.strip_prefix("X-Amz-Signature="))
            .unwrap();
        assert_eq!(signature.len(), 64);
        assert!(signature.chars().all(|c| c.is_ascii_hexdigit()));
    }

    fn pg(url: &str) -> tokio_postgres::Config {
        tokio_postgres::Config::from_str(url).unwrap()
    }

    #[test]
    fn sources_that_contradict_each_other_are_refused() {
        let file = Path::new("/run/secrets/db");
        let with_pw = pg("postgres://relay:pw@db:5432/app");
        let without = pg("postgres://relay@db:5432/app");
        let prefer = SslMode::Prefer;
        assert_eq!(
            choose(&with_pw, prefer, None, false),
            Ok(PasswordSource::Url)
        );
        assert_eq!(
            choose(&without, prefer, Some(file), false),
            Ok(PasswordSource::File(file.into()))
        );
        assert_eq!(
            choose(&without, prefer, None, true),
            Ok(PasswordSource::Iam)
        );
        for (pg, ssl, file, iam, needle) in [
            (
                &with_pw,
                prefer,
                Some(file),
                false,
                "remove the password from the URL",
            ),
            (
                &with_pw,
                prefer,
                None,
                true,
                "remove the password from --database-url",
            ),
            (&without, prefer, Some(file), true, "choose one"),
            (
                &without,
                SslMode::Disable,
                None,
                true,
                "not sslmode=disable",
            ),
            (
                &pg("postgres://relay@a,b/app"),
                prefer,
                None,
                true,
                "exactly one TCP host",
            ),
            (
                &pg("host=/run/pg user=relay"),
                prefer,
                None,
                true,
                "exactly one TCP host",
            ),
            (
                &pg("postgres://db/app"),
                prefer,
                None,
                true,
                "needs the database user",
            ),
        ] {
            let err = choose(pg, ssl, file, iam).unwrap_err();
            assert!(err.contains(needle), "{err}");
            assert!(!err.contains('\n'));
            assert!(!err.contains("pw@"), "{err}");
        }
        assert!(choose(&without, prefer, Some(Path::new("")), false).is_err());
    }

    #[test]
    fn a_password_file_loses_its_line_break_and_must_not_be_empty() {
        let dir = std::env::temp_dir().join(format!("dbauth-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("password");
        for (content, want) in [
            ("s3cret\n", "s3cret"),
            ("s3cret\r\n", "s3cret"),
            ("s3cret", "s3cret"),
            (" spaced \n", " spaced "),
        ] {
            std::fs::write(&path, content).unwrap();
            assert_eq!(read_password_file(&path).unwrap(), want);
        }
        std::fs::write(&path, "\n").unwrap();
        let err = read_password_file(&path).unwrap_err().to_string();
        assert!(
            err.contains("is empty") && err.contains(&*path.to_string_lossy()),
            "{err}"
        );
        std::fs::write(&path, "hunter2").unwrap();
        let missing = dir.join("missing");
        let err = read_password_file(&missing).unwrap_err().to_string();
        assert!(err.contains("no such file"), "{err}");
        assert!(err.contains(&*missing.to_string_lossy()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
