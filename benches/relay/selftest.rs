//! The benchmark's own unit tests and their runner: `cargo test --bench relay` runs them.
//!
//! The bench has no libtest harness (`harness = false`: its `main` is the benchmark), and
//! `cargo test` and `cargo bench` both build it with `cfg(test)`; what tells them apart is the
//! profile, so a debug build of this binary runs these instead of the benchmark. Each test is
//! a pure function's rule, no database and no relay.

use std::panic;

/// Every unit test, by the path it is known by.
const TESTS: &[(&str, fn())] = &[
    (
        "stats::quantile_is_the_nearest_rank",
        crate::stats::tests::quantile_is_the_nearest_rank,
    ),
    (
        "stats::rounded_rank_quantile_rounds_the_index",
        crate::stats::tests::rounded_rank_quantile_rounds_the_index,
    ),
    (
        "stats::median_sorts_and_averages_the_middle_pair",
        crate::stats::tests::median_sorts_and_averages_the_middle_pair,
    ),
    (
        "stats::shares_are_largest_first_without_the_small_ones",
        crate::stats::tests::shares_are_largest_first_without_the_small_ones,
    ),
    (
        "stats::signed_ms_is_negative_when_the_arrival_came_first",
        crate::stats::tests::signed_ms_is_negative_when_the_arrival_came_first,
    ),
    (
        "stats::slope_fits_a_line",
        crate::stats::tests::slope_fits_a_line,
    ),
    (
        "stats::rotation_gives_each_item_each_place",
        crate::stats::tests::rotation_gives_each_item_each_place,
    ),
    (
        "stats::per_round_ratios_pair_cells_of_the_same_round",
        crate::stats::tests::per_round_ratios_pair_cells_of_the_same_round,
    ),
    (
        "stats::spread_is_min_and_max",
        crate::stats::tests::spread_is_min_and_max,
    ),
    (
        "affinity::cpu_lists_are_written_as_ranges",
        crate::affinity::tests::cpu_lists_are_written_as_ranges,
    ),
    (
        "waldump::waldump_stats_are_parsed_largest_first",
        crate::waldump::tests::waldump_stats_are_parsed_largest_first,
    ),
    (
        "wal::settlement_modes_start_with_the_default_and_repeat_none",
        crate::wal::tests::settlement_modes_start_with_the_default_and_repeat_none,
    ),
    (
        "settings::pg_options_are_percent_encoded_after_any_query",
        crate::settings::tests::pg_options_are_percent_encoded_after_any_query,
    ),
    (
        "relays::help_values_are_read_from_the_flags_own_block",
        crate::help::tests::help_values_are_read_from_the_flags_own_block,
    ),
    (
        "traces::labels_say_where_spans_went_and_the_batch_settings",
        crate::traces::tests::labels_say_where_spans_went_and_the_batch_settings,
    ),
    (
        "traces::dropped_spans_and_export_errors_are_counted_from_the_logs",
        crate::traces::tests::dropped_spans_and_export_errors_are_counted_from_the_logs,
    ),
    (
        "workload::pacing_is_by_schedule_from_the_start",
        crate::workload::tests::pacing_is_by_schedule_from_the_start,
    ),
    (
        "rates::writers_get_one_connection_per_100_events_a_second",
        crate::rates::tests::writers_get_one_connection_per_100_events_a_second,
    ),
    (
        "rates::backends_are_parted_by_sender_role_and_application",
        crate::rates::tests::backends_are_parted_by_sender_role_and_application,
    ),
    (
        "rates::cpu_is_split_by_part_and_exited_processes_fall_to_the_rest",
        crate::rates::tests::cpu_is_split_by_part_and_exited_processes_fall_to_the_rest,
    ),
    (
        "rates::added_cpu_is_per_event_and_the_ratios_follow",
        crate::rates::tests::added_cpu_is_per_event_and_the_ratios_follow,
    ),
    (
        "statements::statements_are_told_apart_by_what_they_do_to_the_lease_table",
        crate::statements::tests::statements_are_told_apart_by_what_they_do_to_the_lease_table,
    ),
    (
        "statements::per_claim_figures_include_the_claims_steps",
        crate::statements::tests::per_claim_figures_include_the_claims_steps,
    ),
    (
        "statements::statements_are_named_by_the_sql_file_they_open_with",
        crate::statements::tests::statements_are_named_by_the_sql_file_they_open_with,
    ),
    (
        "horizon::phases_run_free_held_released_in_order",
        crate::horizon::tests::phases_run_free_held_released_in_order,
    ),
    (
        "horizon::the_held_ratio_is_the_last_held_window_over_the_free_phase",
        crate::horizon::tests::the_held_ratio_is_the_last_held_window_over_the_free_phase,
    ),
    (
        "report::ratios_print_two_decimals_and_a_dash_for_none",
        crate::report::tests::ratios_print_two_decimals_and_a_dash_for_none,
    ),
];

/// Runs every test whose name contains one of `filters` (all without any), libtest-style
/// lines; exits with 101 when one failed, as libtest does.
pub fn run(filters: &[String]) {
    let chosen: Vec<&(&str, fn())> = TESTS
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    println!("\nrunning {} tests", chosen.len());
    let mut failed = Vec::new();
    for (name, test) in chosen.iter().copied() {
        match panic::catch_unwind(*test) {
            Ok(()) => println!("test {name} ... ok"),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed.push(*name);
            }
        }
    }
    println!(
        "\ntest result: {}. {} passed; {} failed\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        chosen.len() - failed.len(),
        failed.len()
    );
    if !failed.is_empty() {
        std::process::exit(101);
    }
}
