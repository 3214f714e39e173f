//! How an idle relay learns of new rows, and what each way installs in the database.
//!
//! `poll` installs nothing. `notify` installs a trigger whose NOTIFY serializes the
//! application's commits (PostgreSQL holds a database-wide lock from pre-commit through the
//! WAL flush of every transaction that queued a notification), so it is opt-in. `logical`
//! installs a publication that a temporary replication slot streams (see `logical`).
//! `migrate --wakeup MODE` installs what MODE needs and removes what it does not, so moving
//! between modes (and upgrading an install that predates them) leaves nothing behind.

use std::fmt;
use std::str::FromStr;

/// The wake-up mode (`--wakeup`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Wakeup {
    /// Adaptive polling with a read-only probe; nothing installed.
    #[default]
    Poll,
    /// A temporary logical replication slot on the table's publication wakes the relay.
    Logical,
    /// The NOTIFY trigger (opt-in: it costs the application's commits).
    Notify,
}

impl Wakeup {
    pub fn as_str(self) -> &'static str {
        match self {
            Wakeup::Poll => "poll",
            Wakeup::Logical => "logical",
            Wakeup::Notify => "notify",
        }
    }
}

impl fmt::Display for Wakeup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Wakeup {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "poll" => Ok(Wakeup::Poll),
            "logical" => Ok(Wakeup::Logical),
            "notify" => Ok(Wakeup::Notify),
            other => Err(format!("{other:?}: use poll, logical or notify")),
        }
    }
}

/// What of the modes' objects exists for a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Installed {
    /// The NOTIFY trigger on the base table.
    pub trigger: bool,
    /// The publication the logical wake-up streams.
    pub publication: bool,
}

impl Installed {
    /// Whether relays running `mode` find what they need, and nothing that costs the
    /// application for no use. `Err` is one line saying which `migrate` fixes it.
    pub fn judge(self, mode: Wakeup) -> Result<(), String> {
        let fix = format!("run `outbox-relay migrate --wakeup {mode}` with the same --table");
        match mode {
            Wakeup::Notify if !self.trigger => {
                Err(format!("--wakeup notify needs the NOTIFY trigger: {fix}"))
            }
            Wakeup::Logical if !self.publication => {
                Err(format!("--wakeup logical needs the table's publication: {fix}"))
            }
            Wakeup::Poll | Wakeup::Logical if self.trigger => Err(format!(
                "the NOTIFY trigger of an earlier install is still on the table and serializes the application's commits: {fix}"
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_needs_its_object_and_no_trigger_it_does_not_use() {
        let none = Installed {
            trigger: false,
            publication: false,
        };
        let trigger = Installed {
            trigger: true,
            publication: false,
        };
        let publication = Installed {
            trigger: false,
            publication: true,
        };
        assert!(none.judge(Wakeup::Poll).is_ok());
        assert!(publication.judge(Wakeup::Poll).is_ok());
        assert!(trigger.judge(Wakeup::Notify).is_ok());
        assert!(publication.judge(Wakeup::Logical).is_ok());
        let err = none.judge(Wakeup::Notify).unwrap_err();
        assert!(err.contains("migrate --wakeup notify"), "{err}");
        let err = trigger.judge(Wakeup::Logical).unwrap_err();
        assert!(err.contains("migrate --wakeup logical"), "{err}");
        let err = trigger.judge(Wakeup::Poll).unwrap_err();
        assert!(
            err.contains("serializes the application's commits"),
            "{err}"
        );
        assert!(err.contains("migrate --wakeup poll"), "{err}");
    }

    #[test]
    fn modes_parse_and_print_alike() {
        for mode in [Wakeup::Poll, Wakeup::Logical, Wakeup::Notify] {
            assert_eq!(mode.as_str().parse::<Wakeup>(), Ok(mode));
        }
        assert!("Listen"
            .parse::<Wakeup>()
            .unwrap_err()
            .contains("poll, logical or notify"));
    }
}
