//! `outbox-relay check`: everything `run` would stumble over, tried before it does.
//!
//! Takes exactly `run`'s flags, so it checks the configuration that will run. Each check
//! prints one line as it completes, `ok   <what>` or `FAIL <what>: <how to fix>`. The facts
//! come from `outbox` (the catalog), `sqs` (GetQueueAttributes) and `s3` (a probe object,
//! with `--offload-bucket`); the verdicts on them are
//! the pure `judge_*` functions here, unit-tested without a server.

use std::fmt;
use std::time::Duration;

use crate::config::{Retention, RunArgs, RunConfig};
use crate::destination::{Client, Destination};
use crate::outbox::inspect::{ColumnFacts, TableFacts, TriggerFacts, RELAY_COLUMNS};
use crate::outbox::{quote_ident, Outbox, OutboxError, Purpose};
use crate::retry::{RequestFailure, Transport};
use crate::sink::s3::S3;
use crate::sink::{Attributes, Sinks};

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// What was checked, e.g. `table "outbox" exists`.
    pub what: String,
    /// `Ok(note)`: passed, with an optional remark; `Err(fix)`: what is wrong and how to fix it.
    pub result: Result<Option<String>, String>,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One line each, whatever a server put in its message.
        let flat = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        match &self.result {
            Ok(None) => write!(f, "ok   {}", self.what),
            Ok(Some(note)) => write!(f, "ok   {} ({})", self.what, flat(note)),
            Err(fix) => write!(f, "FAIL {}: {}", self.what, flat(fix)),
        }
    }
}

/// Prints each verdict as it comes, so a slow check shows where it is.
#[derive(Default)]
struct Report {
    failed: usize,
    /// The table the lines are about when the selection has several: `[table] ` starts
    /// each line's `what`, after the `ok`/`FAIL` that scripts look for.
    table: Option<String>,
}

impl Report {
    fn add(&mut self, what: impl Into<String>, result: Result<Option<String>, String>) -> bool {
        let what = what.into();
        let verdict = Verdict {
            what: match &self.table {
                Some(table) => format!("[{table}] {what}"),
                None => what,
            },
            result,
        };
        println!("{verdict}");
        let ok = verdict.result.is_ok();
        if !ok {
            self.failed += 1;
        }
        ok
    }
}

/// Runs every check; true when all passed.
pub async fn run(args: &RunArgs) -> bool {
    let mut report = Report::default();
    // A missing password file is a configuration mistake, as in every other command.
    let config = match args
        .validate()
        .and_then(|config| config.database.read_secrets().map(|()| config))
    {
        Ok(config) => {
            report.add("configuration", Ok(None));
            config
        }
        Err(e) => {
            // Nothing else can be checked reliably against a configuration that will not run.
            report.add("configuration", Err(e));
            return false;
        }
    };
    if crate::otel::wanted() {
        let verdict = crate::otel::check_settings()
            .map(|()| Some("a span per event over OTLP/HTTP".to_string()));
        report.add("tracing settings (OTEL_*)", verdict);
    }
    check_tables(&config, &mut report).await;
    check_queues(&config, &mut report).await;
    check_offload(&config, &mut report).await;
    report.failed == 0
}

/// Whether a table's checks also report what holds for the whole database, whichever table
/// a connection is for: with several tables, that is reported once, with the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// The connection's pooler and the settings imposed on the role, then the table.
    DatabaseAndTable,
    Table,
}

/// The database checks of every table the selection names or matches: one table as it
/// always was, several each under its label.
async fn check_tables(config: &RunConfig, report: &mut Report) {
    let db = &config.database;
    if db.selection.single().is_some() {
        return check_database(config, db, Scope::DatabaseAndTable, report).await;
    }
    let outbox = match Outbox::from_config(db, Purpose::Relay(config.relay_settings())) {
        Ok(o) => o,
        Err(e) => {
            report.add("database settings", Err(e.to_string()));
            return;
        }
    };
    let tables = match outbox.connector().select(&db.selection).await {
        Ok(tables) => tables,
        Err(e) => {
            report.add("the tables --tables selects", Err(e.to_string()));
            return;
        }
    };
    let unmatched = db.selection.unmatched(&tables);
    for pattern in &db.selection.patterns {
        let verdict = if unmatched.contains(&pattern) {
            Err("no outbox table (one with event_id and payload) matches it: fix --tables, or run `outbox-relay migrate --table SCHEMA.TABLE` for each table".to_string())
        } else {
            Ok(None)
        };
        report.add(format!("--tables '{pattern}' selects a table"), verdict);
    }
    for (i, table) in tables.iter().enumerate() {
        let scope = if i == 0 {
            Scope::DatabaseAndTable
        } else {
            Scope::Table
        };
        report.table = Some(table.to_string());
        check_database(config, &db.for_table(table), scope, report).await;
    }
    report.table = None;
}

async fn check_database(
    config: &RunConfig,
    db: &crate::outbox::DatabaseConfig,
    scope: Scope,
    report: &mut Report,
) {
    let table = db.table.quoted();
    let build = |database: &crate::outbox::DatabaseConfig| {
        Outbox::from_config(database, Purpose::Relay(config.relay_settings()))
    };
    let outbox = match build(db) {
        Ok(o) => o,
        Err(e) => {
            report.add("database settings", Err(e.to_string()));
            return;
        }
    };
    // As `run` does: an unqualified --table resolved once on the role's search_path.
    let (outbox, table) = match outbox.resolve_table().await {
        Ok(Some(resolved)) => {
            report.add(format!("table {table}"), Ok(Some(resolved.describe())));
            match build(&resolved.apply(db)) {
                Ok(o) => (o.pooler_as(&outbox), resolved.table.quoted()),
                Err(e) => {
                    report.add("database settings", Err(e.to_string()));
                    return;
                }
            }
        }
        _ => (outbox, table),
    };
    let reachable = format!("database reachable at {}", outbox.connector().target());
    let facts = match outbox.inspect().await {
        Err(e @ OutboxError::Connect { .. }) => {
            report.add(reachable, Err(e.to_string()));
            return;
        }
        Err(e @ OutboxError::Pooler(_)) => {
            report.add(reachable, Ok(None));
            report.add(
                format!("connections: --pooler {}", db.pooler),
                Err(e.to_string()),
            );
            return;
        }
        Err(e) => {
            report.add(reachable, Ok(None));
            report.add(format!("table {table} readable"), Err(e.to_string()));
            return;
        }
        Ok(facts) => {
            report.add(reachable, Ok(None));
            facts
        }
    };
    if scope == Scope::DatabaseAndTable {
        check_session(db, &outbox, report).await;
    }
    let Some(facts) = facts else {
        if let e @ OutboxError::TableHidden { .. } = outbox.why_missing().await {
            report.add(format!("table {table} exists"), Err(e.to_string()));
            return;
        }
        let fix = match &db.adopted {
            Some(_) => "run `outbox-relay migrate --adopt` with the same --table and --column flags, or fix --table",
            None => "run `outbox-relay migrate` with the same --table, or fix --table",
        };
        report.add(format!("table {table} exists"), Err(fix.to_string()));
        return;
    };
    report.add(format!("table {table} exists"), Ok(None));
    let shape_ok = report.add(
        format!("table {table} has the relay's columns and types"),
        judge_columns(&facts.columns).map(|()| None),
    );
    let needs_delete = config.maintenance.retention != Retention::Off;
    let privileges_ok = report.add(
        format!(
            "role {} has the privileges the relay needs on {table}",
            facts.role
        ),
        judge_privileges(&facts, &table, needs_delete),
    );
    report.add(
        format!("triggers and rules on {table}"),
        judge_triggers(&facts.triggers),
    );
    if shape_ok && privileges_ok {
        // Preparing the relay's own statements finds what the catalog checks cannot: a
        // missing index for --group-by / --fair-by, or a table the statements do not fit;
        // the connection also reads the schema's contract, which must admit this relay.
        let prepared = match outbox.connect().await {
            Ok(_) => match outbox.verdict().filter(|(v, _)| !v.claims()) {
                Some((verdict, _)) => Err(outbox.refusal(verdict).to_string()),
                None => Ok(None),
            },
            Err(e) => Err(e.to_string()),
        };
        report.add(
            format!("the relay's statements prepare on {table}"),
            prepared,
        );
    }
    check_wakeup(config, &outbox, report).await;
}

/// What holds for the connection whatever its table: the pooler between, and the settings
/// the database, role or URL impose.
async fn check_session(db: &crate::outbox::DatabaseConfig, outbox: &Outbox, report: &mut Report) {
    report.add(
        format!("connections: --pooler {}", db.pooler),
        outbox
            .connector()
            .pooler_report()
            .await
            .map(Some)
            .map_err(|e| e.to_string()),
    );
    match outbox.imposed_settings().await {
        Ok(settings) => {
            for setting in &settings {
                report.add(
                    format!(
                        "setting {} = {} ({})",
                        setting.name, setting.value, setting.source
                    ),
                    judge_setting(setting),
                );
            }
        }
        Err(e) => {
            report.add("the session's settings", Err(e.to_string()));
        }
    }
}

/// The wake-up mode finds what it needs in the database, and nothing it does not use that
/// costs the application (a leftover NOTIFY trigger).
async fn check_wakeup(config: &RunConfig, outbox: &Outbox, report: &mut Report) {
    let what = format!("wake-up mode {} is set up", config.claim.wakeup);
    let verdict = match outbox.installed_wakeup().await {
        Ok(installed) => installed.judge(config.claim.wakeup).map(|()| None),
        Err(e) => Err(e.to_string()),
    };
    let verdict = verdict.and_then(|v| {
        outbox
            .connector()
            .pooler_allows(config.claim.wakeup)
            .map(|()| v)
            .map_err(|e| e.to_string())
    });
    let verdict = match verdict {
        Ok(_) if config.claim.wakeup == crate::outbox::Wakeup::Logical => outbox
            .check_logical()
            .await
            .map(|()| None)
            .map_err(|e| e.to_string()),
        other => other,
    };
    report.add(what, verdict);
}

/// What a setting a database, role or URL imposes means for the relay (issue 26, item 2).
/// Each one listed works: the relay states in its transactions what it relies on, sets its
/// own timeouts, resolves the table once, and reads values in the binary format; the line
/// says which of these covers it.
pub fn judge_setting(
    setting: &crate::outbox::inspect::ImposedSetting,
) -> Result<Option<String>, String> {
    let note = match setting.name.as_str() {
        "default_transaction_isolation" => "the relay states READ COMMITTED in every transaction",
        "default_transaction_read_only" => "the relay states READ WRITE in every write",
        "statement_timeout" | "lock_timeout" | "idle_in_transaction_session_timeout" => {
            "the relay sets its own from --db-timeout"
        }
        "search_path" => "an unqualified --table is resolved on it once",
        "client_encoding" => "the relay's connections ask for UTF8",
        "session_replication_role" if setting.value == "replica" => {
            "triggers do not fire for the relay's writes; it relies on none"
        }
        _ => "values are read in the binary format",
    };
    Ok(Some(note.to_string()))
}

/// Every column of the migration, with a type the relay's statements can use.
/// The table's triggers and rules, each with what it can do to the relay: a rule that
/// rewrites the relay's DELETE or UPDATE fails (PostgreSQL refuses the settlement); a trigger
/// passes with what it does said, since only its function knows whether it keeps rows (the
/// relay stops claiming on the table if one does).
pub fn judge_triggers(triggers: &[TriggerFacts]) -> Result<Option<String>, String> {
    if triggers.is_empty() {
        return Ok(Some("none".to_string()));
    }
    let said = |t: &TriggerFacts| format!("{}: {}", t.what, t.effect);
    let breaking: Vec<String> = triggers
        .iter()
        .filter(|t| t.undoes && t.what.starts_with("rule "))
        .map(said)
        .collect();
    if !breaking.is_empty() {
        return Err(format!(
            "{}; drop the rule, or make it leave the relay's DELETE and UPDATE as they are",
            breaking.join("; ")
        ));
    }
    Ok(Some(
        triggers.iter().map(said).collect::<Vec<_>>().join("; "),
    ))
}

pub fn judge_columns(columns: &[ColumnFacts]) -> Result<(), String> {
    let mut problems = Vec::new();
    for (name, kind, _) in RELAY_COLUMNS {
        match columns.iter().find(|c| c.name == *name) {
            None => problems.push(format!("{name} ({}) is missing", kind.as_sql())),
            Some(c) if !kind.accepts(&c.sql_type, &c.category) => problems.push(format!(
                "{name} is {}, expected {}",
                c.sql_type,
                kind.as_sql()
            )),
            Some(_) => {}
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{}; run `outbox-relay migrate` (or `migrate --adopt` for an adopted table) to bring it to the current shape",
        problems.join("; ")
    ))
}

/// SELECT on every column, UPDATE on the columns the relay owns, DELETE when sent rows are
/// deleted (retention or --delete-on-ack), USAGE on the schema; on the relay's own tables
/// beside it what `inspect::BESIDE` lists (the lease table, the registry, the schema version
/// table); nothing else. What is more than needed is remarked on, not failed: it works, it is just
/// not least privilege. A missing lease table is not judged here: preparing the relay's
/// statements names it, with the `migrate` that creates it.
pub fn judge_privileges(
    facts: &TableFacts,
    table: &str,
    needs_delete: bool,
) -> Result<Option<String>, String> {
    let relevant = |name: &str| facts.columns.iter().find(|c| c.name == name);
    let no_select: Vec<&str> = RELAY_COLUMNS
        .iter()
        .filter(|(name, _, _)| relevant(name).is_some_and(|c| !c.can_select))
        .map(|(name, _, _)| *name)
        .collect();
    let no_update: Vec<&str> = RELAY_COLUMNS
        .iter()
        .filter(|(name, _, updated)| *updated && relevant(name).is_some_and(|c| !c.can_update))
        .map(|(name, _, _)| *name)
        .collect();
    let mut missing = Vec::new();
    let mut grant = Vec::new();
    if !no_select.is_empty() {
        missing.push(format!("SELECT on {}", no_select.join(", ")));
        grant.push("SELECT");
    }
    if !no_update.is_empty() {
        missing.push(format!("UPDATE on {}", no_update.join(", ")));
        grant.push("UPDATE");
    }
    if needs_delete && !facts.can_delete {
        missing.push("DELETE (retention deletes sent rows; or set --retention off)".to_string());
        grant.push("DELETE");
    }
    // What the relay's own tables lack, each with its name.
    let beside_grants: Vec<(&str, String)> = facts
        .beside
        .iter()
        .filter(|b| !b.lacking.is_empty())
        .map(|b| {
            let lacking = b.lacking.join(", ");
            missing.push(format!("{lacking} on {} {}", b.what, b.name));
            (b.name.as_str(), lacking)
        })
        .collect();
    let role = quote_ident(&facts.role);
    if !facts.schema_usage {
        missing.push("USAGE on the table's schema".to_string());
    }
    if !missing.is_empty() {
        let mut fix = Vec::new();
        if !grant.is_empty() {
            fix.push(format!("GRANT {} ON {table} TO {role};", grant.join(", ")));
        }
        for (name, lacking) in &beside_grants {
            fix.push(format!("GRANT {lacking} ON {name} TO {role};"));
        }
        if !facts.schema_usage {
            fix.push(format!(
                "GRANT USAGE ON SCHEMA <the table's schema> TO {role};"
            ));
        }
        return Err(format!(
            "missing {}: {} (sql/roles.sql sets up a least-privilege role)",
            missing.join("; "),
            fix.join(" ")
        ));
    }
    let note = if facts.superuser {
        Some("a superuser: it passes every check, so this proves little; run the relay as a role like sql/roles.sql's".to_string())
    } else if facts.owner {
        Some(
            "it owns the table: the relay needs only SELECT, UPDATE and DELETE on it and a few privileges on its own tables beside it, see sql/roles.sql"
                .to_string(),
        )
    } else if !facts.extra.is_empty() {
        Some(format!(
            "also holds {}, which the relay never uses",
            facts.extra.join(", ")
        ))
    } else {
        None
    };
    Ok(note)
}

async fn check_queues(config: &RunConfig, report: &mut Report) {
    let mut queues: Vec<(&Destination, String)> =
        vec![(&config.destination.queue_url, "--queue-url".into())];
    for (key, url) in &config.order.routes {
        if !queues.iter().any(|(u, _)| *u == url) {
            queues.push((url, format!("--route {key}=...")));
        }
    }
    // The relay's own send timeout bounds each call, so an unreachable endpoint cannot hang.
    let sinks = Sinks::new(
        config.endpoints(),
        config.send.send_timeout.max(Duration::from_secs(1)),
    )
    .await;
    for (url, flag) in queues {
        let read = sinks.of(url).attributes(url).await;
        if url.client() == Client::Sns {
            match read {
                Ok(info) => {
                    report.add(
                        format!("topic {url} reachable"),
                        Ok(Some(describe_topic(&info))),
                    );
                    report.add(
                        format!("topic {url} message size"),
                        Ok(Some(describe_topic_size(
                            url,
                            &info,
                            config.send.max_request_bytes,
                            config.offload.plan.is_some(),
                        ))),
                    );
                }
                Err(failure) => {
                    report.add(
                        format!("topic {url} reachable"),
                        Err(explain_topic_failure(&failure, &flag)),
                    );
                }
            }
            continue;
        }
        let info = match read {
            Ok(info) => {
                report.add(format!("queue {url} reachable"), Ok(None));
                info
            }
            Err(failure) => {
                report.add(
                    format!("queue {url} reachable"),
                    Err(explain_queue_failure(&failure, &flag)),
                );
                continue;
            }
        };
        report.add(
            format!("queue {url} accepts messages of --max-request-bytes"),
            judge_message_size(&info, config.send.max_request_bytes),
        );
        report.add(
            format!("queue {url} FIFO settings"),
            judge_fifo(url, &info, &flag),
        );
    }
}

/// `--offload-bucket`: one PutObject of a small probe object under the prefix, the only call
/// and permission the relay needs (it never reads, lists or deletes). The probe stays, and the
/// next check overwrites it.
async fn check_offload(config: &RunConfig, report: &mut Report) {
    let Some(offload) = &config.offload.plan else {
        return;
    };
    let s3 = S3::new(
        &offload.bucket,
        config.offload.s3_endpoint.as_deref(),
        config.send.send_timeout.max(Duration::from_secs(1)),
    )
    .await;
    let what = format!(
        "bucket {} takes objects under {:?}",
        offload.bucket.address(),
        offload.prefix
    );
    let result = match s3.probe(&offload.prefix).await {
        Ok(()) => Ok(Some(format!(
            "wrote {}{}",
            offload.prefix,
            crate::sink::s3::PROBE_KEY
        ))),
        Err(failure) => Err(explain_bucket_failure(&failure)),
    };
    report.add(what, result);
}

/// How to fix a failed probe PutObject, by what S3 said.
pub fn explain_bucket_failure(failure: &RequestFailure) -> String {
    let fix = match (failure.transport, failure.code.as_deref().unwrap_or("")) {
        (Transport::Construction, _) => {
            "no usable AWS credentials or region: set AWS_REGION and credentials (environment, profile, web identity or instance role)"
        }
        (Transport::Timeout | Transport::Connection, _) => {
            "cannot reach S3: check --s3-endpoint-url (AWS_ENDPOINT_URL_S3), the network path and proxies"
        }
        (_, "NoSuchBucket") => {
            "the bucket does not exist: create it (with a lifecycle rule, docs/large-events.md), or fix --offload-bucket and the region"
        }
        (_, "AccessDenied" | "AllAccessDisabled") => {
            "access denied: allow s3:PutObject on arn:aws:s3:::BUCKET/PREFIX* for the relay's credentials (and kms:GenerateDataKey if the bucket uses SSE-KMS)"
        }
        _ if crate::retry::is_wrong_region(failure) => {
            let region = bucket_region(&failure.message).unwrap_or("the bucket's region");
            return format!(
                "the bucket is in another region than the relay: set AWS_REGION to {region} (or --s3-endpoint-url to its regional endpoint){}",
                match (&failure.code, failure.status) {
                    (Some(code), _) => format!(" [{code}]"),
                    (None, Some(status)) => format!(" [HTTP {status}]"),
                    (None, None) => String::new(),
                }
            );
        }
        _ => "S3 refused PutObject",
    };
    let said = match (&failure.code, failure.status) {
        (Some(code), _) => format!(" [{code}]"),
        (None, Some(status)) => format!(" [HTTP {status}]"),
        (None, None) => String::new(),
    };
    format!("{fix}{said}")
}

/// The bucket's region where S3 named it: the `x-amz-bucket-region` of a redirect (which
/// `sink/s3.rs` puts in the message), or the "expecting 'eu-west-1'" of a refused signature.
fn bucket_region(message: &str) -> Option<&str> {
    let after = |marker: &str, end: char| {
        let start = message.find(marker)? + marker.len();
        let rest = &message[start..];
        Some(&rest[..rest.find(end)?])
    };
    after("(the bucket is in ", ')').or_else(|| after("expecting '", '\''))
}

/// How to fix a failed GetQueueAttributes, by what SQS said.
pub fn explain_queue_failure(failure: &RequestFailure, flag: &str) -> String {
    let code = failure.code.as_deref().unwrap_or("");
    let bare = code.rsplit(['.', '#']).next().unwrap_or(code);
    let fix = match (failure.transport, bare) {
        (Transport::Construction, _) => {
            "no usable AWS credentials or region: set AWS_REGION and credentials (environment, profile, web identity or instance role)".to_string()
        }
        (Transport::Timeout | Transport::Connection, _) => {
            "cannot reach SQS: check --sqs-endpoint-url (AWS_ENDPOINT_URL_SQS), the network path and proxies".to_string()
        }
        (_, "QueueDoesNotExist" | "NonExistentQueue" | "QueueDeletedRecently") => {
            format!("the queue does not exist: create it, or fix {flag} (and the region or endpoint)")
        }
        (_, "AccessDenied" | "AccessDeniedException" | "KmsAccessDenied") => {
            "access denied: allow sqs:GetQueueAttributes (for check) and sqs:SendMessage on this queue for the relay's credentials".to_string()
        }
        // What SQS says of a queue URL of another region than the endpoint the request reached.
        (_, "InvalidAddress") => {
            format!("this endpoint does not serve the queue URL: set AWS_REGION to the region in the URL (or --sqs-endpoint-url to its endpoint), or fix {flag}")
        }
        (
            _,
            "InvalidClientTokenId" | "UnrecognizedClientException" | "SignatureDoesNotMatch"
            | "IncompleteSignature" | "MissingAuthenticationToken" | "ExpiredToken"
            | "ExpiredTokenException" | "RequestExpired",
        ) => "the AWS credentials were refused: check the access key, secret and session token the credential chain finds".to_string(),
        _ => "SQS refused GetQueueAttributes".to_string(),
    };
    let said = match (&failure.code, failure.status) {
        (Some(code), _) => format!(" [{code}]"),
        (None, Some(status)) => format!(" [HTTP {status}]"),
        (None, None) => String::new(),
    };
    format!("{fix}{said}")
}

/// What `check` says of a reachable topic. SNS itself requires a FIFO topic's name to end in
/// `.fifo`, so the ARN cannot disagree with the topic as a queue URL can.
pub fn describe_topic(info: &Attributes) -> String {
    if info.fifo {
        format!(
            "FIFO topic; content-based deduplication {}: the relay sends event_id as the deduplication ID either way",
            if info.content_based_deduplication { "on" } else { "off" }
        )
    } else {
        "standard topic".to_string()
    }
}

/// What `check` says of a reachable topic's size limit: what it reported and what the relay
/// makes of it (the rule: [`Destination::limits`]). Never a failure: the relay sends a topic
/// only what it takes, and a larger event goes through S3 or into quarantine before sending.
pub fn describe_topic_size(
    topic: &Destination,
    info: &Attributes,
    max_request_bytes: usize,
    offload: bool,
) -> String {
    let limit = topic
        .limits(max_request_bytes, info.maximum_message_size)
        .bytes;
    let found = match info.maximum_message_size {
        Some(reported) if reported > max_request_bytes => format!(
            "MaximumMessageSize {reported}, held to --max-request-bytes {max_request_bytes}"
        ),
        Some(reported) => format!("MaximumMessageSize {reported}"),
        None => format!(
            "the topic does not report MaximumMessageSize (created before SNS took 1 MiB, or an emulator): {} assumed",
            crate::destination::SNS_UNREPORTED_MAX_BYTES
        ),
    };
    let larger = if offload {
        "through S3 (--offload-bucket)"
    } else {
        "are quarantined as too_large (--offload-bucket would send them through S3)"
    };
    format!("{found}: the relay sends it messages of up to {limit} bytes, larger ones {larger}")
}

/// How to fix a failed GetTopicAttributes, by what SNS said.
pub fn explain_topic_failure(failure: &RequestFailure, flag: &str) -> String {
    let code = failure.code.as_deref().unwrap_or("");
    let fix = match (failure.transport, code) {
        (Transport::Timeout | Transport::Connection, _) => {
            "cannot reach SNS: check --sns-endpoint-url (AWS_ENDPOINT_URL_SNS), the network path and proxies".to_string()
        }
        (_, "NotFound" | "NotFoundException") => {
            format!("the topic does not exist: create it, or fix {flag} (its region and account are in the ARN)")
        }
        (_, "AuthorizationError" | "AuthorizationErrorException" | "KMSAccessDenied") => {
            "access denied: allow sns:Publish and sns:GetTopicAttributes (the relay reads the topic's MaximumMessageSize) on this topic for the relay's credentials".to_string()
        }
        // SNS says only "Invalid parameter: TopicArn" of a topic in another region.
        _ if crate::retry::is_wrong_region(failure) => {
            format!("the topic is not in the relay's region: set AWS_REGION to the region its ARN names (or --sns-endpoint-url to that region's endpoint), or fix {flag}")
        }
        // Credentials and region fail the same way whichever service is asked.
        _ => {
            let sqs_said = explain_queue_failure(failure, flag);
            if sqs_said.starts_with("SQS refused") {
                "SNS refused GetTopicAttributes".to_string()
            } else {
                return sqs_said;
            }
        }
    };
    let said = match (&failure.code, failure.status) {
        (Some(code), _) => format!(" [{code}]"),
        (None, Some(status)) => format!(" [HTTP {status}]"),
        (None, None) => String::new(),
    };
    format!("{fix}{said}")
}

/// The queue must take the largest message the relay may send; a message between the two
/// sizes would be refused as a sender fault and quarantined.
pub fn judge_message_size(
    info: &Attributes,
    max_request_bytes: usize,
) -> Result<Option<String>, String> {
    match info.maximum_message_size {
        None => Ok(Some(
            "the server does not report MaximumMessageSize; not compared".to_string(),
        )),
        Some(queue) if queue < max_request_bytes => Err(format!(
            "the queue's MaximumMessageSize is {queue} bytes, below --max-request-bytes {max_request_bytes}, so messages in between would be quarantined: set --max-request-bytes {queue}, or raise the queue's MaximumMessageSize"
        )),
        Some(queue) => Ok(Some(format!(
            "MaximumMessageSize {queue} >= --max-request-bytes {max_request_bytes}"
        ))),
    }
}

/// A `.fifo` URL turns on the FIFO fields; it must name a FIFO queue, and only then.
pub fn judge_fifo(
    url: &Destination,
    info: &Attributes,
    flag: &str,
) -> Result<Option<String>, String> {
    let by_url = url.is_fifo();
    match (by_url, info.fifo) {
        (true, true) => Ok(Some(format!(
            "FIFO; content-based deduplication {}: the relay sends event_id as the deduplication ID either way",
            if info.content_based_deduplication { "on" } else { "off" }
        ))),
        (false, false) => Ok(Some("standard queue".to_string())),
        (true, false) => Err(format!(
            "the URL ends in .fifo but the queue is not FIFO, so the relay would send FIFO fields it refuses: fix {flag}"
        )),
        (false, true) => Err(format!(
            "the queue is FIFO but the URL does not end in .fifo, so the relay would send no MessageGroupId: fix {flag}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::inspect::BesideFacts;

    #[test]
    fn every_imposed_setting_gets_a_line_saying_what_covers_it() {
        use crate::outbox::inspect::{ImposedSetting, IMPOSED_SETTINGS};
        for name in IMPOSED_SETTINGS {
            let setting = ImposedSetting {
                name: name.to_string(),
                value: "x".to_string(),
                source: "user".to_string(),
            };
            let note = judge_setting(&setting).expect("works").expect("a note");
            assert!(!note.is_empty() && !note.contains('\n'), "{name}: {note}");
        }
        let isolation = ImposedSetting {
            name: "default_transaction_isolation".to_string(),
            value: "serializable".to_string(),
            source: "user".to_string(),
        };
        assert!(judge_setting(&isolation)
            .unwrap()
            .unwrap()
            .contains("READ COMMITTED"));
    }

    fn column(name: &str, sql_type: &str, category: &str) -> ColumnFacts {
        ColumnFacts {
            name: name.into(),
            sql_type: sql_type.into(),
            category: category.into(),
            can_select: true,
            can_update: true,
        }
    }

    fn migrated_columns() -> Vec<ColumnFacts> {
        RELAY_COLUMNS
            .iter()
            .map(|(name, kind, _)| match kind.as_sql() {
                "timestamptz" => column(name, "timestamp with time zone", "D"),
                "text" => column(name, "text", "S"),
                "jsonb" => column(name, "jsonb", "U"),
                other => column(name, other, "N"),
            })
            .collect()
    }

    fn facts() -> TableFacts {
        TableFacts {
            role: "relay".into(),
            superuser: false,
            owner: false,
            schema_usage: true,
            can_delete: true,
            extra: vec![],
            columns: migrated_columns(),
            beside: vec![BesideFacts {
                what: "the lease table",
                name: "\"outbox_claims\"".into(),
                lacking: vec![],
            }],
            triggers: vec![],
        }
    }

    #[test]
    fn triggers_are_named_with_what_they_do_and_a_rewriting_rule_fails() {
        let fact = |what: &str, undoes: bool| TriggerFacts {
            what: what.to_string(),
            effect: "effect".to_string(),
            undoes,
        };
        assert_eq!(judge_triggers(&[]), Ok(Some("none".to_string())));
        let keep = fact(
            "trigger keep (BEFORE DELETE FOR EACH ROW, function k)",
            true,
        );
        let audit = fact(
            "trigger audit (AFTER DELETE FOR EACH ROW, function a)",
            false,
        );
        let passed = judge_triggers(&[keep, audit.clone()]).unwrap().unwrap();
        assert!(passed.contains("trigger keep") && passed.contains("trigger audit"));
        let rule = fact("rule keep (ON DELETE DO INSTEAD)", true);
        let failed = judge_triggers(&[audit, rule]).unwrap_err();
        assert!(
            failed.contains("rule keep") && !failed.contains("audit"),
            "{failed}"
        );
    }

    #[test]
    fn the_migrated_shape_passes_and_each_difference_is_named() {
        assert_eq!(judge_columns(&migrated_columns()), Ok(()));
        let mut cols = migrated_columns();
        cols.retain(|c| c.name != "message_id");
        cols.iter_mut()
            .find(|c| c.name == "attempts")
            .unwrap()
            .sql_type = "bigint".into();
        cols.iter_mut()
            .find(|c| c.name == "event_id")
            .unwrap()
            .sql_type = "character varying(128)".into();
        let err = judge_columns(&cols).unwrap_err();
        assert!(err.contains("message_id (text) is missing"), "{err}");
        // The lease columns of schema version 1 are not needed: `migrate --contract` drops them.
        let mut contracted = migrated_columns();
        contracted.retain(|c| !c.name.starts_with("lease_"));
        assert_eq!(judge_columns(&contracted), Ok(()));
        assert!(
            err.contains("attempts is bigint, expected integer"),
            "{err}"
        );
        assert!(!err.contains("event_id"), "varchar serves as text: {err}");
        assert!(err.contains("outbox-relay migrate"), "{err}");
    }

    #[test]
    fn missing_privileges_are_named_with_the_grant_that_fixes_them() {
        assert_eq!(judge_privileges(&facts(), "\"outbox\"", true), Ok(None));
        let mut select_only = facts();
        select_only.can_delete = false;
        for c in &mut select_only.columns {
            c.can_update = false;
        }
        let err = judge_privileges(&select_only, "\"outbox\"", true).unwrap_err();
        assert!(
            err.contains("missing UPDATE on available_at, attempts"),
            "{err}"
        );
        assert!(
            err.contains("GRANT UPDATE, DELETE ON \"outbox\" TO \"relay\";"),
            "{err}"
        );
        assert!(
            !err.contains("created_at"),
            "the relay never updates it: {err}"
        );
        // Without retention, DELETE is not needed.
        let err = judge_privileges(&select_only, "\"outbox\"", false).unwrap_err();
        assert!(!err.contains("DELETE"), "{err}");
        let mut no_schema = facts();
        no_schema.schema_usage = false;
        assert!(judge_privileges(&no_schema, "\"app\".\"outbox\"", true)
            .unwrap_err()
            .contains("GRANT USAGE ON SCHEMA"));
    }

    #[test]
    fn missing_privileges_on_the_lease_table_are_named_with_the_grant_that_fixes_them() {
        // As the role of an older sql/roles.sql has it: all it needs on the table, nothing on
        // the lease table that came with schema version 2.
        let mut old_role = facts();
        old_role.beside = vec![BesideFacts {
            what: "the lease table",
            name: "\"app\".\"outbox_claims\"".into(),
            lacking: vec!["SELECT".into(), "INSERT".into(), "DELETE".into()],
        }];
        let err = judge_privileges(&old_role, "\"app\".\"outbox\"", true).unwrap_err();
        assert!(
            err.contains(
                "missing SELECT, INSERT, DELETE on the lease table \"app\".\"outbox_claims\""
            ),
            "{err}"
        );
        assert!(
            err.contains("GRANT SELECT, INSERT, DELETE ON \"app\".\"outbox_claims\" TO \"relay\";"),
            "{err}"
        );
        assert!(
            !err.contains("ON \"app\".\"outbox\" TO"),
            "nothing is missing on the table itself: {err}"
        );
        // Each privilege on its own, also when DELETE on the table is not needed: the lease
        // table's rows are deleted by every settlement, whatever the retention.
        for privilege in ["SELECT", "INSERT", "DELETE"] {
            let mut one = facts();
            one.beside[0].lacking = vec![privilege.to_string()];
            let err = judge_privileges(&one, "\"outbox\"", false).unwrap_err();
            assert!(
                err.contains(&format!(
                    "GRANT {privilege} ON \"outbox_claims\" TO \"relay\";"
                )),
                "{err}"
            );
        }
        // Both tables short of something: one line, both GRANTs.
        let mut both = old_role.clone();
        both.can_delete = false;
        let err = judge_privileges(&both, "\"app\".\"outbox\"", true).unwrap_err();
        assert!(
            err.contains("GRANT DELETE ON \"app\".\"outbox\" TO \"relay\"; GRANT SELECT, INSERT, DELETE ON \"app\".\"outbox_claims\" TO \"relay\";"),
            "{err}"
        );
        // The registry and the version table of schema version 4, named like the lease table.
        let mut no_registry = facts();
        no_registry.beside.push(BesideFacts {
            what: "the relay registry",
            name: "\"outbox_relays\"".into(),
            lacking: vec!["UPDATE".into()],
        });
        no_registry.beside.push(BesideFacts {
            what: "the schema version table",
            name: "\"outbox_relay_schema\"".into(),
            lacking: vec!["SELECT".into()],
        });
        let err = judge_privileges(&no_registry, "\"outbox\"", true).unwrap_err();
        assert!(
            err.contains("missing UPDATE on the relay registry \"outbox_relays\"; SELECT on the schema version table \"outbox_relay_schema\""),
            "{err}"
        );
        assert!(
            err.contains("GRANT UPDATE ON \"outbox_relays\" TO \"relay\"; GRANT SELECT ON \"outbox_relay_schema\" TO \"relay\";"),
            "{err}"
        );
        // No lease table yet: preparing the statements reports it (with `migrate`), not this.
        let mut none = facts();
        none.beside.clear();
        assert_eq!(judge_privileges(&none, "\"outbox\"", true), Ok(None));
    }

    #[test]
    fn more_than_needed_passes_with_a_remark() {
        let mut wide = facts();
        wide.extra = vec!["INSERT".into(), "TRUNCATE".into()];
        let note = judge_privileges(&wide, "\"outbox\"", true)
            .unwrap()
            .unwrap();
        assert!(note.contains("INSERT, TRUNCATE"), "{note}");
        let mut root = facts();
        root.superuser = true;
        assert!(judge_privileges(&root, "\"outbox\"", true)
            .unwrap()
            .unwrap()
            .contains("superuser"));
    }

    #[test]
    fn the_queue_must_take_our_largest_message() {
        let info = |size| Attributes {
            maximum_message_size: size,
            fifo: false,
            content_based_deduplication: false,
        };
        assert!(judge_message_size(&info(Some(1_048_576)), 1_048_576).is_ok());
        let err = judge_message_size(&info(Some(262_144)), 1_048_576).unwrap_err();
        assert!(err.contains("set --max-request-bytes 262144"), "{err}");
        assert!(judge_message_size(&info(None), 1_048_576).is_ok());
    }

    #[test]
    fn a_fifo_url_must_name_a_fifo_queue_and_only_then() {
        let info = |fifo| Attributes {
            maximum_message_size: None,
            fifo,
            content_based_deduplication: false,
        };
        let fifo = Destination::parse("http://q/1/a.fifo").expect("a queue URL");
        let standard = Destination::parse("http://q/1/a").expect("a queue URL");
        assert!(judge_fifo(&fifo, &info(true), "--queue-url").is_ok());
        assert!(judge_fifo(&standard, &info(false), "--queue-url").is_ok());
        assert!(judge_fifo(&fifo, &info(false), "--queue-url")
            .unwrap_err()
            .contains("not FIFO"));
        assert!(judge_fifo(&standard, &info(true), "--route order=...")
            .unwrap_err()
            .contains("fix --route order=..."));
    }

    #[test]
    fn queue_failures_say_what_to_do() {
        let failure = |transport, code: Option<&str>| RequestFailure {
            status: Some(400),
            code: code.map(str::to_string),
            message: "x".into(),
            transport,
        };
        let missing = explain_queue_failure(
            &failure(
                Transport::Response,
                Some("AWS.SimpleQueueService.NonExistentQueue"),
            ),
            "--queue-url",
        );
        assert!(missing.starts_with("the queue does not exist: create it, or fix --queue-url"));
        assert!(
            explain_queue_failure(&failure(Transport::Response, Some("AccessDenied")), "")
                .contains("sqs:GetQueueAttributes")
        );
        assert!(
            explain_queue_failure(&failure(Transport::Connection, None), "")
                .contains("--sqs-endpoint-url")
        );
        assert!(explain_queue_failure(
            &failure(
                Transport::Response,
                Some("AWS.SimpleQueueService.InvalidAddress")
            ),
            "--queue-url"
        )
        .starts_with("this endpoint does not serve the queue URL: set AWS_REGION"));
    }

    #[test]
    fn a_bucket_or_topic_in_another_region_is_named_with_the_region_to_set() {
        let failure = |status, code: &str, message: &str| RequestFailure {
            status: Some(status),
            code: Some(code.to_string()),
            message: message.into(),
            transport: Transport::Response,
        };
        let redirect = explain_bucket_failure(&failure(
            301,
            "PermanentRedirect",
            "S3 PutObject: The bucket you are attempting to access must be addressed using the specified endpoint. (the bucket is in eu-west-1)",
        ));
        assert_eq!(
            redirect,
            "the bucket is in another region than the relay: set AWS_REGION to eu-west-1 (or --s3-endpoint-url to its regional endpoint) [PermanentRedirect]"
        );
        let signed = explain_bucket_failure(&failure(
            400,
            "AuthorizationHeaderMalformed",
            "S3 PutObject: The authorization header is malformed; the region 'us-east-1' is wrong; expecting 'ap-south-1'",
        ));
        assert!(signed.contains("set AWS_REGION to ap-south-1"), "{signed}");
        let unnamed =
            explain_bucket_failure(&failure(301, "PermanentRedirect", "S3 PutObject: moved"));
        assert!(
            unnamed.contains("set AWS_REGION to the bucket's region"),
            "{unnamed}"
        );
        let topic = explain_topic_failure(
            &failure(400, "InvalidParameter", "Invalid parameter: TopicArn"),
            "--queue-url",
        );
        assert!(
            topic.starts_with("the topic is not in the relay's region: set AWS_REGION")
                && topic.ends_with("or fix --queue-url [InvalidParameter]"),
            "{topic}"
        );
    }

    #[test]
    fn topic_failures_say_what_to_do() {
        let failure = |code: Option<&str>, transport| RequestFailure {
            status: Some(404),
            code: code.map(str::to_string),
            message: "m".into(),
            transport,
        };
        let missing = explain_topic_failure(
            &failure(Some("NotFound"), Transport::Response),
            "--route pay=...",
        );
        assert!(missing.starts_with("the topic does not exist: create it, or fix --route pay=..."));
        assert!(missing.ends_with("[NotFound]"));
        assert!(explain_topic_failure(
            &failure(Some("AuthorizationError"), Transport::Response),
            ""
        )
        .contains("sns:Publish"));
        assert!(
            explain_topic_failure(&failure(None, Transport::Connection), "")
                .contains("--sns-endpoint-url")
        );
        assert!(
            explain_topic_failure(&failure(Some("ExpiredToken"), Transport::Response), "")
                .starts_with("the AWS credentials were refused")
        );
        assert!(
            explain_topic_failure(&failure(Some("Odd"), Transport::Response), "")
                .starts_with("SNS refused GetTopicAttributes [Odd]")
        );
        let fifo = Attributes {
            maximum_message_size: None,
            fifo: true,
            content_based_deduplication: false,
        };
        assert!(describe_topic(&fifo).starts_with("FIFO topic"));
    }

    #[test]
    fn a_topics_size_line_names_what_it_reported_and_what_the_relay_sends_it() {
        let topic = Destination::parse("arn:aws:sns:eu-west-1:1:t").expect("a topic ARN");
        let info = |size| Attributes {
            maximum_message_size: size,
            fifo: false,
            content_based_deduplication: false,
        };
        assert_eq!(
            describe_topic_size(&topic, &info(Some(1_048_576)), 1_048_576, true),
            "MaximumMessageSize 1048576: the relay sends it messages of up to 1048576 bytes, larger ones through S3 (--offload-bucket)"
        );
        assert_eq!(
            describe_topic_size(&topic, &info(Some(1_048_576)), 524_288, false),
            "MaximumMessageSize 1048576, held to --max-request-bytes 524288: the relay sends it messages of up to 524288 bytes, larger ones are quarantined as too_large (--offload-bucket would send them through S3)"
        );
        let unreported = describe_topic_size(&topic, &info(None), 1_048_576, true);
        assert!(
            unreported.starts_with("the topic does not report MaximumMessageSize")
                && unreported.contains("262144 assumed")
                && unreported.contains("messages of up to 262144 bytes"),
            "{unreported}"
        );
    }

    #[test]
    fn verdicts_print_on_one_line() {
        let v = Verdict {
            what: "queue q reachable".into(),
            result: Err("line one\nline two".into()),
        };
        assert_eq!(v.to_string(), "FAIL queue q reachable: line one line two");
        let v = Verdict {
            what: "configuration".into(),
            result: Ok(None),
        };
        assert_eq!(v.to_string(), "ok   configuration");
    }
}
