//! One relay serving several tables (`--tables`, or `--table` more than once).
//!
//! - **Connections**: a fixed few whatever the number of tables: each of the
//!   `--active-tables` turns that may run at once has a connection for claims and one for
//!   settlements, which every table's statements are prepared on ([`HostConn`]); maintenance on
//!   one, the look on one, discovery on a short-lived one.
//! - **The look**: one statement (per hundred tables) every `--poll-interval` tells, for every
//!   table, whether a row is claimable, the age of its oldest unsent row, and whether maintenance
//!   is due ([`Watch`]). Idle tables cost that look between them, nothing else.
//! - **Turns**: a table with work gets a turn: the relay's claim loop for that table until it
//!   has nothing claimable, or its `--table-turn` is over while another table waits. At most
//!   `--active-tables` turns run at once; tables wait in the order of their last turn (the one
//!   served longest ago first), so a table with a backlog of millions delays another table's
//!   new row by one turn at most. Every settlement is its claim's, on its table.
//! - **Isolation**: a table that fails (dropped, renamed, locked, unreadable, a schema that
//!   does not admit this relay) is reported once, backed off on its own and tried again;
//!   the others keep flowing. Discovery every `--discover-every` adds and lets go of tables.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::board::Board;
use super::{within, Relay, Sessions, Shared, Turn, TurnEnd};
use crate::config::RunConfig;
use crate::metrics::{Health, Section};
use crate::otel::Tracing;
use crate::outbox::{
    HostConn, LiveSession, Look, Maintenance, Outbox, OutboxError, Purpose, Registration,
    TableName, Watch,
};

/// How many tables' statements one shared connection keeps prepared (least recently used
/// dropped past it): a turn of a table among them prepares nothing.
const PREPARED_TABLES: usize = 128;

/// A table the relay serves, and where it is in the rotation.
struct Table {
    relay: Arc<Relay>,
    /// Whether a turn runs now.
    in_turn: bool,
    /// When its last turn ended; `None`: never had one (served first).
    last_turn: Option<Instant>,
    /// Its last turn gave way with more to claim: it needs another without waiting for a look.
    more: bool,
    /// What the last look saw.
    look: Option<Look>,
    /// Why it is not served now, and until when it is left alone.
    trouble: Option<Trouble>,
}

/// A turn's connections: claims (and the registration), settlements.
struct Slot {
    claims: Arc<HostConn>,
    settlements: Arc<HostConn>,
}

struct Trouble {
    why: String,
    failures: u32,
    until: Instant,
    /// A trial look at it alone, on a connection of its own, passed: it is looked at and
    /// given turns again, and its failures are forgotten after a turn that works.
    tried: bool,
}

/// The candidates for a turn, in the order they get one: the table served longest ago first
/// (never served: first of all), ties by name. Pure.
pub(crate) fn rotation(mut waiting: Vec<(TableName, Option<Instant>)>) -> Vec<TableName> {
    waiting.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.label().cmp(&b.0.label())));
    waiting.into_iter().map(|(t, _)| t).collect()
}

/// The selection with each unqualified --table resolved once on the role's search_path, as for
/// one table, so that every connection (a pooler's included) uses the same table; and the
/// tables it selects now.
async fn first_look(
    config: &RunConfig,
    root: &Outbox,
    purpose: &Purpose,
) -> Result<(crate::outbox::Selection, Vec<TableName>), OutboxError> {
    let mut selection = config.database.selection.clone();
    for named in selection.named.iter_mut().filter(|t| t.schema.is_none()) {
        let one = Outbox::from_config(&config.database.for_table(named), purpose.clone())?;
        if let Some(resolved) = one.resolve_table().await? {
            *named = resolved.table;
        }
    }
    let first = root.connector().select(&selection).await?;
    Ok((selection, first))
}

/// Relays for every table of the selection until `shutdown`, then drains every turn.
pub async fn run(
    config: RunConfig,
    health: Arc<Health>,
    tracing: Option<Arc<Tracing>>,
    shutdown: CancellationToken,
) -> Result<(), OutboxError> {
    let purpose = Purpose::Relay(config.relay_settings());
    let root = Arc::new(Outbox::from_config(&config.database, purpose.clone())?);
    // Started with its database, or before it: the first look is tried again while the
    // database is not there yet, as one table's first connection is (`connect_when_ready` in
    // main.rs); what no retry fixes ends the relay at once.
    let mut failures = 0u32;
    health.set_not_claiming(Some("starting: connecting to the database".to_string()));
    let (selection, first) = loop {
        match first_look(&config, &root, &purpose).await {
            Ok(found) => break found,
            Err(e) if e.is_transient() && !shutdown.is_cancelled() => {
                failures += 1;
                let delay = crate::outbox::reconnect_delay(
                    failures,
                    false,
                    config.retry.retry_base,
                    config.retry.db_retry_max,
                    fastrand::f64(),
                );
                tracing::warn!(retry_in = ?delay, "waiting for the database: {e}");
                health.set_not_claiming(Some(format!("waiting for the database: {e}")));
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.cancelled() => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    };
    health.set_not_claiming(None);
    if first.is_empty() {
        tracing::warn!(
            "no table matches the selection yet; looking again every {}",
            humantime::format_duration(config.many.discover_every)
        );
    }
    health.set_database_ok(true);
    let shared = Shared::new(&config, Arc::clone(&health), tracing).await;
    let board = Arc::new(Board::new(
        config.many.table_series,
        config.maintenance.stats_interval,
    ));
    {
        let board = Arc::clone(&board);
        health.add_section(Section(Arc::new(move || board.render())));
    }
    let slots = (0..config.many.active_tables)
        .map(|_| Slot {
            claims: HostConn::new(PREPARED_TABLES),
            settlements: HostConn::new(PREPARED_TABLES),
        })
        .collect::<Vec<_>>();
    let mut many = Many {
        free: (0..slots.len()).rev().collect(),
        slots,
        maintenance: Maintenance::new(Arc::clone(&root), config.maintenance.maintenance_timeout),
        tables: HashMap::new(),
        order: Vec::new(),
        watch: Watch::new(Vec::new(), None),
        retention: config.maintenance.retention.seconds(),
        shared,
        board,
        health,
        purpose,
        config,
        waiting: Arc::new(AtomicUsize::new(0)),
    };
    many.serve(first, &root);
    tracing::info!(
        relay_id = %many.config.claim.relay_id,
        tables = many.tables.len(),
        active_tables = many.config.many.active_tables,
        queue_url = %many.config.destination.queue_url,
        "relay started for several tables"
    );
    many.rotate(root, selection, shutdown).await;
    Ok(())
}

struct Many {
    config: RunConfig,
    purpose: Purpose,
    shared: Shared,
    board: Arc<Board>,
    health: Arc<Health>,
    /// One per turn that may run at once: a turn's claims and settlements never queue behind
    /// another table's on a connection (a backlog's claims would hold up every other table's).
    slots: Vec<Slot>,
    /// The slots no turn uses now.
    free: Vec<usize>,
    maintenance: Maintenance,
    tables: HashMap<TableName, Table>,
    /// The tables in the look's order.
    order: Vec<TableName>,
    watch: Watch,
    retention: Option<f64>,
    /// How many tables wait for a turn (a turn past its `--table-turn` gives way then).
    waiting: Arc<AtomicUsize>,
}

impl Many {
    /// Serves `found` (named and discovered): new tables are added, tables no longer found
    /// are let go once their turn ends.
    fn serve(&mut self, found: Vec<TableName>, root: &Outbox) {
        for table in &found {
            if self.tables.contains_key(table) {
                continue;
            }
            match self.table(table, root) {
                Ok(relay) => {
                    tracing::info!(table = %table.label(), "serving table");
                    self.tables.insert(
                        table.clone(),
                        Table {
                            relay,
                            in_turn: false,
                            last_turn: None,
                            more: false,
                            look: None,
                            trouble: None,
                        },
                    );
                }
                Err(e) => tracing::error!(table = %table.label(), error = %e, "cannot serve table"),
            }
        }
        let gone: Vec<TableName> = self
            .tables
            .keys()
            .filter(|t| !found.contains(t))
            .cloned()
            .collect();
        for table in gone {
            if self.tables.get(&table).is_some_and(|t| !t.in_turn) {
                tracing::info!(table = %table.label(), "table no longer selected (dropped, renamed or out of the pattern): let go");
                self.tables.remove(&table);
                self.board.forget(&table.label());
            }
        }
        self.rewatch();
    }

    /// The look over every table not in trouble, in a stable order.
    fn rewatch(&mut self) {
        let mut order: Vec<TableName> = self
            .tables
            .iter()
            .filter(|(_, t)| t.trouble.as_ref().is_none_or(|t| t.tried))
            .map(|(name, _)| name.clone())
            .collect();
        order.sort_by_key(|t| t.label());
        if order != self.order {
            let outboxes = order
                .iter()
                .map(|t| Arc::clone(&self.tables[t].relay.outbox))
                .collect();
            self.watch = Watch::new(outboxes, self.retention);
            self.order = order;
        }
    }

    /// A table's relay: its statements, on the shared connections.
    fn table(&self, table: &TableName, root: &Outbox) -> Result<Arc<Relay>, OutboxError> {
        let mut config = self.config.clone();
        config.database = config.database.for_table(table);
        let outbox = Arc::new(
            Outbox::from_config(&config.database, self.purpose.clone())?.sharing_hosts_with(root),
        );
        let registration = Registration::starting(&config.claim.relay_id, config.claim.lease);
        // Bound to a slot's connections at each turn (`start_turns`).
        let sessions = Sessions {
            claims: LiveSession::on(Arc::clone(&outbox), Arc::clone(&self.slots[0].claims)),
            settlements: LiveSession::on(
                Arc::clone(&outbox),
                Arc::clone(&self.slots[0].settlements),
            ),
        };
        Ok(Arc::new(Relay::new(
            config,
            outbox,
            sessions,
            &self.shared,
            registration,
            super::Gauges::Board(Arc::clone(&self.board)),
            Some(&self.maintenance),
        )))
    }

    async fn rotate(
        &mut self,
        root: Arc<Outbox>,
        selection: crate::outbox::Selection,
        shutdown: CancellationToken,
    ) {
        let c = self.config.clone();
        let mut turns: JoinSet<(TableName, TurnEnd, usize)> = JoinSet::new();
        // A skipped table is tried alone, on a connection of its own, before it shares the
        // look and the claims' connection again: a table locked by a migration would otherwise
        // hold up the statements of every table queued behind its own on those connections.
        let mut trials: JoinSet<(TableName, Result<(), String>)> = JoinSet::new();
        let mut discover_at = Instant::now() + c.many.discover_every;
        let mut look_at = Instant::now();
        // The full look (the gauges' ages, maintenance due) every --stats-interval; between, the
        // fast one (claimable only) every --poll-interval.
        let mut full_at = Instant::now();
        let mut look_failures = 0u32;
        // The tables' sweeps below their floors (src/outbox/floors.rs), due after full looks:
        // a row that became unsent below a table's floor makes the look see nothing there, so
        // the sweep cannot wait for the table's next turn.
        let mut sweeping: Option<tokio::task::JoinHandle<()>> = None;
        while !shutdown.is_cancelled() {
            self.health.tick();
            let now = Instant::now();
            if now >= discover_at && !selection.patterns.is_empty() {
                discover_at = now + c.many.discover_every;
                match within(
                    c.retry.db_timeout,
                    "looking up the tables",
                    root.connector().select(&selection),
                )
                .await
                {
                    Ok(found) => self.serve(found, &root),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not look up the tables --tables selects; serving those found before")
                    }
                }
            }
            if now >= look_at {
                let full = now >= full_at;
                let began = std::time::SystemTime::now();
                let look = within(
                    c.retry.db_timeout,
                    "looking at the tables",
                    self.watch.look(full),
                );
                match look.await {
                    Ok(answers) => {
                        if full {
                            full_at = now + c.maintenance.stats_interval;
                            if sweeping.as_ref().is_none_or(|s| s.is_finished()) {
                                sweeping = Some(tokio::spawn(self.sweeps()));
                            }
                        }
                        look_failures = 0;
                        self.health.set_database_ok(true);
                        self.seen(answers, began);
                        look_at = Instant::now() + c.claim.poll_interval;
                    }
                    Err(e) => {
                        if matches!(e, OutboxError::Unanswered { .. }) {
                            self.watch.reset();
                        }
                        look_failures += 1;
                        self.health.set_database_ok(false);
                        self.board.failed_all();
                        let delay = crate::outbox::reconnect_delay(
                            look_failures,
                            false,
                            c.retry.retry_base,
                            c.retry.db_retry_max,
                            fastrand::f64(),
                        );
                        tracing::warn!(error = %e, retry_in = ?delay, "could not look at the tables; backing off");
                        look_at = Instant::now() + delay;
                    }
                }
            }
            self.start_turns(&mut turns, &shutdown);
            self.start_trials(&mut trials);
            let wake = tokio::time::Instant::from_std(look_at.min(discover_at));
            tokio::select! {
                Some(done) = turns.join_next() => {
                    if let Ok((table, end, slot)) = done {
                        self.ended(&table, end, slot);
                    }
                    while let Some(done) = turns.try_join_next() {
                        if let Ok((table, end, slot)) = done {
                            self.ended(&table, end, slot);
                        }
                    }
                }
                Some(Ok((table, result))) = trials.join_next() => self.tried(&table, result),
                _ = tokio::time::sleep_until(wake) => {}
                _ = tokio::time::sleep(self.health.tick_every()) => {}
                _ = shutdown.cancelled() => {}
            }
        }
        tracing::info!(
            turns = turns.len(),
            "shutting down: no new turns; finishing the turns in flight"
        );
        while let Some(done) = turns.join_next().await {
            if let Ok((table, end, slot)) = done {
                self.ended(&table, end, slot);
            }
        }
        for table in self.tables.values() {
            if table.relay.admission.last_renewal().is_some() {
                table.relay.deregister().await;
            }
        }
        tracing::info!("relay stopped");
    }

    /// What the look saw: the gauges, and which tables need a turn; a table whose part of
    /// the look failed is in trouble.
    fn seen(&mut self, answers: Vec<crate::outbox::Answer>, began: std::time::SystemTime) {
        let order = self.order.clone();
        let mut troubled = false;
        for (name, answer) in order.iter().zip(answers) {
            let Some(table) = self.tables.get_mut(name) else {
                continue;
            };
            match answer {
                Ok(look) => {
                    if look.full {
                        self.board.look(&name.label(), &look, began);
                    }
                    table.look = Some(look);
                }
                Err(e) => {
                    troubled = true;
                    trouble(name, table, &e.to_string(), &self.config);
                    self.board.skipped(&name.label(), true);
                }
            }
        }
        if troubled {
            self.rewatch();
        }
    }

    /// The sweeps that are due, one table after another on the shared maintenance connection; a
    /// table in trouble is left to its trial.
    fn sweeps(&self) -> impl std::future::Future<Output = ()> + 'static {
        let due: Vec<Arc<Relay>> = self
            .tables
            .values()
            .filter(|t| t.trouble.is_none() && t.relay.sweep_due())
            .map(|t| Arc::clone(&t.relay))
            .collect();
        async move {
            for relay in due {
                relay.sweep_if_due().await;
            }
        }
    }

    /// Starts turns for the tables that need one, in rotation, while fewer than
    /// `--active-tables` run.
    fn start_turns(
        &mut self,
        turns: &mut JoinSet<(TableName, TurnEnd, usize)>,
        shutdown: &CancellationToken,
    ) {
        let candidates: Vec<(TableName, Option<Instant>)> = self
            .tables
            .iter()
            .filter(|(_, t)| !t.in_turn)
            .filter(|(_, t)| match &t.trouble {
                Some(trouble) if !trouble.tried => false,
                _ => t.more || t.look.is_some_and(|l| t.relay.needs_turn(&l)),
            })
            .map(|(name, t)| (name.clone(), t.last_turn))
            .collect();
        let queue = rotation(candidates);
        let free = self.free.len();
        self.waiting
            .store(queue.len().saturating_sub(free), Ordering::Relaxed);
        for name in queue.into_iter().take(free) {
            let slot = self.free.pop().expect("a free slot");
            let table = self.tables.get_mut(&name).expect("a candidate is served");
            table
                .relay
                .session
                .bind(Arc::clone(&self.slots[slot].claims));
            table
                .relay
                .settlements
                .bind(Arc::clone(&self.slots[slot].settlements));
            table.in_turn = true;
            table.more = false;
            let look = table.look.take();
            let relay = Arc::clone(&table.relay);
            let turn = Turn {
                until: Instant::now() + self.config.many.table_turn,
                waiting: Arc::clone(&self.waiting),
            };
            let shutdown = shutdown.clone();
            turns.spawn(async move {
                let end = relay.turn(turn, look, &shutdown).await;
                (name, end, slot)
            });
        }
    }

    /// Starts a trial of the skipped tables whose back-off is over, one at a time.
    fn start_trials(&mut self, trials: &mut JoinSet<(TableName, Result<(), String>)>) {
        if !trials.is_empty() {
            return;
        }
        let now = Instant::now();
        let due = self
            .tables
            .iter()
            .filter(|(_, t)| !t.in_turn)
            .filter_map(|(name, t)| match &t.trouble {
                Some(trouble) if !trouble.tried && now >= trouble.until => {
                    Some((name.clone(), trouble.until))
                }
                _ => None,
            })
            .min_by_key(|(_, until)| *until);
        let Some((name, _)) = due else {
            return;
        };
        let outbox = Arc::clone(&self.tables[&name].relay.outbox);
        let retention = self.retention;
        let deadline = self.config.retry.db_timeout;
        trials.spawn(async move {
            let mut alone = Watch::new(vec![outbox], retention);
            let result = match within(deadline, "looking at the table", alone.look(true)).await {
                Ok(mut answers) => answers.remove(0).map(|_| ()).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            (name, result)
        });
    }

    /// A trial ended: the table shares the look and the turns again, or waits longer.
    fn tried(&mut self, name: &TableName, result: Result<(), String>) {
        let Some(table) = self.tables.get_mut(name) else {
            return;
        };
        match result {
            Ok(()) => {
                if let Some(trouble) = table.trouble.as_mut() {
                    trouble.tried = true;
                }
                self.rewatch();
            }
            Err(why) => trouble(name, table, &why, &self.config),
        }
    }

    /// A turn ended: the table waits for the next, or is backed off.
    fn ended(&mut self, name: &TableName, end: TurnEnd, slot: usize) {
        self.free.push(slot);
        let Some(table) = self.tables.get_mut(name) else {
            return;
        };
        table.in_turn = false;
        table.last_turn = Some(Instant::now());
        let was_troubled = table.trouble.is_some();
        let was_watched = table.trouble.as_ref().is_none_or(|t| t.tried);
        match end {
            TurnEnd::Drained | TurnEnd::Shutdown => {
                if let Some(trouble) = table.trouble.take() {
                    tracing::info!(table = %name.label(), was = %trouble.why, "table served again");
                }
            }
            TurnEnd::Yielded => {
                table.more = true;
                table.trouble = None;
            }
            TurnEnd::Failed(e) => trouble(name, table, &e.to_string(), &self.config),
            TurnEnd::NotClaiming(why) => trouble(name, table, &why, &self.config),
        }
        if was_troubled != table.trouble.is_some() {
            self.board.skipped(&name.label(), table.trouble.is_some());
        }
        if was_watched != table.trouble.as_ref().is_none_or(|t| t.tried) {
            self.rewatch();
        }
    }
}

/// The table is not served until its back-off ends: said once per reason, at ERROR when it
/// will not pass by itself.
fn trouble(name: &TableName, table: &mut Table, why: &str, config: &RunConfig) {
    let failures = table.trouble.as_ref().map_or(0, |t| t.failures) + 1;
    let delay = crate::retry::backoff(
        failures,
        config.retry.retry_base,
        config.retry.retry_max,
        fastrand::f64(),
    )
    .max(config.retry.retry_base);
    if table.trouble.as_ref().map(|t| t.why.as_str()) != Some(why) {
        tracing::error!(table = %name.label(), retry_in = ?delay,
            "table skipped, the others go on: {why}");
    }
    table.trouble = Some(Trouble {
        why: why.to_string(),
        failures,
        until: Instant::now() + delay,
        tried: false,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_table_served_longest_ago_goes_first_and_a_new_one_before_all() {
        let t = |s: &str| s.parse::<TableName>().unwrap();
        let t0 = Instant::now();
        let order = rotation(vec![
            (t("a.outbox"), Some(t0 + Duration::from_millis(5))),
            (t("b.outbox"), Some(t0)),
            (t("c.outbox"), None),
            (t("d.outbox"), Some(t0 + Duration::from_millis(1))),
        ]);
        let labels: Vec<String> = order.iter().map(TableName::label).collect();
        assert_eq!(labels, ["c.outbox", "b.outbox", "d.outbox", "a.outbox"]);
    }
}
