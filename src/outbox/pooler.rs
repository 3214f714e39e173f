//! `--pooler`: whether the relay's connections are its own, or server connections a pooler
//! (PgBouncer, RDS Proxy, Supavisor) hands to other clients between the relay's transactions.
//!
//! On its own connections the relay sets `plan_cache_mode` and `synchronous_commit` for the
//! session and prepares its statements once, by name. Through a pooler both would stay on a
//! server connection the application gets next: its commits would stop being durable, and a
//! named statement would collide with the next client's of the same name (PgBouncer before
//! 1.21 does not track them). So pooled connections set nothing for the session and keep no
//! statement: each statement is sent whole as the unnamed one (see `conn`), and the relay's
//! `synchronous_commit = off` is set per transaction (`SET LOCAL`).

use std::fmt;
use std::str::FromStr;

use super::{query_err, Outbox, OutboxError, Wakeup};

/// How the relay's connections reach PostgreSQL (`--pooler`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Pooler {
    /// The relay's own connections: session settings and prepared statements.
    #[default]
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
            Pooler::None => "none",
            Pooler::Session => "session",
            Pooler::Transaction => "transaction",
        }
    }

    /// Whether a server connection may serve other clients after (or between) the relay's
    /// transactions, so that nothing may be left on it.
    pub fn pooled(self) -> bool {
        self != Pooler::None
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

impl Outbox {
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
        Ok(self.pooler.describe(url_port, port))
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
            "none" => Ok(Pooler::None),
            "session" => Ok(Pooler::Session),
            "transaction" => Ok(Pooler::Transaction),
            other => Err(format!("{other:?}: use none, session or transaction")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print_alike() {
        for mode in [Pooler::None, Pooler::Session, Pooler::Transaction] {
            assert_eq!(mode.as_str().parse::<Pooler>(), Ok(mode));
        }
        assert!("statement"
            .parse::<Pooler>()
            .unwrap_err()
            .contains("none, session or transaction"));
        assert!(!Pooler::None.pooled());
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
