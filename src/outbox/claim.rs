//! Claim strategies: how a claim chooses rows. Each strategy owns its SQL and the parameters
//! that SQL takes, so the two cannot disagree: [`ClaimStrategy::sql`] renders the statement,
//! [`ClaimStrategy::bind`] lists its parameters in order, a unit test checks every strategy's
//! statement against its parameter count, and `Outbox::connect` (so `run` and `check`) compares
//! the prepared statement's parameters with the strategy's before anything is claimed.

use std::time::Duration;

use tokio_postgres::types::ToSql;

use super::ident::{key_sql, TableName};
use super::order_by::{OrderBy, XACT_COLUMN};
use super::template::{fragment, render, Value};
use crate::group::Routing;
use crate::row::{KeyColumn, QuarantineReason};

/// How claims choose rows; built once at start-up from the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ClaimStrategy {
    /// The oldest claimable rows, in id order.
    #[default]
    Plain,
    /// Round-robin across the values of a key, so a burst under one value cannot starve the others.
    Fair { key: KeyColumn },
    /// Per-group order (see sql/claim_ordered.sql).
    Ordered(Ordered),
    /// Per-group order, with the groups' heads taken round-robin across the values of `fair`.
    OrderedFair { ordered: Ordered, fair: KeyColumn },
}

/// Per-group ordered delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ordered {
    /// The group's key: the same key as the FIFO MessageGroupId.
    pub key: KeyColumn,
    /// Where rows go: the group's other half, its destination (a group is (destination, key)).
    pub routing: Routing,
    /// `--on-poison skip`: a row quarantined as poison no longer holds its group back.
    pub skip_poison: bool,
    /// Which rows are ordered.
    pub scope: OrderScope,
    /// What "earlier" means within a group (`--order-by`).
    pub by: OrderBy,
}

/// Which rows ordered delivery applies to: ordering is decided per destination queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderScope {
    /// Every row (`--ordered on`, or a FIFO default queue).
    Every,
    /// Rows whose destination is a FIFO queue: their own `queue_url`, else the `--route` of
    /// their `route_by` value when that route's queue is FIFO (`fifo_routes` lists those
    /// values). The default queue is standard.
    FifoDestinations {
        route_by: KeyColumn,
        fifo_routes: Vec<String>,
    },
}

/// What one claim asks for; the strategy picks the parameters its statement takes.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    /// Rows at most.
    pub limit: i64,
    pub owner: String,
    pub lease: Duration,
    /// Payload bytes at most (the first row is always claimed, whatever its size).
    pub budget_bytes: i64,
    /// Ordered claims: the group key after which `others` continues (see claim_ordered.sql).
    pub cursor: Option<String>,
    /// The relay is behind (the claim before came back full, and this one asks for more than
    /// `--batch-size`): the claim is planned with its parameters (see `session::CUSTOM_PLANS`).
    pub catching_up: bool,
}

/// Which rows a claim quarantines instead of leasing (see sql/claim.sql); fixed at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimLimits {
    /// A payload larger than this is quarantined `too_large` from its size measured in SQL,
    /// never read (`--max-payload-bytes`).
    pub max_payload_bytes: i64,
    /// A row whose attempts already reached this is quarantined `max_attempts` instead of being
    /// claimed once more: its last claims ended without an outcome (`--max-attempts`).
    pub max_attempts: i32,
}

impl ClaimLimits {
    /// What a row refused at claim gets in `last_error` (sql/refuse.sql): why, with the limit
    /// it reached. `bytes` is its payload's size as the claim measured it, `attempts` the
    /// attempts that ended.
    pub fn refusal_error(&self, reason: QuarantineReason, bytes: i64, attempts: i32) -> String {
        match reason {
            QuarantineReason::TooLarge => format!(
                "payload of {bytes} bytes is larger than the relay can hold ({} bytes, --max-payload-bytes); quarantined at claim without being read",
                self.max_payload_bytes.max(1)
            ),
            _ => format!(
                "claimed {attempts} times (--max-attempts {}) and the last claim ended without an outcome: the relay holding it stopped or lost its lease; quarantined at claim, not sent again",
                self.max_attempts.max(1)
            ),
        }
    }
}

impl Default for ClaimLimits {
    /// No limit: what a library user who sets none gets.
    fn default() -> Self {
        ClaimLimits {
            max_payload_bytes: i64::MAX,
            max_attempts: i32::MAX,
        }
    }
}

/// The parameters, owned, in the types the statements declare.
#[derive(Debug)]
pub struct ClaimParams {
    limit: i64,
    owner: String,
    lease_seconds: f64,
    budget_bytes: i64,
    /// Where the claim starts in the outbox and in the lease table (src/outbox/floors.rs).
    floor: i64,
    claims_floor: i64,
    window: i64,
    cursor: Option<String>,
    keys_per_claim: i64,
    fifo_routes: Vec<String>,
    max_payload_bytes: i64,
    max_attempts: i32,
}

impl ClaimParams {
    /// The claims' floor this claim reads the lease table from: its first statement's
    /// parameter too (sql/claim_start.sql).
    pub fn claims_floor(&self) -> &i64 {
        &self.claims_floor
    }

    /// `floors`: the rows' floor and the claims' (src/outbox/floors.rs), as read for this claim.
    pub fn new(
        request: &ClaimRequest,
        strategy: &ClaimStrategy,
        limits: &ClaimLimits,
        (floor, claims_floor): (i64, i64),
    ) -> ClaimParams {
        let fifo_routes = match strategy.ordered().map(|o| &o.scope) {
            Some(OrderScope::FifoDestinations { fifo_routes, .. }) => fifo_routes.clone(),
            _ => Vec::new(),
        };
        ClaimParams {
            limit: request.limit,
            owner: request.owner.clone(),
            lease_seconds: request.lease.as_secs_f64(),
            budget_bytes: request.budget_bytes.max(1),
            floor,
            claims_floor,
            window: ordered_window(request.limit),
            cursor: request.cursor.clone(),
            keys_per_claim: request.limit.clamp(1, 100),
            fifo_routes,
            max_payload_bytes: limits.max_payload_bytes.max(1),
            max_attempts: limits.max_attempts.max(1),
        }
    }
}

/// Rows the ordered claim's `oldest` looks at, at most: about two claims' worth of group heads
/// when groups interleave, and little to read when a few groups hold a long backlog (`others`
/// reaches the groups behind them).
fn ordered_window(limit: i64) -> i64 {
    (limit * 2).max(200)
}

impl ClaimStrategy {
    /// The strategy for a configuration's ordering and fairness.
    pub fn new(ordered: Option<Ordered>, fair: Option<KeyColumn>) -> ClaimStrategy {
        match (ordered, fair) {
            (None, None) => ClaimStrategy::Plain,
            (None, Some(key)) => ClaimStrategy::Fair { key },
            (Some(ordered), None) => ClaimStrategy::Ordered(ordered),
            (Some(ordered), Some(fair)) => ClaimStrategy::OrderedFair { ordered, fair },
        }
    }

    pub fn ordered(&self) -> Option<&Ordered> {
        match self {
            ClaimStrategy::Ordered(o) | ClaimStrategy::OrderedFair { ordered: o, .. } => Some(o),
            _ => None,
        }
    }

    /// The order within a group; insertion order when nothing is ordered.
    pub fn order_by(&self) -> OrderBy {
        self.ordered().map(|o| o.by).unwrap_or_default()
    }

    pub fn fair(&self) -> Option<&KeyColumn> {
        match self {
            ClaimStrategy::Fair { key } | ClaimStrategy::OrderedFair { fair: key, .. } => Some(key),
            _ => None,
        }
    }

    /// The full ordered claim (claim_ordered.sql: runs, the groups' cursor) applies when every
    /// row is ordered; with a standard default queue the plain or fair claim holds back the
    /// FIFO-bound rows that are not their group's head.
    fn full_ordered(&self) -> bool {
        self.ordered().is_some_and(|o| o.scope == OrderScope::Every)
    }

    /// Whether the claim is planned at every execution rather than once (`session::PLANS`):
    /// the full ordered claim, whose generic plan runs slower than planning it each time.
    pub(crate) fn planned_each_time(&self) -> bool {
        self.full_ordered()
    }

    /// Whether a claim returns the next cursor as its last column, and may return one row
    /// with no claimed row in it.
    pub fn returns_cursor(&self) -> bool {
        self.full_ordered()
    }

    /// How many parameters [`ClaimStrategy::bind`] gives the statement.
    pub fn param_count(&self) -> usize {
        self.mode_param_count() + 3
    }

    /// The parameters before the two limits every strategy ends with.
    fn mode_param_count(&self) -> usize {
        if self.full_ordered() {
            return 8;
        }
        5 + usize::from(self.ordered().is_some())
    }

    /// The placeholders of the limits ([`ClaimLimits`]): the two parameters after the mode's.
    fn limit_params(&self) -> (String, String) {
        let n = self.mode_param_count();
        (format!("${}::bigint", n + 1), format!("${}::int", n + 2))
    }

    /// The placeholder of the claims' floor: the last parameter.
    fn claims_floor_param(&self) -> String {
        format!("${}::bigint", self.mode_param_count() + 3)
    }

    /// The parameters of the statement, in order: limit, owner, lease, budget, the rows' floor;
    /// then the window, the cursor and the groups per claim (full ordered), or the keys of the
    /// FIFO routes (rows bound for FIFO queues ordered); then the largest payload and the most
    /// attempts a row may have; last the claims' floor.
    pub fn bind<'a>(&self, b: &'a ClaimParams) -> Vec<&'a (dyn ToSql + Sync)> {
        let mut params: Vec<&'a (dyn ToSql + Sync)> = vec![
            &b.limit,
            &b.owner,
            &b.lease_seconds,
            &b.budget_bytes,
            &b.floor,
        ];
        if self.full_ordered() {
            params.extend([
                &b.window as &(dyn ToSql + Sync),
                &b.cursor,
                &b.keys_per_claim,
            ]);
        } else if self.ordered().is_some() {
            params.push(&b.fifo_routes);
        }
        params.extend([
            &b.max_payload_bytes as &(dyn ToSql + Sync),
            &b.max_attempts,
            &b.claims_floor,
        ]);
        debug_assert_eq!(params.len(), self.param_count());
        params
    }

    /// The claim statement for `table`.
    pub fn sql(&self, table: &TableName) -> Result<String, String> {
        let t = Value::Table(table);
        let claims = table.claims();
        let l = Value::Table(&claims);
        let (max_payload, max_attempts) = self.limit_params();
        let measured = measured(&max_payload, &max_attempts)?;
        let claims_floor = self.claims_floor_param();
        let leased = render(
            include_str!("../../sql/claim_leased.sql"),
            &[("claims", l), ("claims_floor", Value::Sql(&claims_floor))],
        )?;
        let ordered = self.ordered();
        // Ordered claims test every head against the groups claims hold (`nothing_in_flight`).
        let leased = match ordered {
            Some(o) => format!(
                "{}\n{},",
                leased.trim_end(),
                in_flight(table, o, "SELECT id FROM leased")?
            ),
            None => leased.trim_end().to_string(),
        };
        let leased = leased.as_str();
        let payload = payload_bytes(Some("c"), &max_payload);
        let row_c = row_columns("c", self.order_by());
        let head_c = ordered
            .map(|o| group_head(table, o, "c", "p"))
            .transpose()?;
        // The statement reads in this order: the leased rows (sql/claim_leased.sql), the
        // strategy's candidates, then the lease and the rows' update (sql/claim.sql).
        let update = render(
            include_str!("../../sql/claim.sql"),
            &[
                ("table", t),
                ("claims", l),
                ("turn_o", Value::Sql(&self.order_by().turn("o"))),
            ],
        )?;
        if !self.full_ordered() {
            // Rows bound for a FIFO queue ($6, the FIFO routes' keys) wait until they are their
            // group's head; the others are not held.
            let ordered_filter = match (ordered, &head_c) {
                (Some(o), Some(head)) => {
                    format!("AND (NOT {} OR {head})", fifo_bound(&o.scope, "c", "$6"))
                }
                _ => String::new(),
            };
            return match self.fair() {
                None => Ok(format!(
                    "WITH {},\n{update}\nSELECT * FROM claimed",
                    render(
                        include_str!("../../sql/claim_candidates.sql"),
                        &[
                            ("table", t),
                            ("leased", Value::Sql(leased)),
                            ("payload_bytes", Value::Sql(&payload)),
                            ("row_c", Value::Sql(&row_c)),
                            ("measured", Value::Sql(&measured)),
                            ("ordered_filter", Value::Sql(&ordered_filter)),
                        ],
                    )?
                )),
                Some(key) => Ok(format!(
                    "WITH RECURSIVE {},\n{update}\nSELECT * FROM claimed",
                    render(
                        include_str!("../../sql/claim_candidates_fair.sql"),
                        &[
                            ("table", t),
                            ("leased", Value::Sql(leased)),
                            ("keys", Value::Sql(&fair_values(t, key, "keys")?)),
                            ("key_c", Value::Sql(&key_sql(key, Some("c")))),
                            ("payload_bytes", Value::Sql(&payload)),
                            ("row_c", Value::Sql(&row_c)),
                            ("measured", Value::Sql(&measured)),
                            ("ordered_filter", Value::Sql(&ordered_filter)),
                        ],
                    )?
                )),
            };
        }
        let ordered = ordered.expect("full ordered");
        let key = &ordered.key;
        let by = ordered.by;
        let (fair_h, fair_turn) = match self.fair() {
            Some(f) => (
                key_sql(f, Some("h")),
                "dense_rank() OVER (PARTITION BY runs.fair ORDER BY runs.head)".to_string(),
            ),
            None => ("NULL::text".to_string(), "0".to_string()),
        };
        let not_poison_c = if ordered.skip_poison {
            format!("AND NOT {}", poison("c"))
        } else {
            String::new()
        };
        let keys_anchor = render(
            &fragment(include_str!("../../sql/claim_keys_anchor.sql")),
            &[("table", t), ("key_bare", Value::Sql(&key_sql(key, None)))],
        )?;
        let head = head_c.as_deref().expect("ordered");
        let (fair_values, fair_heads) = match self.fair() {
            Some(f) => (
                fair_values(t, f, "fair_values")?,
                render(
                    include_str!("../../sql/claim_ordered_fair_heads.sql"),
                    &[
                        ("table", t),
                        ("fair_f", Value::Sql(&key_sql(f, Some("f")))),
                        ("head_c", Value::Sql(head)),
                    ],
                )?,
            ),
            None => (
                "SELECT NULL::text WHERE false".to_string(),
                "SELECT NULL::bigint AS id WHERE false".to_string(),
            ),
        };
        render(
            include_str!("../../sql/claim_ordered.sql"),
            &[
                ("table", t),
                ("leased", Value::Sql(leased)),
                ("key_bare", Value::Sql(&key_sql(key, None))),
                ("key_c", Value::Sql(&key_sql(key, Some("c")))),
                ("key_h", Value::Sql(&key_sql(key, Some("h")))),
                ("key_w", Value::Sql(&key_sql(key, Some("w")))),
                ("key_f", Value::Sql(&key_sql(key, Some("f")))),
                ("head_c", Value::Sql(head)),
                ("dest_w", Value::Sql(&destination_sql(ordered, "w")?)),
                ("dest_c", Value::Sql(&destination_sql(ordered, "c")?)),
                ("dest_h", Value::Sql(&destination_sql(ordered, "h")?)),
                ("not_poison_c", Value::Sql(&not_poison_c)),
                ("keys_anchor", Value::Sql(&keys_anchor)),
                ("fair_values", Value::Sql(&fair_values)),
                ("fair_heads", Value::Sql(&fair_heads)),
                ("fair_h", Value::Sql(&fair_h)),
                ("fair_turn", Value::Sql(&fair_turn)),
                ("payload_bytes", Value::Sql(&payload)),
                ("row_c", Value::Sql(&row_c)),
                ("measured", Value::Sql(&measured)),
                ("claim_update", Value::Sql(&update)),
                ("carried_w", Value::Sql(&by.carried("w"))),
                ("carried_c", Value::Sql(&by.carried("c"))),
                ("order_bare", Value::Sql(&by.columns(None))),
                ("order_c", Value::Sql(&by.columns(Some("c")))),
                ("order_f", Value::Sql(&by.columns(Some("f")))),
                ("order_g", Value::Sql(&by.columns(Some("g")))),
                ("position_c", Value::Sql(&by.position("c"))),
                ("position_h", Value::Sql(&by.position("h"))),
                ("released_c", Value::Sql(&by.released(Some("c")))),
            ],
        )
    }
}

/// A statement that parks (sql/park_blocked.sql) or unparks (sql/unpark_blocked.sql) the rows
/// behind a blocking order's quarantined heads, with `aliases` the template's two row aliases.
pub(crate) fn park_sql(
    table: &TableName,
    ordered: &Ordered,
    template: &str,
    aliases: [&str; 2],
) -> Result<String, String> {
    let (a, b) = (aliases[0], aliases[1]);
    let key = &ordered.key;
    let claims = table.claims();
    // Every claim's rows, expired or not: a claim that ended may still be settling.
    let leased_ids = render(
        "SELECT unnest(l.ids) FROM {claims} AS l",
        &[("claims", Value::Table(&claims))],
    )?;
    let in_flight = in_flight(table, ordered, &leased_ids)?;
    let nothing_in_flight = nothing_in_flight(ordered, b)?;
    render(
        template,
        &[
            ("table", Value::Table(table)),
            ("claims", Value::Table(&claims)),
            ("in_flight", Value::Sql(&in_flight)),
            (
                &format!("nothing_in_flight_{b}"),
                Value::Sql(&nothing_in_flight),
            ),
            (&format!("key_{a}"), Value::Sql(&key_sql(key, Some(a)))),
            (&format!("key_{b}"), Value::Sql(&key_sql(key, Some(b)))),
            (
                &format!("dest_{a}"),
                Value::Sql(&destination_sql(ordered, a)?),
            ),
            (
                &format!("dest_{b}"),
                Value::Sql(&destination_sql(ordered, b)?),
            ),
            (
                "ordered_o",
                Value::Sql(&fifo_bound(&ordered.scope, "o", "$1")),
            ),
            (&format!("carried_{a}"), Value::Sql(&ordered.by.carried(a))),
            (
                &format!("order_{a}"),
                Value::Sql(&ordered.by.columns(Some(a))),
            ),
            (
                &format!("position_{a}"),
                Value::Sql(&ordered.by.position(a)),
            ),
            (
                &format!("position_{b}"),
                Value::Sql(&ordered.by.position(b)),
            ),
            ("position_head", Value::Sql(&ordered.by.position("head"))),
        ],
    )
}

/// The `in_flight` CTE (sql/in_flight.sql) over the ids `leased_ids` selects: the groups of
/// the rows claims hold, for [`nothing_in_flight`].
pub(crate) fn in_flight(
    table: &TableName,
    ordered: &Ordered,
    leased_ids: &str,
) -> Result<String, String> {
    Ok(render(
        include_str!("../../sql/in_flight.sql"),
        &[
            ("table", Value::Table(table)),
            ("key_e", Value::Sql(&key_sql(&ordered.key, Some("e")))),
            ("dest_e", Value::Sql(&destination_sql(ordered, "e")?)),
            ("leased_ids", Value::Sql(leased_ids)),
        ],
    )?
    .trim_end()
    .to_string())
}

/// "No row of `alias`'s group is in flight": the one test against [`in_flight`], used by every
/// ordered claim and by parking (neither touches a group while a claim holds a row of it).
/// The whole group rather than its rows before `alias`: a later row in flight means the group
/// is being sent out of its order already (a replayed row), and waiting for it costs one
/// settlement; in exchange the test is uncorrelated, one hashed lookup per row, where comparing
/// positions scanned every leased row for every candidate. Measured on a busy 2-core machine,
/// ordered claims of 100 over 20,000 rows in 2,000 groups with 600-3,500 rows leased: 13-30 ms
/// comparing positions, 11-19 ms this way, 9-15 ms with no in-flight test at all.
pub(crate) fn nothing_in_flight(ordered: &Ordered, alias: &str) -> Result<String, String> {
    Ok(format!(
        "({}, {}) NOT IN (SELECT k, d FROM in_flight)",
        key_sql(&ordered.key, Some(alias)),
        destination_sql(ordered, alias)?,
    ))
}

/// A row quarantined as poison is "done" for its group under --on-poison skip; rows the relay
/// parked itself (behind a poisoned head, or for their destination) never are.
fn poison(alias: &str) -> String {
    format!(
        "({alias}.quarantined_at IS NOT NULL \
         AND {alias}.quarantine_reason NOT IN ('blocked', 'destination'))"
    )
}

/// The body of a recursive CTE named `walk` that yields every value of the fair key `key`
/// with pending rows: the one walk of plain and ordered fair claims alike.
fn fair_values(table: Value<'_>, key: &KeyColumn, walk: &str) -> Result<String, String> {
    render(
        include_str!("../../sql/fair_values.sql"),
        &[
            ("table", table),
            ("key_bare", Value::Sql(&key_sql(key, None))),
            ("walk", Value::Sql(walk)),
        ],
    )
}

/// The row `alias`'s destination in SQL: the one fragment sql/destination.sql, with the
/// routes as quoted literals. Two rows are one group when their keys and these are equal.
pub(crate) fn destination_sql(ordered: &Ordered, alias: &str) -> Result<String, String> {
    let routing = &ordered.routing;
    let literals = |values: Vec<&str>| -> Result<String, String> {
        let quoted = values
            .into_iter()
            .map(|v| render("{v}", &[("v", Value::Literal(v))]))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(format!("ARRAY[{}]::text[]", quoted.join(", ")))
    };
    let template: String = include_str!("../../sql/destination.sql")
        .lines()
        .filter(|l| !l.starts_with("--"))
        .collect::<Vec<_>>()
        .join(" ");
    render(
        template.trim(),
        &[
            ("alias", Value::Sql(alias)),
            (
                "route_destinations",
                Value::Sql(&literals(
                    routing.routes.iter().map(|(_, d)| d.as_str()).collect(),
                )?),
            ),
            (
                "route_keys",
                Value::Sql(&literals(
                    routing.routes.iter().map(|(k, _)| k.as_str()).collect(),
                )?),
            ),
            (
                "route_key",
                Value::Sql(&key_sql(&routing.route_by, Some(alias))),
            ),
            ("default_destination", Value::Literal(&routing.default)),
        ],
    )
}

/// Whether the row `alias` is bound for a FIFO queue: its own queue_url, else its route when
/// that route's queue is FIFO (`routes`: the parameter holding those routes' keys).
pub(crate) fn fifo_bound(scope: &OrderScope, alias: &str, routes: &str) -> String {
    match scope {
        OrderScope::Every => "true".to_string(),
        OrderScope::FifoDestinations { route_by, .. } => format!(
            "(CASE WHEN coalesce({alias}.queue_url, '') <> '' \
             THEN rtrim({alias}.queue_url, '/') LIKE '%.fifo' \
             ELSE {} = ANY ({routes}::text[]) END)",
            key_sql(route_by, Some(alias))
        ),
    }
}

/// The payload's size in bytes as the relay will hold it: its JSON text. A jsonb value's
/// stored form is not its text: the text adds a space after every `:` and `,` and escapes (a
/// control character takes 6 bytes as `\u0001`), the stored form adds 4-byte entry headers; a
/// number is stored in a few bytes however long it is written (measured: `[1e-1000]` is 22
/// bytes stored and 1,004 as text; an array of `1e131071`, the worst we found, 8,162 text bytes
/// per stored byte); and a compressed value (PostgreSQL compresses values of a few KB and more)
/// says nothing of its text. Reading an uncompressed value's stored size costs nothing;
/// rendering the text costs the server a pass over the value. So the stored size stands for
/// the text only where twice that worst expansion keeps the text within the limit
/// `max_payload` (stored in at most 1/16384 of it: 2 KiB at the default 32 MiB, every ordinary
/// row), and the text is measured everywhere else: the size that decides `too_large` is exact,
/// and the byte budget close. Either way the server measures; the relay never reads what it
/// refuses.
fn payload_bytes(alias: Option<&str>, max_payload: &str) -> String {
    let payload = match alias {
        Some(a) => format!("{a}.payload"),
        None => "payload".to_string(),
    };
    // A NULL payload (an unreadable row, quarantined after the claim) weighs nothing; left
    // NULL it would make every running sum after it NULL and stop the claim there.
    format!(
        "coalesce(CASE WHEN pg_column_compression({payload}) IS NULL \
         AND pg_column_size({payload}) <= {max_payload} / 16384 \
         THEN pg_column_size({payload}) ELSE octet_length({payload}::text) END, 0)"
    )
}

/// The columns of a chosen row (table alias `alias`) that the claim returns besides its id,
/// attempts and size (sql/claim.sql, `claimed`), and the order's own (`--order-by
/// transaction` turns by its transaction): every strategy's `chosen` carries them to the
/// claim's answer, so that the rows are read once.
fn row_columns(alias: &str, order_by: OrderBy) -> String {
    let mut columns: Vec<String> = [
        "event_id",
        "aggregate_type",
        "aggregate_id",
        "event_type",
        "payload",
        "headers",
        "queue_url",
        "created_at",
        "dedup_id",
    ]
    .iter()
    .map(|c| format!("{alias}.{c}"))
    .collect();
    if order_by == OrderBy::Transaction {
        columns.push(format!("{alias}.{XACT_COLUMN}"));
    }
    columns.join(", ")
}

/// The `measured` CTE of every claim (sql/claim_measured.sql): one definition, rendered into
/// each strategy's statement.
fn measured(max_payload: &str, max_attempts: &str) -> Result<String, String> {
    render(
        &fragment(include_str!("../../sql/claim_measured.sql")),
        &[
            ("max_payload", Value::Sql(max_payload)),
            ("max_attempts", Value::Sql(max_attempts)),
        ],
    )
}

/// "Row `c` is its group's head" (sql/claim_group_head.sql), `p` the alias of the row before it.
///
/// "The row just before c in its group is done": one step back in the group's order index, so
/// the probe costs the same however many of the group's rows were sent before (a probe for
/// the first unsent row instead walks every dead index entry the group's sent rows left
/// behind). As a correlated scalar subquery it cannot become a hash anti-join over the
/// backlog when statistics are missing; the range comparison keeps the planner on the (key,
/// id) index (see claim_candidates_fair.sql). Of the key's earlier rows only its own
/// destination's are its group: a row of the same key bound elsewhere is stepped over
/// (usually there is none).
///
/// One step back is not enough on its own: with --on-poison skip the row before c may be
/// poison while an earlier one is still leased (A leased, B quarantined at claim, C), and a
/// replayed row may be in flight before rows already sent. So a head's group also has no row
/// in flight, whichever strategy offers it.
fn group_head(table: &TableName, o: &Ordered, c: &str, p: &str) -> Result<String, String> {
    let or_poison_p = match o.skip_poison {
        true => format!(" OR {}", poison(p)),
        false => String::new(),
    };
    render(
        &fragment(include_str!("../../sql/claim_group_head.sql")),
        &[
            ("table", Value::Table(table)),
            ("released_c", Value::Sql(&o.by.released(Some(c)))),
            ("nothing_in_flight_c", Value::Sql(&nothing_in_flight(o, c)?)),
            ("or_poison_p", Value::Sql(&or_poison_p)),
            ("key_p", Value::Sql(&key_sql(&o.key, Some(p)))),
            ("key_c", Value::Sql(&key_sql(&o.key, Some(c)))),
            ("position_p", Value::Sql(&o.by.position(p))),
            ("position_c", Value::Sql(&o.by.position(c))),
            ("dest_p", Value::Sql(&destination_sql(o, p)?)),
            ("dest_c", Value::Sql(&destination_sql(o, c)?)),
            ("order_p_desc", Value::Sql(&o.by.columns_desc(Some(p)))),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::destination::Destination;

    fn strategies() -> Vec<ClaimStrategy> {
        let ordered = |scope: OrderScope, skip_poison: bool| Ordered {
            key: KeyColumn::AggregateId,
            routing: Routing::new(
                &Destination::of_row("https://q/b.fifo"),
                &[("order".into(), Destination::of_row("https://q/it's.fifo"))],
                &KeyColumn::AggregateType,
            ),
            skip_poison,
            scope,
            by: OrderBy::Id,
        };
        let fifo_rows = OrderScope::FifoDestinations {
            route_by: KeyColumn::AggregateType,
            fifo_routes: vec!["order".into()],
        };
        vec![
            ClaimStrategy::Plain,
            ClaimStrategy::Fair {
                key: "header:tenant".parse().unwrap(),
            },
            ClaimStrategy::Ordered(ordered(OrderScope::Every, false)),
            ClaimStrategy::Ordered(ordered(OrderScope::Every, true)),
            ClaimStrategy::Ordered(ordered(fifo_rows.clone(), false)),
            ClaimStrategy::OrderedFair {
                ordered: ordered(OrderScope::Every, false),
                fair: KeyColumn::AggregateType,
            },
            ClaimStrategy::OrderedFair {
                ordered: ordered(fifo_rows, true),
                fair: KeyColumn::EventType,
            },
            ClaimStrategy::Ordered(Ordered {
                by: OrderBy::Transaction,
                ..ordered(OrderScope::Every, false)
            }),
            ClaimStrategy::OrderedFair {
                ordered: Ordered {
                    by: OrderBy::Transaction,
                    ..ordered(OrderScope::Every, true)
                },
                fair: KeyColumn::AggregateType,
            },
        ]
    }

    #[test]
    fn transaction_order_compares_transactions_and_claims_nothing_past_the_watermark() {
        let table: TableName = "outbox".parse().unwrap();
        for strategy in strategies() {
            let sql = strategy.sql(&table).unwrap();
            let watermark = "pg_snapshot_xmin(pg_current_snapshot())";
            if strategy.order_by() == OrderBy::Transaction {
                // Heads (in `oldest`, `others`, the fair heads) and every chosen row.
                assert!(sql.matches(watermark).count() >= 2, "{strategy:?}");
                assert!(sql.contains("(p.xact_id, p.id) < (c.xact_id, c.id)"));
                assert!(sql.contains("(c.xact_id, c.id) > (h.xact_id, h.id)"));
                assert!(sql.contains("ORDER BY o.xact_id, o.id) AS turn"));
                assert!(!sql.contains("p.id < c.id"), "{strategy:?}");
            } else {
                assert!(!sql.contains(".xact_id"), "{strategy:?}");
                // By id, the id is the turn: no window to compute it.
                assert!(sql.contains("o.id AS turn"), "{strategy:?}");
            }
        }
    }

    /// The `$n` numbers a statement uses.
    fn placeholders(sql: &str) -> std::collections::BTreeSet<usize> {
        let bytes = sql.as_bytes();
        let mut found = std::collections::BTreeSet::new();
        for (i, _) in sql.match_indices('$') {
            let digits: String = bytes[i + 1..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .map(|&b| b as char)
                .collect();
            if let Ok(n) = digits.parse() {
                found.insert(n);
            }
        }
        found
    }

    #[test]
    fn every_strategy_binds_exactly_the_parameters_its_statement_uses() {
        let table: TableName = "app.outbox".parse().unwrap();
        let request = ClaimRequest {
            limit: 100,
            owner: "r".into(),
            lease: Duration::from_secs(30),
            budget_bytes: 1 << 20,
            cursor: None,
            catching_up: false,
        };
        for strategy in strategies() {
            let sql = strategy.sql(&table).unwrap();
            let used = placeholders(&sql);
            let expected: std::collections::BTreeSet<usize> =
                (1..=strategy.param_count()).collect();
            assert_eq!(used, expected, "{strategy:?}");
            let bound = ClaimParams::new(&request, &strategy, &ClaimLimits::default(), (0, 0));
            assert_eq!(strategy.bind(&bound).len(), strategy.param_count());
            assert!(sql.contains("FROM \"app\".\"outbox\""), "{strategy:?}");
        }
    }

    #[test]
    fn every_strategy_quarantines_with_the_one_measured_fragment_and_the_two_limit_parameters() {
        let table: TableName = "outbox".parse().unwrap();
        for strategy in strategies() {
            let sql = strategy.sql(&table).unwrap();
            let (max_payload, max_attempts) = strategy.limit_params();
            let n = strategy.param_count();
            assert_eq!(max_payload, format!("${}::bigint", n - 2), "{strategy:?}");
            assert_eq!(max_attempts, format!("${}::int", n - 1), "{strategy:?}");
            assert_eq!(strategy.claims_floor_param(), format!("${n}::bigint"));
            let fragment = measured(&max_payload, &max_attempts).unwrap();
            assert_eq!(sql.matches(&fragment).count(), 1, "{strategy:?}");
            assert_eq!(
                sql.matches(&payload_bytes(Some("c"), &max_payload)).count(),
                1,
                "{strategy:?}"
            );
            // The refused row's payload is not returned.
            assert!(
                sql.contains("CASE WHEN o.refusal IS NULL THEN o.payload::text END"),
                "{strategy:?}"
            );
            assert!(!sql.contains("o.payload::text,"), "{strategy:?}");
        }
    }

    #[test]
    fn strategies_follow_from_ordering_and_fairness() {
        let o = Ordered {
            key: KeyColumn::AggregateId,
            routing: Routing::default(),
            skip_poison: false,
            scope: OrderScope::Every,
            by: OrderBy::Id,
        };
        assert_eq!(ClaimStrategy::new(None, None), ClaimStrategy::Plain);
        assert!(matches!(
            ClaimStrategy::new(None, Some(KeyColumn::EventType)),
            ClaimStrategy::Fair { .. }
        ));
        assert!(matches!(
            ClaimStrategy::new(Some(o.clone()), None),
            ClaimStrategy::Ordered(_)
        ));
        let both = ClaimStrategy::new(Some(o), Some(KeyColumn::EventType));
        assert!(both.ordered().is_some() && both.fair().is_some());
        assert!(both.returns_cursor());
    }

    #[test]
    fn every_group_comparison_renders_the_one_destination_fragment_with_quoted_routes() {
        let table: TableName = "outbox".parse().unwrap();
        for strategy in strategies() {
            let Some(ordered) = strategy.ordered() else {
                continue;
            };
            let (p, c) = (
                destination_sql(ordered, "p").unwrap(),
                destination_sql(ordered, "c").unwrap(),
            );
            assert_eq!(
                c,
                "coalesce(nullif(c.queue_url, ''), \
                 (ARRAY['https://q/it''s.fifo']::text[])[array_position(ARRAY['order']::text[], c.aggregate_type)], \
                 'https://q/b.fifo')"
            );
            let sql = strategy.sql(&table).unwrap();
            assert!(sql.contains(&format!("{p} = {c}")), "{strategy:?}");
            if strategy.full_ordered() {
                for alias in ["w", "h"] {
                    let d = destination_sql(ordered, alias).unwrap();
                    assert!(sql.contains(&d), "{alias}: {strategy:?}");
                }
            }
        }
    }

    #[test]
    fn every_ordered_strategy_tests_its_heads_against_the_one_in_flight_definition() {
        let table: TableName = "outbox".parse().unwrap();
        for strategy in strategies() {
            let sql = strategy.sql(&table).unwrap();
            let Some(ordered) = strategy.ordered() else {
                assert!(!sql.contains("in_flight"), "{strategy:?}");
                continue;
            };
            let cte = in_flight(&table, ordered, "SELECT id FROM leased").unwrap();
            assert_eq!(sql.matches(&cte).count(), 1, "{strategy:?}");
            let test = nothing_in_flight(ordered, "c").unwrap();
            // In the one head test (`head_c`), rendered wherever heads are found.
            assert!(sql.contains(&test), "{strategy:?}");
        }
    }

    /// The SQL's text only: the two parked reasons are named in the skip-poison claim's filter.
    /// That the claim then holds a parked row's group on a table is the integration test
    /// `outbox_sql::skipping_poison_never_skips_rows_the_relay_parked`.
    #[test]
    fn the_skip_poison_claim_exempts_the_parked_reasons_by_name() {
        let sql = ClaimStrategy::Ordered(Ordered {
            key: KeyColumn::AggregateId,
            routing: Routing::default(),
            skip_poison: true,
            scope: OrderScope::Every,
            by: OrderBy::Id,
        })
        .sql(&"outbox".parse().unwrap())
        .unwrap();
        assert!(sql.contains("NOT IN ('blocked', 'destination')"));
    }
}
