//! What a run does: the knobs read from the environment (the table in main.rs) and the
//! constants every group shares.

use std::path::PathBuf;
use std::time::Duration;

use crate::help::help_default;
use crate::support;

/// What this run does; from the environment, see the table at the top of main.rs.
pub struct Settings {
    /// `OUTBOX_BENCH_QUICK`: the smaller defaults, to try the benchmark out.
    pub quick: bool,
    /// Backlog of every drain and ceiling run (`OUTBOX_BENCH_ROWS`).
    pub rows: u64,
    /// `--batch-size` of every relay and the ceiling's batch: the relay's default unless
    /// `OUTBOX_BENCH_BATCH` says otherwise.
    pub batch: usize,
    /// The relay's default `--max-in-flight`; drains run at it unless they sweep.
    pub in_flight: usize,
    /// Runs that cannot finish the backlog in reasonable time stop after this long and
    /// report the rate they reached.
    pub window: Duration,
    /// Producer time per steady rate.
    pub steady: Duration,
    /// The steady group's rates, events/s, one run each.
    pub steady_rates: Vec<u64>,
    /// Writer time of one harm cell, and how many times without and with alternate.
    pub harm_seconds: Duration,
    /// Without/with alternations per writer count of the harm group.
    pub harm_rounds: usize,
    /// Writer time of one own-core harm cell: `OUTBOX_BENCH_HARM_SECONDS` when set, else 8 s.
    pub own_core_seconds: Duration,
    /// Rounds of the own-core harm table (each runs every cell once, in rotated order):
    /// `OUTBOX_BENCH_HARM_ROUNDS` when set, else 5.
    pub own_core_rounds: usize,
    /// Events of each settlement mode of the `wal` group (`OUTBOX_BENCH_WAL_ROWS`).
    pub wal_rows: u64,
    /// Backlog of the `wal` group's durable drain (`OUTBOX_BENCH_DURABLE_DRAIN_ROWS`).
    pub durable_drain_rows: u64,
    /// Rounds of the tracing group; each round drains once per variant, in rotated order.
    pub tracing_rounds: usize,
    /// Idle relays run this long before the measured window, so that a wait that stretches
    /// with idleness has stretched.
    pub idle_settle: Duration,
    /// The idle group's measured window, after `idle_settle`.
    pub idle_window: Duration,
    /// Backlog of the `big-backlog` group, and its time without the relay first.
    pub backlog_rows: u64,
    /// The application's steady commits without the relay, before the big backlog's relay starts.
    pub backlog_baseline: Duration,
    /// Events/s of each storage variant's producer.
    pub storage_rate: u64,
    /// Producer time of the storage run.
    pub storage_duration: Duration,
    /// Table size is read this often during the storage run.
    pub storage_every: Duration,
    /// `--max-in-flight` values of the sweep group, one drain each.
    pub sweep: Vec<usize>,
    /// Measured window of one `rates` cell, after its warm-up (`OUTBOX_BENCH_RATE_SECONDS`).
    pub rate_seconds: Duration,
    /// Rounds of the `rates` group; each runs every reader once per rate, in rotated order
    /// (`OUTBOX_BENCH_RATE_ROUNDS`).
    pub rate_rounds: usize,
    /// The `rates` group's rates, events/s (`OUTBOX_BENCH_RATES`, e.g. `200,2000`).
    pub rates: Vec<u64>,
    /// The `horizon` group's rates, events/s (`OUTBOX_BENCH_HORIZON_RATES`).
    pub horizon_rates: Vec<u64>,
    /// The `horizon` group's measured window (`OUTBOX_BENCH_HORIZON_WINDOW`, seconds).
    pub horizon_window: Duration,
    /// How long the `horizon` group holds its snapshot (`OUTBOX_BENCH_HOLD`, e.g. `30m`).
    pub horizon_hold: Duration,
    /// Windows of the `horizon` group before the hold, and after it.
    pub horizon_free_windows: usize,
    /// See `horizon_free_windows`.
    pub horizon_released_windows: usize,
    /// Groups to run (`OUTBOX_BENCH_ONLY`); `None`: all of them.
    pub only: Option<Vec<String>>,
    /// Extra flags for every relay (`OUTBOX_BENCH_RELAY_ARGS`).
    pub relay_args: Vec<String>,
    /// libpq `options` added to every relay's database URL: tries a relay-side session
    /// setting without rebuilding the relay.
    pub relay_pg_options: Option<String>,
    /// Where results.json, table.md and the plot data go (`OUTBOX_BENCH_OUT`).
    pub out_dir: PathBuf,
}

/// In-region SQS answers SendMessageBatch in about this long.
pub const SQS_LATENCY: Duration = Duration::from_millis(15);
/// Producer connections for the steady runs. With durable commits one connection commits
/// ~300-500 rows/s and group commit needs many waiting at once (~4k/s with 16-64); open loop,
/// so idle connections cost nothing while the producers keep up.
pub const PRODUCER_CONNECTIONS: usize = 32;

impl Settings {
    /// The run's settings; `relay_help` (`outbox-relay run --help`) gives the relay's defaults.
    pub fn from_env(relay_help: &str) -> Settings {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let number = |name: &str, default: u64| -> u64 {
            var(name).map_or(default, |v| {
                v.trim()
                    .replace('_', "")
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={v:?}: expected a whole number"))
            })
        };
        let rates = |name: &str, default: &[u64]| -> Vec<u64> {
            var(name).map_or(default.to_vec(), |v| {
                v.split(',')
                    .map(|r| {
                        r.trim().replace('_', "").parse().unwrap_or_else(|_| {
                            panic!(
                                "{name}={v:?}: expected whole numbers of events/s, comma-separated"
                            )
                        })
                    })
                    .collect()
            })
        };
        let quick = var("OUTBOX_BENCH_QUICK").is_some_and(|v| v != "0");
        let (rows, window, steady) = if quick {
            (20_000, 5, 5)
        } else {
            (200_000, 15, 15)
        };
        Settings {
            quick,
            rows: number("OUTBOX_BENCH_ROWS", rows),
            batch: number(
                "OUTBOX_BENCH_BATCH",
                help_default(relay_help, "--batch-size").unwrap_or(100),
            ) as usize,
            in_flight: help_default(relay_help, "--max-in-flight").unwrap_or(4) as usize,
            window: Duration::from_secs(number("OUTBOX_BENCH_WINDOW", window)),
            steady: Duration::from_secs(number("OUTBOX_BENCH_STEADY_SECONDS", steady)),
            steady_rates: vec![500, 2_000, 5_000],
            backlog_rows: number(
                "OUTBOX_BENCH_BACKLOG_ROWS",
                if quick { 100_000 } else { 1_000_000 },
            ),
            backlog_baseline: Duration::from_secs(number(
                "OUTBOX_BENCH_BACKLOG_BASELINE_SECONDS",
                if quick { 10 } else { 30 },
            )),
            harm_seconds: Duration::from_secs(number(
                "OUTBOX_BENCH_HARM_SECONDS",
                if quick { 5 } else { 15 },
            )),
            harm_rounds: number("OUTBOX_BENCH_HARM_ROUNDS", if quick { 1 } else { 3 }) as usize,
            own_core_seconds: Duration::from_secs(number(
                "OUTBOX_BENCH_HARM_SECONDS",
                if quick { 5 } else { 8 },
            )),
            own_core_rounds: number("OUTBOX_BENCH_HARM_ROUNDS", if quick { 1 } else { 5 }) as usize,
            wal_rows: number("OUTBOX_BENCH_WAL_ROWS", if quick { 5_000 } else { 20_000 }),
            durable_drain_rows: number(
                "OUTBOX_BENCH_DURABLE_DRAIN_ROWS",
                if quick { 10_000 } else { 50_000 },
            ),
            tracing_rounds: number("OUTBOX_BENCH_TRACING_ROUNDS", if quick { 1 } else { 3 })
                as usize,
            idle_settle: Duration::from_secs(if quick { 3 } else { 10 }),
            idle_window: Duration::from_secs(number(
                "OUTBOX_BENCH_IDLE_SECONDS",
                if quick { 10 } else { 60 },
            )),
            storage_rate: 1_000,
            storage_duration: Duration::from_secs(number(
                "OUTBOX_BENCH_STORAGE_SECONDS",
                if quick { 60 } else { 600 },
            )),
            storage_every: Duration::from_secs(if quick { 10 } else { 30 }),
            // Below 4 requests in flight a drain only shows the bound in-flight × 10 / 15 ms
            // (measured before); the full run's time goes to the durable runs instead.
            sweep: if quick {
                vec![4, 16, 32]
            } else {
                vec![4, 8, 16, 32, 64]
            },
            rate_seconds: Duration::from_secs(number(
                "OUTBOX_BENCH_RATE_SECONDS",
                if quick { 5 } else { 20 },
            )),
            rate_rounds: number("OUTBOX_BENCH_RATE_ROUNDS", if quick { 1 } else { 3 }) as usize,
            rates: rates("OUTBOX_BENCH_RATES", &crate::rates::RATES),
            horizon_rates: rates("OUTBOX_BENCH_HORIZON_RATES", &crate::horizon::RATES),
            horizon_window: Duration::from_secs(number(
                "OUTBOX_BENCH_HORIZON_WINDOW",
                if quick { 10 } else { 30 },
            )),
            horizon_hold: var("OUTBOX_BENCH_HOLD").map_or(
                Duration::from_secs(if quick { 60 } else { 180 }),
                |v| {
                    humantime::parse_duration(v.trim()).unwrap_or_else(|e| {
                        panic!("OUTBOX_BENCH_HOLD={v:?}: expected a duration such as 30m ({e})")
                    })
                },
            ),
            horizon_free_windows: if quick { 2 } else { 4 },
            horizon_released_windows: if quick { 1 } else { 2 },
            only: var("OUTBOX_BENCH_ONLY")
                .map(|v| v.split(',').map(|s| s.trim().to_string()).collect()),
            relay_args: var("OUTBOX_BENCH_RELAY_ARGS")
                .map(|v| v.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default(),
            relay_pg_options: var("OUTBOX_BENCH_RELAY_PG_OPTIONS"),
            out_dir: var("OUTBOX_BENCH_OUT")
                .map(PathBuf::from)
                .unwrap_or_else(|| support::repo_root().join("target/bench")),
        }
    }

    /// `url` with [`Settings::relay_pg_options`] added, for a relay's `--database-url`.
    pub fn relay_url(&self, url: &str) -> String {
        match &self.relay_pg_options {
            Some(options) => with_pg_options(url, options),
            None => url.to_string(),
        }
    }

    /// Whether `OUTBOX_BENCH_ONLY` lets `group` run.
    pub fn runs(&self, group: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|g| g == group))
    }
}

/// `url` with libpq `options` added, percent-encoded.
fn with_pg_options(url: &str, options: &str) -> String {
    let encoded: String = options
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options={encoded}")
}

// Run by selftest.rs (`cargo test --bench relay`): the bench has no libtest harness.
pub mod tests {
    use super::with_pg_options;

    pub fn pg_options_are_percent_encoded_after_any_query() {
        assert_eq!(
            with_pg_options("postgres://u@h/db", "-c synchronous_commit=off"),
            "postgres://u@h/db?options=-c%20synchronous_commit%3Doff"
        );
        assert_eq!(
            with_pg_options("postgres://u@h/db?sslmode=disable", "-c a=b"),
            "postgres://u@h/db?sslmode=disable&options=-c%20a%3Db"
        );
    }
}
