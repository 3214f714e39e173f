//! Claim strategies: how a claim chooses rows, with the SQL and the parameters of each.

use super::ident::key_sql;
use crate::row::KeyColumn;

/// How claims choose rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimMode {
    /// Per-group order: never claim a row while an earlier row of its group is unsent.
    pub ordered: Option<Ordered>,
    /// Round-robin across the values of this key instead of strict id order.
    pub fair: Option<KeyColumn>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ordered {
    /// The group: the same key as the FIFO MessageGroupId.
    pub key: KeyColumn,
    /// `--on-poison skip`: a quarantined row no longer holds its group back.
    pub skip_poison: bool,
}

/// Rows an ordered claim looks at, at most: enough to find a claim's worth of group heads
/// when groups interleave, and a bound on the probes when a few groups hold a long backlog.
pub(crate) fn ordered_window(limit: i64) -> i64 {
    (limit * 10).max(1000)
}

/// The claim statement for a mode: the candidates part of the mode, then the shared UPDATE.
pub(crate) fn claim_sql(table: &str, mode: &ClaimMode) -> String {
    // "The row just before c in its group is done": sent (or, with --on-poison skip, also
    // quarantined), or there is none. One step back in the group's order index, so the probe
    // costs the same however many of the group's rows were sent before — a probe for the first
    // unsent row instead walks every dead index entry the group's sent rows left behind. As a
    // correlated scalar subquery it cannot become a hash anti-join over the backlog when
    // statistics are missing; the range comparison keeps the planner on the (key, id) index
    // (see claim_candidates_fair.sql).
    let ordered_filter = match &mode.ordered {
        Some(o) => {
            let (p, c) = (key_sql(&o.key, Some("p")), key_sql(&o.key, Some("c")));
            format!(
                "AND coalesce((SELECT p.sent_at IS NOT NULL{} FROM {table} AS p \
                 WHERE {p} >= {c} AND {p} <= {c} AND p.id < c.id \
                 ORDER BY {p} DESC, p.id DESC LIMIT 1), true)",
                if o.skip_poison {
                    " OR p.quarantined_at IS NOT NULL"
                } else {
                    ""
                },
            )
        }
        None => String::new(),
    };
    let candidates = match (&mode.fair, &mode.ordered) {
        (Some(key), _) => format!(
            "RECURSIVE {}",
            include_str!("../../sql/claim_candidates_fair.sql")
                .replace("{key_bare}", &key_sql(key, None))
                .replace("{key_c}", &key_sql(key, Some("c")))
        ),
        (None, Some(_)) => include_str!("../../sql/claim_candidates_ordered.sql").to_string(),
        (None, None) => include_str!("../../sql/claim_candidates.sql").to_string(),
    };
    format!(
        "WITH {}\n{}",
        candidates.replace("{ordered_filter}", &ordered_filter),
        include_str!("../../sql/claim.sql")
    )
    .replace("{table}", table)
}
