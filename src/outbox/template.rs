//! The one SQL template renderer. Templates are the files in `sql/` with `{name}` placeholders
//! (lower-case letters, digits and underscores). Rendering is a single pass: a value is never
//! scanned for placeholders again, so a table named `{table}` stays inside its quotes, and a
//! placeholder without a value is an error rather than a syntax error on a production database.

use super::ident::{quote_ident, TableName};

/// What may fill a placeholder. Identifiers are quoted here; `Sql` is a fragment the relay built
/// itself from quoted identifiers (a key expression, a filter), never configuration text.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    /// One identifier, quoted.
    Ident(&'a str),
    /// A possibly schema-qualified table, or anything named like one in its schema (a
    /// sequence, a function, an index), quoted part by part.
    Table(&'a TableName),
    /// The same name as a string literal, for the functions that take a name as text or
    /// regclass (`nextval`, `setval`, `pg_relation_size`, the migration lock's `hashtext`):
    /// quoted part by part, then as a literal.
    TableLiteral(&'a TableName),
    /// A string literal, quotes doubled.
    Literal(&'a str),
    /// A fragment of SQL built by the relay from quoted parts.
    Sql(&'a str),
}

impl Value<'_> {
    fn render(&self) -> String {
        match self {
            Value::Ident(name) => quote_ident(name),
            Value::Table(table) => table.quoted(),
            Value::TableLiteral(table) => literal(&table.quoted()),
            Value::Literal(text) => literal(text),
            Value::Sql(sql) => (*sql).to_string(),
        }
    }
}

/// `text` as an SQL string literal, for DDL, where bind parameters are impossible. Quoted as
/// PostgreSQL's `quote_literal` does: quotes doubled, and a text with a backslash written as an
/// escape string (`E'…'`, backslashes doubled), so that it means the same whatever the
/// server's `standard_conforming_strings`.
pub fn literal(text: &str) -> String {
    let quoted = text.replace('\'', "''");
    if quoted.contains('\\') {
        return format!("E'{}'", quoted.replace('\\', "\\\\"));
    }
    format!("'{quoted}'")
}

/// A template that is rendered inside one line of another statement (an expression, a
/// subquery): its comment lines dropped, the rest trimmed and joined with single spaces.
pub fn fragment(template: &str) -> String {
    template
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Fills every `{name}` of `template` from `values`. Fails on a placeholder that has no value.
pub fn render(template: &str, values: &[(&str, Value<'_>)]) -> Result<String, String> {
    let mut out = String::with_capacity(template.len() + 64);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match placeholder(after) {
            Some(name) => {
                let value = values.iter().find(|(n, _)| *n == name).ok_or_else(|| {
                    format!("placeholder {{{name}}} has no value in:\n{template}")
                })?;
                out.push_str(&value.1.render());
                rest = &after[name.len() + 1..];
            }
            // Not a placeholder (`'{}'::jsonb`, psql's `:{?var}`): kept as it is.
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The name of the placeholder `text` starts with (the part after `{`), if it is one.
fn placeholder(text: &str) -> Option<&str> {
    let end = text.find('}')?;
    let name = &text[..end];
    (!name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
    .then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_quoted_and_never_rescanned() {
        let table: TableName = "{table}\"x".parse().unwrap();
        let sql = render(
            "SELECT {col} FROM {table} WHERE k = {lit} AND {frag}",
            &[
                ("table", Value::Table(&table)),
                ("col", Value::Ident("{frag}")),
                ("lit", Value::Literal("it's {col}")),
                ("frag", Value::Sql("true")),
            ],
        )
        .unwrap();
        assert_eq!(
            sql,
            "SELECT \"{frag}\" FROM \"{table}\"\"x\" WHERE k = 'it''s {col}' AND true"
        );
    }

    #[test]
    fn names_become_literals_quoted_twice_over() {
        let sequence: TableName = "app.\"we'ird\"\"seq\"".parse().unwrap();
        let sql = render(
            "SELECT nextval({sequence_literal}), {text}",
            &[
                ("sequence_literal", Value::TableLiteral(&sequence)),
                ("text", Value::Literal("it's \\ {sequence_literal}")),
            ],
        )
        .unwrap();
        assert_eq!(
            sql,
            "SELECT nextval('\"app\".\"we''ird\"\"seq\"'), E'it''s \\\\ {sequence_literal}'"
        );
        assert_eq!(literal("a'b''c"), "'a''b''''c'");
        assert_eq!(literal(""), "''");
        assert_eq!(literal("a\\'b"), "E'a\\\\''b'");
    }

    #[test]
    fn a_placeholder_without_a_value_is_an_error() {
        let err = render(
            "SELECT 1 FROM {table} WHERE {missing}",
            &[("table", Value::Sql("t"))],
        )
        .unwrap_err();
        assert!(err.contains("{missing}"), "{err}");
    }

    #[test]
    fn braces_that_are_not_placeholders_stay() {
        let sql = render(
            "SELECT '{}'::jsonb, '{A}', :{?x} FROM {t}",
            &[("t", Value::Sql("t"))],
        )
        .unwrap();
        assert_eq!(sql, "SELECT '{}'::jsonb, '{A}', :{?x} FROM t");
    }
}
