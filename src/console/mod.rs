//! `outbox-relay console`: the operators' web page over every table the relays serve. It reads
//! what `status` reads (once per refresh interval, however many pages are open), lists
//! quarantined rows by seeking on the quarantined index, and, only where turned on, retries
//! quarantined rows and replays sent ones through the same statements as the CLI, each action
//! shown as a count first, confirmed, logged and counted.
//!
//! - `access`: tokens, sessions, CSRF tokens and origins (who may do what).
//! - `tables`: the figures, cached per refresh interval, and the sent-per-minute history.
//! - `causes`: pure: why a table's rows do not move, with the runbook section.
//! - `pages`: the HTML, maud templates escaped at compile time.
//! - this file: the listener, TLS, and each request's route.

mod access;
mod causes;
mod pages;
mod tables;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::command::Failure;
use crate::config::{parse_when, ConsoleConfig};
use crate::outbox::{ReplaySelection, RetryRows, RetrySelection};
use access::{Access, Denied, Who};
use pages::{href, Context};
use tables::Tables;

/// The console's own metrics, on its own `/metrics` (src/metrics.rs names the relays'): actions
/// taken, labelled `action` (`retry`, `replay`) and `table`, each also a log line naming who
/// took it; and the tables' figures read from the database, what the console costs it.
pub const ACTIONS: &str = "outbox_console_actions_total";
pub const TABLE_READS: &str = "outbox_console_table_reads_total";

/// Rows per page of the quarantine list.
const PAGE_ROWS: i64 = 100;

/// A form larger than this is refused (a selection of a page's rows is a few KiB).
const MAX_FORM: usize = 256 * 1024;

/// How often the sent-per-minute history is sampled while no page is open.
const SAMPLE_EVERY: Duration = Duration::from_secs(60);

/// The most rows one replay selects, as the CLI's default --limit.
const REPLAY_LIMIT: i64 = 10_000;

/// Every response's headers: no script, style or image from anywhere but the console, no
/// framing, no caching of pages that show rows, no referrer leaving with a table's name
/// (`same-origin`, not `no-referrer`: under the latter a browser sends `Origin: null` with the
/// console's own forms, and the origin check could not tell them from a sandboxed attacker's).
const SECURITY_HEADERS: [(&str, &str); 6] = [
    (
        "content-security-policy",
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "same-origin"),
    ("cache-control", "no-store"),
    ("cross-origin-opener-policy", "same-origin"),
];

struct Console {
    access: Access,
    tables: Tables,
    actions: bool,
    payloads: bool,
    runbook: Option<String>,
    metrics: PrometheusHandle,
}

/// Serves the console until `shutdown`.
pub async fn run(config: ConsoleConfig, shutdown: CancellationToken) -> Result<(), Failure> {
    config.database.read_secrets().map_err(Failure::Config)?;
    let access = Access::from_file(config.token_file.as_deref(), config.tls.is_some())
        .map_err(Failure::Config)?;
    let tls = match &config.tls {
        Some((cert, key)) => Some(tls_acceptor(cert, key).map_err(Failure::Config)?),
        None => None,
    };
    let metrics = crate::metrics::install().map_err(Failure::Runtime)?;
    let listener = TcpListener::bind(config.listen).await.map_err(|e| {
        Failure::Config(format!(
            "--listen {}: cannot listen there: {e}",
            config.listen
        ))
    })?;
    let bound = listener
        .local_addr()
        .map_err(|e| Failure::Runtime(e.to_string()))?;
    let console = Arc::new(Console {
        access,
        tables: Tables::new(config.database.clone(), config.refresh),
        actions: config.actions,
        payloads: config.payloads,
        runbook: config.runbook_url.clone(),
        metrics,
    });
    tracing::info!(
        console_addr = %bound,
        url = %format!("{}://{bound}/", if tls.is_some() { "https" } else { "http" }),
        access = if console.access.needs_token() { "token" } else { "loopback, no token" },
        actions = console.actions,
        payloads = console.payloads,
        "console listening"
    );
    tokio::spawn(sample(Arc::clone(&console), shutdown.clone()));
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "console accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => return Ok(()),
        };
        let console = Arc::clone(&console);
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(stream) => serve_connection(stream, console, peer).await,
                    Err(e) => tracing::debug!(%peer, error = %e, "console TLS handshake failed"),
                },
                None => serve_connection(stream, console, peer).await,
            }
        });
    }
}

/// Keeps the sent-per-minute history fed while no page is open; with pages open the refresh
/// interval's cache answers and this costs nothing more.
async fn sample(console: Arc<Console>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => { console.tables.overview().await; }
            _ = shutdown.cancelled() => return,
        }
    }
}

fn tls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "--tls-cert {} holds no PEM certificate",
            cert.display()
        ));
    }
    // The parser's own messages may quote a line of the key: none is passed on.
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|_| format!("--tls-key {} holds no PEM private key", key.display()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("--tls-cert and --tls-key do not make a certificate: {e}"))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

async fn serve_connection<S>(stream: S, console: Arc<Console>, peer: SocketAddr)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let console = Arc::clone(&console);
        async move { Ok::<_, Infallible>(route(&console, req, peer).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10))
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "console connection ended");
    }
}

type Answer = Response<Full<Bytes>>;

fn answer(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Answer {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    for (name, value) in SECURITY_HEADERS {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

fn html(status: StatusCode, markup: maud::Markup) -> Answer {
    answer(status, "text/html; charset=utf-8", markup.into_string())
}

fn redirect(to: &str, set_cookie: Option<String>) -> Answer {
    let mut response = answer(StatusCode::SEE_OTHER, "text/plain; charset=utf-8", "");
    if let Ok(location) = HeaderValue::from_str(to) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    if let Some(cookie) = set_cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

fn denied(why: Denied) -> Answer {
    match why {
        Denied::Unauthenticated => {
            let mut response = html(
                StatusCode::UNAUTHORIZED,
                pages::message(
                    "Sign in first",
                    "This console needs a token: sign in at /login, or send Authorization: Bearer.",
                ),
            );
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
        Denied::ForeignHost => html(
            StatusCode::FORBIDDEN,
            pages::message(
                "Not this host",
                "A console without a token answers only requests for localhost or a loopback address.",
            ),
        ),
        Denied::CrossSite => html(
            StatusCode::FORBIDDEN,
            pages::message(
                "Refused",
                "A change must come from the console's own page (its origin and form token); reload the page and try again.",
            ),
        ),
    }
}

fn not_found(what: &str) -> Answer {
    html(StatusCode::NOT_FOUND, pages::message("Not found", what))
}

/// The query string's or form's pairs.
type Fields = Vec<(String, String)>;

fn first<'a>(fields: &'a Fields, key: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn query(req: &Request<Incoming>) -> Fields {
    form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

async fn form(req: Request<Incoming>) -> Result<Fields, Answer> {
    let body = Limited::new(req.into_body(), MAX_FORM)
        .collect()
        .await
        .map_err(|_| {
            answer(
                StatusCode::PAYLOAD_TOO_LARGE,
                "text/plain; charset=utf-8",
                "form too large\n",
            )
        })?
        .to_bytes();
    Ok(form_urlencoded::parse(&body).into_owned().collect())
}

async fn route(console: &Console, req: Request<Incoming>, peer: SocketAddr) -> Answer {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    match (&method, path.as_str()) {
        (&Method::GET, "/static/console.css") => {
            return answer(StatusCode::OK, "text/css; charset=utf-8", pages::STYLESHEET)
        }
        (&Method::GET, "/login") => return html(StatusCode::OK, pages::login(false)),
        // Browsers ask for it on every page; not worth a 401 in their console.
        (&Method::GET, "/favicon.ico") => {
            return answer(StatusCode::NO_CONTENT, "image/x-icon", "")
        }
        (&Method::POST, "/login") => return login(console, req, peer).await,
        _ => {}
    }
    let who = match console.access.who(req.headers()) {
        Ok(who) => who,
        Err(why) => return denied(why),
    };
    let ctx = Context {
        who: &who.name,
        csrf: console.access.csrf(&who),
        actions: console.actions,
        payloads: console.payloads,
        logged_in: console.access.needs_token(),
        runbook: console.runbook.as_deref(),
    };
    match (method, path.as_str()) {
        (Method::GET, "/") => {
            let overview = console.tables.overview().await;
            let held = first(&query(&req), "hold").is_some();
            html(
                StatusCode::OK,
                pages::overview(&overview, &ctx, console.tables.refresh().as_secs(), held),
            )
        }
        (Method::GET, "/table") => quarantine_page(console, &query(&req), &ctx).await,
        (Method::GET, "/event") => event_page(console, &query(&req), &ctx).await,
        (Method::GET, "/replay") => {
            if !console.actions {
                return actions_off();
            }
            let fields = query(&req);
            match table_of(console, &fields).await {
                Ok((table, _)) => html(StatusCode::OK, pages::replay_form(table, &ctx)),
                Err(answer) => answer,
            }
        }
        (Method::GET, "/metrics") => answer(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            console.metrics.render(),
        ),
        (Method::POST, path) => {
            let headers = req.headers().clone();
            let fields = match form(req).await {
                Ok(fields) => fields,
                Err(refused) => return refused,
            };
            if let Err(why) = console
                .access
                .check_post(&headers, &who, first(&fields, "csrf"))
            {
                tracing::warn!(%peer, who = %who.name, path, "console refused a POST from another origin or without its form token");
                return denied(why);
            }
            match path {
                "/logout" => redirect("/login", Some(console.access.logout(&headers))),
                "/retry" => retry(console, &fields, &ctx, &who, peer).await,
                "/replay" => replay(console, &fields, &ctx, &who, peer).await,
                _ => not_found("No such action."),
            }
        }
        _ => not_found("No such page."),
    }
}

async fn login(console: &Console, req: Request<Incoming>, peer: SocketAddr) -> Answer {
    if !console.access.needs_token() {
        return redirect("/", None);
    }
    if !console.access.same_origin(req.headers()) {
        return denied(Denied::CrossSite);
    }
    let fields = match form(req).await {
        Ok(fields) => fields,
        Err(refused) => return refused,
    };
    match first(&fields, "token").and_then(|t| console.access.token_owner(t.trim())) {
        Some(name) => {
            tracing::info!(%peer, who = %name, "console sign-in");
            let cookie = console.access.login(name);
            redirect("/", Some(cookie))
        }
        None => {
            tracing::warn!(%peer, "console sign-in with a token that opens nothing");
            html(StatusCode::UNAUTHORIZED, pages::login(true))
        }
    }
}

fn actions_off() -> Answer {
    html(
        StatusCode::FORBIDDEN,
        pages::message(
            "Actions are off",
            "This console only reads: start it with --actions to retry or replay rows.",
        ),
    )
}

async fn quarantine_page(console: &Console, fields: &Fields, ctx: &Context<'_>) -> Answer {
    let (table, outbox) = match table_of(console, fields).await {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    let reason = first(fields, "reason").filter(|r| !r.is_empty());
    let destination = first(fields, "destination");
    let after = first(fields, "after")
        .and_then(|a| a.parse::<i64>().ok())
        .unwrap_or(0);
    match outbox
        .quarantine_list(reason, destination, after, PAGE_ROWS)
        .await
    {
        Ok(rows) => {
            let next_after = (rows.len() as i64 == PAGE_ROWS)
                .then(|| rows.last().map(|r| r.id))
                .flatten();
            html(
                StatusCode::OK,
                pages::quarantined(
                    &pages::QuarantinePage {
                        table,
                        reason,
                        destination,
                        rows: &rows,
                        next_after,
                    },
                    ctx,
                ),
            )
        }
        Err(e) => failed(&e),
    }
}

async fn event_page(console: &Console, fields: &Fields, ctx: &Context<'_>) -> Answer {
    let Some(id) = first(fields, "id").and_then(|i| i.parse::<i64>().ok()) else {
        return not_found("Which event? (id=)");
    };
    let (table, outbox) = match table_of(console, fields).await {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    match outbox.event(id, console.payloads).await {
        Ok(Some(event)) => html(StatusCode::OK, pages::event(table, &event, ctx)),
        Ok(None) => not_found("No row with that id (sent and deleted, or never there)."),
        Err(e) => failed(&e),
    }
}

/// The table a request names (`t=`) and its outbox, if the console's selection holds it.
async fn table_of<'a>(
    console: &Console,
    fields: &'a Fields,
) -> Result<(&'a str, Arc<crate::outbox::Outbox>), Answer> {
    let Some(table) = first(fields, "t") else {
        return Err(not_found("Which table? (t=)"));
    };
    match console.tables.outbox(table).await {
        Some(outbox) => Ok((table, outbox)),
        None => Err(not_found("No such table in this console's selection.")),
    }
}

/// A form's fields for its confirmation page, which adds its own CSRF token and `confirm`.
fn resubmitted(fields: &Fields) -> Vec<(String, String)> {
    fields
        .iter()
        .filter(|(k, _)| k != "csrf" && k != "confirm")
        .cloned()
        .collect()
}

fn failed(e: &dyn std::fmt::Display) -> Answer {
    html(
        StatusCode::BAD_GATEWAY,
        pages::message("The database did not answer", &e.to_string()),
    )
}

/// Retry quarantined rows: the selected ids, or every row narrowed by reason and destination.
/// Without `confirm=yes` only counts them (a dry run) and asks.
async fn retry(
    console: &Console,
    fields: &Fields,
    ctx: &Context<'_>,
    who: &Who,
    peer: SocketAddr,
) -> Answer {
    if !console.actions {
        return actions_off();
    }
    let (table, outbox) = match table_of(console, fields).await {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    let ids: Vec<i64> = fields
        .iter()
        .filter(|(k, _)| k == "id")
        .filter_map(|(_, v)| v.parse().ok())
        .collect();
    let which = if ids.is_empty() {
        RetrySelection {
            rows: RetryRows::All,
            reason: first(fields, "reason").map(str::to_string),
            destination: first(fields, "destination").map(str::to_string),
        }
    } else {
        RetrySelection::rows(RetryRows::Ids(ids))
    };
    let confirmed = first(fields, "confirm") == Some("yes");
    let done = match outbox.quarantine_retry(&which, !confirmed).await {
        Ok(done) => done,
        Err(e) => return failed(&e),
    };
    let back = href("/table", &[("t", table)]);
    if !confirmed {
        if done.selected == 0 {
            return html(
                StatusCode::OK,
                pages::done("No quarantined row matches: nothing to retry.", &back, ctx),
            );
        }
        let warning = (done.maybe_accepted > 0).then(|| format!(
            "{} of them were quarantined less than 5 minutes ago after claims that ended without an outcome: a FIFO queue may drop the retried copy as a duplicate of one it accepted then.",
            done.maybe_accepted
        ));
        let keep = resubmitted(fields);
        return html(
            StatusCode::OK,
            pages::confirm(
                &format!(
                    "Retry {} quarantined row(s) of {table}: {}. They become unsent again, attempts reset, with the same event_id.",
                    done.selected,
                    describe_retry(&which)
                ),
                "/retry",
                &keep,
                warning.as_deref(),
                ctx,
            ),
        );
    }
    tracing::info!(
        action = "retry",
        table,
        who = %who.name,
        %peer,
        selection = %describe_retry(&which),
        moved = done.moved,
        "console: quarantined rows retried"
    );
    metrics::counter!(ACTIONS, "action" => "retry", "table" => table.to_string()).increment(1);
    html(
        StatusCode::OK,
        pages::done(
            &format!(
                "Moved {} row(s) of {table} back to unsent; the relays send them with the same event_id.",
                done.moved
            ),
            &back,
            ctx,
        ),
    )
}

fn describe_retry(which: &RetrySelection) -> String {
    let rows = match &which.rows {
        RetryRows::Ids(ids) if ids.len() == 1 => format!("row {}", ids[0]),
        RetryRows::Ids(ids) => format!("{} selected rows", ids.len()),
        RetryRows::EventId(e) => format!("event {e}"),
        RetryRows::All => "every quarantined row".to_string(),
    };
    let reason = which
        .reason
        .as_ref()
        .map(|r| format!(" of reason {r}"))
        .unwrap_or_default();
    let destination = match which.destination.as_deref() {
        None => String::new(),
        Some("") => " without a queue_url of their own".to_string(),
        Some(d) => format!(" for {d}"),
    };
    format!("{rows}{reason}{destination}")
}

/// Replay sent rows kept by --retention: by event ids or a time range, counted first.
async fn replay(
    console: &Console,
    fields: &Fields,
    ctx: &Context<'_>,
    who: &Who,
    peer: SocketAddr,
) -> Answer {
    if !console.actions {
        return actions_off();
    }
    let (table, outbox) = match table_of(console, fields).await {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    let back = href("/replay", &[("t", table)]);
    let event_ids: Vec<String> = first(fields, "event_ids")
        .unwrap_or("")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let when = |key: &str| -> Result<Option<std::time::SystemTime>, String> {
        match first(fields, key).map(str::trim).filter(|v| !v.is_empty()) {
            Some(text) => parse_when(text).map(Some),
            None => Ok(None),
        }
    };
    let (since, until) = match (when("since"), when("until")) {
        (Ok(since), Ok(until)) => (since, until),
        (Err(e), _) | (_, Err(e)) => {
            return html(StatusCode::BAD_REQUEST, pages::done(&e, &back, ctx))
        }
    };
    if event_ids.is_empty() && since.is_none() && until.is_none() {
        return html(
            StatusCode::BAD_REQUEST,
            pages::done(
                "A replay needs event ids or a time range: a replay of every kept row is asked for by a range.",
                &back,
                ctx,
            ),
        );
    }
    let confirmed = first(fields, "confirm") == Some("yes");
    let which = ReplaySelection {
        event_ids: (!event_ids.is_empty()).then_some(event_ids),
        since,
        until,
        event_types: None,
        limit: REPLAY_LIMIT,
        new_dedup_id: false,
        dry_run: !confirmed,
    };
    let done = match outbox.replay(&which).await {
        Ok(done) => done,
        Err(e) => return failed(&e),
    };
    if !confirmed {
        if done.selected == 0 {
            return html(
                StatusCode::OK,
                pages::done(
                    "No sent row matches; sent rows are kept only with the relays' --retention.",
                    &back,
                    ctx,
                ),
            );
        }
        let warning = (done.sent_within_dedup_window > 0).then(|| format!(
            "{} of them were sent less than 5 minutes ago: a FIFO queue drops a copy with a deduplication ID it accepted in the last 5 minutes (the CLI's replay --new-dedup-id sends those anyway).",
            done.sent_within_dedup_window
        ));
        let keep = resubmitted(fields);
        return html(
            StatusCode::OK,
            pages::confirm(
                &format!(
                    "Replay {} sent row(s) of {table}: they become unsent again and are sent with the same event_id.",
                    done.selected
                ),
                "/replay",
                &keep,
                warning.as_deref(),
                ctx,
            ),
        );
    }
    tracing::info!(
        action = "replay",
        table,
        who = %who.name,
        %peer,
        replayed = done.replayed,
        first_id = done.first_id,
        last_id = done.last_id,
        "console: sent rows replayed"
    );
    metrics::counter!(ACTIONS, "action" => "replay", "table" => table.to_string()).increment(1);
    html(
        StatusCode::OK,
        pages::done(
            &format!(
                "Replayed {} sent row(s) of {table}: unsent again, sent with the same event_id.",
                done.replayed
            ),
            &href("/", &[]),
            ctx,
        ),
    )
}
