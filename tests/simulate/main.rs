//! The randomized simulation of issue 26: real PostgreSQL (a cluster of its own), PgBouncer,
//! fauxqs and `outbox-relay` processes, under the settings, fleet, workload and fault schedule a
//! seed draws, and a checker over the whole history.
//!
//! # Layout
//!
//! - [`plan`]: the seed's PRNG and what it draws ([`plan::Plan`]).
//! - [`expect`]: the one table of what each database setting must give (deliver, or refuse
//!   with one line naming it).
//! - [`world`]: runs a plan against the real things and gathers the evidence.
//! - [`history`]: the trigger log on the outbox and lease tables.
//! - [`check`]: the invariants over the evidence.
//!
//! Usage (`scripts/simulate` passes its arguments here): no arguments runs [`CI_SEEDS`];
//! `--seed N` one seed; `--minutes N` random seeds until N minutes passed, then a summary.
//! libtest's flags are ignored, and positional filters none of which matches `simulate` (what
//! `cargo test -- FILTER` passes to every test binary) run nothing.

#[path = "../support/mod.rs"]
mod support;

mod check;
mod expect;
mod history;
mod plan;
mod selftest;
mod world;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use expect::Expect;
use plan::Plan;
use support::pg::PrivatePg;

/// The seeds every `cargo test` runs (within 4 minutes on a 2-core machine). Each covers a
/// cell that caught one of issue 26's defects on the code before its fix (docs/guarantees.md,
/// "The randomized simulation"). Defect 3 is a race, so two seeds cover it (595, 140).
///
/// | seed | cell | caught, before the fixes |
/// |---|---|---|
/// | 160 | repeatable read on the role, 2 relays, no fault | defect 1: copies without faults |
/// | 202 | slow claims in the server, 3 relays, FIFO | defect 2: attempts spent by takeovers |
/// | 595 | FIFO, ordered, fair-by, skip, 4 relays, slow claims, kill -9 | defect 3: a group in flight twice (and defect 2) |
/// | 140 | (its redraw) FIFO topic, ordered, fair-by, skip, kill -9 | defect 3, and order broken |
/// | 6 | PgBouncer transaction pool, no --pooler, 1 relay | defect 4: synchronous_commit = off |
/// | 31 | the same with 2 relays | defect 4: refused (prepared statement "s0") |
/// | 107 | default_transaction_read_only on the database | defect 5: every row lost |
/// | 115 | search_path without public on the role | defect 5: a refusal not naming it |
/// | 640 | repeatable read, FIFO, block, poison, retries | defect 1 |
/// | 320 | serializable on the role, 4 relays, one skipping and three blocking | defect 6: parking a leased row (shown with parking's stated isolation removed) |
/// | 49 | sigstop, 5xx, dark link, kill -9, ordered block | (faults together) |
/// | 405 | repeatable read on the role, FIFO, ordered skip, 1 relay, no fault | (issue 36, below) |
/// | 381 | 3 relays, ordered skip, fair-by, `--order-by transaction`, no fault | (issue 36, below) |
/// | 288 | FIFO, ordered block, partial batch failure, slow claims, kill -9 | (issue 36, below) |
///
/// Issue 36 (the vacuum horizon and late commits) was drawn after them, so each seed above
/// runs its cell unchanged, with what it now draws of these beside it ("below": late rows that
/// committed below an id already sent, of those committed, in one run; each of the six seeds
/// with late rows loses rows with the relays at `--sweep-interval 1h`):
///
/// | seed | horizon held | late writers | sweep | below |
/// |---|---|---|---|---|
/// | 160 | snapshot, prepared (committed) | two cached-id sessions | 2 s | 16 of 19 |
/// | 202 | two snapshots | | 1 s | |
/// | 595 | snapshot | | 1 s | |
/// | 140 | idle writer (its redraw) | | 2 s | |
/// | 107 | snapshot | | 2 s | |
/// | 640 | | a cached-id session | 2 s | 4 of 5 |
/// | 49 | | a long transaction (committed) | 10 s | 4 of 4 |
/// | 405 | snapshot, prepared (rolled back) | cached ids, savepoint, prepared (committed) | 2 s | 14 of 15 |
/// | 381 | idle writer | cached ids, prepared committed and prepared rolled back | 3 s | 9 of 13 |
/// | 288 | snapshot, prepared (committed) | long rolled back, savepoint beside one rolled back to | 1 s | 2 of 2 |
///
/// Issue 37 (what the application's side does to the relay) was drawn after those, the same
/// way: of the seeds above, 31 starts its relays 2 s before the database, 49 gets a keep-row
/// trigger at 3 s (4 relays, kill -9 among its faults), and 202 row-level security with the
/// relays' own policy (they deliver). Three seeds were added for it:
///
/// | seed | cell | caught, before the fixes |
/// |---|---|---|
/// | 47 | a `DO INSTEAD NOTHING` rule on UPDATE at 243 ms, FIFO topic, 2 relays, slow claims, 5xx | settlements the server refused (SQLSTATE 0A000) retried until each lease ended, never named: "no committed row is lost" (219 rows), "nothing is left unsent" |
/// | 52 | the same on DELETE at 75 ms, 3 relays, sigstop | with only the fix above: the refusal met on a new connection (`SettlementRewritten`) was still retried every 0.1 s until the lease ended, and the takeovers after it spent attempts |
/// | 74 | row-level security hiding every row from the relays' role at 1.8 s, FIFO, 2 relays | none (the relays named it): the cell of "a backlog the relay cannot see is reported" |
///
/// Issue 45's age signal (what a scraper derives from `/metrics`, sampled through the run) is
/// checked in every seed and draws nothing, so no plan changed: 381 caught its defect (the
/// statistics reported the lowest unsent id's `created_at`; a cached-id row hid older ones),
/// and rows wait while no relay can read in 115 (its redraw: the database restarted, then
/// PgBouncer refusing logins; 21 s), 74 (row-level security: the relays stop reading) and 288;
/// one seed was added for a dark link (docs/guarantees.md, "The age signal"):
///
/// | seed | cell | rows waiting while no relay could read |
/// |---|---|---|
/// | 1313 | PgBouncer, 1 relay, ordered skip, a partial batch failure, PostgreSQL restarted, SQS 5xx, then its link dark; held horizons, a prepared late row | 19 s, the derived age within its bounds at every sample |
///
/// And two found by `--minutes` runs, which failed replays before their fixes:
///
/// | seed | cell | caught, before the fix |
/// |---|---|---|
/// | 4885364916658979242 | PgBouncer in transaction pooling, 2 relays, FIFO ordered skip+block, fair-by, a slow link to relay 0 (181 ms each way) | a renewal given up on between its statement's Parse and its Close (learning parameter types took three round trips) left the statement on a server connection the pool then gave the application's session ("an application session through the pool reads the server's defaults", 3 runs in 4) |
/// | 12172163297347410868 | PgBouncer in transaction pooling (a pool of one), 2 relays, ordered skip+block, a dark link to relay 1, two held snapshots, late prepared rows | the maintenance connection's BEGIN went out alone, the link went dark before its timeouts: the pool's one server connection stayed idle in that transaction, and both relays waited on the pool for the rest of the run ("no committed row is lost", 59 rows) |
const CI_SEEDS: &[u64] = &[
    160,
    202,
    595,
    140,
    6,
    31,
    107,
    115,
    640,
    320,
    49,
    405,
    381,
    288,
    47,
    52,
    74,
    12172163297347410868,
    4885364916658979242,
    1313,
];

/// Refused combinations re-drawn before a seed gives up.
const REDRAWS: u32 = 8;

/// libtest flags that take a value as the next argument.
const VALUE_FLAGS: &[&str] = &[
    "--test-threads",
    "--color",
    "--format",
    "--skip",
    "--logfile",
    "-Z",
    "--shuffle-seed",
    "--report-time",
];

enum Mode {
    /// The seeds, after the checker's self-test when they are the CI seeds.
    Seeds(Vec<u64>),
    /// `--self-test`: the checker against histories made by hand, nothing else.
    SelfTest,
    /// `--describe N`: print the plans of seeds 0..N (first draw, and the second one a refusal
    /// would lead to) and run nothing (to pick seeds).
    Describe(u64),
    Minutes(u64),
    Nothing,
}

fn parse(args: &[String]) -> Mode {
    let mut seeds = Vec::new();
    let mut minutes = None;
    let mut filters = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        let value = || {
            args.get(i + 1)
                .unwrap_or_else(|| panic!("{a} needs a value"))
                .parse::<u64>()
                .unwrap_or_else(|e| panic!("{a} {}: {e}", args[i + 1]))
        };
        match a {
            "--seed" => {
                seeds.push(value());
                i += 1;
            }
            "--minutes" => {
                minutes = Some(value());
                i += 1;
            }
            "--list" => return Mode::Nothing,
            "--self-test" => return Mode::SelfTest,
            "--describe" => return Mode::Describe(value()),
            _ if VALUE_FLAGS.contains(&a) => i += 1,
            _ if a.starts_with('-') => {}
            _ => filters.push(a.to_string()),
        }
        i += 1;
    }
    if !filters.is_empty() && !filters.iter().any(|f| "simulate".contains(f.as_str())) {
        return Mode::Nothing;
    }
    match minutes {
        Some(m) => Mode::Minutes(m),
        None if seeds.is_empty() => Mode::Seeds(CI_SEEDS.to_vec()),
        None => Mode::Seeds(seeds),
    }
}

/// What one seed came to.
struct SeedResult {
    cell: String,
    faults: Vec<&'static str>,
    refusals: Vec<String>,
    violations: Vec<check::Violation>,
}

async fn run_seed(seed: u64, cluster: &PrivatePg) -> SeedResult {
    let mut refusals = Vec::new();
    for redraw in 0..REDRAWS {
        let plan = Plan::draw(seed, redraw);
        println!("{plan}");
        let started = Instant::now();
        match world::run(&plan, cluster).await {
            world::Run::Refused {
                line,
                error_lines,
                setting_caused,
            } => {
                let verdict = if setting_caused {
                    match expect::expectation(&plan.setting, plan.pool.is_some()) {
                        Expect::MayRefuse(_) if error_lines != 1 => Some(format!(
                            "the refusal under {} takes {error_lines} error lines, not one: {line}",
                            plan.cell()
                        )),
                        Expect::MayRefuse(needle) if line.contains(needle) => None,
                        Expect::MayRefuse(needle) => Some(format!(
                            "the refusal under {} does not name `{needle}`: {line}",
                            plan.cell()
                        )),
                        Expect::Delivers => Some(format!(
                            "refused to start under {}, which it must deliver under: {line}",
                            plan.cell()
                        )),
                    }
                } else {
                    None
                };
                println!(
                    "  refused at start ({}): {line}",
                    if setting_caused {
                        "the setting"
                    } else {
                        "the flags"
                    }
                );
                if let Some(detail) = verdict {
                    return SeedResult {
                        cell: plan.cell(),
                        faults: Vec::new(),
                        refusals,
                        violations: vec![check::Violation {
                            invariant: "every setting delivers unchanged or is refused by design",
                            detail,
                        }],
                    };
                }
                refusals.push(line);
            }
            world::Run::Ran(evidence) => {
                let violations = check::check(&plan, &evidence);
                println!(
                    "  {} rows written, {} messages received, faults {:?}, {:.1} s",
                    evidence
                        .changes
                        .iter()
                        .filter(|c| c.is_outbox() && c.op == "I")
                        .count(),
                    evidence.received.len(),
                    evidence.injected,
                    started.elapsed().as_secs_f64()
                );
                // What the age signal was checked against: a seed whose rows never waited
                // while a relay could not read says little about it.
                let ages = |f: &dyn Fn(&world::Sample) -> Option<f64>| {
                    evidence.signal.iter().filter_map(f).fold(0.0_f64, f64::max)
                };
                let unread = evidence
                    .signal
                    .iter()
                    .filter(|s| s.readings.is_empty())
                    .count();
                println!(
                    "  age signal: {} samples ({unread} before any relay's first read), oldest unsent up to {:.1} s (derived up to {:.1} s), up to {:.1} s while no relay could read",
                    evidence.signal.len(),
                    ages(&|s| s.truth.map(|c| s.at - c)),
                    ages(&|s| s.picked().map(|r| s.at - r.oldest)),
                    ages(&|s| {
                        // Every relay's table down (a failed or overdue read), or the relay not
                        // answering the scrape (stopped, killed).
                        s.readings
                            .iter()
                            .all(|r| r.up == 0.0 || s.at - r.scraped > 1.0)
                            .then_some(s.truth.map(|c| s.at - c))
                            .flatten()
                    }),
                );
                if let Some((late, below)) = evidence.late_rows {
                    println!(
                        "  {late} late rows committed, {below} of them below an id already sent at their commit"
                    );
                }
                if let Some(line) = &evidence.undone_named {
                    let at = line.find("settlements on").unwrap_or(0);
                    println!(
                        "  named: {}",
                        line[at..].chars().take(200).collect::<String>()
                    );
                }
                return SeedResult {
                    cell: plan.cell(),
                    faults: evidence.injected.clone(),
                    refusals,
                    violations,
                };
            }
        }
    }
    SeedResult {
        cell: format!("(seed {seed}: every draw refused)"),
        faults: Vec::new(),
        refusals,
        violations: Vec::new(),
    }
}

fn report(seed: u64, result: &SeedResult) {
    if result.violations.is_empty() {
        println!("  seed {seed}: ok");
        return;
    }
    for v in &result.violations {
        println!("  VIOLATION {}: {}", v.invariant, v.detail);
    }
    println!("  replay: scripts/simulate --seed {seed}");
}

/// Runs the checker's self-test; exits non-zero if the checker misses a broken invariant.
fn self_test() {
    let failures = selftest::run();
    if failures.is_empty() {
        println!("checker self-test: ok");
        return;
    }
    for f in &failures {
        println!("checker self-test FAILED: {f}");
    }
    std::process::exit(1);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = parse(&args);
    match mode {
        Mode::Nothing => return,
        Mode::SelfTest => return self_test(),
        Mode::Describe(n) => {
            for seed in 0..n {
                println!("{}", Plan::draw(seed, 0));
                println!("  if refused: {}", Plan::draw(seed, 1));
            }
            return;
        }
        _ => {}
    }
    if matches!(&mode, Mode::Seeds(s) if s == CI_SEEDS) {
        self_test();
    }
    // The relays, migrate and the admin commands must never probe the EC2 metadata service.
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    // The relays' output is the checker's to read; OUTBOX_SIM_ECHO=1 shows it while one seed
    // is looked into.
    let echo = std::env::var_os("OUTBOX_SIM_ECHO").is_some_and(|v| v == "1");
    support::relay::ECHO.store(echo, std::sync::atomic::Ordering::Relaxed);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let failed = runtime.block_on(async {
        // Commit times say which late rows committed below a row already sent (the run's
        // summary line); prepared transactions are on by the harness's defaults.
        let cluster = PrivatePg::start_with(&["track_commit_timestamp=on"]).await;
        let mut failed = Vec::new();
        let mut cells = BTreeSet::new();
        let mut faults: BTreeMap<&'static str, usize> = BTreeMap::new();
        let mut refusals = 0;
        let mut violations = 0;
        let mut seeds_run = 0;
        let (seeds, until): (Box<dyn Iterator<Item = u64>>, Option<Instant>) = match mode {
            Mode::Seeds(s) => (Box::new(s.into_iter()), None),
            Mode::Minutes(m) => {
                let first = support::random_hex(8);
                let base = u64::from_str_radix(&first, 16).unwrap_or(0);
                (
                    Box::new((0..).map(move |k: u64| base.wrapping_add(k))),
                    Some(Instant::now() + Duration::from_secs(m * 60)),
                )
            }
            Mode::Nothing | Mode::Describe(_) | Mode::SelfTest => unreachable!(),
        };
        for seed in seeds {
            if until.is_some_and(|u| Instant::now() >= u) {
                break;
            }
            let result = run_seed(seed, &cluster).await;
            report(seed, &result);
            seeds_run += 1;
            cells.insert(result.cell.clone());
            for f in &result.faults {
                *faults.entry(f).or_default() += 1;
            }
            refusals += result.refusals.len();
            violations += result.violations.len();
            if !result.violations.is_empty() {
                failed.push(seed);
            }
        }
        println!(
            "simulate: {seeds_run} seeds, {} settings cells, faults injected {} ({}), {refusals} refused combinations re-drawn, {violations} violations",
            cells.len(),
            faults.values().sum::<usize>(),
            faults
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if until.is_some() {
            println!("cells: {}", cells.into_iter().collect::<Vec<_>>().join(" | "));
        }
        // In libtest's words, one test per seed, so that scripts/test counts the seeds in its
        // summary like every other test.
        println!(
            "test result: {}. {} passed; {} failed; 0 ignored; 0 measured; 0 filtered out",
            if failed.is_empty() { "ok" } else { "FAILED" },
            seeds_run - failed.len(),
            failed.len()
        );
        failed
    });
    if !failed.is_empty() {
        for seed in &failed {
            println!("failed: scripts/simulate --seed {seed}");
        }
        std::process::exit(1);
    }
}
