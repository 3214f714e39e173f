//! Which tables a command serves: `--table` (repeatable) and `--tables SCHEMA.TABLE` patterns,
//! and the discovery of the tables a pattern matches (sql/discover.sql).

use std::fmt;
use std::str::FromStr;

use super::conn::Conn;
use super::connector::Connector;
use super::error::{query_err, OutboxError};
use super::ident::TableName;

/// The tables a command was asked to serve, as configured: named ones, and patterns that
/// discovery turns into tables (again every `--discover-every` for `run`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// `--table`, in the order given.
    pub named: Vec<TableName>,
    /// `--tables`.
    pub patterns: Vec<Pattern>,
}

impl Selection {
    /// The one table of a selection that names exactly one and has no pattern: the relay as
    /// it always was, one table, no `table` label on its series.
    pub fn single(&self) -> Option<&TableName> {
        match (self.named.as_slice(), self.patterns.is_empty()) {
            ([only], true) => Some(only),
            _ => None,
        }
    }

    /// The named tables and those `discovered` (the patterns' matches), each once, in a
    /// stable order: named ones first as given, then the discovered ones as the catalog
    /// sorted them.
    pub fn resolve(&self, discovered: Vec<TableName>) -> Vec<TableName> {
        let mut tables: Vec<TableName> = Vec::new();
        for t in self.named.iter().cloned().chain(discovered) {
            if !tables.iter().any(|seen| same_table(seen, &t)) {
                tables.push(t);
            }
        }
        tables
    }

    /// The patterns that select none of `tables` (what [`Selection::resolve`] returned): a
    /// pattern matching nothing is a mistyped name far more often than an empty fleet, so
    /// the commands that act on tables once say so instead of doing nothing.
    pub fn unmatched(&self, tables: &[TableName]) -> Vec<&Pattern> {
        self.patterns
            .iter()
            .filter(|p| {
                !tables.iter().any(|t| {
                    t.schema
                        .as_deref()
                        .is_some_and(|schema| p.matches(schema, &t.name))
                })
            })
            .collect()
    }

    /// The one table of a command that acts on one table (`quarantine`, `replay`): their
    /// selectors (ids, event ids, time ranges) mean something in one table only.
    pub fn one_table(&self, command: &str) -> Result<&TableName, String> {
        if let Some(table) = self.single() {
            return Ok(table);
        }
        let why = match self.patterns.first() {
            Some(pattern) => format!("--tables '{pattern}' is a pattern"),
            None => format!("the selection names {} tables", self.named.len()),
        };
        Err(format!(
            "{command} acts on one table: give one --table ({why})"
        ))
    }
}

/// Whether two configured names are the same table (an unqualified name and a qualified one
/// are told apart: the first is resolved on the search_path before it is used).
fn same_table(a: &TableName, b: &TableName) -> bool {
    a == b
}

/// `SCHEMA.TABLE` where either part may hold `*` (any run of characters) and `?` (one
/// character): `tenant_*.outbox`, `*.outbox`, `billing.outbox_*`. A part in double quotes
/// is matched as written, wildcards included. The schema part is required: a pattern never
/// depends on a search_path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    /// As written, for messages.
    text: String,
    /// The parts as LIKE patterns (escape `\`).
    schema_like: String,
    name_like: String,
}

impl FromStr for Pattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parts = s
            .parse::<TableName>()
            .map_err(|e| e.replace("--table", "--tables"))?;
        let Some(schema) = parts.schema.as_deref() else {
            return Err(format!(
                "--tables {s:?}: name the schema too (`SCHEMA.TABLE`, e.g. `tenant_*.outbox` or `*.outbox`)"
            ));
        };
        let quoted = |part: &str| s.contains(&format!("\"{part}\""));
        Ok(Pattern {
            text: s.to_string(),
            schema_like: like(schema, quoted(schema)),
            name_like: like(&parts.name, quoted(&parts.name)),
        })
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A glob part as a LIKE pattern: LIKE's own wildcards and its escape are escaped, then `*`
/// and `?` become `%` and `_` (not inside a quoted part, which is matched as written).
fn like(glob: &str, literal: bool) -> String {
    let mut out = String::with_capacity(glob.len() + 4);
    for c in glob.chars() {
        match c {
            '\\' | '%' | '_' => {
                out.push('\\');
                out.push(c);
            }
            '*' if !literal => out.push('%'),
            '?' if !literal => out.push('_'),
            c => out.push(c),
        }
    }
    out
}

impl Pattern {
    /// Whether the pattern selects `schema.name` (the same rule as sql/discover.sql's LIKE),
    /// for tests and for telling a table the pattern no longer reaches.
    pub fn matches(&self, schema: &str, name: &str) -> bool {
        like_matches(&self.schema_like, schema) && like_matches(&self.name_like, name)
    }
}

/// LIKE with `\` as escape, as PostgreSQL evaluates it.
fn like_matches(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    fn go(p: &[char], t: &[char]) -> bool {
        match p.first() {
            None => t.is_empty(),
            Some('%') => (0..=t.len()).any(|i| go(&p[1..], &t[i..])),
            Some('_') => !t.is_empty() && go(&p[1..], &t[1..]),
            Some('\\') if p.len() > 1 => t.first() == Some(&p[1]) && go(&p[2..], &t[1..]),
            Some(c) => t.first() == Some(c) && go(&p[1..], &t[1..]),
        }
    }
    go(&p, &t)
}

impl Connector {
    /// The tables `selection` names and those its patterns match now, each once; on one
    /// connection of its own. Without patterns, no connection is made.
    pub async fn select(&self, selection: &Selection) -> Result<Vec<TableName>, OutboxError> {
        if selection.patterns.is_empty() {
            return Ok(selection.resolve(Vec::new()));
        }
        let conn = self.raw_connect().await?;
        Ok(selection.resolve(discover(&conn, &selection.patterns).await?))
    }
}

/// The outbox tables the patterns select (sql/discover.sql), sorted by schema and name.
pub(super) async fn discover(
    conn: &Conn,
    patterns: &[Pattern],
) -> Result<Vec<TableName>, OutboxError> {
    let mut found: Vec<TableName> = Vec::new();
    for pattern in patterns {
        let rows = conn
            .query(DISCOVER, &[&pattern.schema_like, &pattern.name_like])
            .await
            .map_err(query_err("discovering the tables --tables selects"))?;
        for row in rows {
            let table = TableName {
                schema: Some(row.get(0)),
                name: row.get(1),
            };
            if !found.contains(&table) {
                found.push(table);
            }
        }
    }
    found.sort_by(|a, b| (&a.schema, &a.name).cmp(&(&b.schema, &b.name)));
    Ok(found)
}

const DISCOVER: &str = include_str!("../../sql/discover.sql");

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TableName {
        s.parse().unwrap()
    }

    #[test]
    fn a_pattern_matches_by_glob_and_treats_like_wildcards_as_characters() {
        let p: Pattern = "tenant_*.outbox".parse().unwrap();
        assert!(p.matches("tenant_1", "outbox"));
        assert!(p.matches("tenant_", "outbox"));
        assert!(
            !p.matches("tenantX1", "outbox"),
            "`_` is a character, not LIKE's wildcard"
        );
        assert!(!p.matches("tenant_1", "outbox_claims"));
        let q: Pattern = "app.outbox_?".parse().unwrap();
        assert!(q.matches("app", "outbox_a"));
        assert!(!q.matches("app", "outbox_ab"));
        let pct: Pattern = "a%b.*".parse().unwrap();
        assert!(pct.matches("a%b", "x"));
        assert!(!pct.matches("aXb", "x"));
    }

    #[test]
    fn a_quoted_part_is_matched_as_written() {
        let p: Pattern = "\"t*\".outbox".parse().unwrap();
        assert!(p.matches("t*", "outbox"));
        assert!(!p.matches("t1", "outbox"));
    }

    #[test]
    fn a_pattern_names_its_schema() {
        let e = "outbox_*".parse::<Pattern>().unwrap_err();
        assert!(e.contains("name the schema"), "{e}");
        let e = "a.b.c".parse::<Pattern>().unwrap_err();
        assert!(e.starts_with("--tables"), "{e}");
    }

    #[test]
    fn resolving_keeps_named_tables_first_and_each_table_once() {
        let s = Selection {
            named: vec![t("app.outbox"), t("b.outbox")],
            patterns: vec!["*.outbox".parse().unwrap()],
        };
        assert_eq!(s.single(), None);
        let all = s.resolve(vec![t("a.outbox"), t("app.outbox"), t("c.outbox")]);
        assert_eq!(
            all,
            vec![t("app.outbox"), t("b.outbox"), t("a.outbox"), t("c.outbox")]
        );
        let one = Selection {
            named: vec![t("outbox")],
            patterns: vec![],
        };
        assert_eq!(one.single(), Some(&t("outbox")));
    }

    #[test]
    fn a_pattern_that_selects_none_of_the_tables_is_named() {
        let s = Selection {
            named: vec![t("outbox")],
            patterns: vec![
                "tenant_*.outbox".parse().unwrap(),
                "x_*.outbox".parse().unwrap(),
            ],
        };
        let found = s.resolve(vec![t("tenant_1.outbox")]);
        let unmatched: Vec<String> = s.unmatched(&found).iter().map(|p| p.to_string()).collect();
        assert_eq!(unmatched, vec!["x_*.outbox"]);
        assert_eq!(
            s.unmatched(&[]).len(),
            2,
            "an unqualified name matches no pattern"
        );
    }

    #[test]
    fn a_one_table_command_refuses_several_tables_and_patterns() {
        let one = Selection {
            named: vec![t("app.outbox")],
            patterns: vec![],
        };
        assert_eq!(one.one_table("replay"), Ok(&t("app.outbox")));
        let two = Selection {
            named: vec![t("a.outbox"), t("b.outbox")],
            patterns: vec![],
        };
        assert_eq!(
            two.one_table("quarantine retry"),
            Err("quarantine retry acts on one table: give one --table (the selection names 2 tables)".to_string())
        );
        let pattern = Selection {
            named: vec![],
            patterns: vec!["tenant_*.outbox".parse().unwrap()],
        };
        assert_eq!(
            pattern.one_table("quarantine list"),
            Err("quarantine list acts on one table: give one --table (--tables 'tenant_*.outbox' is a pattern)".to_string())
        );
    }
}
