//! Why a table's rows do not move, named from what `status` read, in the words the relay logs,
//! each with the runbook section that says what to do. Pure: figures in, causes out.

use super::tables::TableView;
use crate::outbox::TableReport;

/// One reason rows wait, and where the runbook deals with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    pub text: String,
    /// The section's anchor in docs/operations.md.
    pub runbook: &'static str,
    /// It stops claims or sends outright (shown first, in red), rather than setting rows aside.
    pub stops: bool,
}

impl Cause {
    fn stops(text: String, runbook: &'static str) -> Cause {
        Cause {
            text,
            runbook,
            stops: true,
        }
    }

    fn aside(text: String, runbook: &'static str) -> Cause {
        Cause {
            text,
            runbook,
            stops: false,
        }
    }
}

/// The causes of one table, those that stop everything first.
pub fn causes(view: &TableView) -> Vec<Cause> {
    let status = match &view.report {
        TableReport::Failed { error, .. } => {
            return vec![Cause::stops(
                format!("the table cannot be read: {error}"),
                "outboxrelaycannotreadtable",
            )]
        }
        TableReport::Read(status) => status,
    };
    let mut found = Vec::new();
    if let Some(hidden) = &status.hidden {
        found.push(Cause::stops(hidden.clone(), "row-level-security"));
    }
    for trigger in status.triggers.iter().filter(|t| t.undoes) {
        found.push(Cause::stops(
            format!("{}: {}", trigger.what, trigger.effect),
            "triggers-and-rules",
        ));
    }
    for relay in status.relays.iter().filter(|r| !r.claiming) {
        found.push(Cause::stops(
            format!(
                "relay {} ({}) does not claim: the table's schema refuses its version, or it is stopping",
                relay.relay_id, relay.version
            ),
            "outboxrelayrefusedbyschema",
        ));
    }
    if status.relays.is_empty() && status.unsent > 0 {
        found.push(Cause::stops(
            "no live relay serves this table".to_string(),
            "outboxrelaydown",
        ));
    }
    for parked in &view.parked {
        let destination = if parked.destination.is_empty() {
            "the relays' --queue-url or route".to_string()
        } else {
            parked.destination.clone()
        };
        found.push(Cause::stops(
            format!(
                "{} row(s) parked while {destination} refuses them: {}",
                parked.rows, parked.last_error
            ),
            "rows-parked-for-their-queue-destination",
        ));
    }
    if let Some(held) = &status.held_back {
        if held.rows > 0 {
            found.push(Cause::aside(
                format!(
                    "{} row(s) held back: a transaction older than theirs still runs (--order-by transaction)",
                    held.rows
                ),
                "outboxorderheldback",
            ));
        }
    }
    for (reason, n) in &status.quarantined_by_reason {
        if reason != "destination" && *n > 0 {
            found.push(Cause::aside(
                format!("{n} row(s) quarantined: {reason}"),
                "why-rows-are-quarantined",
            ));
        }
    }
    found.sort_by_key(|c| !c.stops);
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::{LiveRelay, ParkedDestination, TableStatus};
    use std::collections::BTreeMap;

    fn status() -> TableStatus {
        TableStatus {
            table: "\"public\".\"outbox\"".into(),
            unsent: 3,
            leased: 0,
            parked: 2,
            quarantined: 3,
            quarantined_by_reason: BTreeMap::from([
                ("destination".to_string(), 2),
                ("invalid".to_string(), 1),
            ]),
            oldest_unsent_age_seconds: 12.0,
            oldest_quarantined_age_seconds: 3.0,
            sent_last_minute: 0,
            unsent_counted_from_id: 0,
            held_back: None,
            relays: vec![LiveRelay {
                relay_id: "r1".into(),
                version: "0.9.0".into(),
                host: "h".into(),
                started_at: "now".into(),
                running_seconds: 1.0,
                last_claim_seconds_ago: Some(0.5),
                claiming: true,
                unsent_floor: None,
                claims_floor: None,
            }],
            unregistered: Vec::new(),
            triggers: Vec::new(),
            hidden: None,
        }
    }

    fn view(status: TableStatus, parked: Vec<ParkedDestination>) -> TableView {
        TableView {
            key: status.table.clone(),
            report: TableReport::Read(status),
            parked,
            sent_per_minute: Vec::new(),
        }
    }

    #[test]
    fn a_parked_destination_stops_and_a_quarantined_row_is_set_aside() {
        let parked = ParkedDestination {
            destination: "http://sqs/q".into(),
            rows: 2,
            oldest_age_seconds: 12.0,
            last_error: "AWS.SimpleQueueService.NonExistentQueue".into(),
        };
        let found = causes(&view(status(), vec![parked]));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].stops && found[0].text.contains("http://sqs/q"));
        assert_eq!(found[0].runbook, "rows-parked-for-their-queue-destination");
        assert!(!found[1].stops && found[1].text.contains("invalid"));
    }

    #[test]
    fn no_relay_hidden_rows_and_an_undoing_trigger_each_stop() {
        let mut s = status();
        s.relays.clear();
        s.hidden = Some("row-level security hides rows".into());
        s.quarantined_by_reason.clear();
        let found = causes(&view(s, Vec::new()));
        let anchors: Vec<_> = found.iter().map(|c| c.runbook).collect();
        assert_eq!(anchors, ["row-level-security", "outboxrelaydown"]);
        let failed = TableView {
            key: "t".into(),
            report: TableReport::Failed {
                table: "t".into(),
                error: "permission denied".into(),
            },
            parked: Vec::new(),
            sent_per_minute: Vec::new(),
        };
        assert_eq!(causes(&failed)[0].runbook, "outboxrelaycannotreadtable");
    }

    #[test]
    fn a_quiet_table_has_no_cause() {
        let mut s = status();
        s.quarantined_by_reason.clear();
        assert!(causes(&view(s, Vec::new())).is_empty());
    }
}
