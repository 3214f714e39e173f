//! An OTLP/HTTP trace receiver on loopback: it takes `POST /v1/traces` with a protobuf
//! `ExportTraceServiceRequest`, decodes it and keeps every span, as a collector would.
//!
//! Plain HTTP/1.1 over std sockets, a thread per connection: the exporter sends one
//! `Content-Length` body per request and may reuse the connection.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::AnyValue;
use prost::Message as _;

/// One span as received, ids in lowercase hex, attribute values as text.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// OTLP's `SpanKind` number (4 = producer).
    pub kind: i32,
    pub attributes: HashMap<String, String>,
    /// OTLP's status code (0 unset, 1 ok, 2 error) and message.
    pub status_code: i32,
    pub status_message: String,
    /// The resource's `service.name`.
    pub service_name: String,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
}

impl ReceivedSpan {
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attributes.get(name).map(String::as_str)
    }
}

#[derive(Default)]
struct Received {
    spans: Vec<ReceivedSpan>,
    /// Each request's headers, names in lowercase.
    headers: Vec<HashMap<String, String>>,
}

pub struct OtlpReceiver {
    endpoint: String,
    received: Arc<Mutex<Received>>,
}

impl OtlpReceiver {
    pub fn start() -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the OTLP receiver");
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Received::default()));
        let shared = Arc::clone(&received);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || serve(stream, &shared));
            }
        });
        OtlpReceiver { endpoint, received }
    }

    /// For `OTEL_EXPORTER_OTLP_ENDPOINT` (the exporter appends `/v1/traces`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received.lock().unwrap().spans.clone()
    }

    pub fn request_headers(&self) -> Vec<HashMap<String, String>> {
        self.received.lock().unwrap().headers.clone()
    }
}

fn serve(stream: TcpStream, received: &Mutex<Received>) {
    let mut writer = stream.try_clone().expect("clone the connection");
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if !matches!(reader.read_line(&mut request_line), Ok(n) if n > 0) {
            return;
        }
        let mut headers = HashMap::new();
        loop {
            let mut line = String::new();
            if !matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
            }
        }
        let length: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let (status, spans) = if request_line.starts_with("POST /v1/traces ") {
            match ExportTraceServiceRequest::decode(body.as_slice()) {
                Ok(request) => ("200 OK", spans_of(request)),
                Err(_) => ("400 Bad Request", Vec::new()),
            }
        } else {
            ("404 Not Found", Vec::new())
        };
        {
            let mut r = received.lock().unwrap();
            r.spans.extend(spans);
            r.headers.push(headers);
        }
        // An empty body is an empty ExportTraceServiceResponse: everything accepted.
        let response = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

fn spans_of(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let service_name = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| kv.value.as_ref())
            .map(text)
            .unwrap_or_default();
        for scope_spans in resource_spans.scope_spans {
            for span in scope_spans.spans {
                let status = span.status.clone().unwrap_or_default();
                out.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name.clone(),
                    kind: span.kind,
                    attributes: span
                        .attributes
                        .iter()
                        .map(|kv| {
                            (
                                kv.key.clone(),
                                kv.value.as_ref().map(text).unwrap_or_default(),
                            )
                        })
                        .collect(),
                    status_code: status.code,
                    status_message: status.message,
                    service_name: service_name.clone(),
                    start_unix_nano: span.start_time_unix_nano,
                    end_unix_nano: span.end_time_unix_nano,
                });
            }
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: &AnyValue) -> String {
    match &value.value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}
