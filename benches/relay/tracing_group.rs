//! Group `tracing`: what exporting a span per event costs a drain, with the spans exported to
//! a collector that keeps up, to a slow one and to none.

use std::time::Duration;

use crate::drain::{drain, say_drain, spec, Destination, DrainRun};
use crate::progress::say;
use crate::settings::Settings;
use crate::traces::{TraceRun, Traces};

/// A collector that answers an export of 512 spans in this long keeps up with at most
/// 512 / 0.05 s ≈ 10,000 spans/s (the SDK exports one batch at a time): less than a drain.
/// A collector across a network, or a busy one, is this slow.
const SLOW_COLLECTOR: Duration = Duration::from_millis(50);

/// Environment variables given to a relay, in order.
type RelayEnv = Vec<(String, String)>;

/// The tracing group's runs: off, then where the spans go and the batch processor's
/// settings (`OTEL_BSP_*`; none: the SDK's defaults, as a relay gets them).
fn tracing_variants() -> Vec<(Option<Traces>, RelayEnv)> {
    let bsp = |pairs: &[(&str, &str)]| -> RelayEnv {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    vec![
        (None, Vec::new()),
        (Some(Traces::Collector(Duration::ZERO)), Vec::new()),
        (Some(Traces::CollectorDown), Vec::new()),
        (Some(Traces::Collector(SLOW_COLLECTOR)), Vec::new()),
        (
            Some(Traces::Collector(SLOW_COLLECTOR)),
            bsp(&[
                ("OTEL_BSP_MAX_QUEUE_SIZE", "8192"),
                ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2048"),
            ]),
        ),
    ]
}

/// One drain of the tracing group.
pub struct TracingDrain {
    /// 1-based; each round drains once per variant.
    pub round: usize,
    /// The drain itself.
    pub run: DrainRun,
}

impl TracingDrain {
    /// `tracing off`, or what [`TraceRun::label`] says.
    pub fn variant(&self) -> String {
        self.run
            .traces
            .as_ref()
            .map_or("tracing off".to_string(), TraceRun::label)
    }
}

/// Every drain of the group, in the order run.
pub async fn run(settings: &Settings) -> Vec<TracingDrain> {
    let sink0 = Destination::Sink(Duration::ZERO);
    let mut runs = Vec::new();
    // What exporting a span per event costs a drain: the standard drain (its backlog
    // carries a sampled traceparent in every row) with tracing off, exporting to a
    // collector that answers at once, and exporting to none (collector down). Each round
    // runs every variant, the order rotated, so drift of the machine falls on each alike.
    let variants = tracing_variants();
    for round in 1..=settings.tracing_rounds {
        for i in 0..variants.len() {
            let (traces, env) = &variants[(i + round - 1) % variants.len()];
            let label = traces.map_or("tracing off".to_string(), |t| t.label(env));
            let mut s = spec(
                settings,
                &format!("{label}, round {round}"),
                sink0,
                1,
                settings.in_flight,
            );
            s.traces = *traces;
            s.env = env.clone();
            let run = drain(settings, s).await;
            say_drain(&run);
            if let Some(tr) = &run.traces {
                say(&format!("{}: {}", run.name, tr.summary(run.sent)));
            }
            runs.push(TracingDrain { round, run });
        }
    }
    runs
}
