//! Running one plan against the real things: a fresh database on the simulation's own cluster,
//! queues of its own, PgBouncer when the plan pools, a TCP proxy per relay (dark and slow
//! links), one HTTP fault proxy in front of the SQS/SNS server, the relays as child processes,
//! the writers, the fault schedule and the operator's commands. It gathers the evidence the
//! checker reads; it judges nothing itself.

mod faults;
mod horizon;
mod observe;
mod signal;
mod workload;

use faults::{inject, Marks};
use observe::{quiet_point, sample_pool, settled};
pub use signal::{Reading, Sample};
use workload::write;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::MessageSystemAttributeName;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

use crate::history::{self, Change, FinalRow};
use crate::plan::{
    Dest, Fault, Hazard, Op, Plan, Poison, Scope, Setting, SqsFault, Timed, MAX_PAYLOAD_BYTES,
};
use crate::support::pg::PrivatePg;
use crate::support::scenario::{self, args};
use crate::support::{
    create_queue, create_topic, receive_all, run_to_end, sqs, subscribe_queue, FaultProxy, Mode,
    PgBouncer, PoolMode, Pooling, RelayProcess, TcpProxy,
};

/// How long a relay may take to refuse its configuration (exit non-zero) before it counts as
/// started.
const START_WINDOW: Duration = Duration::from_secs(3);
/// What a relay says when its settlements change nothing (src/relay/deliver.rs).
const UNDONE: &str = "change nothing";
/// What a relay says when row-level security hides rows from its role (src/outbox/error.rs).
const HIDDEN: &str = "no policy lets it see and settle every row";
/// How long the fleet gets, after the writers and faults are done, to leave no row unsent.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(40);

/// A message as a consumer received it.
#[derive(Clone, Debug)]
pub struct Received {
    /// The queue it was received from.
    pub queue: String,
    pub event_id: Option<String>,
    pub aggregate_id: Option<String>,
    pub group_id: Option<String>,
    pub body: String,
}

/// What the relays and the table said at a quiet point (nothing unsent, relays running).
#[derive(Clone, Debug, Default)]
pub struct Quiet {
    /// From the table right after `status` ran: unsent rows, parked ones included, and the
    /// oldest one's age.
    pub table_unsent: i64,
    pub table_age: f64,
    /// The same, right after the last scrape of the gauges.
    pub gauge_table_unsent: i64,
    pub gauge_table_age: f64,
    /// `status --json`, and its last line when it failed.
    pub status_unsent: Option<i64>,
    pub status_error: Option<String>,
    pub status_age: Option<f64>,
    /// A relay's `/metrics`, the last sample taken.
    pub gauge_unsent: Option<f64>,
    pub gauge_age: Option<f64>,
}

impl Quiet {
    /// How far the age gauge may be from the table's: the gauges refresh every 500 ms.
    pub const GAUGE_AGE_SLACK: f64 = 2.0;

    /// The last sample of the gauges agrees with the table read right after it.
    pub fn gauges_agree(&self) -> bool {
        self.gauge_unsent == Some(self.gauge_table_unsent as f64)
            && self
                .gauge_age
                .is_some_and(|a| (a - self.gauge_table_age).abs() <= Self::GAUGE_AGE_SLACK)
    }
}

/// Everything the checker reads.
#[derive(Default)]
pub struct Evidence {
    pub changes: Vec<Change>,
    pub rows: Vec<FinalRow>,
    pub received: Vec<Received>,
    /// The queue each row's messages must reach, by aggregate type (`None`: the default).
    pub routes: HashMap<String, String>,
    pub default_queue: String,
    /// Poison rows by event id.
    pub poison: HashMap<String, Poison>,
    /// Relay ids that were killed, stopped, cut off (a dark or slow link) or lost the database
    /// to a restart while they ran: their claims may be taken over, and their rows sent twice.
    pub faulted_hard: HashSet<String>,
    /// Relay ids whose answers from SQS were slowed or partly failed: their rows may be sent
    /// twice (an acknowledgement lost between send and mark).
    pub faulted_soft: HashSet<String>,
    /// Kinds of fault injected, in order.
    pub injected: Vec<&'static str>,
    /// Readings of an application session through the pool that differ from the server's
    /// defaults.
    pub pool_leaks: Vec<String>,
    pub quiet: Option<Quiet>,
    /// Whether the table was settled (nothing unsent, no live claim) before the drain.
    pub settled: bool,
    /// SQS 5xx or failed entries were injected: a row may spend its attempts on them.
    pub sqs_errors: bool,
    /// Exit status and last line of each relay that stopped on its own.
    pub exits: Vec<String>,
    /// With late writers: their rows that committed, and how many of those committed below
    /// an id already sent then (where a relay's floor had likely passed them: its sweep's
    /// work). Said, not judged.
    pub late_rows: Option<(i64, i64)>,
    /// Relay processes started in all (restarts after kill -9 included).
    pub relays_run: usize,
    /// Relays that exited at start-up and were started again, with their last line.
    pub startup_exits: Vec<String>,
    /// Some relay said that its settlements change nothing (issue 37), and named this.
    pub undone_named: Option<String>,
    /// Some relay said that row-level security hides rows from its role, and this.
    pub hidden_named: Option<String>,
    /// The relays that said so: each stopped claiming, leaving a claim the server refused to
    /// settle to be taken over when its lease ends, as a stopped relay's is.
    pub undone_by: HashSet<String>,
    /// The age signal, sampled while the relays ran (faults included) until the table settled.
    pub signal: Vec<Sample>,
    /// When the server was killed (immediate shutdown, a crash), seconds since the epoch: the
    /// relay's last asynchronous commits may be lost with it.
    pub crashes: Vec<f64>,
}

pub enum Run {
    /// A relay exited non-zero at start; `setting_caused` when the same flags start straight
    /// to the database (no pool) and without the seed's setting.
    Refused {
        line: String,
        /// How many lines of its output say `error` (a refusal is one line).
        error_lines: usize,
        setting_caused: bool,
    },
    Ran(Box<Evidence>),
}

/// A connection of the simulation's own, on the server's settings the seed did not change:
/// writers and the checker must see the table as it is, whatever the role was given.
pub async fn own_session(url: &str) -> Option<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.ok()?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
        .batch_execute(
            "SET default_transaction_isolation = 'read committed'; \
             SET default_transaction_read_only = off; SET statement_timeout = 0; \
             SET lock_timeout = 0; SET idle_in_transaction_session_timeout = 0; \
             SET search_path = public; SET session_replication_role = origin",
        )
        .await
        .ok()?;
    Some(client)
}

async fn own_session_retrying(url: &str, deadline: Instant) -> Option<Client> {
    loop {
        if let Some(c) = own_session(url).await {
            return Some(c);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a session gets in at `url` and answers: nothing is set on it, since behind
/// PgBouncer a session's settings would stay on the server connection for the relays.
async fn reaches(url: &str) -> bool {
    let Ok((client, connection)) = tokio_postgres::connect(url, NoTls).await else {
        return false;
    };
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client.simple_query("SELECT 1").await.is_ok()
}

fn with_app(url: &str, app: &str) -> String {
    format!("{url}?application_name={app}")
}

/// The fleet: relay processes, each behind its own TCP proxy, with the ids they run under.
struct Fleet {
    /// The URL relays reach the database by (PgBouncer's or the cluster's), before its proxy.
    url: String,
    /// Each relay's `run` flags besides the URL and the relay id.
    flags: Vec<Vec<String>>,
    proxies: Vec<TcpProxy>,
    slots: Vec<Option<RelayProcess>>,
    /// The id relay `i` runs under now; a restart gets a new one (`r<i>.<incarnation>`).
    ids: Vec<String>,
    incarnations: Vec<u32>,
}

/// The id relay `i` runs under in its `incarnation`-th process (also its application_name).
fn relay_id(i: usize, incarnation: u32) -> String {
    format!("r{i}.{incarnation}")
}

impl Fleet {
    fn spawn(&mut self, i: usize) {
        self.incarnations[i] += 1;
        let id = relay_id(i, self.incarnations[i]);
        let url = with_app(&self.proxies[i].url_through(&self.url), &id);
        let mut a = args(&["run", "--database-url", &url, "--relay-id", &id]);
        a.extend(self.flags[i].iter().cloned());
        self.slots[i] = Some(RelayProcess::spawn_named(&id, &a, &[]));
        self.ids[i] = id;
    }
}

/// The first line of any relay's output containing `needle`.
fn output_line(fleet: &Mutex<Fleet>, needle: &str) -> Option<String> {
    fleet.lock().unwrap().slots.iter().flatten().find_map(|p| {
        p.output()
            .lines()
            .find(|l| l.contains(needle))
            .map(str::to_string)
    })
}

/// What a [`Hazard::KeepRows`] installs: the relay's settling statement (DELETE under
/// delete-on-ack, UPDATE under retention) made to change nothing.
fn keep_rows_sql(plan: &Plan, rule: bool) -> String {
    let event = if plan.fleet.delete_on_ack {
        "DELETE"
    } else {
        "UPDATE"
    };
    if rule {
        format!(
            "CREATE OR REPLACE RULE sim_keep_rows AS ON {event} TO public.outbox DO INSTEAD NOTHING"
        )
    } else {
        format!(
            "CREATE OR REPLACE FUNCTION public.sim_keep_rows() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$; \
             CREATE OR REPLACE TRIGGER sim_keep_rows BEFORE {event} ON public.outbox FOR EACH ROW EXECUTE FUNCTION public.sim_keep_rows()"
        )
    }
}

/// The relays' own role in a [`Hazard::RowSecurity`] seed (and the application's, which
/// sql/roles.sql makes beside it): roles are the cluster's, so named after the seed's database.
fn hazard_roles(db: &str) -> (String, String) {
    (format!("{db}_relay"), format!("{db}_app"))
}

/// What the owner does to the table at the hazard's time: keep the rows the relay settles, or
/// turn on row-level security.
async fn hazard(plan: &Plan, start: Instant, db: &crate::support::TestDb) {
    let (at_ms, sql) = match plan.hazard {
        Some(Hazard::KeepRows { at_ms, rule }) => (at_ms, keep_rows_sql(plan, rule)),
        Some(Hazard::RowSecurity {
            at_ms,
            relay_policy,
        }) => {
            let (relay_role, _) = hazard_roles(&db.name);
            let mut sql = "ALTER TABLE public.outbox ENABLE ROW LEVEL SECURITY; \
                 DROP POLICY IF EXISTS sim_tenant ON public.outbox; \
                 CREATE POLICY sim_tenant ON public.outbox USING (aggregate_type = 'nobody')"
                .to_string();
            if relay_policy {
                sql.push_str(&format!(
                    "; DROP POLICY IF EXISTS sim_relay ON public.outbox; \
                     CREATE POLICY sim_relay ON public.outbox FOR ALL TO {relay_role} \
                     USING (true) WITH CHECK (true)"
                ));
            }
            (at_ms, sql)
        }
        _ => return,
    };
    tokio::time::sleep_until((start + Duration::from_millis(at_ms)).into()).await;
    // A database restart may be under way: tried again on a new session (the statements are
    // idempotent, in case one took effect unanswered).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let session = own_session_retrying(&db.url, deadline)
            .await
            .expect("connect for the hazard");
        match session.batch_execute(&sql).await {
            Ok(()) => return,
            Err(e) if Instant::now() < deadline => {
                println!("  the hazard's statements failed, tried again: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{sql}: {e}"),
        }
    }
}

/// Every relay of the fleet got past its start-up (it may have exited since: that is the
/// checker's to see).
fn all_started(fleet: &Mutex<Fleet>) -> bool {
    fleet.lock().unwrap().slots.iter().all(|s| {
        s.as_ref()
            .is_some_and(|p| p.output().contains("relay started"))
    })
}

/// What an orchestrator does for a container that exits at start-up: started again after a
/// pause. A relay waits for its database at start (a database restarting, PgBouncer's
/// `server_login_retry`) instead of exiting, so every such exit is a violation the checker
/// reports; the restart only lets the run finish. A relay that exits after it started relaying
/// is not restarted: that is the checker's "a relay runs until it is stopped". Runs until
/// `done`.
async fn supervise(
    fleet: &Mutex<Fleet>,
    done: &std::sync::atomic::AtomicBool,
    restarts: &Mutex<Vec<String>>,
) {
    /// The pause before a restart, as an orchestrator's first back-off.
    const RESTART_AFTER: Duration = Duration::from_millis(500);
    while !done.load(std::sync::atomic::Ordering::Relaxed) {
        {
            let mut f = fleet.lock().unwrap();
            for i in 0..f.slots.len() {
                let failed_start = f.slots[i].as_ref().is_some_and(|p| {
                    futures_util::FutureExt::now_or_never(p.wait_exit(Duration::ZERO))
                        .flatten()
                        .is_some_and(|status| !status.success())
                        && !p.output().contains("relay started")
                });
                if failed_start {
                    let p = f.slots[i].take().expect("checked above");
                    restarts.lock().unwrap().push(format!(
                        "{} exited at start-up and was started again: {}",
                        p.name(),
                        last_line(&p.output())
                    ));
                    f.spawn(i);
                }
            }
        }
        tokio::time::sleep(RESTART_AFTER).await;
    }
}

fn setting_sql(plan: &Plan, db: &str, reset: bool) -> Option<String> {
    let (name, value) = plan.setting.assignment()?;
    let target = match plan.scope {
        Scope::Database => format!("DATABASE {db}"),
        Scope::Role => format!("ROLE postgres IN DATABASE {db}"),
    };
    Some(if reset {
        format!("ALTER {target} RESET {name}")
    } else {
        format!("ALTER {target} SET {name} = {value}")
    })
}

async fn operate(timed: Timed<Op>, start: Instant, admin_url: &str, table: &str) {
    tokio::time::sleep_until((start + Duration::from_millis(timed.at_ms)).into()).await;
    let command = match timed.what {
        Op::Replay => args(&["replay", "--since", "1h"]),
        Op::QuarantineRetry => args(&["quarantine", "retry", "--all"]),
    };
    let mut a = command;
    a.extend(args(&["--database-url", admin_url, "--table", table]));
    // Refused or failed commands are part of the history, not the checker's business: under
    // a read-only role, say, `replay` cannot write.
    let _ = run_to_end(&a, &[], Duration::from_secs(60)).await;
}

fn last_line(output: &str) -> String {
    output
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("(no output)")
        .to_string()
}

pub async fn run(plan: &Plan, cluster: &PrivatePg) -> Run {
    let db = cluster.create_db().await;
    let result = run_in(plan, cluster, &db).await;
    // A long `--minutes` run would otherwise fill the disk with finished seeds' databases.
    if let Some(admin) = own_session(&cluster.admin_url()).await {
        horizon::roll_back_left_behind(&admin, &db.name).await;
        let _ = admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", db.name))
            .await;
        if matches!(plan.hazard, Some(Hazard::RowSecurity { .. })) {
            let (relay_role, app_role) = hazard_roles(&db.name);
            let _ = admin
                .batch_execute(&format!("DROP ROLE IF EXISTS {relay_role}, {app_role}"))
                .await;
        }
    }
    result
}

async fn run_in(plan: &Plan, cluster: &PrivatePg, db: &crate::support::TestDb) -> Run {
    let admin = own_session(&db.url)
        .await
        .expect("connect to the seed's database");
    let table = plan.setting.table();
    let mut migrate_flags = Vec::new();
    if plan.fleet.order_by_transaction {
        migrate_flags.extend(args(&["--order-by", "transaction"]));
    }
    if plan.fleet.fair {
        migrate_flags.extend(args(&["--fair-by", "aggregate_type"]));
    }
    for t in std::iter::once("public.outbox")
        .chain((plan.setting == Setting::SearchPathShadowed).then_some("shadow.outbox"))
    {
        if t == "shadow.outbox" {
            admin
                .batch_execute("CREATE SCHEMA shadow")
                .await
                .expect("create schema shadow");
        }
        let mut flags = vec!["--table", t];
        flags.extend(migrate_flags.iter().map(String::as_str));
        scenario::migrate_with(db, &flags).await;
    }
    if matches!(plan.setting, Setting::SearchPathWithoutPublic { .. }) {
        admin
            .batch_execute("CREATE SCHEMA elsewhere")
            .await
            .expect("create schema elsewhere");
    }
    admin
        .batch_execute(&history::install_sql(
            "public.outbox",
            "public.outbox_claims",
        ))
        .await
        .expect("install the trigger log");
    admin
        .batch_execute(horizon::SETUP_SQL)
        .await
        .expect("create sim.scratch");
    if plan.workload.cached_ids() {
        admin
            .batch_execute(horizon::CACHE_SQL)
            .await
            .expect("cache the outbox's ids");
    }

    // Destinations, all behind one fault proxy.
    let sqs_proxy = FaultProxy::start(sqs().endpoint());
    let mut routes = HashMap::new();
    let mut dest_flags = Vec::new();
    let (default_dest, default_queue, queues) = match plan.fleet.dest {
        Dest::Standard => {
            let q = create_queue("sim", &[]).await;
            (q.clone(), q.clone(), vec![q])
        }
        Dest::Fifo => {
            let q = create_queue("sim.fifo", &[]).await;
            (q.clone(), q.clone(), vec![q])
        }
        Dest::SnsFifo => {
            let topic = create_topic("sim.fifo").await;
            let q = create_queue("simsub.fifo", &[]).await;
            subscribe_queue(&topic, &q, true).await;
            dest_flags.extend(args(&["--sns-endpoint-url", sqs_proxy.endpoint()]));
            (topic, q.clone(), vec![q])
        }
        Dest::Routed => {
            let q = create_queue("sim", &[]).await;
            let r = create_queue("simroute", &[]).await;
            dest_flags.extend(args(&["--route", &format!("a1={r}")]));
            routes.insert("a1".to_string(), r.clone());
            (q.clone(), q.clone(), vec![q, r])
        }
    };

    if let Some(sql) = setting_sql(plan, &db.name, false) {
        admin
            .batch_execute(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let bouncer = match plan.pool {
        Some(size) => Some(
            PgBouncer::start(
                cluster.port(),
                cluster.password(),
                Pooling {
                    mode: PoolMode::Transaction,
                    size,
                    reset: false,
                },
            )
            .await,
        ),
        None => None,
    };
    let (url, target_port) = match &bouncer {
        Some(b) => (b.url_for(&db.name), b.port()),
        None => (db.url.clone(), cluster.port()),
    };
    let admin_url = with_app(&url, "sim-admin");
    // The relays' own role, where row-level security is to apply to them (a superuser passes).
    let relay_url = match plan.hazard {
        Some(Hazard::RowSecurity { .. }) => {
            let (relay_role, app_role) = hazard_roles(&db.name);
            let password = crate::support::roles::make_roles(db, &relay_role, &app_role);
            format!(
                "postgres://{relay_role}:{password}@127.0.0.1:{}/{}",
                cluster.port(),
                db.name
            )
        }
        _ => url.clone(),
    };
    let mut flags = args(&[
        "--queue-url",
        &default_dest,
        "--sqs-endpoint-url",
        sqs_proxy.endpoint(),
        "--metrics-addr",
        "127.0.0.1:0",
        "--table",
        table,
    ]);
    flags.extend(dest_flags);
    let n = plan.fleet.relays;
    let flags_of: Vec<Vec<String>> = (0..n)
        .map(|i| flags.iter().cloned().chain(plan.run_flags(i)).collect())
        .collect();
    let flags = flags_of[0].clone();
    let mut primed = Vec::new();
    for w in &plan.workload.late {
        primed.push(horizon::prime(w, &db.url).await);
    }
    let backlog = plan.workload.backlog_txns;
    if backlog > 0 {
        futures_util::future::join_all(plan.workload.writers.iter().map(|txns| {
            write(
                &db.url,
                &txns[..backlog.min(txns.len())],
                Instant::now(),
                Duration::ZERO,
            )
        }))
        .await;
    }
    let probe_url = relay_url.clone();
    let fleet = Mutex::new(Fleet {
        url: relay_url,
        flags: flags_of,
        proxies: (0..n).map(|_| TcpProxy::start(target_port)).collect(),
        slots: (0..n).map(|_| None).collect(),
        ids: vec![String::new(); n],
        incarnations: vec![0; n],
    });
    // Relays started before their database: it comes up `down_ms` later.
    let database_up = match plan.hazard {
        Some(Hazard::EarlyStart { down_ms }) => {
            cluster.stop_fast().await;
            Some(async move {
                tokio::time::sleep(Duration::from_millis(down_ms)).await;
                cluster.start_again().await;
            })
        }
        _ => None,
    };
    // A relay refuses its configuration once it reaches its database, so the window for a
    // refusal opens when a session can get in by the relays' way: at once, or, for relays
    // started before their database, once it is up and a probe gets in (PgBouncer waits
    // `server_login_retry`, 15 s, after a failed login before it tries the server again).
    let spawned = Instant::now();
    let reachable = async move {
        if let Some(up) = database_up {
            up.await;
            let give_up = Instant::now() + Duration::from_secs(60);
            while !reaches(&probe_url).await && Instant::now() < give_up {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Instant::now()
    };
    tokio::pin!(reachable);
    let mut reached_at = None;
    let mut all_ids = Vec::new();
    for i in 0..n {
        let mut f = fleet.lock().unwrap();
        f.spawn(i);
        all_ids.push(f.ids[i].clone());
    }

    // A relay that refuses its configuration exits at once.
    loop {
        if reached_at.is_none() {
            reached_at = futures_util::FutureExt::now_or_never(&mut reachable);
        }
        if reached_at.is_some_and(|at: Instant| Instant::now() >= spawned.max(at) + START_WINDOW) {
            break;
        }
        let refused = {
            let f = fleet.lock().unwrap();
            f.slots.iter().flatten().find_map(|p| {
                let status = futures_util::FutureExt::now_or_never(p.wait_exit(Duration::ZERO))??;
                (!status.success()).then(|| {
                    let output = p.output();
                    // Error lines: the refusal (`error: ...`) and any logged at ERROR. The
                    // word alone is not one: a relay started before its database logs
                    // `WARN waiting for the database: ... error communicating with the
                    // server`, as it should, until the database is up.
                    let errors = output
                        .lines()
                        .filter(|l| l.starts_with("error") || l.contains(" ERROR "))
                        .count();
                    (last_line(&output), errors)
                })
            })
        };
        if let Some((line, error_lines)) = refused {
            // The same flags, straight to the database and without the seed's setting: if
            // they start, the setting or the pool was what the relay refused.
            if reached_at.is_none() {
                (&mut reachable).await;
            }
            if let Some(reset) = setting_sql(plan, &db.name, true) {
                // A session of its own: the database may have been down since `admin` connected.
                own_session_retrying(&db.url, Instant::now() + Duration::from_secs(60))
                    .await
                    .expect("connect to reset the setting")
                    .batch_execute(&reset)
                    .await
                    .expect("reset the setting");
            }
            let mut a = args(&["run", "--database-url", &with_app(&db.url, "recheck")]);
            a.extend(flags.iter().cloned());
            let again = RelayProcess::spawn_named("recheck", &a, &[]);
            let setting_caused = again.wait_exit(START_WINDOW).await.is_none();
            again.kill9();
            return Run::Refused {
                line,
                error_lines,
                setting_caused,
            };
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let start = Instant::now();
    let marks = Mutex::new(Marks::default());
    let stop_sampling = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = bouncer
        .as_ref()
        .map(|b| tokio::spawn(sample_pool(b.url_for(&db.name), stop_sampling.clone())));
    let spread = Duration::from_millis(plan.workload.write_ms);
    let writers = futures_util::future::join_all(
        plan.workload
            .writers
            .iter()
            .map(|txns| write(&db.url, &txns[backlog.min(txns.len())..], start, spread)),
    );
    let faults = futures_util::future::join_all(
        plan.faults
            .iter()
            .map(|t| inject(*t, start, &fleet, &marks, &sqs_proxy, cluster, &db.url)),
    );
    let ops = futures_util::future::join_all(
        plan.ops
            .iter()
            .map(|t| operate(*t, start, &admin_url, table)),
    );
    let held = futures_util::future::join_all(
        plan.horizon
            .iter()
            .enumerate()
            .map(|(n, h)| horizon::hold(*h, start, &db.url, horizon::gid(&db.name, "hold", n))),
    );
    let late =
        futures_util::future::join_all(plan.workload.late.iter().zip(primed).enumerate().map(
            |(n, (w, session))| {
                let gid = horizon::gid(&db.name, "late", n);
                horizon::write_late(w.clone(), start, &db.url, gid, session)
            },
        ));
    let kept = hazard(plan, start, db);
    let checker_url = db.url.clone();
    let supervising = std::sync::atomic::AtomicBool::new(false);
    let restarts = Mutex::new(Vec::new());
    // A row that became unsent below a relay's floor is read from its next sweep: a sweep gap,
    // then the statistics pass it runs in, whose statements come one after another (seconds
    // over a slow link).
    let late_wait = Duration::from_millis(plan.fleet.sweep_ms) + Duration::from_secs(3);
    let ((checker, is_settled), signal) = {
        let work = async {
            tokio::join!(writers, faults, ops, held, late, kept);
            let checker =
                own_session_retrying(&checker_url, Instant::now() + Duration::from_secs(60))
                    .await
                    .expect("connect to check");
            // Rows that committed late below a relay's floor wait for its next sweep.
            let deadline =
                Instant::now() + SETTLE_TIMEOUT + 2 * Duration::from_millis(plan.fleet.sweep_ms);
            let mut is_settled = false;
            let mut named_at = None;
            while Instant::now() < deadline {
                if settled(&checker).await {
                    is_settled = true;
                    break;
                }
                // Settlements that change nothing leave rows unsent for good: once a relay
                // said so, the others get a little longer to meet them too.
                if plan.keeps_rows() && named_at.is_none() {
                    named_at = output_line(&fleet, UNDONE).map(|_| Instant::now());
                }
                if plan.hides_rows() && named_at.is_none() {
                    named_at = output_line(&fleet, HIDDEN).map(|_| Instant::now());
                }
                if named_at.is_some_and(|at| at.elapsed() > Duration::from_secs(3)) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // A relay started again late (after a fault near the end) may still be starting,
            // or failing to, while PgBouncer refuses logins after a database restart
            // (`server_login_retry`): the quiet point asks the relays, so they get that long.
            let started_by = Instant::now() + Duration::from_secs(40);
            while Instant::now() < started_by && !all_started(&fleet) {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            supervising.store(true, std::sync::atomic::Ordering::Relaxed);
            (checker, is_settled)
        };
        let (outcome, (), signal) = tokio::join!(
            work,
            supervise(&fleet, &supervising, &restarts),
            signal::sample(&fleet, &db.url, late_wait, &supervising)
        );
        (outcome, signal)
    };
    for id in fleet.lock().unwrap().ids.iter() {
        if !all_ids.contains(id) {
            all_ids.push(id.clone());
        }
    }
    let undone_named = output_line(&fleet, UNDONE);
    let hidden_named = output_line(&fleet, HIDDEN);
    let undone_by: HashSet<String> = fleet
        .lock()
        .unwrap()
        .slots
        .iter()
        .flatten()
        .filter(|p| p.output().contains(UNDONE))
        .map(|p| p.name().to_string())
        .collect();
    let restarts = restarts.into_inner().unwrap();
    if let Some(last) = restarts.last() {
        println!(
            "  {} start-up exit(s) restarted, the last: {last}",
            restarts.len()
        );
    }

    // The faults are over: the relays are the main task's alone now.
    let procs: Vec<RelayProcess> = fleet
        .lock()
        .unwrap()
        .slots
        .iter_mut()
        .filter_map(Option::take)
        .collect();
    let quiet = if is_settled {
        let faulted = marks.lock().unwrap().hard.clone();
        Some(quiet_point(&checker, &procs, &faulted, &admin_url, table).await)
    } else {
        None
    };
    stop_sampling.store(true, std::sync::atomic::Ordering::Relaxed);
    let pool_leaks = match sampler {
        Some(s) => s.await.unwrap_or_default(),
        None => Vec::new(),
    };

    // Relays that stopped on their own before being told to.
    let mut exits = Vec::new();
    for p in &procs {
        if let Some(status) = p.wait_exit(Duration::ZERO).await {
            exits.push(format!(
                "{} exited {status}: {}",
                p.name(),
                last_line(&p.output())
            ));
        }
    }
    // A run that did not settle fails "nothing is left unsent": what holds the rows, and what
    // each relay said last, are printed then, so that a failure in CI names its cause.
    if !is_settled || std::env::var_os("OUTBOX_SIM_ECHO").is_some_and(|v| v == "1") {
        echo_what_holds_unsent_rows(&checker).await;
    }
    if !is_settled {
        for p in &procs {
            let output = p.output();
            let lines: Vec<&str> = output.lines().collect();
            println!("  -- the last lines of {}", p.name());
            for line in &lines[lines.len().saturating_sub(30)..] {
                println!("     {}", line.chars().take(400).collect::<String>());
            }
        }
    }
    for p in &procs {
        p.sigterm();
    }
    for p in &procs {
        if p.wait_exit(Duration::from_secs(10)).await.is_none() {
            p.kill9();
        }
    }

    let changes = history::read_log(&checker).await;
    let late_rows = if plan.workload.late.is_empty() {
        None
    } else {
        history::late_below(&checker).await
    };
    let rows = history::read_rows(&checker, "public.outbox").await;
    let route_of = |aggregate_type: &str| {
        routes
            .get(aggregate_type)
            .cloned()
            .unwrap_or_else(|| default_queue.clone())
    };
    let mut types = HashMap::new();
    let mut poison = HashMap::new();
    for row in plan.workload.specs() {
        types.insert(row.event_id.clone(), row.aggregate_type.clone());
        if let Some(p) = row.poison {
            poison.insert(row.event_id.clone(), p);
        }
    }
    let mut sent_to: HashMap<String, HashSet<String>> = HashMap::new();
    for c in changes.iter().filter(|c| c.is_outbox()) {
        let acked = (c.op == "U" && c.new_sent == Some(true) && c.old_sent == Some(false))
            || (c.op == "D" && c.old_sent == Some(false) && c.old_reason.is_none());
        if acked {
            let ev = c.event_id.clone().unwrap_or_default();
            let q = route_of(types.get(&ev).map_or("", |s| s));
            sent_to.entry(q).or_default().insert(ev);
        }
    }
    let mut received = Vec::new();
    for q in &queues {
        let expected = sent_to.get(q).map_or(0, HashSet::len);
        for m in receive_all(q, expected, Duration::from_secs(20)).await {
            let attr = |name: &str| {
                m.message_attributes()
                    .and_then(|a| a.get(name))
                    .and_then(|v| v.string_value())
                    .map(str::to_string)
            };
            received.push(Received {
                queue: q.clone(),
                event_id: attr("event_id"),
                aggregate_id: attr("aggregate_id"),
                group_id: m
                    .attributes()
                    .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
                    .cloned(),
                body: m.body().unwrap_or_default().to_string(),
            });
        }
    }
    let marks = marks.into_inner().unwrap();
    Run::Ran(Box::new(Evidence {
        changes,
        rows,
        received,
        routes,
        default_queue,
        poison,
        faulted_hard: marks.hard,
        faulted_soft: marks.soft,
        injected: marks.injected,
        crashes: marks.crashes,
        pool_leaks,
        quiet,
        settled: is_settled,
        sqs_errors: marks.sqs_errors,
        exits,
        late_rows,
        relays_run: all_ids.len(),
        startup_exits: restarts,
        undone_named,
        hidden_named,
        undone_by,
        signal,
    }))
}

/// With OUTBOX_SIM_ECHO=1, at the end of a run with the relays still up: the rows still unsent,
/// the relays' published floors, their live claims and the sessions in a transaction, for
/// reading why a row waited.
async fn echo_what_holds_unsent_rows(client: &Client) {
    let queries = [
        "SELECT id, event_id, aggregate_id, attempts, available_at, created_at, quarantine_reason, \
         to_jsonb(o) ->> 'xact_id' AS xact_id FROM public.outbox o \
         WHERE sent_at IS NULL ORDER BY id",
        "SELECT relay_id, claiming, unsent_floor, claims_floor, seen_until > now() AS live \
         FROM public.outbox_relays",
        "SELECT token, owner, until > now() AS live, ids FROM public.outbox_claims ORDER BY token",
        "SELECT pid, application_name, state, backend_xid, backend_xmin, xact_start, left(query, 80) \
         FROM pg_stat_activity WHERE xact_start IS NOT NULL AND pid <> pg_backend_pid()",
        "SELECT gid, transaction, prepared FROM pg_prepared_xacts",
        "SELECT pg_snapshot_xmin(pg_current_snapshot())",
    ];
    for sql in queries {
        match client.simple_query(sql).await {
            Ok(messages) => {
                println!(
                    "  -- {}",
                    sql.split_whitespace().take(6).collect::<Vec<_>>().join(" ")
                );
                for m in messages {
                    if let tokio_postgres::SimpleQueryMessage::Row(row) = m {
                        let cells: Vec<&str> = (0..row.len())
                            .map(|i| row.get(i).unwrap_or("NULL"))
                            .collect();
                        println!("     {}", cells.join(" | "));
                    }
                }
            }
            Err(e) => println!("  -- {sql}: {e}"),
        }
    }
}
