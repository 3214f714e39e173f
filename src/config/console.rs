//! The flags of `console`, the operators' web page, and the rules that keep it safe to leave
//! running: loopback unless told otherwise, a token wherever it listens beyond loopback, TLS
//! files in pairs, read-only and without payloads unless each is turned on.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::Args;

use super::{DatabaseArgs, DatabaseConfig};

#[derive(Debug, Clone, Args)]
pub struct ConsoleArgs {
    /// Where the database is and which tables (--table, --tables), as for `status`; run it with
    /// an operator's role, never the relays'.
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Where the console listens. An address beyond loopback needs a token.
    #[arg(long, env = "OUTBOX_CONSOLE_LISTEN", default_value = "127.0.0.1:8089")]
    pub listen: String,

    /// A file of tokens that open the console, one per line as NAME:TOKEN (the name is logged
    /// with every action) or a bare TOKEN (named `operator`); read once at start. With a token,
    /// every request needs it, on loopback too.
    #[arg(long, env = "OUTBOX_CONSOLE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,

    /// PEM certificate chain to serve HTTPS with (needs --tls-key).
    #[arg(long, env = "OUTBOX_CONSOLE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "OUTBOX_CONSOLE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// Turn on the actions that change rows: retry quarantined rows, replay sent ones. Off, the
    /// console only reads.
    #[arg(long, env = "OUTBOX_CONSOLE_ACTIONS", value_parser = BoolishValueParser::new())]
    pub actions: bool,

    /// Show events' payloads. Off, a payload never leaves the database through the console.
    #[arg(long, env = "OUTBOX_CONSOLE_PAYLOADS", value_parser = BoolishValueParser::new())]
    pub payloads: bool,

    /// How old the overview's figures may be: one `status` per table per interval, however
    /// many pages are open.
    #[arg(long, env = "OUTBOX_CONSOLE_REFRESH", default_value = "10s", value_parser = humantime::parse_duration)]
    pub refresh: Duration,

    /// Where the runbook (docs/operations.md) is published, e.g.
    /// https://git.example.com/outbox-relay/blob/main/docs/operations.md: each named cause
    /// links to its section there. Unset, the section is named as text.
    #[arg(long, env = "OUTBOX_CONSOLE_RUNBOOK_URL")]
    pub runbook_url: Option<String>,
}

/// `console`'s settings, validated.
#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    pub database: DatabaseConfig,
    pub listen: SocketAddr,
    pub token_file: Option<PathBuf>,
    /// Certificate chain and key, both or neither.
    pub tls: Option<(PathBuf, PathBuf)>,
    pub actions: bool,
    pub payloads: bool,
    pub refresh: Duration,
    pub runbook_url: Option<String>,
}

impl ConsoleArgs {
    pub fn validate(&self) -> Result<ConsoleConfig, String> {
        let database = self.database.validate()?;
        let listen: SocketAddr = self.listen.parse().map_err(|_| {
            format!(
                "--listen {:?} is not an address: use host:port, e.g. 127.0.0.1:8089",
                self.listen
            )
        })?;
        if !listen.ip().is_loopback() && self.token_file.is_none() {
            return Err(format!(
                "--listen {listen} is beyond loopback: the console needs a token there (--token-file), or listen on 127.0.0.1 and reach it through a port-forward"
            ));
        }
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            _ => return Err("--tls-cert and --tls-key go together".into()),
        };
        if let Some(url) = &self.runbook_url {
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return Err(format!(
                    "--runbook-url {url:?} must start with https:// or http://"
                ));
            }
        }
        if self.refresh < Duration::from_secs(1) {
            return Err(
                "--refresh must be at least 1s: each refresh reads every table's status".into(),
            );
        }
        Ok(ConsoleConfig {
            database,
            listen,
            token_file: self.token_file.clone(),
            tls,
            actions: self.actions,
            payloads: self.payloads,
            refresh: self.refresh,
            runbook_url: self.runbook_url.clone(),
        })
    }
}
