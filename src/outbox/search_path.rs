//! `--table` and the role's `search_path`: which table an unqualified name reaches, the
//! others of its name, and why a name that reaches none is not simply "missing".

use super::conn::Conn;
use super::error::{query_err, OutboxError};
use super::ident::TableName;
use super::settings::DatabaseConfig;
use super::store::Outbox;

impl Outbox {
    /// Why the table was not found: hidden by the search_path (a table of its name exists in
    /// a schema the path does not reach), or missing.
    pub(super) async fn missing(&self, client: &Conn) -> OutboxError {
        let missing = OutboxError::TableMissing(self.table().quoted());
        if self.table().schema.is_some() {
            return missing;
        }
        match self.search_path(client).await {
            Ok(found) if !found.others.is_empty() => OutboxError::TableHidden {
                table: self.table().quoted(),
                search_path: found.search_path,
                first: found.others[0].clone(),
                found: found.others.join(", "),
            },
            _ => missing,
        }
    }

    /// Why the table was not found, on a connection of its own (for `check`).
    pub async fn why_missing(&self) -> OutboxError {
        match self.raw_connect().await {
            Ok(client) => self.missing(&client).await,
            Err(e) => e,
        }
    }

    /// What the unqualified table name reaches on `client`'s search_path (sql/resolve_search_path.sql).
    async fn search_path(&self, client: &Conn) -> Result<SearchPath, OutboxError> {
        let row = client
            .query_one(
                RESOLVE_SEARCH_PATH,
                &[&self.table().quoted(), &self.table().name],
            )
            .await
            .map_err(query_err("looking up the table on the search_path"))?;
        Ok(SearchPath {
            schema: row.get(0),
            search_path: row.get(1),
            others: row.get(2),
        })
    }

    /// The table a `--table` without a schema names, resolved once on the role's
    /// search_path, so that every connection of the relay uses the same table whatever its
    /// own search_path (a pooler's server connections, a URL's options), when another table
    /// of that name exists: only then could two connections reach different ones. `None`
    /// when the name is already qualified, is the only table of its name (every connection
    /// reaches that one, or fails saying so), or reaches no table (then the commands say so).
    pub async fn resolve_table(&self) -> Result<Option<Resolved>, OutboxError> {
        if self.table().schema.is_some() {
            return Ok(None);
        }
        let client = self.raw_connect().await?;
        let found = self.search_path(&client).await?;
        if found.others.is_empty() {
            return Ok(None);
        }
        Ok(found.schema.map(|schema| Resolved {
            table: TableName {
                schema: Some(schema),
                name: self.table().name.clone(),
            },
            search_path: found.search_path,
            others: found.others,
        }))
    }
}

/// Which table an unqualified name reaches, and the others of that name.
const RESOLVE_SEARCH_PATH: &str = include_str!("../../sql/resolve_search_path.sql");

/// sql/resolve_search_path.sql's answer.
struct SearchPath {
    schema: Option<String>,
    search_path: String,
    others: Vec<String>,
}

/// An unqualified `--table` resolved on the role's search_path ([`Outbox::resolve_table`]).
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The schema-qualified table every connection uses.
    pub table: TableName,
    /// The role's search_path it was resolved on.
    pub search_path: String,
    /// Other tables or views of the same name, quoted and qualified.
    pub others: Vec<String>,
}

impl Resolved {
    /// `database` with the resolved table (and an adopted table in the same schema).
    pub fn apply(&self, database: &DatabaseConfig) -> DatabaseConfig {
        let mut database = database.clone();
        database.table = self.table.clone();
        if let Some((base, _)) = database.adopted.as_mut() {
            if base.schema.is_none() {
                base.schema = self.table.schema.clone();
            }
        }
        database
    }

    /// What `check` says: which table, and the others of its name.
    pub fn describe(&self) -> String {
        let mut line = format!(
            "resolved to {} on the search_path ({})",
            self.table.quoted(),
            self.search_path
        );
        if !self.others.is_empty() {
            line.push_str(&format!(
                "; another table of that name exists: {} (name it with --table SCHEMA.NAME if that is the outbox)",
                self.others.join(", ")
            ));
        }
        line
    }
}
