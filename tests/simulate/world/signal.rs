//! The age signal while the relays run (issue 45): every [`EVERY`], through whatever faults are
//! on, every relay's `/metrics` is scraped and the table is read on the simulation's own
//! connection right after, so that the checker can compare what a scraper derives with the
//! truth at (nearly) one moment. It judges nothing itself (check.rs does).
//!
//! The scraper is the shipped rule's: `min (time() - last_over_time(
//! outbox_oldest_unsent_timestamp_seconds[2m]))` over the relays that can read the table now
//! (`outbox_table_up` 1 in this scrape), over all of them when none can, so a relay that cannot
//! be scraped now (killed, stopped) keeps its last scraped reading, as in Prometheus, but
//! counts only while no relay reads. The table's
//! side is computed in one statement given the two reads the bounds depend on (the reading the
//! rule picks, and the freshest), from the table and the trigger log with its commit times
//! (`track_commit_timestamp`).

use super::*;

/// How often a sample is taken.
const EVERY: Duration = Duration::from_millis(250);
/// A scrape that takes longer failed (a stopped relay accepts the connection and never answers).
const SCRAPE_TIMEOUT: Duration = Duration::from_millis(300);
/// A reading scraped less than this before the table's read is of this sample (a sample
/// scrapes every relay first, each within [`SCRAPE_TIMEOUT`]).
const SCRAPED_NOW: f64 = 1.0;
/// How long a scraped reading stands for a relay that cannot be scraped (the rules'
/// `last_over_time(...[2m])`).
const KEPT: f64 = 120.0;

/// One relay's reading, as last scraped.
#[derive(Clone, Debug, Default)]
pub struct Reading {
    /// The relay id (its process).
    pub relay: String,
    /// `outbox_oldest_unsent_timestamp_seconds`.
    pub oldest: f64,
    /// `outbox_table_last_read_timestamp_seconds`: when the read behind `oldest` began.
    pub last_read: f64,
    /// `outbox_table_up`.
    pub up: f64,
    /// When it was scraped (seconds since the epoch); older than the sample when the relay
    /// could not be scraped then.
    pub scraped: f64,
}

/// The table and every relay's reading at one moment.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// Seconds since the epoch, the database's `now()` of the table's read (the same host's
    /// clock as the relays').
    pub at: f64,
    /// Seconds since the epoch when the relays started (for `t+` in reports).
    pub start: f64,
    /// The readings a scraper has now (scraped now, or within [`KEPT`]).
    pub readings: Vec<Reading>,
    /// The oldest unsent row's `created_at` (parked rows included), and how many are unsent.
    pub truth: Option<f64>,
    pub unsent: i64,
    /// Of the unsent rows the rule's pick (the reading with the newest `oldest`) could know
    /// of, the oldest: `(created_at, id)`. A row it could know of became unsent (inserted,
    /// replayed, re-driven, unparked) in a transaction committed before that read began, and,
    /// where it may have done so below the relay's floor (made unsent again after its insert,
    /// which a relay may have claimed and passed; or a row of a higher id committed before
    /// it: docs/guarantees.md section 12), also a whole sweep gap before.
    pub known: Option<(f64, i64)>,
    /// The oldest `created_at` of the rows unsent now or sent, deleted or quarantined for good
    /// in a transaction committed after the freshest read began: no row unsent at that read
    /// is older.
    pub lower: Option<f64>,
}

impl Sample {
    /// What the rule derives: the smallest age (the newest `oldest`) over the readings of the
    /// relays that can read the table now, scraped in this sample with `outbox_table_up` 1;
    /// over every reading when there is none.
    pub fn picked(&self) -> Option<&Reading> {
        self.read_by_rule()
            .max_by(|a, b| a.oldest.total_cmp(&b.oldest))
    }

    /// The latest read among those the rule reads. Not the latest of all: a relay stopped
    /// (SIGSTOP) for less than its reads take to be overdue wakes with `outbox_table_up` 1 and
    /// its reading from before the stop, which the rule prefers over the fresher readings of
    /// relays that lost the database meanwhile (seed 505906779503356568).
    pub fn freshest(&self) -> Option<&Reading> {
        self.read_by_rule()
            .max_by(|a, b| a.last_read.total_cmp(&b.last_read))
    }

    /// The readings the rule derives from: those scraped in this sample with
    /// `outbox_table_up` 1; every reading when there is none.
    fn read_by_rule(&self) -> impl Iterator<Item = &Reading> {
        let reading_now = |r: &Reading| r.up == 1.0 && self.at - r.scraped < SCRAPED_NOW;
        let any_now = self.readings.iter().any(reading_now);
        self.readings
            .iter()
            .filter(move |r| !any_now || reading_now(r))
    }
}

/// The table's side of a sample: `$1` the picked reading's read, `$2` the freshest read,
/// `$3` how long after its commit a row that may be below a floor waits to be known (a sweep
/// gap and a statistics pass).
const TRUTH_SQL: &str = "
WITH unsent AS (
    SELECT id, extract(epoch FROM created_at)::float8 AS created
    FROM public.outbox
    WHERE sent_at IS NULL
      AND (quarantined_at IS NULL OR quarantine_reason IN ('blocked', 'destination'))
), log AS (
    SELECT id, op, created, old_sent, new_sent, old_reason, new_reason,
           extract(epoch FROM pg_xact_commit_timestamp(((txid % 4294967296)::text)::xid))::float8
               AS committed
    FROM sim.log
    WHERE tbl = 'outbox'
), inserted AS (
    SELECT id, committed AS born,
           min(committed) OVER (ORDER BY id DESC ROWS BETWEEN UNBOUNDED PRECEDING
                                                  AND 1 PRECEDING) AS above
    FROM log
    WHERE op = 'I'
), since AS (
    SELECT id, max(committed) AS since
    FROM log
    WHERE op = 'I'
       OR (op = 'U' AND NOT new_sent AND new_reason IS NULL
           AND (old_sent OR old_reason IS NOT NULL))
    GROUP BY id
), known AS (
    SELECT u.id, u.created
    FROM unsent u
    JOIN since s USING (id)
    JOIN inserted i USING (id)
    -- Inserted above every floor (before any higher id committed), or a sweep's wait ago: a row
    -- made unsent again by an update (a replay, a re-drive, an unpark) may lie below a floor
    -- that passed it when it was sent, whatever was inserted since.
    WHERE s.since < $1::float8 - 0.05
      AND ((s.since <= i.born AND (i.above IS NULL OR s.since <= i.above))
           OR s.since + $3::float8 < $1::float8)
), gone AS (
    SELECT created
    FROM log
    WHERE committed > $2::float8 - 0.05
      AND NOT old_sent
      AND (old_reason IS NULL OR old_reason IN ('blocked', 'destination'))
      AND (op = 'D'
           OR (op = 'U' AND (new_sent OR new_reason NOT IN ('blocked', 'destination'))))
)
SELECT extract(epoch FROM now())::float8,
       (SELECT min(created) FROM unsent),
       (SELECT count(*) FROM unsent),
       k.created, k.id,
       (SELECT min(created) FROM gone)
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (SELECT created, id FROM known ORDER BY created, id LIMIT 1) k ON true";

/// Samples until `stop`; `late_wait` is `$3` of [`TRUTH_SQL`].
pub(super) async fn sample(
    fleet: &Mutex<Fleet>,
    db_url: &str,
    late_wait: Duration,
    stop: &std::sync::atomic::AtomicBool,
) -> Vec<Sample> {
    let start = unix_now();
    let mut samples = Vec::new();
    let mut addrs: HashMap<String, String> = HashMap::new();
    let mut last: HashMap<String, Reading> = HashMap::new();
    let mut client: Option<Client> = None;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let next = Instant::now() + EVERY;
        // The relays running now, by the address their output named.
        let running: Vec<(String, String)> = {
            let f = fleet.lock().unwrap();
            f.slots
                .iter()
                .flatten()
                .filter_map(|p| {
                    let name = p.name().to_string();
                    if !addrs.contains_key(&name) {
                        let addr = p
                            .output()
                            .lines()
                            .find_map(crate::support::parse_metrics_addr)?;
                        addrs.insert(name.clone(), addr);
                    }
                    Some((name.clone(), addrs[&name].clone()))
                })
                .collect()
        };
        let scraped = futures_util::future::join_all(running.iter().map(|(name, addr)| async {
            let body = tokio::time::timeout(SCRAPE_TIMEOUT, observe::http_get_metrics(addr))
                .await
                .ok()
                .flatten()?;
            let value = |series: &str| crate::support::metric_value(&body, series);
            Some(Reading {
                relay: name.clone(),
                oldest: value("outbox_oldest_unsent_timestamp_seconds")?,
                last_read: value("outbox_table_last_read_timestamp_seconds")?,
                up: value("outbox_table_up").unwrap_or(0.0),
                scraped: unix_now(),
            })
        }))
        .await;
        for r in scraped.into_iter().flatten() {
            last.insert(r.relay.clone(), r);
        }
        let now = unix_now();
        let readings: Vec<Reading> = last
            .values()
            .filter(|r| now - r.scraped <= KEPT)
            .cloned()
            .collect();
        let mut sample = Sample {
            start,
            readings,
            ..Sample::default()
        };
        // Without a reading (no relay has read the table yet) the rule has no series and the
        // check nothing to compare; the table is still read, for the run's summary.
        let params = (
            sample.picked().map_or(0.0, |r| r.last_read),
            sample.freshest().map_or(0.0, |r| r.last_read),
            late_wait.as_secs_f64(),
        );
        if client.is_none() {
            client = own_session(db_url).await;
        }
        if let Some(c) = &client {
            match c
                .query_one(TRUTH_SQL, &[&params.0, &params.1, &params.2])
                .await
            {
                Ok(row) => {
                    sample.at = row.get(0);
                    sample.truth = row.get(1);
                    sample.unsent = row.get(2);
                    let known: Option<f64> = row.get(3);
                    let id: Option<i64> = row.get(4);
                    sample.known = known.zip(id);
                    sample.lower = row.get(5);
                    samples.push(sample);
                }
                // The database restarting: no truth to compare with until it is back.
                Err(_) => client = None,
            }
        }
        tokio::time::sleep_until(next.into()).await;
    }
    samples
}

pub(super) fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
