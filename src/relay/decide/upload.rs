//! What becomes of a request whose large bodies could not all be stored in S3.

use std::time::Duration;

use crate::batch::{BatchRequest, Entry};
use crate::destination::Destination;
use crate::retry::{self, EntryDecision, RequestReaction};
use crate::row::{ClaimedRow, QuarantineReason};

use super::Decide;
use crate::relay::effect::{Effect, Held, Log, Refusal};
use crate::relay::send::OffloadFailed;

impl<J: FnMut() -> f64> Decide<J> {
    /// A request's uploads failed, so nothing of it was sent. The failure is S3's, counted in
    /// `outbox_offload_failures_total` only, and it holds only the entries it concerns: a bad
    /// body is quarantined alone (`rejected`); a bucket that refuses us (missing, denied) parks
    /// the large rows on the bucket's own back-off (an [`Effect::Refused`]), and readiness
    /// fails, as for the relay's own queue; throttling, outages and credentials pause the
    /// relay and release the large rows. The other entries go on in a request of their own
    /// (returned), unless the destination keeps order (`ordered`): then they are given back
    /// unsent, so no group overtakes its held row. `bucket` is the bucket's park key.
    pub(in crate::relay) fn offload_failed(
        &mut self,
        rows: &[ClaimedRow],
        request: &BatchRequest,
        failed: OffloadFailed,
        bucket: &Destination,
        ordered: bool,
    ) -> Option<BatchRequest> {
        let large: Vec<usize> = (0..request.entries.len())
            .filter(|&i| request.entries[i].offload.is_some())
            .collect();
        let large_rows =
            || -> Vec<usize> { large.iter().map(|&i| request.entries[i].row).collect() };
        let held: Vec<usize> = match failed {
            OffloadFailed::NoTime => {
                for row in large_rows() {
                    self.release(&rows[row], Duration::ZERO, None);
                }
                self.log(Log::NoTimeForUploads);
                large.clone()
            }
            OffloadFailed::Parked(park) => {
                for row in large_rows() {
                    self.park_row(&rows[row], bucket, &park);
                }
                self.log(Log::BucketParked {
                    bucket: bucket.to_string(),
                });
                large.clone()
            }
            OffloadFailed::Refused { failure, .. } if retry::upload_spends_attempt(&failure) => {
                let error = retry::describe(&failure);
                self.log(Log::UploadTimedOut {
                    error: error.clone(),
                    bucket: bucket.to_string(),
                });
                for row in large_rows() {
                    self.span_refused(rows[row].id, None);
                    self.spend_attempt(&rows[row], error.clone());
                }
                large.clone()
            }
            OffloadFailed::Refused { index, failure } => {
                let class = retry::classify(&failure);
                let what = retry::describe(&failure);
                let culprit = &request.entries[index];
                match retry::request_reaction(class, 1, false) {
                    RequestReaction::QuarantineTheEntry => {
                        self.span_refused(rows[culprit.row].id, failure.code.as_deref());
                        self.quarantine(&rows[culprit.row], QuarantineReason::Rejected, what);
                        vec![index]
                    }
                    RequestReaction::ParkTheQueue => {
                        self.effect(Effect::Refused(Refusal {
                            destination: bucket.clone(),
                            error: what,
                            held: Held::Uploads {
                                rows: large_rows(),
                                code: failure.code.clone(),
                            },
                        }));
                        large.clone()
                    }
                    reaction => {
                        let delay = self.pause();
                        if reaction == (RequestReaction::PauseAndRelease { not_ready: true }) {
                            self.effect(Effect::NotReady(format!("S3: {what}")));
                            self.log(Log::S3CredentialsRefused {
                                error: what.clone(),
                                retry_in: delay,
                                bucket: bucket.to_string(),
                            });
                        } else {
                            self.log(Log::UploadFailed {
                                error: what.clone(),
                                kind: class.metric_kind(),
                                retry_in: delay,
                            });
                        }
                        let error = format!("S3 PutObject: {what}");
                        for row in large_rows() {
                            self.span_refused(rows[row].id, failure.code.as_deref());
                            self.release(&rows[row], delay, Some(error.clone()));
                        }
                        large.clone()
                    }
                }
            }
        };
        let rest = request
            .entries
            .iter()
            .enumerate()
            .filter(|(i, _)| !held.contains(i))
            .map(|(_, e)| e.clone());
        if ordered {
            for entry in rest {
                self.release(&rows[entry.row], Duration::ZERO, None);
            }
            return None;
        }
        let entries: Vec<Entry> = rest.collect();
        (!entries.is_empty()).then(|| BatchRequest {
            destination: request.destination.clone(),
            entries,
        })
    }

    /// A failure that counts against the row: retried after the row's own back-off with the
    /// attempt kept, or quarantined (`max_attempts`) once `--max-attempts` are spent.
    fn spend_attempt(&mut self, row: &ClaimedRow, error: String) {
        let attempts = row.attempts as u32;
        match retry::entry_decision(false, "", attempts, self.policy.max_attempts) {
            EntryDecision::OutOfAttempts => {
                let error = format!("{attempts} attempts; last: {error}");
                self.quarantine(row, QuarantineReason::MaxAttempts, error);
            }
            _ => self.retry(row, attempts, error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::decide::tests::*;
    use crate::retry::RequestFailure;

    /// A request of a small row, a large one, and a small one.
    fn mixed() -> BatchRequest {
        BatchRequest {
            destination: Destination::of_row(QUEUE),
            entries: vec![entry(0, false), entry(1, true), entry(2, false)],
        }
    }

    fn refused_upload(f: RequestFailure) -> OffloadFailed {
        OffloadFailed::Refused {
            index: 1,
            failure: f,
        }
    }

    fn rest_rows(rest: &Option<BatchRequest>) -> Vec<usize> {
        rest.iter()
            .flat_map(|r| r.entries.iter().map(|e| e.row))
            .collect()
    }

    #[test]
    fn a_body_s3_refuses_as_bad_input_is_quarantined_alone_and_the_rest_goes_on() {
        let rows = rows(3, 1);
        let (mut d, _) = decide(0);
        let rest = d.offload_failed(
            &rows,
            &mixed(),
            refused_upload(failure("EntityTooLarge")),
            &bucket(),
            false,
        );
        assert_eq!(rest_rows(&rest), [0, 2]);
        let d = d.finish();
        assert_eq!(quarantined(&d), [(2, QuarantineReason::Rejected, None)]);
        assert!(pauses(&d).is_empty());
        assert!(
            counts(&d).is_empty(),
            "S3's failures are counted as offload failures only"
        );
    }

    #[test]
    fn under_ordered_delivery_the_rest_of_a_request_whose_upload_failed_is_given_back() {
        let rows = rows(3, 1);
        let (mut d, _) = decide(0);
        let rest = d.offload_failed(
            &rows,
            &mixed(),
            refused_upload(failure("EntityTooLarge")),
            &bucket(),
            true,
        );
        assert_eq!(rest, None, "no group overtakes its held row");
        let d = d.finish();
        assert_eq!(quarantined(&d), [(2, QuarantineReason::Rejected, None)]);
        assert_eq!(
            rescheduled(&d),
            [(1, true, Duration::ZERO), (3, true, Duration::ZERO)]
        );
    }

    #[test]
    fn a_transient_upload_failure_pauses_the_relay_and_releases_the_large_rows() {
        let rows = rows(3, 1);
        let (mut d, _) = decide(0);
        let mut f = failure("SlowDown");
        f.status = Some(503);
        let rest = d.offload_failed(&rows, &mixed(), refused_upload(f), &bucket(), false);
        assert_eq!(rest_rows(&rest), [0, 2]);
        let d = d.finish();
        assert_eq!(pauses(&d), [SECOND / 2]);
        assert_eq!(rescheduled(&d), [(2, true, SECOND / 2)]);
        assert_eq!(
            d.settlement.reschedule[0].error.as_deref(),
            Some("S3 PutObject: SlowDown: said so")
        );
        assert!(matches!(logs(&d)[..], [Log::UploadFailed { .. }]));
        assert!(!d.effects.iter().any(|e| matches!(e, Effect::NotReady(_))));
    }

    #[test]
    fn refused_s3_credentials_make_the_relay_not_ready() {
        let rows = rows(3, 1);
        let (mut d, _) = decide(0);
        d.offload_failed(
            &rows,
            &mixed(),
            refused_upload(failure("InvalidClientTokenId")),
            &bucket(),
            false,
        );
        let d = d.finish();
        assert!(d.effects.contains(&Effect::NotReady(
            "S3: InvalidClientTokenId: said so".into()
        )));
        assert!(matches!(logs(&d)[..], [Log::S3CredentialsRefused { .. }]));
        assert_eq!(rescheduled(&d), [(2, true, SECOND / 2)]);
    }

    #[test]
    fn a_refusing_bucket_parks_only_the_large_rows_once_the_park_is_known() {
        let rows = rows(3, 1);
        let (mut d, now) = decide(0);
        let rest = d.offload_failed(
            &rows,
            &mixed(),
            refused_upload(failure("NoSuchBucket")),
            &bucket(),
            false,
        );
        assert_eq!(rest_rows(&rest), [0, 2], "the small rows flow");
        let first = d.finish();
        let [refusal] = &refusals(&first)[..] else {
            panic!("one refusal: {:?}", first.effects);
        };
        assert_eq!(refusal.destination, bucket());
        let mut d = Decide::new(policy(), now, 1_000.0, 0, || 0.5);
        d.refused(&rows, (*refusal).clone(), &park(true, true, now));
        let d = d.finish();
        assert_eq!(
            quarantined(&d),
            [(2, QuarantineReason::Destination, Some(10 * SECOND))]
        );
        assert!(d.settlement.quarantine[0]
            .error
            .starts_with("bucket s3://bodies: "));
        assert_eq!(d.effects[0], Effect::Readiness);
        assert!(matches!(logs(&d)[..], [Log::BucketRefused { .. }]));
    }

    #[test]
    fn an_upload_that_timed_out_spends_the_attempt_of_the_large_rows() {
        let rows = rows(3, 2);
        let (mut d, _) = decide(0);
        d.offload_failed(&rows, &mixed(), refused_upload(timeout()), &bucket(), false);
        let d = d.finish();
        assert_eq!(rescheduled(&d), [(2, false, SECOND)]);
        assert!(
            pauses(&d).is_empty(),
            "the body, not the path, may be at fault"
        );
        assert!(matches!(logs(&d)[..], [Log::UploadTimedOut { .. }]));
    }

    #[test]
    fn an_upload_that_timed_out_on_the_last_attempt_quarantines_the_row() {
        let rows = rows(3, 5);
        let (mut d, _) = decide(0);
        d.offload_failed(&rows, &mixed(), refused_upload(timeout()), &bucket(), false);
        let d = d.finish();
        assert_eq!(quarantined(&d), [(2, QuarantineReason::MaxAttempts, None)]);
        assert_eq!(
            d.settlement.quarantine[0].error,
            "5 attempts; last: no answer"
        );
    }

    #[test]
    fn a_parked_bucket_or_a_short_lease_holds_the_large_rows_without_an_upload() {
        let rows = rows(3, 1);
        let (mut d, now) = decide(0);
        let rest = d.offload_failed(
            &rows,
            &mixed(),
            OffloadFailed::Parked(park(false, true, now)),
            &bucket(),
            false,
        );
        assert_eq!(rest_rows(&rest), [0, 2]);
        let rest = d.offload_failed(&rows, &mixed(), OffloadFailed::NoTime, &bucket(), false);
        assert_eq!(rest_rows(&rest), [0, 2]);
        let d = d.finish();
        assert_eq!(
            quarantined(&d),
            [(2, QuarantineReason::Destination, Some(10 * SECOND))]
        );
        assert_eq!(rescheduled(&d), [(2, true, Duration::ZERO)]);
        assert_eq!(
            logs(&d),
            [
                &Log::BucketParked {
                    bucket: BUCKET.into()
                },
                &Log::NoTimeForUploads
            ]
        );
    }
}
