//! Finding dead connections: a deadline on every round trip of `run` (`--db-timeout`), TCP
//! keepalives and `tcp_user_timeout` on the relay's sockets, and what a failed round trip means
//! for its connection: kept, or dropped and replaced.
//!
//! Why both: keepalives and `tcp_user_timeout` let the kernel notice a peer that vanished (a
//! lost NAT or conntrack entry, a partition), even on an idle connection. They cannot notice a
//! path whose near end still acknowledges while nothing answers (a proxy or load balancer that
//! stopped forwarding, a frozen server): only a deadline on the answer does.

use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::error::OutboxError;

/// tokio-postgres's (and libpq's) keepalive idle time when the URL sets none: two hours, the
/// kernel's default, which finds nothing in time.
const DRIVER_DEFAULT_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// Unanswered keepalive probes before the kernel drops the connection, where the URL sets none.
const KEEPALIVE_PROBES: u32 = 3;

/// Sets keepalives and `tcp_user_timeout` from the round-trip deadline wherever the URL set
/// none: idle time and user timeout the deadline, probes a third of it apart. A connection
/// lost in the network then ends within about two deadlines even while idle (a LISTEN
/// connection), instead of after the kernel's ~15 minutes of retransmissions. `keepalives=0`
/// in the URL is respected. An idle time of exactly two hours counts as unset: that is the
/// driver's default, and asking for it explicitly is indistinguishable from not asking.
pub fn apply_keepalives(pg: &mut tokio_postgres::Config, deadline: Duration) {
    // The kernel counts keepalive times in whole seconds.
    let deadline = deadline.max(Duration::from_secs(1));
    if pg.get_keepalives_idle() == DRIVER_DEFAULT_IDLE {
        pg.keepalives_idle(deadline);
    }
    if pg.get_keepalives_interval().is_none() {
        pg.keepalives_interval((deadline / 3).max(Duration::from_secs(1)));
    }
    if pg.get_keepalives_retries().is_none() {
        pg.keepalives_retries(KEEPALIVE_PROBES);
    }
    if pg.get_tcp_user_timeout().is_none() {
        pg.tcp_user_timeout(deadline);
    }
}

/// The same settings on a socket the relay opened itself (the logical wake-up's replication
/// connection), as tokio-postgres sets them on its own.
pub fn set_socket_keepalives(
    socket: &impl std::os::fd::AsRawFd,
    pg: &tokio_postgres::Config,
) -> std::io::Result<()> {
    let fd = socket.as_raw_fd();
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| {
        // SAFETY: setsockopt on a socket we own, with a pointer to a live c_int and its size.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    let secs = |d: Duration| d.as_secs().clamp(1, i32::MAX as u64) as libc::c_int;
    set(
        libc::SOL_SOCKET,
        libc::SO_KEEPALIVE,
        libc::c_int::from(pg.get_keepalives()),
    )?;
    #[cfg(target_os = "linux")]
    {
        if pg.get_keepalives() {
            set(
                libc::IPPROTO_TCP,
                libc::TCP_KEEPIDLE,
                secs(pg.get_keepalives_idle()),
            )?;
            if let Some(interval) = pg.get_keepalives_interval() {
                set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, secs(interval))?;
            }
            if let Some(probes) = pg.get_keepalives_retries() {
                let probes = probes.min(i32::MAX as u32) as libc::c_int;
                set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, probes)?;
            }
        }
        if let Some(timeout) = pg.get_tcp_user_timeout() {
            let millis = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
            set(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, millis)?;
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = secs;
    Ok(())
}

/// Why a connection is dropped and replaced after one of its round trips.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replace {
    /// No answer within the deadline: the connection may be dark, and a dark one never answers.
    Unanswered,
    /// The server takes no writes (a standby, or a primary demoted since we connected):
    /// retrying the statement there can never succeed; another host must take over.
    ReadOnly,
}

/// Whether the connection behind this failure must go. Anything else (a server error, a lost
/// connection, which reconnects by itself) keeps today's handling.
pub fn replacement(e: &OutboxError) -> Option<Replace> {
    match e {
        OutboxError::Unanswered { .. } => Some(Replace::Unanswered),
        OutboxError::Query { source, .. } => {
            for_sqlstate(source.code()).or_else(|| in_recovery(source))
        }
        _ => None,
    }
}

/// A standby's answer to the relay's `BEGIN ... READ WRITE` (see `conn::Access`): SQLSTATE
/// 0A000, "cannot set transaction read-write mode during recovery". The code alone is too
/// broad (any unsupported feature), so the server's message decides.
fn in_recovery(e: &tokio_postgres::Error) -> Option<Replace> {
    let db = e.as_db_error()?;
    (db.code() == &SqlState::FEATURE_NOT_SUPPORTED && db.message().contains("during recovery"))
        .then_some(Replace::ReadOnly)
}

/// The server's refusals that mean "not on this connection": SQLSTATE 25006
/// (read_only_sql_transaction), what a hot standby answers every write.
pub fn for_sqlstate(code: Option<&SqlState>) -> Option<Replace> {
    (code == Some(&SqlState::READ_ONLY_SQL_TRANSACTION)).then_some(Replace::ReadOnly)
}

/// How long to wait before the `failures`-th database retry in a row: at once after a
/// connection was replaced (the next one is new, and the database may well be fine), otherwise
/// capped exponential back-off with full jitter, capped by `--db-retry-max` rather than SQS's
/// `--retry-max`, so the relay is back within seconds of the database.
pub fn reconnect_delay(
    failures: u32,
    replaced: bool,
    base: Duration,
    cap: Duration,
    jitter: f64,
) -> Duration {
    if replaced && failures <= 1 {
        return Duration::ZERO;
    }
    crate::retry::backoff(failures, base.min(cap), cap, jitter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    #[test]
    fn keepalives_follow_the_deadline_where_the_url_sets_none() {
        let mut pg = tokio_postgres::Config::from_str("postgres://u@h/db").unwrap();
        apply_keepalives(&mut pg, Duration::from_secs(6));
        assert!(pg.get_keepalives());
        assert_eq!(pg.get_keepalives_idle(), Duration::from_secs(6));
        assert_eq!(pg.get_keepalives_interval(), Some(Duration::from_secs(2)));
        assert_eq!(pg.get_keepalives_retries(), Some(KEEPALIVE_PROBES));
        assert_eq!(pg.get_tcp_user_timeout(), Some(&Duration::from_secs(6)));
    }

    #[test]
    fn keepalives_the_url_sets_are_kept() {
        // tokio-postgres reads tcp_user_timeout in seconds (libpq: milliseconds).
        let mut pg = tokio_postgres::Config::from_str(
            "postgres://u@h/db?keepalives_idle=30&keepalives_interval=7&keepalives_retries=9&tcp_user_timeout=45",
        )
        .unwrap();
        apply_keepalives(&mut pg, Duration::from_secs(5));
        assert_eq!(pg.get_keepalives_idle(), Duration::from_secs(30));
        assert_eq!(pg.get_keepalives_interval(), Some(Duration::from_secs(7)));
        assert_eq!(pg.get_keepalives_retries(), Some(9));
        assert_eq!(pg.get_tcp_user_timeout(), Some(&Duration::from_secs(45)));
        let mut off = tokio_postgres::Config::from_str("postgres://u@h/db?keepalives=0").unwrap();
        apply_keepalives(&mut off, Duration::from_secs(5));
        assert!(!off.get_keepalives());
    }

    #[test]
    fn sub_second_deadlines_keep_whole_second_keepalives() {
        let mut pg = tokio_postgres::Config::from_str("postgres://u@h/db").unwrap();
        apply_keepalives(&mut pg, Duration::from_millis(300));
        assert_eq!(pg.get_keepalives_idle(), Duration::from_secs(1));
        assert_eq!(pg.get_keepalives_interval(), Some(Duration::from_secs(1)));
    }

    #[test]
    fn a_timeout_or_a_read_only_server_replaces_the_connection() {
        let unanswered = OutboxError::Unanswered {
            what: "claiming rows",
            after: Duration::from_secs(5),
        };
        assert_eq!(replacement(&unanswered), Some(Replace::Unanswered));
        assert_eq!(
            for_sqlstate(Some(&SqlState::READ_ONLY_SQL_TRANSACTION)),
            Some(Replace::ReadOnly)
        );
        for kept in [
            Some(&SqlState::UNDEFINED_TABLE),
            Some(&SqlState::ADMIN_SHUTDOWN),
            Some(&SqlState::T_R_SERIALIZATION_FAILURE),
            None,
        ] {
            assert_eq!(for_sqlstate(kept), None, "{kept:?}");
        }
        assert_eq!(
            replacement(&OutboxError::TableMissing("outbox".into())),
            None
        );
    }

    #[test]
    fn reconnects_wait_at_most_the_database_cap_and_not_at_all_after_a_replacement() {
        let (base, cap) = (Duration::from_secs(1), Duration::from_secs(2));
        assert_eq!(reconnect_delay(1, true, base, cap, 1.0), Duration::ZERO);
        assert_eq!(reconnect_delay(2, true, base, cap, 1.0), cap);
        assert_eq!(reconnect_delay(1, false, base, cap, 1.0), base);
        assert_eq!(reconnect_delay(30, false, base, cap, 1.0), cap);
        assert_eq!(reconnect_delay(30, false, base, cap, 0.25), cap / 4);
        // A --retry-base above the cap cannot lift the wait past it.
        let big_base = Duration::from_secs(10);
        assert_eq!(reconnect_delay(1, false, big_base, cap, 1.0), cap);
    }
}
