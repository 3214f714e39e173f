//! Where rows go: the destinations, and which of them refuse us lately.
//!
//! - [`parked`]: which destinations are refusing us, and until when their rows wait.

mod parked;

pub use parked::{bucket_key, describe, Destinations, Park};
