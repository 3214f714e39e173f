//! docs/configuration.md against the binary's own `--help`: every command's every long flag has
//! a row there with its environment variable and default, and no row names a flag that is gone.
//!
//! The doc's rule, which this test reads: a `##` section applies to the commands written in
//! its heading as `` `outbox-relay CMD` ``, or to every command when the heading says
//! "every command"; a flag's row is a table line starting with `` | `--flag` ``.

use std::time::Duration;

use crate::scenario::args;
use crate::support::run_to_end;

/// One option as `--help` shows it.
#[derive(Debug, Clone)]
struct Flag {
    long: String,
    env: Option<String>,
    default: Option<String>,
    help: String,
}

/// `--help` of `outbox-relay PATH...`.
async fn help(path: &[&str]) -> String {
    let mut parts = path.to_vec();
    parts.push("--help");
    let (status, output) = run_to_end(&args(&parts), &[], Duration::from_secs(20)).await;
    assert!(status.success(), "{parts:?}: {output}");
    output
}

/// The subcommands listed under `Commands:`, without `help`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim_end() != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// Options with a long name; `--help` and `--version` are clap's own.
fn flags(help: &str) -> Vec<Flag> {
    let mut blocks: Vec<Vec<&str>> = Vec::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.starts_with('-') && (2..=6).contains(&indent) {
            blocks.push(vec![line]);
        } else if indent == 0 && !trimmed.is_empty() {
            // A heading such as `Options:` or `Commands:` ends the block before it.
            blocks.push(Vec::new());
        } else if let Some(block) = blocks.last_mut().filter(|b| !b.is_empty()) {
            block.push(line);
        }
    }
    blocks
        .iter()
        .filter(|b| !b.is_empty())
        .filter_map(|block| {
            let long = block[0]
                .split(|c: char| c.is_whitespace() || c == ',')
                .find(|t| t.starts_with("--"))?
                .to_string();
            let text = block.join(" ");
            let bracket = |tag: &str| {
                let start = text.find(tag)? + tag.len();
                let end = start + text[start..].find(']')?;
                Some(text[start..end].to_string())
            };
            let env =
                bracket("[env: ").map(|e| e.split('=').next().unwrap_or_default().to_string());
            let default = bracket("[default: ");
            let first = block[0]
                .trim_start()
                .split_once("  ")
                .map(|(_, rest)| rest.trim());
            let help = first
                .into_iter()
                .chain(block[1..].iter().map(|l| l.trim()))
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            let help = help
                .split(" [")
                .next()
                .unwrap_or_default()
                .trim()
                .to_string();
            Some(Flag {
                long,
                env,
                default,
                help,
            })
        })
        .filter(|f| f.long != "--help" && f.long != "--version")
        .collect()
}

/// A doc section: which commands it covers and its flag rows.
struct Section {
    heading: String,
    commands: Vec<String>,
    everyone: bool,
    rows: Vec<String>,
}

fn sections(doc: &str) -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    for line in doc.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            let commands = heading
                .split('`')
                .skip(1)
                .step_by(2)
                .filter_map(|code| code.strip_prefix("outbox-relay"))
                .map(|rest| rest.trim().to_string())
                .collect();
            out.push(Section {
                heading: heading.to_string(),
                commands,
                everyone: heading.contains("every command"),
                rows: Vec::new(),
            });
        } else if line.starts_with("| `--") {
            if let Some(section) = out.last_mut() {
                section.rows.push(line.to_string());
            }
        }
    }
    out
}

/// The row's first cell, which names its flag(s), e.g. `` `--retry-base`, `--retry-max` ``.
fn first_cell(row: &str) -> &str {
    row.trim_start_matches('|')
        .split('|')
        .next()
        .unwrap_or_default()
}

fn row_names(row: &str, long: &str) -> bool {
    first_cell(row).contains(&format!("`{long}`")) || first_cell(row).contains(&format!("`{long} "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_reference_matches_every_commands_help() {
    // Every command path, found from the top-level help down.
    let mut commands: Vec<Vec<String>> = vec![Vec::new()];
    let mut i = 0;
    let mut helps = Vec::new();
    while i < commands.len() {
        let path = commands[i].clone();
        let text = help(&path.iter().map(String::as_str).collect::<Vec<_>>()).await;
        for sub in subcommands(&text) {
            let mut child = path.clone();
            child.push(sub);
            commands.push(child);
        }
        helps.push((path.join(" "), text));
        i += 1;
    }

    let doc_path = crate::support::repo_root().join("docs/configuration.md");
    let doc = std::fs::read_to_string(&doc_path)
        .unwrap_or_else(|e| panic!("{}: {e}", doc_path.display()));
    let sections = sections(&doc);
    let mut problems = Vec::new();
    let mut seen = 0;
    for (command, text) in &helps {
        let shown = format!("outbox-relay {command}").trim().to_string();
        if !command.is_empty()
            && subcommands(text).is_empty()
            && !sections.iter().any(|s| s.commands.contains(command))
        {
            problems.push(format!("no `## ` section names `{shown}`"));
        }
        let applies = |s: &Section| s.everyone || s.commands.contains(command);
        for flag in flags(text) {
            seen += 1;
            let rows: Vec<&String> = sections
                .iter()
                .filter(|s| applies(s))
                .flat_map(|s| &s.rows)
                .filter(|r| row_names(r, &flag.long))
                .collect();
            let Some(row) = rows.first() else {
                problems.push(format!(
                    "{shown}: {} has no row; add to its section:\n| `{}` | {} | {} | {} |",
                    flag.long,
                    flag.long,
                    flag.env
                        .as_deref()
                        .map(|e| format!("`{e}`"))
                        .unwrap_or_default(),
                    flag.default
                        .as_deref()
                        .map(|d| format!("`{d}`"))
                        .unwrap_or_default(),
                    flag.help
                ));
                continue;
            };
            if let Some(env) = &flag.env {
                if !row.contains(&format!("`{env}`")) {
                    problems.push(format!(
                        "{shown}: the row of {} lacks `{env}`: {row}",
                        flag.long
                    ));
                }
            }
            if let Some(default) = &flag.default {
                if !row.contains(&format!("`{default}`")) {
                    problems.push(format!(
                        "{shown}: the row of {} lacks its default `{default}`: {row}",
                        flag.long
                    ));
                }
            }
        }
    }
    // The other way round: a row for a flag none of its section's commands has is stale.
    for section in &sections {
        for row in &section.rows {
            let cell = first_cell(row);
            for long in cell.split('`').skip(1).step_by(2) {
                let long = long.split_whitespace().next().unwrap_or_default();
                let exists = helps.iter().any(|(command, text)| {
                    (section.everyone || section.commands.contains(command))
                        && flags(text).iter().any(|f| f.long == long)
                });
                if !exists {
                    problems.push(format!(
                        "section {:?} documents {long}, which none of its commands has",
                        section.heading
                    ));
                }
            }
        }
    }
    println!(
        "checked {seen} flags of {} commands against {}",
        helps.len(),
        doc_path.display()
    );
    assert!(
        problems.is_empty(),
        "docs/configuration.md is out of date:\n{}",
        problems.join("\n")
    );
}

#[test]
fn help_blocks_are_read_in_both_of_claps_layouts() {
    let short = "Options:\n      --table <TABLE>\n          Outbox table [env: OUTBOX_TABLE=] [default: outbox]\n      --json\n          Print JSON\n  -h, --help\n          Print help\n";
    let long = "Options:\n      --lease <LEASE>\n          How long a claim holds its rows\n          \n          [env: OUTBOX_LEASE=]\n          [default: 30s]\n\n      --database-url <DATABASE_URL>\n          PostgreSQL connection\n          \n          [env: DATABASE_URL]\n\n";
    let top = "Options:\n      --log-format <LOG_FORMAT>  Log line format [env: OUTBOX_LOG_FORMAT=] [default: text] [possible values: text, json]\n  -h, --help                     Print help\n";
    let f = flags(short);
    assert_eq!(f.len(), 2);
    assert_eq!(f[0].long, "--table");
    assert_eq!(f[0].env.as_deref(), Some("OUTBOX_TABLE"));
    assert_eq!(f[0].default.as_deref(), Some("outbox"));
    assert_eq!(f[0].help, "Outbox table");
    assert_eq!((f[1].env.as_deref(), f[1].default.as_deref()), (None, None));
    let f = flags(long);
    assert_eq!(f[0].default.as_deref(), Some("30s"));
    assert_eq!(f[1].env.as_deref(), Some("DATABASE_URL"));
    let f = flags(top);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].default.as_deref(), Some("text"));
    assert_eq!(f[0].help, "Log line format");
}
