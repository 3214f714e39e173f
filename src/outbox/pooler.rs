//! `--pooler`: whether the relay's connections are its own, or server connections a pooler
//! (PgBouncer, RDS Proxy, Supavisor) hands to other clients between the relay's transactions.
//!
//! On its own connections the relay sets how it plans (`session::PLANS`) and
//! `synchronous_commit` for the session and prepares its statements once, by name. Through a pooler both would stay on a
//! server connection the application gets next: its commits would stop being durable, and a
//! named statement would collide with the next client's of the same name (PgBouncer before
//! 1.21 does not track them). So pooled connections set nothing for the session and keep no
//! statement: each statement is sent whole as the unnamed one (see `conn`), and the relay's
//! `synchronous_commit = off` is set per transaction (`SET LOCAL`).
//!
//! The default, `auto`, looks before it sets anything: PostgreSQL's BackendKeyData names the
//! backend's process, and a pooler (PgBouncer, RDS Proxy, Supavisor) sends a cancel key of its
//! own, because its client is bound to no one backend. So the relay's first connection is
//! direct when the process its cancel key names is `pg_backend_pid()`, pooled otherwise; a
//! pooled one is used as transaction pooling is (nothing on the session). tokio-postgres keeps
//! the key private, but writes it into any stream as a CancelRequest: [`cancel_key_pid`]
//! gives it one in memory, and nothing reaches the network.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::str::FromStr;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, TlsConnect, TlsStream};

use super::wakeup::Wakeup;

/// How the relay's connections reach PostgreSQL (`--pooler`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Pooler {
    /// Detected at the first connection (see the module's documentation): `None` on a direct
    /// one, `Transaction` behind a pooler.
    #[default]
    Auto,
    /// The relay's own connections: session settings and prepared statements.
    None,
    /// A pooler that lends a server connection for a client's whole session (PgBouncer
    /// `pool_mode = session`): LISTEN works, but what the session set stays for the next client.
    Session,
    /// A pooler that lends a server connection for one transaction (PgBouncer
    /// `pool_mode = transaction`, RDS Proxy, Supavisor's transaction mode).
    Transaction,
}

impl Pooler {
    pub fn as_str(self) -> &'static str {
        match self {
            Pooler::Auto => "auto",
            Pooler::None => "none",
            Pooler::Session => "session",
            Pooler::Transaction => "transaction",
        }
    }

    /// Whether a server connection may serve other clients after (or between) the relay's
    /// transactions, so that nothing may be left on it. `Auto` before detection counts as
    /// pooled: nothing is set until the relay knows.
    pub fn pooled(self) -> bool {
        self != Pooler::None
    }

    /// The mode the relay's connections use, from the configured one and what the first
    /// connection showed (`pooled`: its cancel key names another process than the server's).
    /// `Err` is one line saying what to fix: `--pooler none` behind a pooler would leave the
    /// relay's session settings (`synchronous_commit = off`) to the application's sessions.
    pub fn in_use(self, pooled: bool) -> Result<Pooler, String> {
        match (self, pooled) {
            (Pooler::Auto, false) => Ok(Pooler::None),
            (Pooler::Auto, true) => Ok(Pooler::Transaction),
            (Pooler::None, true) => Err(
                "--pooler none, but a connection pooler answers for PostgreSQL (the connection's cancel key names another process than pg_backend_pid()): session settings would stay on connections other clients get; drop --pooler none (auto detects the pooler) or set --pooler transaction (or session)"
                    .to_string(),
            ),
            (mode, _) => Ok(mode),
        }
    }

    /// Whether `wakeup` can work through the pooler `auto` detected; `Err` is one line saying
    /// what to do.
    pub fn detected_allows(wakeup: Wakeup) -> Result<(), String> {
        match wakeup {
            Wakeup::Poll => Ok(()),
            Wakeup::Notify => Err(
                "--wakeup notify cannot work through the connection pooler detected in front of PostgreSQL: LISTEN needs a session of its own; use --wakeup poll, or --pooler session if the pooler lends whole sessions"
                    .to_string(),
            ),
            Wakeup::Logical => Err(
                "--wakeup logical cannot work through the connection pooler detected in front of PostgreSQL: a replication connection must reach PostgreSQL directly; use --wakeup poll, or a --database-url without the pooler"
                    .to_string(),
            ),
        }
    }

    /// Whether `wakeup` can work through this pooler; `Err` is one line saying what to do.
    /// LISTEN belongs to a session, which a transaction pooler does not keep; a replication
    /// connection is a different protocol that PgBouncer (before 1.23, and never in
    /// transaction pooling) and RDS Proxy do not carry.
    pub fn allows(self, wakeup: Wakeup) -> Result<(), String> {
        match (self, wakeup) {
            (Pooler::Transaction, Wakeup::Notify) => Err(
                "--wakeup notify cannot work through a transaction pooler (--pooler transaction): LISTEN needs a session of its own; use --wakeup poll, or session pooling (--pooler session)"
                    .to_string(),
            ),
            (Pooler::Session | Pooler::Transaction, Wakeup::Logical) => Err(format!(
                "--wakeup logical cannot work through a connection pooler (--pooler {self}): a replication connection must reach PostgreSQL directly; use --wakeup poll"
            )),
            _ => Ok(()),
        }
    }

    /// What `check` says about the mode: what the relay does on its connections, and a hint
    /// when the server's own port (`inet_server_port()`, `None` over a Unix socket) differs
    /// from the URL's, which is what a pooler in between (or a port mapping) looks like.
    pub fn describe(self, url_port: u16, server_port: Option<i32>) -> String {
        let what = match self {
            Pooler::Auto => "not yet detected",
            Pooler::None => "direct connections: session settings and prepared statements",
            Pooler::Session => {
                "session pooling: per-transaction settings, unnamed statements, LISTEN allowed"
            }
            Pooler::Transaction => {
                "transaction pooling: per-transaction settings, unnamed statements, no LISTEN or replication"
            }
        };
        match server_port {
            Some(port) if port != i32::from(url_port) && self == Pooler::None => format!(
                "{what}; the server listens on port {port} and the URL names {url_port}: if a connection pooler is in between, set --pooler transaction (or session), or the relay's session settings stay on connections the application gets"
            ),
            _ => what.to_string(),
        }
    }
}

/// The process id in `client`'s cancel key (BackendKeyData), which tokio-postgres keeps to
/// itself: its CancelRequest is written into a stream in memory instead of a socket. An
/// SSLRequest first (any `sslmode` but `disable`) is answered `S`, and the "TLS" is this same
/// stream, so every mode gets as far as the request itself.
pub(super) async fn cancel_key_pid(client: &tokio_postgres::Client) -> io::Result<i32> {
    /// int32 length, int32 code, int32 process id, int32 secret key.
    const CANCEL_REQUEST: i32 = 80_877_102;
    let (near, mut far) = tokio::io::duplex(256);
    far.write_all(b"S").await?;
    client
        .cancel_token()
        .cancel_query_raw(near, InMemory)
        .await
        .map_err(io::Error::other)?;
    let mut written = Vec::new();
    far.read_to_end(&mut written).await?;
    let request = written
        .get(written.len().saturating_sub(16)..)
        .filter(|r| r.len() == 16)
        .ok_or_else(|| io::Error::other("no CancelRequest written"))?;
    let word = |i: usize| i32::from_be_bytes(request[i..i + 4].try_into().expect("4 bytes"));
    if word(0) != 16 || word(4) != CANCEL_REQUEST {
        return Err(io::Error::other("not a CancelRequest"));
    }
    Ok(word(8))
}

/// A "TLS" connector that hands back the stream it is given: [`cancel_key_pid`]'s.
struct InMemory;

/// [`InMemory`]'s stream.
struct Plain(DuplexStream);

impl TlsConnect<DuplexStream> for InMemory {
    type Stream = Plain;
    type Error = io::Error;
    type Future = std::future::Ready<io::Result<Plain>>;

    fn connect(self, stream: DuplexStream) -> Self::Future {
        std::future::ready(Ok(Plain(stream)))
    }
}

impl TlsStream for Plain {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl AsyncRead for Plain {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Plain {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl fmt::Display for Pooler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Pooler {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Pooler::Auto),
            "none" => Ok(Pooler::None),
            "session" => Ok(Pooler::Session),
            "transaction" => Ok(Pooler::Transaction),
            other => Err(format!("{other:?}: use auto, none, session or transaction")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print_alike() {
        for mode in [
            Pooler::Auto,
            Pooler::None,
            Pooler::Session,
            Pooler::Transaction,
        ] {
            assert_eq!(mode.as_str().parse::<Pooler>(), Ok(mode));
        }
        assert!("statement"
            .parse::<Pooler>()
            .unwrap_err()
            .contains("auto, none, session or transaction"));
        assert!(!Pooler::None.pooled());
        assert!(Pooler::Auto.pooled(), "nothing is set before detection");
        assert!(Pooler::Session.pooled() && Pooler::Transaction.pooled());
    }

    #[test]
    fn wakeups_that_need_a_session_or_replication_are_refused_where_the_pooler_has_none() {
        for wakeup in [Wakeup::Poll, Wakeup::Notify, Wakeup::Logical] {
            assert!(Pooler::None.allows(wakeup).is_ok(), "{wakeup}");
        }
        assert!(Pooler::Session.allows(Wakeup::Notify).is_ok());
        assert!(Pooler::Session.allows(Wakeup::Poll).is_ok());
        assert!(Pooler::Transaction.allows(Wakeup::Poll).is_ok());
        let err = Pooler::Transaction.allows(Wakeup::Notify).unwrap_err();
        assert!(
            err.contains("LISTEN") && err.contains("--wakeup poll"),
            "{err}"
        );
        for pooler in [Pooler::Session, Pooler::Transaction] {
            let err = pooler.allows(Wakeup::Logical).unwrap_err();
            assert!(err.contains("replication connection"), "{err}");
            assert!(!err.contains('\n'));
        }
    }

    #[test]
    fn auto_follows_what_the_first_connection_shows_and_none_behind_a_pooler_is_refused() {
        assert_eq!(Pooler::Auto.in_use(false), Ok(Pooler::None));
        assert_eq!(Pooler::Auto.in_use(true), Ok(Pooler::Transaction));
        assert_eq!(Pooler::None.in_use(false), Ok(Pooler::None));
        let refused = Pooler::None.in_use(true).unwrap_err();
        assert!(refused.contains("--pooler"), "{refused}");
        assert!(!refused.contains('\n'));
        for explicit in [Pooler::Session, Pooler::Transaction] {
            assert_eq!(explicit.in_use(true), Ok(explicit));
            assert_eq!(explicit.in_use(false), Ok(explicit));
        }
        assert!(Pooler::detected_allows(Wakeup::Poll).is_ok());
        let notify = Pooler::detected_allows(Wakeup::Notify).unwrap_err();
        assert!(notify.contains("--pooler session") && notify.contains("--wakeup poll"));
        let logical = Pooler::detected_allows(Wakeup::Logical).unwrap_err();
        assert!(logical.contains("--wakeup poll"), "{logical}");
    }

    #[test]
    fn check_hints_at_a_pooler_only_when_the_ports_differ_on_direct_connections() {
        let direct = Pooler::None.describe(5432, Some(5432));
        assert!(!direct.contains("--pooler"), "{direct}");
        let hint = Pooler::None.describe(6432, Some(5432));
        assert!(
            hint.contains("port 5432") && hint.contains("--pooler transaction"),
            "{hint}"
        );
        assert!(!Pooler::None.describe(6432, None).contains("--pooler"));
        let pooled = Pooler::Transaction.describe(6432, Some(5432));
        assert!(pooled.starts_with("transaction pooling"), "{pooled}");
        assert!(!pooled.contains("--pooler"), "{pooled}");
    }
}
