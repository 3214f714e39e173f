//! What the simulation watches while and after the relays run: an application session through
//! the pool, whether the table has settled, and what `status` and the gauges say at a quiet
//! point.

use super::*;

/// Samples what an application session through the pool reads, until `stop`.
pub(super) async fn sample_pool(
    url: String,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Vec<String> {
    use std::sync::atomic::Ordering;
    let mut leaks = Vec::new();
    let mut client: Option<Client> = None;
    while !stop.load(Ordering::Relaxed) {
        if client.is_none() {
            if let Ok((c, connection)) = tokio_postgres::connect(&url, NoTls).await {
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                client = Some(c);
            }
        }
        if let Some(c) = &client {
            // One simple query, so one transaction on one server connection.
            match c
                .simple_query(
                    "SHOW synchronous_commit; SHOW plan_cache_mode; \
                     SELECT count(*) FROM pg_prepared_statements; \
                     SELECT coalesce(string_agg(name || ': ' || left(statement, 120), ' | '), '') \
                     FROM pg_prepared_statements",
                )
                .await
            {
                Ok(messages) => {
                    let seen: Vec<String> = messages
                        .into_iter()
                        .filter_map(|m| match m {
                            SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                            _ => None,
                        })
                        .collect();
                    if seen.get(..3) != Some(&["on", "auto", "0"].map(String::from)[..]) {
                        // The statements left behind, by name and text: which client made them.
                        let leak = format!(
                            "synchronous_commit={}, plan_cache_mode={}, prepared statements={} ({})",
                            seen.first().map_or("?", |s| s),
                            seen.get(1).map_or("?", |s| s),
                            seen.get(2).map_or("?", |s| s),
                            seen.get(3).map_or("?", |s| s)
                        );
                        if !leaks.contains(&leak) && leaks.len() < 5 {
                            leaks.push(leak);
                        }
                    }
                }
                Err(_) => client = None,
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    leaks
}

/// Unsent rows (parked ones included) and no live claim.
pub(super) async fn settled(client: &Client) -> bool {
    client
        .query_one(
            "SELECT (SELECT count(*) FROM public.outbox WHERE sent_at IS NULL \
               AND (quarantined_at IS NULL OR quarantine_reason = 'destination')) \
             + (SELECT count(*) FROM public.outbox_claims)",
            &[],
        )
        .await
        .map(|r| r.get::<_, i64>(0) == 0)
        .unwrap_or(false)
}

pub(super) async fn quiet_point(
    client: &Client,
    relays: &[RelayProcess],
    faulted: &HashSet<String>,
    admin_url: &str,
    table: &str,
) -> Quiet {
    let table_now = || async {
        let r = client
            .query_one(
                "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at))::float8, 0) \
                 FROM public.outbox WHERE sent_at IS NULL \
                 AND (quarantined_at IS NULL OR quarantine_reason IN ('blocked', 'destination'))",
                &[],
            )
            .await
            .expect("count unsent rows");
        (r.get::<_, i64>(0), r.get::<_, f64>(1))
    };
    let mut quiet = Quiet::default();
    // `status` is a one-shot command: after a database restart PgBouncer refuses logins for a
    // while (`server_login_retry`), and `status` then fails as it should; an operator runs it
    // again. A status that keeps failing, or fails any other way, is reported.
    let status_by = Instant::now() + Duration::from_secs(30);
    let (status, out) = loop {
        let (status, out) = run_to_end(
            &args(&[
                "status",
                "--json",
                "--database-url",
                admin_url,
                "--table",
                table,
            ]),
            &[],
            Duration::from_secs(30),
        )
        .await;
        // Only a refused login is tried again: any other failure (a statement of the relay's
        // failing through the pool, say) is what the check is for.
        let login_refused = out.contains("server login has been failing")
            || out.contains("cannot connect to PostgreSQL");
        if status.success() || !login_refused || Instant::now() >= status_by {
            break (status, out);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    (quiet.table_unsent, quiet.table_age) = table_now().await;
    if !status.success() {
        quiet.status_error = Some(last_line(&out));
    } else {
        if let Some(json) = out
            .lines()
            .find(|l| l.starts_with('{'))
            .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        {
            quiet.status_unsent = json["unsent"].as_i64();
            quiet.status_age = json["oldest_unsent_age_seconds"].as_f64();
        }
    }
    // The gauges refresh every --stats-interval (500 ms), on the relay's maintenance
    // connection: a relay cut off by a fault may take --maintenance-timeout (10 s) to notice
    // that connection is gone, so an unfaulted relay is asked when there is one, and the gauges
    // get that long to catch up.
    let addr_of = |p: &RelayProcess| {
        p.output()
            .lines()
            .find_map(crate::support::parse_metrics_addr)
    };
    let addr = relays
        .iter()
        .filter(|p| !faulted.contains(p.name()))
        .chain(relays.iter())
        .find_map(addr_of);
    let deadline = Instant::now() + Duration::from_secs(12);
    while let Some(addr) = &addr {
        if let Some(body) = http_get_metrics(addr).await {
            quiet.gauge_unsent = crate::support::metric_value(&body, "outbox_unsent_rows");
            quiet.gauge_age =
                crate::support::metric_value(&body, "outbox_oldest_unsent_age_seconds");
            (quiet.gauge_table_unsent, quiet.gauge_table_age) = table_now().await;
            // Both: after an outage the count may agree already (nothing moved) while the
            // age is still the one read before it, until the first statistics pass.
            if quiet.gauges_agree() {
                break;
            }
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    quiet
}

pub(super) async fn http_get_metrics(addr: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        std::io::Result::Ok(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    text.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
}
