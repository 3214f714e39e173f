//! The binary: parse, set up logging and metrics, dispatch. The only place that turns errors
//! into exit codes: 0 done, 1 a runtime failure, 2 bad configuration or usage.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use tokio_util::sync::CancellationToken;

use outbox_relay::command::{open, selected_tables, Failure};
use outbox_relay::config::{
    Cli, Command, DatabaseArgs, DatabaseConfig, LogFormat, MigrateArgs, QuarantineCommand,
    QuarantineListArgs, QuarantineRetryArgs, ReplayArgs, RunArgs,
};
use outbox_relay::metrics::{self, Health};
use outbox_relay::otel::{self, Tracing};
use outbox_relay::outbox::{
    worst_first, Outbox, Purpose, RetryRows, RetrySelection, TableReport, TableStatus,
};
use outbox_relay::relay;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    init_logging(cli.log_format);
    // One thread: the relay's work is a few round trips per claim, each a few µs of CPU, and
    // on a multi-thread runtime every one of them crossed threads (the claim loop on the main
    // thread, deliveries and connection tasks on the workers), each hand-over a futex wake and
    // an eventfd write. At 200 events/s that was most of the process's CPU (scripts/proc-cost,
    // docs/benchmarks.md). Blocking work still goes to tokio's blocking pool.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(dispatch(cli.command))
}

/// clap prints usage and hints over several lines; keep its first line, which says what is
/// wrong, and point to --help. Help and version requests print as usual.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    let rendered = e.render().to_string();
    let first = rendered
        .lines()
        .next()
        .unwrap_or("error: invalid arguments");
    eprintln!("{first} (see outbox-relay --help)");
    ExitCode::from(2)
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Dependencies log what they were given (the OTLP exporter its endpoint with the
        // userinfo in it); every line is redacted on its way out, at every level.
        .with_writer(outbox_relay::redact::RedactedStderr)
        .with_ansi(
            std::env::var_os("NO_COLOR").is_none()
                && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        );
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

fn config_error(message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(2)
}

fn runtime_error(message: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(1)
}

/// The exit code of a command that could not do its work on its one table: 2 for a setting
/// that cannot work, 1 otherwise.
fn exit(failure: Failure) -> ExitCode {
    match failure {
        Failure::Config(message) => config_error(&message),
        Failure::Runtime(message) | Failure::Unavailable(message) => runtime_error(&message),
    }
}

async fn dispatch(command: Command) -> ExitCode {
    match command {
        Command::Migrate(args) => migrate(args).await,
        Command::Run(args) => run(*args).await,
        Command::Status(args) => status(args).await,
        Command::Check(args) => check(*args).await,
        Command::Quarantine(QuarantineCommand::List(args)) => quarantine_list(args).await,
        Command::Quarantine(QuarantineCommand::Retry(args)) => quarantine_retry(args).await,
        Command::Replay(args) => replay(args).await,
        Command::Console(args) => console(*args).await,
    }
}

/// The database settings of `args`, validated, or the exit code for a bad one.
fn database(args: &DatabaseArgs) -> Result<DatabaseConfig, ExitCode> {
    args.validate().map_err(|e| config_error(&e))
}

/// The outbox a command uses, or the exit code for a bad database setting ([`open`]).
async fn outbox(db: &DatabaseConfig, purpose: Purpose) -> Result<Outbox, ExitCode> {
    open(db, purpose).await.map_err(exit)
}

/// The outbox of a one-shot command that reads or re-drives rows: of one table, since its
/// selectors (ids, event ids, time ranges) mean something in one table only.
async fn admin_outbox(args: &DatabaseArgs, command: &str) -> Result<Outbox, ExitCode> {
    let db = database(args)?;
    db.selection
        .one_table(command)
        .map_err(|e| config_error(&e))?;
    outbox(&db, Purpose::Admin).await
}

async fn migrate(args: MigrateArgs) -> ExitCode {
    let locks = match args.lock_policy() {
        Ok(l) => l,
        Err(e) => return config_error(&e),
    };
    if args.adopt && args.order_by == outbox_relay::outbox::OrderBy::Transaction {
        return config_error(outbox_relay::outbox::NOT_ON_ADOPTED);
    }
    if args.print_sql && args.database.database_url.is_none() {
        return print_sql_offline(&args, locks);
    }
    let db = match database(&args.database) {
        Ok(db) => db,
        Err(code) => return code,
    };
    if db.selection.single().is_some() {
        return match migrate_table(&args, &db, locks).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(failure) => exit(failure),
        };
    }
    // --column is refused with several tables, and adopting needs it.
    if args.adopt {
        return config_error("--adopt adopts one table: give one --table with its --column flags");
    }
    let tables = match selected_tables(&db, Purpose::Migrate(locks)).await {
        Ok(tables) => tables,
        Err(failure) => return exit(failure),
    };
    // One table after the other, each in its own steps and locks as when migrated alone; a
    // table that fails does not keep the others at an older schema version.
    let mut failed = false;
    for table in &tables {
        if args.print_sql {
            println!("-- {table}");
        }
        if let Err(failure) = migrate_table(&args, &db.for_table(table), locks).await {
            eprintln!("error: {table}: {failure}");
            failed = true;
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// `migrate` of `db`'s one table, printing what it did.
async fn migrate_table(
    args: &MigrateArgs,
    db: &DatabaseConfig,
    locks: outbox_relay::outbox::LockPolicy,
) -> Result<(), Failure> {
    let outbox = open(db, Purpose::Migrate(locks)).await?;
    if args.print_sql {
        let sql = match &db.adopted {
            Some((base, map)) if args.adopt => outbox.adopt_sql(base, map, &args.keys()).await,
            _ => outbox.migrate_sql(&args.keys()),
        };
        print!("{}", sql.map_err(Failure::runtime)?);
        return Ok(());
    }
    if args.contract {
        let requirement = outbox.contract().await.map_err(Failure::runtime)?;
        println!(
            "contracted {}: relays {requirement} may claim; the lease columns of schema version 1 are gone",
            outbox.table()
        );
        return Ok(());
    }
    let result = match (&db.adopted, args.adopt) {
        (Some((base, map)), true) => outbox.adopt(base, map, &args.keys()).await,
        (None, true) => {
            return Err(Failure::Config(
                "--adopt needs --column NAME=COLUMN for the application's columns (e.g. --column event_id=id)".to_string(),
            ))
        }
        (Some(_), false) => {
            return Err(Failure::Config(
                "--column describes an existing table: add --adopt to adopt it, or drop --column to create a new outbox table".to_string(),
            ))
        }
        (None, false) => outbox.migrate(&args.keys()).await,
    };
    // The wake-up follows the table: it needs the table (or view) to exist.
    let result = match result {
        Ok(report) => outbox.set_up_wakeup(args.wakeup).await.map(|installed| {
            println!(
                "wake-up mode {}: NOTIFY trigger {}, publication {}",
                args.wakeup,
                if installed.trigger {
                    "installed"
                } else {
                    "absent"
                },
                if installed.publication {
                    "present"
                } else {
                    "absent"
                },
            );
            report
        }),
        Err(e) => Err(e),
    };
    let report = result.map_err(Failure::runtime)?;
    if report.from == report.to {
        println!(
            "{} is up to date (schema version {})",
            outbox.table(),
            report.to
        );
    } else {
        println!(
            "migrated {} from schema version {} to {}",
            outbox.table(),
            report.from,
            report.to
        );
    }
    Ok(())
}

/// `migrate --print-sql` without a database: the table and columns come from the flags alone.
fn print_sql_offline(args: &MigrateArgs, locks: outbox_relay::outbox::LockPolicy) -> ExitCode {
    let db = match args.database.offline() {
        Ok(db) => db,
        Err(e) => return config_error(&e),
    };
    // Parsing only: no connection is made.
    let outbox = match Outbox::from_config(&db, Purpose::Migrate(locks)) {
        Ok(o) => o,
        Err(e) => return config_error(&e.to_string()),
    };
    let sql = match (&db.adopted, args.adopt) {
        (Some((base, map)), true) => match outbox.adopt_sql_assumed(base, map, &args.keys()) {
            Ok(sql) => sql,
            Err(e) => return runtime_error(&e),
        },
        (None, false) => match outbox.migrate_sql(&args.keys()) {
            Ok(sql) => sql,
            Err(e) => return runtime_error(&e),
        },
        (None, true) => return config_error("--adopt needs --column NAME=COLUMN for the application's columns (e.g. --column event_id=id)"),
        (Some(_), false) => return config_error("--column describes an existing table: add --adopt to adopt it, or drop --column to create a new outbox table"),
    };
    print!("{sql}");
    ExitCode::SUCCESS
}

async fn run(args: RunArgs) -> ExitCode {
    let config = match args.validate() {
        Ok(c) => c,
        Err(e) => return config_error(&e),
    };
    // Before anything connects: a bad OTEL_* setting is a configuration error like a bad flag.
    let traces = match Tracing::from_env() {
        Ok(t) => t.map(Arc::new),
        Err(e) => return config_error(&e),
    };
    // Before the first connection (resolving the table is one): a SIGTERM while connecting
    // reaches the relay's handler instead of the signal's default action.
    let shutdown = CancellationToken::new();
    tokio::spawn(watch_signals(shutdown.clone()));
    if config.database.selection.single().is_none() {
        return run_many(config, traces, shutdown).await;
    }
    // The files the settings name first: one that cannot be used is a configuration error,
    // said before anything else.
    if let Err(e) = config.database.read_secrets() {
        return config_error(&e);
    }
    if let Err(e) = Outbox::from_config(&config.database, Purpose::Relay(config.relay_settings())) {
        return config_error(&e.to_string());
    }
    // Serving before the first connection: /readyz says why the relay is not ready while it
    // waits for its database, and /healthz that it is alive.
    let (health, stop_serving) = match serve_metrics(&config).await {
        Ok(served) => served,
        Err(code) => return code,
    };
    // The table's reads are shown from the start: down until the first one.
    let reads = Arc::new(relay::reads::Reads::new(config.maintenance.stats_interval));
    {
        let reads = Arc::clone(&reads);
        health.add_section(metrics::Section(Arc::new(move || reads.render())));
    }
    let connected = match connect_when_ready(&config, &health, &shutdown).await {
        Ok(c) => c,
        Err(code) => {
            stop_serving.cancel();
            return code;
        }
    };
    if traces.is_some() {
        tracing::info!("exporting a span per event over OTLP/HTTP");
    }
    relay::run(connected, health, reads, traces.clone(), shutdown).await;
    // The drain is over; the spans of its last sends go out now, within a bound.
    if let Some(traces) = traces {
        traces.shutdown(otel::FLUSH_BOUND).await;
    }
    stop_serving.cancel();
    ExitCode::SUCCESS
}

/// `run`'s first connection, tried again with the relay's back-off while the database is not
/// there yet (refused, reset, starting up, too many clients, a pooler's login retry, a name not
/// yet resolving): one line per try, and `/readyz` says why. A relay started with its
/// database, or before it (a pod beside a database that restarts), then comes up by itself
/// instead of exiting into a restart loop whose back-off outlasts the database's return. Only
/// what no retry fixes exits at once: configuration (a malformed URL, authentication, a
/// missing database or table, a certificate that does not verify), or a SIGTERM meanwhile.
async fn connect_when_ready(
    config: &outbox_relay::config::RunConfig,
    health: &Health,
    shutdown: &CancellationToken,
) -> Result<relay::Connected, ExitCode> {
    let mut failures = 0u32;
    health.set_not_claiming(Some("starting: connecting to the database".to_string()));
    loop {
        health.tick();
        let attempt = async {
            let outbox = open(&config.database, Purpose::Relay(config.relay_settings())).await?;
            relay::connect(config.clone(), outbox)
                .await
                .map_err(|relay::RelayError::Startup(e)| match e.is_transient() {
                    true => Failure::Unavailable(e.to_string()),
                    false => Failure::runtime(e),
                })
        };
        // Alive while it waits: an attempt may take the connect timeout and a round trip.
        tokio::pin!(attempt);
        let result = loop {
            tokio::select! {
                result = &mut attempt => break result,
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => health.tick(),
            }
        };
        let why = match result {
            Ok(connected) => {
                health.set_not_claiming(None);
                return Ok(connected);
            }
            Err(Failure::Unavailable(why)) => why,
            Err(failure) => return Err(exit(failure)),
        };
        if shutdown.is_cancelled() {
            return Err(runtime_error(&why));
        }
        failures += 1;
        let delay = outbox_relay::outbox::reconnect_delay(
            failures,
            false,
            config.retry.retry_base,
            config.retry.db_retry_max,
            fastrand::f64(),
        );
        tracing::warn!(retry_in = ?delay, "waiting for the database: {why}");
        health.set_not_claiming(Some(format!("waiting for the database: {why}")));
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.cancelled() => return Err(runtime_error(&why)),
        }
    }
}

/// `/metrics`, `/healthz` and `/readyz` on `--metrics-addr`, and the health they report;
/// the token stops serving. Separate from `shutdown`: metrics and probes keep answering while
/// in-flight sends drain after SIGTERM.
async fn serve_metrics(
    config: &outbox_relay::config::RunConfig,
) -> Result<(Arc<Health>, CancellationToken), ExitCode> {
    let handle =
        metrics::install().map_err(|e| runtime_error(&format!("cannot set up metrics: {e}")))?;
    // Several poll intervals without a loop iteration means the loop is stuck.
    let stuck_after = (config.claim.poll_interval * 5).max(std::time::Duration::from_secs(10));
    let health = Health::new(stuck_after);
    let stop_serving = CancellationToken::new();
    let bound = metrics::serve(
        config.metrics_addr,
        handle,
        Arc::clone(&health),
        stop_serving.clone(),
    )
    .await
    .map_err(|e| {
        runtime_error(&format!(
            "cannot listen on --metrics-addr {}: {e}",
            config.metrics_addr
        ))
    })?;
    tracing::info!(metrics_addr = %bound, "metrics endpoint listening");
    Ok((health, stop_serving))
}

/// `run` for several tables (`relay::many`): the same endpoint, health and shutdown.
async fn run_many(
    config: outbox_relay::config::RunConfig,
    traces: Option<Arc<Tracing>>,
    shutdown: CancellationToken,
) -> ExitCode {
    if let Err(e) = config.database.read_secrets() {
        return config_error(&e);
    }
    let (health, stop_serving) = match serve_metrics(&config).await {
        Ok(served) => served,
        Err(code) => return code,
    };
    let result = relay::many::run(config, health, traces.clone(), shutdown).await;
    if let Some(traces) = traces {
        traces.shutdown(otel::FLUSH_BOUND).await;
    }
    stop_serving.cancel();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => runtime_error(&e),
    }
}

async fn status(args: outbox_relay::config::StatusArgs) -> ExitCode {
    let db = match database(&args.database) {
        Ok(db) => db,
        Err(code) => return code,
    };
    if db.selection.single().is_none() {
        return status_of_tables(&db, args.json).await;
    }
    let status = match table_status(&db).await {
        Ok(s) => s,
        Err(failure) => return exit(failure),
    };
    if args.json {
        match serde_json::to_string(&status) {
            Ok(json) => println!("{json}"),
            Err(e) => return runtime_error(&e),
        }
    } else {
        print!("{status}");
    }
    ExitCode::SUCCESS
}

async fn table_status(db: &DatabaseConfig) -> Result<TableStatus, Failure> {
    let outbox = open(db, Purpose::Admin).await?;
    outbox.status().await.map_err(Failure::runtime)
}

/// `status` of several tables, worst first: a table that cannot be read is listed with its
/// error and the others still are; exit 1 then.
async fn status_of_tables(db: &DatabaseConfig, json: bool) -> ExitCode {
    let tables = match selected_tables(db, Purpose::Admin).await {
        Ok(tables) => tables,
        Err(failure) => return exit(failure),
    };
    let mut reports = Vec::with_capacity(tables.len());
    for table in &tables {
        reports.push(match table_status(&db.for_table(table)).await {
            Ok(status) => TableReport::Read(status),
            Err(failure) => TableReport::Failed {
                table: table.quoted(),
                error: failure.to_string(),
            },
        });
    }
    worst_first(&mut reports);
    if json {
        match serde_json::to_string(&reports) {
            Ok(json) => println!("{json}"),
            Err(e) => return runtime_error(&e),
        }
    } else {
        for (i, report) in reports.iter().enumerate() {
            if i > 0 {
                println!();
            }
            print!("{report}");
        }
    }
    if reports.iter().any(TableReport::failed) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Every check prints its own line; a failed one is not a usage error, hence 1.
async fn check(args: RunArgs) -> ExitCode {
    if outbox_relay::check::run(&args).await {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

async fn quarantine_list(args: QuarantineListArgs) -> ExitCode {
    let outbox = match admin_outbox(&args.database, "quarantine list").await {
        Ok(o) => o,
        Err(code) => return code,
    };
    let rows = match outbox
        .quarantine_list(args.reason.as_deref(), None, 0, args.limit)
        .await
    {
        Ok(rows) => rows,
        Err(e) => return runtime_error(&e),
    };
    if args.json {
        match serde_json::to_string_pretty(&rows) {
            Ok(json) => println!("{json}"),
            Err(e) => return runtime_error(&e),
        }
        return ExitCode::SUCCESS;
    }
    if rows.is_empty() {
        println!("no quarantined rows");
        return ExitCode::SUCCESS;
    }
    println!(
        "{:>10}  {:<32}  {:<13}  {:>8}  {:<29}  last error",
        "id", "event_id", "reason", "attempts", "quarantined at"
    );
    for r in &rows {
        // One line per row; the full error is in --json.
        let error: String = r.last_error.replace('\n', " ").chars().take(120).collect();
        println!(
            "{:>10}  {:<32}  {:<13}  {:>8}  {:<29}  {}",
            r.id,
            r.event_id.as_deref().unwrap_or("-"),
            r.reason,
            r.attempts,
            r.quarantined_at,
            error
        );
    }
    ExitCode::SUCCESS
}

async fn quarantine_retry(args: QuarantineRetryArgs) -> ExitCode {
    let outbox = match admin_outbox(&args.database, "quarantine retry").await {
        Ok(o) => o,
        Err(code) => return code,
    };
    let rows = match (args.id, args.event_id) {
        (Some(id), _) => RetryRows::Ids(vec![id]),
        (_, Some(event_id)) => RetryRows::EventId(event_id),
        _ => RetryRows::All,
    };
    let which = RetrySelection {
        rows,
        reason: args.reason,
        destination: args.destination,
    };
    match outbox.quarantine_retry(&which, args.dry_run).await {
        Ok(done) => {
            if args.dry_run {
                println!(
                    "would move {} quarantined row(s) back to unsent; nothing changed",
                    done.selected
                );
            } else {
                println!("moved {} quarantined row(s) back to unsent", done.moved);
            }
            if done.maybe_accepted > 0 {
                eprintln!(
                    "warning: {} of them were quarantined less than 5 minutes ago after claims that ended without an outcome (max_attempts): SQS may have accepted a copy then, and a FIFO queue or topic silently drops the re-driven copy as its duplicate within 5 minutes of it",
                    done.maybe_accepted
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => runtime_error(&e),
    }
}

async fn replay(args: ReplayArgs) -> ExitCode {
    let which = match args.selection() {
        Ok(w) => w,
        Err(e) => return config_error(&e),
    };
    let outbox = match admin_outbox(&args.database, "replay").await {
        Ok(o) => o,
        Err(code) => return code,
    };
    let done = match outbox.replay(&which).await {
        Ok(done) => done,
        Err(e) => return runtime_error(&e),
    };
    let ids = match (done.first_id, done.last_id) {
        (Some(a), Some(b)) => format!(" (ids {a} to {b})"),
        _ => String::new(),
    };
    if done.selected == 0 {
        println!("no sent rows match; sent rows are kept only with --retention (the default, 0, deletes each row once SQS acknowledged it)");
    } else if which.dry_run {
        println!(
            "would replay {} sent row(s){ids}; nothing changed",
            done.selected
        );
    } else {
        println!(
            "replayed {} sent row(s){ids}: unsent again, the relays send them with the same event_id",
            done.replayed
        );
    }
    if done.sent_within_dedup_window > 0 && !which.new_dedup_id {
        eprintln!(
            "warning: {} of them were sent less than 5 minutes ago: a FIFO queue or topic silently drops a copy whose deduplication ID (the event_id) it accepted in the last 5 minutes; replay with --new-dedup-id for those to arrive",
            done.sent_within_dedup_window
        );
    }
    ExitCode::SUCCESS
}

async fn console(args: outbox_relay::config::ConsoleArgs) -> ExitCode {
    let config = match args.validate() {
        Ok(c) => c,
        Err(e) => return config_error(&e),
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(watch_signals(shutdown.clone()));
    match outbox_relay::console::run(config, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Config(message)) => config_error(&message),
        Err(failure) => runtime_error(&failure),
    }
}

/// SIGTERM or SIGINT starts a clean shutdown; a second signal is left to the default action
/// only after the first has been handled.
/// Installs the SIGTERM/SIGINT handlers now (a SIGTERM during start-up must drain the relay,
/// not kill it) and returns the task that cancels `shutdown` when one arrives.
fn watch_signals(shutdown: CancellationToken) -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        let (mut term, mut int) = match handlers {
            (Ok(t), Ok(i)) => (t, i),
            _ => {
                tracing::error!("cannot install signal handlers; stop the relay with SIGKILL");
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
        shutdown.cancel();
    }
}
