//! Pure: how many rows the next claim asks for. A relay that keeps up claims `--batch-size`
//! rows at most; one that falls behind (its claims come back full) doubles the next claim, up
//! to [`CATCH_UP`] times `--batch-size`, and goes back to `--batch-size` as soon as a claim
//! comes back with room to spare.
//!
//! Why: each claim and its settlement cost the database a fixed amount besides their rows (two
//! statements planned, two transactions), about as much as a hundred rows' work. With the
//! database's core saturated by the application's writers, the relay's one backend gets a
//! share of it, and that fixed cost decided whether the relay kept up: with the database on
//! its own core and 16 writers committing ~11,000 events/s, claims of 100 fell seconds behind
//! (commit-to-sent p50 0.3–6 s) and claims of 400 kept within 73 ms (docs/benchmarks.md).

/// The largest claim, in multiples of `--batch-size`.
pub const CATCH_UP: usize = 4;

/// The next claim's row limit after a claim that asked for `asked` rows got `got`.
pub fn next(batch_size: usize, asked: usize, got: usize) -> usize {
    if got >= asked {
        asked
            .saturating_mul(2)
            .min(batch_size * CATCH_UP)
            .max(batch_size)
    } else {
        batch_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_claims_double_up_to_the_cap_and_one_with_room_goes_back() {
        assert_eq!(next(100, 100, 100), 200);
        assert_eq!(next(100, 200, 200), 400);
        assert_eq!(next(100, 400, 400), 400, "capped at CATCH_UP batches");
        assert_eq!(
            next(100, 400, 399),
            100,
            "room to spare: back to --batch-size"
        );
        assert_eq!(next(100, 100, 0), 100);
        assert_eq!(next(1, 1, 1), 2);
    }
}
