//! Which of a claim's requests must wait for another: the rest of a group too long for one
//! request, and the second half of an ordered request refused as a whole.
//!
//! A follow-up goes only once the request it follows was accepted entry by entry; otherwise it
//! and everything after it go back unsent, so a group keeps its order. Pure bookkeeping: no
//! clock, no I/O.

use std::collections::HashMap;

use crate::batch::BatchRequest;

/// The requests waiting for another, keyed by the first entry `id` of the request they follow.
#[derive(Debug, Default)]
pub(super) struct FollowUps {
    /// At most one follow-up per request; a chain is a follow-up that has a follow-up of its own.
    after: HashMap<String, BatchRequest>,
}

/// What follows a request once it was answered.
#[derive(Debug, PartialEq)]
pub(super) enum Next {
    /// Nothing waited for it.
    Nothing,
    /// It was accepted entry by entry: send its follow-up now.
    Send(BatchRequest),
    /// It was not: these (its follow-up, and theirs, in order) go back unsent.
    GiveBack(Vec<BatchRequest>),
}

impl FollowUps {
    /// The planner's follow-ups (`batch::Plan::follow_ups`).
    pub(super) fn new(follow_ups: Vec<(String, BatchRequest)>) -> Self {
        FollowUps {
            after: follow_ups.into_iter().collect(),
        }
    }

    /// An ordered request was split in `left` and `right`: `right` goes only once `left` was
    /// accepted, and what waited for the whole request now waits for `right`.
    pub(super) fn split_in_order(&mut self, left: &BatchRequest, right: BatchRequest) {
        let first = left.entries[0].id.clone();
        if let Some(next) = self.after.remove(&first) {
            self.after.insert(right.entries[0].id.clone(), next);
        }
        self.after.insert(first, right);
    }

    /// The request whose first entry is `first` was answered; `all_sent` when every entry of
    /// it was accepted.
    pub(super) fn answered(&mut self, first: &str, all_sent: bool) -> Next {
        let Some(next) = self.after.remove(first) else {
            return Next::Nothing;
        };
        if all_sent {
            return Next::Send(next);
        }
        let mut given_back = Vec::new();
        let mut next = Some(next);
        while let Some(request) = next {
            next = self.after.remove(&request.entries[0].id);
            given_back.push(request);
        }
        Next::GiveBack(given_back)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Entry;

    const QUEUE: &str = "http://sqs/1/orders.fifo";

    fn entry(row: usize) -> Entry {
        Entry {
            row,
            id: row.to_string(),
            body: "{}".into(),
            attributes: Vec::new(),
            group_id: Some("g".into()),
            dedup_id: Some(row.to_string()),
            size: 2,
            offload: None,
        }
    }

    /// A request of the rows `rows`.
    fn request(rows: std::ops::Range<usize>) -> BatchRequest {
        BatchRequest {
            destination: crate::destination::Destination::of_row(QUEUE),
            entries: rows.map(entry).collect(),
        }
    }

    fn firsts(requests: &[BatchRequest]) -> Vec<&str> {
        requests.iter().map(|r| r.entries[0].id.as_str()).collect()
    }

    #[test]
    fn a_sequel_goes_once_its_request_was_accepted() {
        let mut s = FollowUps::new(vec![("0".into(), request(10..12))]);
        assert_eq!(s.answered("0", true), Next::Send(request(10..12)));
        assert_eq!(s.answered("0", true), Next::Nothing, "sent once");
    }

    #[test]
    fn a_request_nothing_waits_for_has_no_sequel() {
        let mut s = FollowUps::new(vec![("0".into(), request(10..12))]);
        assert_eq!(s.answered("5", true), Next::Nothing);
        assert_eq!(s.answered("5", false), Next::Nothing);
        assert_eq!(s.answered("0", true), Next::Send(request(10..12)));
    }

    #[test]
    fn a_request_not_accepted_gives_back_its_whole_chain_unsent() {
        let mut s = FollowUps::new(vec![
            ("0".into(), request(10..12)),
            ("10".into(), request(20..22)),
            ("20".into(), request(30..32)),
        ]);
        let Next::GiveBack(back) = s.answered("0", false) else {
            panic!("the chain goes back");
        };
        assert_eq!(firsts(&back), ["10", "20", "30"]);
        assert_eq!(s.answered("10", true), Next::Nothing, "nothing left of it");
        assert_eq!(s.answered("20", true), Next::Nothing);
    }

    #[test]
    fn split_in_order_puts_the_second_half_between_the_first_and_the_old_sequel() {
        let whole = request(0..4);
        let mut s = FollowUps::new(vec![("0".into(), request(10..12))]);
        let (left, right) = whole.split();
        s.split_in_order(&left, right);
        // The left half is answered first: the right half follows it, then the old follow-up.
        assert_eq!(s.answered("0", true), Next::Send(request(2..4)));
        assert_eq!(s.answered("2", true), Next::Send(request(10..12)));
        assert_eq!(s.answered("10", true), Next::Nothing);
    }

    #[test]
    fn a_failed_first_half_gives_back_the_second_half_and_what_followed() {
        let mut s = FollowUps::new(vec![("0".into(), request(10..12))]);
        let (left, right) = request(0..4).split();
        s.split_in_order(&left, right);
        let Next::GiveBack(back) = s.answered("0", false) else {
            panic!("the halves after it go back");
        };
        assert_eq!(firsts(&back), ["2", "10"]);
    }

    #[test]
    fn halves_split_again_keep_the_chain_in_row_order() {
        let mut s = FollowUps::default();
        let (left, right) = request(0..8).split();
        s.split_in_order(&left, right);
        // The left half (0..4) is refused as a whole again and split in turn.
        let (left_left, left_right) = left.split();
        s.split_in_order(&left_left, left_right);
        assert_eq!(s.answered("0", true), Next::Send(request(2..4)));
        assert_eq!(s.answered("2", true), Next::Send(request(4..8)));
        assert_eq!(s.answered("4", true), Next::Nothing);
    }
}
