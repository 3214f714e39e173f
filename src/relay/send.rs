//! The send gate (destination parks, relay-wide pause, lease deadline), S3 uploads and the
//! cache of each queue's and topic's `MaximumMessageSize`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::batch::BatchRequest;
use crate::concurrency::{self, Outcome};
use crate::destination::{Destination, Park, SizeRead};
use crate::metrics as names;
use crate::retry::{self, RequestFailure, Transport};
use crate::row::ClaimedRow;
use crate::sink::EntryOutcome;

use super::{Relay, LOG_TARGET};

/// Destinations whose size limit is remembered at most (rows may carry their own).
pub(super) const MAX_KNOWN_DESTINATIONS: usize = 1024;

/// A destination's `MaximumMessageSize` as the relay last learnt it.
#[derive(Debug, Clone, Copy)]
pub(super) struct SizeLimit {
    /// What it reported; `None`: it reports none (an older topic, an emulator), or a topic
    /// that could not be read yet.
    reported: Option<usize>,
    /// When it was last asked: it is asked again a `--stats-interval` later. `None`: at the
    /// next claim (a row was refused for it, and the operator may have raised it since).
    asked: Option<Instant>,
    /// The last ask failed: said once when it starts, not at every ask.
    failing: bool,
}

impl Relay {
    /// The `MaximumMessageSize` of each destination the rows go to that needs one, read on
    /// first use and again every `--stats-interval`; which are read, and what a failed read
    /// means, is [`crate::destination::SizeRead`]; [`crate::destination::Destination::limits`]
    /// makes it a limit.
    pub(super) async fn size_limits(&self, rows: &[ClaimedRow]) -> HashMap<Destination, usize> {
        let mut unknown: Vec<(Destination, SizeRead)> = Vec::new();
        {
            let known = self.shared.size_limits.lock().expect("size limits lock");
            for row in rows {
                let destination = self.plan_config.queue_for(row);
                let read = destination.size_read(self.keeps_order(destination));
                if read == SizeRead::Never {
                    continue;
                }
                let fresh = known
                    .get(destination)
                    .and_then(|limit| limit.asked)
                    .is_some_and(|asked| asked.elapsed() < self.config.maintenance.stats_interval);
                if !fresh && !unknown.iter().any(|(d, _)| d == destination) {
                    unknown.push((destination.clone(), read));
                }
            }
        }
        for (destination, read) in unknown {
            let failure = match self
                .shared
                .sinks
                .of(&destination)
                .attributes(&destination)
                .await
            {
                Ok(info) => {
                    self.learnt(destination, info.maximum_message_size, false);
                    continue;
                }
                Err(failure) => retry::describe(&failure),
            };
            if read != SizeRead::KeptOnFailure {
                continue;
            }
            let (last, already_failing) = {
                let known = self.shared.size_limits.lock().expect("size limits lock");
                known
                    .get(&destination)
                    .map_or((None, false), |limit| (limit.reported, limit.failing))
            };
            if !already_failing {
                let limit = destination
                    .limits(self.config.send.max_request_bytes, last)
                    .bytes;
                tracing::warn!(target: LOG_TARGET, topic = %destination, error = %failure, limit,
                    "cannot read the topic's MaximumMessageSize: it is sent messages of up to `limit` bytes until it can be read (where access is denied, allow sns:GetTopicAttributes on it)");
            }
            self.learnt(destination, last, true);
        }
        let known = self.shared.size_limits.lock().expect("size limits lock");
        known
            .iter()
            .filter_map(|(destination, limit)| Some((destination.clone(), limit.reported?)))
            .collect()
    }

    /// Makes each of `destinations` asked again at the next claim, keeping what it reported
    /// until then.
    pub(super) fn ask_again(&self, destinations: &[Destination]) {
        let mut known = self.shared.size_limits.lock().expect("size limits lock");
        for destination in destinations {
            if let Some(limit) = known.get_mut(destination) {
                limit.asked = None;
            }
        }
    }

    /// Remembers what a destination reported (or kept, after a failed ask) until the next
    /// `--stats-interval`.
    fn learnt(&self, destination: Destination, reported: Option<usize>, failing: bool) {
        let mut known = self.shared.size_limits.lock().expect("size limits lock");
        // Rows may name any number of destinations of their own; keep the memory bounded.
        if known.len() >= MAX_KNOWN_DESTINATIONS && !known.contains_key(&destination) {
            known.clear();
        }
        known.insert(
            destination,
            SizeLimit {
                reported,
                asked: Some(Instant::now()),
                failing,
            },
        );
    }

    /// One SendMessageBatch call, once a request slot is free and the relay is not backing off.
    pub(super) async fn send(
        &self,
        request: BatchRequest,
        lease_deadline: Instant,
        shutdown: &CancellationToken,
    ) -> (BatchRequest, Result<Vec<EntryOutcome>, NoAnswer>) {
        let c = &self.config;
        // A queue that refused us lately is not asked again before its time: its rows wait in
        // the table, and need no request slot for that.
        if let Some(park) = self
            .shared
            .destinations
            .parked(&request.destination, Instant::now())
        {
            return (request, Err(NoAnswer::Parked(park)));
        }
        // The destination's own slot first: a request waiting for a slow queue must not hold one
        // of the permits every destination shares. The bucket's next, for the uploads.
        let slot = tokio::select! {
            slot = self.shared.concurrency.acquire(&request.destination) => slot,
            _ = shutdown.cancelled() => return (request, Err(NoAnswer::NotSent(STOPPING))),
        };
        let bucket = self
            .shared
            .sinks
            .offload()
            .filter(|_| request.entries.iter().any(|e| e.offload.is_some()))
            .map(|s3| s3.bucket().clone());
        let upload_slot = match &bucket {
            Some(bucket) => tokio::select! {
                slot = self.shared.concurrency.acquire(bucket) => Some(slot),
                _ = shutdown.cancelled() => return (request, Err(NoAnswer::NotSent(STOPPING))),
            },
            None => None,
        };
        let _permit = tokio::select! {
            permit = self.shared.request_permits.acquire() => permit.expect("never closed"),
            _ = shutdown.cancelled() => return (request, Err(NoAnswer::NotSent(STOPPING))),
        };
        while let Some(pause) = self.shared.pressure.remaining(Instant::now()) {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.cancelled() => return (request, Err(NoAnswer::NotSent(STOPPING))),
            }
        }
        // Another request may have found the queue refusing while this one waited.
        if let Some(park) = self
            .shared
            .destinations
            .parked(&request.destination, Instant::now())
        {
            return (request, Err(NoAnswer::Parked(park)));
        }
        // Another delivery found that settlements on this table change nothing (or is looking
        // whether they do), after this request's claim took rows its settlement had just
        // freed: sent now, they would be a copy that no settlement can stop. Given back, they
        // wait unsent like the others.
        if self.admission.sends_stopped() {
            return (request, Err(NoAnswer::NotSent(SETTLEMENTS_UNDONE)));
        }
        // Sending now could outlive the lease: another replica might take the rows over while
        // SQS's answer is still on its way. Give them back instead.
        if Instant::now() + c.send.send_timeout + c.send.settle_margin > lease_deadline {
            return (
                request,
                Err(NoAnswer::NotSent("lease too short for another send")),
            );
        }
        if let Some(upload_slot) = upload_slot {
            let started = Instant::now();
            let uploaded = self.offload(&request, lease_deadline).await;
            upload_slot.finish(upload_outcome(&uploaded, started.elapsed()));
            if let Err(failed) = uploaded {
                return (request, Err(NoAnswer::Offload(failed)));
            }
            if Instant::now() + c.send.send_timeout + c.send.settle_margin > lease_deadline {
                return (
                    request,
                    Err(NoAnswer::NotSent(
                        "lease too short for the send after the upload",
                    )),
                );
            }
        }
        let started = Instant::now();
        let result = self
            .shared
            .sinks
            .of(&request.destination)
            .send(&request)
            .await
            .map_err(NoAnswer::Failed);
        metrics::histogram!(names::SEND_DURATION).record(started.elapsed().as_secs_f64());
        slot.finish(send_outcome(&result, started.elapsed()));
        (request, result)
    }

    /// Stores the request's large bodies in S3 before their pointers are sent; if an upload
    /// fails, nothing is sent and the first failed entry decides (see
    /// [`Relay::offload_failed`]); a bucket that refused us lately is not asked again before its
    /// park ends. The uploads of a request go at once, each in its own round trip: their bodies
    /// are in memory already (the byte budget bounds them), and one after the other a request
    /// of ten would wait ten round trips. An object stored for a request that then fails stays,
    /// and a resend overwrites it (a replica that took the row over writes the same bytes under
    /// the same key). Each upload's deadline grows with its body, within what the lease leaves
    /// for the send after it (`s3::upload_deadline`): an upload that outlived the lease could
    /// never be followed by its send, and would be given back for ever. No upload starts unless
    /// every large body of the request has its time.
    pub(super) async fn offload(
        &self,
        request: &BatchRequest,
        lease_deadline: Instant,
    ) -> Result<(), OffloadFailed> {
        let Some(s3) = self.shared.sinks.offload() else {
            return Ok(());
        };
        let c = &self.config;
        let after = c.send.send_timeout + c.send.settle_margin;
        let lease_left = lease_deadline.saturating_duration_since(Instant::now() + after);
        let lease_window = c.claim.lease.saturating_sub(after);
        let bucket = s3.bucket().clone();
        if let Some(park) = self.shared.destinations.parked(&bucket, Instant::now()) {
            return Err(OffloadFailed::Parked(park));
        }
        let mut deadlines = Vec::with_capacity(request.entries.len());
        for entry in &request.entries {
            let deadline = match &entry.offload {
                Some(offload) => {
                    let bytes = offload.body.len();
                    match crate::sink::s3::upload_deadline(
                        bytes,
                        c.send.send_timeout,
                        lease_left,
                        lease_window,
                    ) {
                        Some(deadline) => Some(deadline),
                        None => return Err(OffloadFailed::NoTime),
                    }
                }
                None => None,
            };
            deadlines.push(deadline);
        }
        let uploads = request
            .entries
            .iter()
            .zip(deadlines)
            .enumerate()
            .filter_map(|(index, (entry, deadline))| {
                let offload = entry.offload.as_ref()?;
                let deadline = deadline?;
                Some(async move {
                    let result = s3.put(offload, deadline).await.map_err(|mut failure| {
                        if failure.transport == Transport::Timeout {
                            failure.message = format!(
                                "{} (a {}-byte body gets {}: --send-timeout and 1 s per MiB, within the lease)",
                                failure.message,
                                offload.body.len(),
                                humantime::format_duration(deadline)
                            );
                        }
                        failure
                    });
                    (index, result)
                })
            });
        let mut first_failed = None;
        for (index, result) in futures_util::future::join_all(uploads).await {
            match result {
                Ok(()) => {
                    self.shared.destinations.reached(&bucket);
                }
                Err(failure) => {
                    let kind = retry::classify(&failure).metric_kind();
                    metrics::counter!(names::OFFLOAD_FAILURES, "kind" => kind).increment(1);
                    // join_all keeps the entries' order: the first failure is the first entry's.
                    if first_failed.is_none() {
                        first_failed = Some(OffloadFailed::Refused { index, failure });
                    }
                }
            }
        }
        first_failed.map_or(Ok(()), Err)
    }
}

/// Why a request produced no per-entry answers.
/// Why a request waiting for its turn is not sent when sending stops: the relay shuts down, or
/// stopped claiming because the schema no longer admits it; its rows are given back either way.
const STOPPING: &str = "sending stopped (shutdown, or the schema no longer admits this relay)";
/// Why a request is not sent once settlements on its table were found to change nothing.
const SETTLEMENTS_UNDONE: &str = "settlements on the table change nothing, or may";

/// Why a request has no answer entry by entry.
pub(super) enum NoAnswer {
    /// SQS (or the path to it) failed the whole request.
    Failed(RequestFailure),
    /// We chose not to send it (shutdown, or the lease would not outlast the call).
    NotSent(&'static str),
    /// Its queue refused us lately and is not asked again before the park ends.
    Parked(Park),
    /// A large body could not be stored in S3, so nothing was sent.
    Offload(OffloadFailed),
}

/// Why a request's large bodies are not all in S3.
pub(super) enum OffloadFailed {
    /// The bucket refused us lately and is not asked again before its park ends.
    Parked(Park),
    /// What the lease has left is too short for an upload a fresh claim would have time for.
    NoTime,
    /// S3 refused the upload of the entry at `index`, the first of the request that failed.
    Refused {
        index: usize,
        failure: RequestFailure,
    },
}

/// What a send tells its destination's concurrency limit (the rule: `concurrency`).
pub(super) fn send_outcome(result: &Result<Vec<EntryOutcome>, NoAnswer>, rtt: Duration) -> Outcome {
    match result {
        Ok(outcomes) => concurrency::answer_outcome(
            rtt,
            outcomes.iter().filter_map(|o| match o {
                EntryOutcome::Failed { code, .. } => Some(code.as_str()),
                EntryOutcome::Sent { .. } => None,
            }),
        ),
        Err(NoAnswer::Failed(failure)) => concurrency::failure_outcome(retry::classify(failure)),
        Err(_) => Outcome::Unmeasured,
    }
}

/// The same for a request's uploads to the offload bucket (S3 `SlowDown` is its throttling).
pub(super) fn upload_outcome(result: &Result<(), OffloadFailed>, rtt: Duration) -> Outcome {
    match result {
        Ok(()) => Outcome::Answered(rtt),
        Err(OffloadFailed::Refused { failure, .. }) => {
            concurrency::failure_outcome(retry::classify(failure))
        }
        Err(OffloadFailed::Parked(_) | OffloadFailed::NoTime) => Outcome::Unmeasured,
    }
}
