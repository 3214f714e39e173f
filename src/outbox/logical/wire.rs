//! A minimal PostgreSQL client for the replication sub-protocol, which tokio-postgres 0.7
//! cannot speak (it has no CopyBoth): connect with the relay's own settings, TLS through
//! [`PgTls`], authenticate (cleartext, md5, SCRAM-SHA-256), run replication commands, and
//! read and write the CopyData stream. Message encoding and parsing, and the SCRAM and md5
//! arithmetic, are `postgres-protocol`'s, the crate tokio-postgres is built on; only the
//! order of the conversation is written here.

use std::fmt;
use std::io;

use bytes::{Bytes, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::{self, sasl};
use postgres_protocol::message::backend::{ErrorFields, Message};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio_postgres::config::{Host, LoadBalanceHosts, SslMode, SslNegotiation, TargetSessionAttrs};
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};

use crate::tls::PgTls;

/// Anything the connection can run over: TCP, a Unix socket, or TLS on TCP.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// What went wrong on the replication connection.
#[derive(Debug)]
pub enum WireError {
    /// The server said no: its SQLSTATE and message.
    Server(ServerError),
    /// The socket, TLS, or a message we could not make sense of; nothing the server said.
    Io(String),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Server(e) => e.fmt(f),
            WireError::Io(text) => f.write_str(text),
        }
    }
}

impl From<io::Error> for WireError {
    fn from(e: io::Error) -> Self {
        WireError::Io(e.to_string())
    }
}

/// An ErrorResponse, reduced to what an operator needs.
#[derive(Debug, Clone)]
pub struct ServerError {
    /// What went wrong, for the caller to classify (transient or not, a known prerequisite).
    pub code: SqlState,
    /// The server's own words, for the operator.
    pub message: String,
}

impl fmt::Display for ServerError {
    /// The same shape as `outbox::describe` gives tokio-postgres's server errors.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (SQLSTATE {})", self.message, self.code.code())
    }
}

impl ServerError {
    fn from_fields(mut fields: ErrorFields<'_>) -> ServerError {
        let mut code = String::new();
        let mut message = String::new();
        while let Ok(Some(field)) = fields.next() {
            let value = String::from_utf8_lossy(field.value_bytes()).into_owned();
            match field.type_() {
                b'C' => code = value,
                b'M' => message = value,
                _ => {}
            }
        }
        ServerError {
            code: SqlState::from_code(&code),
            message,
        }
    }
}

/// A backend message, or the CopyBothResponse that postgres-protocol does not parse.
enum Frame {
    Message(Message),
    CopyBoth,
}

/// One replication connection (`replication=database`).
pub struct Wire {
    io: Box<dyn Io>,
    /// Bytes read but not yet parsed into a whole message.
    read: BytesMut,
    /// `server_version` as the server reported it at start-up.
    server_version: String,
    /// Where we connected, and the key the server gave us to cancel what it is doing.
    cancel: Option<CancelToken>,
}

/// What it takes to interrupt the server's work on this connection from outside it.
#[derive(Debug, Clone)]
pub struct CancelToken {
    target: Host,
    port: u16,
    process_id: i32,
    secret_key: i32,
}

impl CancelToken {
    /// Sends a CancelRequest on a connection of its own, as libpq's PQcancel does: without
    /// TLS and without authentication (the key is the credential; pg_hba.conf is not asked).
    pub async fn send(&self) -> Result<(), WireError> {
        let mut buf = BytesMut::new();
        frontend::cancel_request(self.process_id, self.secret_key, &mut buf);
        let mut io: Box<dyn Io> = match &self.target {
            Host::Tcp(host) => Box::new(TcpStream::connect((host.as_str(), self.port)).await?),
            Host::Unix(dir) => {
                Box::new(UnixStream::connect(dir.join(format!(".s.PGSQL.{}", self.port))).await?)
            }
        };
        io.write_all(&buf).await?;
        io.flush().await?;
        // The server closes the connection once it has acted on the request.
        let mut rest = Vec::new();
        let _ = io.read_to_end(&mut rest).await;
        Ok(())
    }
}

/// CopyBothResponse's tag; absent from postgres-protocol's parser.
const COPY_BOTH_RESPONSE_TAG: u8 = b'W';

impl Wire {
    /// Connects as tokio-postgres would with `pg` (hosts in order or shuffled, hostaddr, port,
    /// TLS per `sslmode`, `target_session_attrs`), adding `replication=database`. Returns the
    /// last host's failure when none works. Not bounded in time: the caller bounds the whole
    /// handshake.
    pub async fn connect(pg: &tokio_postgres::Config, tls: &PgTls) -> Result<Wire, WireError> {
        let hosts = pg.get_hosts();
        let addrs = pg.get_hostaddrs();
        let count = hosts.len().max(addrs.len());
        if count == 0 {
            return Err(WireError::Io("the connection string names no host".into()));
        }
        let mut order: Vec<usize> = (0..count).collect();
        if pg.get_load_balance_hosts() == LoadBalanceHosts::Random {
            fastrand::shuffle(&mut order);
        }
        let mut last = None;
        for i in order {
            let port = pg
                .get_ports()
                .get(i)
                .or_else(|| pg.get_ports().first())
                .copied()
                .unwrap_or(5432);
            // The host name is what TLS checks the certificate against; hostaddr, when given,
            // is where we actually connect.
            let name = match hosts.get(i) {
                Some(Host::Tcp(h)) => Some(h.clone()),
                _ => None,
            };
            let target = match (addrs.get(i), hosts.get(i)) {
                (Some(ip), _) => Host::Tcp(ip.to_string()),
                (None, Some(host)) => host.clone(),
                (None, None) => unreachable!("count is the longer of the two lists"),
            };
            match Self::connect_one(pg, tls, &target, name, port).await {
                Ok(wire) => return Ok(wire),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("at least one host was tried"))
    }

    async fn connect_one(
        pg: &tokio_postgres::Config,
        tls: &PgTls,
        target: &Host,
        name: Option<String>,
        port: u16,
    ) -> Result<Wire, WireError> {
        let io: Box<dyn Io> = match target {
            Host::Tcp(host) => {
                let tcp = TcpStream::connect((host.as_str(), port)).await?;
                tcp.set_nodelay(true)?;
                // This connection idles between status updates; the kernel watches it too.
                crate::outbox::liveness::set_socket_keepalives(&tcp, pg)?;
                negotiate_tls(tcp, pg, tls, name).await?
            }
            Host::Unix(dir) => {
                let unix = UnixStream::connect(dir.join(format!(".s.PGSQL.{port}"))).await?;
                negotiate_tls(unix, pg, tls, None).await?
            }
        };
        let mut wire = Wire {
            io,
            read: BytesMut::with_capacity(8192),
            server_version: String::new(),
            cancel: None,
        };
        let user = match pg.get_user() {
            Some(user) => user.to_string(),
            None => whoami::username().map_err(|e| WireError::Io(e.to_string()))?,
        };
        wire.startup(pg, &user).await?;
        wire.authenticate(pg, &user).await?;
        wire.until_ready(target, port).await?;
        if pg.get_target_session_attrs() != TargetSessionAttrs::Any {
            let rows = wire.simple_query("SHOW transaction_read_only").await?;
            let read_only = rows.first().and_then(|r| r.first()).cloned().flatten();
            let wanted = match pg.get_target_session_attrs() {
                TargetSessionAttrs::ReadWrite => "off",
                _ => "on",
            };
            if read_only.as_deref() != Some(wanted) {
                return Err(WireError::Io(
                    "the server's transaction_read_only does not match target_session_attrs".into(),
                ));
            }
        }
        Ok(wire)
    }

    /// The means to interrupt a command this connection is running (the server sent none
    /// only if it is very unusual).
    pub fn cancel_token(&self) -> Option<CancelToken> {
        self.cancel.clone()
    }

    /// The major version, e.g. 15; 0 when the server did not say.
    pub fn server_major(&self) -> u32 {
        self.server_version
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    async fn startup(&mut self, pg: &tokio_postgres::Config, user: &str) -> Result<(), WireError> {
        let mut params = vec![
            ("client_encoding", "UTF8"),
            ("user", user),
            // A walsender that also accepts SQL and logical replication commands.
            ("replication", "database"),
        ];
        if let Some(db) = pg.get_dbname() {
            params.push(("database", db));
        }
        if let Some(options) = pg.get_options() {
            params.push(("options", options));
        }
        if let Some(name) = pg.get_application_name() {
            params.push(("application_name", name));
        }
        let mut buf = BytesMut::new();
        frontend::startup_message(params, &mut buf)?;
        self.send(&buf).await
    }

    async fn authenticate(
        &mut self,
        pg: &tokio_postgres::Config,
        user: &str,
    ) -> Result<(), WireError> {
        // The password is only ever written to the socket; no error below quotes it.
        let password = || {
            pg.get_password().ok_or_else(|| {
                WireError::Io(
                    "the server asks for a password and the connection string has none".into(),
                )
            })
        };
        let mut buf = BytesMut::new();
        match self.message().await? {
            Message::AuthenticationOk => return Ok(()),
            Message::AuthenticationCleartextPassword => {
                frontend::password_message(password()?, &mut buf)?;
                self.send(&buf).await?;
            }
            Message::AuthenticationMd5Password(body) => {
                let hash = authentication::md5_hash(user.as_bytes(), password()?, body.salt());
                frontend::password_message(hash.as_bytes(), &mut buf)?;
                self.send(&buf).await?;
            }
            Message::AuthenticationSasl(body) => {
                let mut mechanisms = body.mechanisms();
                let mut scram = false;
                while let Some(m) = mechanisms.next()? {
                    scram |= m == sasl::SCRAM_SHA_256;
                }
                if !scram {
                    return Err(WireError::Io(
                        "the server offers no SASL mechanism this client knows (SCRAM-SHA-256)"
                            .into(),
                    ));
                }
                // No channel binding, as on the relay's other connections (see
                // PgTlsStream::channel_binding): plain SCRAM-SHA-256.
                let mut scram =
                    sasl::ScramSha256::new(password()?, sasl::ChannelBinding::unsupported());
                frontend::sasl_initial_response(sasl::SCRAM_SHA_256, scram.message(), &mut buf)?;
                self.send(&buf).await?;
                let body = match self.message().await? {
                    Message::AuthenticationSaslContinue(body) => body,
                    other => return Err(unexpected(&other, "SCRAM")),
                };
                scram.update(body.data())?;
                buf.clear();
                frontend::sasl_response(scram.message(), &mut buf)?;
                self.send(&buf).await?;
                let body = match self.message().await? {
                    Message::AuthenticationSaslFinal(body) => body,
                    other => return Err(unexpected(&other, "SCRAM")),
                };
                // Proves the server knew the password too.
                scram.finish(body.data())?;
            }
            other => return Err(unexpected(&other, "authentication")),
        }
        match self.message().await? {
            Message::AuthenticationOk => Ok(()),
            other => Err(unexpected(&other, "authentication")),
        }
    }

    /// Reads the start-up's parameter reports up to ReadyForQuery.
    async fn until_ready(&mut self, target: &Host, port: u16) -> Result<(), WireError> {
        loop {
            match self.message().await? {
                Message::BackendKeyData(key) => {
                    self.cancel = Some(CancelToken {
                        target: target.clone(),
                        port,
                        process_id: key.process_id(),
                        secret_key: key.secret_key(),
                    });
                }
                Message::ReadyForQuery(_) => return Ok(()),
                Message::ParameterStatus(p) => {
                    if p.name()? == "server_version" {
                        self.server_version = p.value()?.to_string();
                    }
                }
                Message::NoticeResponse(_) => {}
                other => return Err(unexpected(&other, "start-up")),
            }
        }
    }
}

/// A connection that is ready: replication commands, the CopyBoth stream, and the framing
/// beneath both.
impl Wire {
    /// Runs one command with the simple query protocol (replication commands take no other)
    /// and returns its rows as text.
    pub async fn simple_query(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, WireError> {
        let mut buf = BytesMut::new();
        frontend::query(sql, &mut buf)?;
        self.send(&buf).await?;
        let mut rows = Vec::new();
        let mut failed = None;
        loop {
            match self.frame().await? {
                Frame::Message(Message::ReadyForQuery(_)) => break,
                Frame::Message(Message::DataRow(row)) => {
                    let buffer = row.buffer();
                    let mut values = Vec::new();
                    let mut ranges = row.ranges();
                    while let Some(range) = ranges.next()? {
                        values
                            .push(range.map(|r| String::from_utf8_lossy(&buffer[r]).into_owned()));
                    }
                    rows.push(values);
                }
                Frame::Message(Message::ErrorResponse(body)) => {
                    failed = Some(ServerError::from_fields(body.fields()));
                }
                Frame::Message(
                    Message::RowDescription(_)
                    | Message::CommandComplete(_)
                    | Message::EmptyQueryResponse
                    | Message::NoticeResponse(_)
                    | Message::ParameterStatus(_),
                ) => {}
                Frame::Message(other) => return Err(unexpected(&other, "a command")),
                Frame::CopyBoth => {
                    return Err(WireError::Io(
                        "the server started streaming in answer to a plain command".into(),
                    ))
                }
            }
        }
        match failed {
            Some(e) => Err(WireError::Server(e)),
            None => Ok(rows),
        }
    }

    /// Sends START_REPLICATION (or any command that answers with CopyBothResponse) and
    /// returns once the server has switched to streaming.
    pub async fn start_streaming(&mut self, command: &str) -> Result<(), WireError> {
        let mut buf = BytesMut::new();
        frontend::query(command, &mut buf)?;
        self.send(&buf).await?;
        loop {
            match self.frame().await? {
                Frame::CopyBoth => return Ok(()),
                Frame::Message(Message::ErrorResponse(body)) => {
                    return Err(WireError::Server(ServerError::from_fields(body.fields())))
                }
                Frame::Message(Message::NoticeResponse(_) | Message::ParameterStatus(_)) => {}
                Frame::Message(other) => return Err(unexpected(&other, "START_REPLICATION")),
            }
        }
    }

    /// The next CopyData payload of the replication stream. Cancel-safe (see [`Wire::frame`]).
    pub async fn receive(&mut self) -> Result<Bytes, WireError> {
        loop {
            match self.message().await? {
                Message::CopyData(body) => return Ok(body.into_bytes()),
                Message::CopyDone => {
                    return Err(WireError::Io(
                        "the server ended the replication stream".into(),
                    ))
                }
                // Notices and parameter reports: nothing to act on.
                Message::NoticeResponse(_) | Message::ParameterStatus(_) => {}
                other => return Err(unexpected(&other, "replication")),
            }
        }
    }

    /// Sends one CopyData message with `payload`.
    pub async fn copy_data(&mut self, payload: &[u8]) -> Result<(), WireError> {
        let mut buf = BytesMut::with_capacity(payload.len() + 5);
        frontend::CopyData::new(payload)?.write(&mut buf);
        self.send(&buf).await
    }

    /// Says goodbye, so the server ends the session (and drops its temporary slot) at once
    /// rather than when it notices the socket closed.
    pub async fn terminate(mut self) {
        let mut buf = BytesMut::new();
        frontend::terminate(&mut buf);
        let _ = self.send(&buf).await;
        let _ = self.io.shutdown().await;
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        self.io.write_all(bytes).await?;
        self.io.flush().await?;
        Ok(())
    }

    /// The next message, with an ErrorResponse turned into the error.
    async fn message(&mut self) -> Result<Message, WireError> {
        match self.frame().await? {
            Frame::Message(Message::ErrorResponse(body)) => {
                Err(WireError::Server(ServerError::from_fields(body.fields())))
            }
            Frame::Message(m) => Ok(m),
            Frame::CopyBoth => Err(WireError::Io("the server started streaming unasked".into())),
        }
    }

    /// The next whole backend message. Cancel-safe: bytes read before a cancellation stay in
    /// the buffer, so the streaming loop can race it against its timer.
    async fn frame(&mut self) -> Result<Frame, WireError> {
        loop {
            if self.read.len() >= 5 && self.read[0] == COPY_BOTH_RESPONSE_TAG {
                let len =
                    u32::from_be_bytes([self.read[1], self.read[2], self.read[3], self.read[4]]);
                let total = len as usize + 1;
                if self.read.len() >= total {
                    let _: Bytes = self.read.split_to(total).freeze();
                    return Ok(Frame::CopyBoth);
                }
            } else if let Some(message) = Message::parse(&mut self.read)? {
                return Ok(Frame::Message(message));
            }
            if self.io.read_buf(&mut self.read).await? == 0 {
                return Err(WireError::Io("the server closed the connection".into()));
            }
        }
    }
}

fn unexpected(message: &Message, during: &str) -> WireError {
    let kind = match message {
        Message::AuthenticationKerberosV5
        | Message::AuthenticationGss
        | Message::AuthenticationSspi
        | Message::AuthenticationScmCredential => {
            return WireError::Io(
                "the server asks for an authentication method this client does not support (use scram-sha-256, md5 or password in pg_hba.conf)"
                    .into(),
            )
        }
        Message::CopyData(_) => "CopyData",
        Message::CopyDone => "CopyDone",
        Message::ReadyForQuery(_) => "ReadyForQuery",
        Message::CommandComplete(_) => "CommandComplete",
        Message::DataRow(_) => "DataRow",
        Message::RowDescription(_) => "RowDescription",
        _ => "another message",
    };
    WireError::Io(format!("unexpected {kind} from the server during {during}"))
}

/// SSLRequest and the TLS handshake as tokio-postgres does them for `sslmode`
/// (disable/prefer/require on the wire; [`PgTls`] adds libpq's certificate checks).
async fn negotiate_tls<S>(
    mut stream: S,
    pg: &tokio_postgres::Config,
    tls: &PgTls,
    host_name: Option<String>,
) -> Result<Box<dyn Io>, WireError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mode = pg.get_ssl_mode();
    if mode == SslMode::Disable {
        return Ok(Box::new(stream));
    }
    if pg.get_ssl_negotiation() == SslNegotiation::Postgres {
        let mut buf = BytesMut::new();
        frontend::ssl_request(&mut buf);
        stream.write_all(&buf).await?;
        stream.flush().await?;
        let mut answer = [0u8; 1];
        stream.read_exact(&mut answer).await?;
        if answer[0] != b'S' {
            if mode == SslMode::Require {
                return Err(WireError::Io("the server does not support TLS".into()));
            }
            return Ok(Box::new(stream));
        }
    } else if mode == SslMode::Prefer {
        return Err(WireError::Io(
            "sslnegotiation=direct needs sslmode=require or stronger".into(),
        ));
    }
    let Some(name) = host_name else {
        return Err(WireError::Io(
            "no host name to check the server's certificate against".into(),
        ));
    };
    let connector = MakeTlsConnect::<S>::make_tls_connect(&mut tls.clone(), &name)?;
    let stream = TlsConnect::connect(connector, stream).await?;
    Ok(Box::new(stream))
}
