//! sql/roles.sql run as the operator would: psql, the superuser, passwords from the environment.

use std::path::PathBuf;
use std::process::Command;

use super::TestDb;

/// psql from PATH, else from Debian's newest server directory (Debian keeps it there too).
fn psql() -> PathBuf {
    let on_path = Command::new("psql").arg("--version").output();
    if on_path.is_ok_and(|o| o.status.success()) {
        return PathBuf::from("psql");
    }
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            Some((
                e.file_name().to_str()?.parse().ok()?,
                e.path().join("bin/psql"),
            ))
        })
        .filter(|(_, psql)| psql.is_file())
        .collect();
    debian.sort();
    debian
        .pop()
        .map(|(_, psql)| psql)
        .expect("psql, the PostgreSQL client, is needed to run sql/roles.sql")
}

/// Runs sql/roles.sql on `db` as the superuser; passwords come from the environment.
pub fn apply_roles(
    db: &TestDb,
    vars: &[(&str, &str)],
    envs: &[(&str, &str)],
) -> std::process::Output {
    let mut cmd = Command::new(psql());
    cmd.arg(&db.url)
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1"])
        .arg("-f")
        .arg(crate::support::repo_root().join("sql/roles.sql"));
    for (k, v) in vars {
        cmd.arg("-v").arg(format!("{k}={v}"));
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.env_remove("PGPASSWORD")
        .output()
        .expect("run psql (the PostgreSQL client)")
}

/// sql/roles.sql for `relay_role` and `app_role`, each with a random password: the relay's.
pub fn make_roles(db: &TestDb, relay_role: &str, app_role: &str) -> String {
    let relay_pw = super::random_hex(12);
    let out = apply_roles(
        db,
        &[("relay_role", relay_role), ("app_role", app_role)],
        &[
            ("OUTBOX_RELAY_PASSWORD", &relay_pw),
            ("OUTBOX_APP_PASSWORD", &super::random_hex(12)),
        ],
    );
    assert!(
        out.status.success(),
        "sql/roles.sql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    relay_pw
}
