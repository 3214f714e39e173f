//! Evaluating queries through Prometheus's API over the run: each must return series and name
//! only metrics the relay exports.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use crate::support::prometheus::{Prometheus, JOB, SCRAPE_INTERVAL};

use super::files::{relative, yaml_files, yaml_values};
use super::lint::{panel_name, panels};
use super::promql::{by_labels, selectors, signals, substitute};
use super::{ALERTS, METRICS_SOURCE};

/// Metrics that Prometheus makes of every scrape itself; queries may name these too.
const SCRAPE_METRICS: &[&str] = &["up", "scrape_duration_seconds", "scrape_samples_scraped"];

/// The relay's labels with a fixed set of values (src/metrics.rs), each worth a word on the
/// panels that split by it; `version` and `destination` are open-ended.
const ENUMERATED_LABELS: &[&str] = &["kind", "reason", "state"];

/// Grafana's `$__interval` for a range query of one point a scrape interval, and its
/// `$__rate_interval`: max($__interval + scrape interval, 4 × scrape interval).
const INTERVAL: &str = "1s";
const RATE_INTERVAL: &str = "4s";

/// Evaluates queries over the run and collects what is wrong with them.
pub struct Checker<'a> {
    pub prometheus: &'a Prometheus,
    pub start: f64,
    pub end: f64,
    /// The metric names src/metrics.rs declares.
    pub declared: BTreeSet<String>,
    /// The metric names Prometheus holds (`/api/v1/label/__name__/values`).
    pub exported: BTreeSet<String>,
}

impl Checker<'_> {
    /// Every declared metric is exported (a histogram as its `_bucket` series), and every
    /// `outbox_` metric exported is declared.
    pub fn exports_what_it_declares(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for name in &self.declared {
            if !self.exported.contains(name) && !self.exported.contains(&format!("{name}_bucket")) {
                problems.push(format!(
                    "{METRICS_SOURCE} declares {name}, but no relay exported it during the run"
                ));
            }
        }
        for name in self.exported.iter().filter(|n| n.starts_with("outbox_")) {
            if !self.declared.contains(base_name(name)) {
                problems.push(format!(
                    "the relay exports {name}, which {METRICS_SOURCE} does not declare"
                ));
            }
        }
        problems
    }

    /// Says (without failing) which metrics the relay exports that no dashboard shows.
    pub fn note_metrics_no_panel_shows(&self, dashboards: &[(PathBuf, serde_json::Value)]) {
        let shown: BTreeSet<String> = dashboards
            .iter()
            .flat_map(|(_, d)| panels(d))
            .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
            .filter_map(|t| t["expr"].as_str().map(selectors))
            .flatten()
            .map(|s| base_name(&s.metric).to_string())
            .collect();
        let unshown: Vec<&String> = self.declared.difference(&shown).collect();
        if !unshown.is_empty() {
            println!("note: exported, on no dashboard panel: {unshown:?}");
        }
    }

    /// The metric names in `expr` that the relay does not export, or Prometheus does not hold.
    fn unknown_metrics(&self, expr: &str) -> Vec<String> {
        let mut problems = Vec::new();
        for selector in selectors(expr) {
            let name = selector.metric.as_str();
            if name.is_empty() {
                problems.push(format!(
                    "a selector without a metric name cannot be checked: {}",
                    selector.matchers
                ));
            } else if !SCRAPE_METRICS.contains(&name) && !self.declared.contains(base_name(name)) {
                problems.push(format!("{name} is not a metric of {METRICS_SOURCE}"));
            } else if !self.exported.contains(name) {
                problems.push(format!("{name} is not among the metrics Prometheus holds"));
            }
        }
        problems
    }

    /// What is wrong with `expr` over the run: an error, no series, only NaN (nothing to
    /// draw), unknown metrics, or a selector of it that matches nothing. Also prints what it
    /// returned, for the record.
    async fn check(&self, what: &str, expr: &str) -> Vec<String> {
        let mut problems: Vec<String> = self
            .unknown_metrics(expr)
            .into_iter()
            .map(|p| format!("{what}: {p}: {expr}"))
            .collect();
        match self.range(expr).await {
            Err(e) => problems.push(format!("{what}: {e}: {expr}")),
            Ok(0) => problems.push(format!("{what} returns no series: {expr}")),
            Ok(n) => println!("ok {what}: {n} series: {expr}"),
        }
        for selector in selectors(expr) {
            let text = selector.text();
            if text != expr && matches!(self.range(&text).await, Ok(0)) {
                problems.push(format!(
                    "{what}: its selector {text} matches no series: {expr}"
                ));
            }
        }
        problems
    }

    /// How many series with at least one number `expr` returns over the run.
    async fn range(&self, expr: &str) -> Result<usize, String> {
        let step = SCRAPE_INTERVAL.as_secs_f64();
        let series = self
            .prometheus
            .query_range(expr, self.start, self.end, step)
            .await?;
        let drawn = |s: &serde_json::Value| {
            s["values"].as_array().into_iter().flatten().any(|v| {
                v[1].as_str()
                    .and_then(|x| x.parse::<f64>().ok())
                    .is_some_and(f64::is_finite)
            })
        };
        Ok(series.iter().filter(|s| drawn(s)).count())
    }

    /// Every template variable's query and every panel's every query.
    pub async fn dashboard(&self, dashboard: &serde_json::Value) -> Vec<String> {
        let mut problems = Vec::new();
        let window = format!("{}s", (self.end - self.start).ceil());
        let mut values: HashMap<String, String> = [
            ("__interval", INTERVAL),
            ("__rate_interval", RATE_INTERVAL),
            ("__range", window.as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let variables = dashboard["templating"]["list"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for variable in &variables {
            let name = variable["name"].as_str().unwrap_or("?").to_string();
            match variable["type"].as_str() {
                Some("datasource") => {
                    values.insert(name, "prometheus".to_string());
                }
                Some("query") => match self.variable(variable, &values).await {
                    Ok(value) => {
                        values.insert(name, value);
                    }
                    Err(e) => problems.push(format!("variable {name}: {e}")),
                },
                other => problems.push(format!("variable {name}: type {other:?} is not checked")),
            }
        }
        for panel in panels(dashboard) {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let Some(expr) = target["expr"].as_str() else {
                    continue;
                };
                let what = format!(
                    "{} query {}",
                    panel_name(panel),
                    target["refId"].as_str().unwrap_or("?")
                );
                match substitute(expr, &values) {
                    Ok(expr) => {
                        problems.extend(self.check(&what, &expr).await);
                        problems.extend(self.explained(panel, &expr).await);
                    }
                    Err(e) => problems.push(format!("{what}: {e}")),
                }
            }
        }
        problems
    }

    /// A panel that splits its series by one of the relay's enumerated labels says in its
    /// description what each value the relay exports means: an operator looking at a line
    /// called `destination` finds it explained.
    async fn explained(&self, panel: &serde_json::Value, expr: &str) -> Vec<String> {
        let mut problems = Vec::new();
        let description = panel["description"].as_str().unwrap_or("");
        for label in by_labels(expr) {
            if !ENUMERATED_LABELS.contains(&label.as_str()) {
                continue;
            }
            let (start, end) = (self.start.to_string(), self.end.to_string());
            for selector in selectors(expr) {
                let series = format!("{}{{job=\"{JOB}\"}}", selector.metric);
                let values = self
                    .prometheus
                    .api(
                        &format!("label/{label}/values"),
                        &[("match[]", &series), ("start", &start), ("end", &end)],
                    )
                    .await;
                let values = match values {
                    Ok(values) => values,
                    Err(e) => {
                        problems.push(format!("{}: {label} of {series}: {e}", panel_name(panel)));
                        continue;
                    }
                };
                for value in values
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str())
                {
                    if !mentions(description, value) {
                        problems.push(format!(
                            "{} shows {label}=\"{value}\" ({}), which its description does not explain",
                            panel_name(panel),
                            selector.metric
                        ));
                    }
                }
            }
        }
        problems
    }

    /// A query variable's values, evaluated as Grafana's Prometheus data source does, and the
    /// value it stands for in queries (the "All" value where it offers one).
    async fn variable(
        &self,
        variable: &serde_json::Value,
        values: &HashMap<String, String>,
    ) -> Result<String, String> {
        let query = variable["query"]["query"]
            .as_str()
            .or(variable["query"].as_str())
            .or(variable["definition"].as_str())
            .ok_or("no query")?;
        let query = substitute(query, values)?;
        let (start, end) = (self.start.to_string(), self.end.to_string());
        let inner = query
            .trim()
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .ok_or_else(|| format!("only label_values(...) is checked: {query}"))?;
        let (selector, label) = match inner.rsplit_once(',') {
            Some((selector, label)) => (Some(selector.trim()), label.trim()),
            None => (None, inner.trim()),
        };
        let mut params = vec![("start", start.as_str()), ("end", end.as_str())];
        if let Some(selector) = selector {
            params.push(("match[]", selector));
            let unknown = self.unknown_metrics(selector);
            if !unknown.is_empty() {
                return Err(format!("{}: {query}", unknown.join("; ")));
            }
        }
        let found = self
            .prometheus
            .api(&format!("label/{label}/values"), &params)
            .await
            .map_err(|e| format!("{e}: {query}"))?;
        let found: Vec<&str> = found
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
            .collect();
        if found.is_empty() {
            return Err(format!("returns no values: {query}"));
        }
        println!("ok variable {}: {found:?}: {query}", variable["name"]);
        let all = variable["allValue"].as_str().filter(|a| !a.is_empty());
        Ok(match (variable["includeAll"].as_bool(), all) {
            (Some(true), Some(all)) => all.to_string(),
            _ if variable["multi"] == true => format!("({})", found.join("|")),
            _ => found[0].to_string(),
        })
    }

    /// Every alerting rule of the file, loaded and healthy; what each compares with its
    /// threshold returns series; and the metrics its annotations query exist.
    pub async fn alerts(&self, rules: &[serde_json::Value], file: &Path) -> Vec<String> {
        let mut problems = Vec::new();
        let text = std::fs::read_to_string(file).expect("read the alert rules");
        let in_file = text
            .lines()
            .filter(|l| l.trim_start().starts_with("- alert:"))
            .count();
        if in_file != rules.len() {
            problems.push(format!(
                "{ALERTS} has {in_file} alerts, Prometheus loaded {}",
                rules.len()
            ));
        }
        for rule in rules {
            let name = rule["name"].as_str().unwrap_or("?");
            let what = format!("alert {name}");
            let expr = rule["query"].as_str().unwrap_or("");
            if rule["health"] != "ok" {
                problems.push(format!(
                    "{what}: health {} ({}): {expr}",
                    rule["health"], rule["lastError"]
                ));
            }
            for signal in signals(expr) {
                problems.extend(self.check(&what, &signal).await);
            }
            for (key, annotation) in rule["annotations"].as_object().into_iter().flatten() {
                let annotation = annotation.as_str().unwrap_or("");
                for name in metric_words(annotation) {
                    if !self.declared.contains(base_name(&name)) {
                        problems.push(format!(
                            "{what}: its {key} names {name}, not a metric of {METRICS_SOURCE}"
                        ));
                    }
                }
            }
        }
        problems
    }

    /// The `query` of every KEDA ScaledObject's Prometheus trigger under `deploy`.
    pub async fn scaled_objects(&self, deploy: &Path) -> Vec<String> {
        let mut problems = Vec::new();
        let mut found = 0;
        for path in yaml_files(deploy) {
            let text = std::fs::read_to_string(&path).expect("read a manifest");
            if !text.lines().any(|l| l.trim() == "kind: ScaledObject") {
                continue;
            }
            for query in yaml_values(&text, "query") {
                found += 1;
                // The component leaves the namespace to the overlay (a `replacements` entry);
                // here it is the one the test's targets carry.
                let query = query.replace(
                    "namespace=\"NAMESPACE\"",
                    &format!(
                        "namespace=\"{}\"",
                        crate::support::prometheus::TARGET_NAMESPACE
                    ),
                );
                let what = format!("{} query", relative(&path));
                problems.extend(self.check(&what, &query).await);
            }
        }
        if found == 0 {
            println!(
                "note: no KEDA ScaledObject with a query under {}: nothing to evaluate",
                relative(deploy)
            );
        }
        problems
    }
}

/// The metric names of src/metrics.rs's constants.
pub fn declared_metrics(source: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(source).expect("read src/metrics.rs");
    let names: BTreeSet<String> = text
        .lines()
        .filter(|l| l.starts_with("pub const ") && l.contains(": &str = \""))
        .filter_map(|l| l.split('"').nth(1))
        .map(str::to_string)
        .collect();
    assert!(
        names.len() > 10,
        "too few metrics found in {}",
        source.display()
    );
    names
}

pub async fn exported_metrics(prometheus: &Prometheus) -> BTreeSet<String> {
    let names = prometheus
        .api("label/__name__/values", &[])
        .await
        .expect("GET /api/v1/label/__name__/values");
    names
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect()
}

/// Whether `text` has `word` as a word of its own (not inside a longer identifier).
fn mentions(text: &str, word: &str) -> bool {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        text[..at].chars().next_back().is_none_or(|c| !is_word(c))
            && text[at + word.len()..]
                .chars()
                .next()
                .is_none_or(|c| !is_word(c))
    })
}

/// A histogram's series name without its `_bucket`, `_sum` or `_count`.
fn base_name(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name)
}

/// Words of `text` that look like the relay's metric names.
fn metric_words(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("outbox_") && w.len() > "outbox_".len())
        .map(str::to_string)
        .collect()
}
