//! Identifiers: the configured table name, always quoted; names derived from it; key columns
//! as SQL expressions. No configuration value reaches SQL except through these functions.

use std::fmt;
use std::str::FromStr;

use super::order_by::OrderBy;
use crate::row::KeyColumn;

/// A possibly schema-qualified table name from configuration.
///
/// Parts are separated by dots outside double quotes; a part in double quotes may contain dots
/// and doubled quotes. Parts are used exactly as written (case-sensitive) and always quoted
/// when they reach SQL, so no configuration value is ever spliced into SQL raw.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    pub schema: Option<String>,
    pub name: String,
}

/// PostgreSQL truncates identifiers beyond this many bytes, which could silently merge names.
pub(crate) const MAX_IDENTIFIER_BYTES: usize = 63;

impl FromStr for TableName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut chars = s.chars().peekable();
        loop {
            let mut part = String::new();
            if chars.peek() == Some(&'"') {
                chars.next();
                loop {
                    match chars.next() {
                        Some('"') if chars.peek() == Some(&'"') => {
                            chars.next();
                            part.push('"');
                        }
                        Some('"') => break,
                        Some(c) => part.push(c),
                        None => return Err(format!("--table {s:?}: unterminated double quote")),
                    }
                }
                if !matches!(chars.peek(), None | Some('.')) {
                    return Err(format!("--table {s:?}: expected a dot after a quoted name"));
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == '.' {
                        break;
                    }
                    part.push(c);
                    chars.next();
                }
            }
            if part.is_empty() {
                return Err(format!("--table {s:?}: empty name part"));
            }
            if part.len() > MAX_IDENTIFIER_BYTES {
                return Err(format!(
                    "--table {s:?}: a name part is longer than PostgreSQL's {MAX_IDENTIFIER_BYTES} bytes"
                ));
            }
            if part.contains('\0') {
                return Err(format!("--table {s:?}: names cannot contain NUL"));
            }
            parts.push(part);
            match chars.next() {
                None => break,
                Some('.') => continue,
                Some(_) => unreachable!("parts end at a dot or the end"),
            }
        }
        match parts.len() {
            1 => Ok(TableName {
                schema: None,
                name: parts.remove(0),
            }),
            2 => {
                let name = parts.remove(1);
                Ok(TableName {
                    schema: Some(parts.remove(0)),
                    name,
                })
            }
            _ => Err(format!(
                "--table {s:?}: use `table` or `schema.table` (quote a name that contains a dot)"
            )),
        }
    }
}

/// Quotes one identifier the way PostgreSQL's quote_ident does, always.
pub fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

impl TableName {
    /// The table as people write it, `schema.name` unquoted: a metric label, a log field.
    pub fn label(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{schema}.{}", self.name),
            None => self.name.clone(),
        }
    }

    /// The table as SQL: `"schema"."name"` or `"name"`.
    pub fn quoted(&self) -> String {
        self.qualify(&self.name)
    }

    /// The view through which the relay reads an adopted table: `<name>_relay`, same schema.
    pub fn relay_view(&self) -> TableName {
        TableName {
            schema: self.schema.clone(),
            name: self.derived("relay"),
        }
    }

    /// Another object in the table's schema (function, version table), quoted.
    pub(crate) fn qualify(&self, object: &str) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", quote_ident(schema), quote_ident(object)),
            None => quote_ident(object),
        }
    }

    /// The table of the relay's leases beside this one (sql/claims.sql), in its schema.
    pub(crate) fn claims(&self) -> TableName {
        TableName {
            schema: self.schema.clone(),
            name: self.derived("claims"),
        }
    }

    /// The registry of the relays of this table beside it (sql/relays.sql), in its schema.
    pub(crate) fn relays(&self) -> TableName {
        TableName {
            schema: self.schema.clone(),
            name: self.derived("relays"),
        }
    }

    /// The table where `migrate` records the schema version and the relay versions that may
    /// claim (one row per table of the schema), in the table's schema.
    pub(crate) fn versions(&self) -> TableName {
        TableName {
            schema: self.schema.clone(),
            name: "outbox_relay_schema".to_string(),
        }
    }

    /// A name derived from the table's, kept within PostgreSQL's identifier length by
    /// shortening the table part and adding a hash of it, so two long names never collide.
    pub(crate) fn derived(&self, suffix: &str) -> String {
        let full = format!("{}_{suffix}", self.name);
        if full.len() <= MAX_IDENTIFIER_BYTES {
            return full;
        }
        let hash = crate::row::fifo_id(&format!("{}\u{1}{}", self.name, suffix));
        let mut head: String = String::new();
        for c in self.name.chars() {
            if head.len() + c.len_utf8() + 1 + 8 + 1 + suffix.len() > MAX_IDENTIFIER_BYTES {
                break;
            }
            head.push(c);
        }
        format!("{head}_{}_{suffix}", &hash[..8])
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.quoted())
    }
}

/// The SQL for a key's value on a row (`alias` = None inside index definitions, where the
/// expression must match the queries' exactly). Header names are restricted to letters,
/// digits, `_ - .` by `KeyColumn::from_str`, so the literal below cannot break out of its
/// quotes; it is escaped all the same.
pub(crate) fn key_sql(key: &KeyColumn, alias: Option<&str>) -> String {
    let column = |name: &str| match alias {
        Some(a) => format!("{a}.{name}"),
        None => name.to_string(),
    };
    match key {
        KeyColumn::AggregateId => column("aggregate_id"),
        KeyColumn::AggregateType => column("aggregate_type"),
        KeyColumn::EventType => column("event_type"),
        KeyColumn::Header(name) => format!(
            "coalesce({} ->> '{}', '')",
            column("headers"),
            name.replace('\'', "''")
        ),
    }
}

/// The two (key, id) indexes a claim mode may need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyIndex {
    /// Ordered delivery: over every row whose key is not null, so that "the row just before
    /// this one in its group" is one step in the index, however many of the group's rows were
    /// sent before.
    Order,
    /// Over pending rows (neither sent nor quarantined), so that walking the distinct keys
    /// never visits keys whose rows are all sent or quarantined (a tenant's million quarantined
    /// rows cost its fair claims nothing): fair claiming walks its key's values, ordered claims
    /// their groups.
    Fair,
    /// [`KeyIndex::Order`] under `--order-by transaction`: (key, xact_id, id).
    TransactionOrder,
    /// [`KeyIndex::Fair`] under `--order-by transaction`: the first pending row of a group in
    /// its order is one probe.
    TransactionPending,
}

impl KeyIndex {
    /// The two indexes ordered claims of `by` need for a group key.
    pub fn for_groups(by: OrderBy) -> [KeyIndex; 2] {
        match by {
            OrderBy::Id => [KeyIndex::Order, KeyIndex::Fair],
            OrderBy::Transaction => [KeyIndex::TransactionOrder, KeyIndex::TransactionPending],
        }
    }

    pub(crate) fn prefix(self) -> &'static str {
        match self {
            KeyIndex::Order => "ordered",
            KeyIndex::Fair => "unsent",
            KeyIndex::TransactionOrder => "xact_ordered",
            KeyIndex::TransactionPending => "xact_unsent",
        }
    }

    /// The index's `WHERE`, `key` the key's expression as the index is built on it.
    ///
    /// No (key, id) index may serve a statement that does not compare the key. The relay looks
    /// its rows up by `id = ANY (...)`, joins on `id` and reads unsent rows from `id >= floor`;
    /// an index with `id` as a later column can do each of these by reading itself whole, and
    /// where the planner sees the table as empty (analyzed while empty: the usual state of an
    /// outbox whose relay keeps up) every index looks one page long, so that read costs no more
    /// than the primary key's lookup or the unsent index's range, and the planner took the
    /// (key, id) index (tests/plans.rs): every settlement and every claim's rows then read all
    /// its entries, the deleted rows' included, which a held vacuum horizon keeps by the
    /// hundred thousand. `key IS NOT NULL` leaves the index out of every statement that does
    /// not compare the key (a comparison implies it), and holds every row the claims look for
    /// in it: a null key is in no group and has no fair share (`key = $1` and `key > $1` never
    /// match it).
    pub(crate) fn predicate(self, key: &str) -> String {
        match self {
            KeyIndex::Order | KeyIndex::TransactionOrder => format!(" WHERE {key} IS NOT NULL"),
            KeyIndex::Fair | KeyIndex::TransactionPending => {
                format!(" WHERE sent_at IS NULL AND quarantined_at IS NULL AND {key} IS NOT NULL")
            }
        }
    }

    /// The order the index keeps each key's rows in.
    pub(crate) fn order_by(self) -> OrderBy {
        match self {
            KeyIndex::Order | KeyIndex::Fair => OrderBy::Id,
            KeyIndex::TransactionOrder | KeyIndex::TransactionPending => OrderBy::Transaction,
        }
    }

    /// The prefixes of the indexes this one replaced: `migrate` drops them once this one is
    /// built. The fair index of schema version 1 also held quarantined rows, as
    /// `key_<KEY>_idx`; the indexes of 0.2.0 let the planner walk them for statements that do
    /// not compare the key, as `order_`, `pending_`, `xact_order_` and `xact_pending_<KEY>_idx`
    /// (see [`KeyIndex::predicate`]).
    pub(crate) fn replaces(self) -> &'static [&'static str] {
        match self {
            KeyIndex::Order => &["order"],
            KeyIndex::Fair => &["key", "pending"],
            KeyIndex::TransactionOrder => &["xact_order"],
            KeyIndex::TransactionPending => &["xact_pending"],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_index_leaves_out_rows_of_no_key_under_a_name_of_its_own() {
        assert_eq!(
            KeyIndex::Fair.predicate("k"),
            " WHERE sent_at IS NULL AND quarantined_at IS NULL AND k IS NOT NULL"
        );
        assert_eq!(KeyIndex::Order.predicate("k"), " WHERE k IS NOT NULL");
        for kind in [
            KeyIndex::Order,
            KeyIndex::Fair,
            KeyIndex::TransactionOrder,
            KeyIndex::TransactionPending,
        ] {
            assert!(kind.predicate("k").ends_with("k IS NOT NULL"), "{kind:?}");
            assert!(!kind.replaces().is_empty(), "{kind:?}");
            assert!(
                !kind.replaces().contains(&kind.prefix()),
                "{kind:?}: built beside the old one"
            );
        }
    }

    #[test]
    fn plain_and_schema_qualified_names() {
        let t: TableName = "outbox".parse().unwrap();
        assert_eq!(t.quoted(), "\"outbox\"");
        let t: TableName = "app.outbox".parse().unwrap();
        assert_eq!(t.schema.as_deref(), Some("app"));
        assert_eq!(t.quoted(), "\"app\".\"outbox\"");
    }

    #[test]
    fn quotes_and_dots_inside_names_stay_inside_one_quoted_identifier() {
        let t: TableName = "we\"ird".parse().unwrap();
        assert_eq!(t.name, "we\"ird");
        assert_eq!(t.quoted(), "\"we\"\"ird\"");
        let t: TableName = "\"my.outbox\"".parse().unwrap();
        assert_eq!(t.schema, None);
        assert_eq!(t.name, "my.outbox");
        assert_eq!(t.quoted(), "\"my.outbox\"");
        let t: TableName = "\"s.1\".\"a\"\"b\"".parse().unwrap();
        assert_eq!(t.schema.as_deref(), Some("s.1"));
        assert_eq!(t.name, "a\"b");
        assert_eq!(t.quoted(), "\"s.1\".\"a\"\"b\"");
        let injection: TableName = "outbox; DROP TABLE users; --".parse().unwrap();
        assert_eq!(injection.quoted(), "\"outbox; DROP TABLE users; --\"");
    }

    #[test]
    fn malformed_names_are_refused_with_the_reason() {
        for (bad, why) in [
            ("", "empty"),
            ("a..b", "empty"),
            ("a.b.c", "schema.table"),
            ("\"open", "unterminated"),
            ("\"a\"b", "expected a dot"),
            (&"x".repeat(64), "63 bytes"),
        ] {
            let err = bad.parse::<TableName>().unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }

    #[test]
    fn derived_names_stay_within_the_identifier_limit_and_apart() {
        let short: TableName = "outbox".parse().unwrap();
        assert_eq!(short.derived("unsent_idx"), "outbox_unsent_idx");
        let a: TableName = "a".repeat(60).parse().unwrap();
        let b: TableName = format!("{}b", "a".repeat(59)).parse().unwrap();
        let (da, db) = (a.derived("unsent_idx"), b.derived("unsent_idx"));
        assert!(da.len() <= 63 && db.len() <= 63);
        assert_ne!(da, db);
        assert!(da.ends_with("_unsent_idx"));
    }
}
