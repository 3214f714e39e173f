//! `pg_waldump --stats=record` of the cluster's WAL between two positions: which record types
//! a phase wrote, and how much of it was full-page images.

use std::path::Path;

use crate::progress::say;
use crate::support::pg::bin_dir;

/// Record types [`top`] lists.
const TOP_RECORDS: usize = 5;

/// One line of `pg_waldump --stats=record`.
#[derive(Debug, PartialEq)]
pub struct WalRecord {
    /// `Heap/INSERT`, `Btree/INSERT_LEAF`, …
    pub kind: String,
    /// Records of the kind.
    pub count: u64,
    /// Their bytes without full-page images, and the images' bytes.
    pub record_bytes: u64,
    /// See `record_bytes`.
    pub fpi_bytes: u64,
}

impl WalRecord {
    pub fn bytes(&self) -> u64 {
        self.record_bytes + self.fpi_bytes
    }
}

/// The record lines of `pg_waldump --stats=record` output, largest (record + FPI) first.
pub fn parse_waldump_stats(output: &str) -> Vec<WalRecord> {
    let mut records: Vec<WalRecord> = output
        .lines()
        .filter_map(|line| {
            let cleaned = line.replace(['(', ')'], " ");
            let t: Vec<&str> = cleaned.split_whitespace().collect();
            // Type, N, %, record size, %, FPI size, %, combined size, %.
            if t.len() != 9 || !t[0].contains('/') {
                return None;
            }
            Some(WalRecord {
                kind: t[0].to_string(),
                count: t[1].parse().ok()?,
                record_bytes: t[3].parse().ok()?,
                fpi_bytes: t[5].parse().ok()?,
            })
        })
        .filter(|r| r.count > 0)
        .collect();
    records.sort_by(|a, b| b.bytes().cmp(&a.bytes()).then(a.kind.cmp(&b.kind)));
    records
}

/// `kind n × bytes (FPI share)` of the largest record types.
pub fn top(records: &[WalRecord]) -> String {
    let total: u64 = records.iter().map(WalRecord::bytes).sum::<u64>().max(1);
    records
        .iter()
        .take(TOP_RECORDS)
        .map(|r| {
            format!(
                "{} {:.0}% ({} records, {:.0}% of it FPI)",
                r.kind,
                r.bytes() as f64 * 100.0 / total as f64,
                r.count,
                r.fpi_bytes as f64 * 100.0 / r.bytes().max(1) as f64
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `pg_waldump --stats=record` between two positions; `None` (and a line saying why) when
/// the bindir has no pg_waldump or it fails.
pub fn stats(wal_dir: &Path, start: &str, end: &str) -> Option<Vec<WalRecord>> {
    let tool = bin_dir().join("pg_waldump");
    if !tool.is_file() || !wal_dir.is_dir() {
        say(&format!(
            "  (no WAL record mix: {} or {} is missing)",
            tool.display(),
            wal_dir.display()
        ));
        return None;
    }
    let out = std::process::Command::new(&tool)
        .arg("--stats=record")
        .arg("-p")
        .arg(wal_dir)
        .args(["-s", start, "-e", end])
        .output()
        .ok()?;
    let records = parse_waldump_stats(&String::from_utf8_lossy(&out.stdout));
    if records.is_empty() {
        say(&format!(
            "  (no WAL record mix: pg_waldump {start}..{end}: {})",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
        return None;
    }
    Some(records)
}

// Run by selftest.rs (`cargo test --bench relay`): the bench has no libtest harness.
pub mod tests {
    use super::{parse_waldump_stats, WalRecord};

    /// The shape PostgreSQL 15's `pg_waldump --stats=record` prints.
    const STATS: &str = "\
Type                                           N      (%)          Record size      (%)             FPI size      (%)        Combined size      (%)
----                                           -      ---          -----------      ---             --------      ---        -------------      ---
XLOG/FPI_FOR_HINT                              0 (  0.00)                    0 (  0.00)                    0 (  0.00)                    0 (  0.00)
Heap/INSERT                                20000 ( 40.00)              1620000 ( 60.00)                 8000 (  5.00)              1628000 ( 50.00)
Btree/INSERT_LEAF                          40000 ( 55.00)              2400000 ( 35.00)               160000 ( 90.00)              2560000 ( 45.00)
Transaction/COMMIT                         20000 (  5.00)               680000 (  5.00)                    0 (  0.00)               680000 (  5.00)
                                        --------                      --------                      --------                      --------
Total                                      80000                       4700000 [95.00%]               168000 [5.00%]               4868000 [100%]
";

    pub fn waldump_stats_are_parsed_largest_first() {
        let records = parse_waldump_stats(STATS);
        assert_eq!(
            records.iter().map(|r| r.kind.as_str()).collect::<Vec<_>>(),
            ["Btree/INSERT_LEAF", "Heap/INSERT", "Transaction/COMMIT"]
        );
        assert_eq!(
            records[1],
            WalRecord {
                kind: "Heap/INSERT".into(),
                count: 20000,
                record_bytes: 1620000,
                fpi_bytes: 8000,
            }
        );
        assert!(parse_waldump_stats("pg_waldump: error: no such file").is_empty());
    }
}
