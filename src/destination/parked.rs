//! Which destinations (queues, topics, the offload bucket) are refusing us, and until when their rows wait.
//!
//! A failure that belongs to one queue (missing, access denied, its KMS key) must hold only
//! that queue's rows: the relay parks them (quarantined with reason `destination`, available
//! again when the queue's park ends) and every other queue keeps flowing. Each queue has its own
//! capped exponential back-off with full jitter, reset by the first request that reaches it.
//! No I/O here; time and the random draw are parameters, so the rules are unit-tested.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Destination;
use crate::retry;

/// The queues that refused us lately, one process's view. Replicas keep their own: the shared
/// schedule is the parked rows' `available_at` in the table.
#[derive(Debug)]
pub struct Destinations {
    /// Queues of the relay's own configuration (`--queue-url`, `--route`): while one of them is
    /// refused the relay is not ready. A row's own `queue_url` is the application's data and
    /// only parks that row.
    configured: Vec<Destination>,
    /// `--retry-base`: the first park's ceiling.
    base: Duration,
    /// `--retry-max`: no park is longer.
    cap: Duration,
    /// Each refusing destination's back-off, keyed by the destination itself.
    state: Mutex<HashMap<Destination, Refused>>,
}

#[derive(Debug, Clone)]
struct Refused {
    /// Parks so far without a request getting through, for the back-off.
    parks: u32,
    /// Its rows wait until then.
    until: Instant,
    /// What it last said.
    error: String,
}

/// A queue's rows wait until `until`; `error` is what the queue last said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Park {
    /// The destination is not asked again before then.
    pub until: Instant,
    /// What it last said, for the rows' `last_error`.
    pub error: String,
    /// This failure started the park (log it once); otherwise it joined one already running,
    /// like the other requests that were in flight to the same queue.
    pub started: bool,
    /// The queue is one of the relay's own: its refusal makes the relay not ready.
    pub configured: bool,
}

impl Park {
    /// How long from `now` until the queue is tried again.
    pub fn remaining(&self, now: Instant) -> Duration {
        self.until.saturating_duration_since(now)
    }
}

impl Destinations {
    /// `configured`: the queues whose refusal fails readiness; `base` and `cap` shape each
    /// queue's back-off (`--retry-base`, `--retry-max`).
    pub fn new(configured: Vec<Destination>, base: Duration, cap: Duration) -> Self {
        Destinations {
            configured,
            base,
            cap,
            state: Mutex::new(HashMap::new()),
        }
    }

    fn is_configured(&self, destination: &Destination) -> bool {
        self.configured.iter().any(|q| q == destination)
    }

    /// The park a queue is in at `now`, if any: its rows are parked without a request.
    pub fn parked(&self, destination: &Destination, now: Instant) -> Option<Park> {
        let state = self.state.lock().expect("destinations lock");
        let refused = state.get(destination).filter(|r| r.until > now)?;
        Some(Park {
            until: refused.until,
            error: refused.error.clone(),
            started: false,
            configured: self.is_configured(destination),
        })
    }

    /// `queue_url` refused a request at `now`. Starts a park one back-off step longer than the
    /// last (`jitter` is the draw in `[0, 1)`), or joins the park already running: requests in
    /// flight together fail together, and count as one.
    pub fn refused(
        &self,
        destination: &Destination,
        error: &str,
        now: Instant,
        jitter: f64,
    ) -> Park {
        let mut state = self.state.lock().expect("destinations lock");
        // Forget queues nobody has sent to for a while (a row's mistyped URL), so the map
        // holds what is failing now, not every URL ever refused.
        let forget_after = self.cap.saturating_mul(4);
        state.retain(|url, r| {
            self.is_configured(url) || now.saturating_duration_since(r.until) < forget_after
        });
        let configured = self.is_configured(destination);
        if let Some(r) = state.get_mut(destination).filter(|r| r.until > now) {
            r.error = error.to_string();
            return Park {
                until: r.until,
                error: r.error.clone(),
                started: false,
                configured,
            };
        }
        let parks = state
            .get(destination)
            .map_or(0, |r| r.parks)
            .saturating_add(1);
        let until = now + retry::backoff(parks, self.base, self.cap, jitter);
        state.insert(
            destination.clone(),
            Refused {
                parks,
                until,
                error: error.to_string(),
            },
        );
        Park {
            until,
            error: error.to_string(),
            started: true,
            configured,
        }
    }

    /// A request reached `queue_url`: its back-off starts afresh. Returns whether it had been
    /// refused.
    pub fn reached(&self, destination: &Destination) -> bool {
        let mut state = self.state.lock().expect("destinations lock");
        state.remove(destination).is_some()
    }

    /// Why the relay is not ready because of its own destinations: the first configured queue still
    /// refused (its last error), or `None`.
    pub fn readiness_error(&self) -> Option<String> {
        let state = self.state.lock().expect("destinations lock");
        self.configured.iter().find_map(|url| {
            state
                .get(url)
                .map(|r| format!("{} {url} refused: {}", url.noun(), r.error))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(url: &str) -> Destination {
        Destination::parse(url).expect("a queue URL")
    }

    fn default() -> Destination {
        queue("http://sqs/1/orders")
    }

    fn other() -> Destination {
        queue("http://sqs/1/billing")
    }

    fn destinations() -> Destinations {
        Destinations::new(
            vec![default()],
            Duration::from_secs(1),
            Duration::from_secs(60),
        )
    }

    #[test]
    fn a_refused_queue_is_parked_alone_and_a_request_that_reaches_it_ends_the_park() {
        let d = destinations();
        let now = Instant::now();
        let park = d.refused(&other(), "QueueDoesNotExist: gone", now, 0.5);
        assert!(park.started);
        assert!(!park.configured);
        assert_eq!(park.remaining(now), Duration::from_millis(500));
        assert_eq!(
            d.parked(&other(), now),
            Some(Park {
                started: false,
                ..park.clone()
            })
        );
        assert_eq!(d.parked(&default(), now), None, "other queues are not held");
        assert_eq!(
            d.readiness_error(),
            None,
            "a row's own queue keeps the relay ready"
        );
        assert_eq!(
            d.parked(&other(), park.until),
            None,
            "its rows are tried again once the park is over"
        );
        assert!(d.reached(&other()));
        assert!(!d.reached(&other()));
    }

    #[test]
    fn requests_failing_together_join_one_park() {
        let d = destinations();
        let now = Instant::now();
        let first = d.refused(&other(), "AccessDenied: a", now, 0.9);
        let second = d.refused(
            &other(),
            "AccessDenied: b",
            now + Duration::from_millis(1),
            0.1,
        );
        assert!(first.started && !second.started);
        assert_eq!(second.until, first.until, "no longer and no shorter");
        assert_eq!(second.error, "AccessDenied: b", "the latest error is shown");
    }

    #[test]
    fn each_park_backs_off_further_up_to_the_cap_and_success_starts_afresh() {
        let d = destinations();
        let mut now = Instant::now();
        let mut ceilings = Vec::new();
        for _ in 0..10 {
            let park = d.refused(&other(), "QueueDoesNotExist", now, 0.999_999);
            assert!(park.started);
            ceilings.push(park.remaining(now).as_secs_f64().round() as u64);
            now = park.until;
        }
        assert_eq!(ceilings, [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]);
        d.reached(&other());
        let park = d.refused(&other(), "QueueDoesNotExist", now, 0.999_999);
        assert_eq!(park.remaining(now).as_secs_f64().round() as u64, 1);
    }

    #[test]
    fn a_refused_configured_queue_makes_the_relay_not_ready_until_it_is_reached() {
        let d = destinations();
        let now = Instant::now();
        let park = d.refused(&default(), "NonExistentQueue: no", now, 0.5);
        assert!(park.configured);
        let why = d.readiness_error().expect("not ready");
        assert!(
            why.contains(&default().to_string()) && why.contains("NonExistentQueue"),
            "{why}"
        );
        // Still not ready after the park ends: nothing has reached the queue yet.
        assert!(d.parked(&default(), park.until).is_none());
        assert!(d.readiness_error().is_some());
        d.reached(&other());
        assert!(
            d.readiness_error().is_some(),
            "another queue says nothing of this one"
        );
        d.reached(&default());
        assert_eq!(d.readiness_error(), None);
    }

    #[test]
    fn queues_refused_long_ago_are_forgotten_but_configured_ones_are_not() {
        let d = destinations();
        let now = Instant::now();
        d.refused(&other(), "QueueDoesNotExist", now, 0.0);
        d.refused(&default(), "QueueDoesNotExist", now, 0.0);
        let later = now + Duration::from_secs(241);
        d.refused(&queue("http://sqs/1/third"), "AccessDenied", later, 0.0);
        assert!(
            !d.reached(&other()),
            "forgotten: its next refusal starts at the first step"
        );
        assert!(d.reached(&default()));
    }

    #[test]
    fn a_refused_bucket_holds_only_itself_and_is_named_as_a_bucket() {
        let bucket = Destination::bucket("events").expect("a bucket name");
        let lookalike = queue("http://sqs/1/events");
        let d = Destinations::new(
            vec![bucket.clone()],
            Duration::from_secs(1),
            Duration::from_secs(60),
        );
        let now = Instant::now();
        d.refused(&bucket, "NoSuchBucket: gone", now, 0.5);
        assert!(
            d.parked(&default(), now).is_none(),
            "the queue is not the bucket"
        );
        assert!(d.parked(&lookalike, now).is_none());
        assert!(
            d.parked(&Destination::of_row("s3://events"), now).is_none(),
            "nor is a row's `s3://` text"
        );
        assert_eq!(
            d.readiness_error().as_deref(),
            Some("bucket s3://events refused: NoSuchBucket: gone")
        );
    }

    #[test]
    fn a_refused_topic_is_named_as_a_topic() {
        let topic =
            Destination::parse("arn:aws:sns:eu-west-1:123456789012:orders").expect("an ARN");
        let d = Destinations::new(
            vec![topic.clone()],
            Duration::from_secs(1),
            Duration::from_secs(60),
        );
        d.refused(&topic, "NotFound: no topic", Instant::now(), 0.5);
        assert_eq!(
            d.readiness_error().as_deref(),
            Some("topic arn:aws:sns:eu-west-1:123456789012:orders refused: NotFound: no topic")
        );
    }
}
