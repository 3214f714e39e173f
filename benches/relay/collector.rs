//! A minimal OTLP/HTTP trace collector: answers `200` to every `POST /v1/traces`, at once or
//! after a fixed delay (a collector across a network, or a busy one), and keeps the bodies. It does no work while the relay drains (no decoding, no allocation per
//! span), so a tracing drain against it shows what exporting costs the relay, not what a
//! collector costs the machine. The bodies are decoded after the run to count the spans
//! exactly (the OTLP protobuf messages, as the test harness's receiver decodes them).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message as _;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::support::http;

pub struct Collector {
    /// For `OTEL_EXPORTER_OTLP_ENDPOINT` (the exporter appends `/v1/traces`).
    pub endpoint: String,
    /// What the listener counted, shared with its connection tasks.
    state: Arc<State>,
    /// The accept loop, aborted on drop so the port closes with the run.
    accept: JoinHandle<()>,
}

#[derive(Default)]
struct State {
    /// How long each answer waits.
    delay: Duration,
    /// Export requests answered.
    requests: AtomicU64,
    /// Body bytes of the export requests (protobuf, uncompressed).
    bytes: AtomicU64,
    /// Every export body, decoded after the run.
    bodies: Mutex<Vec<Vec<u8>>>,
}

/// What the collector received over a run, decoded.
#[derive(Clone, Debug, Default)]
pub struct Received {
    /// Export requests the collector answered.
    pub requests: u64,
    /// Their body bytes (protobuf, uncompressed).
    pub bytes: u64,
    /// Spans decoded from them.
    pub spans: u64,
    /// Distinct `outbox.event_id` values among the spans.
    pub events: u64,
    /// Spans in the trace of their row's `traceparent` (the backlog's trace id of event n is
    /// n in hex), with a parent: the trace continued, not a new one.
    pub in_row_trace: u64,
    /// Bodies that did not decode as an `ExportTraceServiceRequest`.
    pub undecodable: u64,
}

impl Collector {
    /// Listens on a loopback port the OS picks; answers each request after `delay`.
    pub async fn start(delay: Duration) -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the OTLP collector");
        let addr: SocketAddr = listener.local_addr().expect("collector address");
        let state = Arc::new(State {
            delay,
            ..State::default()
        });
        let accept = http::accept_all(listener, Arc::clone(&state), serve);
        Collector {
            endpoint: format!("http://{addr}"),
            state,
            accept,
        }
    }

    /// Decodes everything received so far.
    pub fn received(&self) -> Received {
        let bodies = self.state.bodies.lock().unwrap();
        let mut out = Received {
            requests: self.state.requests.load(Ordering::Relaxed),
            bytes: self.state.bytes.load(Ordering::Relaxed),
            ..Received::default()
        };
        let mut events = HashSet::new();
        for body in bodies.iter() {
            let Ok(request) = ExportTraceServiceRequest::decode(body.as_slice()) else {
                out.undecodable += 1;
                continue;
            };
            for span in request
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .flat_map(|s| &s.spans)
            {
                out.spans += 1;
                let event_id = span
                    .attributes
                    .iter()
                    .find(|kv| kv.key == "outbox.event_id")
                    .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                        Value::StringValue(s) => Some(s.as_str()),
                        _ => None,
                    });
                let Some(event_id) = event_id else {
                    continue;
                };
                let row_trace = event_id
                    .rsplit('-')
                    .next()
                    .and_then(|n| n.parse::<u128>().ok())
                    .map(|n| n.to_be_bytes());
                if row_trace.is_some_and(|t| t[..] == span.trace_id[..])
                    && !span.parent_span_id.is_empty()
                {
                    out.in_row_trace += 1;
                }
                events.insert(event_id.to_string());
            }
        }
        out.events = events.len() as u64;
        out
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// An address on loopback where nothing listens: a collector that is down. The port was
/// just given by the OS and released, so another process taking it during a run is unlikely.
pub fn down_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let addr = listener.local_addr().expect("address");
    drop(listener);
    format!("http://{addr}")
}

/// One keep-alive connection: read a request, answer it, repeat until the client closes.
async fn serve(mut stream: TcpStream, state: Arc<State>) {
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    loop {
        let (head, head_len) = match http::next_request(&mut stream, &mut buf, 64 * 1024).await {
            Ok(Some(request)) => request,
            Ok(None) => return,
            Err(()) => {
                let _ = respond(&mut stream, "400 Bad Request").await;
                return;
            }
        };
        let content_length = head.content_length;
        let status = if head.method == "POST" && head.path == "/v1/traces" {
            state.requests.fetch_add(1, Ordering::Relaxed);
            state
                .bytes
                .fetch_add(content_length as u64, Ordering::Relaxed);
            let body = buf[head_len..head_len + content_length].to_vec();
            state.bodies.lock().unwrap().push(body);
            "200 OK"
        } else {
            "404 Not Found"
        };
        buf.drain(..head_len + content_length);
        if !state.delay.is_zero() {
            tokio::time::sleep(state.delay).await;
        }
        if respond(&mut stream, status).await.is_err() {
            return;
        }
    }
}

/// An empty body is an empty `ExportTraceServiceResponse`: everything accepted.
async fn respond(stream: &mut TcpStream, status: &str) -> std::io::Result<()> {
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"
    );
    stream.write_all(response.as_bytes()).await
}
