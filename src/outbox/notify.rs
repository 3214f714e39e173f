//! `--wakeup notify`: a connection that LISTENs on the table's channel.

use std::time::Duration;

use futures_util::StreamExt;
use tokio_postgres::AsyncMessage;

use super::error::{query_err, OutboxError};
use super::store::Outbox;
use super::template::{render, Value};

impl Outbox {
    /// A connection that LISTENs on the table's channel and calls `wake` on each notification.
    /// Returns when the connection ends, so the caller can reconnect; `on_listening` runs once
    /// LISTEN is in place (anything inserted before then was missed and must be polled for).
    pub async fn listen(
        &self,
        wake: impl Fn(),
        on_listening: impl FnOnce(),
    ) -> Result<(), OutboxError> {
        let (client, mut connection) = self.connector().open().await?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let driver = tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(_)) => {
                        if tx.send(()).is_err() {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "listen connection ended");
                        break;
                    }
                }
            }
        });
        let client = super::conn::Conn::new(client, self.connector().pooler_in_use());
        // As every direct connection of the relay's (see `conn::session_baseline`).
        if !client.pooled() {
            client
                .batch_execute(&super::conn::session_baseline(self.round_trip()))
                .await
                .map_err(query_err("setting up the wake-up connection's session"))?;
        }
        let channel = self.resolve_channel(&client).await?;
        client
            .batch_execute(
                &render("LISTEN {channel}", &[("channel", Value::Ident(&channel))])
                    .map_err(OutboxError::Template)?,
            )
            .await
            .map_err(query_err("subscribing to wake-ups"))?;
        on_listening();
        // An idle LISTEN connection sends nothing, so a path that went dark would go unnoticed
        // (keepalives only catch a peer whose kernel stopped answering): with a round-trip
        // deadline, a round trip every deadline proves the connection still answers.
        let every = self
            .round_trip()
            .unwrap_or(Duration::from_secs(24 * 60 * 60));
        let mut check = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                woken = rx.recv() => match woken {
                    Some(()) => wake(),
                    None => break,
                },
                _ = check.tick() => {
                    if tokio::time::timeout(every, client.batch_execute("")).await.is_err() {
                        driver.abort();
                        return Err(OutboxError::Unanswered {
                            what: "checking the wake-up connection",
                            after: every,
                        });
                    }
                }
            }
        }
        driver.abort();
        Err(OutboxError::Connect {
            target: self.connector().target(),
            reason: "the wake-up connection was closed".to_string(),
        })
    }
}
