//! # outbox-relay
//!
//! A sidecar that relays a PostgreSQL transactional outbox to Amazon SQS: it claims unsent
//! rows under a short lease (one row per claim in a lease table beside the outbox; the claims
//! of a table take turns on a transaction advisory lock, with no row locks), sends them with
//! SendMessageBatch keeping the business `event_id`, and settles them only after SQS
//! acknowledged them: deletes them (`--retention 0`, the default), or marks them sent and
//! keeps them for `--retention`.
//!
//! # Layout
//!
//! Data flows one way: `outbox::claim -> batch::plan -> relay::send -> relay::decide ->
//! relay::apply -> outbox::settle -> metrics`. The one feedback (pause, park a destination,
//! a destination reached) travels as data: decisions return `Effect`s that the loop applies.
//! docs/architecture.md draws it, says where each decision lives and how to add a destination
//! kind.
//!
//! - [`config`]: command line and environment -> validated configuration, in groups (database,
//!   destination, claim, send, retry, order, format, offload, maintenance), each validated purely;
//!   the files the flags name are read once, at start-up.
//! - [`outbox`]: the only owner of SQL: migrate, claim, settle (fenced by lease token), stats.
//! - [`row`]: the rows and their outcomes, shared by `outbox` and `batch` (a leaf).
//! - [`group`]: what a group is, (destination, group key), for the planner and the claim's SQL (a leaf).
//! - [`batch`]: pure: rows -> SendMessageBatch requests within SQS's count and size limits.
//! - [`sink`]: SQS queues and SNS topics behind one interface (one request in, one outcome per
//!   entry out), each SDK owned by one file in it; and the S3 bucket large bodies go to first.
//! - [`retry`]: pure: classify failures; capped exponential backoff with full jitter.
//! - [`concurrency`]: each destination's requests in flight, adapted to its answers (pure rule inside).
//! - [`destination`]: what a destination is (queue, topic, bucket; FIFO or standard), parsed once,
//!   with its limits, client, FIFO rules and park key; which refuse us and until when their rows wait.
//! - [`relay`]: the loop that ties them together, with shutdown and back-pressure; its decisions
//!   are pure (`relay::decide`) and return their effects as data (`relay::effect`).
//! - [`idle`]: pure: when an idle relay looks for work again (`--wakeup poll`).
//! - [`metrics`]: metric names, `/metrics`, `/healthz`, `/readyz`.
//! - [`tls`]: TLS to PostgreSQL with libpq's `sslmode` semantics, and client certificates.
//! - [`dbauth`]: each new connection's password: the URL, a password file, or an RDS IAM token.
//! - [`aws`]: the AWS configuration, loaded once, shared by SQS and IAM database auth.
//! - [`check`]: the `check` command: configuration, database and queues, one verdict a line.
//! - [`otel`]: OpenTelemetry: a span per event, parented on the row's `traceparent`, over OTLP.
//! - [`version`]: pure: this relay's version, and which versions a table's schema lets claim
//!   (the compatibility contract `migrate` records).
//! - [`redact`]: every log line on its way out: URL userinfo and secret settings masked.

pub mod aws;
pub mod batch;
pub mod check;
pub mod concurrency;
pub mod config;
pub mod dbauth;
pub mod destination;
pub mod group;
pub mod idle;
pub mod metrics;
pub mod otel;
pub mod outbox;
pub mod redact;
pub mod relay;
pub mod retry;
pub mod row;
pub mod sink;
pub mod tls;
pub mod version;

/// The module maps (each file's `//!` list of its rooms) stay true: a map that falls behind
/// its `mod` lines sends a newcomer to the wrong place.
#[cfg(test)]
mod maps {
    use std::path::Path;

    /// The modules `text` declares with `mod x;` (test modules aside).
    fn declared(text: &str) -> Vec<String> {
        text.lines()
            .map(str::trim_start)
            .filter_map(|line| {
                let rest = line
                    .strip_prefix("pub(crate) ")
                    .or_else(|| line.strip_prefix("pub "))
                    .unwrap_or(line);
                rest.strip_prefix("mod ")?
                    .strip_suffix(';')
                    .map(str::to_string)
            })
            .filter(|name| name != "tests")
            .collect()
    }

    /// The file's map: its leading `//!` lines.
    fn map(text: &str) -> String {
        text.lines()
            .take_while(|line| line.starts_with("//!") || line.trim().is_empty())
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read src/") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn every_declared_module_is_in_its_files_map() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut missing = Vec::new();
        let mut checked = 0;
        for path in files {
            let text = std::fs::read_to_string(&path).expect("read a source file");
            let map = map(&text);
            for name in declared(&text) {
                checked += 1;
                if !map.contains(&format!("`{name}`")) {
                    missing.push(format!("{}: `{name}`", path.display()));
                }
            }
        }
        assert!(checked > 50, "only {checked} modules found under src/");
        assert!(
            missing.is_empty(),
            "declared with `mod` but missing from the file's `//!` map:\n{}",
            missing.join("\n")
        );
    }

    #[test]
    fn a_module_left_out_of_the_map_is_found() {
        let text = "//! - `a`: one room.\n\nmod a;\npub(crate) mod b;\n#[cfg(test)]\nmod tests;\n";
        assert_eq!(declared(text), ["a", "b"]);
        assert!(!map(text).contains("`b`"));
    }
}
