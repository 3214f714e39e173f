//! Settlements carried by the next claim: a delivery that is done hands its settlement over,
//! and the claim loop's next claim applies it in its own transaction (`Session::lease_settling`),
//! one transaction and one commit for both, on one connection. At the rates services run,
//! a claim cycle is then one transaction instead of two (docs/benchmarks.md, "A claim cycle").
//!
//! A settlement is carried only while claims come soon and the relay keeps up: the loop takes
//! what is waiting at each claim, and a delivery waits at most the latency budget
//! (`--max-delay`) for it. A loop that is idle (waiting for work, or gone) or behind (its last
//! claim came back full: settlements then keep a backend of their own, and a share of a busy
//! database's cores) hands everything back at once and takes nothing, and a delivery whose
//! settlement was not taken in time takes it back; either way the delivery settles it on its
//! own, as before. A settlement the loop took comes back with what each of
//! its rows came to, or whole when the claim failed (the delivery retries it on its own, as
//! after a settlement of its own whose answer was lost): whatever ends a claim, a taken
//! settlement always comes back ([`Taken`]'s drop).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::oneshot;

use crate::row::{Settled, Settlement};

/// What became of a settlement handed over.
#[derive(Debug)]
pub(super) enum Carried {
    /// A claim applied it, with this outcome.
    Settled(Settled),
    /// Not applied by a claim: the delivery settles it on its own. `tried`: a claim carried it
    /// and failed, and may have committed unseen.
    Back { settlement: Settlement, tried: bool },
}

/// The settlements waiting for the next claim.
#[derive(Debug, Default)]
pub(super) struct Carry {
    waiting: Mutex<Vec<Handed>>,
    /// Set while the loop is not about to claim: nothing is taken then.
    idle: AtomicBool,
    tickets: AtomicU64,
}

#[derive(Debug)]
struct Handed {
    ticket: u64,
    settlement: Option<Settlement>,
    answer: Option<oneshot::Sender<Carried>>,
}

impl Handed {
    fn answer(&mut self, carried: Carried) {
        if let Some(answer) = self.answer.take() {
            // A delivery that is gone (its task aborted at shutdown) needs no answer: its
            // rows are sent again after their lease, like those of any delivery cut short.
            let _ = answer.send(carried);
        }
    }
}

/// A settlement waiting for a claim, as its delivery holds it.
pub(super) struct Ticket {
    ticket: u64,
    answer: oneshot::Receiver<Carried>,
}

impl Carry {
    /// Hands `settlement` over to the next claim, or back at once when the loop is idle.
    pub(super) fn hand(&self, settlement: Settlement) -> Result<Ticket, Settlement> {
        // Under the lock that [`Carry::idle`] sets the flag under: nothing is left waiting
        // once the loop is idle.
        let mut waiting = self.waiting.lock().expect("carry lock");
        if self.idle.load(Ordering::Acquire) {
            return Err(settlement);
        }
        let (tx, rx) = oneshot::channel();
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        waiting.push(Handed {
            ticket,
            settlement: Some(settlement),
            answer: Some(tx),
        });
        Ok(Ticket { ticket, answer: rx })
    }

    /// What became of the settlement behind `ticket`, waiting for a claim at most `patience`.
    pub(super) async fn outcome(
        &self,
        mut ticket: Ticket,
        patience: std::time::Duration,
    ) -> Carried {
        if let Ok(answer) = tokio::time::timeout(patience, &mut ticket.answer).await {
            return answer.expect("a taken settlement is always answered");
        }
        let back = {
            let mut waiting = self.waiting.lock().expect("carry lock");
            let at = waiting.iter().position(|h| h.ticket == ticket.ticket);
            at.map(|at| waiting.swap_remove(at))
        };
        if let Some(mut handed) = back {
            handed.answer.take();
            let settlement = handed.settlement.take().expect("not taken");
            return Carried::Back {
                settlement,
                tried: false,
            };
        }
        // Taken meanwhile: its claim answers.
        ticket
            .answer
            .await
            .expect("a taken settlement is always answered")
    }

    /// What waits, for the claim about to run on the server that started at `server` (as
    /// the last claim found it). A settlement of a claim made on another server goes back:
    /// one statement settles claims of one server, and a claim of another would find none of
    /// them (sql/settle.sql).
    pub(super) fn take(&self, server: Option<i64>) -> Taken {
        let waiting = std::mem::take(&mut *self.waiting.lock().expect("carry lock"));
        let (parts, other): (Vec<_>, Vec<_>) = waiting
            .into_iter()
            .partition(|h| h.settlement.as_ref().is_some_and(|s| s.server == server));
        for mut handed in other {
            if let Some(settlement) = handed.settlement.take() {
                handed.answer(Carried::Back {
                    settlement,
                    tried: false,
                });
            }
        }
        Taken { parts }
    }

    /// The loop waits for work, or stops claiming: what waits is handed back, and nothing is
    /// taken until [`Carry::claiming`].
    pub(super) fn idle(&self) {
        let waiting = {
            let mut waiting = self.waiting.lock().expect("carry lock");
            self.idle.store(true, Ordering::Release);
            std::mem::take(&mut *waiting)
        };
        for mut handed in waiting {
            if let Some(settlement) = handed.settlement.take() {
                handed.answer(Carried::Back {
                    settlement,
                    tried: false,
                });
            }
        }
    }

    /// The loop claims again.
    pub(super) fn claiming(&self) {
        self.idle.store(false, Ordering::Release);
    }
}

/// The settlements a claim carries. Dropped unanswered (the claim failed or was cut short),
/// each goes back to its delivery, as possibly applied.
#[derive(Debug)]
pub(super) struct Taken {
    parts: Vec<Handed>,
}

impl Taken {
    /// The settlements, in the order [`Taken::settled`] takes their outcomes.
    pub(super) fn settlements(&self) -> Vec<&Settlement> {
        self.parts
            .iter()
            .filter_map(|h| h.settlement.as_ref())
            .collect()
    }

    /// The claim applied them: each delivery hears what its rows came to.
    pub(super) fn settled(mut self, outcomes: Vec<Settled>) {
        debug_assert_eq!(outcomes.len(), self.parts.len());
        for (handed, settled) in self.parts.iter_mut().zip(outcomes) {
            handed.settlement = None;
            handed.answer(Carried::Settled(settled));
        }
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        for handed in &mut self.parts {
            if let Some(settlement) = handed.settlement.take() {
                handed.answer(Carried::Back {
                    settlement,
                    tried: true,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::row::SentRow;

    fn settlement(id: i64) -> Settlement {
        Settlement {
            sent: vec![SentRow {
                id,
                lease_token: id,
                message_id: format!("m{id}"),
            }],
            ..Settlement::default()
        }
    }

    fn ids(s: &Settlement) -> Vec<i64> {
        s.sent.iter().map(|r| r.id).collect()
    }

    /// The ids of each settlement a claim took.
    fn taken_ids(taken: &Taken) -> Vec<Vec<i64>> {
        taken.settlements().iter().map(|s| ids(s)).collect()
    }

    /// Asserts that `carried` is `ids`'s settlement given back, `tried` by a claim or not.
    fn assert_back(carried: Carried, expected: &[i64], was_tried: bool) {
        match carried {
            Carried::Back { settlement, tried } => {
                assert_eq!(ids(&settlement), expected);
                assert_eq!(tried, was_tried);
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_claim_that_applied_the_settlements_answers_each_its_own() {
        let carry = Carry::default();
        let first = carry.hand(settlement(1)).unwrap();
        let second = carry.hand(settlement(2)).unwrap();
        let taken = carry.take(None);
        assert_eq!(taken_ids(&taken), [[1], [2]]);
        let outcome = |sent| Settled {
            sent,
            ..Settled::default()
        };
        taken.settled(vec![outcome(1), outcome(7)]);
        let patience = Duration::from_secs(60);
        match carry.outcome(second, patience).await {
            Carried::Settled(s) => assert_eq!(s.sent, 7),
            other => panic!("{other:?}"),
        }
        match carry.outcome(first, patience).await {
            Carried::Settled(s) => assert_eq!(s.sent, 1),
            other => panic!("{other:?}"),
        }
        assert!(carry.take(None).settlements().is_empty());
    }

    #[tokio::test]
    async fn a_settlement_of_a_claim_made_on_another_server_is_not_carried() {
        let carry = Carry::default();
        let mut before = settlement(8);
        before.server = Some(1);
        let mut after = settlement(9);
        after.server = Some(2);
        let (old, new) = (carry.hand(before).unwrap(), carry.hand(after).unwrap());
        let taken = carry.take(Some(2));
        assert_eq!(taken_ids(&taken), [[9]]);
        assert_back(
            carry.outcome(old, Duration::from_secs(60)).await,
            &[8],
            false,
        );
        taken.settled(vec![Settled::default()]);
        assert!(matches!(
            carry.outcome(new, Duration::from_secs(60)).await,
            Carried::Settled(_)
        ));
    }

    #[tokio::test]
    async fn a_failed_claim_gives_its_settlements_back_as_possibly_applied() {
        let carry = Carry::default();
        let ticket = carry.hand(settlement(3)).unwrap();
        drop(carry.take(None));
        assert_back(
            carry.outcome(ticket, Duration::from_secs(60)).await,
            &[3],
            true,
        );
    }

    #[tokio::test]
    async fn a_settlement_no_claim_took_in_time_comes_back_untried() {
        let carry = Carry::default();
        let ticket = carry.hand(settlement(4)).unwrap();
        assert_back(
            carry.outcome(ticket, Duration::from_millis(1)).await,
            &[4],
            false,
        );
        assert!(
            carry.take(None).settlements().is_empty(),
            "taken back, not left for a claim"
        );
    }

    #[tokio::test]
    async fn an_idle_loop_hands_back_what_waits_and_takes_nothing_until_it_claims() {
        let carry = Carry::default();
        let ticket = carry.hand(settlement(5)).unwrap();
        carry.idle();
        assert_back(
            carry.outcome(ticket, Duration::from_secs(60)).await,
            &[5],
            false,
        );
        let refused = carry
            .hand(settlement(6))
            .err()
            .expect("handed back at once");
        assert_eq!(ids(&refused), [6]);
        carry.claiming();
        assert!(carry.hand(settlement(7)).is_ok());
    }
}
