//! What the relay must do under each setting a database or role can impose (issue 26, item 2):
//! the one table to edit when a setting's expected behaviour changes.

use crate::plan::Setting;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Delivers unchanged; refusing to start is a violation.
    Delivers,
    /// May refuse at start, with one line naming this text (the setting, so the operator knows
    /// what to fix); delivering unchanged is fine too.
    MayRefuse(&'static str),
}

/// PgBouncer in transaction pooling without a `--pooler` flag: the default mode must be safe
/// there (issue 26), so it delivers; a setting that may refuse still may.
pub const THROUGH_A_POOL: Expect = Expect::Delivers;

pub fn expectation(setting: &Setting, pooled: bool) -> Expect {
    match (by_setting(setting), pooled) {
        (Expect::Delivers, true) => THROUGH_A_POOL,
        (expect, _) => expect,
    }
}

fn by_setting(setting: &Setting) -> Expect {
    match setting {
        // A read-only role is a configuration to name, not a standby to wait for.
        Setting::ReadOnly => Expect::MayRefuse("default_transaction_read_only"),
        // `--table outbox` with a search_path that does not reach it: say so, not "run migrate".
        Setting::SearchPathWithoutPublic { qualified: false } => Expect::MayRefuse("search_path"),
        _ => Expect::Delivers,
    }
}
