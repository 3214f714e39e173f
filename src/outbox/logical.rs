//! The logical wake-up (`--wakeup logical`): learns of committed inserts into the
//! outbox table from a temporary replication slot on the table's publication, and only rings;
//! the claim loop still finds the rows.
//!
//! Why this shape:
//! - Nothing runs in the application's commit path (no trigger, no NOTIFY lock): the server
//!   decodes the WAL after the commits, in the WAL sender of this connection.
//! - The slot is TEMPORARY: PostgreSQL drops it when this connection ends, however the relay
//!   ends (`kill -9` included), so a dead relay never holds back WAL. While the relay lives, it
//!   confirms everything it received, so the slot holds back at most a few seconds of WAL.
//! - The slot starts with no snapshot (nothing to export or copy): rows committed before
//!   streaming started are the claim loop's to find, which `on_ready` tells the caller.
//!
//! # Layout
//!
//! - this file: the `Outbox` entry points, what failures mean for an operator, the loop.
//! - [`wire`]: the replication sub-protocol client (connect, TLS, auth, commands, CopyData).
//! - [`stream`]: pure decoding of the stream and encoding of status updates.

mod stream;
mod wire;

use std::time::{Duration, Instant, SystemTime};

use tokio_postgres::error::SqlState;

use super::conn::Conn;

use super::error::{query_err, OutboxError};
use super::ident::quote_ident;
use super::store::Outbox;
use stream::{Decoder, ServerMessage};
use wire::{Wire, WireError};

/// How often the logical wake-up confirms its position and asks the server for a sign of life;
/// pg_recvlogical's default status interval, or `--db-timeout` when shorter.
const STATUS_INTERVAL: Duration = Duration::from_secs(10);

/// Silence after which the connection counts as dead (a server that went away without
/// closing the socket) when `run` set no round-trip deadline: PostgreSQL's default
/// `wal_sender_timeout`, the time after which the server would give up on us in the same
/// situation. With a deadline, the server answers each status update at once, so a live one
/// is never quieter than a status interval plus one deadline.
const SILENCE_LIMIT: Duration = Duration::from_secs(60);

/// Keepalives that do not ask for an answer are answered at most this often: the server sends
/// one whenever it has read WAL past what we confirmed, which on a busy database (even with no
/// outbox inserts) can be many a second.
const KEEPALIVE_ANSWER_GAP: Duration = Duration::from_secs(1);

impl Outbox {
    /// Streams committed inserts of the table through a temporary slot; calls `wake` once per
    /// committed transaction that inserted rows; `on_ready` once streaming has started (rows
    /// inserted before may have been missed and must be polled for). Returns (Err) when the
    /// connection ends, so the caller reconnects.
    pub async fn logical_wakeup(
        &self,
        wake: impl Fn(),
        on_ready: impl FnOnce(),
    ) -> Result<(), OutboxError> {
        let publication = {
            let client = self.raw_connect().await?;
            self.ready_publication(&client).await?
        };
        let slot = stream::slot_name(&publication, std::process::id(), fastrand::u32(..));
        let (mut wire, consistent_point) = self.open_slot(&slot, Some(&publication)).await?;
        tracing::debug!(%slot, %consistent_point, "logical wake-up streaming from a temporary replication slot");
        on_ready();
        let mut decoder = Decoder::default();
        // The furthest WAL position received; confirmed back so the slot retains nothing.
        let mut position = 0u64;
        let mut heard = Instant::now();
        let mut answered = Instant::now();
        let (status_interval, silence_limit) = match self.round_trip() {
            Some(deadline) => {
                let every = STATUS_INTERVAL.min(deadline);
                (every, every + deadline)
            }
            None => (STATUS_INTERVAL, SILENCE_LIMIT),
        };
        let mut tick = tokio::time::interval_at(
            tokio::time::Instant::now() + status_interval,
            status_interval,
        );
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let frame = tokio::select! {
                frame = wire.receive() => frame,
                _ = tick.tick() => {
                    if heard.elapsed() >= silence_limit {
                        return Err(self.lost(format!(
                            "no word from the server in {}",
                            humantime::format_duration(silence_limit)
                        )));
                    }
                    self.confirm(&mut wire, position, true).await?;
                    answered = Instant::now();
                    continue;
                }
            };
            heard = Instant::now();
            let message = frame.map_err(|e| self.streaming_error(e))?;
            match stream::parse(&message).map_err(|e| self.lost(e))? {
                ServerMessage::XLogData { start, data } => {
                    position = position.max(start);
                    if decoder.ring(data) {
                        wake();
                    }
                }
                ServerMessage::Keepalive {
                    end,
                    reply_requested,
                } => {
                    position = position.max(end);
                    if reply_requested || answered.elapsed() >= KEEPALIVE_ANSWER_GAP {
                        self.confirm(&mut wire, position, false).await?;
                        answered = Instant::now();
                    }
                }
                ServerMessage::Other(_) => {}
            }
        }
    }

    /// Start-up / `check` verdict: Ok, or an error whose Display is one line saying what to
    /// fix: wal_level, the role's REPLICATION attribute, the publication, free replication
    /// slots and WAL senders.
    pub async fn check_logical(&self) -> Result<(), OutboxError> {
        let client = self.raw_connect().await?;
        let row = client
            .query_one(
                "SELECT current_setting('wal_level'), current_setting('server_version_num')::int",
                &[],
            )
            .await
            .map_err(query_err("reading wal_level"))?;
        let (wal_level, version): (String, i32) = (row.get(0), row.get(1));
        if version < 100_000 {
            return Err(OutboxError::Wakeup(format!(
                "--wakeup logical needs PostgreSQL 10 or newer (temporary slots, pgoutput), and the server is {}.{}: upgrade it, or use --wakeup poll",
                version / 10_000,
                version / 100 % 100
            )));
        }
        if wal_level != "logical" {
            return Err(wal_level_error(&wal_level));
        }
        let publication = self.ready_publication(&client).await?;
        drop(client);
        // The server itself is the authority on the role's REPLICATION attribute (managed
        // services grant it in their own ways), pg_hba.conf, and free slots and WAL senders:
        // open a slot as the logical wake-up would, and let it go.
        let slot = stream::slot_name(&publication, std::process::id(), fastrand::u32(..));
        let (wire, _) = self.open_slot(&slot, None).await?;
        wire.terminate().await;
        Ok(())
    }

    /// The publication's name, once it is known to publish the table's inserts.
    async fn ready_publication(&self, client: &Conn) -> Result<String, OutboxError> {
        let name = self.resolve_channel(client).await?;
        let base = self.base_or_table();
        let found = client
            .query_opt(
                include_str!("../../sql/publication.sql"),
                &[&name, &base.quoted()],
            )
            .await
            .map_err(query_err("looking up the logical wake-up's publication"))?;
        match found.map(|row| row.get::<_, bool>(0)) {
            Some(true) => Ok(name),
            Some(false) => Err(OutboxError::Wakeup(format!(
                "--wakeup logical: publication {name} does not publish inserts into {base}: run `outbox-relay migrate --wakeup logical` with the same --table"
            ))),
            None => Err(OutboxError::Wakeup(format!(
                "--wakeup logical: publication {name} for {base} is missing: run `outbox-relay migrate --wakeup logical` with the same --table"
            ))),
        }
    }

    /// Opens a replication connection and creates the temporary slot; with a publication,
    /// also starts streaming from it. The whole handshake is bounded by the connect timeout,
    /// as `Outbox::open` bounds the relay's other connections.
    async fn open_slot(
        &self,
        slot: &str,
        publication: Option<&str>,
    ) -> Result<(Wire, String), OutboxError> {
        let limit = self
            .connector()
            .config()
            .get_connect_timeout()
            .copied()
            .unwrap_or(Duration::from_secs(10));
        // One deadline for the whole handshake; each step under it, so a timeout names the
        // step that hung.
        let deadline = tokio::time::Instant::now() + limit;
        // This connection's password (a file read now, a token signed now), as for the others.
        let pg = match tokio::time::timeout_at(deadline, self.connector().connect_settings()).await
        {
            Ok(pg) => pg?,
            Err(_) => {
                return Err(OutboxError::Connect {
                    target: self.connector().target(),
                    reason: format!(
                        "no password from {} within {} (--connect-timeout)",
                        self.connector().passwords().source(),
                        humantime::format_duration(limit)
                    ),
                })
            }
        };
        let mut wire = self
            .bounded(
                deadline,
                limit,
                Step::Connect,
                Wire::connect(&pg, self.connector().tls()),
            )
            .await?;
        // A walsender waiting to create a slot does not notice its client leave: it waits on
        // until the transactions open at that moment end, holding a WAL sender and a slot, and
        // every retry would add one. So a handshake abandoned from here on (timed out, or the
        // logical wake-up dropped) cancels the server's work.
        let mut guard = CancelOnDrop(wire.cancel_token());
        let options = if wire.server_major() >= 15 {
            "(SNAPSHOT 'nothing')"
        } else {
            "NOEXPORT_SNAPSHOT"
        };
        let create = format!(
            "CREATE_REPLICATION_SLOT {} TEMPORARY LOGICAL pgoutput {options}",
            quote_ident(slot)
        );
        let rows = self
            .bounded(
                deadline,
                limit,
                Step::CreateSlot,
                wire.simple_query(&create),
            )
            .await?;
        let consistent_point = rows
            .first()
            .and_then(|r| r.get(1))
            .cloned()
            .flatten()
            .unwrap_or_default();
        if let Some(publication) = publication {
            // publication_names is a list of identifiers inside a string literal.
            let names = quote_ident(publication).replace('\'', "''");
            let start = format!(
                "START_REPLICATION SLOT {} LOGICAL 0/0 (proto_version '1', publication_names '{names}')",
                quote_ident(slot)
            );
            self.bounded(deadline, limit, Step::Start, wire.start_streaming(&start))
                .await?;
        }
        guard.0 = None;
        Ok((wire, consistent_point))
    }

    /// Runs one handshake step until the handshake's deadline.
    async fn bounded<T>(
        &self,
        deadline: tokio::time::Instant,
        limit: Duration,
        step: Step,
        work: impl std::future::Future<Output = Result<T, WireError>>,
    ) -> Result<T, OutboxError> {
        match tokio::time::timeout_at(deadline, work).await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(e)) => Err(self.handshake_error(step, e)),
            Err(_) => Err(OutboxError::Connect {
                target: self.connector().target(),
                reason: format!(
                    "{} did not finish within {} (--connect-timeout){}",
                    step.doing(),
                    humantime::format_duration(limit),
                    if step == Step::CreateSlot {
                        ": PostgreSQL creates a slot only once the transactions open at that moment have ended (see pg_stat_activity)"
                    } else {
                        ""
                    }
                ),
            }),
        }
    }

    /// Sends a status update confirming `position`.
    async fn confirm(
        &self,
        wire: &mut Wire,
        position: u64,
        reply: bool,
    ) -> Result<(), OutboxError> {
        wire.copy_data(&stream::status_update(position, SystemTime::now(), reply))
            .await
            .map_err(|e| self.streaming_error(e))?;
        tracing::trace!(confirmed = %stream::lsn(position), "logical wake-up status update");
        Ok(())
    }

    /// A failure during the handshake, in the operator's terms where the server's answer
    /// has a known fix.
    fn handshake_error(&self, step: Step, e: WireError) -> OutboxError {
        match e {
            WireError::Server(server) => match logical_prerequisite(&server, &self.user_name()) {
                Some(line) => OutboxError::Wakeup(line),
                None if step == Step::Connect => OutboxError::Connect {
                    target: self.connector().target(),
                    reason: server.to_string(),
                },
                None => OutboxError::Replication {
                    context: step.doing(),
                    detail: server.to_string(),
                    code: Some(server.code),
                },
            },
            WireError::Io(reason) => OutboxError::Connect {
                target: self.connector().target(),
                reason: format!("{}: {reason}", step.doing()),
            },
        }
    }

    fn streaming_error(&self, e: WireError) -> OutboxError {
        match e {
            WireError::Server(server) => match logical_prerequisite(&server, &self.user_name()) {
                Some(line) => OutboxError::Wakeup(line),
                None => OutboxError::Replication {
                    context: "logical wake-up",
                    detail: server.to_string(),
                    code: Some(server.code),
                },
            },
            WireError::Io(reason) => self.lost(reason),
        }
    }

    fn lost(&self, reason: String) -> OutboxError {
        OutboxError::Replication {
            context: "logical wake-up",
            detail: format!("{reason} ({})", self.connector().target()),
            code: None,
        }
    }

    /// The role we log in as, for messages (never the password).
    fn user_name(&self) -> String {
        match self.connector().config().get_user() {
            Some(user) => user.to_string(),
            None => whoami::username().unwrap_or_else(|_| "(the OS user)".to_string()),
        }
    }
}

/// Cancels the server's work on a handshake that did not finish, in the background.
struct CancelOnDrop(Option<wire::CancelToken>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(token) = self.0.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let sent = tokio::time::timeout(Duration::from_secs(10), token.send()).await;
                if !matches!(sent, Ok(Ok(()))) {
                    tracing::debug!("could not cancel an unfinished replication handshake");
                }
            });
        }
    }
}

/// Where the handshake was, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Connect,
    CreateSlot,
    Start,
}

impl Step {
    fn doing(self) -> &'static str {
        match self {
            Step::Connect => "opening a replication connection",
            Step::CreateSlot => "creating the temporary replication slot",
            Step::Start => "starting logical replication",
        }
    }
}

fn wal_level_error(found: &str) -> OutboxError {
    OutboxError::Wakeup(format!(
        "--wakeup logical needs wal_level=logical, and the server has wal_level={found}: run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL, or use --wakeup poll"
    ))
}

/// One line for a server error that means `--wakeup logical` cannot work until an operator
/// changes the server or the role; `None` for anything else.
fn logical_prerequisite(e: &wire::ServerError, user: &str) -> Option<String> {
    match e.code {
        // PostgreSQL 15: "must be superuser or replication role to start walsender";
        // 16+: "permission denied to start WAL sender".
        SqlState::INSUFFICIENT_PRIVILEGE => Some(format!(
            "--wakeup logical needs a role with the REPLICATION attribute, and {} has not: run ALTER ROLE {} REPLICATION as a superuser, or use --wakeup poll",
            quote_ident(user),
            quote_ident(user)
        )),
        SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE if e.message.contains("wal_level") => {
            Some(wal_level_error("replica").to_string())
        }
        // Slots switched off altogether (max_replication_slots = 0).
        SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE
            if e.message.contains("max_replication_slots") =>
        {
            Some(format!(
            "--wakeup logical needs a free replication slot ({}): raise max_replication_slots (restart needed)",
            e.message
        ))
        }
        SqlState::CONFIGURATION_LIMIT_EXCEEDED => Some(format!(
            "--wakeup logical needs a free replication slot ({}): raise max_replication_slots (restart needed) or drop unused slots listed in pg_replication_slots",
            e.message
        )),
        SqlState::TOO_MANY_CONNECTIONS if e.message.contains("max_wal_senders") => Some(format!(
            "--wakeup logical needs a free WAL sender ({}): raise max_wal_senders (restart needed)",
            e.message
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: SqlState, message: &str) -> wire::ServerError {
        wire::ServerError {
            code,
            message: message.into(),
        }
    }

    /// The relay spawns the logical wake-up on the multi-threaded runtime.
    #[allow(dead_code)]
    fn the_logical_wakeup_future_is_send(outbox: &Outbox) {
        fn send<T: Send>(_: T) {}
        send(outbox.logical_wakeup(|| {}, || {}));
        send(outbox.check_logical());
    }

    #[test]
    fn prerequisites_become_one_line_with_the_fix() {
        let cases = [
            (
                server(
                    SqlState::INSUFFICIENT_PRIVILEGE,
                    "must be superuser or replication role to start walsender",
                ),
                "ALTER ROLE \"app\"\"x\" REPLICATION",
            ),
            (
                server(
                    SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
                    "logical decoding requires wal_level >= logical",
                ),
                "ALTER SYSTEM SET wal_level = logical",
            ),
            (
                server(
                    SqlState::CONFIGURATION_LIMIT_EXCEEDED,
                    "all replication slots are in use",
                ),
                "max_replication_slots",
            ),
            (
                server(
                    SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
                    "replication slots can only be used if max_replication_slots > 0",
                ),
                "max_replication_slots",
            ),
            (
                server(
                    SqlState::TOO_MANY_CONNECTIONS,
                    "number of requested standby connections exceeds max_wal_senders (currently 0)",
                ),
                "max_wal_senders",
            ),
        ];
        for (e, fix) in cases {
            let line = logical_prerequisite(&e, "app\"x").unwrap();
            assert!(line.contains(fix), "{line}");
            assert!(!line.contains('\n'), "{line}");
        }
        assert!(logical_prerequisite(
            &server(SqlState::TOO_MANY_CONNECTIONS, "too many clients already"),
            "u"
        )
        .is_none());
        assert!(logical_prerequisite(
            &server(SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE, "something else"),
            "u"
        )
        .is_none());
        assert!(logical_prerequisite(
            &server(SqlState::INVALID_PASSWORD, "password authentication failed"),
            "u"
        )
        .is_none());
    }
}
