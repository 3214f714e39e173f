//! The files the test reads: the dashboards, the docs that name their panels, and the YAML of
//! manifests (a few keys' values, without a YAML library).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::support::repo_root;

use super::lint::panels;

/// The docs send operators to panels by title ("the dashboard's *Send failures by kind*"):
/// each title they name is a panel's.
pub fn docs_name_panels_that_exist(
    docs: &Path,
    dashboards: &[(PathBuf, serde_json::Value)],
) -> Vec<String> {
    let titles: BTreeSet<&str> = dashboards
        .iter()
        .flat_map(|(_, d)| panels(d))
        .filter_map(|p| p["title"].as_str())
        .collect();
    let mut problems = Vec::new();
    for path in std::fs::read_dir(docs).into_iter().flatten().flatten() {
        let path = path.path();
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        for (at, marker) in text.match_indices("dashboard's *") {
            let rest = &text[at + marker.len()..];
            let title = rest.split('*').next().unwrap_or("");
            if !titles.contains(title) {
                problems.push(format!(
                    "{} names the dashboard panel *{title}*, which no dashboard has",
                    relative(&path)
                ));
            }
        }
    }
    problems
}

pub fn read_dashboards(dir: &Path) -> Vec<(PathBuf, serde_json::Value)> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no dashboard in {}", dir.display());
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("read a dashboard");
            let json = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
            (path, json)
        })
        .collect()
}

pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(yaml_files(&path));
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The values of every `key:` in a YAML text: plain or quoted on its line, or a block scalar
/// (`|`, `>`, with chomping indicators) on the lines indented below it.
pub fn yaml_values(text: &str, key: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start().trim_start_matches("- ");
        let Some(value) = trimmed.strip_prefix(&format!("{key}:")) else {
            continue;
        };
        let value = value.trim();
        if value.starts_with('|') || value.starts_with('>') {
            let indent = line.len() - line.trim_start().len();
            let block: Vec<&str> = lines[i + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
                .map(|l| l.trim())
                .collect();
            let joiner = if value.starts_with('|') { "\n" } else { " " };
            out.push(block.join(joiner).trim().to_string());
        } else {
            let unquoted = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .map(|v| v.replace("\\\"", "\"").replace("\\\\", "\\"))
                .or_else(|| {
                    value
                        .strip_prefix('\'')
                        .and_then(|v| v.strip_suffix('\''))
                        .map(|v| v.replace("''", "'"))
                })
                .unwrap_or_else(|| value.to_string());
            out.push(unquoted);
        }
    }
    out
}

pub fn relative(path: &Path) -> String {
    path.strip_prefix(repo_root())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn yaml_values_read_plain_quoted_and_block_scalars() {
    let text = "spec:\n  triggers:\n    - type: prometheus\n      metadata:\n        \
                query: max(a{job=\"x\"})\n        other: 1\n    - metadata:\n        \
                query: 'sum(b)'\n    - metadata:\n        query: >-\n          max(\n          \
                c)\n        threshold: \"5\"\n";
    assert_eq!(
        yaml_values(text, "query"),
        ["max(a{job=\"x\"})", "sum(b)", "max( c)"]
    );
}
