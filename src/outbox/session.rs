//! One connection with the relay's prepared statements: claims, settlements, statistics.

use std::sync::Arc;

use super::claim::{ClaimLimits, ClaimParams, ClaimRequest, ClaimStrategy};
use super::conn::{Conn, Stmt};
use super::decode::{decode, Decoded, CURSOR, LIVE_FROM, LOWEST_UNSENT, TURN};
use super::error::hidden_by_row_security;
use super::error::{query_err, OutboxError};
use super::floors::Floors;
use super::ident::TableName;
use super::maintenance::Stats;
use super::maintenance::{STATS_EXACT_UP_TO, UNPARK_BATCH};
use super::settle::{Acknowledge, SettleAnswer, SettleArgs};
use super::store::Outbox;
use super::template::{render, Value};

use crate::row::{Claimed, Kept, QuarantinedAtClaim, Settled, Settlement};

impl Outbox {
    /// A working connection with the relay's statements prepared.
    pub async fn connect(&self) -> Result<Session, OutboxError> {
        let client = Arc::new(self.raw_connect().await?);
        self.session_on(client).await
    }

    /// The relay's statements for this table prepared on `client`, which may already hold
    /// other tables' ([`HostConn`]): the session settings below are the same for every
    /// table, setting them again changes nothing.
    pub(super) async fn session_on(&self, client: Arc<Conn>) -> Result<Session, OutboxError> {
        // The relay's own commits (claims, settlements, retention) do not wait for their WAL
        // flush: waiting made each of them queue with the application's commits for the same
        // flushes, and made the relay's connection, not the database, its limit on durable
        // clusters (docs/benchmarks.md). Nothing the relay writes needs to survive a database
        // crash: a lost claim or settlement only means the row is sent again, with the same
        // event_id, which at-least-once delivery allows. The application's commits are
        // untouched.
        // Through a pooler these would stay on a server connection the application gets next
        // (its commits no longer durable): there, unnamed statements are planned with their
        // parameters each time, and the relay's writes set synchronous_commit per transaction
        // (see `conn`).
        // JIT: a claim's estimated cost counts each group-head probe at its worst (a bitmap
        // scan and a sort per candidate row), so a claim over a large backlog passes
        // `jit_above_cost` while it runs in a millisecond. JIT compiling then took 10–40 ms of
        // every claim, four times the claim itself (docs/benchmarks.md, "JIT off"). The relay's
        // statements are short: compiling them never pays.
        if !client.pooled() {
            client
                .batch_execute(&format!(
                    "{PLANS}; SET synchronous_commit = off; SET jit = off"
                ))
                .await
                .map_err(query_err("setting up the relay's session"))?;
        }
        self.resolve_channel(&client).await?;
        self.check_row_security(&client).await?;
        self.check_contract(&client).await?;
        self.check_key_indexes(&client).await?;
        let sqls: Vec<(&str, bool)> = self
            .relay_statements()
            .into_iter()
            .map(|s| (s.sql, s.writes))
            .collect();
        let blockers = self.fill_table(
            include_str!("../../sql/settlement_blockers.sql"),
            self.base_or_table(),
        )?;
        let mut prepared = match client.statements(&sqls).await {
            Ok(prepared) => prepared.into_iter(),
            // A rule on the table that a data-modifying statement in WITH cannot go through
            // (DO INSTEAD NOTHING, DO ALSO, DO INSTEAD without RETURNING): name it, rather
            // than suggest a migration.
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED) => {
                let rules: Vec<String> = match client.query(&blockers, &[]).await {
                    Ok(rows) => rows
                        .iter()
                        .map(|r| r.get::<_, String>(0))
                        .filter(|line| line.starts_with("rule "))
                        .collect(),
                    Err(_) => Vec::new(),
                };
                if rules.is_empty() {
                    return Err(query_err("preparing the relay's statements")(e));
                }
                return Err(OutboxError::SettlementRewritten {
                    table: self.table().to_string(),
                    causes: format!("{} ({})", rules.join("; "), super::error::describe(&e)),
                });
            }
            Err(e) => {
                return Err(query_err("preparing the relay's statements (is the table at the current schema version? run `outbox-relay migrate`)")(e))
            }
        };
        let mut next = || prepared.next().expect("one statement per text");
        // Fields are evaluated in the order written: the order of `sqls`.
        let statements = Prepared {
            claim_start: next(),
            claim: next(),
            settle: Settle {
                mode: self.acknowledge(),
                full: next(),
                sent_only: next(),
            },
            stats: next(),
            probe: next(),
            unpark_destination: next(),
            lost_leases: next(),
            takeover: next(),
            refuse: next(),
        };
        // The strategy and its statement are built from one description; this catches the day
        // they drift apart, at start-up (and in `check`) instead of at every claim.
        let claim_params = statements.claim.params().len();
        if claim_params != self.strategy().param_count() {
            return Err(OutboxError::Template(format!(
                "the claim statement takes {claim_params} parameters, its strategy binds {}",
                self.strategy().param_count()
            )));
        }
        for (statement, others) in [
            (&statements.settle.full, true),
            (&statements.settle.sent_only, false),
        ] {
            let takes = statement.params().len();
            let binds = self.acknowledge().param_count(others);
            if takes != binds {
                return Err(OutboxError::Template(format!(
                    "the settlement statement takes {takes} parameters, {:?} binds {binds}",
                    self.acknowledge()
                )));
            }
        }
        Ok(Session {
            client,
            statements,
            claim_settings: self.claim_settings(false),
            catch_up_settings: self.claim_settings(true),
            strategy: self.strategy().clone(),
            limits: *self.limits(),
            floors: std::sync::Arc::clone(self.floors()),
            unsettled: self.fill_table(include_str!("../../sql/unsettled.sql"), self.table())?,
            blockers,
        })
    }

    /// Row-level security that applies to the relay's role without a policy that lets it see
    /// and settle every row (sql/row_security.sql) refuses the connection: checked at every
    /// new connection, so a table that turns it on is caught at the next.
    async fn check_row_security(&self, client: &Conn) -> Result<(), OutboxError> {
        let table = self.base_or_table();
        let row = client
            .query_opt(
                include_str!("../../sql/row_security.sql"),
                &[&table.quoted()],
            )
            .await
            .map_err(query_err("reading the table's row-level security"))?;
        match row.and_then(|row| hidden_by_row_security(&row, table.quoted())) {
            Some(refused) => Err(refused),
            None => Ok(()),
        }
    }

    /// `template` for `table` (its name and its name as a literal).
    fn fill_table(&self, template: &str, table: &TableName) -> Result<String, OutboxError> {
        render(
            template,
            &[
                ("table", Value::Table(table)),
                ("table_literal", Value::TableLiteral(table)),
            ],
        )
        .map_err(OutboxError::Template)
    }
}

/// How a direct connection of the relay's plans its statements, set once for its session. The
/// relay runs a handful of statements hundreds of times a second; planning each afresh cost
/// five times its execution (a claim planned 0.50 ms and ran 0.09 ms, a settlement 0.15 / 0.04
/// ms: issue 27). So they are planned once per connection, generically, and the plan is
/// reused until the table's statistics change (an ANALYZE invalidates it, and the next
/// execution plans it again).
///
/// A generic plan is made without the parameters' values and with whatever statistics the
/// table has at that moment: never analyzed and empty when the relay starts on a new table, a
/// million rows later still unanalyzed. Plans made so once scanned and sorted the whole table
/// for every claim (880 ms at 100k rows) and walked the whole unsent index for every
/// settlement (22–39 ms). The planner switches take those shapes away from the relay's own
/// session, so that what is left is the one shape that is right at any size: a bounded walk of
/// the unsent index in id order (claims, the probe), and primary-key lookups of the ids a
/// claim holds (settlements, a claim's own rows).
/// - `enable_seqscan`, `enable_bitmapscan` off: the outbox is reached through an index, in
///   the index's order, so `ORDER BY id LIMIT $1` stops after $1 entries instead of reading
///   and sorting every unsent row;
/// - `enable_hashjoin`, `enable_mergejoin` off: a join with the outbox is a nested loop of
///   index lookups, never a hash of, or a merge along, its whole primary key (on PostgreSQL
///   18 an analyzed table's claim hashed it whole for the rows of ended claims, on 15 merged
///   along it). The claim's own CTEs are then joined by nested loops too: cheap for the few
///   rows of a plain or fair claim, not for the full ordered claim (see [`CUSTOM_PLANS`]).
/// - The statements reach the rows a claim chose, or a settlement settles, by an id array
///   and test "unsent" as `coalesce(sent_at, quarantined_at) IS NULL`, which matches no
///   partial index: on an empty table the planner otherwise walked a small partial index whole
///   rather than look ids up, and kept that plan for the million rows that came later.
///
/// A switch that is off makes the planner avoid the node where something else can do the
/// work; where nothing else can (sorting a claim's few rows for a window), it still plans it.
/// tests/plans.rs checks each hot statement's generic plan on a never-analyzed table that grew
/// to a million rows, on PostgreSQL 15 and 18.
pub const PLANS: &str = "SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off; \
SET enable_bitmapscan = off; SET enable_hashjoin = off; SET enable_mergejoin = off";

/// For one claim's transaction, what a session had before [`PLANS`]: a plan made with the
/// parameters at every execution, all the planner's choices open. The full ordered claim
/// (sql/claim_ordered.sql) keeps these: its generic plan has the bounded shape too
/// (tests/plans.rs), but joins its own CTEs by nested loops sized for a few rows, and at 5,000
/// unsent rows in 100 groups a claim of 100 took ~95 ms against ~30 ms planned each time.
const CUSTOM_PLANS: &str = "SET LOCAL plan_cache_mode = force_custom_plan; \
SET LOCAL enable_seqscan = on; SET LOCAL enable_bitmapscan = on; \
SET LOCAL enable_hashjoin = on; SET LOCAL enable_mergejoin = on";

/// One of the statements a relay's session prepares.
#[derive(Debug, Clone, Copy)]
pub struct RelayStatement<'a> {
    /// What it is, for a reader: `claim`, `settle`, `probe`, ...
    pub name: &'static str,
    pub sql: &'a str,
    /// It changes rows.
    pub writes: bool,
}

impl Outbox {
    /// The statements a relay's session prepares, in the order `connect` binds them.
    pub fn relay_statements(&self) -> Vec<RelayStatement<'_>> {
        let settle = self.statements().settle(self.acknowledge());
        fn s<'a>(name: &'static str, sql: &'a str, writes: bool) -> RelayStatement<'a> {
            RelayStatement { name, sql, writes }
        }
        vec![
            s("claim_start", &self.statements().claim_start, false),
            s("claim", &self.statements().claim, true),
            s("settle", &settle.full, true),
            s("settle_sent_only", &settle.sent_only, true),
            s("stats", &self.statements().stats, false),
            s("probe", &self.statements().probe, false),
            s(
                "unpark_destination",
                &self.statements().unpark_destination,
                true,
            ),
            s("lost_leases", &self.statements().lost_leases, false),
            s("takeover", &self.statements().takeover, true),
            s("refuse", &self.statements().refuse, true),
        ]
    }
}

impl Outbox {
    /// What a claim's transaction sets before its first statement: the claim's plans made with
    /// its parameters ([`CUSTOM_PLANS`]) for a strategy that needs it, or a claim that catches
    /// up (`catching_up`); nothing otherwise.
    fn claim_settings(&self, catching_up: bool) -> &'static str {
        match catching_up || self.strategy().planned_each_time() {
            true => CUSTOM_PLANS,
            false => "",
        }
    }
}

/// The table's statements ([`super::statements::Statements`]) prepared on this session's
/// connection.
#[derive(Debug)]
struct Prepared {
    /// A claim's first statement: its lock, under its budget (sql/claim_lock.sql,
    /// sql/claim_deadline.sql).
    claim_start: Stmt,
    claim: Stmt,
    /// A claim's outcomes, in the statement of what acknowledged rows become.
    settle: Settle,
    lost_leases: Stmt,
    /// Claims that ended, taken over (sql/takeover.sql).
    takeover: Stmt,
    /// Rows a claim refused, quarantined (sql/refuse.sql).
    refuse: Stmt,
    stats: Stmt,
    probe: Stmt,
    unpark_destination: Stmt,
}

/// One connection with the relay's prepared statements.
#[derive(Debug)]
pub struct Session {
    pub(super) client: Arc<Conn>,
    statements: Prepared,
    /// What a claim's transaction sets before its lock ([`Outbox::claim_settings`]).
    claim_settings: &'static str,
    /// The same for a claim that catches up ([`ClaimRequest::catching_up`]): planned with its
    /// parameters. A claim of hundreds of rows under the generic plan (nested loops over its
    /// own CTEs, sized for a few rows) took 93–112 ms against 41 ms planned with its limit,
    /// and a relay behind saturated writers fell further behind (docs/benchmarks.md); its
    /// 0.5–1.5 ms of planning is spread over those rows.
    catch_up_settings: &'static str,
    /// How `claim` binds its statement's parameters.
    strategy: ClaimStrategy,
    /// The claim's last two parameters.
    limits: ClaimLimits,
    /// Where the claims, the probe and the statistics start (src/outbox/floors.rs): the
    /// table's, shared with the relay's other connections to it.
    floors: Arc<Floors>,
    /// How many acknowledged rows a settlement left unsent (sql/unsettled.sql), and what on
    /// the table can make it so (sql/settlement_blockers.sql): asked only when a settlement
    /// changed fewer rows than it meant to. Unprepared: they run once in a relay's life.
    unsettled: String,
    blockers: String,
}

/// What a committed claim leaves to [`Session::after_claim`]: the rows it refused (too large,
/// out of attempts), and whether it saw claims whose lease ended.
#[derive(Debug, Default)]
pub struct AfterClaim {
    refused: Vec<QuarantinedAtClaim>,
    ended: bool,
    claims_floor: i64,
}

/// What [`Session::after_claim`] did: the refused rows it quarantined and those the
/// quarantine left out, and how many rows its takeover made claimable again.
#[derive(Debug, Default)]
pub struct AfterClaimed {
    pub quarantined: Vec<QuarantinedAtClaim>,
    pub kept: Kept,
    pub freed: u64,
}

impl AfterClaimed {
    /// Into the claim's outcome, where the relay reads it.
    pub fn apply_to(self, claimed: &mut Claimed) {
        claimed.quarantined = self.quarantined;
        claimed.kept = self.kept;
        claimed.freed = self.freed;
    }
}

impl AfterClaim {
    /// Nothing to do after the claim.
    pub fn is_empty(&self) -> bool {
        self.refused.is_empty() && !self.ended
    }
}

impl Session {
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// The connection, for the few statements of other modules that run on it (the
    /// registration's renewal).
    pub(super) fn conn(&self) -> &Conn {
        &self.client
    }

    /// Claims rows as the strategy chooses them, after the table's claim lock, in one
    /// pipelined transaction that commits before this returns. A row whose columns cannot be read comes back among the
    /// claim's rows, marked `unreadable`, instead of failing the claim; one the claim quarantined
    /// (too large, out of attempts) among its `quarantined`, without its payload.
    pub async fn claim(&self, request: &ClaimRequest) -> Result<Claimed, OutboxError> {
        let (mut claimed, after) = self.lease(request).await?;
        self.after_claim(after).await.apply_to(&mut claimed);
        Ok(claimed)
    }

    /// The claim's own transaction, [`Session::claim`]'s first half: the rows it leased, and
    /// what it leaves to [`Session::after_claim`]. The loop runs the two under deadlines of
    /// their own, so that a connection lost after the claim committed costs none of its rows.
    pub async fn lease(
        &self,
        request: &ClaimRequest,
    ) -> Result<(Claimed, AfterClaim), OutboxError> {
        let (claimed, after, _) = self.lease_settling(request, "", &[]).await?;
        Ok((claimed, after))
    }

    /// [`Session::lease`], whose transaction first applies `carried`, settlements of `owner`'s
    /// earlier claims (as [`Session::write_settlement`] would, on its first try): one
    /// transaction and one commit for both. Before the claim, so that it sees the rows the
    /// settlements freed (the next rows of ordered groups), and before its lock: a settlement
    /// never waits on another relay's claim while holding that lock. What each settlement did
    /// comes back in their order; none applied if this fails.
    pub async fn lease_settling(
        &self,
        request: &ClaimRequest,
        owner: &str,
        carried: &[&Settlement],
    ) -> Result<(Claimed, AfterClaim, Vec<Settled>), OutboxError> {
        let read = self.floors.reading();
        let bound = ClaimParams::new(
            request,
            &self.strategy,
            &self.limits,
            (read.rows, self.floors.claims()),
        );
        let settle = SettleArgs::new(self.statements.settle.mode, owner, carried);
        let settle_params = settle.params();
        let before = match carried.iter().all(|s| s.is_empty()) {
            true => None,
            false => Some((self.settle_statement(&settle), &settle_params[..])),
        };
        let (settled, start, rows) = self
            .client
            .query_in_transaction(
                match request.catching_up {
                    true => self.catch_up_settings,
                    false => self.claim_settings,
                },
                before,
                (&self.statements.claim_start, &[bound.claims_floor()]),
                &self.statements.claim,
                &self.strategy.bind(&bound),
            )
            .await
            .map_err(query_err(match before {
                Some(_) => "settling earlier claims and claiming rows",
                None => "claiming rows",
            }))?;
        let settled = match settled.as_deref() {
            Some([row]) => SettleAnswer::read(row).shares(carried),
            _ => Vec::new(),
        };
        let (ended, server_started): (bool, i64) = match start.first() {
            Some(row) => (
                row.try_get("ended")
                    .map_err(query_err("reading whether a claim ended"))?,
                row.try_get("server_started")
                    .map_err(query_err("reading when the server started"))?,
            ),
            None => (false, 0),
        };
        let restarted = self.floors.server_started(server_started);
        if restarted {
            tracing::info!(
                "the database server restarted or another took its place: it may have lost the relay's last claims, so claims read the lease table and the outbox from their start once"
            );
        }
        let mut claimed = Claimed {
            cursor: request.cursor.clone(),
            server: Some(server_started),
            ..Claimed::default()
        };
        let mut turns = Vec::with_capacity(rows.len());
        let mut live_from: Option<i64> = None;
        let mut lowest_unsent: Option<i64> = None;
        let mut highest: Option<i64> = None;
        for row in &rows {
            if self.strategy.returns_cursor() {
                claimed.cursor = row
                    .try_get(CURSOR)
                    .map_err(query_err("reading the claim's cursor"))?;
                // The one row of a claim that took nothing carries only the cursor.
                let id: Option<i64> = row.try_get(0).map_err(query_err("reading a claimed id"))?;
                if id.is_none() {
                    continue;
                }
            }
            let turn: i64 = row
                .try_get(TURN)
                .map_err(query_err("reading a claimed row's turn"))?;
            live_from = row
                .try_get(LIVE_FROM)
                .map_err(query_err("reading the claims' floor"))?;
            lowest_unsent = row
                .try_get(LOWEST_UNSENT)
                .map_err(query_err("reading the rows' floor"))?;
            match decode(row, &self.limits)? {
                Decoded::Row(row) => turns.push((turn, *row)),
                Decoded::Quarantined(row) => claimed.quarantined.push(row),
            }
        }
        // The claim's rows come back in no particular order; the planner keeps a group's rows
        // in the order they are given, so they are given in the group's (`--order-by`).
        turns.sort_unstable_by_key(|(turn, _)| *turn);
        claimed.rows = turns.into_iter().map(|(_, row)| row).collect();
        for id in claimed.rows.iter().map(|r| r.id) {
            highest = highest.max(Some(id));
        }
        // A claim that found the server restarted read from floors that may be wrong.
        if !restarted {
            self.floors.claimed(highest, live_from);
            // Only a claim that took rows says where the unsent ones start: its own are among
            // them.
            if lowest_unsent.is_some() {
                self.floors.raise(read, lowest_unsent);
            }
        }
        let after = AfterClaim {
            refused: std::mem::take(&mut claimed.quarantined),
            ended,
            claims_floor: *bound.claims_floor(),
        };
        Ok((claimed, after, settled))
    }

    /// What follows a committed claim, each in a transaction of its own: the rows it refused
    /// quarantined (those it did quarantine are returned, with those it left out), and the
    /// claims it found ended taken over (how many rows that made claimable). The claim's rows
    /// are leased whatever happens here, so a failure is logged, never returned: a refused row
    /// not quarantined now is refused again by the next claim; a takeover not done now, done
    /// by the next claim that looks. A rule that rewrites the quarantine is returned as
    /// [`Kept::ByRule`], since no retry changes it.
    pub async fn after_claim(&self, after: AfterClaim) -> AfterClaimed {
        let mut done = AfterClaimed::default();
        if !after.refused.is_empty() {
            match self.refuse(after.refused, after.claims_floor).await {
                Ok((quarantined, kept)) => {
                    done.quarantined = quarantined;
                    if !kept.is_empty() {
                        done.kept = Kept::Rows(kept);
                    }
                }
                Err(e) if e.rewritten_by_rule() => done.kept = Kept::ByRule(e.to_string()),
                Err(e) => {
                    tracing::warn!(error = %e, "could not quarantine the rows the claim refused; the next claim refuses them again");
                }
            }
        }
        if after.ended {
            match self.take_over(after.claims_floor).await {
                Ok(f) => done.freed = f,
                Err(e) => {
                    tracing::warn!(error = %e, "could not take over claims whose lease ended; the next claim tries again");
                }
            }
        }
        done
    }

    /// Quarantines the rows a claim refused (sql/refuse.sql), after the claim lock, in a
    /// transaction of its own: returns those it quarantined (a row another relay's claim
    /// leased meanwhile is that claim's), and the ids of those it meant to and left out.
    async fn refuse(
        &self,
        refused: Vec<QuarantinedAtClaim>,
        claims_floor: i64,
    ) -> Result<(Vec<QuarantinedAtClaim>, Vec<i64>), OutboxError> {
        let ids: Vec<i64> = refused.iter().map(|r| r.id).collect();
        let reasons: Vec<&str> = refused.iter().map(|r| r.reason.as_str()).collect();
        let errors: Vec<&str> = refused.iter().map(|r| r.error.as_str()).collect();
        let (_, _, rows) = self
            .client
            .query_in_transaction(
                self.claim_settings,
                None,
                (&self.statements.claim_start, &[&claims_floor]),
                &self.statements.refuse,
                &[&ids, &reasons, &errors, &claims_floor],
            )
            .await
            .map_err(query_err("quarantining rows the claim refused"))?;
        let context = "reading what the quarantine of refused rows changed";
        let (quarantined, kept): (Vec<i64>, Vec<i64>) = match rows.first() {
            Some(row) => (
                row.try_get("quarantined").map_err(query_err(context))?,
                row.try_get("kept").map_err(query_err(context))?,
            ),
            None => (Vec::new(), Vec::new()),
        };
        let quarantined: std::collections::HashSet<i64> = quarantined.into_iter().collect();
        let quarantined = refused
            .into_iter()
            .filter(|r| quarantined.contains(&r.id))
            .collect();
        Ok((quarantined, kept))
    }

    /// Takes over the claims that ended (sql/takeover.sql): how many rows it made claimable
    /// again. Its own transaction, after the claim that found them committed.
    async fn take_over(&self, claims_floor: i64) -> Result<u64, OutboxError> {
        let row = self
            .client
            .query_one(&self.statements.takeover, &[&claims_floor])
            .await
            .map_err(query_err("taking over claims that ended"))?;
        let (claims, rows): (i64, i64) = (row.get("claims"), row.get("rows"));
        if claims > 0 {
            tracing::info!(
                claims,
                rows,
                "took over claims whose lease ended: their rows are claimable again"
            );
        }
        Ok(rows as u64)
    }

    /// Applies a claim's outcomes in one statement, fenced by the claim's row (owner and
    /// token), which it removes. A settlement is a whole claim's: rows of the claim it does not
    /// mention are free for the next claim at once, their attempt not counted. `retry`: an
    /// earlier try of this settlement may have applied already, its answer lost with the
    /// connection.
    pub async fn write_settlement(
        &self,
        owner: &str,
        s: &Settlement,
        retry: bool,
    ) -> Result<Settled, OutboxError> {
        if s.is_empty() {
            return Ok(Settled::default());
        }
        let mode = self.statements.settle.mode;
        let args = SettleArgs::new(mode, owner, &[s]);
        let row = self
            .client
            .query_one(self.settle_statement(&args), &args.params())
            .await
            .map_err(query_err(mode.context()))?;
        let answer = SettleAnswer::read(&row);
        let mut settled = answer.shares(&[s]).remove(0);
        if retry && settled.lost > 0 {
            // Nothing else removes a claim's row while its lease lasts but a claim after it
            // ended; after a retry, the first try may have removed it, and settled its rows.
            settled.lost = self.lost_leases(&s.without_claims(&answer.fenced)).await?;
        }
        Ok(settled)
    }

    /// The statement that applies `args`: the cheaper one when every row was acknowledged.
    fn settle_statement(&self, args: &SettleArgs) -> &Stmt {
        match args.others() {
            true => &self.statements.settle.full,
            false => &self.statements.settle.sent_only,
        }
    }

    /// Of the acknowledged `ids`, how many are still unsent.
    pub async fn unsettled(&self, ids: &[i64]) -> Result<u64, OutboxError> {
        let row = self
            .client
            .query_one(&self.unsettled, &[&ids])
            .await
            .map_err(query_err(
                "looking for acknowledged rows the settlement left unsent",
            ))?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    /// What on the table can make a settlement change nothing: one line per trigger, rule or
    /// row-level security that applies (sql/settlement_blockers.sql).
    pub async fn settlement_blockers(&self) -> Result<Vec<String>, OutboxError> {
        let rows = self
            .client
            .query(&self.blockers, &[])
            .await
            .map_err(query_err("looking for what undoes the relay's settlements"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Of a retried settlement whose claim is gone, how many rows another claim holds. The
    /// others were settled by its first try, or are free again and not anyone's yet.
    async fn lost_leases(&self, ids: &[i64]) -> Result<u64, OutboxError> {
        let row = self
            .client
            .query_one(&self.statements.lost_leases, &[&ids])
            .await
            .map_err(query_err("looking for rows taken over by another owner"))?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    /// Whether a claim now would find a row: a read-only look that takes no lock, for an
    /// idle relay to decide whether to claim.
    pub async fn probe(&self) -> Result<bool, OutboxError> {
        let (floor, claims_floor) = (self.floors.rows(), self.floors.claims());
        let row = self
            .client
            .query_one(&self.statements.probe, &[&floor, &claims_floor])
            .await
            .map_err(query_err("looking for claimable rows"))?;
        Ok(row.get(0))
    }

    /// The server's own address and port as it sees them, for messages naming the host that
    /// refused us; `None` over a Unix socket or when it does not say.
    pub async fn server_address(&self) -> Option<String> {
        let row = self
            .client
            .query_one(
                "SELECT host(inet_server_addr()) || ':' || inet_server_port()",
                &[],
            )
            .await
            .ok()?;
        row.get(0)
    }

    /// Whether the server is a standby; `None` when it does not say.
    pub async fn in_recovery(&self) -> Option<bool> {
        let row = self
            .client
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await
            .ok()?;
        row.get(0)
    }

    /// Gauges for `/metrics`, from partial indexes only; the relay reads them on its
    /// maintenance connection (`Maintenance::stats`).
    pub async fn stats(&self) -> Result<Stats, OutboxError> {
        let read = self.floors.reading();
        let row = self
            .client
            .query_one(&self.statements.stats, &[&STATS_EXACT_UP_TO, &read.rows])
            .await
            .map_err(query_err("reading outbox statistics"))?;
        let stats = Stats::from_row(&row, STATS_EXACT_UP_TO);
        self.floors.raise(read, stats.lowest_unsent());
        Ok(stats)
    }

    /// Makes up to `UNPARK_BATCH` rows parked for their destination unsent again once their
    /// time has come; returns how many.
    pub async fn unpark_destinations(&self) -> Result<u64, OutboxError> {
        self.client
            .execute(&self.statements.unpark_destination, &[&UNPARK_BATCH])
            .await
            .map_err(query_err("unparking rows whose destination is due a retry"))
    }
}

/// An acknowledgement mode with its settlement statements, prepared once per session.
#[derive(Debug)]
struct Settle {
    /// Which parameters the statements take.
    mode: Acknowledge,
    /// `mode`'s statement for every kind of outcome, prepared.
    full: Stmt,
    /// The same for a claim whose rows were all acknowledged.
    sent_only: Stmt,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_claim_with_a_deadline_gives_the_server_less_than_the_relay_waits() {
        let outbox = Outbox::new(
            "postgres://u:p@127.0.0.1:5/db",
            "outbox".parse().unwrap(),
            Duration::from_secs(1),
        )
        .unwrap();
        let plain = &outbox.statements().claim_start;
        assert!(
            plain.contains(outbox.statements().claim_lock.trim_end()),
            "{plain}"
        );
        assert!(plain.contains("AS ended"), "{plain}");
        assert!(!plain.contains("timeout"), "{plain}");
        let timed = outbox.round_trip_deadline(Duration::from_secs(2));
        let start = &timed.statements().claim_start;
        assert!(
            start.contains("set_config('lock_timeout', '1500', true)"),
            "{start}"
        );
        assert!(start.contains("pg_advisory_xact_lock"), "{start}");
        assert!(start.contains("AS ended"), "{start}");
        assert!(
            start
                .contains("greatest(1, 1500 - floor(extract(epoch FROM clock_timestamp() - now())"),
            "{start}"
        );
        // One statement: prepared once, never parsed again.
        let code: String = start
            .lines()
            .map(|l| l.split("--").next().unwrap())
            .collect();
        assert!(!code.contains(';'), "{start}");
        assert!(
            super::super::statements::claim_budget(Duration::from_millis(1))
                < Duration::from_millis(1)
        );
    }

    #[test]
    fn only_the_full_ordered_claim_is_planned_at_every_execution() {
        use super::super::claim::{OrderScope, Ordered};
        let outbox = |strategy| {
            Outbox::new(
                "postgres://u:p@127.0.0.1:5/db",
                "outbox".parse().unwrap(),
                Duration::from_secs(1),
            )
            .unwrap()
            .claim_strategy(strategy)
            .unwrap()
        };
        let ordered = |scope| Ordered {
            key: crate::row::KeyColumn::AggregateId,
            routing: Default::default(),
            skip_poison: false,
            scope,
            by: Default::default(),
        };
        let full = outbox(ClaimStrategy::Ordered(ordered(OrderScope::Every)));
        assert_eq!(full.claim_settings(false), CUSTOM_PLANS);
        assert_eq!(full.claim_settings(true), CUSTOM_PLANS);
        let fifo_only = ordered(OrderScope::FifoDestinations {
            route_by: crate::row::KeyColumn::AggregateType,
            fifo_routes: vec![],
        });
        for strategy in [ClaimStrategy::Plain, ClaimStrategy::Ordered(fifo_only)] {
            let outbox = outbox(strategy);
            assert_eq!(outbox.claim_settings(false), "");
            // A claim that catches up is planned with its parameters whatever the strategy.
            assert_eq!(outbox.claim_settings(true), CUSTOM_PLANS);
        }
    }

    #[test]
    fn each_acknowledgement_mode_names_its_own_statement() {
        let outbox = |delete: bool| {
            Outbox::new(
                "postgres://u:p@127.0.0.1:5/db",
                "outbox".parse().unwrap(),
                Duration::from_secs(1),
            )
            .unwrap()
            .delete_on_ack(delete)
        };
        let kept = outbox(false);
        assert_eq!(kept.acknowledge(), Acknowledge::MarkSent);
        assert!(kept
            .statements()
            .settle(kept.acknowledge())
            .sent_only
            .contains("SET sent_at = now()"));
        let deleted = outbox(true);
        assert_eq!(deleted.acknowledge(), Acknowledge::Delete);
        assert!(deleted
            .statements()
            .settle(deleted.acknowledge())
            .sent_only
            .contains("DELETE FROM \"outbox\""));
    }
}
