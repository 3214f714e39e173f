//! Slots per destination: each destination's requests in flight are held to its controller's
//! limit, and the limit is exported as `outbox_request_concurrency_limit{destination}`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::controller::{Controller, Outcome, Settings};
use super::RequestConcurrency;
use crate::destination::Destination;
use crate::metrics as names;

/// Destinations whose limit is remembered at most: rows may name queues of their own. Past it,
/// the idle ones are forgotten (they start again from one).
const MAX_DESTINATIONS: usize = 1024;

/// The `destination` label of every destination not in the relay's configuration (a row's own
/// `queue_url`): labels stay bounded; the gauge shows the lowest of their limits.
const OTHER: &str = "other";

/// Every destination's slots, one per process.
#[derive(Debug)]
pub struct Limiter {
    mode: RequestConcurrency,
    settings: Settings,
    /// Destinations of the relay's own configuration (`--queue-url`, `--route`, the offload
    /// bucket): each is its own gauge series, and never forgotten.
    configured: Vec<Destination>,
    /// Each destination's share, by the destination itself.
    destinations: Mutex<HashMap<Destination, Arc<Share>>>,
}

/// One destination's share of the requests in flight.
#[derive(Debug)]
struct Share {
    /// Its `destination` label: a queue URL, topic ARN or `s3://bucket`.
    key: String,
    state: Mutex<State>,
    permits: Arc<Semaphore>,
    /// The controller's limit, readable without its lock (for the `other` gauge).
    limit: AtomicUsize,
    configured: bool,
}

#[derive(Debug)]
struct State {
    controller: Controller,
    /// Permits still to take out of circulation after a decrease: those in use when the limit
    /// fell are forgotten as their requests end.
    debt: usize,
}

/// A request's place in its destination's limit; [`Slot::finish`] reports how it went.
/// Dropped unfinished (not sent after all), it frees the place and tells nothing.
#[derive(Debug)]
pub struct Slot<'a> {
    limiter: &'a Limiter,
    held: Option<(Arc<Share>, OwnedSemaphorePermit)>,
}

impl Limiter {
    /// `ceiling`: `--max-in-flight`; `configured`: the relay's own destinations, whose gauges
    /// exist from the start.
    pub fn new(mode: RequestConcurrency, ceiling: usize, configured: Vec<Destination>) -> Limiter {
        let limiter = Limiter {
            mode,
            settings: Settings::new(ceiling),
            configured,
            destinations: Mutex::new(HashMap::new()),
        };
        for key in &limiter.configured {
            let destination = limiter.destination(key);
            limiter.export(&destination);
        }
        limiter
    }

    /// Waits for a slot of `destination` (a queue, topic or the offload bucket).
    pub async fn acquire(&self, destination: &Destination) -> Slot<'_> {
        if self.mode == RequestConcurrency::Fixed {
            return Slot {
                limiter: self,
                held: None,
            };
        }
        let destination = self.destination(destination);
        let permit = Arc::clone(&destination.permits)
            .acquire_owned()
            .await
            .expect("never closed");
        destination
            .state
            .lock()
            .expect("limiter lock")
            .controller
            .started();
        Slot {
            limiter: self,
            held: Some((destination, permit)),
        }
    }

    fn destination(&self, key: &Destination) -> Arc<Share> {
        let mut destinations = self.destinations.lock().expect("limiter lock");
        if let Some(d) = destinations.get(key) {
            return Arc::clone(d);
        }
        if destinations.len() >= MAX_DESTINATIONS {
            // A destination with a slot in use is held by that slot too.
            destinations.retain(|_, d| d.configured || Arc::strong_count(d) > 1);
        }
        let controller = Controller::new(self.settings);
        let limit = match self.mode {
            RequestConcurrency::Adaptive => controller.limit(),
            RequestConcurrency::Fixed => self.settings.ceiling,
        };
        let d = Arc::new(Share {
            key: key.to_string(),
            permits: Arc::new(Semaphore::new(limit)),
            limit: AtomicUsize::new(limit),
            configured: self.configured.contains(key),
            state: Mutex::new(State {
                controller,
                debt: 0,
            }),
        });
        destinations.insert(key.clone(), Arc::clone(&d));
        d
    }

    fn export(&self, destination: &Share) {
        if destination.configured {
            let limit = destination.limit.load(Ordering::Relaxed);
            metrics::gauge!(names::REQUEST_CONCURRENCY_LIMIT, "destination" => destination.key.clone())
                .set(limit as f64);
            return;
        }
        let lowest = self
            .destinations
            .lock()
            .expect("limiter lock")
            .values()
            .filter(|d| !d.configured)
            .map(|d| d.limit.load(Ordering::Relaxed))
            .min();
        if let Some(lowest) = lowest {
            metrics::gauge!(names::REQUEST_CONCURRENCY_LIMIT, "destination" => OTHER)
                .set(lowest as f64);
        }
    }
}

impl Slot<'_> {
    /// The request ended with `outcome`: the controller adjusts the destination's limit.
    pub fn finish(mut self, outcome: Outcome) {
        self.release(outcome);
    }

    fn release(&mut self, outcome: Outcome) {
        let Some((destination, permit)) = self.held.take() else {
            return;
        };
        let changed = {
            let mut state = destination.state.lock().expect("limiter lock");
            let before = state.controller.limit();
            let changed = state.controller.finished(outcome, Instant::now());
            if let Some(after) = changed {
                if after > before {
                    let raise = after - before;
                    let repaid = raise.min(state.debt);
                    state.debt -= repaid;
                    destination.permits.add_permits(raise - repaid);
                } else {
                    let cut = before - after;
                    let forgotten = destination.permits.forget_permits(cut);
                    state.debt += cut - forgotten;
                }
            }
            if state.debt > 0 {
                state.debt -= 1;
                permit.forget();
            } else {
                drop(permit);
            }
            changed
        };
        if let Some(limit) = changed {
            destination.limit.store(limit, Ordering::Relaxed);
            self.limiter.export(&destination);
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.release(Outcome::Unmeasured);
    }
}
