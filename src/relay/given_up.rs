//! Claims the relay gave up on (docs/failure-handling.md, "The database"): a claim whose
//! answer did not come back within `--db-timeout` may still have committed on the server. Its
//! lease would hold its rows for a whole `--lease` with no relay to send them, and the takeover
//! would count an attempt the rows never made. Claims of one table run one after the other in
//! a relay, so after such a claim every live claim of this relay's is either one whose rows it
//! is delivering (held here) or one it gave up on: before its next claim the relay removes
//! those (sql/release_orphans.sql).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The lease tokens of the claims whose rows the relay is delivering, and whether a claim was
/// given up on since the last release.
#[derive(Debug, Default)]
pub(super) struct GivenUp {
    held: Mutex<HashMap<i64, usize>>,
    pending: AtomicBool,
}

impl GivenUp {
    /// A claim ended without an answer the relay could trust: it may have committed.
    pub(super) fn claim_given_up(&self) {
        self.pending.store(true, Ordering::Relaxed);
    }

    /// The tokens to keep when a release is due, `None` when none is.
    pub(super) fn due(&self) -> Option<Vec<i64>> {
        if !self.pending.load(Ordering::Relaxed) {
            return None;
        }
        Some(
            self.held
                .lock()
                .expect("held lock")
                .keys()
                .copied()
                .collect(),
        )
    }

    /// The release went through: nothing is due until a claim is given up on again.
    pub(super) fn released(&self) {
        self.pending.store(false, Ordering::Relaxed);
    }

    /// Marks `tokens` held until the returned guard drops (when their delivery ends, however it
    /// ends: settled, given back, or its task aborted).
    pub(super) fn hold(self: &Arc<Self>, tokens: impl IntoIterator<Item = i64>) -> Held {
        let tokens: Vec<i64> = tokens.into_iter().filter(|t| *t != 0).collect();
        let mut held = self.held.lock().expect("held lock");
        for t in &tokens {
            *held.entry(*t).or_default() += 1;
        }
        Held {
            tokens,
            of: Arc::clone(self),
        }
    }
}

/// Claims held while their delivery runs.
#[derive(Debug)]
pub(super) struct Held {
    tokens: Vec<i64>,
    of: Arc<GivenUp>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.of.held.lock().expect("held lock");
        for t in &self.tokens {
            if let Some(n) = held.get_mut(t) {
                *n -= 1;
                if *n == 0 {
                    held.remove(t);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_is_due_after_a_claim_given_up_and_keeps_the_claims_in_delivery() {
        let g = Arc::new(GivenUp::default());
        let first = g.hold([7, 7, 0]);
        assert_eq!(g.due(), None, "nothing given up yet");
        g.claim_given_up();
        let second = g.hold([9]);
        let mut kept = g.due().expect("due");
        kept.sort_unstable();
        assert_eq!(
            kept,
            [7, 9],
            "token 0 (rows quarantined at claim) is no claim"
        );
        drop(first);
        assert_eq!(
            g.due(),
            Some(vec![9]),
            "a delivery that ended holds nothing"
        );
        g.released();
        assert_eq!(g.due(), None);
        drop(second);
        g.claim_given_up();
        assert_eq!(g.due(), Some(vec![]));
    }
}
