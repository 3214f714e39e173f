//! A PostgreSQL front that checks RDS IAM auth tokens the way RDS does, in front of the test
//! cluster.
//!
//! It speaks the start-up protocol to the client (SSLRequest and GSSENCRequest are answered
//! `N`, so the client goes on in plain text, which `sslmode=prefer` allows), asks for a
//! cleartext password, and accepts only a token for its own address, for the start-up message's
//! user, no older than its `max_age` nor its own `X-Amz-Expires`, whose signature is right for
//! the test AWS credentials the relay processes are given. Then it logs in to the real cluster
//! (SCRAM, with the cluster's password), tells the client AuthenticationOk and pipes bytes both
//! ways. CancelRequests are passed on as they are.
//!
//! Why a proxy and not "set the role's password to the token": the token is minted by the
//! relay at each connection, at a moment the harness cannot know, and PostgreSQL could only
//! compare it as a string. The proxy checks what RDS checks: host, port, user, age, signature.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use bytes::{BufMut, BytesMut};
use postgres_protocol::authentication::{self, sasl};
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY};

/// The region the relay processes sign for (`AWS_REGION` in `RelayProcess`).
const REGION: &str = "us-east-1";

const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;
const PROTOCOL_3: u32 = 196_608;

pub struct IamProxy {
    port: u16,
    shared: Arc<Shared>,
    /// Its own runtime, so it serves while a test blocks its threads; dropping it closes all.
    runtime: Option<tokio::runtime::Runtime>,
}

struct Shared {
    /// The real cluster's port on 127.0.0.1.
    upstream_port: u16,
    /// The password the proxy logs in to the real cluster with, as the client's user.
    upstream_password: String,
    /// Tokens older than this (by their X-Amz-Date) are refused: RDS's 15 minutes, made short.
    max_age: Mutex<Duration>,
    /// Every token accepted, in order.
    accepted: Mutex<Vec<String>>,
    /// Why each refused token was refused.
    rejected: Mutex<Vec<String>>,
}

impl IamProxy {
    /// Starts a proxy in front of the cluster on 127.0.0.1:`upstream_port`, whose roles log in
    /// with `upstream_password`.
    pub fn start(upstream_port: u16, upstream_password: &str) -> IamProxy {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("iam-proxy")
            .enable_all()
            .build()
            .expect("iam proxy runtime");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind iam proxy");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            upstream_port,
            upstream_password: upstream_password.to_string(),
            max_age: Mutex::new(Duration::from_secs(900)),
            accepted: Mutex::new(Vec::new()),
            rejected: Mutex::new(Vec::new()),
        });
        let accept_shared = shared.clone();
        runtime.spawn(async move {
            let listener = TcpListener::from_std(listener).expect("register listener");
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let shared = accept_shared.clone();
                tokio::spawn(async move {
                    let _ = serve(client, shared, port).await;
                });
            }
        });
        IamProxy {
            port,
            shared,
            runtime: Some(runtime),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL for `db` as `user` through this proxy, without a password.
    pub fn url(&self, db: &str, user: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{db}", self.port)
    }

    /// From now on, tokens older than `age` are refused.
    pub fn set_max_age(&self, age: Duration) {
        *self.shared.max_age.lock().unwrap() = age;
    }

    pub fn accepted(&self) -> Vec<String> {
        self.shared.accepted.lock().unwrap().clone()
    }

    pub fn rejected(&self) -> Vec<String> {
        self.shared.rejected.lock().unwrap().clone()
    }
}

impl Drop for IamProxy {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn serve(mut client: TcpStream, shared: Arc<Shared>, port: u16) -> std::io::Result<()> {
    let params = loop {
        let len = client.read_u32().await? as usize;
        let mut body = vec![0u8; len.saturating_sub(4)];
        client.read_exact(&mut body).await?;
        let code = u32::from_be_bytes(body[..4].try_into().unwrap());
        match code {
            SSL_REQUEST | GSSENC_REQUEST => client.write_all(b"N").await?,
            CANCEL_REQUEST => {
                let mut upstream = TcpStream::connect(("127.0.0.1", shared.upstream_port)).await?;
                upstream.write_all(&(len as u32).to_be_bytes()).await?;
                upstream.write_all(&body).await?;
                let mut rest = Vec::new();
                let _ = upstream.read_to_end(&mut rest).await;
                return Ok(());
            }
            PROTOCOL_3 => break startup_params(&body[4..]),
            _ => return Ok(()),
        }
    };
    let user = params
        .iter()
        .find(|(k, _)| k == "user")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    // AuthenticationCleartextPassword, as RDS asks for the token.
    client.write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 3]).await?;
    let tag = client.read_u8().await?;
    let len = client.read_u32().await? as usize;
    let mut body = vec![0u8; len.saturating_sub(4)];
    client.read_exact(&mut body).await?;
    if tag != b'p' {
        return Ok(());
    }
    let token = String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(&body)).into_owned();
    let max_age = *shared.max_age.lock().unwrap();
    if let Err(reason) = verify(&token, port, &user, max_age, SystemTime::now()) {
        shared.rejected.lock().unwrap().push(reason);
        let message = format!("PAM authentication failed for user \"{user}\"");
        client.write_all(&error_response("28P01", &message)).await?;
        return Ok(());
    }
    shared.accepted.lock().unwrap().push(token);

    let mut upstream = TcpStream::connect(("127.0.0.1", shared.upstream_port)).await?;
    upstream.set_nodelay(true)?;
    let mut buf = BytesMut::new();
    frontend::startup_message(
        params.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        &mut buf,
    )?;
    upstream.write_all(&buf).await?;
    let mut read = BytesMut::new();
    if let Err(message) = log_in_upstream(&mut upstream, &mut read, &user, &shared).await {
        client.write_all(&error_response("08006", &message)).await?;
        return Ok(());
    }
    // AuthenticationOk, then whatever the server sent after its own (parameters, key, ready).
    client.write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 0]).await?;
    client.write_all(&read).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// Logs in to the real cluster as `user`; leaves in `read` what came after AuthenticationOk.
async fn log_in_upstream(
    upstream: &mut TcpStream,
    read: &mut BytesMut,
    user: &str,
    shared: &Shared,
) -> Result<(), String> {
    let password = shared.upstream_password.as_bytes();
    let mut scram = None;
    loop {
        let message = next_message(upstream, read).await?;
        let mut buf = BytesMut::new();
        match message {
            Message::AuthenticationOk => return Ok(()),
            Message::AuthenticationCleartextPassword => {
                frontend::password_message(password, &mut buf).map_err(|e| e.to_string())?;
            }
            Message::AuthenticationMd5Password(body) => {
                let hash = authentication::md5_hash(user.as_bytes(), password, body.salt());
                frontend::password_message(hash.as_bytes(), &mut buf).map_err(|e| e.to_string())?;
            }
            Message::AuthenticationSasl(_) => {
                let s = sasl::ScramSha256::new(password, sasl::ChannelBinding::unsupported());
                frontend::sasl_initial_response(sasl::SCRAM_SHA_256, s.message(), &mut buf)
                    .map_err(|e| e.to_string())?;
                scram = Some(s);
            }
            Message::AuthenticationSaslContinue(body) => {
                let s = scram.as_mut().ok_or("SASL continue before start")?;
                s.update(body.data()).map_err(|e| e.to_string())?;
                frontend::sasl_response(s.message(), &mut buf).map_err(|e| e.to_string())?;
            }
            Message::AuthenticationSaslFinal(body) => {
                let mut s = scram.take().ok_or("SASL final before start")?;
                s.finish(body.data()).map_err(|e| e.to_string())?;
                continue;
            }
            Message::ErrorResponse(_) => return Err("the upstream server refused the proxy".into()),
            _ => return Err("unexpected message from the upstream server".into()),
        }
        upstream.write_all(&buf).await.map_err(|e| e.to_string())?;
    }
}

async fn next_message(upstream: &mut TcpStream, read: &mut BytesMut) -> Result<Message, String> {
    loop {
        if let Some(message) = Message::parse(read).map_err(|e| e.to_string())? {
            return Ok(message);
        }
        if upstream.read_buf(read).await.map_err(|e| e.to_string())? == 0 {
            return Err("the upstream server closed the connection".into());
        }
    }
}

/// Checks `token` as RDS would for a login as `user` on 127.0.0.1:`port` at `now`; the reason
/// when it is refused.
pub fn verify(
    token: &str,
    port: u16,
    user: &str,
    max_age: Duration,
    now: SystemTime,
) -> Result<(), String> {
    let (authority, query) = token.split_once("/?").ok_or("not a token")?;
    let expected_authority = format!("127.0.0.1:{port}");
    if authority != expected_authority {
        return Err(format!(
            "the token is for {authority}, not {expected_authority}"
        ));
    }
    let params: HashMap<String, String> = form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let param = |name: &str| params.get(name).map(String::as_str).unwrap_or("");
    if param("Action") != "connect" {
        return Err("the token is not for Action=connect".into());
    }
    if param("DBUser") != user {
        return Err(format!(
            "the token is for user {:?}, the login for {user:?}",
            param("DBUser")
        ));
    }
    let expires = param("X-Amz-Expires")
        .parse::<u64>()
        .map_err(|_| "no X-Amz-Expires")?;
    let signed_at = parse_amz_date(param("X-Amz-Date")).ok_or("no X-Amz-Date")?;
    let age = now.duration_since(signed_at).unwrap_or_default();
    if age > Duration::from_secs(expires) {
        return Err(format!("the token expired {age:?} after signing"));
    }
    if age > max_age {
        return Err(format!(
            "the token is {age:?} old; accepted for {max_age:?}"
        ));
    }
    // The signature: the token the test credentials make for the same claims must be this one.
    let credentials = Credentials::new(
        TEST_ACCESS_KEY_ID,
        TEST_SECRET_ACCESS_KEY,
        None,
        None,
        "iam-proxy",
    );
    let expected = outbox_relay::dbauth::rds_auth_token(
        "127.0.0.1",
        port,
        user,
        REGION,
        credentials,
        signed_at,
    )
    .map_err(|e| e.to_string())?;
    if expected != token {
        return Err("the signature does not verify with the test credentials".into());
    }
    Ok(())
}

/// `20240826T220000Z` as a time.
fn parse_amz_date(text: &str) -> Option<SystemTime> {
    let digits = |range: std::ops::Range<usize>| text.get(range)?.parse::<i64>().ok();
    if text.len() != 16 || &text[8..9] != "T" || !text.ends_with('Z') {
        return None;
    }
    let (y, m, d) = (digits(0..4)?, digits(4..6)?, digits(6..8)?);
    let (hh, mm, ss) = (digits(9..11)?, digits(11..13)?, digits(13..15)?);
    // Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hh * 3600 + mm * 60 + ss;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).ok()?))
}

fn startup_params(mut body: &[u8]) -> Vec<(String, String)> {
    let mut params = Vec::new();
    let mut next = || {
        let end = body.iter().position(|&b| b == 0)?;
        let s = String::from_utf8_lossy(&body[..end]).into_owned();
        body = &body[end + 1..];
        (!s.is_empty()).then_some(s)
    };
    while let (Some(k), Some(v)) = (next(), next()) {
        params.push((k, v));
    }
    params
}

fn error_response(code: &str, message: &str) -> BytesMut {
    let mut fields = BytesMut::new();
    for (kind, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', code),
        (b'M', message),
    ] {
        fields.put_u8(kind);
        fields.put_slice(value.as_bytes());
        fields.put_u8(0);
    }
    fields.put_u8(0);
    let mut out = BytesMut::new();
    out.put_u8(b'E');
    out.put_u32(fields.len() as u32 + 4);
    out.put_slice(&fields);
    out
}

#[test]
fn amz_dates_are_read_as_utc() {
    assert_eq!(
        parse_amz_date("20240826T220000Z"),
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_724_709_600))
    );
    assert_eq!(
        parse_amz_date("20161107T173933Z"),
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_478_540_373))
    );
    assert_eq!(parse_amz_date("2016-11-07"), None);
}

#[test]
fn the_proxy_refuses_what_rds_would_refuse() {
    let signed_at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let sign = |host: &str, port: u16, user: &str, secret: &str| {
        let credentials = Credentials::new(TEST_ACCESS_KEY_ID, secret, None, None, "t");
        outbox_relay::dbauth::rds_auth_token(host, port, user, REGION, credentials, signed_at)
            .unwrap()
    };
    let good = sign("127.0.0.1", 7000, "relay", TEST_SECRET_ACCESS_KEY);
    let later = signed_at + Duration::from_secs(5);
    let minute = Duration::from_secs(60);
    assert_eq!(verify(&good, 7000, "relay", minute, later), Ok(()));
    for (token, port, user, max_age, now, why) in [
        (
            good.clone(),
            7001,
            "relay",
            minute,
            later,
            "not 127.0.0.1:7001",
        ),
        (good.clone(), 7000, "other", minute, later, "the login for"),
        (
            good.clone(),
            7000,
            "relay",
            Duration::from_secs(2),
            later,
            "old; accepted for",
        ),
        (
            good.clone(),
            7000,
            "relay",
            minute * 60,
            signed_at + minute * 16,
            "expired",
        ),
        (
            sign("127.0.0.1", 7000, "relay", "not-the-secret"),
            7000,
            "relay",
            minute,
            later,
            "signature",
        ),
        (
            good.replace("DBUser=relay", "DBUser=relay&x=1"),
            7000,
            "relay",
            minute,
            later,
            "signature",
        ),
    ] {
        let err = verify(&token, port, user, max_age, now).unwrap_err();
        assert!(err.contains(why), "{why}: {err}");
    }
}
