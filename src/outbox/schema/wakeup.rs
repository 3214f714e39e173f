//! What each `--wakeup` mode installs in the database (the NOTIFY trigger, the publication)
//! and what is installed now: `migrate --wakeup MODE` installs what MODE needs and removes what
//! it does not (the modes themselves: the `wakeup` room of `outbox`).

use crate::outbox::conn::Conn;
use crate::outbox::error::{query_err, OutboxError};
use crate::outbox::ident::quote_ident;
use crate::outbox::store::Outbox;
use crate::outbox::template::{render, Value};
use crate::outbox::wakeup::{Installed, Wakeup};

impl Outbox {
    /// What of the wake-up modes' objects exists now.
    pub async fn installed_wakeup(&self) -> Result<Installed, OutboxError> {
        let client = self.raw_connect().await?;
        self.installed_on(&client).await
    }

    async fn installed_on(&self, client: &Conn) -> Result<Installed, OutboxError> {
        let publication = self.resolve_channel(client).await?;
        let row = client
            .query_one(
                include_str!("../../../sql/wakeup_installed.sql"),
                &[&self.base_or_table().quoted(), &publication],
            )
            .await
            .map_err(query_err("looking up the wake-up trigger and publication"))?;
        Ok(Installed {
            trigger: row.get(0),
            publication: row.get(1),
        })
    }

    /// Installs what `mode` needs and removes what it does not; touches the table (and takes
    /// its lock) only when something changes.
    pub async fn set_up_wakeup(&self, mode: Wakeup) -> Result<Installed, OutboxError> {
        // The migration's session: serialised with other `migrate` runs, and its DDL waits
        // for the table's lock only as long as the migration's lock policy allows.
        let client = self.migration_session().await?;
        let found = self.installed_on(&client).await?;
        let channel = self.resolve_channel(&client).await?;
        let base = self.base_or_table().quoted();
        let function = self.table().qualify(&self.table().derived("notify"));
        let mut steps: Vec<(String, &'static str)> = Vec::new();
        match (mode, found.trigger) {
            (Wakeup::Notify, _) => steps.push((
                render(
                    include_str!("../../../sql/wakeup_notify.sql"),
                    &[
                        ("notify_function", Value::Sql(&function)),
                        ("base", Value::Sql(&base)),
                        ("channel", Value::Literal(&channel)),
                    ],
                )
                .map_err(OutboxError::Template)?,
                "installing the NOTIFY trigger",
            )),
            (_, true) => steps.push((
                format!(
                    "DROP TRIGGER IF EXISTS outbox_relay_notify ON {base}; \
                     DROP FUNCTION IF EXISTS {function}();"
                ),
                "removing the NOTIFY trigger",
            )),
            (_, false) => {}
        }
        match (mode, found.publication) {
            (Wakeup::Logical, false) => steps.push((
                format!(
                    "CREATE PUBLICATION {} FOR TABLE {base} WITH (publish = 'insert');",
                    quote_ident(&channel)
                ),
                "creating the publication for --wakeup logical",
            )),
            (Wakeup::Poll | Wakeup::Notify, true) => steps.push((
                format!("DROP PUBLICATION IF EXISTS {};", quote_ident(&channel)),
                "removing the publication of --wakeup logical",
            )),
            _ => {}
        }
        for (ddl, what) in steps {
            self.with_lock_retries(&client, what, &ddl).await?;
        }
        self.installed_on(&client).await
    }
}
