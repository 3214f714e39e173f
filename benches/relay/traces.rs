//! Where a traced drain's relays send their spans, and what became of those spans.

use std::time::Duration;

use serde_json::{json, Value};

use crate::collector::{Collector, Received};

/// Where a tracing drain's relays send their spans.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Traces {
    /// The benchmark's OTLP/HTTP collector ([`collector::Collector`]), answering each export
    /// after this delay.
    Collector(Duration),
    /// An address where nothing listens: the collector is down.
    CollectorDown,
}

impl Traces {
    /// How a run is told apart in the tables: where spans went, and any batch settings.
    pub fn label(&self, env: &[(String, String)]) -> String {
        let mut label = match self {
            Traces::Collector(d) if d.is_zero() => "tracing on".to_string(),
            Traces::Collector(d) => format!("tracing on, collector {} ms", d.as_millis()),
            Traces::CollectorDown => "tracing on, collector down".to_string(),
        };
        for (k, v) in env {
            label.push_str(&format!(", {k}={v}"));
        }
        label
    }
}

/// Log lines of OpenTelemetry's own crates carry their crate name as the target
/// (`opentelemetry_sdk`, `opentelemetry-otlp`, ...).
pub const EXPORTER_LOG_TARGET: &str = "opentelemetry";

/// What became of a tracing drain's spans.
pub struct TraceRun {
    /// Where the relays sent their spans.
    pub export: Traces,
    /// The batch processor's settings given to the relay (`OTEL_BSP_*`); empty: its defaults.
    pub settings: Vec<(String, String)>,
    /// What the collector received, decoded (`None` when it was down).
    pub received: Option<Received>,
    /// Spans the batch processor dropped because its queue was full: the SDK's own count,
    /// logged at shutdown (`dropped_span_count`), summed over the replicas.
    pub dropped: u64,
    /// Exports that failed (one error line each from the SDK).
    pub export_errors: u64,
}

impl TraceRun {
    pub fn new(
        export: Traces,
        settings: &[(String, String)],
        collector: Option<&Collector>,
        logs: &str,
    ) -> TraceRun {
        let dropped = logs
            .lines()
            .filter_map(|l| {
                let rest = l.split("dropped_span_count=").nth(1)?;
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits.parse::<u64>().ok()
            })
            .sum();
        let export_errors = logs
            .lines()
            .filter(|l| l.contains("BatchSpanProcessor.ExportError"))
            .count() as u64;
        TraceRun {
            export,
            settings: settings.to_vec(),
            received: collector.map(Collector::received),
            dropped,
            export_errors,
        }
    }

    /// How the run is told apart in the tables.
    pub fn label(&self) -> String {
        self.export.label(&self.settings)
    }

    /// One line for the progress output.
    pub fn summary(&self, events: u64) -> String {
        let received = self.received.as_ref().map_or(
            "collector down, nothing received".to_string(),
            |r| {
                format!(
                    "{} spans received for {events} events ({} distinct events, {} in their row's trace) in {} requests, {:.0} bytes per span",
                    r.spans,
                    r.events,
                    r.in_row_trace,
                    r.requests,
                    r.bytes as f64 / r.spans.max(1) as f64
                )
            },
        );
        format!(
            "{received}; {} dropped (queue full), {} export errors",
            self.dropped, self.export_errors
        )
    }

    pub fn to_json(&self) -> Value {
        json!({
            "export": match self.export {
                Traces::Collector(_) => "collector",
                Traces::CollectorDown => "collector down",
            },
            "collector_delay_ms": match self.export {
                Traces::Collector(d) => Some(d.as_millis() as u64),
                Traces::CollectorDown => None,
            },
            "settings": self.settings.iter().map(|(k, v)| (k.clone(), Value::from(v.clone()))).collect::<serde_json::Map<_, _>>(),
            "collector_requests": self.received.as_ref().map(|r| r.requests),
            "collector_bytes": self.received.as_ref().map(|r| r.bytes),
            "spans_received": self.received.as_ref().map(|r| r.spans),
            "events_with_a_span_received": self.received.as_ref().map(|r| r.events),
            "spans_in_their_rows_trace": self.received.as_ref().map(|r| r.in_row_trace),
            "undecodable_requests": self.received.as_ref().map(|r| r.undecodable),
            "spans_dropped_queue_full": self.dropped,
            "export_errors": self.export_errors,
        })
    }
}

// Run by selftest.rs (`cargo test --bench relay`): the bench has no libtest harness.
pub mod tests {
    use std::time::Duration;

    use super::{TraceRun, Traces};

    pub fn labels_say_where_spans_went_and_the_batch_settings() {
        assert_eq!(Traces::Collector(Duration::ZERO).label(&[]), "tracing on");
        assert_eq!(
            Traces::Collector(Duration::from_millis(50))
                .label(&[("OTEL_BSP_MAX_QUEUE_SIZE".into(), "8192".into())]),
            "tracing on, collector 50 ms, OTEL_BSP_MAX_QUEUE_SIZE=8192"
        );
        assert_eq!(
            Traces::CollectorDown.label(&[]),
            "tracing on, collector down"
        );
    }

    pub fn dropped_spans_and_export_errors_are_counted_from_the_logs() {
        let logs = "INFO opentelemetry_sdk: shutdown dropped_span_count=12 x
ERROR opentelemetry_sdk: BatchSpanProcessor.ExportError reason=refused
INFO opentelemetry_sdk: shutdown dropped_span_count=3
ERROR opentelemetry_sdk: BatchSpanProcessor.ExportError reason=refused";
        let run = TraceRun::new(Traces::CollectorDown, &[], None, logs);
        assert_eq!(run.dropped, 15);
        assert_eq!(run.export_errors, 2);
        assert!(run.received.is_none());
        assert!(run
            .summary(10)
            .starts_with("collector down, nothing received; 15 dropped"));
    }
}
