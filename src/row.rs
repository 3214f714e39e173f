//! The rows the relay works on and what becomes of them: the types shared by the outbox (which
//! reads and settles rows) and the planner (which turns rows into requests). A leaf: it depends
//! on neither.

use std::time::Duration;

use sha2::{Digest, Sha256};

/// Longest MessageGroupId / MessageDeduplicationId SQS accepts.
const MAX_FIFO_ID_LEN: usize = 128;

/// Why a row was quarantined; a bounded set, used as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuarantineReason {
    /// The message can never fit SQS's size limit.
    TooLarge,
    /// The row cannot be read (NULL where a value is needed, undecodable text, headers that
    /// are not a JSON object) or cannot be expressed as an SQS message (bad header, bad
    /// characters).
    Invalid,
    /// SQS refused the entry as bad input (`SenderFault`).
    SenderFault,
    /// SQS refused a request holding only this entry, as bad input.
    Rejected,
    /// Retryable failures went on past `--max-attempts`.
    MaxAttempts,
    /// The row's queue refused the relay (missing, access denied): parked, not failed. It
    /// comes back by itself when its queue is tried again, its attempt refunded.
    Destination,
}

impl QuarantineReason {
    pub fn as_str(self) -> &'static str {
        match self {
            QuarantineReason::TooLarge => "too_large",
            QuarantineReason::Invalid => "invalid",
            QuarantineReason::SenderFault => "sender_fault",
            QuarantineReason::Rejected => "rejected",
            QuarantineReason::MaxAttempts => "max_attempts",
            QuarantineReason::Destination => "destination",
        }
    }
}

/// A row this relay holds a lease on.
#[derive(Debug, Clone)]
pub struct ClaimedRow {
    pub id: i64,
    pub event_id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    /// The payload as JSON text, which becomes the message body.
    pub payload: String,
    pub headers: serde_json::Value,
    /// The row's own destination (its `queue_url` column, parsed as it is read); `None`: its
    /// route or the default.
    pub queue_url: Option<crate::destination::Destination>,
    /// Fencing generation: settlements only apply while the row still carries it.
    pub lease_token: i64,
    /// Attempts including this claim.
    pub attempts: i32,
    /// `created_at` as Unix seconds, for the delivery-lag histogram.
    pub created_at_epoch: f64,
    /// `created_at` in RFC 3339 (UTC), for envelopes such as CloudEvents' `time`.
    pub created_at: String,
    /// Columns the relay could not read: the planner rejects the row `invalid` in its place in
    /// its group, so under `--on-poison block` it holds the rows behind it like any poison.
    pub unreadable: Option<Unreadable>,
    /// The FIFO deduplication ID when it is not the `event_id`: set by `replay
    /// --new-dedup-id`, so that a copy sent again within SQS's deduplication window arrives.
    pub dedup_id: Option<String>,
}

/// The rows one claim leased (readable or not), and those it quarantined.
#[derive(Debug, Default)]
pub struct Claimed {
    /// In `id` order; an unreadable row among them says so ([`ClaimedRow::unreadable`]).
    pub rows: Vec<ClaimedRow>,
    /// Quarantined by the claim itself, not leased: nothing to send or settle.
    pub quarantined: Vec<QuarantinedAtClaim>,
    /// Where the next ordered claim continues looking for groups (see claim_ordered.sql).
    pub cursor: Option<String>,
    /// Rows made claimable again after the claim, by taking over claims that had ended
    /// (sql/takeover.sql): the next claim may take them at once.
    pub freed: u64,
    /// Refused rows that the quarantine after the claim did not change (sql/refuse.sql).
    pub kept: Kept,
    /// When the server the claim was made on started (microseconds since the epoch): after a
    /// crash it may have lost the claim, and handed its token to another.
    pub server: Option<i64>,
}

impl Claimed {
    /// Rows the claim took: leased (readable or not) or quarantined by it.
    pub fn len(&self) -> usize {
        self.rows.len() + self.quarantined.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What of a claimed row the relay cannot use: NULL where a value is needed, text that is
/// not UTF-8, headers that are not a JSON object. The row's other columns were read as far as
/// they could be (an unread one is empty), so it still has its place in its group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// Names the first column that failed and what is wrong with it, never its value.
    pub error: String,
    /// Every column that failed (`aggregate_id`, `headers`, ...): a row whose group key is
    /// among them belongs to no group.
    pub columns: Vec<&'static str>,
}

/// Refused rows that their quarantine after a claim did not change (sql/refuse.sql): what
/// the relay looks at, since the same cause would undo its settlements.
#[derive(Debug, Default)]
pub enum Kept {
    #[default]
    Nothing,
    /// The ids it meant to quarantine and left out: those still unsent and unquarantined
    /// after its commit were kept by something on the table.
    Rows(Vec<i64>),
    /// The server refused the quarantine itself: a rule rewrites its UPDATE.
    ByRule(String),
}

/// A row the claim quarantined instead of leasing it: its payload is larger than the relay
/// can hold (`TooLarge`), or its claims kept ending without an outcome (`MaxAttempts`: the
/// relays holding it died). Its payload was never read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantinedAtClaim {
    pub id: i64,
    pub event_id: Option<String>,
    pub reason: QuarantineReason,
    /// What the claim wrote to `last_error`.
    pub error: String,
}

/// Outcomes of one claim, one statement per class.
#[derive(Debug, Default)]
pub struct Settlement {
    pub sent: Vec<SentRow>,
    pub reschedule: Vec<RescheduledRow>,
    pub quarantine: Vec<QuarantinedRow>,
    /// When the server the claim was made on started ([`Claimed::server`]): the settlement
    /// applies there only, or to a claim still there from before the server started.
    /// `None`: wherever.
    pub server: Option<i64>,
    /// The claim's lease (`--lease`): when its row was made, with its `until`.
    pub lease: Duration,
}

#[derive(Debug)]
pub struct SentRow {
    pub id: i64,
    pub lease_token: i64,
    pub message_id: String,
}

#[derive(Debug)]
pub struct RescheduledRow {
    pub id: i64,
    pub lease_token: i64,
    pub delay: Duration,
    /// Kept in `last_error`; `None` keeps the previous error (a plain release).
    pub error: Option<String>,
    /// Give the claim's attempt back: the failure was not the row's.
    pub refund: bool,
}

#[derive(Debug)]
pub struct QuarantinedRow {
    pub id: i64,
    pub lease_token: i64,
    pub reason: QuarantineReason,
    pub error: String,
    /// Parked rather than failed: unsent again after this long (the relay's maintenance
    /// unparks it), with the claim's attempt refunded. `None`: stays until an operator acts.
    pub retry_in: Option<Duration>,
}

impl Settlement {
    pub fn is_empty(&self) -> bool {
        self.sent.is_empty() && self.reschedule.is_empty() && self.quarantine.is_empty()
    }

    /// The ids of its rows whose claim is not among `fenced`.
    pub fn without_claims(&self, fenced: &[i64]) -> Vec<i64> {
        let sent = self.sent.iter().map(|r| (r.id, r.lease_token));
        let rescheduled = self.reschedule.iter().map(|r| (r.id, r.lease_token));
        sent.chain(rescheduled)
            .chain(self.quarantine.iter().map(|r| (r.id, r.lease_token)))
            .filter(|(_, token)| !fenced.contains(token))
            .map(|(id, _)| id)
            .collect()
    }

    /// The lease tokens of the claims whose outcomes these are, each once.
    pub fn tokens(&self) -> Vec<i64> {
        let sent = self.sent.iter().map(|r| r.lease_token);
        let rescheduled = self.reschedule.iter().map(|r| r.lease_token);
        let mut tokens: Vec<i64> = sent
            .chain(rescheduled)
            .chain(self.quarantine.iter().map(|r| r.lease_token))
            .collect();
        tokens.sort_unstable();
        tokens.dedup();
        tokens
    }
}

/// How many rows each statement actually changed; the rest had been taken over.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Settled {
    pub sent: u64,
    pub rescheduled: u64,
    /// The reasons of the rows actually quarantined (for the per-reason counter).
    pub quarantined_reasons: Vec<QuarantineReason>,
    pub lost: u64,
    /// Acknowledged rows of claims the fence found, when the statement changed fewer rows than
    /// that: something on the table may have undone the settlement (a trigger, a rule,
    /// row-level security), or another statement removed some of them. The caller stops
    /// sending before it looks ([`crate::outbox::Session::unsettled`]), so that no claim of
    /// its own sends them again in between.
    pub suspect: Vec<i64>,
}

/// A per-row key: the FIFO message group, the routing key, the fairness key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyColumn {
    AggregateId,
    AggregateType,
    EventType,
    /// A string entry of the row's `headers`.
    Header(String),
}

impl KeyColumn {
    /// The row's value for this key; `None` when a header is absent.
    pub fn value<'a>(&self, row: &'a ClaimedRow) -> Option<std::borrow::Cow<'a, str>> {
        use std::borrow::Cow;
        match self {
            KeyColumn::AggregateId => Some(Cow::Borrowed(&row.aggregate_id)),
            KeyColumn::AggregateType => Some(Cow::Borrowed(&row.aggregate_type)),
            KeyColumn::EventType => Some(Cow::Borrowed(&row.event_type)),
            KeyColumn::Header(name) => match row.headers.get(name)? {
                serde_json::Value::String(s) => Some(Cow::Borrowed(s)),
                serde_json::Value::Number(n) => Some(Cow::Owned(n.to_string())),
                serde_json::Value::Bool(b) => Some(Cow::Owned(b.to_string())),
                _ => None,
            },
        }
    }

    /// The claimed column the value comes from (a header's: `headers`).
    pub fn column(&self) -> &'static str {
        match self {
            KeyColumn::AggregateId => "aggregate_id",
            KeyColumn::AggregateType => "aggregate_type",
            KeyColumn::EventType => "event_type",
            KeyColumn::Header(_) => "headers",
        }
    }

    /// A short name usable inside identifiers (index names).
    pub fn slug(&self) -> String {
        match self {
            KeyColumn::AggregateId => "aggregate_id".into(),
            KeyColumn::AggregateType => "aggregate_type".into(),
            KeyColumn::EventType => "event_type".into(),
            KeyColumn::Header(name) => format!("h_{}", name.replace(['.', '-'], "_")),
        }
    }
}

impl std::str::FromStr for KeyColumn {
    type Err = String;

    /// `aggregate_id`, `aggregate_type`, `event_type` or `header:NAME`. Header names follow
    /// SQS's attribute-name characters, which also keeps them safe inside index definitions.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "aggregate_id" => Ok(KeyColumn::AggregateId),
            "aggregate_type" => Ok(KeyColumn::AggregateType),
            "event_type" => Ok(KeyColumn::EventType),
            _ => match s.strip_prefix("header:") {
                Some(name)
                    if !name.is_empty()
                        && name.len() <= 128
                        && name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) =>
                {
                    Ok(KeyColumn::Header(name.to_string()))
                }
                _ => Err(format!(
                    "{s:?} is not a key: use aggregate_id, aggregate_type, event_type or header:NAME (NAME of letters, digits, _ - .)"
                )),
            },
        }
    }
}

impl std::fmt::Display for KeyColumn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyColumn::Header(name) => write!(f, "header:{name}"),
            other => f.write_str(&other.slug()),
        }
    }
}

/// A FIFO group or deduplication ID: the value itself where SQS accepts it (1–128 printable
/// ASCII characters), otherwise its SHA-256 hex, which is stable, so the same aggregate always
/// maps to the same group and the same event to the same deduplication ID.
pub fn fifo_id(value: &str) -> String {
    let valid = !value.is_empty()
        && value.len() <= MAX_FIFO_ID_LEN
        && value.bytes().all(|b| (0x21..=0x7e).contains(&b));
    if valid {
        value.to_string()
    } else {
        let digest = Sha256::digest(value.as_bytes());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }
}
