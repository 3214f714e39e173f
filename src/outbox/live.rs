//! A session that lives on: [`LiveSession`] reconnects on demand after its connection is lost
//! or replaced, and is shared by the claim loop, the settling tasks and the statistics; under
//! `run` serving several tables, a [`HostConn`] is the one connection the sessions of many
//! tables share, so that the relay's connections do not grow with the number of tables.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use super::conn::Conn;
use super::error::OutboxError;
use super::ident::TableName;
use super::liveness::{replacement, Replace};
use super::session::Session;
use super::store::Outbox;

/// A session that reconnects on demand after the connection is lost; shared by the claim loop,
/// the settling tasks and the statistics task.
#[derive(Debug)]
pub struct LiveSession {
    outbox: Arc<Outbox>,
    current: Mutex<Option<Arc<Session>>>,
    /// A connection this table shares with others ([`LiveSession::on`]), in place of one
    /// of its own; another may be bound for each turn ([`LiveSession::bind`]).
    host: std::sync::Mutex<Option<Arc<HostConn>>>,
    /// Whether a connection was ever established: only a later one is news (INFO), the first
    /// of a lazy session is not.
    connected: std::sync::atomic::AtomicBool,
}

impl LiveSession {
    pub fn new(outbox: Arc<Outbox>, first: Session) -> Self {
        LiveSession {
            outbox,
            current: Mutex::new(Some(Arc::new(first))),
            host: std::sync::Mutex::new(None),
            connected: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// A session on `host`, a connection the sessions of several tables share.
    pub fn on(outbox: Arc<Outbox>, host: Arc<HostConn>) -> Self {
        LiveSession {
            outbox,
            current: Mutex::new(None),
            host: std::sync::Mutex::new(Some(host)),
            connected: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// A session that connects at its first use.
    pub fn lazy(outbox: Arc<Outbox>) -> Self {
        LiveSession {
            outbox,
            current: Mutex::new(None),
            host: std::sync::Mutex::new(None),
            connected: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The live session, reconnecting once if the last one is closed. Callers that get an
    /// error back decide how long to wait before asking again.
    /// From now on, runs on `host` (a session made with [`LiveSession::on`]): a relay serving
    /// several tables gives each turn a connection of its own.
    pub fn bind(&self, host: Arc<HostConn>) {
        *self.host.lock().expect("host lock") = Some(host);
    }

    fn host(&self) -> Option<Arc<HostConn>> {
        self.host.lock().expect("host lock").clone()
    }

    pub async fn get(&self) -> Result<Arc<Session>, OutboxError> {
        if let Some(host) = self.host() {
            let limit = self.outbox.round_trip().map(|deadline| {
                self.outbox
                    .connector()
                    .config()
                    .get_connect_timeout()
                    .copied()
                    .unwrap_or_default()
                    + deadline
            });
            return match limit {
                Some(limit) => tokio::time::timeout(limit, host.session(&self.outbox))
                    .await
                    .map_err(|_| OutboxError::Unanswered {
                        what: "setting up a shared connection",
                        after: limit,
                    })?,
                None => host.session(&self.outbox).await,
            };
        }
        let mut current = self.current.lock().await;
        if let Some(session) = current.as_ref() {
            if !session.is_closed() {
                return Ok(Arc::clone(session));
            }
        }
        *current = None;
        // A connection can go dark while its statements are prepared too, and this lock is held
        // meanwhile: every caller would wait with it.
        let session = match self.outbox.round_trip() {
            Some(deadline) => {
                let limit = self
                    .outbox
                    .connector()
                    .config()
                    .get_connect_timeout()
                    .copied()
                    .unwrap_or_default()
                    + deadline;
                tokio::time::timeout(limit, self.outbox.connect())
                    .await
                    .map_err(|_| OutboxError::Unanswered {
                        what: "setting up a new connection",
                        after: limit,
                    })??
            }
            None => self.outbox.connect().await?,
        };
        let session = Arc::new(session);
        *current = Some(Arc::clone(&session));
        if self
            .connected
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::info!(target = %self.outbox.connector().target(), "database connection established");
        } else {
            tracing::debug!(target = %self.outbox.connector().target(), "database connection established");
        }
        Ok(session)
    }
}

impl LiveSession {
    /// Runs `op` (one round trip, or a few pipelined) on the live session within `run`'s
    /// deadline. A connection that gave no answer in time, or whose server takes no writes, is
    /// dropped here, with one WARN line, and the next call opens a new one; the caller gets the
    /// error back and retries as it does after any database failure. What the round trip was
    /// doing when the connection went is the lease's to settle: a claim's rows stay leased until
    /// their lease ends, then any replica takes them; a settlement retried on the new
    /// connection meets its rows unchanged, or changed by its own first try (every settlement
    /// is fenced by owner and lease token, and only ever applies to a row still unsent and
    /// unquarantined, so applying it twice changes nothing the second time).
    pub async fn run<T, F, Fut>(&self, what: &'static str, op: F) -> Result<T, OutboxError>
    where
        F: FnOnce(Arc<Session>) -> Fut,
        Fut: std::future::Future<Output = Result<T, OutboxError>>,
    {
        let session = self.get().await?;
        let result = match self.outbox.round_trip() {
            Some(deadline) => tokio::time::timeout(deadline, op(Arc::clone(&session)))
                .await
                .unwrap_or(Err(OutboxError::Unanswered {
                    what,
                    after: deadline,
                })),
            None => op(Arc::clone(&session)).await,
        };
        if let Err(e) = &result {
            if let Some(why) = replacement(e) {
                self.replace(&session, why, what, e).await;
            }
        }
        result
    }

    /// Drops `session` if it is still the current one; of the callers that met the same dark
    /// connection only the first logs.
    async fn replace(&self, session: &Arc<Session>, why: Replace, what: &str, e: &OutboxError) {
        if let Some(host) = self.host() {
            if !host.drop_conn_of(session).await {
                return;
            }
        } else {
            let mut current = self.current.lock().await;
            match current.as_ref() {
                Some(live) if Arc::ptr_eq(live, session) => *current = None,
                _ => return,
            }
        }
        match why {
            Replace::Unanswered => tracing::warn!(
                target = %self.outbox.connector().target(),
                "database connection dropped: {e}; the next round trip opens a new one"
            ),
            Replace::ReadOnly => {
                let deadline = self.outbox.round_trip().unwrap_or(Duration::from_secs(5));
                let server = tokio::time::timeout(deadline, session.server_address())
                    .await
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| "(address not known)".to_string());
                let standby = tokio::time::timeout(deadline, session.in_recovery())
                    .await
                    .ok()
                    .flatten()
                    .unwrap_or(false);
                // A URL of one host has no primary to give way to: skipping read-only hosts
                // would only turn this into "cannot connect: database does not allow writes"
                // for ever. Say what the host is instead, at every try, until it is promoted
                // or the URL is fixed.
                if standby && self.outbox.connector().host_count() == 1 {
                    tracing::error!(
                        server = %server,
                        "database server {server} is a standby (pg_is_in_recovery() is true) and --database-url names no other host: it takes no writes, so nothing is sent; point --database-url at the primary, or list the primary too (with target_session_attrs=read-write)"
                    );
                    return;
                }
                self.outbox.connector().skip_read_only_hosts();
                let kind = match standby {
                    true => "is a standby (pg_is_in_recovery() is true)",
                    false => "takes no writes (a demoted primary)",
                };
                tracing::warn!(
                    server = %server,
                    hosts = %self.outbox.connector().hosts(),
                    error = %e,
                    "database server {server} {kind}: it takes no writes, while {what}; dropped the connection, connecting to the next host that does"
                );
            }
        }
    }
}

/// A connection and each table's statements prepared on it.
#[derive(Debug)]
pub struct HostConn {
    /// Opened on first use, with the settings of the table that asks (every table of a relay
    /// has the same), and again after it closed or was dropped.
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
    /// Each table's session on `conn`, and when it was last used.
    sessions: std::sync::Mutex<Sessions>,
    /// Past this many tables the least recently used table's session is dropped (its
    /// statements closed on the server): a backend keeps the plans of `capacity` tables at
    /// most, whatever the number of tables (a table's plans are a few hundred kB).
    capacity: usize,
}

#[derive(Debug, Default)]
struct Sessions {
    by_table: HashMap<TableName, (Arc<Session>, u64)>,
    used: u64,
}

impl HostConn {
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(HostConn {
            conn: tokio::sync::Mutex::new(None),
            sessions: std::sync::Mutex::new(Sessions::default()),
            capacity: capacity.max(1),
        })
    }

    /// The live connection, opened with `outbox`'s settings if there is none.
    async fn conn(&self, outbox: &Outbox) -> Result<Arc<Conn>, OutboxError> {
        let mut conn = self.conn.lock().await;
        if let Some(live) = conn.as_ref().filter(|c| !c.is_closed()) {
            return Ok(Arc::clone(live));
        }
        let opened = Arc::new(outbox.raw_connect().await?);
        *conn = Some(Arc::clone(&opened));
        Ok(opened)
    }

    /// `outbox`'s table's session on the live connection, its statements prepared there at
    /// its first use (and again after the connection was replaced).
    pub(super) async fn session(&self, outbox: &Outbox) -> Result<Arc<Session>, OutboxError> {
        let conn = self.conn(outbox).await?;
        {
            let mut sessions = self.sessions.lock().expect("sessions lock");
            sessions.used += 1;
            let used = sessions.used;
            if let Some((session, last)) = sessions.by_table.get_mut(outbox.table()) {
                if Arc::ptr_eq(&session.client, &conn) {
                    *last = used;
                    return Ok(Arc::clone(session));
                }
            }
        }
        let session = Arc::new(outbox.session_on(Arc::clone(&conn)).await?);
        let mut sessions = self.sessions.lock().expect("sessions lock");
        sessions.used += 1;
        let used = sessions.used;
        sessions
            .by_table
            .insert(outbox.table().clone(), (Arc::clone(&session), used));
        while sessions.by_table.len() > self.capacity {
            let oldest = sessions
                .by_table
                .iter()
                .min_by_key(|(_, (_, last))| *last)
                .map(|(table, _)| table.clone())
                .expect("more than one");
            sessions.by_table.remove(&oldest);
        }
        Ok(session)
    }

    /// Drops the connection `session` ran on if it is still the live one (it went dark, or its
    /// server takes no writes): every table's session on it goes with it. Whether it was.
    pub(super) async fn drop_conn_of(&self, session: &Session) -> bool {
        let mut conn = self.conn.lock().await;
        match conn.as_ref() {
            Some(live) if Arc::ptr_eq(live, &session.client) => {
                *conn = None;
                self.sessions
                    .lock()
                    .expect("sessions lock")
                    .by_table
                    .clear();
                true
            }
            _ => false,
        }
    }

    /// How many tables have statements prepared here now.
    pub fn tables_prepared(&self) -> usize {
        self.sessions.lock().expect("sessions lock").by_table.len()
    }
}
