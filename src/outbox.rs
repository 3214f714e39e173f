//! The only owner of SQL: the outbox table's shape, claims, settlements and statistics.
//!
//! Every statement that names the table is rendered from a file in `sql/` by `template`, which
//! quotes every identifier and refuses a placeholder left over; every value is a bind parameter.
//! Each statement as rendered is kept whole in `sql/rendered/`, checked by `rendered`.
//!
//! The rooms stand in five layers; a room imports only from its own layer or those below it
//! (checked by the unit test `maps::outbox_rooms_import_only_downward` in src/lib.rs), and this
//! file, which declares them, only hands their names on.
//!
//! 1. Pure: text in, text out; no connection.
//!    - `error`: what fails, and which failures are transient.
//!    - `ident`: the table name and the names derived from it, key columns as SQL.
//!    - `template`: the one SQL template renderer.
//!    - `order_by`: `--order-by`, what "earlier" means within a group, as SQL fragments.
//!    - `columns`: an adopted table's column map.
//!    - `floors`: where a relay's scans of a table start, so they seek past settled rows.
//!    - `decode`: a claimed row read column by column; what cannot be read is `Unreadable`.
//!    - `claim`: claim strategies (plain, fair, ordered, ordered + fair), their SQL and
//!      parameters, and the parking statements of a blocking order.
//!    - `wakeup`: the `--wakeup` modes, and what each needs installed.
//!    - `pooler`: `--pooler`, what a connection pooler in between allows.
//!    - `settle`: the settlement statement whole: its text per acknowledgement mode, its `$n`
//!      layout, the arguments a settlement binds and the answer it reads.
//!    - `statements`: the table's statements, rendered once.
//! 2. Connections: no table of its own.
//!    - `conn`: one connection used as the pooler allows (prepared or unnamed statements,
//!      per-transaction settings).
//!    - `liveness`: round-trip deadlines, keepalives, and which failures replace a connection.
//!    - `connector`: the one place connections are opened (URL, password, TLS, hosts to skip,
//!      the pooler mode detected).
//!    - `settings`: the validated database settings an [`Outbox`] is built from.
//!    - `selection`: which tables a command serves (`--table`, `--tables` patterns, discovery).
//! 3. The table: `store`, the [`Outbox`] (connector + statements + floors), its accessors and
//!    the checks a new connection makes of the table.
//! 4. The hot path: what `run` does again and again.
//!    - `session`: a connection with the relay's prepared statements; claims and settlements.
//!    - `live`: a session that reconnects on demand, shared by the relay's tasks; one
//!      connection the sessions of several tables share.
//!    - `maintenance`: statistics and maintenance on a connection of their own, each under a timeout.
//!    - `registry`: the relay registry `<table>_relays` and the schema's contract (who may
//!      claim).
//!    - `watch`: the look a relay serving several tables takes at all of them at once.
//!    - `notify`: `--wakeup notify`'s LISTEN connection.
//!    - `logical`: `--wakeup logical`'s replication-protocol client.
//! 5. One-shot commands.
//!    - `admin`: `quarantine list` and `quarantine retry`.
//!    - [`inspect`], `status`: the catalog facts `check` judges, and `status`.
//!    - `search_path`: which table an unqualified `--table` reaches, and the others of its name.
//!    - [`schema`]: `migrate` and `migrate --adopt`, online (lock timeouts, concurrent
//!      indexes), and what each wake-up mode installs.
//!    - `rendered` (tests only): every statement as rendered, kept whole in `sql/rendered/`.

mod claim;
mod columns;
mod decode;
mod error;
mod floors;
mod ident;
mod order_by;
mod pooler;
mod settle;
mod statements;
mod template;
mod wakeup;

mod conn;
mod connector;
pub(crate) mod liveness;
mod selection;
mod settings;

mod store;

mod live;
mod logical;
mod maintenance;
mod notify;
mod registry;
mod session;
mod watch;

mod admin;
pub mod inspect;
#[cfg(test)]
mod rendered;
pub mod schema;
mod search_path;
mod status;

pub use admin::{
    EventDetail, ParkedDestination, QuarantineEntry, Redriven, ReplaySelection, Replayed,
    RetryRows, RetrySelection,
};
pub use claim::{ClaimLimits, ClaimRequest, ClaimStrategy, OrderScope, Ordered};
pub use columns::ColumnMap;
pub use conn::Conn;
pub use connector::Connector;
pub use error::{describe, sqlstate_is_transient, OutboxError};
pub use floors::{Floors, FULL_RETENTION_PASS};
pub use ident::{quote_ident, KeyIndex, TableName};
pub use live::{HostConn, LiveSession};
pub use liveness::{reconnect_delay, replacement, Replace};
pub use maintenance::{
    extrapolate, BlockedGroups, Count, Maintenance, Stats, Swept, STATS_EXACT_UP_TO,
};
pub use order_by::{OrderBy, NOT_ON_ADOPTED, XACT_COLUMN};
pub use pooler::Pooler;
pub use registry::{LiveRelay, Registration, Renewed};
pub use schema::{MigrateReport, SCHEMA_VERSION};
pub use search_path::Resolved;
pub use selection::{Pattern, Selection};
pub use session::{AfterClaim, AfterClaimed, RelayStatement, Session, PLANS};
pub use settings::{DatabaseConfig, LockPolicy, Secret};
pub use status::{worse_first, worst_first, TableReport, TableStatus};
pub use store::{Outbox, Purpose, RelaySettings};
pub use wakeup::{Installed, Wakeup};
pub use watch::{Answer, Look, Watch};
