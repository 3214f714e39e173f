//! The dashboard's own rules, read from its JSON: panel ids are unique, every panel queries the
//! data source the dashboard's `datasource` variable picks, and every query is shown in a unit
//! that fits what it measures.

use std::collections::HashMap;

use super::promql::selectors;

/// What a query's values are, as far as a unit goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantity {
    Seconds,
    PerSecond,
    PerMinute,
    Count,
}

impl Quantity {
    /// Grafana's unit ids that show this quantity truthfully.
    fn units(self) -> &'static [&'static str] {
        match self {
            Quantity::Seconds => &[
                "s",
                "ms",
                "µs",
                "ns",
                "m",
                "h",
                "d",
                "dtdurations",
                "dtdurationms",
                "dthms",
                "dtdhms",
                "clocks",
                "clockms",
            ],
            Quantity::PerSecond => &["cps", "ops", "reqps", "rps", "wps", "iops"],
            Quantity::PerMinute => &["cpm", "opm", "reqpm", "rpm", "wpm"],
            Quantity::Count => &["short", "none", "locale"],
        }
    }
}

/// What `expr` measures, from its functions and its metrics' names (`_seconds` is a time,
/// `_total` counts); an expression of a shape this does not know is an error, so that a new
/// kind of panel extends the rule rather than passing unchecked.
pub fn quantity(expr: &str) -> Result<Quantity, String> {
    let names: Vec<String> = selectors(expr).into_iter().map(|s| s.metric).collect();
    let compact: String = expr.split_whitespace().collect();
    let seconds = |n: &String| n.ends_with("_seconds") || n.ends_with("_seconds_bucket");
    if compact.contains("histogram_quantile(") {
        return match names.iter().all(|n| n.ends_with("_seconds_bucket")) {
            true => Ok(Quantity::Seconds),
            false => Err(format!("a quantile of a histogram not in seconds: {expr}")),
        };
    }
    if compact.contains("rate(") {
        if names.iter().any(|n| !n.ends_with("_total")) {
            return Err(format!("a rate of something other than a counter: {expr}"));
        }
        return Ok(match compact.ends_with("*60") {
            true => Quantity::PerMinute,
            false => Quantity::PerSecond,
        });
    }
    if compact.contains("increase(") {
        return Ok(Quantity::Count);
    }
    for function in ["delta(", "deriv(", "changes(", "resets(", "_over_time("] {
        if compact.contains(function) {
            return Err(format!("no unit rule for {function}...): {expr}"));
        }
    }
    match (names.iter().all(seconds), names.iter().any(seconds)) {
        (true, _) if !names.is_empty() => Ok(Quantity::Seconds),
        (_, false) => Ok(Quantity::Count),
        _ => Err(format!("seconds mixed with other quantities: {expr}")),
    }
}

/// Every panel, those inside collapsed rows included.
pub fn panels(dashboard: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        out.push(panel);
        out.extend(panel["panels"].as_array().into_iter().flatten());
    }
    out
}

/// A panel as a person finds it on the dashboard.
pub fn panel_name(panel: &serde_json::Value) -> String {
    format!(
        "panel {} {:?}",
        panel["id"],
        panel["title"].as_str().unwrap_or("")
    )
}

/// Every problem the rules find, one line each.
pub fn lint(dashboard: &serde_json::Value) -> Vec<String> {
    let mut problems = Vec::new();
    let all = panels(dashboard);

    let mut ids: HashMap<String, usize> = HashMap::new();
    for panel in &all {
        *ids.entry(panel["id"].to_string()).or_default() += 1;
    }
    for (id, n) in &ids {
        if *n > 1 {
            problems.push(format!("panel id {id} is used by {n} panels"));
        }
    }

    let variables = dashboard["templating"]["list"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let datasource = variables
        .iter()
        .find(|v| v["type"] == "datasource")
        .and_then(|v| v["name"].as_str());
    let Some(datasource) = datasource else {
        problems.push("no template variable of type datasource".to_string());
        return problems;
    };
    let picked = |ds: &serde_json::Value| {
        let uid = ds["uid"].as_str().unwrap_or("");
        ds["type"] == "prometheus"
            && (uid == format!("${{{datasource}}}") || uid == format!("${datasource}"))
    };
    for variable in variables.iter().filter(|v| v["type"] == "query") {
        if !picked(&variable["datasource"]) {
            problems.push(format!(
                "variable {} does not query the ${{{datasource}}} data source: {}",
                variable["name"], variable["datasource"]
            ));
        }
    }

    for panel in all.iter().filter(|p| p["type"] != "row") {
        let name = panel_name(panel);
        if !picked(&panel["datasource"]) {
            problems.push(format!(
                "{name} does not use the ${{{datasource}}} data source: {}",
                panel["datasource"]
            ));
        }
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        if targets.is_empty() {
            problems.push(format!("{name} has no query"));
        }
        let unit = panel["fieldConfig"]["defaults"]["unit"].as_str();
        if unit.is_none_or(str::is_empty) {
            problems.push(format!("{name} has no unit (fieldConfig.defaults.unit)"));
        }
        for target in &targets {
            let refid = target["refId"].as_str().unwrap_or("?");
            if !target["datasource"].is_null() && !picked(&target["datasource"]) {
                problems.push(format!(
                    "{name} query {refid} does not use the ${{{datasource}}} data source: {}",
                    target["datasource"]
                ));
            }
            let Some(expr) = target["expr"].as_str() else {
                problems.push(format!("{name} query {refid} has no expr"));
                continue;
            };
            let shown_in = override_unit(panel, target).or(unit).unwrap_or("");
            match quantity(expr) {
                Ok(q) if q.units().contains(&shown_in) => {}
                Ok(q) => problems.push(format!(
                    "{name} query {refid} measures {q:?} but is shown in unit {shown_in:?} \
                     (one of {:?} fits): {expr}",
                    q.units()
                )),
                Err(e) => problems.push(format!("{name} query {refid}: {e}")),
            }
        }
    }
    problems.sort();
    problems
}

/// The unit an override sets for the series of `target` (matched by its legend or its refId).
fn override_unit<'a>(panel: &'a serde_json::Value, target: &serde_json::Value) -> Option<&'a str> {
    let overrides = panel["fieldConfig"]["overrides"].as_array()?;
    overrides.iter().find_map(|o| {
        let matcher = &o["matcher"];
        let matches = match matcher["id"].as_str() {
            Some("byName") => matcher["options"] == target["legendFormat"],
            Some("byFrameRefID") => matcher["options"] == target["refId"],
            _ => false,
        };
        if !matches {
            return None;
        }
        o["properties"]
            .as_array()?
            .iter()
            .find(|p| p["id"] == "unit")
            .and_then(|p| p["value"].as_str())
    })
}

#[test]
fn quantities_follow_functions_and_metric_names() {
    let q = |e: &str| quantity(e).unwrap();
    assert_eq!(
        q("max(outbox_oldest_unsent_age_seconds{job=\"j\"})"),
        Quantity::Seconds
    );
    assert_eq!(q("sum(up{job=\"j\"})"), Quantity::Count);
    assert_eq!(
        q("sum by (reason) (rate(outbox_events_quarantined_total[4s])) * 60"),
        Quantity::PerMinute
    );
    assert_eq!(q("rate(outbox_events_sent_total[4s])"), Quantity::PerSecond);
    assert_eq!(q("increase(outbox_lease_lost_total[4s])"), Quantity::Count);
    assert_eq!(
        q("histogram_quantile(0.5, sum by (le) (rate(outbox_delivery_lag_seconds_bucket[4s])))"),
        Quantity::Seconds
    );
    assert!(quantity("rate(outbox_unsent_rows[1m])").is_err());
}
