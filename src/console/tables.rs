//! What the console reads: every selected table's `status` (the relays' own statement, seeking
//! from their published floors) and its parked destinations, at most once per refresh interval
//! however many pages are open, and the sent-per-minute of each table as the console saw it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::command::{open, selected_tables, Failure};
use crate::config::DatabaseConfig;
use crate::outbox::{
    worse_first, Outbox, ParkedDestination, Purpose, TableName, TableReport, TableStatus,
};

/// How many parked destinations a table lists.
const PARKED_SHOWN: i64 = 20;

/// How long the sent-per-minute history reaches back.
pub const HISTORY: Duration = Duration::from_secs(3600);

/// One table as the overview shows it.
#[derive(Debug, Clone)]
pub struct TableView {
    /// The table's quoted name: its key in the console's links.
    pub key: String,
    pub report: TableReport,
    pub parked: Vec<ParkedDestination>,
    /// (seconds ago, rows sent in the minute before), oldest first.
    pub sent_per_minute: Vec<(u64, i64)>,
}

impl TableView {
    pub fn status(&self) -> Option<&TableStatus> {
        match &self.report {
            TableReport::Read(status) => Some(status),
            TableReport::Failed { .. } => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Overview {
    pub read_at: SystemTime,
    /// Worst first.
    pub tables: Vec<TableView>,
    /// Why the selection itself could not be read (no database, a pattern matching nothing).
    pub error: Option<String>,
}

struct Cache {
    read: Option<(Instant, Arc<Overview>)>,
    /// Per table: when the console read its status, and `sent_last_minute` then.
    history: HashMap<String, VecDeque<(Instant, i64)>>,
}

pub struct Tables {
    db: DatabaseConfig,
    refresh: Duration,
    /// Held across a refresh, so that pages opened meanwhile wait for it rather than start
    /// their own: one `status` per table per interval.
    cache: tokio::sync::Mutex<Cache>,
    /// The outbox of each table the last overview listed; apart from the cache, so that a
    /// page of one table does not wait for a refresh of every table to finish.
    outboxes: std::sync::Mutex<HashMap<String, Arc<Outbox>>>,
}

impl Tables {
    pub fn new(db: DatabaseConfig, refresh: Duration) -> Tables {
        Tables {
            db,
            refresh,
            cache: tokio::sync::Mutex::new(Cache {
                read: None,
                history: HashMap::new(),
            }),
            outboxes: std::sync::Mutex::new(HashMap::new()),
        }
    }

    pub fn refresh(&self) -> Duration {
        self.refresh
    }

    /// Every table's figures, read again when the last read is older than the interval.
    pub async fn overview(&self) -> Arc<Overview> {
        let mut cache = self.cache.lock().await;
        if let Some((at, overview)) = &cache.read {
            if at.elapsed() < self.refresh {
                return Arc::clone(overview);
            }
        }
        let overview = Arc::new(self.read(&mut cache).await);
        cache.read = Some((Instant::now(), Arc::clone(&overview)));
        overview
    }

    /// The outbox of a table the overview listed; `None` for any other name.
    pub async fn outbox(&self, key: &str) -> Option<Arc<Outbox>> {
        if let Some(outbox) = self.known(key) {
            return Some(outbox);
        }
        // A link followed before the first overview (a bookmark) reads the selection first.
        self.overview().await;
        self.known(key)
    }

    fn known(&self, key: &str) -> Option<Arc<Outbox>> {
        self.outboxes
            .lock()
            .expect("outboxes lock")
            .get(key)
            .cloned()
    }

    async fn read(&self, cache: &mut Cache) -> Overview {
        let names = match self.names().await {
            Ok(names) => names,
            Err(failure) => {
                return Overview {
                    read_at: SystemTime::now(),
                    tables: Vec::new(),
                    error: Some(failure.to_string()),
                }
            }
        };
        let mut tables = Vec::with_capacity(names.len());
        for name in &names {
            let key = name.quoted();
            let outbox = match self.known(&key) {
                Some(outbox) => Ok(outbox),
                None => open(&self.db.for_table(name), Purpose::Admin)
                    .await
                    .map(Arc::new),
            };
            metrics::counter!(super::TABLE_READS).increment(1);
            let read = match outbox {
                Ok(outbox) => {
                    self.outboxes
                        .lock()
                        .expect("outboxes lock")
                        .insert(key.clone(), Arc::clone(&outbox));
                    read_table(&outbox).await
                }
                Err(failure) => Err(failure.to_string()),
            };
            let (report, parked) = match read {
                Ok((status, parked)) => (TableReport::Read(status), parked),
                Err(error) => (
                    TableReport::Failed {
                        table: key.clone(),
                        error,
                    },
                    Vec::new(),
                ),
            };
            let history = cache.history.entry(key.clone()).or_default();
            if let TableReport::Read(status) = &report {
                history.push_back((Instant::now(), status.sent_last_minute));
            }
            while history
                .front()
                .is_some_and(|(at, _)| at.elapsed() > HISTORY)
            {
                history.pop_front();
            }
            let sent_per_minute = history
                .iter()
                .map(|(at, n)| (at.elapsed().as_secs(), *n))
                .collect();
            tables.push(TableView {
                key,
                report,
                parked,
                sent_per_minute,
            });
        }
        // Tables gone from the selection are forgotten with their history.
        let keys: Vec<String> = tables.iter().map(|t| t.key.clone()).collect();
        self.outboxes
            .lock()
            .expect("outboxes lock")
            .retain(|k, _| keys.contains(k));
        cache.history.retain(|k, _| keys.contains(k));
        tables.sort_by(|a, b| worse_first(&a.report, &b.report));
        Overview {
            read_at: SystemTime::now(),
            tables,
            error: None,
        }
    }

    async fn names(&self) -> Result<Vec<TableName>, Failure> {
        match self.db.selection.single() {
            Some(one) => Ok(vec![one.clone()]),
            None => selected_tables(&self.db, Purpose::Admin).await,
        }
    }
}

async fn read_table(outbox: &Outbox) -> Result<(TableStatus, Vec<ParkedDestination>), String> {
    let status = outbox.status().await.map_err(|e| e.to_string())?;
    let parked = if status.quarantined_by_reason.contains_key("destination") {
        outbox
            .parked_destinations(PARKED_SHOWN)
            .await
            .map_err(|e| e.to_string())?
    } else {
        Vec::new()
    };
    Ok((status, parked))
}
