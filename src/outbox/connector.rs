//! One connector: where and how every connection of the relay is opened. The URL's settings,
//! where the password comes from, the TLS handshake, the hosts it has learnt to skip, the
//! pooler mode in use and `run`'s round-trip deadline, and nothing of any table: the tables'
//! [`Outbox`](super::store::Outbox)es of one database share one.

use std::borrow::Cow;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::dbauth::{PasswordSource, Passwords};
use crate::tls::{PgTls, PgTlsStream};

use super::conn::{self, Conn};
use super::error::{self, describe, query_err, OutboxError};
use super::liveness;
use super::pooler::{cancel_key_pid, Pooler};
use super::wakeup::Wakeup;

/// Where and how to connect.
#[derive(Debug)]
pub struct Connector {
    pg: tokio_postgres::Config,
    /// Where each new connection's password comes from (the URL, a file, an IAM token).
    passwords: Passwords,
    /// The handshake `sslmode` asks for; tokio-postgres alone cannot verify certificates.
    tls: PgTls,
    /// `run`'s deadline for one round trip (`--db-timeout`); `None` for the one-shot commands.
    round_trip: Option<Duration>,
    /// Set once a server refused a write as read-only (SQLSTATE 25006): from then on new
    /// connections skip read-only hosts, as `target_session_attrs=read-write` would.
    /// Shared by the tables of a relay serving several ([`Connector::sharing_hosts_with`]):
    /// they share connections, so what one learnt of a host holds for all.
    writable_only: Arc<AtomicBool>,
    /// Whether server connections are shared with other clients (a pooler in between), as
    /// configured (`--pooler`).
    pooler: Pooler,
    /// The mode in use, once the first connection decided it (see `pooler`).
    pooler_detected: OnceLock<Pooler>,
}

impl Connector {
    /// Parses the URL (no I/O). `connect_timeout` bounds each connection attempt.
    pub fn new(database_url: &str, connect_timeout: Duration) -> Result<Self, OutboxError> {
        let (database_url, tls) =
            crate::tls::split(database_url).map_err(OutboxError::InvalidUrl)?;
        // describe() reaches the cause ("unknown option `sslcert`"); its own text is only
        // "invalid connection string". Neither quotes the password.
        let mut pg = tokio_postgres::Config::from_str(&database_url)
            .map_err(|e| OutboxError::InvalidUrl(describe(&e)))?;
        pg.ssl_mode(tls.effective_mode().map_err(OutboxError::Tls)?.wire());
        let tls = PgTls::new(&tls).map_err(OutboxError::Tls)?;
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(connect_timeout);
        }
        if pg.get_application_name().is_none() {
            pg.application_name(crate::version::application_name());
        }
        Ok(Connector {
            pg,
            passwords: Passwords::default(),
            tls,
            round_trip: None,
            writable_only: Arc::new(AtomicBool::new(false)),
            pooler: Pooler::Auto,
            pooler_detected: OnceLock::new(),
        })
    }

    /// Where new connections take their password from; the URL's own by default.
    pub fn password_source(mut self, source: PasswordSource) -> Self {
        self.passwords = Passwords::new(source);
        self
    }

    /// A connection pooler between the relay and PostgreSQL: nothing may stay on a server
    /// connection (see `pooler`).
    pub fn pooler(mut self, pooler: Pooler) -> Self {
        self.pooler = pooler;
        self
    }

    /// Every round trip of `run` gets this deadline, and the relay's sockets keepalives and a
    /// `tcp_user_timeout` derived from it where the URL sets none (see `liveness`).
    pub fn round_trip_deadline(mut self, deadline: Duration) -> Self {
        liveness::apply_keepalives(&mut self.pg, deadline);
        self.round_trip = Some(deadline);
        self
    }

    /// These connections skip read-only hosts once `other`'s learnt to, and take the pooler
    /// mode it detected, so that it is not detected (and logged) twice: the tables of one
    /// database share connections.
    pub fn sharing_hosts_with(mut self, other: &Connector) -> Self {
        self.writable_only = Arc::clone(&other.writable_only);
        self.pooler_as(other)
    }

    /// The URL's settings, as parsed (the logical wake-up's replication connection starts
    /// from them).
    pub(super) fn config(&self) -> &tokio_postgres::Config {
        &self.pg
    }

    /// Where each new connection's password comes from.
    pub(super) fn passwords(&self) -> &Passwords {
        &self.passwords
    }

    /// The TLS handshake `sslmode` asks for.
    pub(super) fn tls(&self) -> &PgTls {
        &self.tls
    }

    /// Where we connect, for messages: host and port, never the password.
    pub fn target(&self) -> String {
        use tokio_postgres::config::Host;
        let host = match self.pg.get_hosts().first() {
            Some(Host::Tcp(h)) => h.clone(),
            Some(Host::Unix(p)) => p.display().to_string(),
            None => "localhost".to_string(),
        };
        let port = self.pg.get_ports().first().copied().unwrap_or(5432);
        let db = self.pg.get_dbname().unwrap_or("(default database)");
        format!("{host}:{port}/{db}")
    }

    /// `run`'s deadline for one round trip, if it set one.
    pub(crate) fn round_trip(&self) -> Option<Duration> {
        self.round_trip
    }

    /// From now on new connections skip hosts that take no writes.
    pub(crate) fn skip_read_only_hosts(&self) {
        self.writable_only.store(true, Ordering::Relaxed);
    }

    /// How many hosts the URL names: with one, a standby there has no primary to give way to.
    pub(crate) fn host_count(&self) -> usize {
        self.pg.get_hosts().len().max(1)
    }

    /// Every host and port of the URL, for messages (never the password).
    pub(crate) fn hosts(&self) -> String {
        use tokio_postgres::config::Host;
        let ports = self.pg.get_ports();
        let hosts: Vec<String> = self
            .pg
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, host)| {
                let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                match host {
                    Host::Tcp(h) => format!("{h}:{port}"),
                    Host::Unix(p) => format!("{}:{port}", p.display()),
                }
            })
            .collect();
        hosts.join(",")
    }

    /// What `check` says about `--pooler` (see [`Pooler::describe`]); asks the server which
    /// port it listens on.
    pub async fn pooler_report(&self) -> Result<String, OutboxError> {
        let client = self.raw_connect().await?;
        let port: Option<i32> = client
            .query_one("SELECT inet_server_port()", &[])
            .await
            .map_err(query_err("asking the server for its port"))?
            .get(0);
        let url_port = self.pg.get_ports().first().copied().unwrap_or(5432);
        let in_use = self.pooler_in_use();
        let described = in_use.describe(url_port, port);
        Ok(match self.pooler {
            Pooler::Auto if in_use.pooled() => {
                format!("a connection pooler detected (its cancel key is not the server's process): {described}")
            }
            Pooler::Auto => format!("no connection pooler detected: {described}"),
            _ => described,
        })
    }

    /// The mode connections use: the configured one, or what `auto` detected (`Auto` until
    /// the first connection).
    pub fn pooler_in_use(&self) -> Pooler {
        self.pooler_detected.get().copied().unwrap_or(self.pooler)
    }

    /// The mode `other` (an outbox of the same database) detected, so that it is not detected
    /// (and logged) twice.
    pub fn pooler_as(self, other: &Connector) -> Self {
        if let Some(mode) = other.pooler_detected.get() {
            let _ = self.pooler_detected.set(*mode);
        }
        self
    }

    /// Whether `wakeup` works through the pooler `auto` detected (an explicit `--pooler` was
    /// judged with the configuration).
    pub fn pooler_allows(&self, wakeup: Wakeup) -> Result<(), OutboxError> {
        match self.pooler == Pooler::Auto && self.pooler_in_use().pooled() {
            true => Pooler::detected_allows(wakeup).map_err(OutboxError::Pooler),
            false => Ok(()),
        }
    }

    /// Decides the mode from `client`, the first connection, before anything is set on it
    /// (see [`Pooler::in_use`]); logs what it found, once.
    async fn detect_pooler(&self, client: &tokio_postgres::Client) -> Result<Pooler, OutboxError> {
        if let Some(mode) = self.pooler_detected.get() {
            return Ok(*mode);
        }
        if matches!(self.pooler, Pooler::Session | Pooler::Transaction) {
            return Ok(self.pooler);
        }
        let key_pid = cancel_key_pid(client).await.map_err(|e| {
            OutboxError::Pooler(format!("cannot read the connection's cancel key: {e}"))
        })?;
        // The simple protocol: a statement prepared by name here would stay on a pooled
        // server connection (its Close goes out later, maybe to another one).
        let backend: Option<i32> = client
            .simple_query("SELECT pg_backend_pid()")
            .await
            .map_err(query_err("asking the server for its process id"))?
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => {
                    row.get(0).and_then(|pid| pid.parse().ok())
                }
                _ => None,
            });
        let backend = backend.ok_or_else(|| {
            OutboxError::Pooler("the server did not say its process id".to_string())
        })?;
        let mode = self
            .pooler
            .in_use(key_pid != backend)
            .map_err(OutboxError::Pooler)?;
        if self.pooler_detected.set(mode).is_ok() && self.pooler == Pooler::Auto {
            match mode.pooled() {
                true => tracing::info!(
                    "a connection pooler answers for PostgreSQL (the cancel key is not the server's process): nothing is left on server connections (per-transaction settings, unnamed statements); --pooler session or transaction says so explicitly"
                ),
                false => tracing::info!(
                    "connected to PostgreSQL directly (no pooler detected): session settings and prepared statements"
                ),
            }
        }
        Ok(mode)
    }

    /// Connects within the connect timeout. tokio-postgres applies its own timeout to the TCP
    /// connect only; a server that accepts and then never answers would hang the start-up
    /// handshake, so the whole handshake is bounded here.
    pub(super) async fn open(
        &self,
    ) -> Result<
        (
            tokio_postgres::Client,
            tokio_postgres::Connection<tokio_postgres::Socket, PgTlsStream<tokio_postgres::Socket>>,
        ),
        OutboxError,
    > {
        let limit = self
            .pg
            .get_connect_timeout()
            .copied()
            .unwrap_or(Duration::from_secs(10));
        // The password is fetched within the limit too: a token needs credentials, which may
        // come from the network (web identity, container or instance roles).
        let connect = async {
            let pg = self.connect_settings().await?;
            pg.connect(self.tls.clone()).await.map_err(|e| {
                let (target, reason) = (self.target(), describe(&e));
                match error::connect_rejected(&e) {
                    true => OutboxError::Rejected { target, reason },
                    false => OutboxError::Connect { target, reason },
                }
            })
        };
        match tokio::time::timeout(limit, connect).await {
            Ok(result) => result,
            Err(_) => Err(OutboxError::Connect {
                target: self.target(),
                reason: format!(
                    "no answer within {} (--connect-timeout)",
                    humantime::format_duration(limit)
                ),
            }),
        }
    }

    /// The connection settings for one new connection, with its password fetched now.
    pub(super) async fn connect_settings(
        &self,
    ) -> Result<Cow<'_, tokio_postgres::Config>, OutboxError> {
        let mut pg = self
            .passwords
            .apply(&self.pg)
            .await
            .map_err(|e| OutboxError::Connect {
                target: self.target(),
                reason: e.to_string(),
            })?;
        use tokio_postgres::config::TargetSessionAttrs;
        if self.writable_only.load(Ordering::Relaxed)
            && pg.get_target_session_attrs() == TargetSessionAttrs::Any
        {
            pg.to_mut()
                .target_session_attrs(TargetSessionAttrs::ReadWrite);
        }
        Ok(pg)
    }

    /// A new connection, set up for the relay where the pooler mode allows; no table is
    /// looked at.
    pub(super) async fn raw_connect(&self) -> Result<Conn, OutboxError> {
        let (client, connection) = self.open().await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "database connection ended");
            }
        });
        let pooler = self.detect_pooler(&client).await?;
        let conn = Conn::new(client, pooler).with_deadline(self.round_trip);
        if !pooler.pooled() {
            conn.batch_execute(&conn::session_baseline(self.round_trip))
                .await
                .map_err(query_err("setting up the relay's session"))?;
        }
        Ok(conn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn after_a_read_only_server_new_connections_skip_read_only_hosts() {
        use tokio_postgres::config::TargetSessionAttrs;
        let outbox = Connector::new(
            "postgres://u:pw@10.0.0.1:5432,10.0.0.2:5433/app",
            Duration::from_secs(1),
        )
        .unwrap()
        .round_trip_deadline(Duration::from_secs(4));
        assert_eq!(outbox.hosts(), "10.0.0.1:5432,10.0.0.2:5433");
        assert_eq!(outbox.round_trip(), Some(Duration::from_secs(4)));
        let before = outbox.connect_settings().await.unwrap();
        assert_eq!(before.get_target_session_attrs(), TargetSessionAttrs::Any);
        assert_eq!(before.get_keepalives_idle(), Duration::from_secs(4));
        drop(before);
        outbox.skip_read_only_hosts();
        let after = outbox.connect_settings().await.unwrap();
        assert_eq!(
            after.get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );
    }
}
