//! Where the relays' database connections spend a drain: pg_stat_activity sampled every
//! 20 ms. A connection that is mostly idle waits on the relay (or the queue); one that is
//! mostly active is the limit, and the statement it runs says which part of the work costs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::support::TestDb;

const INTERVAL: Duration = Duration::from_millis(20);

pub struct Sampler {
    /// Set by [`Sampler::finish`]; the sampling task ends at its next tick.
    stop: Arc<AtomicBool>,
    /// The sampling task; it returns what it counted.
    task: JoinHandle<Activity>,
}

/// Samples over every relay connection that runs statements (the LISTEN connection is left
/// out: it is idle by design): per state (`claim`, `mark sent`, … while active, or `idle`), and
/// per wait event type while active (`IO`, `Lock`, `LWLock`, …; none means on a CPU, or
/// waiting for one).
#[derive(Debug, Default, Clone)]
pub struct Activity {
    /// Samples per state (`claim`, `mark sent`, `idle`, …).
    pub samples: BTreeMap<String, u64>,
    /// Samples per wait event type while active (`IO`, `Lock`, `LWLock`, …).
    pub waits: BTreeMap<String, u64>,
}

impl Activity {
    pub fn total(&self) -> u64 {
        self.samples.values().sum()
    }

    fn share_of(&self, n: u64) -> f64 {
        match self.total() {
            0 => 0.0,
            total => n as f64 / total as f64,
        }
    }

    /// Share of samples in which a connection ran a statement.
    pub fn busy(&self) -> f64 {
        let idle: u64 = self
            .samples
            .iter()
            .filter(|(state, _)| !ACTIVE.contains(&state.as_str()))
            .map(|(_, n)| n)
            .sum();
        1.0 - self.share_of(idle)
    }

    /// E.g. `claim 47%, mark sent 31%, idle 19%; waiting: IO 3%`, largest first.
    pub fn summary(&self) -> String {
        let ranked = |map: &BTreeMap<String, u64>| {
            let mut v: Vec<(&String, &u64)> = map.iter().collect();
            v.sort_by(|a, b| b.1.cmp(a.1));
            v.iter()
                .map(|(k, n)| format!("{k} {:.0}%", self.share_of(**n) * 100.0))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut text = ranked(&self.samples);
        if !self.waits.is_empty() {
            text.push_str("; waiting: ");
            text.push_str(&ranked(&self.waits));
        }
        text
    }
}

/// States in which the connection runs one of the relay's statements.
const ACTIVE: &[&str] = &[
    "claim",
    "mark sent",
    "stats",
    "reschedule",
    "other statement",
];

impl Sampler {
    pub async fn start(db: &TestDb) -> Sampler {
        let client = db.client().await;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let mut activity = Activity::default();
            let statement = client
                .prepare(
                    "SELECT state, coalesce(wait_event_type, ''), query \
                     FROM pg_stat_activity \
                     WHERE datname = current_database() AND application_name = 'outbox-relay' \
                       AND backend_type = 'client backend' AND query NOT LIKE 'LISTEN%'",
                )
                .await
                .expect("prepare the activity sample");
            let mut tick = tokio::time::interval(INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            while !stopped.load(Ordering::Relaxed) {
                tick.tick().await;
                let Ok(rows) = client.query(&statement, &[]).await else {
                    break;
                };
                for row in rows {
                    let state: Option<String> = row.get(0);
                    let wait: String = row.get(1);
                    let query: Option<String> = row.get(2);
                    let key = match state.as_deref() {
                        Some("active") => {
                            // A wait other than on the client says the statement was held up.
                            if !wait.is_empty() && !wait.starts_with("Client") {
                                *activity.waits.entry(wait).or_insert(0) += 1;
                            }
                            classify(query.as_deref().unwrap_or(""))
                        }
                        Some(other) => other,
                        None => "unknown",
                    };
                    *activity.samples.entry(key.to_string()).or_insert(0) += 1;
                }
            }
            activity
        });
        Sampler { stop, task }
    }

    pub async fn finish(self) -> Activity {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

/// Which of the relay's statements a query text is (sql/*.sql). pg_stat_activity keeps only
/// the first 1 KiB of a query, so each is told by text near its start: the claims by the
/// opening comments of their sql/claim_*.sql (their CTEs start after the first 1 KiB).
fn classify(query: &str) -> &'static str {
    const CLAIM_OPENINGS: &[&str] = &[
        "-- Up to $1 claimable rows",
        "-- Fair claiming:",
        "-- Ordered delivery:",
    ];
    if CLAIM_OPENINGS.iter().any(|o| query.contains(o))
        || query.contains("candidates AS")
        || query.contains("SET lease_owner = $2")
    {
        "claim"
    } else if query.contains("SET sent_at = now()") {
        "mark sent"
    } else if query.contains("coalesce((SELECT greatest") {
        "stats"
    } else if query.contains("make_interval(secs => u.delay)") {
        "reschedule"
    } else {
        "other statement"
    }
}
