//! The settlement statement, whole: sql/settle.sql with its acknowledgement part
//! (sql/settle_mark.sql or sql/settle_delete.sql) and, for a claim with rows given back or
//! parked, sql/settle_others.sql. Its `$n` layout, the arguments a settlement binds and the
//! answer it reads live here together, so the text, the binding and the reading cannot drift
//! apart; a session checks the prepared statement's parameter count against
//! [`Acknowledge::param_count`] when it connects.
//!
//! Parameters, in order:
//! - `$1` the relay (the claims' owner), `$2` the claims' tokens (the fence), `$3` the ids of
//!   the rows acknowledged;
//! - with rows given back or parked: `$4..$7` given back (id, delay, error, refund) and
//!   `$8..$11` parked (id, reason, error, delay);
//! - marking rows sent: the acknowledged rows' message ids;
//! - last, when the server the claims were made on started (`Settlement::server`; null: any)
//!   and their lease, in seconds: on a server that started since, a settlement applies only to
//!   a claim that was there before it started (one that survived a clean restart), never to
//!   one made since under the same token.
//!
//! Its one row answers: the tokens of the claims it fenced, how many acknowledged rows it
//! settled, the ids it gave back and the ids it parked.

use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::ident::TableName;
use super::template::{render, Value};
use crate::row::{Settled, Settlement};

/// `$1..$3`: the owner, the fence's tokens, the acknowledged ids.
const FENCED_AND_ACKNOWLEDGED: usize = 3;

/// `$4..$11`: the rows given back and the rows parked, four arrays each.
const GIVEN_BACK_AND_PARKED: usize = 8;

/// What becomes of a row its destination acknowledged. A mode, not a flag: each names its
/// statement and binds that statement's parameters, so the two cannot be paired wrongly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acknowledge {
    /// sql/settle_mark.sql: the row stays, with its message id, until retention deletes it.
    MarkSent,
    /// sql/settle_delete.sql (`--retention 0`): no history, but no bloat and the cheapest
    /// settlement.
    Delete,
}

impl Acknowledge {
    /// How many parameters this mode's statement takes, with or without the rows given back
    /// and parked.
    pub(super) fn param_count(self, others: bool) -> usize {
        self.message_ids(others) + 2
    }

    /// The last of the parameters before the server's start: the message ids' when marking.
    fn message_ids(self, others: bool) -> usize {
        let before = FENCED_AND_ACKNOWLEDGED + if others { GIVEN_BACK_AND_PARKED } else { 0 };
        match self {
            Acknowledge::MarkSent => before + 1,
            Acknowledge::Delete => before,
        }
    }

    /// What a failed settlement was doing, for its error.
    pub(super) fn context(self) -> &'static str {
        match self {
            Acknowledge::MarkSent => "recording outcomes (marking rows sent)",
            Acknowledge::Delete => "recording outcomes (deleting acknowledged rows)",
        }
    }

    fn template(self) -> &'static str {
        match self {
            Acknowledge::MarkSent => include_str!("../../sql/settle_mark.sql"),
            Acknowledge::Delete => include_str!("../../sql/settle_delete.sql"),
        }
    }
}

/// One acknowledgement mode's settlement statements.
#[derive(Debug)]
pub(super) struct SettleSql {
    /// Every kind of outcome.
    pub(super) full: String,
    /// Every row acknowledged (the usual settlement): the same without the given-back and
    /// parked parts, a cheaper plan.
    pub(super) sent_only: String,
}

impl SettleSql {
    /// `mode`'s statements for `table`.
    pub(super) fn render(table: &TableName, mode: Acknowledge) -> Result<SettleSql, String> {
        let others = format!(
            ",\n{}",
            render(
                include_str!("../../sql/settle_others.sql"),
                &[("table", Value::Table(table))]
            )?
            .trim_end()
        );
        let returned = |cte| format!("ARRAY(SELECT id FROM {cte})");
        let none = "'{}'::bigint[]";
        Ok(SettleSql {
            full: statement(
                table,
                mode,
                true,
                &others,
                [&returned("rescheduled"), &returned("quarantined")],
            )?,
            sent_only: statement(table, mode, false, "", [none, none])?,
        })
    }
}

/// sql/settle.sql with `mode`'s part, and `others` (sql/settle_others.sql or nothing);
/// `answered` is what it returns of the rows given back and parked.
fn statement(
    table: &TableName,
    mode: Acknowledge,
    with_others: bool,
    others: &str,
    [rescheduled, quarantined]: [&str; 2],
) -> Result<String, String> {
    // The message ids and the server's start come last, after whichever parameters the
    // statement takes.
    let message_ids = format!("${}", mode.message_ids(with_others));
    let server = format!("${}", mode.message_ids(with_others) + 1);
    let lease = format!("${}", mode.param_count(with_others));
    let acknowledge = render(
        mode.template(),
        &[
            ("table", Value::Table(table)),
            ("message_ids", Value::Sql(&message_ids)),
        ],
    )?;
    render(
        include_str!("../../sql/settle.sql"),
        &[
            ("table", Value::Table(table)),
            ("claims", Value::Table(&table.claims())),
            ("server", Value::Sql(&server)),
            ("lease", Value::Sql(&lease)),
            ("acknowledge", Value::Sql(&acknowledge)),
            ("others", Value::Sql(others)),
            ("rescheduled", Value::Sql(rescheduled)),
            ("quarantined", Value::Sql(quarantined)),
        ],
    )
}

/// A settlement's arguments, in the columns the statement takes them as.
pub(super) struct SettleArgs<'a> {
    mode: Acknowledge,
    owner: &'a str,
    tokens: Vec<i64>,
    sent_ids: Vec<i64>,
    message_ids: Vec<&'a str>,
    /// Whether any row was given back or parked: then the full statement, else the cheaper one.
    others: bool,
    rescheduled_ids: Vec<i64>,
    delays: Vec<f64>,
    errors: Vec<Option<&'a str>>,
    refunds: Vec<i32>,
    quarantined_ids: Vec<i64>,
    reasons: Vec<&'a str>,
    q_errors: Vec<&'a str>,
    q_delays: Vec<Option<f64>>,
    server: Option<i64>,
    lease: f64,
}

impl<'a> SettleArgs<'a> {
    /// The arguments that settle `parts` (each a claim's outcomes, or several claims') in one
    /// statement: each outcome's rows one after the other, every claim's token once.
    /// The parts' claims were all made on one server (`Settlement::server`), with one lease.
    pub(super) fn new(mode: Acknowledge, owner: &'a str, parts: &[&'a Settlement]) -> Self {
        debug_assert!(parts
            .windows(2)
            .all(|w| (w[0].server, w[0].lease) == (w[1].server, w[1].lease)));
        let sent = || parts.iter().flat_map(|s| &s.sent);
        let r = || parts.iter().flat_map(|s| &s.reschedule);
        let q = || parts.iter().flat_map(|s| &s.quarantine);
        let mut tokens: Vec<i64> = parts.iter().flat_map(|s| s.tokens()).collect();
        tokens.sort_unstable();
        tokens.dedup();
        SettleArgs {
            mode,
            owner,
            tokens,
            sent_ids: sent().map(|r| r.id).collect(),
            message_ids: sent().map(|r| r.message_id.as_str()).collect(),
            others: r().next().is_some() || q().next().is_some(),
            rescheduled_ids: r().map(|r| r.id).collect(),
            delays: r().map(|r| r.delay.as_secs_f64()).collect(),
            errors: r().map(|r| r.error.as_deref()).collect(),
            refunds: r().map(|r| i32::from(r.refund)).collect(),
            quarantined_ids: q().map(|r| r.id).collect(),
            reasons: q().map(|r| r.reason.as_str()).collect(),
            q_errors: q().map(|r| r.error.as_str()).collect(),
            q_delays: q().map(|r| r.retry_in.map(|d| d.as_secs_f64())).collect(),
            server: parts.first().and_then(|s| s.server),
            lease: parts.first().map_or(0.0, |s| s.lease.as_secs_f64()),
        }
    }

    /// Whether the full statement is needed (rows given back or parked).
    pub(super) fn others(&self) -> bool {
        self.others
    }

    /// The parameters, in the statement's order.
    pub(super) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&self.owner, &self.tokens, &self.sent_ids];
        if self.others {
            params.extend([
                &self.rescheduled_ids as &(dyn ToSql + Sync),
                &self.delays,
                &self.errors,
                &self.refunds,
                &self.quarantined_ids,
                &self.reasons,
                &self.q_errors,
                &self.q_delays,
            ]);
        }
        if self.mode == Acknowledge::MarkSent {
            params.push(&self.message_ids);
        }
        params.push(&self.server);
        params.push(&self.lease);
        debug_assert_eq!(params.len(), self.mode.param_count(self.others));
        params
    }
}

/// The statement's answer.
pub(super) struct SettleAnswer {
    /// The tokens of the claims the fence found (and deleted).
    pub(super) fenced: Vec<i64>,
    /// How many acknowledged rows it settled.
    pub(super) sent: i64,
    pub(super) rescheduled: Vec<i64>,
    pub(super) quarantined: Vec<i64>,
}

impl SettleAnswer {
    pub(super) fn read(row: &Row) -> SettleAnswer {
        SettleAnswer {
            fenced: row.get(0),
            sent: row.get(1),
            rescheduled: row.get(2),
            quarantined: row.get(3),
        }
    }

    /// What the statement did to each of `parts`, the settlements it applied together, in
    /// their order; a row of a claim the fence did not find counts as lost (the caller asks
    /// again after a retry, whose first try may have settled it).
    ///
    /// The statement counts the acknowledged rows it changed, not which: the count is shared
    /// out in order, and when it falls short of the rows acknowledged under claims the fence
    /// found, every part's are suspect, since any part's may be the ones left unsent.
    pub(super) fn shares(&self, parts: &[&Settlement]) -> Vec<Settled> {
        let acknowledged: Vec<Vec<i64>> = parts
            .iter()
            .map(|s| {
                s.sent
                    .iter()
                    .filter(|r| self.fenced.contains(&r.lease_token))
                    .map(|r| r.id)
                    .collect()
            })
            .collect();
        let total: usize = acknowledged.iter().map(Vec::len).sum();
        let short = (self.sent.max(0) as usize) < total;
        let mut sent_left = self.sent.max(0) as u64;
        parts
            .iter()
            .zip(acknowledged)
            .map(|(s, acknowledged)| {
                let sent = sent_left.min(acknowledged.len() as u64);
                sent_left -= sent;
                Settled {
                    sent,
                    rescheduled: s
                        .reschedule
                        .iter()
                        .filter(|r| self.rescheduled.contains(&r.id))
                        .count() as u64,
                    quarantined_reasons: s
                        .quarantine
                        .iter()
                        .filter(|r| self.quarantined.contains(&r.id))
                        .map(|r| r.reason)
                        .collect(),
                    lost: s.without_claims(&self.fenced).len() as u64,
                    suspect: match short {
                        true => acknowledged,
                        false => Vec::new(),
                    },
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::{QuarantineReason, QuarantinedRow, SentRow};

    /// One claim's outcomes: `sent` acknowledged, `parked` quarantined, under `token`.
    fn part(token: i64, sent: &[i64], parked: &[i64]) -> Settlement {
        Settlement {
            sent: sent
                .iter()
                .map(|&id| SentRow {
                    id,
                    lease_token: token,
                    message_id: format!("m{id}"),
                })
                .collect(),
            quarantine: parked
                .iter()
                .map(|&id| QuarantinedRow {
                    id,
                    lease_token: token,
                    reason: QuarantineReason::Invalid,
                    error: "bad".into(),
                    retry_in: None,
                })
                .collect(),
            ..Settlement::default()
        }
    }

    #[test]
    fn claims_settled_together_each_get_their_own_rows_back() {
        let (a, b) = (part(1, &[10, 11], &[12]), part(2, &[20], &[]));
        let args = SettleArgs::new(Acknowledge::Delete, "relay", &[&a, &b]);
        assert_eq!(args.tokens, [1, 2]);
        assert_eq!(args.sent_ids, [10, 11, 20]);
        assert!(args.others());
        let answer = SettleAnswer {
            fenced: vec![1, 2],
            sent: 3,
            rescheduled: vec![],
            quarantined: vec![12],
        };
        let shares = answer.shares(&[&a, &b]);
        assert_eq!((shares[0].sent, shares[1].sent), (2, 1));
        assert_eq!(shares[0].quarantined_reasons, [QuarantineReason::Invalid]);
        assert!(shares[1].quarantined_reasons.is_empty());
        assert!(shares.iter().all(|s| s.suspect.is_empty() && s.lost == 0));
    }

    #[test]
    fn a_short_count_makes_every_claims_rows_suspect_and_a_claim_not_fenced_lost() {
        let (a, b, c) = (
            part(1, &[10], &[]),
            part(2, &[20, 21], &[]),
            part(3, &[30], &[]),
        );
        // Claim 3 was taken over; of the other three acknowledged rows one stayed unsent, and
        // the count cannot say whose.
        let answer = SettleAnswer {
            fenced: vec![1, 2],
            sent: 2,
            rescheduled: vec![],
            quarantined: vec![],
        };
        let shares = answer.shares(&[&a, &b, &c]);
        assert_eq!(shares[0].suspect, [10]);
        assert_eq!(shares[1].suspect, [20, 21]);
        assert!(
            shares[2].suspect.is_empty(),
            "not fenced: nothing of it was settled"
        );
        assert_eq!(shares[2].lost, 1);
        assert_eq!(shares.iter().map(|s| s.sent).sum::<u64>(), 2);
    }

    /// The highest `$n` a statement names outside its comments.
    fn highest_param(sql: &str) -> usize {
        let code: String = sql
            .lines()
            .map(|line| line.split("--").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        code.split('$')
            .skip(1)
            .filter_map(|rest| {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits.parse().ok()
            })
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn each_mode_binds_what_its_statements_name() {
        let table: TableName = "app.outbox".parse().unwrap();
        for mode in [Acknowledge::MarkSent, Acknowledge::Delete] {
            let sql = SettleSql::render(&table, mode).unwrap();
            assert_eq!(highest_param(&sql.full), mode.param_count(true), "{mode:?}");
            assert_eq!(
                highest_param(&sql.sent_only),
                mode.param_count(false),
                "{mode:?}"
            );
        }
        let sent_only = Settlement::default();
        let mut given_back = Settlement::default();
        given_back.reschedule.push(crate::row::RescheduledRow {
            id: 7,
            lease_token: 1,
            delay: std::time::Duration::from_secs(1),
            error: None,
            refund: true,
        });
        for mode in [Acknowledge::MarkSent, Acknowledge::Delete] {
            for (s, others) in [(&sent_only, false), (&given_back, true)] {
                let args = SettleArgs::new(mode, "relay", &[s]);
                assert_eq!(args.others(), others);
                assert_eq!(args.params().len(), mode.param_count(others), "{mode:?}");
            }
        }
    }
}
