//! The fault schedule: each fault at its time, undone when it has a duration, and which
//! relays it touched (the checker allows what a faulted relay may cause, no more).

use super::*;

/// Which relay ids a fault touched, and what was injected.
#[derive(Default)]
pub(super) struct Marks {
    pub(super) hard: HashSet<String>,
    pub(super) soft: HashSet<String>,
    pub(super) injected: Vec<&'static str>,
    pub(super) sqs_errors: bool,
    /// When the server was killed (immediate shutdown), seconds since the epoch.
    pub(super) crashes: Vec<f64>,
}

pub(super) async fn inject(
    timed: Timed<Fault>,
    start: Instant,
    fleet: &Mutex<Fleet>,
    marks: &Mutex<Marks>,
    sqs_proxy: &FaultProxy,
    cluster: &PrivatePg,
    db_url: &str,
) {
    tokio::time::sleep_until((start + Duration::from_millis(timed.at_ms)).into()).await;
    marks.lock().unwrap().injected.push(timed.what.kind());
    let current = |i: usize| fleet.lock().unwrap().ids[i].clone();
    let all = || fleet.lock().unwrap().ids.clone();
    match timed.what {
        Fault::Kill { relay, down_ms } => {
            let id = current(relay);
            marks.lock().unwrap().hard.insert(id);
            if let Some(p) = fleet.lock().unwrap().slots[relay].take() {
                p.kill9();
            }
            tokio::time::sleep(Duration::from_millis(down_ms)).await;
            // Another fault's restart may have put a process in the slot meanwhile: replacing it
            // kills it (its drop), so it counts as killed too.
            let replaced = {
                let mut f = fleet.lock().unwrap();
                let old = f.slots[relay].as_ref().map(|p| p.name().to_string());
                f.spawn(relay);
                old
            };
            if let Some(id) = replaced {
                marks.lock().unwrap().hard.insert(id);
            }
        }
        Fault::Stop { relay, ms } => {
            let id = current(relay);
            marks.lock().unwrap().hard.insert(id.clone());
            if let Some(p) = &fleet.lock().unwrap().slots[relay] {
                p.sigstop();
            }
            tokio::time::sleep(Duration::from_millis(ms)).await;
            let f = fleet.lock().unwrap();
            // A relay killed and restarted meanwhile is another process.
            if f.ids[relay] == id {
                if let Some(p) = &f.slots[relay] {
                    p.sigcont();
                }
            }
        }
        Fault::PgRestart { immediate } => {
            let ids = all();
            marks.lock().unwrap().hard.extend(ids);
            if immediate {
                marks
                    .lock()
                    .unwrap()
                    .crashes
                    .push(super::signal::unix_now());
                cluster.kill_immediate().await;
                cluster.start_again().await;
            } else {
                cluster.restart().await;
            }
        }
        Fault::Dark { relay } => {
            let id = current(relay);
            marks.lock().unwrap().hard.insert(id);
            fleet.lock().unwrap().proxies[relay].blackhole_existing();
        }
        Fault::SlowClaims { sleep_ms, ms } => {
            // The server is slow, no relay is cut off: nobody counts as faulted.
            if let Some(c) = own_session(db_url).await {
                let _ = history::set_claim_sleep(&c, sleep_ms).await;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let deadline = Instant::now() + Duration::from_secs(60);
                let mut c = Some(c);
                // A database restart meanwhile ends this session: set it back on a new one.
                loop {
                    if let Some(session) = &c {
                        if history::set_claim_sleep(session, 0).await.is_ok() {
                            break;
                        }
                    }
                    if Instant::now() >= deadline {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    c = own_session(db_url).await;
                }
            }
        }
        Fault::SlowDb {
            relay,
            delay_ms,
            ms,
        } => slow_link(fleet, marks, relay, (delay_ms, ms), TcpProxy::set_delay).await,
        Fault::SlowAnswers {
            relay,
            delay_ms,
            ms,
        } => {
            slow_link(
                fleet,
                marks,
                relay,
                (delay_ms, ms),
                TcpProxy::set_answer_delay,
            )
            .await
        }
        Fault::Sqs { fault, ms } => {
            let mode = match fault {
                SqsFault::Error500 => {
                    marks.lock().unwrap().sqs_errors = true;
                    Mode::Error500
                }
                SqsFault::Throttle => Mode::Throttle,
                SqsFault::Slow(d) => {
                    let ids = all();
                    marks.lock().unwrap().soft.extend(ids);
                    Mode::Delay(Duration::from_millis(d))
                }
                SqsFault::PartialFailure => {
                    // Every relay sending meanwhile may have a row its answer lost.
                    let ids = all();
                    let mut m = marks.lock().unwrap();
                    m.soft.extend(ids);
                    m.sqs_errors = true;
                    Mode::FailLastEntry
                }
            };
            let before = fleet.lock().unwrap().incarnations.clone();
            sqs_proxy.set_mode(mode);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            sqs_proxy.set_mode(Mode::Pass);
            if matches!(fault, SqsFault::Slow(_) | SqsFault::PartialFailure) {
                // Relays started again meanwhile (after a kill -9) sent through it too.
                let f = fleet.lock().unwrap();
                let mut m = marks.lock().unwrap();
                for (i, (&then, &now)) in before.iter().zip(&f.incarnations).enumerate() {
                    m.soft.extend((then..=now).map(|k| relay_id(i, k)));
                }
            }
        }
    }
}

/// Relay `relay`'s link to the database slowed by `set` (`delay_ms` more, for `ms`): the relay
/// gives up on round trips the server completed, so it counts as cut off, as by a dark link,
/// and so does a relay restarted meanwhile, which went through the slow link too.
async fn slow_link(
    fleet: &Mutex<Fleet>,
    marks: &Mutex<Marks>,
    relay: usize,
    (delay_ms, ms): (u64, u64),
    set: fn(&TcpProxy, Duration),
) {
    let id = fleet.lock().unwrap().ids[relay].clone();
    marks.lock().unwrap().hard.insert(id);
    set(
        &fleet.lock().unwrap().proxies[relay],
        Duration::from_millis(delay_ms),
    );
    tokio::time::sleep(Duration::from_millis(ms)).await;
    let f = fleet.lock().unwrap();
    set(&f.proxies[relay], Duration::ZERO);
    marks.lock().unwrap().hard.insert(f.ids[relay].clone());
}
