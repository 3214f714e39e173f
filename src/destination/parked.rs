//! Which destination queues are refusing us, and until when their rows wait.
//!
//! A failure that belongs to one queue (missing, access denied, its KMS key) must hold only
//! that queue's rows: the relay parks them (quarantined with reason `destination`, available
//! again when the queue's park ends) and every other queue keeps flowing. Each queue has its own
//! capped exponential back-off with full jitter, reset by the first request that reaches it.
//! No I/O here; time and the random draw are parameters, so the rules are unit-tested.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::retry;

/// The queues that refused us lately, one process's view. Replicas keep their own: the shared
/// schedule is the parked rows' `available_at` in the table.
#[derive(Debug)]
pub struct Destinations {
    /// Queues of the relay's own configuration (`--queue-url`, `--route`): while one of them is
    /// refused the relay is not ready. A row's own `queue_url` is the application's data and
    /// only parks that row.
    configured: Vec<String>,
    base: Duration,
    cap: Duration,
    state: Mutex<HashMap<String, Refused>>,
}

#[derive(Debug, Clone)]
struct Refused {
    /// Parks so far without a request getting through, for the back-off.
    parks: u32,
    until: Instant,
    error: String,
}

/// A queue's rows wait until `until`; `error` is what the queue last said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Park {
    pub until: Instant,
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
    pub fn new(configured: Vec<String>, base: Duration, cap: Duration) -> Self {
        Destinations {
            configured,
            base,
            cap,
            state: Mutex::new(HashMap::new()),
        }
    }

    fn is_configured(&self, queue_url: &str) -> bool {
        self.configured.iter().any(|q| q == queue_url)
    }

    /// The park a queue is in at `now`, if any: its rows are parked without a request.
    pub fn parked(&self, queue_url: &str, now: Instant) -> Option<Park> {
        let state = self.state.lock().expect("destinations lock");
        let refused = state.get(queue_url).filter(|r| r.until > now)?;
        Some(Park {
            until: refused.until,
            error: refused.error.clone(),
            started: false,
            configured: self.is_configured(queue_url),
        })
    }

    /// `queue_url` refused a request at `now`. Starts a park one back-off step longer than the
    /// last (`jitter` is the draw in `[0, 1)`), or joins the park already running: requests in
    /// flight together fail together, and count as one.
    pub fn refused(&self, queue_url: &str, error: &str, now: Instant, jitter: f64) -> Park {
        let mut state = self.state.lock().expect("destinations lock");
        // Forget queues nobody has sent to for a while (a row's mistyped URL), so the map
        // holds what is failing now, not every URL ever refused.
        let forget_after = self.cap.saturating_mul(4);
        state.retain(|url, r| {
            self.is_configured(url) || now.saturating_duration_since(r.until) < forget_after
        });
        let configured = self.is_configured(queue_url);
        if let Some(r) = state.get_mut(queue_url).filter(|r| r.until > now) {
            r.error = error.to_string();
            return Park {
                until: r.until,
                error: r.error.clone(),
                started: false,
                configured,
            };
        }
        let parks = state
            .get(queue_url)
            .map_or(0, |r| r.parks)
            .saturating_add(1);
        let until = now + retry::backoff(parks, self.base, self.cap, jitter);
        state.insert(
            queue_url.to_string(),
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
    pub fn reached(&self, queue_url: &str) -> bool {
        let mut state = self.state.lock().expect("destinations lock");
        state.remove(queue_url).is_some()
    }

    /// Why the relay is not ready because of its own destinations: the first configured queue still
    /// refused (its last error), or `None`.
    pub fn readiness_error(&self) -> Option<String> {
        let state = self.state.lock().expect("destinations lock");
        self.configured.iter().find_map(|url| {
            state
                .get(url)
                .map(|r| format!("{} {url} refused: {}", describe(url).1, r.error))
        })
    }
}

/// The key an S3 bucket (`--offload-bucket`) is parked under, beside queue URLs and topic
/// ARNs: a bucket that refuses us holds only the rows whose bodies must go to it.
pub fn bucket_key(bucket: &str) -> String {
    format!("s3://{bucket}")
}

/// What a destination is, for log lines and row errors: the service that refused, and the noun.
pub fn describe(destination: &str) -> (&'static str, &'static str) {
    if destination.starts_with("s3://") {
        ("S3", "bucket")
    } else if crate::batch::is_topic(destination) {
        ("SNS", "topic")
    } else {
        ("SQS", "queue")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: &str = "http://sqs/1/orders";
    const OTHER: &str = "http://sqs/1/billing";

    fn destinations() -> Destinations {
        Destinations::new(
            vec![DEFAULT.to_string()],
            Duration::from_secs(1),
            Duration::from_secs(60),
        )
    }

    #[test]
    fn a_refused_queue_is_parked_alone_and_a_request_that_reaches_it_ends_the_park() {
        let d = destinations();
        let now = Instant::now();
        let park = d.refused(OTHER, "QueueDoesNotExist: gone", now, 0.5);
        assert!(park.started);
        assert!(!park.configured);
        assert_eq!(park.remaining(now), Duration::from_millis(500));
        assert_eq!(
            d.parked(OTHER, now),
            Some(Park {
                started: false,
                ..park.clone()
            })
        );
        assert_eq!(d.parked(DEFAULT, now), None, "other queues are not held");
        assert_eq!(
            d.readiness_error(),
            None,
            "a row's own queue keeps the relay ready"
        );
        assert_eq!(
            d.parked(OTHER, park.until),
            None,
            "its rows are tried again once the park is over"
        );
        assert!(d.reached(OTHER));
        assert!(!d.reached(OTHER));
    }

    #[test]
    fn requests_failing_together_join_one_park() {
        let d = destinations();
        let now = Instant::now();
        let first = d.refused(OTHER, "AccessDenied: a", now, 0.9);
        let second = d.refused(
            OTHER,
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
            let park = d.refused(OTHER, "QueueDoesNotExist", now, 0.999_999);
            assert!(park.started);
            ceilings.push(park.remaining(now).as_secs_f64().round() as u64);
            now = park.until;
        }
        assert_eq!(ceilings, [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]);
        d.reached(OTHER);
        let park = d.refused(OTHER, "QueueDoesNotExist", now, 0.999_999);
        assert_eq!(park.remaining(now).as_secs_f64().round() as u64, 1);
    }

    #[test]
    fn a_refused_configured_queue_makes_the_relay_not_ready_until_it_is_reached() {
        let d = destinations();
        let now = Instant::now();
        let park = d.refused(DEFAULT, "NonExistentQueue: no", now, 0.5);
        assert!(park.configured);
        let why = d.readiness_error().expect("not ready");
        assert!(
            why.contains(DEFAULT) && why.contains("NonExistentQueue"),
            "{why}"
        );
        // Still not ready after the park ends: nothing has reached the queue yet.
        assert!(d.parked(DEFAULT, park.until).is_none());
        assert!(d.readiness_error().is_some());
        d.reached(OTHER);
        assert!(
            d.readiness_error().is_some(),
            "another queue says nothing of this one"
        );
        d.reached(DEFAULT);
        assert_eq!(d.readiness_error(), None);
    }

    #[test]
    fn queues_refused_long_ago_are_forgotten_but_configured_ones_are_not() {
        let d = destinations();
        let now = Instant::now();
        d.refused(OTHER, "QueueDoesNotExist", now, 0.0);
        d.refused(DEFAULT, "QueueDoesNotExist", now, 0.0);
        let later = now + Duration::from_secs(241);
        d.refused("http://sqs/1/third", "AccessDenied", later, 0.0);
        assert!(
            !d.reached(OTHER),
            "forgotten: its next refusal starts at the first step"
        );
        assert!(d.reached(DEFAULT));
    }

    #[test]
    fn a_bucket_is_parked_under_a_key_no_queue_or_topic_can_have() {
        let key = bucket_key("events");
        assert_eq!(describe(&key), ("S3", "bucket"));
        assert_eq!(describe(DEFAULT), ("SQS", "queue"));
        assert_eq!(
            describe("arn:aws:sns:eu-west-1:123456789012:orders"),
            ("SNS", "topic")
        );
        let d = Destinations::new(
            vec![key.clone()],
            Duration::from_secs(1),
            Duration::from_secs(60),
        );
        let now = Instant::now();
        d.refused(&key, "NoSuchBucket: gone", now, 0.5);
        assert!(
            d.parked(DEFAULT, now).is_none(),
            "the queue is not the bucket"
        );
        assert_eq!(
            d.readiness_error().as_deref(),
            Some("bucket s3://events refused: NoSuchBucket: gone")
        );
    }
}
