//! The checker: reads the whole history of one seed (the trigger log, the table's last state,
//! every message received, which relays were faulted, what a pooled application session read,
//! the gauges at a quiet point, the age signal sampled while the relays ran) and lists every
//! broken invariant.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::history::Change;
use crate::plan::{Dest, Op, Plan};
use crate::world::Evidence;

#[derive(Debug, Clone)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

/// Reported per invariant: at most this many details, then a count.
const DETAILS: usize = 5;

#[derive(Default)]
struct Report(BTreeMap<&'static str, (usize, Vec<String>)>);

impl Report {
    fn add(&mut self, invariant: &'static str, detail: String) {
        let entry = self.0.entry(invariant).or_default();
        entry.0 += 1;
        if entry.1.len() < DETAILS {
            entry.1.push(detail);
        }
    }

    fn into_violations(self) -> Vec<Violation> {
        self.0
            .into_iter()
            .map(|(invariant, (n, details))| Violation {
                invariant,
                detail: format!(
                    "{n} case(s): {}{}",
                    details.join("; "),
                    if n > details.len() { "; ..." } else { "" }
                ),
            })
            .collect()
    }
}

/// A claim (lease row) as the log saw it.
struct Claim {
    owner: String,
    inserted_at: f64,
    inserted_txid: i64,
    deleted_at: Option<f64>,
    deleted_txid: Option<i64>,
    until: f64,
    ids: Vec<i64>,
}

impl Claim {
    /// Live from its insert until its delete or its `until`, whichever is first.
    fn live_until(&self) -> f64 {
        self.deleted_at.map_or(self.until, |d| d.min(self.until))
    }

    fn live_at(&self, at: f64) -> bool {
        self.inserted_at < at && at < self.live_until()
    }
}

/// One row's place in one claim: live from `.0` to `.1`, claim token `.2`, row id `.3`.
type Lease = (f64, f64, i64, i64);

/// A committed row, from its insert.
struct Written {
    id: i64,
    event_id: String,
    group: String,
    txid: i64,
}

pub fn check(plan: &Plan, ev: &Evidence) -> Vec<Violation> {
    let mut report = Report::default();
    let fleet = &plan.fleet;
    let written: Vec<Written> = ev
        .changes
        .iter()
        .filter(|c| c.is_outbox() && c.op == "I")
        .map(|c| Written {
            id: c.id.unwrap_or_default(),
            event_id: c.event_id.clone().unwrap_or_default(),
            group: c.group_key.clone().unwrap_or_default(),
            txid: c.txid,
        })
        .collect();
    let by_id: HashMap<i64, &Written> = written.iter().map(|w| (w.id, w)).collect();
    let types: HashMap<&str, &str> = plan
        .workload
        .specs()
        .map(|r| (r.event_id.as_str(), r.aggregate_type.as_str()))
        .collect();
    let queue_of = |event_id: &str| -> &str {
        types
            .get(event_id)
            .and_then(|t| ev.routes.get(*t))
            .map_or(ev.default_queue.as_str(), String::as_str)
    };

    // Claims, by token.
    let mut claims: HashMap<i64, Claim> = HashMap::new();
    for c in ev.changes.iter().filter(|c| !c.is_outbox()) {
        let token = c.token.unwrap_or_default();
        match c.op.as_str() {
            "I" => {
                claims.insert(
                    token,
                    Claim {
                        owner: c.owner.clone().unwrap_or_default(),
                        inserted_at: c.at,
                        inserted_txid: c.txid,
                        deleted_at: None,
                        deleted_txid: None,
                        until: c.until.unwrap_or_default(),
                        ids: c.ids.clone(),
                    },
                );
            }
            "D" => {
                if let Some(claim) = claims.get_mut(&token) {
                    claim.deleted_at = Some(c.at);
                    claim.deleted_txid = Some(c.txid);
                }
            }
            _ => report.add(
                "the lease table is only inserted into and deleted from",
                format!("token {token} updated by {}", c.app),
            ),
        }
    }
    let mut claims_of_row: HashMap<i64, Vec<i64>> = HashMap::new();
    for (token, claim) in &claims {
        for id in &claim.ids {
            claims_of_row.entry(*id).or_default().push(*token);
        }
    }
    let faulted = |owner: &str| ev.faulted_hard.contains(owner) || ev.faulted_soft.contains(owner);

    // What became of each row.
    let mut receipts: HashMap<&str, usize> = HashMap::new();
    for m in &ev.received {
        match &m.event_id {
            Some(e) => *receipts.entry(e.as_str()).or_default() += 1,
            None => report.add(
                "every message carries its event_id",
                format!("a message on {} without one: {}", m.queue, m.body),
            ),
        }
    }
    let replays: HashMap<&str, usize> = ev
        .changes
        .iter()
        .filter(|c| {
            c.is_outbox() && c.op == "U" && c.old_sent == Some(true) && c.new_sent == Some(false)
        })
        .fold(HashMap::new(), |mut m, c| {
            *m.entry(c.event_id.as_deref().unwrap_or("")).or_default() += 1;
            m
        });
    let ever_quarantined: HashSet<i64> = ev
        .changes
        .iter()
        .filter(|c| c.is_outbox() && c.new_reason.is_some())
        .filter_map(|c| c.id)
        .collect();
    let final_reason: HashMap<&str, Option<&str>> = ev
        .rows
        .iter()
        .map(|r| (r.event_id.as_str(), r.reason.as_deref()))
        .collect();
    let any_fault = !ev.faulted_hard.is_empty() || !ev.faulted_soft.is_empty() || ev.sqs_errors;
    // Settlements that change nothing (issue 37): rows the relays stopped at stay unsent in the
    // table once a relay named the cause, and each relay may have sent them once more.
    // Row-level security hiding the rows from the relays' role: the same, once a relay said
    // that it cannot see them.
    let kept_named = (plan.keeps_rows() && ev.undone_named.is_some())
        || (plan.hides_rows() && (ev.hidden_named.is_some() || ev.undone_named.is_some()));
    // Once per relay: a relay stops sending before it looks whether such a settlement took
    // effect (seed 12172163297347410878, 4 relays with batches of 3, received two events 6
    // times while the look came first).
    let undone_copies = if plan.keeps_rows() || plan.hides_rows() {
        ev.relays_run
    } else {
        0
    };
    for w in &written {
        let got = receipts.get(w.event_id.as_str()).copied().unwrap_or(0);
        let poison = ev.poison.get(&w.event_id);
        let reason = final_reason.get(w.event_id.as_str()).copied().flatten();
        if let (Some(p), true) = (poison, got > 0) {
            report.add(
                "a poison row is quarantined, never delivered",
                format!("{} ({:?}) was received {got} time(s)", w.event_id, p),
            );
        }
        let waits_named = kept_named && final_reason.contains_key(w.event_id.as_str());
        if got == 0 && !waits_named {
            match reason {
                None => report.add(
                    "no committed row is lost",
                    format!(
                        "{} (id {}) never received and not quarantined (final state: {})",
                        w.event_id,
                        w.id,
                        if final_reason.contains_key(w.event_id.as_str()) {
                            "unsent in the table"
                        } else {
                            "deleted"
                        }
                    ),
                ),
                Some(r) => {
                    let true_reason = match poison {
                        Some(p) => r == p.reason(),
                        None => false,
                    } || (r == "blocked" && fleet.some_block())
                        || (r == "max_attempts" && any_fault);
                    if !true_reason {
                        report.add(
                            "a quarantined row has its true reason",
                            format!(
                                "{} quarantined `{r}`, its true reason: {}",
                                w.event_id,
                                poison.map_or("none (a good row)", |p| p.reason())
                            ),
                        );
                    }
                }
            }
        }
        let replayed = replays.get(w.event_id.as_str()).copied().unwrap_or(0);
        let allowed = 1 + replayed + undone_copies;
        let holders: Vec<&str> = claims_of_row
            .get(&w.id)
            .into_iter()
            .flatten()
            .map(|t| claims[t].owner.as_str())
            .collect();
        // A relay whose acknowledgements were lost (SQS's answers slowed or partly failed) sends
        // copies whatever undoes its settlements: those are the next branch's to judge (seed
        // 14172503877484800111: a partial batch failure, then a keep-rows rule, three copies).
        let held_by_faulted = holders.iter().any(|o| faulted(o));
        if (plan.keeps_rows() || plan.hides_rows()) && got > allowed && !held_by_faulted {
            report.add(
                "settlements that change nothing cost at most one copy per relay",
                format!(
                    "{} received {got} times ({} relay processes, {replayed} replays)",
                    w.event_id, ev.relays_run
                ),
            );
        } else if got > allowed {
            if plan.faults.is_empty() {
                report.add(
                    "a seed without faults delivers every row exactly once",
                    format!(
                        "{} received {got} times, claimed by {}",
                        w.event_id,
                        holders.join(", ")
                    ),
                );
            } else if !holders.iter().any(|o| faulted(o)) {
                report.add(
                    "after faults, copies only of rows a faulted relay held",
                    format!(
                        "{} received {got} times, claimed only by unfaulted {}",
                        w.event_id,
                        holders.join(", ")
                    ),
                );
            }
        }
    }

    // The message itself.
    let committed: HashSet<&str> = written.iter().map(|w| w.event_id.as_str()).collect();
    for m in &ev.received {
        let Some(e) = &m.event_id else { continue };
        // A row of a transaction that rolled back (or a savepoint rolled back to) never
        // existed for anyone but its writer.
        if !committed.contains(e.as_str()) {
            report.add(
                "only committed rows are delivered",
                format!("{e} received on {}, never committed", m.queue),
            );
        }
        let body_event = serde_json::from_str::<serde_json::Value>(&m.body)
            .ok()
            .and_then(|v| v["ev"].as_str().map(str::to_string));
        if body_event.as_deref() != Some(e.as_str()) {
            report.add(
                "a message's body is its row's payload",
                format!(
                    "event_id {e} carried body {}",
                    m.body.chars().take(80).collect::<String>()
                ),
            );
        }
        if queue_of(e) != m.queue {
            report.add(
                "a row reaches its route's queue",
                format!("{e} arrived on {} instead of {}", m.queue, queue_of(e)),
            );
        }
        if fleet.dest.fifo() && m.group_id != m.aggregate_id {
            report.add(
                "a FIFO message's group is its aggregate_id",
                format!(
                    "{e}: group {:?}, aggregate_id {:?}",
                    m.group_id, m.aggregate_id
                ),
            );
        }
    }

    // FIFO order: each group's first deliveries in the documented order.
    if matches!(fleet.dest, Dest::Fifo | Dest::SnsFifo) {
        let ids: HashMap<&str, &Written> =
            written.iter().map(|w| (w.event_id.as_str(), w)).collect();
        let mut seen = HashSet::new();
        let mut last: HashMap<&str, (i64, i64, &str)> = HashMap::new();
        for m in &ev.received {
            let Some(e) = m.event_id.as_deref() else {
                continue;
            };
            let Some(w) = ids.get(e) else { continue };
            // A row quarantined and re-driven by an operator legitimately comes late.
            if !seen.insert(e) || ever_quarantined.contains(&w.id) {
                continue;
            }
            let key = if fleet.order_by_transaction {
                (w.txid, w.id)
            } else {
                (w.id, 0)
            };
            if let Some((a, b, before)) = last.get(w.group.as_str()) {
                if (*a, *b) > key {
                    report.add(
                        "a FIFO group's first deliveries come in the documented order",
                        format!(
                            "group {}: {e} (id {}) arrived after {before}",
                            w.group, w.id
                        ),
                    );
                }
            }
            last.insert(w.group.as_str(), (key.0, key.1, e));
        }
    }

    // With --on-poison block the rest of a group waits behind its poisoned row (docs/ordering.md,
    // "A poisoned head blocks its group"). An operator's `quarantine retry` re-drives rows, so
    // seeds with one are left out.
    let retried = plan.ops.iter().any(|o| o.what == Op::QuarantineRetry);
    if fleet.all_block() && !retried {
        let mut groups: HashMap<(&str, &str), Vec<&Written>> = HashMap::new();
        for w in &written {
            groups
                .entry((queue_of(&w.event_id), w.group.as_str()))
                .or_default()
                .push(w);
        }
        for ((_, group), mut rows) in groups {
            rows.sort_by_key(|w| {
                if fleet.order_by_transaction {
                    (w.txid, w.id)
                } else {
                    (w.id, 0)
                }
            });
            let Some(head) = rows
                .iter()
                .position(|w| ev.poison.contains_key(&w.event_id))
            else {
                continue;
            };
            for w in &rows[head + 1..] {
                if receipts.contains_key(w.event_id.as_str()) {
                    report.add(
                        "with --on-poison block, nothing after a poisoned row of its group is delivered",
                        format!(
                            "group {group}: {} (id {}) delivered behind poisoned {} (id {})",
                            w.event_id, w.id, rows[head].event_id, rows[head].id
                        ),
                    );
                }
            }
        }
    }

    // Never two rows of one group in flight at once.
    if fleet.ordered() {
        let mut by_group: HashMap<(&str, &str), Vec<Lease>> = HashMap::new();
        for (token, claim) in &claims {
            for id in &claim.ids {
                if let Some(w) = by_id.get(id) {
                    by_group
                        .entry((queue_of(&w.event_id), w.group.as_str()))
                        .or_default()
                        .push((claim.inserted_at, claim.live_until(), *token, *id));
                }
            }
        }
        for ((_, group), mut leases) in by_group {
            leases.sort_by(|a, b| a.0.total_cmp(&b.0));
            for (i, a) in leases.iter().enumerate() {
                for b in &leases[i + 1..] {
                    if b.0 >= a.1 {
                        break;
                    }
                    if a.2 != b.2 && a.3 != b.3 {
                        report.add(
                            "never two rows of one group in flight at once",
                            format!(
                                "group {group}: id {} (claim {} of {}) and id {} (claim {} of {}) leased together for {:.0} ms",
                                a.3,
                                a.2,
                                claims[&a.2].owner,
                                b.3,
                                b.2,
                                claims[&b.2].owner,
                                (a.1.min(b.1) - b.0) * 1000.0
                            ),
                        );
                    }
                }
            }
        }
    }

    // Changes to rows, against the claims that held them.
    let relay_apps: HashSet<&str> = claims.values().map(|c| c.owner.as_str()).collect();
    let mut deleted_in: HashMap<i64, Vec<&Claim>> = HashMap::new();
    for claim in claims.values() {
        if let Some(t) = claim.deleted_txid {
            deleted_in.entry(t).or_default().push(claim);
        }
    }
    let inserted_in: HashSet<i64> = claims.values().map(|c| c.inserted_txid).collect();
    // Who claimed in a transaction: a claim's own lease row says it, whatever the session's
    // name (a pooler might not pass `application_name` on).
    let taker_in: HashMap<i64, &str> = claims
        .values()
        .map(|c| (c.inserted_txid, c.owner.as_str()))
        .collect();
    for c in ev.changes.iter().filter(|c| c.is_outbox() && c.op != "I") {
        let id = c.id.unwrap_or_default();
        // A row held by a live claim is changed only by that claim's own transactions.
        for token in claims_of_row.get(&id).into_iter().flatten() {
            let claim = &claims[token];
            if claim.live_at(c.at)
                && claim.deleted_txid != Some(c.txid)
                && claim.inserted_txid != c.txid
            {
                let invariant = if c.new_reason.as_deref() == Some("blocked") {
                    "parking leaves a row a live claim holds alone"
                } else {
                    "a row a live claim holds is changed only by that claim's settlement or takeover"
                };
                report.add(
                    invariant,
                    format!(
                        "id {id} {} by {} while claim {token} of {} held it",
                        describe(c),
                        c.app,
                        claim.owner
                    ),
                );
            }
        }
        let ended = deleted_in.get(&c.txid).map(Vec::as_slice).unwrap_or(&[]);
        // A transaction that deletes claims and leases none is a settlement (its fence deletes
        // only its owner's claims); one that also leases is a claim taking ended claims over.
        let taker = taker_in.get(&c.txid).copied();
        let own = ended
            .iter()
            .any(|k| k.ids.contains(&id) && taker.is_none_or(|t| t == k.owner));
        let taken: Vec<&&Claim> = ended
            .iter()
            .filter(|k| k.ids.contains(&id) && taker.is_some_and(|t| t != k.owner))
            .collect();
        // A relay whose claim was taken over changes nothing: what a relay's session changes
        // outside its claims (parking, retention) leaves sent and attempts alone.
        let parking = c.op == "U"
            && c.old_sent == c.new_sent
            && c.old_attempts == c.new_attempts
            && [&c.old_reason, &c.new_reason]
                .iter()
                .any(|r| matches!(r.as_deref(), Some("blocked" | "destination")));
        let retention = c.op == "D" && c.old_sent == Some(true);
        // A claim quarantines the rows it dooms (too large, out of attempts) without leasing
        // them; when it dooms all it found, it writes no lease row either.
        let doomed = c.op == "U"
            && c.old_reason.is_none()
            && matches!(c.new_reason.as_deref(), Some("too_large" | "max_attempts"))
            && c.old_sent == c.new_sent;
        if relay_apps.contains(c.app.as_str())
            && !own
            && taken.is_empty()
            && !inserted_in.contains(&c.txid)
            && !parking
            && !retention
            && !doomed
        {
            report.add(
                "a relay whose claim was taken over changes nothing",
                format!(
                    "id {id} {} by {} holding no claim of it",
                    describe(c),
                    c.app
                ),
            );
        }
        // Attempts are spent only by a row's own outcomes.
        if c.new_attempts.unwrap_or(0) > c.old_attempts.unwrap_or(0) {
            for k in taken {
                // A relay the server refused to settle for stopped with its claim unsettled,
                // as a killed one does.
                if !ev.faulted_hard.contains(&k.owner) && !ev.undone_by.contains(&k.owner) {
                    report.add(
                        "attempts are spent only by a row's own outcomes",
                        format!(
                            "id {id}: attempt {} counted by {}'s takeover of a claim of {}, which was not faulted",
                            c.new_attempts.unwrap_or(0),
                            taker.unwrap_or("?"),
                            k.owner
                        ),
                    );
                }
            }
        }
    }

    if !ev.pool_leaks.is_empty() {
        report.add(
            "an application session through the pool reads the server's defaults",
            ev.pool_leaks.join("; "),
        );
    }
    if !ev.settled && !kept_named {
        report.add(
            "nothing is left unsent",
            "rows still unsent or leased when the run ended".to_string(),
        );
    }
    if let Some(line) = &ev.undone_named {
        let cause = match (plan.keeps_rows(), plan.hides_rows()) {
            (true, _) => Some("sim_keep_rows"),
            (_, true) => Some("sim_tenant"),
            _ => None,
        };
        match cause {
            None => report.add(
                "settlements are undone only where something undoes them",
                line.clone(),
            ),
            Some(cause) if !line.contains(cause) => report.add(
                "a relay whose settlements change nothing names the cause",
                line.clone(),
            ),
            Some(_) => {}
        }
    }
    if plan.hides_rows() && !ev.settled && !kept_named {
        report.add(
            "a backlog the relay cannot see is reported",
            "rows unsent at the end, and no relay said that row-level security hides them"
                .to_string(),
        );
    }
    if let (Some(line), false) = (&ev.hidden_named, plan.hides_rows()) {
        report.add(
            "row-level security is reported only where it hides rows",
            line.clone(),
        );
    }
    // Started before its database, or again after a kill while the database or the pooler
    // refused logins: a relay waits, it does not exit (issue 37).
    for exit in &ev.startup_exits {
        report.add(
            "a relay waits for its database at start-up, never exits",
            exit.clone(),
        );
    }
    if let Some(q) = &ev.quiet {
        // The gauges refresh every 500 ms; status reads the table when asked.
        let slack = 1.5;
        if q.status_unsent != Some(q.table_unsent)
            || q.status_age.is_none_or(|a| (a - q.table_age).abs() > slack)
        {
            report.add(
                "`status --json` agrees with the table",
                format!(
                    "status unsent {:?}, age {:?}; table {} rows, {:.1} s{}",
                    q.status_unsent,
                    q.status_age,
                    q.table_unsent,
                    q.table_age,
                    q.status_error
                        .as_ref()
                        .map_or(String::new(), |e| format!("; status failed: {e}"))
                ),
            );
        }
        if !q.gauges_agree() {
            report.add(
                "outbox_oldest_unsent_age_seconds and outbox_unsent_rows agree with the table",
                format!(
                    "gauges unsent {:?}, age {:?}; table {} rows, {:.1} s",
                    q.gauge_unsent, q.gauge_age, q.gauge_table_unsent, q.gauge_table_age
                ),
            );
        }
    }
    for exit in &ev.exits {
        report.add("a relay runs until it is stopped", exit.clone());
    }
    signal(plan, ev, &mut report);
    report.into_violations()
}

/// How far the derived age may fall short of the oldest row the picked reading could know
/// of: the relay reports the `created_at` of the lowest unsent id, and a transaction that began
/// earlier may take a higher id a few milliseconds later.
pub const HIDES_SLACK: f64 = 0.25;
/// Rounding and the clock's granularity, beyond the bound's own terms.
pub const OVERSTATES_SLACK: f64 = 0.25;

/// The age a scraper derives from the relays' `/metrics` (the shipped rule: the smallest
/// `time() - outbox_oldest_unsent_timestamp_seconds`, a relay's last scrape kept 2 minutes),
/// against the table at the same moment, at every sample of the run, faults included
/// (docs/guarantees.md section 9, "The age signal"):
///
/// - it never hides a waiting row: at least the age of the oldest unsent row that the picked
///   reading could know of, less [`HIDES_SLACK`];
/// - it overstates by at most the time since the freshest read it derives from began (of
///   the relays that can read the table now, or of all when none can): at most `now -` the
///   oldest `created_at` of the rows unsent now or settled since that read began, plus the
///   time since it began (which bounds the read's own duration), plus [`OVERSTATES_SLACK`].
fn signal(plan: &Plan, ev: &Evidence, report: &mut Report) {
    for s in &ev.signal {
        let (Some(picked), Some(freshest)) = (s.picked(), s.freshest()) else {
            continue;
        };
        let derived = s.at - picked.oldest;
        let shown = || {
            let readings: Vec<String> = s
                .readings
                .iter()
                .map(|r| {
                    format!(
                        "{} oldest t{:+.2} read t{:+.2} up {}{}",
                        r.relay,
                        r.oldest - s.start,
                        r.last_read - s.start,
                        r.up,
                        if s.at - r.scraped > 1.0 {
                            format!(" (scraped {:.1} s before)", s.at - r.scraped)
                        } else {
                            String::new()
                        }
                    )
                })
                .collect();
            format!(
                "seed {} at t+{:.2} s: derived {derived:.2} s, true {} ({} unsent); relays: {}",
                plan.seed,
                s.at - s.start,
                s.truth
                    .map_or("none unsent".to_string(), |c| format!("{:.2} s", s.at - c)),
                s.unsent,
                readings.join(", ")
            )
        };
        // A read begun before a crash of the server saw the relay's last asynchronous
        // commits, which the crash may have lost (docs/operations.md, "The relay's own
        // transactions"): a row they settled or quarantined is unsent again, and the log that
        // would say it was not is lost with them. Until a read after the crash, what the
        // picked read could know of is not known here.
        let crashed_since = ev
            .crashes
            .iter()
            .any(|&crash| picked.last_read < crash && crash < s.at);
        if let Some((created, id)) = s.known.filter(|_| !crashed_since) {
            if derived < s.at - created - HIDES_SLACK {
                report.add(
                    "the age a scraper derives from /metrics never hides a waiting row",
                    format!(
                        "{}; id {id} waits {:.2} s, known to the picked read",
                        shown(),
                        s.at - created
                    ),
                );
            }
        }
        let lower = match (s.truth, s.lower) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let bound = lower.map_or(0.0, |c| (s.at - c).max(0.0))
            + (s.at - freshest.last_read)
            + OVERSTATES_SLACK;
        if derived > bound {
            report.add(
                "the age a scraper derives from /metrics overstates by at most the time since the freshest read it derives from",
                format!("{}; bound {bound:.2} s", shown()),
            );
        }
    }
}

fn describe(c: &Change) -> String {
    match c.op.as_str() {
        "D" => "deleted".to_string(),
        _ if c.new_sent != c.old_sent => format!("marked sent={:?}", c.new_sent),
        _ if c.new_reason != c.old_reason => format!(
            "quarantine {:?} -> {:?}",
            c.old_reason.as_deref().unwrap_or("none"),
            c.new_reason.as_deref().unwrap_or("none")
        ),
        _ => format!(
            "attempts {} -> {}",
            c.old_attempts.unwrap_or(0),
            c.new_attempts.unwrap_or(0)
        ),
    }
}
