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
//! - [`poll`]: pure: when an idle relay looks for work again (`--wakeup poll`).
//! - [`metrics`]: metric names, `/metrics`, `/healthz`, `/readyz`.
//! - [`tls`]: TLS to PostgreSQL with libpq's `sslmode` semantics, and client certificates.
//! - [`dbauth`]: each new connection's password: the URL, a password file, or an RDS IAM token.
//! - [`aws`]: the AWS configuration, loaded once, shared by SQS and IAM database auth.
//! - [`check`]: the `check` command: configuration, database and queues, one verdict a line.
//! - [`command`]: what the commands share: a table's outbox, a selection's tables, a failure.
//! - [`console`]: the `console` command: the operators' web page over every table.
//! - [`otel`]: OpenTelemetry: a span per event, parented on the row's `traceparent`, over OTLP.
//! - [`version`]: pure: this relay's version, and which versions a table's schema lets claim
//!   (the compatibility contract `migrate` records).
//! - [`redact`]: every log line on its way out: URL userinfo and secret settings masked.

pub mod aws;
pub mod batch;
pub mod check;
pub mod command;
pub mod concurrency;
pub mod config;
pub mod console;
pub mod dbauth;
pub mod destination;
pub mod group;
pub mod metrics;
pub mod otel;
pub mod outbox;
pub mod poll;
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

    /// The layers of `src/outbox/`, lowest first, as src/outbox.rs's map declares them: its
    /// `//! N.` sections, each naming its rooms in backquotes. A room may import from its own
    /// layer and those below; a folder (`schema/`, `logical/`) is one room.
    fn outbox_layers() -> Vec<Vec<String>> {
        let face = include_str!("outbox.rs");
        let rooms = declared(face);
        let mut layers: Vec<Vec<String>> = Vec::new();
        for line in map(face).lines() {
            let text = line.trim_start_matches("//!").trim_start();
            let starts_layer = text
                .split_once(". ")
                .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
            if starts_layer {
                layers.push(Vec::new());
            }
            let Some(layer) = layers.last_mut() else {
                continue;
            };
            for (i, name) in text.split('`').enumerate() {
                let known = rooms.iter().any(|room| room == name);
                if i % 2 == 1 && known && !layer.iter().any(|r| r == name) {
                    layer.push(name.to_string());
                }
            }
        }
        layers
    }

    fn layer(room: &str) -> Option<usize> {
        outbox_layers()
            .iter()
            .position(|rooms| rooms.iter().any(|r| r == room))
    }

    /// The room a file of `src/outbox/` is, and the prefixes by which it names other rooms.
    fn room_of(path: &Path) -> (String, Vec<&'static str>) {
        let outbox = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/outbox");
        let inside = path.strip_prefix(&outbox).expect("a file of src/outbox/");
        let mut parts = inside.iter().map(|p| p.to_string_lossy().to_string());
        let first = parts.next().expect("a file name");
        match parts.next() {
            // A folder's `mod.rs` names its siblings as the file beside it would.
            Some(file) if file == "mod.rs" => (first, vec!["super::", "crate::outbox::"]),
            // A folder's other files: `super::` is the folder's own room.
            Some(_) => (first, vec!["super::super::", "crate::outbox::"]),
            None => match first.strip_suffix(".rs") {
                Some(name) => (name.to_string(), vec!["super::", "crate::outbox::"]),
                None => (first, vec![]),
            },
        }
    }

    /// Every room `text` imports (test modules aside), and whether it names the face
    /// (`src/outbox.rs`) or the request planner.
    fn imports(text: &str, prefixes: &[&str]) -> Vec<String> {
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
        let mut found = Vec::new();
        for line in code.lines().map(str::trim_start) {
            if line.starts_with("//") {
                continue;
            }
            if line.contains("crate::batch") {
                found.push("crate::batch".to_string());
            }
            for prefix in prefixes {
                let mut rest = line;
                while let Some(at) = rest.find(prefix) {
                    let after = &rest[at + prefix.len()..];
                    // `super::super::x` is another prefix's import, not this one's.
                    if after.starts_with("super::") {
                        rest = after.trim_start_matches("super::");
                        continue;
                    }
                    rest = after;
                    let name: String = after
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '{')
                        .collect();
                    let name = name.trim_end_matches('{');
                    let is_room =
                        !name.is_empty() && name.chars().all(|c| c.is_lowercase() || c == '_');
                    found.push(if is_room && layer(name).is_some() {
                        name.to_string()
                    } else {
                        "the face".to_string()
                    });
                }
            }
        }
        found
    }

    /// Every import in `src/outbox/` that runs up a layer, names the face or the planner.
    fn arrows_up() -> Vec<String> {
        let mut files = Vec::new();
        rust_files(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src/outbox"),
            &mut files,
        );
        let mut up = Vec::new();
        for path in files {
            let (room, prefixes) = room_of(&path);
            let text = std::fs::read_to_string(&path).expect("read a source file");
            let own = layer(&room).unwrap_or_else(|| panic!("{room} is in no layer"));
            for target in imports(&text, &prefixes) {
                let wrong = match layer(&target) {
                    Some(theirs) => theirs > own,
                    None => true,
                };
                if wrong && target != room {
                    up.push(format!("{} -> {target}", path.display()));
                }
            }
        }
        up.sort();
        up.dedup();
        up
    }

    #[test]
    fn outbox_rooms_import_only_downward() {
        let up = arrows_up();
        assert!(
            up.is_empty(),
            "{} imports in src/outbox/ run up a layer (src/outbox.rs), name the face, or reach the request planner:\n{}",
            up.len(),
            up.join("\n")
        );
    }

    #[test]
    fn an_import_from_above_or_from_the_face_is_found() {
        let text = "use super::store::Outbox;\nuse super::{Outbox, TableName};\nuse crate::batch::fifo_id;\nuse super::super::template::render;\n";
        assert_eq!(
            imports(text, &["super::", "crate::outbox::"]),
            ["store", "the face", "crate::batch"]
        );
        assert_eq!(
            imports(text, &["super::super::", "crate::outbox::"]),
            ["crate::batch", "template"]
        );
        assert!(layer("store") > layer("conn") && layer("schema") > layer("session"));
        let layers = outbox_layers();
        assert_eq!(layers.len(), 5, "{layers:?}");
        let placed: Vec<&String> = layers.iter().flatten().collect();
        for room in declared(include_str!("outbox.rs")) {
            assert_eq!(
                placed.iter().filter(|r| ***r == room).count(),
                1,
                "`{room}` is declared in src/outbox.rs and must stand in exactly one layer of its map"
            );
        }
    }
}
