//! The configuration rules, without I/O (one test reads a password file it writes).

use std::time::Duration;

use clap::Parser;

use super::*;
use crate::batch::{KeyColumn, MessageFormat, OffloadPlan, PlanOrdering};
use crate::dbauth::PasswordSource;
use crate::destination::Destination;
use crate::outbox::{ClaimStrategy, OrderScope, Pooler, Wakeup};

#[test]
fn the_maintenance_timeout_is_above_zero_and_within_postgresqls_limit() {
    assert_eq!(
        run_args(&[]).unwrap().maintenance.maintenance_timeout,
        Duration::from_secs(10)
    );
    assert_eq!(
        run_args(&["--maintenance-timeout", "0s"]).unwrap_err(),
        "--maintenance-timeout must be above zero"
    );
    let err = run_args(&["--maintenance-timeout", "30days"]).unwrap_err();
    assert!(
        err.starts_with("--maintenance-timeout 30days is too long: use at most 1day"),
        "{err}"
    );
    assert_eq!(
        run_args(&["--maintenance-timeout", "500ms"])
            .unwrap()
            .maintenance
            .maintenance_timeout,
        Duration::from_millis(500)
    );
}

fn run_args(extra: &[&str]) -> Result<RunConfig, String> {
    run_args_to("http://127.0.0.1:4566/000000000000/q", extra)
}

fn run_args_to(queue_url: &str, extra: &[&str]) -> Result<RunConfig, String> {
    let mut argv = vec![
        "outbox-relay",
        "run",
        "--database-url",
        "postgres://relay:pw@127.0.0.1:5432/app",
        "--queue-url",
        queue_url,
    ];
    argv.extend_from_slice(extra);
    let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
    match cli.command {
        Command::Run(args) => args.validate(),
        other => panic!("parsed {other:?}"),
    }
}

#[test]
fn the_largest_payload_read_defaults_to_the_bytes_in_flight_and_cannot_exceed_them() {
    let c = run_args(&[]).unwrap();
    assert_eq!(c.send.max_payload_bytes, c.send.max_bytes_in_flight);
    let c = run_args(&["--max-bytes-in-flight", "8MiB"]).unwrap();
    assert_eq!(c.send.max_payload_bytes, 8 * 1024 * 1024);
    let c = run_args(&["--max-payload-bytes", "256KiB"]).unwrap();
    assert_eq!(c.send.max_payload_bytes, 256 * 1024);
    for bad in ["0", "64MiB"] {
        let err = run_args(&["--max-payload-bytes", bad]).unwrap_err();
        assert!(
            err.starts_with("--max-payload-bytes") && err.contains("--max-bytes-in-flight"),
            "{err}"
        );
        assert!(!err.contains('\n'), "one line: {err}");
    }
}

#[test]
fn offload_is_off_by_default_and_its_flags_need_a_bucket() {
    assert_eq!(run_args(&[]).unwrap().plan().offload, None);
    let c = run_args(&[
        "--offload-bucket",
        "events",
        "--offload-prefix",
        "outbox/",
        "--offload-threshold",
        "256KiB",
    ])
    .unwrap();
    assert_eq!(
        c.plan().offload,
        Some(OffloadPlan {
            bucket: Destination::bucket("events").expect("a bucket name"),
            prefix: "outbox/".into(),
            threshold: Some(256 * 1024),
        })
    );
    let err = run_args(&["--offload-threshold", "1KiB"]).unwrap_err();
    assert!(err.contains("need --offload-bucket"), "{err}");
    let err = run_args(&["--offload-bucket", "s3://events/x"]).unwrap_err();
    assert!(err.contains("--offload-prefix"), "{err}");
    let err = run_args(&["--offload-bucket", "e", "--offload-threshold", "2MiB"]).unwrap_err();
    assert!(err.contains("out of range"), "{err}");
}

#[test]
fn defaults_are_valid_and_keep_the_lease_relation() {
    let c = run_args(&[]).unwrap();
    assert_eq!(c.claim.batch_size, 100);
    assert_eq!(c.claim.lease, Duration::from_secs(30));
    assert!(c.send.send_timeout + c.send.settle_margin < c.claim.lease);
    assert_eq!(c.database.table.quoted(), "\"outbox\"");
    assert!(!c.claim.relay_id.is_empty());
}

#[test]
fn the_lease_must_outlast_send_timeout_plus_settle_margin() {
    let s = Duration::from_secs;
    assert!(check_lease(s(30), s(10), s(5)).is_ok());
    assert!(check_lease(s(16), s(10), s(5)).is_ok());
    let err = check_lease(s(15), s(10), s(5)).unwrap_err();
    assert!(err
        .contains("--lease (15s) must be longer than --send-timeout (10s) + --settle-margin (5s)"));
    assert!(check_lease(s(5), s(10), s(1)).is_err());
    let err = run_args(&["--lease", "5s"]).unwrap_err();
    assert!(err.contains("--lease"), "{err}");
}

#[test]
fn missing_queue_url_says_what_to_set() {
    let cli = Cli::try_parse_from(["outbox-relay", "run", "--database-url", "postgres://x@h/db"])
        .unwrap();
    let Command::Run(mut args) = cli.command else {
        panic!()
    };
    args.destination.queue_url = None;
    let err = args.validate().unwrap_err();
    assert!(err.starts_with("--queue-url (or OUTBOX_QUEUE_URL) is required"));
    assert!(!err.contains('\n'));
}

#[test]
fn ranges_and_shapes_are_checked() {
    for (flags, needle) in [
        (vec!["--batch-size", "0"], "--batch-size 0"),
        (vec!["--max-in-flight", "0"], "--max-in-flight 0"),
        (vec!["--max-attempts", "0"], "--max-attempts"),
        (vec!["--metrics-addr", "nope"], "--metrics-addr"),
        (
            vec!["--max-request-bytes", "2000000"],
            "--max-request-bytes",
        ),
        (
            vec!["--retry-base", "10s", "--retry-max", "1s"],
            "--retry-max",
        ),
        (vec!["--table", "a.b.c"], "--table"),
        (vec!["--db-timeout", "0s"], "--db-timeout"),
        (vec!["--db-retry-max", "0s"], "--db-retry-max"),
        (
            vec!["--db-timeout", "30s", "--lease", "30s"],
            "--db-timeout (30s)",
        ),
        (
            vec!["--settle-margin", "0s"],
            "--db-timeout (default: --settle-margin)",
        ),
        (
            vec!["--sqs-endpoint-url", "localhost:4566"],
            "--sqs-endpoint-url",
        ),
    ] {
        let err = run_args(&flags).unwrap_err();
        assert!(err.contains(needle), "{flags:?}: {err}");
        assert!(!err.contains('\n'), "one line: {err}");
    }
}

#[test]
fn the_database_deadline_defaults_to_the_settle_margin() {
    let c = run_args(&["--settle-margin", "3s"]).unwrap();
    assert_eq!(c.retry.db_timeout, Duration::from_secs(3));
    assert_eq!(c.retry.db_retry_max, Duration::from_secs(2));
    let c = run_args(&["--db-timeout", "7s"]).unwrap();
    assert_eq!(c.retry.db_timeout, Duration::from_secs(7));
}

#[test]
fn retention_takes_zero_a_duration_or_off() {
    assert_eq!(
        run_args(&[]).unwrap().maintenance.retention,
        Retention::OnAck
    );
    for zero in ["0", "0s"] {
        assert_eq!(
            run_args(&["--retention", zero])
                .unwrap()
                .maintenance
                .retention,
            Retention::OnAck
        );
    }
    assert_eq!(
        run_args(&["--delete-on-ack"])
            .unwrap()
            .maintenance
            .retention,
        Retention::OnAck
    );
    let err = run_args(&["--delete-on-ack", "--retention", "1h"]).unwrap_err();
    assert!(err.contains("contradicts --retention"), "{err}");
    assert_eq!(
        run_args(&["--retention", "off"])
            .unwrap()
            .maintenance
            .retention,
        Retention::Off
    );
    assert_eq!(
        run_args(&["--retention", "90s"])
            .unwrap()
            .maintenance
            .retention,
        Retention::For(Duration::from_secs(90))
    );
    assert!(run_args(&["--retention", "soon"])
        .unwrap_err()
        .contains("or `off`"));
}

#[test]
fn pooler_defaults_to_direct_connections_and_refuses_what_cannot_cross_it() {
    assert_eq!(run_args(&[]).unwrap().database.pooler, Pooler::Auto);
    let pooled = run_args(&["--pooler", "transaction"]).unwrap();
    assert_eq!(pooled.database.pooler, Pooler::Transaction);
    for wakeup in ["notify", "logical"] {
        let err = run_args(&["--pooler", "transaction", "--wakeup", wakeup]).unwrap_err();
        assert!(err.contains(&format!("--wakeup {wakeup}")), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }
    assert!(run_args(&["--pooler", "session", "--wakeup", "notify"]).is_ok());
    assert!(run_args(&["--pooler", "session", "--wakeup", "logical"]).is_err());
    assert!(run_args(&["--pooler", "statement"]).is_err());
}

#[test]
fn wakeup_defaults_to_polling_and_names_each_mode() {
    assert_eq!(run_args(&[]).unwrap().claim.wakeup, Wakeup::Poll);
    for (flag, mode) in [
        ("poll", Wakeup::Poll),
        ("logical", Wakeup::Logical),
        ("notify", Wakeup::Notify),
    ] {
        assert_eq!(run_args(&["--wakeup", flag]).unwrap().claim.wakeup, mode);
    }
    let err = run_args(&["--wakeup", "listen"]).unwrap_err();
    assert!(err.contains("poll, logical or notify"), "{err}");
}

#[test]
fn quarantine_retry_needs_exactly_one_selection() {
    let parse = |extra: &[&str]| {
        let mut argv = vec![
            "outbox-relay",
            "quarantine",
            "retry",
            "--database-url",
            "postgres://h/db",
        ];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv)
    };
    assert!(parse(&[]).is_err());
    assert!(parse(&["--id", "3", "--all"]).is_err());
    assert!(
        parse(&["--reason", "invalid"]).is_err(),
        "--reason only narrows --all"
    );
    assert!(parse(&["--all", "--reason", "invalid"]).is_ok());
    assert!(parse(&["--event-id", "order-1:paid"]).is_ok());
}

#[test]
fn ordering_is_decided_per_destination_queue() {
    let fifo = "http://127.0.0.1:4566/000000000000/orders.fifo";
    let c = run_args_to(fifo, &[]).unwrap();
    let ordered = c
        .order
        .strategy
        .ordered()
        .expect("ordered on a FIFO queue")
        .clone();
    assert_eq!(ordered.key, KeyColumn::AggregateId);
    assert!(!ordered.skip_poison);
    assert_eq!(ordered.scope, OrderScope::Every);
    // A standard default queue: only rows bound for a FIFO queue (their own queue_url, a
    // FIFO route) are ordered.
    let c = run_args(&[]).unwrap();
    assert!(matches!(
        c.order.strategy.ordered().unwrap().scope,
        OrderScope::FifoDestinations { ref fifo_routes, .. } if fifo_routes.is_empty()
    ));
    assert_eq!(
        c.plan().ordering,
        Some(PlanOrdering {
            every_destination: false,
            skip_poison: false
        })
    );
    let c = run_args(&[
        "--ordered",
        "on",
        "--group-by",
        "header:tenant",
        "--on-poison",
        "skip",
    ])
    .unwrap();
    let ordered = c.order.strategy.ordered().unwrap();
    assert_eq!(ordered.key, KeyColumn::Header("tenant".into()));
    assert!(ordered.skip_poison);
    assert_eq!(ordered.scope, OrderScope::Every);
    let off = run_args_to(fifo, &["--ordered", "off"]).unwrap();
    assert_eq!(off.order.strategy, ClaimStrategy::Plain);
    assert_eq!(off.plan().ordering, None);
    let routed = run_args(&[
        "--route",
        "order=http://q/1/orders.fifo",
        "--route",
        "invoice=http://q/1/invoices",
    ])
    .unwrap();
    assert!(matches!(
        &routed.order.strategy.ordered().unwrap().scope,
        OrderScope::FifoDestinations { fifo_routes, .. } if fifo_routes == &["order".to_string()]
    ));
    let fair = run_args_to(fifo, &["--fair-by", "aggregate_type"]).unwrap();
    assert!(matches!(
        fair.order.strategy,
        ClaimStrategy::OrderedFair { .. }
    ));
}

#[test]
fn topic_arns_are_destinations_and_what_topics_cannot_do_is_refused() {
    let topic = "arn:aws:sns:eu-west-1:123456789012:orders";
    let fifo_topic = "arn:aws:sns:eu-west-1:123456789012:orders.fifo";
    let c = run_args_to(topic, &["--route", &format!("pay={fifo_topic}")]).unwrap();
    assert_eq!(c.destination.queue_url.to_string(), topic);
    assert_eq!(c.plan().routes[0].1.to_string(), fifo_topic);
    // A FIFO topic route orders its rows like a FIFO queue route does.
    assert!(matches!(
        &c.order.strategy.ordered().unwrap().scope,
        OrderScope::FifoDestinations { fifo_routes, .. } if fifo_routes == &["pay".to_string()]
    ));
    let c = run_args_to(fifo_topic, &["--sns-endpoint-url", "http://127.0.0.1:1"]).unwrap();
    assert_eq!(c.order.strategy.ordered().unwrap().scope, OrderScope::Every);
    assert_eq!(
        c.destination.sns_endpoint.as_deref(),
        Some("http://127.0.0.1:1")
    );
    let err = run_args_to("arn:aws:sns:eu-west-1:orders", &[]).unwrap_err();
    assert!(
        err.starts_with("--queue-url") && err.contains("not a topic ARN"),
        "{err}"
    );
    let err = run_args(&["--route", "x=arn:aws:sns::1:t"]).unwrap_err();
    assert!(err.contains("not a topic ARN"), "{err}");
    let err = run_args_to(topic, &["--fair-by", "aggregate_type", "--fair-group-id"]).unwrap_err();
    assert!(err.contains("takes no MessageGroupId"), "{err}");
    assert!(run_args_to(
        fifo_topic,
        &["--fair-by", "aggregate_type", "--fair-group-id"]
    )
    .is_ok());
    assert!(run_args_to(topic, &["--sns-endpoint-url", "localhost:1"])
        .unwrap_err()
        .starts_with("--sns-endpoint-url"));
}

#[test]
fn routes_fairness_and_formats_are_validated() {
    let c = run_args(&[
        "--route",
        "order=http://q/o",
        "--route",
        "invoice=http://q/i",
        "--route-by",
        "event_type",
    ])
    .unwrap();
    assert_eq!(c.plan().routes.len(), 2);
    assert_eq!(c.plan().route_by, KeyColumn::EventType);
    assert!(run_args(&["--route", "nourl"])
        .unwrap_err()
        .contains("KEY=QUEUE_URL"));
    assert!(run_args(&["--fair-group-id"])
        .unwrap_err()
        .contains("set --fair-by"));
    let c = run_args(&["--fair-by", "aggregate_type", "--fair-group-id"]).unwrap();
    assert_eq!(c.order.strategy.fair(), Some(&KeyColumn::AggregateType));
    assert_eq!(c.plan().fair_group, Some(KeyColumn::AggregateType));
    assert!(run_args(&["--group-by", "payload"])
        .unwrap_err()
        .contains("not a key"));
    let c = run_args(&[
        "--message-format",
        "cloudevents",
        "--cloudevents-source",
        "/shop",
    ])
    .unwrap();
    assert_eq!(
        c.plan().format,
        MessageFormat::CloudEvents {
            source: "/shop".into()
        }
    );
    assert!(run_args(&[
        "--message-format",
        "cloudevents",
        "--cloudevents-source",
        " "
    ])
    .is_err());
}

#[test]
fn column_mapping_reads_an_adopted_table_through_its_view() {
    let c = run_args(&[
        "--table",
        "app.outboxevent",
        "--column",
        "event_id=id",
        "--column",
        "aggregate_type=aggregatetype",
        "--column",
        "headers=",
    ])
    .unwrap();
    assert_eq!(c.database.table.quoted(), "\"app\".\"outboxevent_relay\"");
    let (base, map) = c.database.adopted.unwrap();
    assert_eq!(base.quoted(), "\"app\".\"outboxevent\"");
    assert_eq!(map.event_id, "id");
    assert_eq!(map.aggregate_type, "aggregatetype");
    assert_eq!(map.headers, None);
    assert_eq!(map.id, "outbox_seq");
    assert!(run_args(&["--column", "payload="])
        .unwrap_err()
        .contains("needs a column"));
    assert!(run_args(&["--column", "nope=x"])
        .unwrap_err()
        .contains("unknown name"));
    assert!(run_args(&["--column", "x"]).is_err());
}

fn database(url: &str, extra: &[&str]) -> Result<DatabaseConfig, String> {
    let mut argv = vec!["outbox-relay", "status", "--database-url", url];
    argv.extend_from_slice(extra);
    let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
    match cli.command {
        Command::Status(args) => args.database.validate(),
        other => panic!("parsed {other:?}"),
    }
}

#[test]
fn the_password_source_follows_the_flags_and_a_missing_file_is_a_configuration_error() {
    let bare = "postgres://relay@db.internal:5432/app";
    assert_eq!(database(bare, &[]).unwrap().password, PasswordSource::Url);
    assert_eq!(
        database(bare, &["--database-iam-auth"]).unwrap().password,
        PasswordSource::Iam
    );
    let err = run_args(&["--database-iam-auth"]).unwrap_err();
    assert!(
        err.contains("remove the password from --database-url"),
        "{err}"
    );
    let err = database(&format!("{bare}?sslmode=disable"), &["--database-iam-auth"]).unwrap_err();
    assert!(err.contains("sslmode=disable"), "{err}");

    let path = std::env::temp_dir().join(format!("config-pw-{}", std::process::id()));
    let file = path.to_str().unwrap();
    // Validation reads nothing; the file is read once at start-up, by read_secrets.
    let config = database(bare, &["--database-password-file", file]).unwrap();
    assert_eq!(config.password, PasswordSource::File(path.clone()));
    let err = config.read_secrets().unwrap_err();
    assert!(
        err.starts_with("--database-password-file: cannot read the password file"),
        "{err}"
    );
    assert!(err.contains(file) && !err.contains('\n'), "{err}");
    std::fs::write(&path, "rotated-secret\n").unwrap();
    assert_eq!(config.read_secrets(), Ok(()));
    let err = run_args(&["--database-password-file", file]).unwrap_err();
    assert!(err.contains("remove the password from the URL"), "{err}");
    let err = database(
        bare,
        &["--database-password-file", file, "--database-iam-auth"],
    )
    .unwrap_err();
    assert!(err.contains("choose one"), "{err}");
    assert!(!format!("{config:?}").contains("rotated-secret"));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn the_database_url_is_redacted_in_debug_output() {
    let c = run_args(&[]).unwrap();
    let shown = format!("{c:?}");
    assert!(!shown.contains("relay:pw"), "{shown}");
    assert!(shown.contains("<redacted>"));
}

/// Every boolean flag that reads an environment variable: (subcommand path, arg id, env).
fn boolean_env_flags() -> Vec<(Vec<String>, String, String)> {
    fn walk(cmd: &clap::Command, path: &[String], out: &mut Vec<(Vec<String>, String, String)>) {
        for arg in cmd.get_arguments() {
            if let (Some(env), clap::ArgAction::SetTrue) = (arg.get_env(), arg.get_action()) {
                let env = env.to_string_lossy().into_owned();
                out.push((path.to_vec(), arg.get_id().to_string(), env));
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &[path, &[sub.get_name().to_string()]].concat(), out);
        }
    }
    let mut out = Vec::new();
    walk(&<Cli as clap::CommandFactory>::command(), &[], &mut out);
    out
}

/// `cmd` with the flag `id` (under the subcommands `path`) taking a value.
fn taking_a_value(cmd: clap::Command, path: &[String], id: &str) -> clap::Command {
    match path.split_first() {
        None => cmd.mut_arg(id, |a| a.action(clap::ArgAction::Set)),
        Some((name, rest)) => cmd.mut_subcommand(name, |sub| taking_a_value(sub, rest, id)),
    }
}

/// Manifests and shells write 1/0, yes/no, on/off as often as true/false. clap reads the
/// variable through the flag's value parser. Tests share the process environment, so
/// instead each flag is made to take a value and given the same text on the command line,
/// where that same parser reads it.
#[test]
fn boolean_environment_variables_accept_the_usual_spellings() {
    let flags = boolean_env_flags();
    let envs: Vec<&str> = flags.iter().map(|(_, _, env)| env.as_str()).collect();
    for expected in ["OUTBOX_DELETE_ON_ACK", "OUTBOX_FAIR_GROUP_ID"] {
        assert!(envs.contains(&expected), "{expected} in {envs:?}");
    }
    for (path, id, env) in &flags {
        // Other required arguments (quarantine retry's selection) are not this test's
        // concern.
        let cmd =
            taking_a_value(<Cli as clap::CommandFactory>::command(), path, id).ignore_errors(true);
        let long = format!("--{}", id.replace('_', "-"));
        for (text, want) in [
            ("1", true),
            ("0", false),
            ("yes", true),
            ("no", false),
            ("on", true),
            ("off", false),
            ("true", true),
            ("false", false),
        ] {
            let argv = ["outbox-relay"]
                .into_iter()
                .chain(path.iter().map(String::as_str))
                .chain([long.as_str(), text]);
            let matches = cmd
                .clone()
                .try_get_matches_from(argv)
                .unwrap_or_else(|e| panic!("{env}={text}: {e}"));
            let matches = path.iter().fold(&matches, |m, name| {
                m.subcommand_matches(name).expect("subcommand")
            });
            assert_eq!(matches.get_one::<bool>(id), Some(&want), "{env}={text}");
        }
    }
}

#[test]
fn boolean_flags_still_work_without_a_value() {
    let c = run_args(&["--fair-by", "aggregate_type", "--fair-group-id"]).unwrap();
    assert!(c.plan().fair_group.is_some());
    assert!(run_args(&[]).unwrap().plan().fair_group.is_none());
    assert_eq!(
        run_args(&["--delete-on-ack"])
            .unwrap()
            .maintenance
            .retention,
        Retention::OnAck
    );
}

#[test]
fn the_plan_is_assembled_from_the_destination_order_format_offload_and_send_groups() {
    let c = run_args(&[
        "--route",
        "order=http://q/1/orders.fifo",
        "--route-by",
        "event_type",
        "--group-by",
        "aggregate_type",
        "--fair-by",
        "header:tenant",
        "--fair-group-id",
        "--max-request-bytes",
        "262144",
        "--message-format",
        "cloudevents",
        "--offload-bucket",
        "events",
    ])
    .unwrap();
    let plan = c.plan();
    assert_eq!(plan.default_queue_url, c.destination.queue_url);
    assert_eq!(
        plan.routes,
        vec![(
            "order".to_string(),
            Destination::parse("http://q/1/orders.fifo").expect("a queue URL")
        )]
    );
    assert_eq!(plan.route_by, KeyColumn::EventType);
    assert_eq!(plan.group_by, KeyColumn::AggregateType);
    assert_eq!(plan.fair_group, Some(KeyColumn::Header("tenant".into())));
    assert_eq!(plan.max_request_bytes, 262_144);
    assert_eq!(plan.ordering, c.order.ordering);
    assert_eq!(
        plan.format,
        MessageFormat::CloudEvents {
            source: "/outbox-relay".into()
        }
    );
    assert_eq!(
        plan.offload.map(|o| o.bucket),
        Some(Destination::bucket("events").expect("a bucket name"))
    );
}

#[test]
fn the_outbox_gets_the_settlement_deadline_limits_and_strategy_of_run() {
    let c = run_args(&[
        "--retention",
        "1h",
        "--db-timeout",
        "4s",
        "--max-payload-bytes",
        "64KiB",
        "--max-attempts",
        "4",
    ])
    .unwrap();
    let relay = c.relay_settings();
    assert!(!relay.delete_on_ack, "kept for an hour, so marked sent");
    assert_eq!(relay.round_trip, Duration::from_secs(4));
    assert_eq!(relay.limits.max_payload_bytes, 64 * 1024);
    assert_eq!(relay.limits.max_attempts, 4);
    assert_eq!(relay.strategy, c.order.strategy);
    assert!(run_args(&[]).unwrap().relay_settings().delete_on_ack);
}

#[test]
fn print_sql_without_a_database_takes_the_table_and_columns_from_the_flags_alone() {
    let cli = Cli::try_parse_from([
        "outbox-relay",
        "migrate",
        "--print-sql",
        "--table",
        "app.outboxevent",
        "--column",
        "event_id=id",
    ])
    .unwrap();
    let Command::Migrate(args) = cli.command else {
        panic!("parsed {:?}", cli.command)
    };
    assert!(args.database.validate().is_err(), "no --database-url");
    let db = args.database.offline().unwrap();
    assert_eq!(db.table.quoted(), "\"app\".\"outboxevent_relay\"");
    let (base, map) = db.adopted.unwrap();
    assert_eq!(base.quoted(), "\"app\".\"outboxevent\"");
    assert_eq!(map.event_id, "id");
    assert_eq!(db.password, PasswordSource::Url);
    let cli = Cli::try_parse_from(["outbox-relay", "migrate", "--table", "a.b.c"]).unwrap();
    let Command::Migrate(args) = cli.command else {
        panic!()
    };
    assert!(args.database.offline().unwrap_err().contains("--table"));
}

#[test]
fn the_latency_budget_defaults_to_thirty_milliseconds_and_stays_within_the_poll_interval() {
    assert_eq!(
        run_args(&[]).unwrap().claim.max_delay,
        Duration::from_millis(30)
    );
    assert_eq!(
        run_args(&["--max-delay", "0s"]).unwrap().claim.max_delay,
        Duration::ZERO
    );
    // The flag's name before it became a budget still works.
    assert_eq!(
        run_args(&["--linger", "7ms"]).unwrap().claim.max_delay,
        Duration::from_millis(7)
    );
    let err = run_args(&["--max-delay", "200ms"]).unwrap_err();
    assert!(
        err.starts_with("--max-delay 200ms is longer than --poll-interval 100ms"),
        "{err}"
    );
    assert!(run_args(&["--max-delay", "200ms", "--poll-interval", "1s"]).is_ok());
    // Unset, it follows a shorter poll interval instead of refusing it.
    assert_eq!(
        run_args(&["--poll-interval", "20ms"])
            .unwrap()
            .claim
            .max_delay,
        Duration::from_millis(20)
    );
}
