//! What a group is: the rows that keep their order among themselves are one destination's rows
//! of one group key, `(destination, key)`, in the planner, the claim, parking and unparking
//! alike. A leaf: the planner takes [`Group`], the claim's SQL takes [`Routing`] and renders
//! the one fragment `sql/destination.sql` from it.

use crate::destination::Destination;
use crate::row::{ClaimedRow, KeyColumn};

/// One ordered group: a row's destination and its group key's value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Group {
    /// Where the group's rows go (a queue URL, topic ARN): the same key on two destinations is
    /// two groups, so one's quarantined row never holds the other.
    pub destination: Destination,
    /// The `--group-by` value (the FIFO MessageGroupId's source); empty when a header is absent.
    pub key: String,
}

impl Group {
    /// The group of `row` bound for `destination`. `None` when the row's key column could not
    /// be read: the claim's SQL sees no value there either, so the row belongs to no group.
    pub fn of(row: &ClaimedRow, destination: &Destination, key: &KeyColumn) -> Option<Group> {
        if row
            .unreadable
            .as_ref()
            .is_some_and(|u| u.columns.contains(&key.column()))
        {
            return None;
        }
        Some(Group {
            destination: destination.clone(),
            key: key.value(row).unwrap_or_default().into_owned(),
        })
    }
}

/// Where rows go, as SQL needs it to tell groups apart: the same rule as the planner's
/// (`PlanConfig::queue_for`): a row's own `queue_url`, else the `--route` of its `route_by`
/// value, else the default destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routing {
    /// `--queue-url`: where rows with neither their own queue_url nor a route go.
    pub default: String,
    /// `--route`: key value -> destination.
    pub routes: Vec<(String, String)>,
    /// The key `routes` match on (`--route-by`); unused without routes.
    pub route_by: KeyColumn,
}

impl Default for Routing {
    /// One destination, unnamed: every row without its own queue_url shares it.
    fn default() -> Self {
        Routing {
            default: String::new(),
            routes: Vec::new(),
            route_by: KeyColumn::AggregateType,
        }
    }
}

impl Routing {
    /// The texts SQL compares: each destination as it was written (its `Display`), the same text
    /// a row's own `queue_url` column holds for it.
    pub fn new(
        default: &Destination,
        routes: &[(String, Destination)],
        route_by: &KeyColumn,
    ) -> Routing {
        Routing {
            default: default.to_string(),
            routes: routes
                .iter()
                .map(|(key, destination)| (key.clone(), destination.to_string()))
                .collect(),
            route_by: route_by.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::Unreadable;

    fn to(text: &str) -> Destination {
        Destination::of_row(text)
    }

    fn row() -> ClaimedRow {
        ClaimedRow {
            id: 1,
            event_id: "e".into(),
            aggregate_type: "order".into(),
            aggregate_id: "17".into(),
            event_type: "order.paid".into(),
            payload: "{}".into(),
            headers: serde_json::json!({"tenant": "t1"}),
            queue_url: None,
            lease_token: 1,
            attempts: 1,
            created_at_epoch: 0.0,
            created_at: String::new(),
            unreadable: None,
            dedup_id: None,
        }
    }

    #[test]
    fn the_same_key_on_two_destinations_is_two_groups() {
        let r = row();
        let a = Group::of(&r, &to("https://q/a.fifo"), &KeyColumn::AggregateId).unwrap();
        let b = Group::of(&r, &to("https://q/b.fifo"), &KeyColumn::AggregateId).unwrap();
        assert_ne!(a, b);
        assert_eq!(a.key, b.key);
        let tenant: KeyColumn = "header:tenant".parse().unwrap();
        assert_eq!(Group::of(&r, &to("http://q/d"), &tenant).unwrap().key, "t1");
    }

    #[test]
    fn a_row_whose_key_cannot_be_read_has_no_group_but_other_unread_columns_keep_it() {
        let mut r = row();
        r.unreadable = Some(Unreadable {
            error: "column \"aggregate_id\" is NULL".into(),
            columns: vec!["aggregate_id"],
        });
        assert_eq!(
            Group::of(&r, &to("http://q/d"), &KeyColumn::AggregateId),
            None
        );
        r.unreadable = Some(Unreadable {
            error: "column \"headers\" is not a JSON object but an array".into(),
            columns: vec!["headers"],
        });
        assert!(Group::of(&r, &to("http://q/d"), &KeyColumn::AggregateId).is_some());
        assert_eq!(
            Group::of(&r, &to("http://q/d"), &"header:tenant".parse().unwrap()),
            None
        );
    }
}
