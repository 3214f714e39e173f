//! The console's pages, as maud templates: checked when the relay is built, and every value
//! inserted with `(…)` is HTML-escaped, so what a table holds (event ids, headers, errors,
//! payloads) is shown as text, never run. No script: forms post, and the overview reloads
//! itself with a meta refresh.

use maud::{html, Markup, DOCTYPE};

use super::causes::causes;
use super::tables::{Overview, TableView, HISTORY};
use crate::outbox::{EventDetail, QuarantineEntry, TableReport};

/// What every page needs of the request and the console's settings.
pub struct Context<'a> {
    pub who: &'a str,
    pub csrf: String,
    pub actions: bool,
    pub payloads: bool,
    /// Shown: a logout button (the user logged in with a token).
    pub logged_in: bool,
    pub runbook: Option<&'a str>,
}

/// A link to a page with its query string encoded.
pub fn href(path: &str, params: &[(&str, &str)]) -> String {
    if params.is_empty() {
        return path.to_string();
    }
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (k, v) in params {
        query.append_pair(k, v);
    }
    format!("{path}?{}", query.finish())
}

fn page(title: &str, ctx: Option<&Context>, refresh: Option<u64>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(seconds) = refresh {
                    meta http-equiv="refresh" content=(seconds);
                }
                title { (title) " · outbox-relay console" }
                link rel="stylesheet" href="/static/console.css";
            }
            body {
                header {
                    a.brand href="/" { "outbox-relay console" }
                    @if let Some(ctx) = ctx {
                        span.who { "signed in as " (ctx.who) }
                        span.mode {
                            @if ctx.actions { "actions on" } @else { "read-only" }
                            " · payloads " @if ctx.payloads { "shown" } @else { "hidden" }
                        }
                        @if ctx.logged_in {
                            form.inline method="post" action="/logout" {
                                input type="hidden" name="csrf" value=(ctx.csrf);
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

fn age(seconds: f64) -> String {
    let s = seconds.max(0.0);
    if s < 120.0 {
        format!("{s:.1} s")
    } else if s < 7200.0 {
        format!("{:.1} min", s / 60.0)
    } else if s < 172_800.0 {
        format!("{:.1} h", s / 3600.0)
    } else {
        format!("{:.1} d", s / 86400.0)
    }
}

fn runbook(ctx: &Context, anchor: &str) -> Markup {
    match ctx.runbook {
        Some(base) => html! { a.runbook href=(format!("{base}#{anchor}")) { "runbook" } },
        None => html! { span.runbook { "docs/operations.md#" (anchor) } },
    }
}

/// The sent-per-minute samples of the last hour as a line, newest at the right.
fn chart(view: &TableView) -> Markup {
    let (w, h) = (240.0_f64, 40.0_f64);
    let span = HISTORY.as_secs() as f64;
    let max = view
        .sent_per_minute
        .iter()
        .map(|(_, n)| *n)
        .max()
        .unwrap_or(0);
    let scale = max.max(1) as f64;
    let points: Vec<String> = view
        .sent_per_minute
        .iter()
        .map(|(ago, n)| {
            let x = w - (*ago as f64 / span) * w;
            let y = h - (*n as f64 / scale) * (h - 2.0) - 1.0;
            format!("{x:.1},{y:.1}")
        })
        .collect();
    let last = view.sent_per_minute.last().map_or(0, |(_, n)| *n);
    html! {
        figure.chart {
            svg viewBox=(format!("0 0 {w} {h}")) width=(w) height=(h) role="img"
                aria-label="rows sent per minute, last hour" {
                polyline points=(points.join(" ")) {}
                // The newest sample as a dot, so that a first one shows before there is a line.
                @if let Some((x, y)) = points.last().and_then(|p| p.split_once(',')) {
                    circle cx=(x) cy=(y) r="2" {}
                }
            }
            figcaption { (last) " sent in the last minute · peak " (max) " · last hour" }
        }
    }
}

/// The overview; it reloads itself every `refresh` seconds unless `held` (an operator reading
/// or about to press a button does not want the page to move under them).
pub fn overview(ov: &Overview, ctx: &Context, refresh: u64, held: bool) -> Markup {
    let body = html! {
        p.read {
            "Read " (humantime::format_rfc3339_seconds(ov.read_at)) ". "
            @if held {
                "Held: " a href="/" { "reload every " (refresh) " s" }
            } @else {
                "Reloads every " (refresh) " s · " a href="/?hold=1" { "hold this view" }
            }
        }
        @if let Some(error) = &ov.error {
            p.error { "The tables cannot be listed: " (error) }
        }
        @if ov.tables.is_empty() && ov.error.is_none() {
            p { "No outbox table matches the selection." }
        }
        @for view in &ov.tables { (table_card(view, ctx)) }
        (fleet(ov))
    };
    page("Overview", Some(ctx), (!held).then_some(refresh), body)
}

fn table_card(view: &TableView, ctx: &Context) -> Markup {
    let found = causes(view);
    html! {
        section.table id=(view.key) {
            h2 { a href=(href("/table", &[("t", &view.key)])) { (view.key) } }
            @match &view.report {
                TableReport::Failed { .. } => {}
                TableReport::Read(s) => {
                    dl.figures {
                        div { dt { "unsent" } dd.unsent { (s.unsent) } }
                        div.age { dt { "oldest unsent" } dd { (age(s.oldest_unsent_age_seconds)) } }
                        div { dt { "leased" } dd { (s.leased) } }
                        div { dt { "quarantined" } dd { (s.quarantined) } }
                        div { dt { "parked" } dd { (s.parked) } }
                        div { dt { "counted from id" } dd { (s.unsent_counted_from_id) } }
                    }
                    @if !s.quarantined_by_reason.is_empty() {
                        ul.reasons {
                            @for (reason, n) in &s.quarantined_by_reason {
                                li { a href=(href("/table", &[("t", &view.key), ("reason", reason)])) { (reason) } ": " (n) }
                            }
                        }
                    }
                }
            }
            @if !found.is_empty() {
                ul.causes {
                    @for cause in &found {
                        li class=(if cause.stops { "stops" } else { "aside" }) {
                            span.cause { (cause.text) } " " (runbook(ctx, cause.runbook))
                        }
                    }
                }
            }
            @if !view.parked.is_empty() {
                table.parked {
                    thead { tr { th { "parked destination" } th { "rows" } th { "oldest" } th {} } }
                    tbody {
                        @for p in &view.parked {
                            tr {
                                td.dest { @if p.destination.is_empty() { "(the relays' --queue-url or route)" } @else { (p.destination) } }
                                td { (p.rows) }
                                td { (age(p.oldest_age_seconds)) }
                                td {
                                    a href=(href("/table", &[("t", &view.key), ("reason", "destination"), ("destination", &p.destination)])) { "rows" }
                                    @if ctx.actions {
                                        " " (retry_form(ctx, &view.key, &[("reason", "destination"), ("destination", &p.destination)], "Retry this destination's rows"))
                                    }
                                }
                            }
                        }
                    }
                }
            }
            (chart(view))
        }
    }
}

fn floor(f: Option<i64>) -> String {
    f.map_or_else(|| "-".to_string(), |f| f.to_string())
}

/// Every live relay of every table, once, with the tables it serves.
fn fleet(ov: &Overview) -> Markup {
    let mut relays: Vec<(&crate::outbox::LiveRelay, Vec<&str>)> = Vec::new();
    for view in &ov.tables {
        if let Some(status) = view.status() {
            for relay in &status.relays {
                match relays
                    .iter_mut()
                    .find(|(r, _)| r.relay_id == relay.relay_id)
                {
                    Some((_, tables)) => tables.push(&view.key),
                    None => relays.push((relay, vec![&view.key])),
                }
            }
        }
    }
    html! {
        section.fleet {
            h2 { "Fleet" }
            @if relays.is_empty() {
                p { "No live relay is registered on these tables." }
            } @else {
                table {
                    thead { tr { th { "relay" } th { "version" } th { "host" } th { "state" } th { "last claim" } th { "up" } th { "floors (rows, claims)" } th { "tables" } } }
                    tbody {
                        @for (r, tables) in &relays {
                            tr {
                                td { (r.relay_id) }
                                td { (r.version) }
                                td { (r.host) }
                                td { @if r.claiming { "claiming" } @else { "refused or stopping" } }
                                td { @match r.last_claim_seconds_ago { Some(s) => { (age(s)) " ago" }, None => "never" } }
                                td { (age(r.running_seconds)) }
                                td { (floor(r.unsent_floor)) ", " (floor(r.claims_floor)) }
                                td { (tables.join(", ")) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A form that asks the console what a retry would move; the answer page confirms.
fn retry_form(ctx: &Context, table: &str, fields: &[(&str, &str)], label: &str) -> Markup {
    html! {
        form.inline method="post" action="/retry" {
            input type="hidden" name="csrf" value=(ctx.csrf);
            input type="hidden" name="t" value=(table);
            @for (k, v) in fields { input type="hidden" name=(k) value=(v); }
            button type="submit" { (label) }
        }
    }
}

pub struct QuarantinePage<'a> {
    pub table: &'a str,
    pub reason: Option<&'a str>,
    pub destination: Option<&'a str>,
    pub rows: &'a [QuarantineEntry],
    /// The id the next page starts after, when this one was full.
    pub next_after: Option<i64>,
}

pub fn quarantined(p: &QuarantinePage, ctx: &Context) -> Markup {
    let mut narrowed: Vec<(&str, &str)> = Vec::new();
    if let Some(r) = p.reason {
        narrowed.push(("reason", r));
    }
    if let Some(d) = p.destination {
        narrowed.push(("destination", d));
    }
    let next = p.next_after.map(|after| {
        let after = after.to_string();
        let mut params = narrowed.clone();
        params.push(("t", p.table));
        params.push(("after", &after));
        href("/table", &params)
    });
    let body = html! {
        h1 { "Quarantined rows of " (p.table) }
        p.filter {
            @if let Some(r) = p.reason { "reason " strong { (r) } " · " }
            @if let Some(d) = p.destination { "destination " strong { (d) } " · " }
            a href=(href("/table", &[("t", p.table)])) { "all reasons" }
            @if ctx.actions {
                " · " a href=(href("/replay", &[("t", p.table)])) { "Replay sent events" }
            }
        }
        @if ctx.actions && !p.rows.is_empty() {
            (retry_form(ctx, p.table, &narrowed, if narrowed.is_empty() { "Retry every quarantined row" } else { "Retry every row shown by this filter" }))
        }
        @if p.rows.is_empty() {
            p { "No quarantined rows." }
        } @else {
            form method="post" action="/retry" {
                input type="hidden" name="csrf" value=(ctx.csrf);
                input type="hidden" name="t" value=(p.table);
                table.rows {
                    thead { tr {
                        @if ctx.actions { th {} }
                        th { "id" } th { "event id" } th { "type" } th { "group" } th { "reason" } th { "last error" } th { "attempts" } th { "quarantined at" }
                    } }
                    tbody {
                        @for r in p.rows {
                            tr {
                                @if ctx.actions { td { input type="checkbox" name="id" value=(r.id) aria-label=(format!("select row {}", r.id)); } }
                                td { a href=(href("/event", &[("t", p.table), ("id", &r.id.to_string())])) { (r.id) } }
                                td.eid { (r.event_id.as_deref().unwrap_or("-")) }
                                td { (r.event_type.as_deref().unwrap_or("-")) }
                                td { (r.aggregate_type.as_deref().unwrap_or("-")) "/" (r.aggregate_id.as_deref().unwrap_or("-")) }
                                td.reason { (r.reason) }
                                td.error { (r.last_error) }
                                td { (r.attempts) }
                                td { (r.quarantined_at) }
                            }
                        }
                    }
                }
                @if ctx.actions { button type="submit" { "Retry the selected rows" } }
            }
            @if let Some(next) = &next {
                p { a.next href=(next) { "Next page" } }
            }
        }
    };
    page(&format!("Quarantine of {}", p.table), Some(ctx), None, body)
}

pub fn event(table: &str, e: &EventDetail, ctx: &Context) -> Markup {
    let state = if e.sent_at.is_some() {
        "sent"
    } else if e.quarantine_reason.is_some() {
        "quarantined"
    } else {
        "unsent"
    };
    let body = html! {
        h1 { "Event " (e.id) " of " (table) }
        dl.detail {
            dt { "event id" } dd.eid { (e.event_id.as_deref().unwrap_or("-")) }
            dt { "state" } dd { (state) }
            dt { "type" } dd { (e.event_type.as_deref().unwrap_or("-")) }
            dt { "group" } dd { (e.aggregate_type.as_deref().unwrap_or("-")) "/" (e.aggregate_id.as_deref().unwrap_or("-")) }
            dt { "destination" } dd { @if e.destination.is_empty() { "the relays' --queue-url or route (the row has no queue_url)" } @else { (e.destination) } }
            dt { "size" } dd { @match e.payload_bytes { Some(n) => { (n) " bytes of payload" }, None => "-" } }
            dt { "headers" } dd { code { (e.headers.as_deref().unwrap_or("-")) } }
            dt { "created at" } dd { (e.created_at) }
            dt { "available at" } dd { (e.available_at) }
            dt { "attempts" } dd { (e.attempts) }
            @if let Some(at) = &e.sent_at { dt { "sent at" } dd { (at) } }
            @if let Some(reason) = &e.quarantine_reason {
                dt { "reason" } dd.reason { (reason) }
                dt { "quarantined at" } dd { (e.quarantined_at.as_deref().unwrap_or("-")) }
            }
            @if let Some(error) = &e.last_error { dt { "last error" } dd.error { (error) } }
            dt { "payload" }
            dd {
                @match &e.payload {
                    Some(payload) => { pre.payload { (payload) } },
                    None => { span.muted { "hidden (the console runs without --payloads)" } },
                }
            }
        }
        @if ctx.actions && e.quarantine_reason.is_some() {
            (retry_form(ctx, table, &[("id", &e.id.to_string())], "Retry this row"))
        }
        @if ctx.actions && e.sent_at.is_some() {
            @if let Some(event_id) = &e.event_id {
                form.inline method="post" action="/replay" {
                    input type="hidden" name="csrf" value=(ctx.csrf);
                    input type="hidden" name="t" value=(table);
                    input type="hidden" name="event_ids" value=(event_id);
                    button type="submit" { "Replay this event" }
                }
            }
        }
        p { a href=(href("/table", &[("t", table)])) { "Quarantined rows of " (table) } }
    };
    page(&format!("Event {}", e.id), Some(ctx), None, body)
}

/// What an action would do, and the button that does it: the same fields, confirmed.
pub fn confirm(
    what: &str,
    action: &str,
    fields: &[(String, String)],
    warning: Option<&str>,
    ctx: &Context,
) -> Markup {
    let body = html! {
        h1 { "Confirm" }
        p.would { (what) }
        @if let Some(w) = warning { p.warning { (w) } }
        form method="post" action=(action) {
            input type="hidden" name="csrf" value=(ctx.csrf);
            @for (k, v) in fields { input type="hidden" name=(k) value=(v); }
            input type="hidden" name="confirm" value="yes";
            button.danger type="submit" { "Yes, do it" }
        }
        p { a href="/" { "Cancel" } }
    };
    page("Confirm", Some(ctx), None, body)
}

pub fn done(what: &str, back: &str, ctx: &Context) -> Markup {
    let body = html! {
        p.done { (what) }
        p { a href=(back) { "Back" } " · " a href="/" { "Overview" } }
    };
    page("Done", Some(ctx), None, body)
}

pub fn replay_form(table: &str, ctx: &Context) -> Markup {
    let body = html! {
        h1 { "Replay sent events of " (table) }
        p { "Sent rows kept by the relays' --retention are sent again with the same event_id. The next page shows how many rows match before anything changes." }
        form.stack method="post" action="/replay" {
            input type="hidden" name="csrf" value=(ctx.csrf);
            input type="hidden" name="t" value=(table);
            label { "Event ids, one per line" textarea name="event_ids" rows="4" {} }
            label { "Created since (RFC 3339 or a duration ago, e.g. 2h)" input type="text" name="since"; }
            label { "Created until" input type="text" name="until"; }
            button type="submit" { "Count the rows" }
        }
    };
    page("Replay", Some(ctx), None, body)
}

pub fn login(failed: bool) -> Markup {
    let body = html! {
        h1 { "Sign in" }
        @if failed { p.error { "That token opens nothing." } }
        form.stack method="post" action="/login" {
            label { "Token" input type="password" name="token" autocomplete="current-password" autofocus; }
            button type="submit" { "Sign in" }
        }
    };
    page("Sign in", None, None, body)
}

pub fn message(title: &str, text: &str) -> Markup {
    page(
        title,
        None,
        None,
        html! { h1 { (title) } p { (text) } p { a href="/" { "Overview" } } },
    )
}

/// The stylesheet, served from the binary: no asset from elsewhere.
pub const STYLESHEET: &str = include_str!("console.css");
