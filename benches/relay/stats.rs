//! Statistics every group uses: quantiles, medians, shares of a count, signed time
//! differences.

use std::collections::BTreeMap;
use std::time::Instant;

/// Nearest-rank quantile of sorted values.
pub fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// `share%` of each key, largest first, the small ones left out.
pub fn shares(map: &BTreeMap<String, u64>) -> String {
    let total: u64 = map.values().sum();
    let mut v: Vec<(&String, &u64)> = map.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    v.iter()
        .filter(|(_, n)| **n * 100 >= total.max(1))
        .map(|(k, n)| format!("{k} {:.0}%", **n as f64 * 100.0 / total.max(1) as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `arrival - commit` in milliseconds; negative when the event reached the sink before the
/// INSERT's reply reached the writer.
pub fn signed_ms(commit: Instant, arrival: Instant) -> f64 {
    if arrival >= commit {
        (arrival - commit).as_secs_f64() * 1000.0
    } else {
        -((commit - arrival).as_secs_f64() * 1000.0)
    }
}

pub fn rounded_rank_quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}
