//! Progress lines: on stdout, beside the tables printed at the end.

/// Progress goes to stdout with the table; the relays' own log lines go to stderr.
pub fn say(line: &str) {
    println!("{line}");
}
