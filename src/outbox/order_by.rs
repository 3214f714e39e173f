//! `--order-by`: what "earlier" means within a group, as SQL fragments. The claim, the parking
//! of blocked rows, the idle probe, the statistics and `migrate` all take their comparisons
//! from here, so the order a group is delivered in is defined once.
//!
//! - `id` (default): insertion order. A row is its group's head once every row of its group
//!   with a smaller `id` is done; a transaction still open with an earlier `id` can be
//!   overtaken (the writer must serialise a group's transactions, docs/ordering.md).
//! - `transaction`: the order of the writing transactions, `(xact_id, id)`, where `xact_id` is
//!   the writing transaction's `pg_current_xact_id()` (the column's default, `migrate
//!   --order-by transaction`). A row is claimable only once no transaction that began writing
//!   before it is still running: its `xact_id` is below the claim snapshot's xmin (the oldest
//!   transaction ID still running). Every transaction that could still add an earlier event of
//!   its group has then ended, so the order is the table's, whatever the claims' timing.

use std::fmt;
use std::str::FromStr;

/// The column `migrate --order-by transaction` adds: the writing transaction's ID (`xid8`).
pub const XACT_COLUMN: &str = "xact_id";

/// Why `run` and `migrate --adopt` refuse `--order-by transaction` on an adopted table.
pub const NOT_ON_ADOPTED: &str = "--order-by transaction is not supported on an adopted table (--adopt, --column): the relay adds its xact_id column only to tables migrate created";

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum OrderBy {
    /// Insertion order: `id`.
    #[default]
    Id,
    /// The writing transactions' order: `(xact_id, id)`, behind the running transactions.
    Transaction,
}

impl OrderBy {
    /// The columns a group's order sorts by, for an ORDER BY or a select list.
    pub fn columns(self, alias: Option<&str>) -> String {
        let a = prefix(alias);
        match self {
            OrderBy::Id => format!("{a}id"),
            OrderBy::Transaction => format!("{a}{XACT_COLUMN}, {a}id"),
        }
    }

    /// A claimed row's place in the order, as a value the relay sorts the claim's rows by:
    /// the id itself where ids are the order (no window and no sort in the claim's plan),
    /// else the row's rank by the columns.
    pub fn turn(self, alias: &str) -> String {
        match self {
            OrderBy::Id => format!("{alias}.id"),
            OrderBy::Transaction => {
                format!("row_number() OVER (ORDER BY {})", self.columns(Some(alias)))
            }
        }
    }

    /// The same columns, descending: the row just before another in its group's index.
    pub fn columns_desc(self, alias: Option<&str>) -> String {
        let a = prefix(alias);
        match self {
            OrderBy::Id => format!("{a}id DESC"),
            OrderBy::Transaction => format!("{a}{XACT_COLUMN} DESC, {a}id DESC"),
        }
    }

    /// The value two rows of one group compare by (`<` is "earlier").
    pub fn position(self, alias: &str) -> String {
        match self {
            OrderBy::Id => format!("{alias}.id"),
            OrderBy::Transaction => format!("({alias}.{XACT_COLUMN}, {alias}.id)"),
        }
    }

    /// Whether the row may be claimed yet, in SQL. Transaction order holds a row back while a
    /// transaction that was given its ID before the row's own still runs: that one could still
    /// write an earlier event of the row's group. The xmin is the statement's snapshot's, the
    /// one the claim sees rows by, so what it lets through and what is visible agree.
    /// `IS TRUE` keeps it a filter, never an index condition: as one, a claim's generic plan
    /// made on a small table ran it over the whole (key, xact_id, id) index instead of looking
    /// up the few ids the claim chose (tests/plans.rs). `xact_id` is never null, so it
    /// changes no answer.
    pub fn released(self, alias: Option<&str>) -> String {
        match self {
            OrderBy::Id => "true".to_string(),
            OrderBy::Transaction => format!(
                "({}{XACT_COLUMN} < pg_snapshot_xmin(pg_current_snapshot())) IS TRUE",
                prefix(alias)
            ),
        }
    }

    /// What a group key's index holds between the key and `id`: the index keeps each key's
    /// rows in this order.
    pub fn index_columns(self) -> &'static str {
        match self {
            OrderBy::Id => "",
            OrderBy::Transaction => "xact_id, ",
        }
    }

    /// The flag `migrate` needs to build what this order claims with.
    pub fn migrate_flag(self) -> &'static str {
        match self {
            OrderBy::Id => "",
            OrderBy::Transaction => " --order-by transaction",
        }
    }

    /// The row's extra select-list entry (`, alias.xact_id`) where a query carries rows on to
    /// be compared by [`OrderBy::position`].
    pub fn carried(self, alias: &str) -> String {
        match self {
            OrderBy::Id => String::new(),
            OrderBy::Transaction => format!(", {alias}.{XACT_COLUMN}"),
        }
    }
}

fn prefix(alias: Option<&str>) -> String {
    alias.map(|a| format!("{a}.")).unwrap_or_default()
}

impl FromStr for OrderBy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "id" => Ok(OrderBy::Id),
            "transaction" => Ok(OrderBy::Transaction),
            other => Err(format!(
                "unknown order {other:?}: use id (insertion order) or transaction (the writing transactions' order)"
            )),
        }
    }
}

impl fmt::Display for OrderBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OrderBy::Id => "id",
            OrderBy::Transaction => "transaction",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_order_compares_ids_and_holds_nothing_back() {
        assert_eq!(OrderBy::Id.position("p"), "p.id");
        assert_eq!(OrderBy::Id.columns(Some("c")), "c.id");
        assert_eq!(OrderBy::Id.released(Some("c")), "true");
        assert_eq!(OrderBy::Id.carried("w"), "");
        assert_eq!(OrderBy::Id.index_columns(), "");
        assert_eq!(OrderBy::Id.migrate_flag(), "");
    }

    #[test]
    fn transaction_order_compares_the_writing_transaction_first_and_waits_for_older_ones() {
        let t = OrderBy::Transaction;
        assert_eq!(t.position("p"), "(p.xact_id, p.id)");
        assert_eq!(t.columns(None), "xact_id, id");
        assert_eq!(t.columns_desc(Some("p")), "p.xact_id DESC, p.id DESC");
        assert_eq!(
            t.released(Some("c")),
            "(c.xact_id < pg_snapshot_xmin(pg_current_snapshot())) IS TRUE"
        );
        assert_eq!(t.carried("w"), ", w.xact_id");
        assert_eq!(t.index_columns(), "xact_id, ");
        assert_eq!(t.migrate_flag(), " --order-by transaction");
    }

    #[test]
    fn parses_what_it_prints() {
        for o in [OrderBy::Id, OrderBy::Transaction] {
            assert_eq!(o.to_string().parse::<OrderBy>(), Ok(o));
        }
        assert!("commit"
            .parse::<OrderBy>()
            .unwrap_err()
            .contains("transaction"));
    }
}
