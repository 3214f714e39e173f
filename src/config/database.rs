//! The database flags every command shares (`--database-url`, `--table`, TLS, password
//! sources), and their validated form.

use std::str::FromStr;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::Args;

use super::parse::parse_column;
use crate::dbauth::PasswordSource;
use crate::outbox::{ColumnMap, Pattern, Pooler, Selection, TableName};

#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL connection: a libpq URL or key=value string.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Outbox table, optionally schema-qualified (`app.outbox`); quote a part containing a dot.
    /// Repeatable: one relay serves every table named (default: `outbox`, unless --tables).
    #[arg(long, env = "OUTBOX_TABLE")]
    pub table: Vec<String>,

    /// Every outbox table matching SCHEMA.TABLE, where `*` is any run of characters and `?`
    /// one (`tenant_*.outbox`, `*.outbox`); repeatable (env: comma-separated). `run` looks
    /// again every --discover-every, so a table added or dropped needs no restart.
    #[arg(long = "tables", env = "OUTBOX_TABLES", value_delimiter = ',')]
    pub tables: Vec<String>,

    /// Give up on one connection attempt after this long.
    #[arg(long, env = "OUTBOX_CONNECT_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,

    /// A connection pooler between the relay and PostgreSQL: `auto` (detected at the first
    /// connection, before anything is set: direct, or used as `transaction`), `none` (the
    /// relay's own connections: session settings, prepared statements; refused behind a
    /// pooler), `session` or `transaction` (PgBouncer's pool modes; RDS Proxy is
    /// `transaction`): nothing is left on a server connection, statements are unnamed and
    /// settings per transaction.
    #[arg(long, env = "OUTBOX_POOLER", default_value = "auto")]
    pub pooler: Pooler,

    /// An adopted table's column for a standard name: NAME=COLUMN, repeatable (env:
    /// comma-separated), e.g. event_id=id aggregate_type=aggregatetype. With any of these the
    /// relay reads the table through the view `migrate --adopt` created.
    #[arg(long = "column", env = "OUTBOX_COLUMNS", value_delimiter = ',', value_parser = parse_column)]
    pub columns: Vec<(String, String)>,

    /// PEM file of the CA certificate(s) the database server's certificate must chain to
    /// (libpq's sslrootcert; wins over one in --database-url). Used by sslmode verify-ca,
    /// verify-full and require.
    #[arg(long, env = "OUTBOX_DB_CA_CERT")]
    pub db_ca_cert: Option<std::path::PathBuf>,

    /// A file holding the database password (a mounted secret), read again for every new
    /// connection so a rotated password is used without a restart; trailing newline ignored.
    /// The URL must not carry a password then.
    #[arg(long, env = "OUTBOX_DATABASE_PASSWORD_FILE")]
    pub database_password_file: Option<std::path::PathBuf>,

    /// Log in with a fresh RDS IAM auth token per connection, signed with the relay's AWS
    /// credentials (the chain SQS uses) for the URL's host, port and user; needs TLS and a
    /// URL without a password.
    // Boolean variables also take 1/0, yes/no, on/off: manifests write those as often.
    #[arg(long, env = "OUTBOX_DATABASE_IAM_AUTH", value_parser = BoolishValueParser::new())]
    pub database_iam_auth: bool,

    /// PEM file of the client certificate (or a chain starting with it) to present to the
    /// database server (libpq's sslcert; wins over one in --database-url). Needs
    /// --db-client-key; read again at each new connection.
    #[arg(long, env = "OUTBOX_DB_CLIENT_CERT")]
    pub db_client_cert: Option<std::path::PathBuf>,

    /// PEM file of the client certificate's private key, unencrypted, readable by the relay's
    /// user only (libpq's sslkey; wins over one in --database-url).
    #[arg(long, env = "OUTBOX_DB_CLIENT_KEY")]
    pub db_client_key: Option<std::path::PathBuf>,
}

// The validated form lives with the outbox, which is built from it (`Outbox::from_config`):
// so the outbox never imports the configuration, and the configuration builds it here.
pub use crate::outbox::{DatabaseConfig, Secret};

impl DatabaseArgs {
    /// Checks every rule that needs no I/O; the files the flags name are read later, once
    /// (see [`DatabaseConfig::read_secrets`]).
    pub fn validate(&self) -> Result<DatabaseConfig, String> {
        let url = match self.database_url.as_deref().map(str::trim) {
            Some(url) if !url.is_empty() => url.to_string(),
            _ => {
                return Err(
                    "--database-url (or DATABASE_URL) is required: the PostgreSQL database holding the outbox table"
                        .to_string(),
                )
            }
        };
        let selection = self.selection()?;
        let table = first_table(&selection);
        if self.connect_timeout.is_zero() {
            return Err("--connect-timeout must be above zero".to_string());
        }
        let url = match &self.db_ca_cert {
            Some(path) => crate::tls::with_root_cert(&url, path)?,
            None => url,
        };
        let url = match &self.db_client_cert {
            Some(path) => crate::tls::with_client_cert(&url, path)?,
            None => url,
        };
        let url = match &self.db_client_key {
            Some(path) => crate::tls::with_client_key(&url, path)?,
            None => url,
        };
        // sslmode and its certificate are checked now, before anything is touched.
        let (rest, tls) = crate::tls::split(&url).map_err(|e| {
            format!("--database-url is not a valid PostgreSQL URL or key=value string: {e}")
        })?;
        let ssl = tls.effective_mode()?;
        let password = match tokio_postgres::Config::from_str(&rest) {
            Ok(pg) => crate::dbauth::choose(
                &pg,
                ssl,
                self.database_password_file.as_deref(),
                self.database_iam_auth,
            )?,
            // Outbox::new says what is wrong with the string, in the words every command uses.
            Err(_) => PasswordSource::Url,
        };
        let (table, adopted) = self.table_and_columns(table)?;
        Ok(DatabaseConfig {
            url: Secret(url),
            table,
            selection,
            connect_timeout: self.connect_timeout,
            adopted,
            password,
            pooler: self.pooler,
        })
    }

    /// `--table` and `--tables` as a [`Selection`]: `outbox` when neither is given. An
    /// adopted table (`--column`) is one table with its own column map: not with several.
    fn selection(&self) -> Result<Selection, String> {
        let mut named = self
            .table
            .iter()
            .map(|t| t.parse::<TableName>())
            .collect::<Result<Vec<_>, _>>()?;
        let patterns = self
            .tables
            .iter()
            .map(|p| p.trim().parse::<Pattern>())
            .collect::<Result<Vec<_>, _>>()?;
        if named.is_empty() && patterns.is_empty() {
            named.push(TableName {
                schema: None,
                name: "outbox".to_string(),
            });
        }
        let selection = Selection { named, patterns };
        if selection.single().is_none() && !self.columns.is_empty() {
            return Err(
                "--column adopts one table: give one --table and no --tables with it".to_string(),
            );
        }
        Ok(selection)
    }

    /// `migrate --print-sql` without `--database-url`: the table and columns from the flags
    /// alone, and a placeholder URL that is parsed but never connected to.
    pub fn offline(&self) -> Result<DatabaseConfig, String> {
        let selection = self.selection()?;
        if selection.single().is_none() {
            return Err(
                "--print-sql without --database-url prints one table's SQL: give one --table"
                    .to_string(),
            );
        }
        let table = first_table(&selection);
        let (table, adopted) = self.table_and_columns(table)?;
        Ok(DatabaseConfig {
            url: Secret("postgres://localhost".to_string()),
            table,
            selection,
            connect_timeout: self.connect_timeout,
            adopted,
            password: PasswordSource::Url,
            pooler: self.pooler,
        })
    }

    /// The table the relay reads (an adopted table's view with --column) and the adopted one.
    fn table_and_columns(
        &self,
        table: TableName,
    ) -> Result<(TableName, Option<(TableName, ColumnMap)>), String> {
        if self.columns.is_empty() {
            return Ok((table, None));
        }
        let map = ColumnMap::from_pairs(&self.columns)?;
        Ok((table.relay_view(), Some((table, map))))
    }
}

/// The table of a one-table selection; with several, each is set in turn
/// ([`DatabaseConfig::for_table`]) and this first one only stands in.
fn first_table(selection: &Selection) -> TableName {
    selection.named.first().cloned().unwrap_or(TableName {
        schema: None,
        name: "outbox".to_string(),
    })
}

impl DatabaseConfig {
    /// The same settings for one table of the selection.
    pub fn for_table(&self, table: &TableName) -> DatabaseConfig {
        let mut one = self.clone();
        one.table = table.clone();
        one
    }

    /// The one look outside this process before anything starts: a missing or empty password
    /// file is a configuration mistake, reported as one. Later reads happen at each new
    /// connection, where a failure is retried.
    pub fn read_secrets(&self) -> Result<(), String> {
        if let PasswordSource::File(path) = &self.password {
            crate::dbauth::read_password_file(path)
                .map_err(|e| format!("--database-password-file: {e}"))?;
        }
        Ok(())
    }
}
