//! One connection to PostgreSQL, used as `--pooler` allows: the one place that decides between
//! prepared statements and unnamed ones, and where the relay's commit setting goes.
//!
//! On a direct connection ([`Pooler::None`]) every call is tokio-postgres's own: statements
//! prepared by name once, text queries prepared and closed by the driver, session settings.
//!
//! On a pooled connection nothing may outlive a transaction:
//! - A [`Stmt`] is sent whole each time as the unnamed statement (Parse, Bind, Execute, Sync in
//!   one round trip), with the parameter types learned at connect time inside a transaction
//!   whose named statements are closed before its COMMIT. The server plans an unnamed
//!   statement with its parameters every time: a pooled relay pays a planning per call, which
//!   a direct one does not (`session::PLANS`).
//! - A statement that writes runs as `BEGIN; SET LOCAL synchronous_commit = off`, the
//!   statement, `COMMIT`, pipelined: one round trip, and the setting ends with the transaction.
//! - A text query learns its parameter types the same way first (queries by text are few:
//!   start-up, `check`, `status`, `migrate`).
//!
//! The claim loop, the settling tasks and the statistics share one connection; a pipelined
//! transaction's three requests must leave with no other request between them, or another
//! task's statement would run inside it. Every request is sent under `order`: through a
//! pooler every write is such a transaction, and on either kind of connection a claim is (it
//! runs after its lock, sql/claim_lock.sql).

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use futures_util::future::{join3, maybe_done};
use futures_util::TryStreamExt;
use tokio::sync::Mutex;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Error, Row, Statement};

use super::pooler::Pooler;

/// The relay's own commits do not wait for their WAL flush, and its statements are never JIT
/// compiled (see `session`); per transaction, through a pooler.
const RELAXED: &str = "SET LOCAL synchronous_commit = off; SET LOCAL jit = off";

/// `a` and `b`, `SET LOCAL`s either of which may be empty, as one script.
fn join_settings(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (_, true) => a.to_string(),
        (true, false) => b.to_string(),
        (false, false) => format!("{a}; {b}"),
    }
}

/// What a transaction of the relay relies on, stated in its BEGIN rather than inherited from
/// `default_transaction_isolation` / `default_transaction_read_only`, which a database, a role
/// or the URL's `options` may set to anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// Claims are serialized by a transaction advisory lock (sql/claim_lock.sql), which
    /// serializes only if the claim's snapshot is taken after the lock is granted: true under
    /// READ COMMITTED, false under REPEATABLE READ or SERIALIZABLE, where the snapshot of the
    /// lock's own statement misses the lease the previous claim committed (measured: 1,580
    /// copies of 3,000 rows). Every write says READ WRITE, so that a role's
    /// `default_transaction_read_only = on` cannot pass for a standby.
    Write,
    /// A read needs no writability (it works on a standby), but READ COMMITTED all the same:
    /// a SERIALIZABLE read takes SIRead locks that can abort the application's own
    /// serializable transactions.
    Read,
}

impl Access {
    pub(super) fn begin(self) -> &'static str {
        match self {
            Access::Write => "BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE",
            Access::Read => "BEGIN ISOLATION LEVEL READ COMMITTED",
        }
    }
}

/// The server-side timeouts of the relay's work, `set` being `SET` (a direct connection's
/// session) or `SET LOCAL` (one transaction): `deadline` (`--db-timeout`) for statements, lock
/// waits and idle transactions. Without one (the one-shot commands: a replay of many rows may
/// take long), statements and lock waits are not bounded, and an idle transaction is ended
/// after [`ONE_SHOT_IDLE`]. The relay's own, never a role's: a role's
/// `statement_timeout = 50ms` would cut claims that are fine.
pub(super) fn timeouts(set: &str, deadline: Option<Duration>) -> String {
    let ms = deadline.map_or(0, |d| d.as_millis().max(1));
    let idle = deadline.unwrap_or(ONE_SHOT_IDLE).as_millis().max(1);
    format!(
        "{set} statement_timeout = {ms}; {set} lock_timeout = {ms}; {set} idle_in_transaction_session_timeout = {idle}"
    )
}

/// How long a one-shot command's transaction may sit idle on the server. Its statements are
/// pipelined, so it never waits for the command between them: an idle one is a command that
/// is gone (killed, or its link dark), and through a pooler it would hold the pool's server
/// connection, through a direct one the rows it changed, until TCP noticed.
pub(super) const ONE_SHOT_IDLE: Duration = Duration::from_secs(60);

/// What a direct connection's session relies on, set once when it connects, for the
/// statements it runs outside a transaction of its own (settlements, statistics, probes): the
/// same as [`Access`] and [`timeouts`] state per transaction. A pooled connection keeps no
/// session state, so there every statement runs in a transaction that states them.
pub(super) fn session_baseline(deadline: Option<Duration>) -> String {
    format!(
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE; {}",
        timeouts("SET", deadline)
    )
}

/// The rows of [`Conn::query_in_transaction`]'s statements: the one before (if any), the
/// first and the query.
pub(super) type InTransaction = (Option<Vec<Row>>, Vec<Row>, Vec<Row>);

/// A statement the relay runs many times, in the form its connection can keep.
#[derive(Debug)]
pub(super) enum Stmt {
    /// Prepared once, by name, on a connection that is the relay's alone.
    Prepared(Statement),
    /// Sent whole with every execution; nothing stays on the server connection.
    Unnamed {
        sql: String,
        /// The parameters' types, as the server inferred them when the relay connected.
        types: Vec<Type>,
        /// It writes: its transaction commits without waiting for the WAL flush.
        writes: bool,
    },
}

impl Stmt {
    /// The parameters' types, to check a statement against what its caller binds.
    pub(super) fn params(&self) -> &[Type] {
        match self {
            Stmt::Prepared(s) => s.params(),
            Stmt::Unnamed { types, .. } => types,
        }
    }
}

/// What a [`Conn`] runs: one of the relay's statements, or a query's text.
pub(super) enum Query<'a> {
    Stmt(&'a Stmt),
    Text(&'a str),
}

/// Anything [`Conn`]'s query methods take, so that call sites read as tokio-postgres's.
pub(super) trait AsQuery {
    fn as_query(&self) -> Query<'_>;
}

impl AsQuery for Stmt {
    fn as_query(&self) -> Query<'_> {
        Query::Stmt(self)
    }
}

impl AsQuery for str {
    fn as_query(&self) -> Query<'_> {
        Query::Text(self)
    }
}

impl AsQuery for String {
    fn as_query(&self) -> Query<'_> {
        Query::Text(self)
    }
}

/// A connection and what `--pooler` allows on it.
#[derive(Debug)]
pub struct Conn {
    client: Client,
    pooler: Pooler,
    /// Held while a pooled request is being sent (see the module's documentation).
    order: Mutex<()>,
    /// `run`'s round-trip deadline (`--db-timeout`): how long the server gives a transaction
    /// this connection pipelined (see [`Conn::pipelined`]).
    deadline: Option<Duration>,
}

impl Conn {
    pub(super) fn new(client: Client, pooler: Pooler) -> Conn {
        Conn {
            client,
            pooler,
            order: Mutex::new(()),
            deadline: None,
        }
    }

    /// The server ends a transaction of ours that outlives `deadline`, running or left idle.
    pub(super) fn with_deadline(mut self, deadline: Option<Duration>) -> Conn {
        self.deadline = deadline;
        self
    }

    /// The start of a transaction pipelined here: what it relies on (below), `settings` (on a
    /// pooled connection, what a session setting does on a direct one), then the deadline on
    /// the server's side. A connection that goes dark mid-transaction leaves the server
    /// holding what the transaction took (a claim's lock, a settlement's rows) for as long as
    /// TCP takes to tell, minutes: `idle_in_transaction_session_timeout` ends a transaction
    /// whose next statement never came, `statement_timeout` one waiting for a lock such a
    /// transaction holds. Without a deadline (the one-shot commands) the three are off, so
    /// that a role's or database's short ones cannot cut the relay's statements either.
    ///
    /// On a direct connection the three are the session's already ([`session_baseline`], set
    /// when it connected, and nothing of the relay's changes them after): stating them again
    /// in every transaction cost the server three statements parsed and run per claim.
    fn begin(&self, access: Access, settings: &str) -> String {
        let mut parts = vec![access.begin().to_string()];
        if !settings.is_empty() {
            parts.push(settings.to_string());
        }
        if self.pooled() {
            parts.push(timeouts("SET LOCAL", self.deadline));
        }
        parts.join("; ")
    }

    /// A pooled statement's transaction: a write commits without waiting for its WAL flush.
    fn begin_for(&self, writes: bool) -> String {
        match writes {
            true => self.begin(Access::Write, RELAXED),
            false => self.begin(Access::Read, ""),
        }
    }

    pub(super) fn pooled(&self) -> bool {
        self.pooler.pooled()
    }

    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// The relay's statements: prepared on a direct connection; on a pooled one, their
    /// parameter types learned in one transaction that leaves no statement behind. `writes`
    /// tells, per statement, whether it changes rows.
    pub(super) async fn statements(&self, sqls: &[(&str, bool)]) -> Result<Vec<Stmt>, Error> {
        if !self.pooled() {
            let prepared = futures_util::future::try_join_all(
                sqls.iter().map(|(sql, _)| self.client.prepare(sql)),
            )
            .await?;
            return Ok(prepared.into_iter().map(Stmt::Prepared).collect());
        }
        let texts: Vec<&str> = sqls.iter().map(|(sql, _)| *sql).collect();
        let types = self.learn(&texts).await?;
        Ok(sqls
            .iter()
            .zip(types)
            .map(|((sql, writes), types)| Stmt::Unnamed {
                sql: sql.to_string(),
                types,
                writes: *writes,
            })
            .collect())
    }

    /// The parameter types of `sqls`, from statements prepared and deallocated again inside
    /// one transaction sent as one simple-protocol message ([`learning_script`]), so that the
    /// server connection keeps none of them.
    ///
    /// One message, because a message reaches the server whole or not at all: prepared with
    /// the extended protocol (a Parse, its answer, then a Close), a caller that gave up
    /// between the Parse and the Close (its deadline, on a slow link) left the statement on
    /// the server connection, the next transaction on the connection committed around it, and
    /// through a transaction pooler the server connection went back to the pool with it for
    /// an application's session to find (simulation seed 4885364916658979242).
    async fn learn(&self, sqls: &[&str]) -> Result<Vec<Vec<Type>>, Error> {
        let script = learning_script(&self.begin(Access::Read, ""), sqls);
        let _order = self.order.lock().await;
        let answer = self.client.simple_query(&script).await;
        let messages = match answer {
            Ok(messages) => messages,
            Err(e) => {
                // The statements after the failed one were skipped, COMMIT with them.
                let _ = self.client.batch_execute("ROLLBACK").await;
                return Err(e);
            }
        };
        let oids: Vec<String> = messages
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                _ => None,
            })
            .collect();
        let mut learned = Vec::with_capacity(sqls.len());
        for (i, sql) in sqls.iter().enumerate() {
            let types: Option<Vec<Type>> = oids.get(i).and_then(|oids| {
                oids.split(',')
                    .filter(|o| !o.is_empty())
                    .map(|o| o.parse().ok().and_then(Type::from_oid))
                    .collect()
            });
            match types {
                Some(types) => learned.push(types),
                // A type tokio-postgres does not know by its number (one of the table's own,
                // a domain): only the driver's own prepare resolves it.
                None => learned.push(self.learn_by_prepare(sql).await?),
            }
        }
        Ok(learned)
    }

    /// [`Conn::learn`] for one statement whose parameter types only the driver resolves: its
    /// prepare and Close in a transaction of their own. Called with `order` held.
    async fn learn_by_prepare(&self, sql: &str) -> Result<Vec<Type>, Error> {
        self.client
            .batch_execute(&self.begin(Access::Read, ""))
            .await?;
        // Dropping the statement sends its Close now, ahead of the COMMIT below.
        let types = self.client.prepare(sql).await.map(|s| s.params().to_vec());
        let end = self
            .client
            .batch_execute(if types.is_ok() { "COMMIT" } else { "ROLLBACK" })
            .await;
        let types = types?;
        end?;
        Ok(types)
    }

    pub(super) async fn query<Q: AsQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        match query.as_query() {
            Query::Stmt(Stmt::Prepared(s)) => self.in_order(self.client.query(s, params)).await,
            Query::Text(sql) if !self.pooled() => {
                self.in_order(self.client.query(sql, params)).await
            }
            Query::Stmt(Stmt::Unnamed { sql, types, writes }) => Ok(self
                .unnamed(sql, types, Some(&self.begin_for(*writes)), params)
                .await?
                .0),
            Query::Text(sql) => {
                let types = self.learn(&[sql]).await?.remove(0);
                let begin = self.begin(Access::Read, "");
                Ok(self.unnamed(sql, &types, Some(&begin), params).await?.0)
            }
        }
    }

    pub(super) async fn execute<Q: AsQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error> {
        match query.as_query() {
            Query::Stmt(Stmt::Prepared(s)) => self.in_order(self.client.execute(s, params)).await,
            Query::Text(sql) if !self.pooled() => {
                self.in_order(self.client.execute(sql, params)).await
            }
            Query::Stmt(Stmt::Unnamed { sql, types, writes }) => Ok(self
                .unnamed(sql, types, Some(&self.begin_for(*writes)), params)
                .await?
                .1),
            Query::Text(sql) => {
                let types = self.learn(&[sql]).await?.remove(0);
                let begin = self.begin(Access::Read, "");
                Ok(self.unnamed(sql, &types, Some(&begin), params).await?.1)
            }
        }
    }

    pub(super) async fn query_one<Q: AsQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error> {
        match query.as_query() {
            Query::Stmt(Stmt::Prepared(s)) => self.in_order(self.client.query_one(s, params)).await,
            Query::Text(sql) if !self.pooled() => {
                self.in_order(self.client.query_one(sql, params)).await
            }
            _ => match self.query_opt(query, params).await? {
                Some(row) => Ok(row),
                None => Err(self.row_count_error("SELECT WHERE false").await),
            },
        }
    }

    pub(super) async fn query_opt<Q: AsQuery + ?Sized>(
        &self,
        query: &Q,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error> {
        match query.as_query() {
            Query::Stmt(Stmt::Prepared(s)) => self.in_order(self.client.query_opt(s, params)).await,
            Query::Text(sql) if !self.pooled() => {
                self.in_order(self.client.query_opt(sql, params)).await
            }
            _ => {
                let mut rows = self.query(query, params).await?;
                if rows.len() > 1 {
                    return Err(self.row_count_error("SELECT 1 UNION ALL SELECT 2").await);
                }
                Ok(rows.pop())
            }
        }
    }

    /// `sql`, which writes, in a transaction of its own whose BEGIN states what it relies on
    /// and its timeouts ([`Access::Write`], [`timeouts`]) in the message that opens it,
    /// pipelined with its COMMIT: an operator's command (`quarantine retry`, `replay`). The
    /// transaction is never open on the server without its idle timeout, so a link that goes
    /// dark in its middle cannot hold a pooled server connection, and nothing named is left on
    /// the connection.
    pub(super) async fn write_in_transaction(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        Ok(self.written_in_transaction("", sql, params).await?.0)
    }

    /// [`Conn::write_in_transaction`] of a statement that returns one row.
    pub(super) async fn write_one_in_transaction(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error> {
        let mut rows = self.write_in_transaction(sql, params).await?;
        match rows.len() {
            1 => Ok(rows.remove(0)),
            0 => Err(self.row_count_error("SELECT WHERE false").await),
            _ => Err(self.row_count_error("SELECT 1 UNION ALL SELECT 2").await),
        }
    }

    /// Simple-protocol statements (DDL, LISTEN, a transaction's BEGIN and COMMIT): nothing
    /// named is created, so the same on every connection.
    pub(super) async fn batch_execute(&self, sql: &str) -> Result<(), Error> {
        if self.pooled() {
            let _order = self.order.lock().await;
            return self.client.batch_execute(sql).await;
        }
        self.in_order(self.client.batch_execute(sql)).await
    }

    /// Runs `before` (if any), `first`, then `query`, in a write transaction of their own that
    /// starts with `settings` (simple-protocol `SET LOCAL`s), pipelined: one round trip, and
    /// the server parses no statement again on a direct connection. A claim runs this way,
    /// after the settlement it carries (`before`). Returns each statement's rows.
    pub(super) async fn query_in_transaction(
        &self,
        settings: &str,
        before: Option<(&Stmt, &[&(dyn ToSql + Sync)])>,
        (first, first_params): (&Stmt, &[&(dyn ToSql + Sync)]),
        query: &Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<InTransaction, Error> {
        let begin = match self.pooled() {
            true => self.begin(Access::Write, &join_settings(RELAXED, settings)),
            false => self.begin(Access::Write, settings),
        };
        let before = async {
            match before {
                Some((statement, params)) => self.run(statement, params).await.map(Some),
                None => Ok(None),
            }
        };
        // Every request leaves on the first poll, in order; the error of the first that
        // failed (a carried settlement's, the lock wait's) is the one the caller hears, since
        // its answer comes first.
        let all = futures_util::future::try_join3(
            before,
            self.run(first, first_params),
            self.run(query, params),
        );
        self.pipelined(&begin, all).await
    }

    /// `statement`'s rows, as its form allows, sent on the first poll.
    async fn run(
        &self,
        statement: &Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        match statement {
            Stmt::Prepared(s) => self.client.query(s, params).await,
            Stmt::Unnamed { sql, types, .. } => {
                Ok(self.unnamed_request(sql, types, params).await?.0)
            }
        }
    }

    /// Sends `request` with no other request of this connection's users between it and the
    /// transactions pipelined here (see [`Conn::pipelined`]); then waits for its answer.
    async fn in_order<T>(
        &self,
        request: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let mut request = pin!(maybe_done(request));
        {
            let _order = self.order.lock().await;
            // The future sends its request on its first poll, before it first waits.
            poll_fn(|cx| {
                let _ = request.as_mut().poll(cx);
                Poll::Ready(())
            })
            .await;
        }
        request.as_mut().await;
        request.take_output().expect("done")
    }

    /// `sql` with its parameters' types, in a transaction of its own that starts with `begin`
    /// (simple-protocol statements, e.g. a BEGIN and its settings), pipelined: one round trip,
    /// nothing named left on the connection.
    pub(super) async fn query_typed_in_transaction(
        &self,
        begin: &str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, Error> {
        let (values, types): (Vec<&(dyn ToSql + Sync)>, Vec<Type>) =
            params.iter().map(|(v, t)| (*v, t.clone())).unzip();
        Ok(self.unnamed(sql, &types, Some(begin), &values).await?.0)
    }

    /// Runs `sql` in a transaction of its own that starts with `settings` (`SET LOCAL ...`),
    /// pipelined: through a pooler, what a session setting does on a direct connection.
    pub(super) async fn execute_in_transaction(
        &self,
        settings: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error> {
        Ok(self.written_in_transaction(settings, sql, params).await?.1)
    }

    /// `sql` by text, its parameter types learned first, in a write transaction of its own
    /// that starts with `settings`: its rows and how many it changed.
    async fn written_in_transaction(
        &self,
        settings: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(Vec<Row>, u64), Error> {
        let types = self.learn(&[sql]).await?.remove(0);
        let begin = self.begin(Access::Write, settings);
        self.unnamed(sql, &types, Some(&begin), params).await
    }

    /// tokio-postgres's own error for a query that returned a count of rows other than the one
    /// its caller expects (its constructor is private): from `sql`, a query that makes it.
    async fn row_count_error(&self, sql: &str) -> Error {
        let _order = self.order.lock().await;
        match self.client.query_typed_one(sql, &[]).await {
            Err(e) => e,
            Ok(_) => unreachable!("{sql} returns a row count other than one"),
        }
    }

    /// Runs `sql` as the unnamed statement; with `begin`, in a transaction of its own that
    /// starts with it, pipelined. Returns the rows and how many rows it changed.
    async fn unnamed(
        &self,
        sql: &str,
        types: &[Type],
        begin: Option<&str>,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(Vec<Row>, u64), Error> {
        let statement = self.unnamed_request(sql, types, params);
        match begin {
            None => self.in_order(statement).await,
            Some(begin) => self.pipelined(begin, statement).await,
        }
    }

    /// `sql` as the unnamed statement, sent on the first poll: its rows and how many rows it
    /// changed.
    async fn unnamed_request(
        &self,
        sql: &str,
        types: &[Type],
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(Vec<Row>, u64), Error> {
        let typed = params.iter().zip(types).map(|(p, t)| (*p, t.clone()));
        let stream = self.client.query_typed_raw(sql, typed).await?;
        let mut stream = pin!(stream);
        let mut rows = Vec::new();
        while let Some(row) = stream.try_next().await? {
            rows.push(row);
        }
        Ok((rows, stream.rows_affected().unwrap_or(0)))
    }

    /// `statement` in a transaction of its own that starts with `begin`, pipelined: BEGIN,
    /// the statement and COMMIT leave together, with no other request between them.
    async fn pipelined<T>(
        &self,
        begin: &str,
        statement: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let mut begin = pin!(maybe_done(self.client.batch_execute(begin)));
        let mut statement = pin!(maybe_done(statement));
        // After a failed statement the transaction is aborted, and COMMIT ends it (as a
        // ROLLBACK) without an error of its own: the connection is left idle either way.
        let mut commit = pin!(maybe_done(self.client.batch_execute("COMMIT")));
        {
            let _order = self.order.lock().await;
            // Each future sends its request on its first poll, before it first waits.
            poll_fn(|cx| {
                let _ = begin.as_mut().poll(cx);
                let _ = statement.as_mut().poll(cx);
                let _ = commit.as_mut().poll(cx);
                Poll::Ready(())
            })
            .await;
        }
        // Driven together: the connection delivers each request's answers only as its
        // receiver reads them, in order.
        join3(begin.as_mut(), statement.as_mut(), commit.as_mut()).await;
        let began = begin.take_output().expect("done");
        let done = statement.take_output().expect("done");
        let committed = commit.take_output().expect("done");
        // What failed first: a failed start (its lock) aborts the statement after it.
        began?;
        let done = done?;
        committed?;
        Ok(done)
    }
}

/// One simple-protocol script that starts with `begin` and, for each of `sqls`, prepares it
/// under a name of the relay's own, answers one row with its parameter types' numbers (comma
/// separated), and deallocates it; then commits. Each statement text ends on a line of its own,
/// so that a comment on its last line ends before the `;`.
fn learning_script(begin: &str, sqls: &[&str]) -> String {
    let mut script = begin.to_string();
    for (i, sql) in sqls.iter().enumerate() {
        let name = format!("outbox_relay_learn_{i}");
        script.push_str(&format!(
            ";\nPREPARE {name} AS {sql}\n;\n\
             SELECT array_to_string(ARRAY(SELECT t::oid FROM unnest(parameter_types) AS t), ',') \
             FROM pg_prepared_statements WHERE name = '{name}';\n\
             DEALLOCATE {name}"
        ));
    }
    script.push_str(";\nCOMMIT");
    script
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_learned_in_one_message_that_deallocates_every_statement_it_prepares() {
        let script = learning_script("BEGIN", &["SELECT $1::int -- trailing", "SELECT $1"]);
        assert!(script.starts_with("BEGIN;"));
        assert!(script.ends_with(";\nCOMMIT"));
        for i in 0..2 {
            let name = format!("outbox_relay_learn_{i}");
            let prepared = script.find(&format!("PREPARE {name} AS")).unwrap();
            let read = script.find(&format!("WHERE name = '{name}'")).unwrap();
            let deallocated = script.find(&format!("DEALLOCATE {name}")).unwrap();
            assert!(prepared < read && read < deallocated, "{script}");
        }
        // A comment on a statement's last line ends before the statement's `;`.
        assert!(script.contains("-- trailing\n;"), "{script}");
    }

    #[test]
    fn every_transaction_states_its_isolation_and_writes_state_read_write() {
        assert_eq!(
            Access::Write.begin(),
            "BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE"
        );
        assert_eq!(Access::Read.begin(), "BEGIN ISOLATION LEVEL READ COMMITTED");
        let baseline = session_baseline(Some(Duration::from_secs(2)));
        assert!(
            baseline.starts_with(
                "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE;"
            ),
            "{baseline}"
        );
    }

    #[test]
    fn the_relays_own_timeouts_replace_a_roles_and_only_idle_transactions_are_bounded_without_a_deadline(
    ) {
        let with = timeouts("SET LOCAL", Some(Duration::from_millis(1500)));
        for name in [
            "statement_timeout",
            "lock_timeout",
            "idle_in_transaction_session_timeout",
        ] {
            assert!(with.contains(&format!("SET LOCAL {name} = 1500")), "{with}");
        }
        let without = timeouts("SET", None);
        assert_eq!(without.matches("= 0").count(), 2, "{without}");
        assert!(
            without.contains("SET idle_in_transaction_session_timeout = 60000"),
            "{without}"
        );
        assert!(!without.contains("LOCAL"));
    }
}
