//! One connection that the sessions of many tables share (`run` serving several tables), so
//! that the relay's connections do not grow with the number of tables it serves.

use std::collections::HashMap;
use std::sync::Arc;

use super::conn::Conn;
use super::error::OutboxError;
use super::ident::TableName;
use super::session::Session;
use super::store::Outbox;

/// A connection and each table's statements prepared on it.
#[derive(Debug)]
pub struct SharedConn {
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

impl SharedConn {
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(SharedConn {
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
