//! Statistics every group uses: quantiles, medians, shares of a count, signed time
//! differences, a least-squares slope. Pure functions; the groups and the report call them.

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

/// Median of unsorted values (the mean of the middle two for an even count); NaN for none.
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

/// The `adopt` group's quantile: the value at `(n - 1) × p` rounded, 0 for none. Not the
/// nearest rank of [`quantile`]: the group has reported it this way from the start.
pub fn rounded_rank_quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Least-squares slope of `y` over `x`; NaN for fewer than two points.
pub fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return f64::NAN;
    }
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    sxy / sxx
}

/// `items` rotated left by `round`: round 0 runs them in order, round 1 starts with the
/// second, and so on, so that each takes each place in turn and a drift of the machine over
/// the rounds favours none of them.
pub fn rotated<T: Copy>(items: &[T], round: usize) -> Vec<T> {
    let n = items.len().max(1);
    (0..items.len()).map(|i| items[(i + round) % n]).collect()
}

/// `a ÷ b` of every round both have a value for (`(round, value)` pairs), in round order:
/// the ratio of cells measured minutes apart, which a slow drift of the machine moves less
/// than it moves the ratio of medians.
pub fn per_round_ratios(a: &[(usize, f64)], b: &[(usize, f64)]) -> Vec<f64> {
    let mut rounds: Vec<usize> = a.iter().map(|(r, _)| *r).collect();
    rounds.sort_unstable();
    rounds.dedup();
    rounds
        .into_iter()
        .filter_map(|r| {
            let of = |v: &[(usize, f64)]| v.iter().find(|(x, _)| *x == r).map(|(_, y)| *y);
            Some(of(a)? / of(b)?)
        })
        .collect()
}

/// (min, max) of the values; NaN for none.
pub fn spread(values: &[f64]) -> (f64, f64) {
    if values.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    (
        values.iter().copied().fold(f64::INFINITY, f64::min),
        values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    )
}

// Run by selftest.rs (`cargo test --bench relay`): the bench has no libtest harness.
pub mod tests {
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};

    use super::*;

    pub fn quantile_is_the_nearest_rank() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(quantile(&v, 0.5), 5.0);
        assert_eq!(quantile(&v, 0.99), 10.0);
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&[3.0], 0.999), 3.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    pub fn rounded_rank_quantile_rounds_the_index() {
        let v = [1.0, 2.0, 3.0, 4.0];
        // (4 - 1) × 0.5 = 1.5 rounds to index 2, where the nearest rank takes index 1.
        assert_eq!(rounded_rank_quantile(&v, 0.5), 3.0);
        assert_eq!(quantile(&v, 0.5), 2.0);
        assert_eq!(rounded_rank_quantile(&v, 0.99), 4.0);
        assert_eq!(rounded_rank_quantile(&[], 0.5), 0.0);
    }

    pub fn median_sorts_and_averages_the_middle_pair() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    pub fn shares_are_largest_first_without_the_small_ones() {
        let counts: BTreeMap<String, u64> = [("CPU", 60), ("IO:WALSync", 39), ("LWLock:x", 1)]
            .into_iter()
            .chain([("idle", 0)])
            .map(|(k, n)| (k.to_string(), n))
            .collect();
        assert_eq!(shares(&counts), "CPU 60%, IO:WALSync 39%, LWLock:x 1%");
        let tiny: BTreeMap<String, u64> = [("CPU".to_string(), 999), ("IO".to_string(), 1)].into();
        assert_eq!(shares(&tiny), "CPU 100%");
        assert_eq!(shares(&BTreeMap::new()), "");
    }

    pub fn signed_ms_is_negative_when_the_arrival_came_first() {
        let commit = Instant::now();
        let later = commit + Duration::from_millis(250);
        assert_eq!(signed_ms(commit, later), 250.0);
        assert_eq!(signed_ms(later, commit), -250.0);
    }

    pub fn slope_fits_a_line() {
        assert_eq!(slope(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]), 2.0);
        assert_eq!(
            slope(&[(0.0, 1.0), (1.0, 0.0), (2.0, 4.0), (3.0, 3.0)]),
            1.0
        );
        assert!(slope(&[(1.0, 1.0)]).is_nan());
    }

    pub fn rotation_gives_each_item_each_place() {
        let cells = ['n', 'r', 'l'];
        assert_eq!(rotated(&cells, 0), vec!['n', 'r', 'l']);
        assert_eq!(rotated(&cells, 1), vec!['r', 'l', 'n']);
        assert_eq!(rotated(&cells, 2), vec!['l', 'n', 'r']);
        assert_eq!(rotated(&cells, 3), rotated(&cells, 0));
        assert!(rotated::<char>(&[], 4).is_empty());
    }

    pub fn per_round_ratios_pair_cells_of_the_same_round() {
        let relay = [(1, 90.0), (0, 80.0), (2, 50.0)];
        let none = [(0, 100.0), (1, 100.0)];
        // Round 2 has no `none` cell: no ratio for it.
        assert_eq!(per_round_ratios(&relay, &none), vec![0.8, 0.9]);
        assert!(per_round_ratios(&[], &none).is_empty());
    }

    pub fn spread_is_min_and_max() {
        assert_eq!(spread(&[3.0, 1.0, 2.0]), (1.0, 3.0));
        let (lo, hi) = spread(&[]);
        assert!(lo.is_nan() && hi.is_nan());
    }
}
