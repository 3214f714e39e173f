//! The relay's statements as the database counts them: `pg_stat_statements` (with
//! `track_planning = on`, `track = all`), reset at the start of a measured window and read at
//! its end, for the `rates` group.
//!
//! The relay connects as a login role of its own, [`RELAY_ROLE`] (a superuser, as the
//! `postgres` role the other groups' relays use), so its statements are told from the
//! writers' and the benchmark's by `userid` whatever their text; the text only says which
//! part of the relay's cycle each is ([`kind`]), and a statement that fits none is counted
//! as `other`, so a change of the relay's SQL shows there instead of vanishing.

use serde_json::{json, Value};

/// The relay's own login role in the `rates` group's cluster.
pub const RELAY_ROLE: &str = "bench_relay";

/// Which part of the relay's cycle a statement is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The statement that leases rows (it inserts the claim's row into the lease table):
    /// one call is one claim.
    Claim,
    /// The rest of a claim's cycle besides the leasing statement (the first statement of its
    /// transaction, with the advisory lock that serializes claims; a takeover of claims that
    /// ended): its time is the claim's, its calls are not claims.
    ClaimStep,
    /// A transaction's BEGIN: one call is one transaction of several statements.
    Begin,
    /// A settlement: deletes a claim's row of the lease table (its fence) without leasing.
    Settlement,
    /// The idle relay's look for work (`SELECT EXISTS (…)`).
    Probe,
    /// Everything else: BEGIN/COMMIT, session settings, gauges, maintenance.
    Other,
}

/// What `query` (pg_stat_statements' normalized text, comments included) is, from its text
/// with `--` comments removed: the lease table is `<table>_claims`.
pub fn kind(query: &str) -> Kind {
    let text: String = query
        .lines()
        .map(|l| l.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase();
    let leases = text.contains("_claims");
    if text.contains("pg_advisory_xact_lock") {
        Kind::ClaimStep
    } else if leases && text.contains("insert into") {
        Kind::Claim
    } else if leases && text.contains("delete from") && text.contains("until < now()") {
        Kind::ClaimStep
    } else if text.trim_start().starts_with("begin") {
        Kind::Begin
    } else if leases && text.contains("delete from") {
        Kind::Settlement
    } else if text.trim_start().starts_with("select exists") {
        Kind::Probe
    } else {
        Kind::Other
    }
}

/// Sums over the statements of one kind.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    /// Executions.
    pub calls: f64,
    /// Times planned (fewer than `calls` where a cached plan was reused).
    pub plans: f64,
    /// Rows returned or changed.
    pub rows: f64,
    /// Planning time, milliseconds.
    pub plan_ms: f64,
    /// Execution time, milliseconds.
    pub exec_ms: f64,
}

impl Totals {
    fn add(&mut self, other: &Totals) {
        self.calls += other.calls;
        self.plans += other.plans;
        self.rows += other.rows;
        self.plan_ms += other.plan_ms;
        self.exec_ms += other.exec_ms;
    }

    fn to_json(self) -> Value {
        json!({
            "calls": self.calls,
            "plans": self.plans,
            "rows": self.rows,
            "plan_ms": self.plan_ms,
            "exec_ms": self.exec_ms,
        })
    }
}

/// The relay's statements over one window, by kind.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RelayStatements {
    /// The leasing statements: calls are claims, rows the events they took.
    pub claim: Totals,
    /// The statements run in a claim's transaction before it.
    pub claim_steps: Totals,
    /// Settlements.
    pub settlement: Totals,
    /// Idle probes.
    pub probe: Totals,
    /// Transactions' BEGINs.
    pub begins: Totals,
    /// Everything else the relay ran.
    pub other: Totals,
    /// The three costliest `other` statements (plan + execution), their text shortened: what
    /// to look at when `other` grows or a change of the relay's SQL escaped [`kind`].
    pub top_other: Vec<(String, f64)>,
    /// Settlements written as statements of their own over the window (the relay's
    /// `outbox_settlements_total{written="alone"}`), where the relay says: the rest ran in a
    /// claim's transaction. `None`: every settlement was a transaction of its own.
    pub settlements_alone: Option<f64>,
}

impl RelayStatements {
    /// Adds one pg_stat_statements row of the relay's.
    pub fn add(&mut self, query: &str, row: Totals) {
        match kind(query) {
            Kind::Claim => self.claim.add(&row),
            Kind::ClaimStep => self.claim_steps.add(&row),
            Kind::Settlement => self.settlement.add(&row),
            Kind::Probe => self.probe.add(&row),
            Kind::Begin => self.begins.add(&row),
            Kind::Other => {
                self.other.add(&row);
                let short: String = query.split_whitespace().collect::<Vec<_>>().join(" ");
                let short: String = short.chars().take(80).collect();
                self.top_other.push((short, row.plan_ms + row.exec_ms));
                self.top_other.sort_by(|a, b| b.1.total_cmp(&a.1));
                self.top_other.truncate(3);
            }
        }
    }

    /// Planning and execution of a claim, milliseconds per claim: the leasing statement and
    /// the steps before it in its transaction.
    pub fn per_claim_ms(&self) -> (f64, f64) {
        let n = self.claim.calls;
        (
            (self.claim.plan_ms + self.claim_steps.plan_ms) / n,
            (self.claim.exec_ms + self.claim_steps.exec_ms) / n,
        )
    }

    /// Planning and execution per settlement, milliseconds.
    pub fn per_settlement_ms(&self) -> (f64, f64) {
        let n = self.settlement.calls;
        (self.settlement.plan_ms / n, self.settlement.exec_ms / n)
    }

    /// Events per claim: rows the leasing statements returned over their calls (empty claims
    /// included).
    pub fn events_per_claim(&self) -> f64 {
        self.claim.rows / self.claim.calls
    }

    /// Statements per claim cycle: every statement of the relay's (its gauges and maintenance
    /// included, a few a second) over the claims.
    pub fn statements_per_claim(&self) -> f64 {
        self.calls() / self.claim.calls
    }

    /// Transactions per claim cycle: the ones with a BEGIN (a claim's, with the settlements
    /// it carries), and the statements a cycle runs on their own on a direct connection
    /// (settlements no claim carried, probes), over the claims.
    pub fn transactions_per_claim(&self) -> f64 {
        let alone = self.settlements_alone.unwrap_or(self.settlement.calls);
        (self.begins.calls + alone + self.probe.calls) / self.claim.calls
    }

    /// Executions of every statement of the relay's.
    pub fn calls(&self) -> f64 {
        [
            self.claim,
            self.claim_steps,
            self.settlement,
            self.probe,
            self.begins,
            self.other,
        ]
        .iter()
        .map(|t| t.calls)
        .sum()
    }

    /// Plan + execution time of every statement of the relay's, milliseconds.
    pub fn total_ms(&self) -> f64 {
        [
            self.claim,
            self.claim_steps,
            self.settlement,
            self.probe,
            self.begins,
            self.other,
        ]
        .iter()
        .map(|t| t.plan_ms + t.exec_ms)
        .sum()
    }

    pub fn to_json(&self) -> Value {
        let (claim_plan, claim_exec) = self.per_claim_ms();
        let (settle_plan, settle_exec) = self.per_settlement_ms();
        let finite = |v: f64| v.is_finite().then_some(v);
        json!({
            "claim": self.claim.to_json(),
            "claim_steps": self.claim_steps.to_json(),
            "settlement": self.settlement.to_json(),
            "probe": self.probe.to_json(),
            "begins": self.begins.to_json(),
            "other": self.other.to_json(),
            "statements_per_claim": finite(self.statements_per_claim()),
            "transactions_per_claim": finite(self.transactions_per_claim()),
            "settlements_alone": self.settlements_alone,
            "other_costliest": self.top_other.iter().map(|(q, ms)| json!({"query": q, "ms": ms})).collect::<Vec<_>>(),
            "events_per_claim": finite(self.events_per_claim()),
            "claim_plan_ms": finite(claim_plan),
            "claim_exec_ms": finite(claim_exec),
            "settlement_plan_ms": finite(settle_plan),
            "settlement_exec_ms": finite(settle_exec),
            "all_statements_ms": self.total_ms(),
        })
    }
}

/// Forgets what pg_stat_statements has counted so far (a window starts).
pub async fn reset(client: &tokio_postgres::Client) {
    client
        .execute("SELECT pg_stat_statements_reset()", &[])
        .await
        .expect("reset pg_stat_statements");
}

/// The relay role's statements in the current database since the last [`reset`].
pub async fn read(client: &tokio_postgres::Client) -> RelayStatements {
    let mut statements = RelayStatements::default();
    for (query, totals) in read_each(client).await {
        statements.add(&query, totals);
    }
    statements
}

/// The same, one entry per statement (its normalized text), for a caller that needs to know
/// which statement took the time.
pub async fn read_each(client: &tokio_postgres::Client) -> Vec<(String, Totals)> {
    let rows = client
        .query(
            "SELECT s.query, s.calls::float8, s.plans::float8, s.rows::float8, \
                    s.total_plan_time, s.total_exec_time \
             FROM pg_stat_statements AS s \
             JOIN pg_roles AS r ON r.oid = s.userid \
             JOIN pg_database AS d ON d.oid = s.dbid \
             WHERE r.rolname = $1 AND d.datname = current_database()",
            &[&RELAY_ROLE],
        )
        .await
        .expect("read pg_stat_statements");
    rows.iter()
        .map(|row| {
            (
                row.get(0),
                Totals {
                    calls: row.get(1),
                    plans: row.get(2),
                    rows: row.get(3),
                    plan_ms: row.get(4),
                    exec_ms: row.get(5),
                },
            )
        })
        .collect()
}

/// Which of the relay's SQL files (`sql/*.sql`, given as (name, text)) a statement was made
/// from: the one whose first line (each opens with a comment of its own) is on the
/// statement's first line (a claim opens with `WITH ` and then its candidates' file); a
/// statement with none there (BEGIN, SET, COMMIT) is named by its first 60 characters.
pub fn source(query: &str, files: &[(String, String)]) -> String {
    let first = query.lines().next().unwrap_or("").trim();
    files
        .iter()
        .find(|(_, text)| {
            let opening = text.lines().next().unwrap_or("").trim();
            !opening.is_empty() && first.contains(opening)
        })
        .map(|(name, _)| format!("sql/{name}"))
        .unwrap_or_else(|| {
            query
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .chars()
                .take(60)
                .collect()
        })
}

/// The relay's SQL files, (file name, text), from the checkout the benchmark was built in.
pub fn sql_files() -> Vec<(String, String)> {
    let dir = crate::support::repo_root().join("sql");
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_str()?.to_string();
                    name.ends_with(".sql")
                        .then(|| Some((name, std::fs::read_to_string(e.path()).ok()?)))?
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

// Run by selftest.rs (`cargo test --bench relay`): the bench has no libtest harness.
pub mod tests {
    use super::*;

    pub fn statements_are_told_apart_by_what_they_do_to_the_lease_table() {
        let lock = "-- serialize\nSELECT pg_advisory_xact_lock($1, $2::regclass::oid::int)";
        assert_eq!(kind(lock), Kind::ClaimStep);
        let claim = "WITH expired AS (\n DELETE FROM \"public\".\"outbox_claims\" AS l WHERE l.until < now()),\n\
                     lease AS (\n INSERT INTO \"public\".\"outbox_claims\" (owner, until, ids) SELECT $2)\nSELECT 1";
        assert_eq!(kind(claim), Kind::Claim);
        let settle = "-- not an insert into the lease table: only a DELETE\nWITH fence AS (\n DELETE FROM \"public\".\"outbox_claims\" AS l)\n DELETE FROM \"public\".\"outbox\"";
        assert_eq!(kind(settle), Kind::Settlement);
        let probe = "-- the idle look\nSELECT EXISTS (\n SELECT 1 FROM \"public\".\"outbox\" WHERE id NOT IN (SELECT unnest(l.ids) FROM \"public\".\"outbox_claims\" AS l))";
        assert_eq!(kind(probe), Kind::Probe);
        assert_eq!(kind("BEGIN ISOLATION LEVEL READ COMMITTED"), Kind::Other);
        assert_eq!(kind("COMMIT"), Kind::Other);
    }

    pub fn statements_are_named_by_the_sql_file_they_open_with() {
        let files = vec![
            (
                "sweep.sql".to_string(),
                "-- The floors' safety net\nSELECT 1".to_string(),
            ),
            ("empty.sql".to_string(), "\nSELECT 2".to_string()),
        ];
        assert_eq!(
            source("-- The floors' safety net\nSELECT 1", &files),
            "sql/sweep.sql"
        );
        assert_eq!(
            source("WITH -- The floors' safety net\nx AS (SELECT 1)", &files),
            "sql/sweep.sql"
        );
        assert_eq!(
            source("BEGIN   ISOLATION LEVEL\nREAD COMMITTED", &files),
            "BEGIN ISOLATION LEVEL READ COMMITTED"
        );
        assert_eq!(source("", &files), "");
    }

    pub fn per_claim_figures_include_the_claims_steps() {
        let mut s = RelayStatements::default();
        let t = |calls: f64, rows: f64, plan_ms: f64, exec_ms: f64| Totals {
            calls,
            plans: calls,
            rows,
            plan_ms,
            exec_ms,
        };
        s.add("INSERT INTO outbox_claims", t(10.0, 15.0, 5.0, 1.0));
        s.add(
            "SELECT pg_advisory_xact_lock(1, 2)",
            t(10.0, 10.0, 0.5, 0.2),
        );
        s.add("DELETE FROM outbox_claims", t(8.0, 8.0, 1.2, 0.4));
        s.add("COMMIT", t(18.0, 0.0, 0.0, 0.9));
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        let ((plan, exec), (settle_plan, settle_exec)) = (s.per_claim_ms(), s.per_settlement_ms());
        assert!(close(plan, 0.55) && close(exec, 0.12), "{plan} {exec}");
        assert!(close(settle_plan, 0.15) && close(settle_exec, 0.05));
        assert!(close(s.events_per_claim(), 1.5));
        assert!(close(s.total_ms(), 9.2));
        assert!(close(s.calls(), 46.0));
        assert_eq!(s.top_other.len(), 1);
        assert!(RelayStatements::default().per_claim_ms().0.is_nan());
    }
}
