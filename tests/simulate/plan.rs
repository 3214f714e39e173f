//! What a seed decides: the database settings, the fleet's flags, the workload and the fault
//! schedule, all drawn from one small PRNG so that `--seed N` replays the same plan (wall-clock
//! timing of course varies).

use std::fmt;

/// SplitMix64: tiny, and its stream is fixed by this file alone, so a seed means the same plan
/// on every machine and after every dependency update.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.next_u64() as usize % items.len()].clone()
    }
}

/// A setting a DBA can impose with `ALTER DATABASE/ROLE ... SET` (issue 26, item 2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Setting {
    /// Nothing set: the server's defaults.
    Defaults,
    /// `default_transaction_isolation`.
    Isolation(&'static str),
    /// `default_transaction_read_only = on`.
    ReadOnly,
    /// `statement_timeout`, `lock_timeout` or `idle_in_transaction_session_timeout`, in ms.
    Timeout(&'static str, u32),
    /// `search_path` without `public`; the relay names the table `public.outbox` when
    /// `qualified`, plain `outbox` otherwise.
    SearchPathWithoutPublic { qualified: bool },
    /// `search_path = shadow, public` with a migrated `shadow.outbox` (and its claims table)
    /// earlier in it; the relay and the writers use `public.outbox`.
    SearchPathShadowed,
    /// A setting that changes how values read, none the relay should depend on.
    Plain(&'static str, &'static str),
}

impl Setting {
    /// `(name, value)` for `SET`, or `None` for the defaults.
    pub fn assignment(&self) -> Option<(String, String)> {
        let (name, value) = match self {
            Setting::Defaults => return None,
            Setting::Isolation(level) => ("default_transaction_isolation", format!("'{level}'")),
            Setting::ReadOnly => ("default_transaction_read_only", "on".to_string()),
            Setting::Timeout(name, ms) => (*name, format!("'{ms}ms'")),
            Setting::SearchPathWithoutPublic { .. } => ("search_path", "elsewhere".to_string()),
            Setting::SearchPathShadowed => ("search_path", "shadow, public".to_string()),
            Setting::Plain(name, value) => (*name, value.to_string()),
        };
        Some((name.to_string(), value))
    }

    /// The `--table` the relay is given.
    pub fn table(&self) -> &'static str {
        match self {
            Setting::SearchPathWithoutPublic { qualified: false } => "outbox",
            Setting::SearchPathWithoutPublic { qualified: true } | Setting::SearchPathShadowed => {
                "public.outbox"
            }
            _ => "outbox",
        }
    }

    /// The cell this setting covers in a `--minutes` summary.
    pub fn cell(&self) -> String {
        match self {
            Setting::Defaults => "defaults".into(),
            Setting::Isolation(level) => format!("isolation={level}"),
            Setting::ReadOnly => "read_only".into(),
            Setting::Timeout(name, _) => name.to_string(),
            Setting::SearchPathWithoutPublic { qualified } => {
                format!("search_path-public(qualified={qualified})")
            }
            Setting::SearchPathShadowed => "search_path-shadowed".into(),
            Setting::Plain(name, value) => format!("{name}={value}"),
        }
    }
}

fn draw_setting(rng: &mut Rng) -> Setting {
    match rng.range(0, 12) {
        0 | 1 => Setting::Defaults,
        2 => Setting::Isolation(rng.pick(&["repeatable read", "serializable"])),
        3 => Setting::ReadOnly,
        4 => Setting::Timeout(
            rng.pick(&[
                "statement_timeout",
                "lock_timeout",
                "idle_in_transaction_session_timeout",
            ]),
            rng.range(50, 200) as u32,
        ),
        5 => Setting::SearchPathWithoutPublic {
            qualified: rng.chance(60),
        },
        6 => Setting::SearchPathShadowed,
        7 => {
            let (name, value) = rng.pick(&[
                ("TimeZone", "'Pacific/Chatham'"),
                ("DateStyle", "'SQL, DMY'"),
                ("IntervalStyle", "'postgres_verbose'"),
            ]);
            Setting::Plain(name, value)
        }
        8 => Setting::Plain("extra_float_digits", rng.pick(&["-15", "0", "3"])),
        9 => Setting::Plain("bytea_output", "escape"),
        10 => Setting::Plain("session_replication_role", "replica"),
        11 => Setting::Plain(
            "client_encoding",
            rng.pick(&["LATIN1", "SQL_ASCII", "EUC_JP"]),
        ),
        _ => Setting::Isolation("repeatable read"),
    }
}

/// Where the setting is imposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// `ALTER DATABASE db SET`.
    Database,
    /// `ALTER ROLE postgres IN DATABASE db SET` (the relay's role, in this seed's database only).
    Role,
}

/// The default destination and what rides beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dest {
    Standard,
    Fifo,
    /// A FIFO SNS topic with a FIFO queue subscribed (raw delivery).
    SnsFifo,
    /// A standard default queue and `--route a1=<another standard queue>`.
    Routed,
}

impl Dest {
    pub fn fifo(self) -> bool {
        matches!(self, Dest::Fifo | Dest::SnsFifo)
    }
}

#[derive(Clone, Debug)]
pub struct Fleet {
    pub relays: usize,
    pub dest: Dest,
    /// `--ordered on` on a standard destination (FIFO ones are ordered by `auto`).
    pub ordered_standard: bool,
    /// `--fair-by aggregate_type`.
    pub fair: bool,
    /// `--on-poison skip` (else `block`).
    pub skip_poison: bool,
    /// Relay 0 runs the other `--on-poison`: a fleet halfway through a rolling change of the
    /// flag. Its skipping claims take rows behind a quarantined row that the others' parking
    /// wants, which is where a parking pass and a claim can meet on one row (issue 26, defect 6).
    pub mixed_poison: bool,
    /// `--order-by transaction` (the table then migrated for it).
    pub order_by_transaction: bool,
    pub batch_size: u32,
    /// `--max-delay`, the latency budget.
    pub max_delay_ms: u32,
    /// `--delete-on-ack`, else `--retention 1h`.
    pub delete_on_ack: bool,
    pub max_in_flight: u32,
    pub lease_ms: u64,
    pub max_attempts: u32,
    /// `--sweep-interval`: how long a row that committed late below a relay's floor may wait
    /// for the sweep that finds it. [`DEFAULT_SWEEP_MS`] leaves the flag out.
    pub sweep_ms: u64,
}

impl Fleet {
    /// Some relay runs `--on-poison block`: a row may be quarantined `blocked`.
    pub fn some_block(&self) -> bool {
        self.ordered() && (!self.skip_poison || self.mixed_poison)
    }

    /// Every relay runs `--on-poison block`: nothing behind a poisoned row is delivered.
    pub fn all_block(&self) -> bool {
        self.ordered() && !self.skip_poison && !self.mixed_poison
    }

    /// `--db-timeout`: the `--settle-margin` it defaults to, a quarter of the lease.
    pub fn db_timeout_ms(&self) -> u64 {
        self.lease_ms / 4
    }

    pub fn ordered(&self) -> bool {
        self.dest.fifo() || self.ordered_standard
    }
}

/// The relay's own `--sweep-interval` (10 s): a fleet drawn with it passes no flag.
pub const DEFAULT_SWEEP_MS: u64 = 10_000;

/// Too large for `--max-payload-bytes`.
pub const MAX_PAYLOAD_BYTES: usize = 2048;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poison {
    /// A payload over `--max-payload-bytes`: `too_large`.
    Oversized,
    /// A header named like an attribute the relay sets itself: `invalid`.
    Invalid,
    /// Headers that are not a JSON object: unreadable, quarantined `invalid`.
    Unreadable,
}

impl Poison {
    /// The reason the row is quarantined with, its true one.
    pub fn reason(self) -> &'static str {
        match self {
            Poison::Oversized => "too_large",
            Poison::Invalid | Poison::Unreadable => "invalid",
        }
    }
}

/// One row the workload writes.
#[derive(Clone, Debug)]
pub struct RowSpec {
    pub event_id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub poison: Option<Poison>,
}

/// One writer's transaction.
#[derive(Clone, Debug)]
pub struct Txn {
    pub rows: Vec<RowSpec>,
    /// Kept open this long after its inserts (for `--order-by transaction`).
    pub hold_ms: u64,
}

#[derive(Clone, Debug)]
pub struct Workload {
    pub groups: u32,
    /// Per writer, its transactions in order.
    pub writers: Vec<Vec<Txn>>,
    /// How long the writers spread their transactions over.
    pub write_ms: u64,
    /// Each writer's first this many transactions are written before the relays start: a
    /// backlog, where claims meet whole groups at once.
    pub backlog_txns: usize,
    /// Writers whose rows commit late with low ids (issue 36): below the floor a relay has
    /// raised past them by then, where only its sweep finds them.
    pub late: Vec<LateWriter>,
}

impl Workload {
    pub fn rows(&self) -> usize {
        self.writers.iter().flatten().map(|t| t.rows.len()).sum()
    }

    /// Every row any writer inserts, late ones and ones that never commit included.
    pub fn specs(&self) -> impl Iterator<Item = &RowSpec> {
        self.writers
            .iter()
            .flatten()
            .flat_map(|t| &t.rows)
            .chain(self.late.iter().flat_map(|w| w.what.rows()))
    }

    /// A late writer holds ids a session cached from the sequence: the outbox's identity is
    /// given `CACHE 50` before anything is written.
    pub fn cached_ids(&self) -> bool {
        self.late
            .iter()
            .any(|w| matches!(w.what, Late::Cached { .. }))
    }
}

/// How a late writer's rows come to commit with ids below rows sent before them.
#[derive(Clone, Debug)]
pub enum Late {
    /// One transaction inserts `rows` and stays open across many claims, then commits, or
    /// rolls back (its rows never exist).
    Long { rows: Vec<RowSpec>, commit: bool },
    /// `rows` inserted under a savepoint released at once, the transaction committed long
    /// after; `discarded` inserted under a second savepoint rolled back to (never exist).
    Savepoint {
        rows: Vec<RowSpec>,
        discarded: Vec<RowSpec>,
    },
    /// A prepared (two-phase) transaction: `PREPARE TRANSACTION` at once, `COMMIT PREPARED`
    /// (or `ROLLBACK PREPARED`) at the end, from another session.
    Prepared { rows: Vec<RowSpec>, commit: bool },
    /// One long-lived session inserts each batch in a transaction of its own, spread over
    /// the writer's time: with the sequence's `CACHE 50` its ids come from a block it took
    /// at its first insert, below the blocks other sessions took since.
    Cached { inserts: Vec<Vec<RowSpec>> },
}

impl Late {
    /// Every row it inserts, committed or not.
    pub fn rows(&self) -> Vec<&RowSpec> {
        match self {
            Late::Long { rows, .. } | Late::Prepared { rows, .. } => rows.iter().collect(),
            Late::Savepoint { rows, discarded } => rows.iter().chain(discarded).collect(),
            Late::Cached { inserts } => inserts.iter().flatten().collect(),
        }
    }
}

/// A late writer, from `at_ms` after the relays started, for `ms`.
#[derive(Clone, Debug)]
pub struct LateWriter {
    pub at_ms: u64,
    pub ms: u64,
    pub what: Late,
}

/// What holds the vacuum horizon back (issue 36): no settled row deleted after it began can
/// be removed, nor its index entries marked dead, until it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class;` kept open:
    /// what `pg_dump` does (read-only, no xid).
    Snapshot,
    /// A transaction that wrote to a table of its own (`sim.scratch`) and stays open.
    IdleWriter,
    /// The same write, prepared (`PREPARE TRANSACTION`) and committed or rolled back at the end.
    Prepared { commit: bool },
}

/// A horizon held from `at_ms` after the relays started, for `ms`.
#[derive(Clone, Copy, Debug)]
pub struct Held {
    pub at_ms: u64,
    pub ms: u64,
    pub what: Hold,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SqsFault {
    Error500,
    Throttle,
    /// Answers delayed this long (below `--send-timeout`, so no answer is lost).
    Slow(u64),
    /// The last accepted entry of each batch reported failed (it was enqueued): a copy.
    PartialFailure,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `kill -9` of relay `relay`, started again (under a new relay id) `down_ms` later.
    Kill { relay: usize, down_ms: u64 },
    /// SIGSTOP of relay `relay` for `ms` (longer than the lease), then SIGCONT.
    Stop { relay: usize, ms: u64 },
    /// PostgreSQL restarted (fast shutdown, or immediate like a crash).
    PgRestart { immediate: bool },
    /// Relay `relay`'s open database connections go dark (nothing forwarded, no FIN/RST).
    Dark { relay: usize },
    /// Every round trip of relay `relay` to the database gets `delay_ms` more, for `ms`.
    SlowDb {
        relay: usize,
        delay_ms: u64,
        ms: u64,
    },
    /// Every answer of the database to relay `relay` arrives `delay_ms` late, for `ms`: its
    /// statements run and commit at once, the relay learns it past the margin it keeps before
    /// a claim's deadline (issue 37: a claim the relay gave up on that committed).
    SlowAnswers {
        relay: usize,
        delay_ms: u64,
        ms: u64,
    },
    /// Every claim takes `sleep_ms` longer in the server (below `--db-timeout`, so one claim
    /// alone keeps its deadline; one that waited for another's lock does not), for `ms`.
    SlowClaims { sleep_ms: u64, ms: u64 },
    /// The SQS/SNS endpoint misbehaves for `ms`.
    Sqs { fault: SqsFault, ms: u64 },
}

impl Fault {
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Kill { .. } => "kill-9",
            Fault::Stop { .. } => "sigstop",
            Fault::PgRestart { .. } => "pg-restart",
            Fault::Dark { .. } => "dark-db",
            Fault::SlowDb { .. } => "slow-db",
            Fault::SlowAnswers { .. } => "slow-answers",
            Fault::SlowClaims { .. } => "slow-claims",
            Fault::Sqs {
                fault: SqsFault::Error500,
                ..
            } => "sqs-5xx",
            Fault::Sqs {
                fault: SqsFault::Throttle,
                ..
            } => "sqs-throttle",
            Fault::Sqs {
                fault: SqsFault::Slow(_),
                ..
            } => "sqs-slow",
            Fault::Sqs {
                fault: SqsFault::PartialFailure,
                ..
            } => "sqs-partial-failure",
        }
    }
}

/// What the application's side may do to the relay's table or to its start (issue 37).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hazard {
    /// At `at_ms`, the owner makes the relay's settlements change nothing: a `BEFORE` row
    /// trigger returning NULL, or (`rule`) a `DO INSTEAD NOTHING` rule, on the statement that
    /// settles (DELETE under delete-on-ack, UPDATE under retention). The relays must name it,
    /// stop claiming, and send each event at most twice more per relay (once as a rule).
    KeepRows { at_ms: u64, rule: bool },
    /// The database is down when the relays start and comes up `down_ms` later: they wait
    /// for it, none exits.
    EarlyStart { down_ms: u64 },
    /// The relays run as a role of their own (sql/roles.sql); at `at_ms` the owner turns on
    /// row-level security with a tenant policy that hides every row from that role, and
    /// (`relay_policy`) the relay's own `FOR ALL ... USING (true)` policy beside it. Without
    /// it the relays must say that they cannot see the backlog and stop; with it, deliver.
    RowSecurity { at_ms: u64, relay_policy: bool },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `outbox-relay replay --since 1h` while relays run.
    Replay,
    /// `outbox-relay quarantine retry --all` while relays run.
    QuarantineRetry,
}

/// Something that happens `at_ms` after the relays started.
#[derive(Clone, Copy, Debug)]
pub struct Timed<T> {
    pub at_ms: u64,
    pub what: T,
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub seed: u64,
    /// How many combinations the relay refused before this one (each refusal re-draws).
    pub redraw: u32,
    pub setting: Setting,
    pub scope: Scope,
    /// PgBouncer in transaction pooling with this pool size, no `--pooler` flag.
    pub pool: Option<u32>,
    pub fleet: Fleet,
    pub workload: Workload,
    pub faults: Vec<Timed<Fault>>,
    pub ops: Vec<Timed<Op>>,
    /// Horizons held for part of the run.
    pub horizon: Vec<Held>,
    pub hazard: Option<Hazard>,
}

impl Plan {
    /// The plan of `seed` after `redraw` refused combinations: the same arguments always give
    /// the same plan. Changing what is drawn here, or in which order, changes the plan of every
    /// seed: the CI seeds (main.rs) must then be chosen again, each shown to catch its defect.
    pub fn draw(seed: u64, redraw: u32) -> Plan {
        let mut rng =
            Rng::new(seed ^ (u64::from(redraw) << 56).wrapping_mul(0x2545_F491_4F6C_DD1D));
        let setting = draw_setting(&mut rng);
        let scope = if rng.chance(50) {
            Scope::Database
        } else {
            Scope::Role
        };
        let pool = rng.chance(25).then(|| rng.range(1, 3) as u32);
        let dest = rng.pick(&[
            Dest::Standard,
            Dest::Standard,
            Dest::Fifo,
            Dest::SnsFifo,
            Dest::Routed,
        ]);
        let mut fleet = Fleet {
            relays: rng.range(1, 4) as usize,
            dest,
            ordered_standard: rng.chance(35),
            fair: rng.chance(35),
            skip_poison: rng.chance(50),
            mixed_poison: false,
            order_by_transaction: rng.chance(25),
            batch_size: rng.pick(&[1, 3, 10, 25, 100]),
            max_delay_ms: rng.pick(&[0, 5, 20]),
            delete_on_ack: rng.chance(40),
            max_in_flight: rng.pick(&[1, 4, 32]),
            lease_ms: rng.range(1, 3) * 1000,
            max_attempts: rng.range(4, 10) as u32,
            sweep_ms: DEFAULT_SWEEP_MS,
        };
        let workload = draw_workload(&mut rng, &fleet);
        let faulty = rng.chance(65);
        let mut faults = Vec::new();
        if faulty {
            for _ in 0..rng.range(1, 4) {
                let relay = rng.range(0, fleet.relays as u64 - 1) as usize;
                let what = match rng.range(0, 8) {
                    0 | 1 => Fault::Kill {
                        relay,
                        down_ms: rng.range(0, 1500),
                    },
                    2 => Fault::Stop {
                        relay,
                        ms: fleet.lease_ms + rng.range(200, 1500),
                    },
                    3 => Fault::PgRestart {
                        immediate: rng.chance(50),
                    },
                    4 => Fault::Dark { relay },
                    5 => Fault::SlowDb {
                        relay,
                        delay_ms: rng.range(100, 400),
                        ms: rng.range(1000, 4000),
                    },
                    6 => Fault::SlowClaims {
                        sleep_ms: fleet.db_timeout_ms() * rng.range(55, 90) / 100,
                        ms: rng.range(1500, 4000),
                    },
                    _ => {
                        let slow = rng.range(100, 300);
                        Fault::Sqs {
                            fault: rng.pick(&[
                                SqsFault::Error500,
                                SqsFault::Throttle,
                                SqsFault::Slow(slow),
                                SqsFault::PartialFailure,
                            ]),
                            ms: rng.range(300, 2000),
                        }
                    }
                };
                // Claims are slow only while there are rows to claim: during the writes.
                let at_ms = match what {
                    Fault::SlowClaims { .. } => rng.range(200, workload.write_ms / 2),
                    _ => rng.range(300, workload.write_ms + 2000),
                };
                faults.push(Timed { at_ms, what });
            }
            faults.sort_by_key(|f| f.at_ms);
        }
        let mut ops = Vec::new();
        for _ in 0..rng.range(0, 3) {
            ops.push(Timed {
                at_ms: rng.range(500, workload.write_ms + 2000),
                what: rng.pick(&[Op::Replay, Op::QuarantineRetry, Op::QuarantineRetry]),
            });
        }
        ops.sort_by_key(|o| o.at_ms);
        // Drawn last, so that it changes no earlier draw: the plans of the seeds chosen before
        // it came are the same but for this.
        fleet.mixed_poison = fleet.ordered() && fleet.relays > 1 && rng.chance(30);
        // Issue 36, drawn after everything else for the same reason.
        let mut workload = workload;
        let horizon = draw_horizon(&mut rng, workload.write_ms);
        workload.late = draw_late(&mut rng, workload.write_ms);
        fleet.sweep_ms = rng.pick(&[1000, 2000, 3000, DEFAULT_SWEEP_MS]);
        // Issue 37, drawn after everything else for the same reason. A rule (and row-level
        // security that hides the rows) is seen at start, so a relay started again after it (a
        // kill -9's restart) refuses: those only where no relay is restarted.
        let restarts = faults.iter().any(|f| matches!(f.what, Fault::Kill { .. }));
        let hazard = match rng.range(0, 9) {
            0 | 1 => Some(Hazard::KeepRows {
                at_ms: rng.range(0, workload.write_ms),
                rule: !restarts && rng.chance(50),
            }),
            2 => Some(Hazard::EarlyStart {
                down_ms: rng.range(500, 3000),
            }),
            // A role of the relays' own: not behind PgBouncer (whose users file knows the
            // superuser only), and only beside settings that reach that role as they would the
            // superuser (on the database) and that a plain role may have.
            3 if pool.is_none()
                && (setting == Setting::Defaults
                    || (scope == Scope::Database
                        && matches!(setting, Setting::Isolation(_) | Setting::Timeout(..)))) =>
            {
                // Hiding the rows is, like a rule, refused at start: only where no relay is
                // started again.
                Some(Hazard::RowSecurity {
                    at_ms: rng.range(0, workload.write_ms),
                    relay_policy: restarts || rng.chance(50),
                })
            }
            _ => None,
        };
        // Issue 37's slow answers, drawn after everything else for the same reason: answers
        // late by a quarter to nine tenths of `--db-timeout`, so that some claims commit and
        // the relay has given up on them (the margin is a quarter).
        if rng.chance(20) {
            let relay = rng.range(0, fleet.relays as u64 - 1) as usize;
            faults.push(Timed {
                at_ms: rng.range(200, workload.write_ms + 1000),
                what: Fault::SlowAnswers {
                    relay,
                    delay_ms: fleet.db_timeout_ms() * rng.range(25, 90) / 100,
                    ms: rng.range(1000, 3000),
                },
            });
            faults.sort_by_key(|f| f.at_ms);
        }
        Plan {
            seed,
            redraw,
            setting,
            scope,
            pool,
            fleet,
            workload,
            faults,
            ops,
            horizon,
            hazard,
        }
    }

    /// The seed makes the relays' settlements change nothing at some point.
    pub fn keeps_rows(&self) -> bool {
        matches!(self.hazard, Some(Hazard::KeepRows { .. }))
    }

    /// The seed hides the rows from the relays' role at some point.
    pub fn hides_rows(&self) -> bool {
        matches!(
            self.hazard,
            Some(Hazard::RowSecurity {
                relay_policy: false,
                ..
            })
        )
    }

    /// The settings cell of this plan in a `--minutes` summary.
    pub fn cell(&self) -> String {
        format!(
            "{} on {:?}{}",
            self.setting.cell(),
            self.scope,
            if self.pool.is_some() {
                " via pgbouncer"
            } else {
                ""
            }
        )
    }

    /// The `run` flags of relay `relay` besides the connection, destination and relay id.
    pub fn run_flags(&self, relay: usize) -> Vec<String> {
        let f = &self.fleet;
        let skip_poison = f.skip_poison != (f.mixed_poison && relay == 0);
        let lease = f.lease_ms;
        // A send, its settlement and a round trip must fit in the lease: the send gets a third,
        // the margin kept for the settlement (and so `--db-timeout`) a quarter.
        let mut flags: Vec<String> = [
            "--lease".into(),
            format!("{lease}ms"),
            "--send-timeout".into(),
            format!("{}ms", lease / 3),
            "--settle-margin".into(),
            format!("{}ms", f.db_timeout_ms()),
            "--batch-size".into(),
            f.batch_size.to_string(),
            "--max-delay".into(),
            format!("{}ms", f.max_delay_ms),
            "--max-in-flight".into(),
            f.max_in_flight.to_string(),
            "--max-attempts".into(),
            f.max_attempts.to_string(),
            "--max-payload-bytes".into(),
            MAX_PAYLOAD_BYTES.to_string(),
            "--poll-interval".into(),
            "100ms".into(),
            "--stats-interval".into(),
            "500ms".into(),
            "--retry-base".into(),
            "100ms".into(),
            "--retry-max".into(),
            "500ms".into(),
            "--db-retry-max".into(),
            "300ms".into(),
            "--retention-interval".into(),
            "1s".into(),
            "--drain-timeout".into(),
            "2s".into(),
        ]
        .into();
        if f.delete_on_ack {
            flags.push("--delete-on-ack".into());
        } else {
            flags.extend(["--retention".into(), "1h".into()]);
        }
        if f.ordered_standard && !f.dest.fifo() {
            flags.extend(["--ordered".into(), "on".into()]);
        }
        if f.ordered() {
            flags.extend([
                "--on-poison".into(),
                if skip_poison { "skip" } else { "block" }.into(),
            ]);
        }
        if f.fair {
            flags.extend(["--fair-by".into(), "aggregate_type".into()]);
        }
        if f.order_by_transaction {
            flags.extend(["--order-by".into(), "transaction".into()]);
        }
        if f.sweep_ms != DEFAULT_SWEEP_MS {
            flags.extend(["--sweep-interval".into(), format!("{}ms", f.sweep_ms)]);
        }
        flags
    }
}

fn draw_workload(rng: &mut Rng, fleet: &Fleet) -> Workload {
    // Log-uniform over 1..=1000: one group, a handful, or nearly a group per row.
    let groups = [1, 2, 5, 20, 100, 1000][rng.range(0, 5) as usize].min(rng.range(1, 1000)) as u32;
    let groups = groups.max(1);
    let rows = rng.range(40, 400) as usize;
    let writers = rng.range(1, 3) as usize;
    let poison_percent = rng.pick(&[0, 2, 5, 10]);
    let hold_open = fleet.order_by_transaction || rng.chance(20);
    let types = rng.range(1, 4);
    // Under `--order-by id` a group's transactions must be serialised by its writers (the
    // documented caveat, docs/ordering.md): each group belongs to one writer. Under
    // `--order-by transaction` writers share groups, which is what that order is for.
    let shared_groups = fleet.order_by_transaction;
    let mut per_writer: Vec<Vec<RowSpec>> = vec![Vec::new(); writers];
    for n in 0..rows {
        let group = rng.range(0, u64::from(groups) - 1);
        let writer = if shared_groups {
            rng.range(0, writers as u64 - 1) as usize
        } else {
            (group % writers as u64) as usize
        };
        let poison = rng.chance(poison_percent).then(|| {
            rng.pick(&[
                Poison::Oversized,
                Poison::Oversized,
                Poison::Invalid,
                Poison::Unreadable,
            ])
        });
        per_writer[writer].push(RowSpec {
            event_id: format!("ev-{n}"),
            aggregate_type: format!("a{}", group % types),
            aggregate_id: format!("g{group}"),
            poison,
        });
    }
    let max_txn = rng.pick(&[1, 1, 3, 8]);
    let writers = per_writer
        .into_iter()
        .map(|rows| {
            let mut txns = Vec::new();
            let mut rest = rows.as_slice();
            while !rest.is_empty() {
                let take = (rng.range(1, max_txn) as usize).min(rest.len());
                let hold_ms = if hold_open && rng.chance(15) {
                    rng.range(100, 800)
                } else {
                    0
                };
                txns.push(Txn {
                    rows: rest[..take].to_vec(),
                    hold_ms,
                });
                rest = &rest[take..];
            }
            txns
        })
        .collect();
    let write_ms = rng.range(1500, 5000);
    let backlog_txns = if rng.chance(40) {
        rng.range(5, 60) as usize
    } else {
        0
    };
    Workload {
        groups,
        writers,
        write_ms,
        backlog_txns,
        late: Vec::new(),
    }
}

/// A third of the seeds hold the horizon once or twice, each for between half the writers'
/// time and two seconds past it, starting in the first half.
fn draw_horizon(rng: &mut Rng, write_ms: u64) -> Vec<Held> {
    if !rng.chance(35) {
        return Vec::new();
    }
    (0..rng.range(1, 2))
        .map(|_| Held {
            at_ms: rng.range(0, write_ms / 2),
            ms: rng.range(write_ms / 2, write_ms + 2000),
            what: match rng.range(0, 3) {
                0 | 1 => Hold::Snapshot,
                2 => Hold::IdleWriter,
                _ => Hold::Prepared {
                    commit: rng.chance(50),
                },
            },
        })
        .collect()
}

/// A third of the seeds get one to three late writers, each starting in the first third of
/// the writers' time and committing between half of it and two seconds past it: across many
/// claims, and (the writers going on meanwhile) after the relays' floors passed their ids.
/// Each writes a group of its own (`late<k>`): rows of one group written by two sessions
/// would be ordered by id, which is insert order, not commit order (docs/ordering.md).
fn draw_late(rng: &mut Rng, write_ms: u64) -> Vec<LateWriter> {
    if !rng.chance(35) {
        return Vec::new();
    }
    (0..rng.range(1, 3))
        .map(|k| {
            let mut n = 0;
            let mut rows = |rng: &mut Rng, kept: bool, lo: u64, hi: u64| -> Vec<RowSpec> {
                (0..rng.range(lo, hi))
                    .map(|_| {
                        n += 1;
                        RowSpec {
                            // Rows that never commit are named apart: one received is a row
                            // the relay read uncommitted, or made up.
                            event_id: format!("{}-{k}-{n}", if kept { "late" } else { "void" }),
                            aggregate_type: format!("a{}", k % 2),
                            aggregate_id: format!("late{k}"),
                            poison: None,
                        }
                    })
                    .collect()
            };
            let what = match rng.range(0, 3) {
                0 => {
                    let commit = rng.chance(75);
                    Late::Long {
                        rows: rows(rng, commit, 1, 4),
                        commit,
                    }
                }
                1 => {
                    let kept = rows(rng, true, 1, 3);
                    let discarded = if rng.chance(50) {
                        rows(rng, false, 1, 2)
                    } else {
                        Vec::new()
                    };
                    Late::Savepoint {
                        rows: kept,
                        discarded,
                    }
                }
                2 => {
                    let commit = rng.chance(75);
                    Late::Prepared {
                        rows: rows(rng, commit, 1, 3),
                        commit,
                    }
                }
                _ => Late::Cached {
                    inserts: (0..rng.range(3, 8))
                        .map(|_| rows(rng, true, 1, 2))
                        .collect(),
                },
            };
            LateWriter {
                at_ms: rng.range(0, write_ms / 3),
                ms: rng.range(write_ms / 2, write_ms + 2000),
                what,
            }
        })
        .collect()
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fl = &self.fleet;
        write!(
            f,
            "seed {} draw {}: {} | {} relays, {:?}{}{}{}{}, batch {}, lease {}ms, {} | {} rows ({} poison, backlog {}) in {} groups, {} writers | faults: {} | ops: {} | horizon: {} | late: {} | sweep {} | hazard: {}",
            self.seed,
            self.redraw,
            self.cell(),
            fl.relays,
            fl.dest,
            if fl.ordered() { ", ordered" } else { "" },
            match (fl.ordered(), fl.skip_poison, fl.mixed_poison) {
                (false, _, _) => "",
                (true, _, true) => " skip+block",
                (true, true, false) => " skip",
                (true, false, false) => " block",
            },
            if fl.fair { ", fair-by" } else { "" },
            if fl.order_by_transaction { ", order-by transaction" } else { "" },
            fl.batch_size,
            fl.lease_ms,
            if fl.delete_on_ack { "delete-on-ack" } else { "retention 1h" },
            self.workload.rows(),
            self.workload
                .writers
                .iter()
                .flatten()
                .flat_map(|t| &t.rows)
                .filter(|r| r.poison.is_some())
                .count(),
            self.workload.backlog_txns,
            self.workload.groups,
            self.workload.writers.len(),
            self.faults
                .iter()
                .map(|t| format!("{:?}@{}ms", t.what, t.at_ms))
                .collect::<Vec<_>>()
                .join(", "),
            self.ops
                .iter()
                .map(|t| format!("{:?}@{}ms", t.what, t.at_ms))
                .collect::<Vec<_>>()
                .join(", "),
            self.horizon
                .iter()
                .map(|h| format!("{:?}@{}ms+{}ms", h.what, h.at_ms, h.ms))
                .collect::<Vec<_>>()
                .join(", "),
            self.workload
                .late
                .iter()
                .map(|w| format!("{}@{}ms+{}ms", w.what, w.at_ms, w.ms))
                .collect::<Vec<_>>()
                .join(", "),
            if fl.sweep_ms == DEFAULT_SWEEP_MS {
                "default".to_string()
            } else {
                format!("{}ms", fl.sweep_ms)
            },
            match self.hazard {
                None => String::new(),
                Some(Hazard::KeepRows { at_ms, rule }) => format!(
                    "settlements kept by a {}@{at_ms}ms",
                    if rule { "rule" } else { "trigger" }
                ),
                Some(Hazard::EarlyStart { down_ms }) => {
                    format!("relays start {down_ms}ms before the database")
                }
                Some(Hazard::RowSecurity {
                    at_ms,
                    relay_policy,
                }) => format!(
                    "row-level security{}@{at_ms}ms",
                    if relay_policy {
                        " with the relay's policy"
                    } else {
                        " hiding the rows"
                    }
                ),
            },
        )
    }
}

impl fmt::Display for Late {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ending = |commit: bool| if commit { "commit" } else { "rollback" };
        match self {
            Late::Long { rows, commit } => {
                write!(f, "Long({} rows, {})", rows.len(), ending(*commit))
            }
            Late::Savepoint { rows, discarded } => {
                write!(
                    f,
                    "Savepoint({} rows, {} rolled back to)",
                    rows.len(),
                    discarded.len()
                )
            }
            Late::Prepared { rows, commit } => {
                write!(f, "Prepared({} rows, {})", rows.len(), ending(*commit))
            }
            Late::Cached { inserts } => write!(f, "Cached({} inserts)", inserts.len()),
        }
    }
}
