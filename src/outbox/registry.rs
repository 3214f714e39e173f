//! The relays of a table and what its schema lets them do: the contract `migrate` recorded
//! (read at every new connection and at every renewal), the registry `<table>_relays` that
//! each relay renews every few seconds, the live fleet `status` lists, and what keeps
//! `migrate --contract` from excluding a relay that is still alive.

use std::time::{Duration, Instant, SystemTime};

use super::conn::Conn;
use super::error::{query_err, OutboxError};
use super::session::Session;
use super::store::Outbox;
use super::template::{render, Value};
use crate::version::{self, Contract, Refusal, Verdict};

/// One relay's registration, as it renews it.
#[derive(Debug, Clone)]
pub struct Registration {
    pub relay_id: String,
    pub host: String,
    /// When the process started (its clock): tells a restarted relay of the same id apart.
    pub started: SystemTime,
    /// Its last claim, `None` before the first.
    pub last_claim: Option<SystemTime>,
    /// Whether it claims now (the schema admits it, and it is not stopping).
    pub claiming: bool,
    /// `--lease`: the registration lasts that long after each renewal.
    pub lease: Duration,
}

impl Registration {
    /// A relay that starts now on this host, claiming, before its first claim.
    pub fn starting(relay_id: &str, lease: Duration) -> Registration {
        Registration {
            relay_id: relay_id.to_string(),
            host: gethostname::gethostname().to_string_lossy().into_owned(),
            started: SystemTime::now(),
            last_claim: None,
            claiming: true,
            lease,
        }
    }
}

/// What a renewal learnt: the contract, and the live fleet before this renewal.
#[derive(Debug, Clone)]
pub struct Renewed {
    pub contract: Contract,
    /// (relay id, version, claiming) of every live registration, this relay's as it was.
    pub fleet: Vec<(String, String, bool)>,
}

/// A live relay, as `status` lists it. The JSON field names are part of the interface.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LiveRelay {
    pub relay_id: String,
    pub version: String,
    pub host: String,
    /// The database's text for the registration's `started_at`.
    pub started_at: String,
    pub running_seconds: f64,
    /// Seconds since its last claim; `None` before its first.
    pub last_claim_seconds_ago: Option<f64>,
    /// The schema admits it and it claims; false while it is refused (or stopping).
    pub claiming: bool,
    /// Where its scans of the unsent rows and of the lease table start (src/outbox/floors.rs),
    /// as it last published them; `None` before it did, or on a registry without floors.
    pub unsent_floor: Option<i64>,
    pub claims_floor: Option<i64>,
}

/// The contract from the version table's row as JSON (sql/contract.sql); no row: version 0.
fn contract_of(row: Option<serde_json::Value>) -> Result<Contract, OutboxError> {
    let Some(row) = row else {
        return Ok(Contract {
            schema: 0,
            relay_versions: None,
        });
    };
    let schema = row
        .get("version")
        .and_then(serde_json::Value::as_i64)
        .unwrap_or(0) as i32;
    let requirement = row
        .get("relay_versions")
        .and_then(serde_json::Value::as_str);
    Contract::read(schema, requirement).map_err(OutboxError::Contract)
}

impl Outbox {
    fn registry_sql(&self, template: &str) -> Result<String, OutboxError> {
        render(
            template,
            &[
                ("relays", Value::Table(&self.table().relays())),
                ("claims", Value::Table(&self.table().claims())),
                ("versions", Value::Table(&self.table().versions())),
            ],
        )
        .map_err(OutboxError::Template)
    }

    /// Reads the contract on `client` (a new connection) and keeps it as the latest read.
    pub(super) async fn read_contract(&self, client: &Conn) -> Result<Contract, OutboxError> {
        let versions = self.table().versions();
        let exists: bool = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&versions.quoted()])
            .await
            .map_err(query_err("looking up the schema version table"))?
            .get(0);
        let row = match exists {
            false => None,
            true => client
                .query_opt(
                    &self.registry_sql(include_str!("../../sql/contract.sql"))?,
                    &[&self.table().name],
                )
                .await
                .map_err(|e| self.unreadable_contract(e))?
                .map(|r| r.get(0)),
        };
        let contract = contract_of(row)?;
        self.observed().record(&contract);
        Ok(contract)
    }

    /// At every new connection: reads the contract and keeps it. A schema older than this relay
    /// needs ends the connection's set-up (nothing of this relay's works on it); one whose
    /// requirement excludes this relay does not, since the relay still settles what it sent,
    /// and its claim loop stops claiming on the verdict ([`Outbox::verdict`]).
    pub(super) async fn check_contract(&self, client: &Conn) -> Result<(), OutboxError> {
        let contract = self.read_contract(client).await?;
        match version::judge(version::this_relay(), &contract) {
            verdict @ Verdict::Migrate { .. } => Err(OutboxError::Refused(self.refusal(verdict))),
            _ => Ok(()),
        }
    }

    /// A role that may not read the version table: the GRANT that fixes it.
    fn unreadable_contract(&self, e: tokio_postgres::Error) -> OutboxError {
        if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) {
            return OutboxError::Contract(format!(
                "the relay's role may not read {} (the schema version and the relay versions it admits): GRANT SELECT ON {} TO <relay role> (sql/roles.sql; `migrate` grants it to the roles that hold the lease table)",
                self.table().versions(),
                self.table().versions()
            ));
        }
        query_err("reading the schema's contract")(e)
    }

    /// This relay's verdict on the latest contract read, and when it was read; `None` before
    /// the first read.
    pub fn verdict(&self) -> Option<(Verdict, Instant)> {
        self.observed().latest()
    }

    /// The one line for a verdict on this table.
    pub fn refusal(&self, verdict: Verdict) -> Refusal {
        Refusal {
            relay: version::this_relay().clone(),
            table: self.table().quoted(),
            verdict,
        }
    }

    /// The fleet as the database knows it: the live registered relays, and the signs of
    /// relays that never registered (relays of before 0.2.0): owners of live leases who are
    /// not registered, and sessions named as those relays named themselves. Nothing where the
    /// registry does not exist yet (schema version 3 and before).
    pub(super) async fn registry_on(
        &self,
        client: &Conn,
    ) -> Result<(Vec<LiveRelay>, Vec<String>), OutboxError> {
        let registry: bool = client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL",
                &[&self.table().relays().quoted()],
            )
            .await
            .map_err(query_err("looking up the relay registry"))?
            .get(0);
        if !registry {
            return Ok((Vec::new(), Vec::new()));
        }
        let live = client
            .query(
                &self.registry_sql(include_str!("../../sql/relays_live.sql"))?,
                &[],
            )
            .await
            .map_err(query_err("reading the relay registry"))?
            .iter()
            .map(|r| LiveRelay {
                relay_id: r.get(0),
                version: r.get(1),
                host: r.get(2),
                running_seconds: r.get(3),
                last_claim_seconds_ago: r.get(4),
                claiming: r.get(5),
                started_at: r.get(6),
                unsent_floor: r.get(7),
                claims_floor: r.get(8),
            })
            .collect();
        let others = client
            .query(
                &self.registry_sql(include_str!("../../sql/contract_blockers.sql"))?,
                &[&version::UNVERSIONED_APPLICATION_NAME],
            )
            .await
            .map_err(query_err("looking for relays of before 0.2.0"))?
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect();
        Ok((live, others))
    }

    /// What may be a relay that `requirement` excludes, alive now (see [`Outbox::registry_on`]).
    /// Empty: `migrate --contract` may go on.
    pub(super) async fn contract_blockers(
        &self,
        client: &Conn,
        requirement: &semver::VersionReq,
    ) -> Result<Vec<String>, OutboxError> {
        let (live, others) = self.registry_on(client).await?;
        Ok(version::contract_blockers(
            requirement,
            live.iter()
                .map(|r| (r.relay_id.as_str(), r.version.as_str(), r.host.as_str())),
            others,
        ))
    }
}

impl Outbox {
    /// Renews `me`'s registration and reads the contract, in one statement (sql/renew.sql) on
    /// `session`, the claims' connection: what answers claims answers this, and a connection
    /// to a server that takes no writes is replaced as for a claim. Keeps the contract as the
    /// latest read.
    pub async fn renew(
        &self,
        session: &Session,
        me: &Registration,
    ) -> Result<Renewed, OutboxError> {
        let sql = self.registry_sql(include_str!("../../sql/renew.sql"))?;
        let version = version::this_relay().to_string();
        let lease = me.lease.as_secs_f64();
        let (unsent_floor, claims_floor) = (self.floors().rows(), self.floors().claims());
        // A write, as the connection allows it (through a pooler: in a transaction that states
        // READ WRITE, whatever the role's default); every few seconds, so made afresh each time
        // rather than kept among the claim path's prepared statements.
        let statement = session
            .conn()
            .statements(&[(sql.as_str(), true)])
            .await
            .map_err(|e| self.unwritable_registry(e))?
            .remove(0);
        let row = session
            .conn()
            .query_one(
                &statement,
                &[
                    &me.relay_id,
                    &version,
                    &me.host,
                    &me.started,
                    &me.last_claim,
                    &me.claiming,
                    &lease,
                    &self.table().name,
                    &unsent_floor,
                    &claims_floor,
                ],
            )
            .await
            .map_err(|e| self.unwritable_registry(e))?;
        let contract = contract_of(row.get(0))?;
        self.observed().record(&contract);
        let ids: Vec<String> = row.get(1);
        let versions: Vec<String> = row.get(2);
        let claiming: Vec<bool> = row.get(3);
        Ok(Renewed {
            contract,
            fleet: ids
                .into_iter()
                .zip(versions)
                .zip(claiming)
                .map(|((id, v), c)| (id, v, c))
                .collect(),
        })
    }

    /// Removes `relay_id`'s registration on `session`: a relay that stops says so, rather than
    /// being listed until its lease runs out.
    pub async fn deregister(&self, session: &Session, relay_id: &str) -> Result<(), OutboxError> {
        let sql = self.registry_sql(include_str!("../../sql/deregister.sql"))?;
        let statement = session
            .conn()
            .statements(&[(sql.as_str(), true)])
            .await
            .map_err(query_err("removing the relay's registration"))?
            .remove(0);
        session
            .conn()
            .execute(&statement, &[&relay_id])
            .await
            .map_err(query_err("removing the relay's registration"))?;
        Ok(())
    }

    /// A role that may not write the registry (or read the version table): the GRANT that
    /// fixes it, as a contract error (start-up stops on it; see [`OutboxError::is_setup`]).
    fn unwritable_registry(&self, e: tokio_postgres::Error) -> OutboxError {
        if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) {
            return OutboxError::Contract(format!(
                "the relay's role may not register in {} or read {}: GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO <relay role>; GRANT SELECT ON {} TO <relay role> (sql/roles.sql; `migrate` grants both to the roles that hold the lease table)",
                self.table().relays(),
                self.table().versions(),
                self.table().relays(),
                self.table().versions()
            ));
        }
        query_err("renewing the relay's registration")(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_row_of_before_reads_as_a_contract_without_requirement() {
        let old = serde_json::json!({"table_name": "outbox", "version": 3, "migrated_at": "x"});
        assert_eq!(
            contract_of(Some(old)).unwrap(),
            Contract {
                schema: 3,
                relay_versions: None
            }
        );
        assert_eq!(contract_of(None).unwrap().schema, 0);
        let new = serde_json::json!({"version": 4, "relay_versions": ">=0.1.0"});
        let c = contract_of(Some(new)).unwrap();
        assert_eq!(c.schema, 4);
        assert_eq!(c.requirement(), ">=0.1.0");
        let bad = serde_json::json!({"version": 4, "relay_versions": "latest"});
        assert!(contract_of(Some(bad)).is_err());
    }
}
