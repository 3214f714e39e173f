//! Which relay versions may claim on which schema: the compatibility contract.
//!
//! `migrate` records two things beside a table (`outbox_relay_schema`): the schema version it
//! left the table at, and `relay_versions`, a requirement on the versions of the relays that
//! may claim on it (`>=0.1.0`). A relay claims only where both admit it: the schema is at
//! least the version it needs ([`NEEDS_SCHEMA`]), and its own version matches the
//! requirement. A migration that only adds (expand) leaves the requirement alone, so relays of
//! the previous version keep claiming beside the new ones during a rolling update; a step that
//! removes what older relays read (`migrate --contract`) raises it first, and refuses while a
//! relay it would exclude is alive.
//!
//! Everything here is pure: the relay's version, the requirement's text, and the verdict with
//! the one line an operator reads.

use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

use semver::{Version, VersionReq};

/// The schema version this build's `migrate` creates, and the least it claims on.
pub const NEEDS_SCHEMA: i32 = 5;

/// What `migrate` records for a schema it leaves at [`NEEDS_SCHEMA`]: relays of 0.1.0 (every
/// build before versions were numbered, schema 3 onwards) keep working on it, since schema 4
/// only adds the registry table beside the lease table, and schema 5 two nullable columns to
/// the registry (the floors each relay publishes; older relays leave them empty).
pub const EXPANDED: &str = ">=0.1.0";

/// What `migrate --contract` records before it drops the lease columns schema 1 wrote: the
/// relays that read them (and `check` of 0.1.0, which still asks for them) may not claim then.
pub const CONTRACTED: &str = ">=0.2.0";

/// The application_name of relays before 0.2.0 (they did not register): a session of that name
/// may be one of them.
pub const UNVERSIONED_APPLICATION_NAME: &str = "outbox-relay";

/// How often a relay renews its registration and reads the contract again, at most; a third of
/// `--lease` when that is shorter, so a registration outlives two missed renewals.
pub const CHECK_EVERY: Duration = Duration::from_secs(5);

/// The interval of the registry heartbeat (and contract check) for a lease.
pub fn check_every(lease: Duration) -> Duration {
    CHECK_EVERY.min(lease / 3).max(Duration::from_millis(100))
}

/// How long after its last renewal began a relay may still start a claim: its registration
/// lasts `--lease` from the renewal (the database's `now()`, later than the relay's start of
/// it), and a claim may take until its round-trip deadline; half the lease leaves both inside.
pub fn claims_allowed_for(lease: Duration) -> Duration {
    lease / 2
}

/// This process's version: the crate's, or in debug builds `OUTBOX_RELAY_TEST_VERSION`, so
/// that tests run relays of two versions side by side from one build. Release builds ignore
/// the variable.
pub fn this_relay() -> &'static Version {
    static VERSION: OnceLock<Version> = OnceLock::new();
    VERSION.get_or_init(|| {
        let test = cfg!(debug_assertions)
            .then(|| std::env::var("OUTBOX_RELAY_TEST_VERSION").ok())
            .flatten();
        let text = test.as_deref().unwrap_or(env!("CARGO_PKG_VERSION"));
        Version::parse(text).unwrap_or_else(|_| {
            Version::parse(env!("CARGO_PKG_VERSION")).expect("the crate's version is semver")
        })
    })
}

/// `outbox-relay --version`: the relay's version and the schemas it claims on.
pub fn long_version() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        let v = this_relay();
        format!(
            "{v}\nschema: creates version {NEEDS_SCHEMA}; claims on version {NEEDS_SCHEMA}, and on a later version whose migrate admits {v}"
        )
    })
}

/// The relay's own version, for `-V` and logs.
pub fn short_version() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| this_relay().to_string())
}

/// The application_name a relay's connections carry unless the URL sets one: the version in
/// it tells `migrate --contract` (and an operator reading pg_stat_activity) which relay it is.
pub fn application_name() -> String {
    format!("{UNVERSIONED_APPLICATION_NAME}/{}", this_relay())
}

/// What a table's schema says of the relays that may claim on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contract {
    /// The schema version `migrate` recorded (0: none).
    pub schema: i32,
    /// Who may claim; `None` where a migrate before 0.2.0 recorded no requirement.
    pub relay_versions: Option<VersionReq>,
}

impl Contract {
    /// The contract as read from `outbox_relay_schema`; a requirement that does not parse is
    /// kept as one that admits nobody this build knows, with the text for the message.
    pub fn read(schema: i32, relay_versions: Option<&str>) -> Result<Contract, String> {
        let relay_versions = match relay_versions {
            None => None,
            Some(text) => Some(VersionReq::parse(text).map_err(|e| {
                format!("the recorded relay_versions {text:?} is not a version requirement: {e}")
            })?),
        };
        Ok(Contract {
            schema,
            relay_versions,
        })
    }

    /// The requirement as written, `>=0.1.0` where none was recorded (a schema of before).
    pub fn requirement(&self) -> String {
        self.relay_versions
            .as_ref()
            .map_or_else(|| EXPANDED.to_string(), ToString::to_string)
    }
}

/// Whether a relay may claim on a table, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Claim,
    /// The schema is older than this relay needs: `migrate` first.
    Migrate {
        found: i32,
    },
    /// The schema's requirement excludes this relay: a newer relay must take over.
    Refused {
        schema: i32,
        requirement: String,
    },
}

impl Verdict {
    pub fn claims(&self) -> bool {
        matches!(self, Verdict::Claim)
    }
}

/// The verdict for `relay` on a table whose schema says `contract`.
pub fn judge(relay: &Version, contract: &Contract) -> Verdict {
    if contract.schema < NEEDS_SCHEMA {
        return Verdict::Migrate {
            found: contract.schema,
        };
    }
    let admitted = contract
        .relay_versions
        .as_ref()
        .is_none_or(|req| matches_release(req, relay));
    match admitted {
        true => Verdict::Claim,
        false => Verdict::Refused {
            schema: contract.schema,
            requirement: contract.requirement(),
        },
    }
}

/// `req` matches `v`, its pre-release part aside: a `0.3.0-rc.1` build is judged as 0.3.0
/// (semver's own rule would exclude it from `>=0.1.0`).
fn matches_release(req: &VersionReq, v: &Version) -> bool {
    req.matches(&Version::new(v.major, v.minor, v.patch))
}

/// The one line a relay says when the verdict is not [`Verdict::Claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub relay: Version,
    pub table: String,
    pub verdict: Verdict,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Refusal {
            relay,
            table,
            verdict,
        } = self;
        match verdict {
            Verdict::Claim => write!(f, "outbox-relay {relay} may claim on {table}"),
            Verdict::Migrate { found } => write!(
                f,
                "outbox-relay {relay} needs schema version {NEEDS_SCHEMA} of {table}, which is at version {found}: run outbox-relay migrate (with the new relay's image) first"
            ),
            Verdict::Refused {
                schema,
                requirement,
            } => write!(
                f,
                "outbox-relay {relay} may not claim on {table}: its schema (version {schema}) admits relays {requirement}; claiming stopped: deploy a relay that matches {requirement}"
            ),
        }
    }
}

/// The larger of two requirements of the `>=X` shape `migrate` writes, so that a rerun of an
/// older step never lowers what a later one recorded; any other shape is kept as recorded.
pub fn raised(recorded: Option<&str>, ours: &str) -> String {
    let floor = |text: &str| {
        text.strip_prefix(">=")
            .and_then(|v| Version::parse(v.trim()).ok())
    };
    match recorded {
        None => ours.to_string(),
        Some(text) => match (floor(text), floor(ours)) {
            (Some(theirs), Some(mine)) if mine > theirs => ours.to_string(),
            (Some(_), Some(_)) => text.to_string(),
            // A requirement a later migrate wrote in a shape this build does not raise.
            _ => text.to_string(),
        },
    }
}

/// What keeps `migrate --contract` from recording `requirement`: each registered live relay
/// (id, version, host) whose version it excludes, or whose version does not parse, and every
/// other sign of a relay of before (`others`, described by the database). Empty: none alive.
pub fn contract_blockers<'a>(
    requirement: &VersionReq,
    registered: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>,
    others: impl IntoIterator<Item = String>,
) -> Vec<String> {
    let mut blockers: Vec<String> = registered
        .into_iter()
        .filter(|(_, v, _)| Version::parse(v).map_or(true, |v| !matches_release(requirement, &v)))
        .map(|(id, v, host)| format!("relay {id} ({v}, on {host})"))
        .collect();
    blockers.extend(others);
    blockers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    fn contract(schema: i32, req: Option<&str>) -> Contract {
        Contract::read(schema, req).unwrap()
    }

    #[test]
    fn a_relay_claims_where_the_schema_is_new_enough_and_admits_its_version() {
        assert_eq!(
            judge(&v("0.2.0"), &contract(NEEDS_SCHEMA, Some(">=0.1.0"))),
            Verdict::Claim
        );
        // A later schema that only added: older relays keep claiming.
        assert_eq!(
            judge(&v("0.2.0"), &contract(NEEDS_SCHEMA + 1, Some(">=0.2.0"))),
            Verdict::Claim
        );
        assert_eq!(
            judge(&v("0.2.0"), &contract(NEEDS_SCHEMA, None)),
            Verdict::Claim
        );
    }

    #[test]
    fn an_older_schema_asks_for_migrate_and_a_newer_requirement_refuses() {
        assert_eq!(
            judge(&v("0.2.0"), &contract(NEEDS_SCHEMA - 1, None)),
            Verdict::Migrate {
                found: NEEDS_SCHEMA - 1
            }
        );
        assert_eq!(
            judge(&v("0.2.0"), &contract(0, None)),
            Verdict::Migrate { found: 0 }
        );
        let refused = judge(&v("0.2.0"), &contract(NEEDS_SCHEMA + 1, Some(">=0.3.0")));
        assert_eq!(
            refused,
            Verdict::Refused {
                schema: NEEDS_SCHEMA + 1,
                requirement: ">=0.3.0".into()
            }
        );
        assert!(judge(&v("0.3.0"), &contract(NEEDS_SCHEMA + 1, Some(">=0.3.0"))).claims());
        // A requirement with an upper bound excludes newer relays too.
        assert!(!judge(
            &v("1.0.0"),
            &contract(NEEDS_SCHEMA, Some(">=0.1.0, <1.0.0"))
        )
        .claims());
        // A release candidate is judged as its release.
        assert!(judge(
            &v("0.3.0-rc.1"),
            &contract(NEEDS_SCHEMA + 1, Some(">=0.3.0"))
        )
        .claims());
    }

    #[test]
    fn the_refusal_is_one_line_naming_both_versions_and_what_to_do() {
        let line = Refusal {
            relay: v("0.2.0"),
            table: "\"public\".\"outbox\"".into(),
            verdict: judge(&v("0.2.0"), &contract(NEEDS_SCHEMA + 1, Some(">=0.3.0"))),
        }
        .to_string();
        assert_eq!(
            line,
            "outbox-relay 0.2.0 may not claim on \"public\".\"outbox\": its schema (version 6) admits relays >=0.3.0; claiming stopped: deploy a relay that matches >=0.3.0"
        );
        let migrate = Refusal {
            relay: v("0.2.0"),
            table: "\"outbox\"".into(),
            verdict: Verdict::Migrate {
                found: NEEDS_SCHEMA - 1,
            },
        }
        .to_string();
        assert!(migrate.contains("run outbox-relay migrate"), "{migrate}");
        assert!(!migrate.contains('\n') && !line.contains('\n'));
    }

    #[test]
    fn an_unreadable_requirement_is_an_error_naming_it() {
        let err = Contract::read(4, Some("newest")).unwrap_err();
        assert!(err.contains("\"newest\""), "{err}");
    }

    #[test]
    fn migrate_never_lowers_a_recorded_requirement() {
        assert_eq!(raised(None, EXPANDED), ">=0.1.0");
        assert_eq!(raised(Some(">=0.2.0"), EXPANDED), ">=0.2.0");
        assert_eq!(raised(Some(">=0.1.0"), CONTRACTED), ">=0.2.0");
        assert_eq!(raised(Some(">=0.10.0"), ">=0.9.0"), ">=0.10.0");
        assert_eq!(raised(Some(">=0.3.0, <2"), CONTRACTED), ">=0.3.0, <2");
    }

    #[test]
    fn the_check_interval_leaves_two_renewals_inside_a_lease() {
        assert_eq!(check_every(Duration::from_secs(30)), CHECK_EVERY);
        assert_eq!(check_every(Duration::from_secs(3)), Duration::from_secs(1));
        assert!(claims_allowed_for(Duration::from_secs(30)) > check_every(Duration::from_secs(30)));
    }

    #[test]
    fn contract_is_blocked_by_every_relay_it_would_exclude_and_every_unregistered_sign() {
        let req = VersionReq::parse(CONTRACTED).unwrap();
        let registered = [
            ("a", "0.2.0", "h1"),
            ("b", "0.1.5", "h2"),
            ("c", "garbage", "h3"),
            ("d", "0.3.1", "h4"),
        ];
        let blockers = contract_blockers(&req, registered, ["lease owner 'old-1'".to_string()]);
        assert_eq!(
            blockers,
            [
                "relay b (0.1.5, on h2)",
                "relay c (garbage, on h3)",
                "lease owner 'old-1'"
            ]
        );
        assert!(contract_blockers(&req, [("a", "0.2.0", "h")], Vec::new()).is_empty());
    }

    #[test]
    fn the_requirements_migrate_writes_parse() {
        for req in [EXPANDED, CONTRACTED] {
            assert!(VersionReq::parse(req).is_ok(), "{req}");
        }
        // The contracted requirement admits this build: --contract never locks out its own relay.
        assert!(matches_release(
            &VersionReq::parse(CONTRACTED).unwrap(),
            &Version::parse(env!("CARGO_PKG_VERSION")).unwrap()
        ));
    }
}
