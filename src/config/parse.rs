//! Value parsers for flags whose values clap does not know: sizes, routes, column pairs,
//! retention.

use super::maintenance::Retention;
use crate::destination::{Destination, DestinationError};

pub(super) fn parse_column(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, column)) if !name.is_empty() => Ok((name.to_string(), column.to_string())),
        _ => Err(format!(
            "{s:?}: use NAME=COLUMN, e.g. aggregate_type=aggregatetype"
        )),
    }
}

/// A byte size: digits, optionally followed by KiB, MiB or GiB (or K, M, G: the same, binary).
pub(super) fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let unit_bytes: usize = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        other => {
            return Err(format!(
                "{other:?} is not a unit: use bytes, KiB, MiB or GiB (e.g. 32MiB)"
            ))
        }
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(unit_bytes))
        .ok_or_else(|| format!("{s:?} is not a size: use bytes, KiB, MiB or GiB (e.g. 32MiB)"))
}

pub(super) fn parse_route(s: &str) -> Result<(String, Destination), String> {
    match s.split_once('=') {
        Some((key, url)) if !key.is_empty() => match Destination::parse(url) {
            Ok(destination) => Ok((key.to_string(), destination)),
            Err(e @ DestinationError::NotATopicArn(_)) => Err(format!("{s:?}: {e}")),
            Err(_) => Err(route_usage(s)),
        },
        _ => Err(route_usage(s)),
    }
}

fn route_usage(s: &str) -> String {
    format!("{s:?}: use KEY=QUEUE_URL or KEY=TOPIC_ARN, e.g. order=https://sqs.eu-west-1.amazonaws.com/123456789012/orders or order=arn:aws:sns:eu-west-1:123456789012:orders")
}

pub(super) fn parse_retention(s: &str) -> Result<Retention, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(Retention::Off);
    }
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Ok(Retention::OnAck),
        Ok(d) => Ok(Retention::For(d)),
        // humantime wants a unit even for zero; a bare 0 is what people write.
        Err(_) if s.trim() == "0" => Ok(Retention::OnAck),
        Err(e) => Err(format!(
            "{e}: use 0 (delete when sent), a duration such as 1h or 7d, or `off`"
        )),
    }
}
