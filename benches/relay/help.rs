//! The relay build's `run --help`: which flags it has and their defaults, so that the runs
//! follow the build being measured.

/// The `[default: N]` clap prints under `flag` in `--help`.
pub fn help_default(help: &str, flag: &str) -> Option<u64> {
    help_value(help, flag)?.parse().ok()
}

/// The `[default: …]` clap prints under `flag` in `--help`, as text.
pub fn help_value(help: &str, flag: &str) -> Option<String> {
    let start = help.find(&format!("{flag} <"))?;
    let rest = &help[start..];
    // The flag's own block ends where the next flag starts.
    let block = &rest[..rest[2..].find("\n      -").map_or(rest.len(), |i| i + 2)];
    let value = block.split("[default: ").nth(1)?.split(']').next()?;
    Some(value.trim().to_string())
}

/// `outbox-relay run --help`, to learn which flags this build has.
pub fn relay_run_help() -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["run", "--help"])
        .output()
        .expect("run outbox-relay run --help");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// Run by selftest.rs (`cargo test --bench relay`): the bench has no libtest harness.
pub mod tests {
    use super::{help_default, help_value};

    /// The shape clap prints for `run --help`.
    const HELP: &str = "Options:
      --batch-size <N>
          Rows claimed at once

          [env: OUTBOX_BATCH_SIZE=]
          [default: 100]

      --wakeup <MODE>
          How an idle relay learns of new rows

          [possible values: poll, notify, logical]

      --retention <AGE>
          [default: 7d]
";

    pub fn help_values_are_read_from_the_flags_own_block() {
        assert_eq!(help_value(HELP, "--batch-size").as_deref(), Some("100"));
        assert_eq!(help_default(HELP, "--batch-size"), Some(100));
        assert_eq!(help_value(HELP, "--retention").as_deref(), Some("7d"));
        assert_eq!(help_default(HELP, "--retention"), None);
        // `--wakeup` has no default of its own: the next flag's is not taken for it.
        assert_eq!(help_value(HELP, "--wakeup"), None);
        assert_eq!(help_value(HELP, "--max-in-flight"), None);
    }
}
