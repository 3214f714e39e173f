//! What a run's results were measured on: when, which commit, which PostgreSQL and CPU, and
//! the run's settings (results.json's `meta`).

use serde_json::{json, Value};

use crate::settings::Settings;
use crate::support;

/// Reads the machine, the repository and the shared cluster once, at the start of a run.
pub async fn collect(settings: &Settings, ordered_flag: bool) -> Value {
    let (admin, connection) =
        tokio_postgres::connect(&support::pg().admin_url(), tokio_postgres::NoTls)
            .await
            .expect("connect to the benchmark PostgreSQL");
    tokio::spawn(connection);
    let pg_version: String = admin
        .query_one("SHOW server_version", &[])
        .await
        .expect("server version")
        .get(0);
    let command = |program: &str, args: &[&str]| {
        std::process::Command::new(program)
            .args(args)
            .current_dir(support::repo_root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let dirty = command("git", &["status", "--porcelain", "--", "src", "sql"])
        .is_some_and(|s| !s.is_empty());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cores = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string());
    json!({
        "date": command("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
        "commit": command("git", &["rev-parse", "--short", "HEAD"]),
        "src_modified_since_commit": dirty,
        "postgres": pg_version,
        "cores": cores,
        "cpu": model,
        "quick": settings.quick,
        "rows": settings.rows,
        "batch_size": settings.batch,
        "max_in_flight_default": settings.in_flight,
        "window_seconds": settings.window.as_secs(),
        "steady_seconds": settings.steady.as_secs(),
        "extra_relay_args": settings.relay_args,
        "relay_pg_options": settings.relay_pg_options,
        "relay_has_ordered_flag": ordered_flag,
    })
}
