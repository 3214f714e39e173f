//! The only owner of OpenTelemetry: one span per event the relay tries to deliver, exported
//! over OTLP/HTTP when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set. Unset, nothing here runs.
//!
//! Why a span per event rather than one per SendMessageBatch with links: each event already
//! carries its own trace (the row's `traceparent`, written in the application's transaction),
//! so a span per event continues that trace as a child, and the message on the queue carries
//! the child's context to the consumer: API call -> relay -> consumer in one trace. A request
//! span would belong to no event's trace and reach them only by links, which most trace views
//! do not follow.
//!
//! The span starts when the relay has the row in hand (its claim returned) and ends when SQS
//! answered for it (or the relay gave up on it for this claim); `outbox.wait_seconds` is the
//! time before that, from `created_at`, spent in the outbox.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt, TraceFlags, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use crate::destination::{Client, Destination};
use crate::row::{ClaimedRow, Settlement};

/// The header (message attribute) that carries the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";
/// `service.name` unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` say otherwise.
const SERVICE_NAME: &str = "outbox-relay";
/// How long the exporter gets, at shutdown, to send the spans it still holds.
pub const FLUSH_BOUND: Duration = Duration::from_secs(5);

/// Tracing turned on: the tracer the relay's spans come from, and the provider that exports
/// them.
#[derive(Debug)]
pub struct Tracing {
    /// Makes the spans.
    tracer: SdkTracer,
    /// Owns the batch exporter; shut down once to flush what it still holds.
    provider: SdkTracerProvider,
}

/// Whether the standard variables ask for traces to be exported.
pub fn wanted() -> bool {
    first_set(&[
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ])
    .is_some()
}

impl Tracing {
    /// Tracing as the standard `OTEL_*` variables describe it, or `None` when no OTLP endpoint
    /// is set. Must be called inside the Tokio runtime: exports run on it.
    ///
    /// The endpoint, headers (`OTEL_EXPORTER_OTLP_HEADERS`, which may hold credentials and are
    /// never logged), timeout and sampler (`OTEL_TRACES_SAMPLER`, parent-based by default) are
    /// read by the OpenTelemetry SDK itself.
    pub fn from_env() -> Result<Option<Tracing>, String> {
        if !wanted() {
            return Ok(None);
        }
        check_settings()?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_http_client(OnRuntime::new()?)
            .build()
            .map_err(|e| format!("cannot set up the trace exporter: {e}"))?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource())
            .build();
        let tracer = provider.tracer("outbox-relay");
        Ok(Some(Tracing { tracer, provider }))
    }

    /// Starts the span of one claimed row and, when the row carries a valid `traceparent`,
    /// rewrites it to the new span's context so the message continues the trace. The value
    /// keeps its length (W3C version 00 is always 55 characters; a longer, future version is
    /// only shortened), so the row's size against SQS's limits does not grow. A row without a
    /// valid `traceparent` starts a new trace and its message is left as written: adding an
    /// attribute could push it over SQS's ten-attribute or size limit, and turning tracing on
    /// must not change what is delivered.
    pub fn begin(
        &self,
        row: &mut ClaimedRow,
        queue_url: &Destination,
        picked_up: SystemTime,
    ) -> opentelemetry_sdk::trace::Span {
        let from_row = row
            .headers
            .get(TRACEPARENT)
            .and_then(|v| v.as_str())
            .is_some_and(is_w3c_traceparent);
        let parent = if from_row {
            TraceContextPropagator::new()
                .extract_with_context(&Context::new(), &HeaderExtractor(&row.headers))
        } else {
            Context::new()
        };
        // The propagator still refuses what W3C calls invalid (an all-zero id, version ff).
        let from_row = from_row && parent.has_active_span();
        let picked_up_epoch = picked_up
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let wait = (picked_up_epoch - row.created_at_epoch).max(0.0);
        let queue = queue_url.name();
        let span = self
            .tracer
            .span_builder(format!("send {queue}"))
            .with_kind(SpanKind::Producer)
            .with_start_time(picked_up)
            .with_attributes([
                KeyValue::new("messaging.system", messaging_system(queue_url)),
                KeyValue::new("messaging.operation.name", "send"),
                KeyValue::new("messaging.operation.type", "send"),
                KeyValue::new("messaging.destination.name", queue.to_string()),
                KeyValue::new("outbox.event_id", row.event_id.clone()),
                KeyValue::new("outbox.event_type", row.event_type.clone()),
                KeyValue::new("outbox.attempts", i64::from(row.attempts)),
                KeyValue::new("outbox.wait_seconds", wait),
            ])
            .start_with_context(&self.tracer, &parent);
        if from_row {
            let context = span.span_context();
            if let Some(headers) = row.headers.as_object_mut() {
                headers.insert(
                    TRACEPARENT.to_string(),
                    format!(
                        "00-{}-{}-{:02x}",
                        context.trace_id(),
                        context.span_id(),
                        context.trace_flags() & TraceFlags::SAMPLED
                    )
                    .into(),
                );
            }
        }
        span
    }

    /// Exports what is still buffered and stops the exporter, waiting at most `bound`. Spans
    /// the collector cannot take by then are lost; delivery never waits for them.
    pub async fn shutdown(self: Arc<Self>, bound: Duration) {
        let provider = self.provider.clone();
        let result =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(bound)).await;
        match result {
            Ok(Ok(())) => tracing::debug!("trace exporter flushed"),
            Ok(Err(e)) => tracing::warn!(error = %e, "trace exporter did not flush every span"),
            Err(e) => tracing::warn!(error = %e, "trace exporter shutdown failed"),
        }
    }
}

/// The OTLP settings the relay cannot use, as one line naming the variable (never its value:
/// an endpoint may carry credentials, `https://user:token@collector`). `run` refuses to start
/// with it; `check` reports it.
pub fn check_settings() -> Result<(), String> {
    if let Some((name, protocol)) = first_set(&[
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ])
    .filter(|(_, p)| p != "http/protobuf")
    {
        return Err(format!(
            "{name}={protocol} is not supported: the relay exports spans over http/protobuf (unset it, or set http/protobuf)"
        ));
    }
    if let Some((name, endpoint)) = first_set(&[
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]) {
        let uri = endpoint.parse::<http::Uri>().ok();
        let usable = uri.is_some_and(|u| {
            matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some()
        });
        if !usable {
            return Err(format!(
                "{name} is not an http(s) URL; set it to the collector's OTLP/HTTP address, e.g. http://otel-collector:4318"
            ));
        }
    }
    Ok(())
}

/// One export's time limit: `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` or `OTEL_EXPORTER_OTLP_TIMEOUT`
/// in milliseconds, 10 s by default, as the exporter reads them.
fn export_timeout() -> Duration {
    first_set(&[
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ])
    .and_then(|(_, ms)| ms.parse().ok())
    .map(Duration::from_millis)
    .unwrap_or(Duration::from_secs(10))
}

/// The first of `names` that is set and not empty, with its value.
fn first_set(names: &[&'static str]) -> Option<(&'static str, String)> {
    names.iter().find_map(|name| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .map(|v| (*name, v))
    })
}

/// `service.name` defaults to the relay's name, not the SDK's `unknown_service`.
fn resource() -> Resource {
    let detected = Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    if named {
        detected
    } else {
        Resource::builder().with_service_name(SERVICE_NAME).build()
    }
}

/// A `traceparent` as W3C writes it: `00-<32 hex>-<16 hex>-<2 hex>`, lowercase, or a later
/// version with more fields after those. The SDK's propagator also takes shorter ids
/// (`00-abc-def-01`), which the relay would then rewrite to a longer value, changing the
/// message's size; such values are the application's business and pass through as written.
fn is_w3c_traceparent(value: &str) -> bool {
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let mut parts = value.split('-');
    let (Some(version), Some(trace), Some(span), Some(flags)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let rest_ok = match version {
        "00" => parts.next().is_none(),
        // A future version may append fields; "ff" is forbidden.
        _ => version != "ff",
    };
    hex(version, 2) && hex(trace, 32) && hex(span, 16) && hex(flags, 2) && rest_ok
}

/// `messaging.system` as OpenTelemetry's semantic conventions name the two services.
fn messaging_system(destination: &Destination) -> &'static str {
    match destination.client() {
        Client::Sns => "aws.sns",
        Client::Sqs | Client::S3 => "aws_sqs",
    }
}

/// Reads `traceparent` / `tracestate` from a row's `headers` object.
struct HeaderExtractor<'a>(&'a serde_json::Value);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)?.as_str()
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }
}

/// The spans of one claim's rows, by row id, ended with each row's outcome. Empty (and free)
/// when tracing is off.
#[derive(Debug, Default)]
pub struct ClaimSpans {
    spans: HashMap<i64, EventSpan>,
}

#[derive(Debug)]
struct EventSpan {
    span: opentelemetry_sdk::trace::Span,
    /// The SQS error code of the last answer about this row, for `error.type`.
    code: Option<String>,
}

impl ClaimSpans {
    /// Starts a span for each row (see [`Tracing::begin`]); `queue_for` is each row's destination.
    pub fn begin(
        tracing: Option<&Tracing>,
        rows: &mut [ClaimedRow],
        queue_for: impl Fn(&ClaimedRow) -> Destination,
    ) -> ClaimSpans {
        let Some(tracing) = tracing else {
            return ClaimSpans::default();
        };
        let picked_up = SystemTime::now();
        let spans = rows
            .iter_mut()
            .map(|row| {
                let queue = queue_for(row);
                let span = tracing.begin(row, &queue, picked_up);
                (row.id, EventSpan { span, code: None })
            })
            .collect();
        ClaimSpans { spans }
    }

    /// SQS refused this row's entry, or the whole request it was in, with `code`.
    pub fn refused(&mut self, row_id: i64, code: Option<&str>) {
        if self.spans.is_empty() {
            return;
        }
        if let Some(s) = self.spans.get_mut(&row_id) {
            s.code = code.map(str::to_string);
        }
    }

    /// Ends every span with its row's outcome in `settlement`: sent (with the SQS message id),
    /// retried, released, parked or quarantined (status error with the reason and SQS code).
    pub fn finish(mut self, settlement: &Settlement) {
        if self.spans.is_empty() {
            return;
        }
        for sent in &settlement.sent {
            if let Some(mut s) = self.spans.remove(&sent.id) {
                s.span.set_attributes([
                    KeyValue::new("messaging.message.id", sent.message_id.clone()),
                    KeyValue::new("outbox.outcome", "sent"),
                ]);
                s.span.end();
            }
        }
        for q in &settlement.quarantine {
            if let Some(s) = self.spans.remove(&q.id) {
                let outcome = if q.retry_in.is_some() {
                    "parked"
                } else {
                    "quarantined"
                };
                s.fail(outcome, Some(q.reason.as_str()), &q.error);
            }
        }
        for r in &settlement.reschedule {
            if let Some(mut s) = self.spans.remove(&r.id) {
                let outcome = if r.refund { "released" } else { "retry" };
                match &r.error {
                    Some(error) => s.fail(outcome, None, error),
                    // Given back unsent (shutdown, a lease too short, behind its group): no
                    // failure of its own.
                    None => {
                        s.span
                            .set_attribute(KeyValue::new("outbox.outcome", outcome));
                        s.span.end();
                    }
                }
            }
        }
        // Rows without an outcome here were settled by nobody (cannot happen today); their
        // spans end when dropped.
    }
}

impl EventSpan {
    fn fail(mut self, outcome: &'static str, reason: Option<&'static str>, error: &str) {
        let error_type = self
            .code
            .clone()
            .or(reason.map(str::to_string))
            .unwrap_or_else(|| "error".to_string());
        self.span
            .set_attribute(KeyValue::new("outbox.outcome", outcome));
        if let Some(reason) = reason {
            self.span
                .set_attribute(KeyValue::new("outbox.quarantine_reason", reason));
        }
        self.span
            .set_attribute(KeyValue::new("error.type", error_type));
        self.span.set_status(Status::error(error.to_string()));
        self.span.end();
    }
}

/// OTLP over HTTP(S) on the hyper and rustls (aws-lc-rs) stack the AWS SDK already links, so
/// tracing adds no second HTTP client or TLS library.
///
/// The SDK's batch processor exports from a thread of its own, outside the Tokio runtime;
/// hyper needs the runtime, so each export is handed to it and awaited from that thread.
#[derive(Debug)]
struct OnRuntime {
    runtime: tokio::runtime::Handle,
    client: Arc<opentelemetry_http::hyper::HyperClient<HttpsConnector>>,
}

type HttpsConnector =
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

impl OnRuntime {
    fn new() -> Result<OnRuntime, String> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| "trace exporter started outside the runtime".to_string())?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        // Unreadable system certificates only matter for an https endpoint, where the
        // handshake then fails and the exporter logs it; an http collector works regardless.
        let found = rustls_native_certs::load_native_certs();
        let _ = roots.add_parsable_certificates(found.certs);
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("cannot set up TLS for the trace exporter: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        // The exporter's own deadline only decides whether to retry; on its batch thread a call
        // in flight is not cut short, so the client bounds each call by the same timeout.
        let client = opentelemetry_http::hyper::HyperClient::new(connector, export_timeout(), None);
        Ok(OnRuntime {
            runtime,
            client: Arc::new(client),
        })
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for OnRuntime {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let client = Arc::clone(&self.client);
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await
            .map_err(|e| Box::new(e) as opentelemetry_http::HttpError)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spans with contexts and sampling, exported nowhere.
    fn tracing() -> Tracing {
        let provider = SdkTracerProvider::builder().build();
        Tracing {
            tracer: provider.tracer("test"),
            provider,
        }
    }

    fn row(headers: serde_json::Value) -> ClaimedRow {
        ClaimedRow {
            id: 1,
            event_id: "order-1:paid".into(),
            aggregate_type: "order".into(),
            aggregate_id: "1".into(),
            event_type: "order.paid".into(),
            payload: "{}".into(),
            headers,
            queue_url: None,
            lease_token: 1,
            attempts: 1,
            created_at_epoch: 0.0,
            created_at: "1970-01-01T00:00:00Z".into(),
            unreadable: None,
            dedup_id: None,
        }
    }

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn a_row_traceparent_becomes_the_span_context_of_the_same_length() {
        let t = tracing();
        let mut r = row(serde_json::json!({"traceparent": PARENT, "tracestate": "k=v"}));
        let span = t.begin(&mut r, &orders(), SystemTime::now());
        let sent = r.headers["traceparent"].as_str().unwrap().to_string();
        assert_eq!(sent.len(), PARENT.len());
        let context = opentelemetry::trace::Span::span_context(&span);
        assert_eq!(
            sent,
            format!(
                "00-0af7651916cd43dd8448eb211c80319c-{}-01",
                context.span_id()
            )
        );
        assert_ne!(context.span_id().to_string(), "b7ad6b7169203331");
        // The rest of the headers travel as written.
        assert_eq!(r.headers["tracestate"], "k=v");
    }

    #[test]
    fn a_later_version_with_more_fields_is_continued_and_gets_shorter() {
        let t = tracing();
        let later = format!("{}-extra", PARENT.replacen("00", "01", 1));
        let mut r = row(serde_json::json!({ "traceparent": later }));
        t.begin(&mut r, &orders(), SystemTime::now());
        let sent = r.headers["traceparent"].as_str().unwrap();
        assert!(
            sent.starts_with("00-0af7651916cd43dd8448eb211c80319c-"),
            "{sent}"
        );
        assert!(sent.len() < later.len());
    }

    #[test]
    fn tracing_changes_neither_a_messages_size_nor_its_attribute_count() {
        use crate::batch::{plan, MessageFormat, PlanConfig};
        use crate::row::KeyColumn;
        // Ten attributes (4 fixed + 6 headers) and exactly the size limit: the most a row may
        // carry, so any growth would get it refused.
        let headers = serde_json::json!({
            "traceparent": PARENT, "tracestate": "k=v", "a": "1", "b": "2", "c": "3", "d": "4",
        });
        let planned = |r: &ClaimedRow, max_request_bytes: usize| {
            let config = PlanConfig {
                default_queue_url: orders(),
                routes: Vec::new(),
                route_by: KeyColumn::AggregateType,
                group_by: KeyColumn::AggregateId,
                fair_group: None,
                format: MessageFormat::Raw,
                max_request_bytes,
                ordering: None,
                offload: None,
            };
            plan(std::slice::from_ref(r), &config)
        };
        let mut r = row(headers);
        let before = planned(&r, usize::MAX).requests[0].size();
        tracing().begin(&mut r, &orders(), SystemTime::now());
        let after = planned(&r, before);
        assert!(after.rejected.is_empty(), "{:?}", after.rejected);
        assert_eq!(after.requests[0].size(), before);
        assert_eq!(after.requests[0].entries[0].attributes.len(), 10);
    }

    #[test]
    fn an_unsampled_parent_stays_unsampled_downstream() {
        let t = tracing();
        let parent = PARENT.replace("-01", "-00");
        let mut r = row(serde_json::json!({ "traceparent": parent }));
        let span = t.begin(&mut r, &orders(), SystemTime::now());
        assert!(!opentelemetry::trace::Span::is_recording(&span));
        assert!(r.headers["traceparent"].as_str().unwrap().ends_with("-00"));
        assert_ne!(r.headers["traceparent"], parent.as_str());
    }

    #[test]
    fn rows_without_a_valid_traceparent_are_sent_as_written() {
        let t = tracing();
        for headers in [
            serde_json::json!({}),
            serde_json::json!({"traceparent": "00-abc-def-01"}),
            serde_json::json!({"traceparent": PARENT.to_uppercase()}),
            serde_json::json!({"traceparent": format!(" {PARENT}")}),
            serde_json::json!({"traceparent": PARENT.replace("00-", "ff-")}),
            serde_json::json!({"traceparent": format!("{PARENT}-more")}),
            serde_json::json!({"traceparent": 42}),
        ] {
            let mut r = row(headers.clone());
            let span = t.begin(&mut r, &orders(), SystemTime::now());
            assert_eq!(r.headers, headers);
            // A new trace of its own.
            assert!(opentelemetry::trace::Span::span_context(&span).is_valid());
        }
    }

    fn orders() -> Destination {
        Destination::parse("http://q/1/orders").expect("a queue URL")
    }

    #[test]
    fn a_topics_system_is_sns_and_a_queues_sqs() {
        let topic = Destination::parse("arn:aws:sns:eu-west-1:123456789012:orders.fifo")
            .expect("a topic ARN");
        assert_eq!(messaging_system(&topic), "aws.sns");
        assert_eq!(messaging_system(&orders()), "aws_sqs");
    }
}
