//! An HTTP/1.1 fault injector between the relay and the AWS server (SQS, SNS or S3).
//!
//! It understands just enough HTTP for the SDK's requests: a head plus a `Content-Length` body,
//! several requests per client connection. Each request goes upstream on a fresh connection
//! with `Connection: close`, so the upstream response is simply read to EOF; it is then passed
//! back unchanged except for its `Connection` header. The mode in force when a request has
//! arrived decides its fate. An injected error is answered in the protocol of the request it
//! refuses (SQS's JSON, SNS's query XML, S3's REST XML), so the SDK reads the code the
//! service itself would send.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::http;

/// What happens to a request that arrives while the mode is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward and answer.
    Pass,
    /// Wait, then forward and answer.
    Delay(Duration),
    /// One request at a time, each taking this long before it is forwarded: a server with one
    /// worker (moto's one Python core, a throttled partition), whose answers take longer the
    /// more requests wait for it.
    Serial(Duration),
    /// Answer 500 `InternalError` without forwarding.
    Error500,
    /// Answer the service's throttle without forwarding: SQS 400 `ThrottlingException`, SNS
    /// 400 `Throttling`, S3 503 `SlowDown`.
    Throttle,
    /// Answer the service's bad-input error without forwarding, as if the request's content
    /// were refused: SQS 400 `InvalidParameterValue`, SNS 400 `InvalidParameter`, S3 400
    /// `InvalidArgument`.
    BadInput,
    /// Answer as a service does a client configured for another region than the destination's,
    /// without forwarding: S3 301 `PermanentRedirect` (with `x-amz-bucket-region: eu-west-1`),
    /// SNS 400 `InvalidParameter` "Invalid parameter: TopicArn", SQS 400 `InvalidAddress`.
    WrongRegion,
    /// S3 400 `AuthorizationHeaderMalformed` ("the region 'us-east-1' is wrong; expecting
    /// 'eu-west-1'"): a request signed for another region than the bucket's. SNS and SQS answer
    /// as in `WrongRegion`.
    WrongSigningRegion,
    /// Close the client connection with a TCP RST without forwarding.
    Reset,
    /// Read the request, never answer, keep the connection open.
    BlackHole,
    /// Forward (SQS acts on it), then close the client connection without answering.
    DropResponse,
    /// Forward, then keep the response until `release_held()` or the next `set_mode()`.
    Hold,
    /// Forward (SQS acts on every entry), then answer a `SendMessageBatch` with its last
    /// accepted entry moved to `Failed` (`InternalError`, not the sender's fault): a partial
    /// batch failure whose failed entry was in fact enqueued, so its retry is a copy. Other
    /// requests pass.
    FailLastEntry,
    /// Answer SNS `GetTopicAttributes` with 403 `AuthorizationError` without forwarding, as
    /// for credentials allowed `sns:Publish` only; forward everything else.
    DenyTopicAttributes,
}

/// The wire protocol of a request, which its injected error must speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    /// `X-Amz-Target` names the operation; errors are JSON (`__type`, `x-amzn-query-error`).
    SqsJson,
    /// A form-encoded `Action=...` body (SNS); errors are `<ErrorResponse>` XML.
    Query,
    /// REST with the operation in method and path (S3); errors are `<Error>` XML.
    S3Rest,
}

/// Body of the injected 500; `__type` is what the SDK reads as the error code.
const INTERNAL_ERROR_BODY: &str = r#"{"__type":"InternalError","message":"injected"}"#;
/// Body of the injected bad-input error (the code also goes in `x-amzn-query-error`).
const BAD_INPUT_BODY: &str =
    r#"{"__type":"com.amazonaws.sqs#InvalidParameterValue","message":"Invalid value (injected)"}"#;
/// Body of the injected throttle. The SQS JSON protocol is "query compatible": the SDK takes the
/// code from `x-amzn-query-error` (sent too) over `__type`, so both say `ThrottlingException`.
const THROTTLE_BODY: &str =
    r#"{"__type":"com.amazonaws.sqs#ThrottlingException","message":"Rate exceeded (injected)"}"#;

/// What SQS says of a queue URL in another region than the endpoint the request reached.
const WRONG_REGION_SQS_BODY: &str = r#"{"__type":"com.amazonaws.sqs#InvalidAddress","message":"The address https://sqs.eu-west-1.amazonaws.com/ is not valid for this endpoint."}"#;

pub struct FaultProxy {
    /// `http://127.0.0.1:PORT`, for `--sqs-endpoint-url`.
    endpoint: String,
    /// State shared with the connection tasks.
    shared: Arc<Shared>,
    /// A runtime of its own, so the proxy keeps serving while a test blocks its own threads;
    /// dropping it closes every connection.
    runtime: Option<tokio::runtime::Runtime>,
}

#[derive(Clone, Copy)]
struct Control {
    mode: Mode,
    /// One-shot faults: the next `next_faults` requests get `next_mode` instead of `mode`.
    /// Counted down where requests arrive, so a test need not race the relay to switch back.
    next_mode: Mode,
    next_faults: u64,
    /// Bumped by `release_held` and `set_mode`; a held response waits for it to move on from
    /// the value it saw when its request arrived.
    release_generation: u64,
}

struct Shared {
    /// `host:port` of the SQS server.
    upstream: String,
    control: watch::Sender<Control>,
    requests: AtomicU64,
    forwarded: AtomicU64,
    faulted: AtomicU64,
    held: AtomicUsize,
    /// What every request asked for, in arrival order (see `FaultProxy::actions`).
    actions: Mutex<Vec<String>>,
    /// The `event_id` of every `SendMessageBatch` entry forwarded (see `FaultProxy::sent_event_ids`).
    sent_event_ids: Mutex<Vec<String>>,
    /// The one worker of `Mode::Serial`: held while a request is served.
    serial: tokio::sync::Mutex<()>,
}

impl FaultProxy {
    /// Starts a proxy in `Pass` mode in front of `upstream` (`http://127.0.0.1:PORT`).
    pub fn start(upstream: &str) -> FaultProxy {
        let upstream = upstream
            .strip_prefix("http://")
            .unwrap_or(upstream)
            .trim_end_matches('/')
            .to_string();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fault-proxy")
            .enable_all()
            .build()
            .expect("fault proxy runtime");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind fault proxy");
        listener.set_nonblocking(true).expect("nonblocking");
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let (control, _) = watch::channel(Control {
            mode: Mode::Pass,
            next_mode: Mode::Pass,
            next_faults: 0,
            release_generation: 0,
        });
        let shared = Arc::new(Shared {
            upstream,
            control,
            requests: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            faulted: AtomicU64::new(0),
            held: AtomicUsize::new(0),
            actions: Mutex::new(Vec::new()),
            sent_event_ids: Mutex::new(Vec::new()),
            serial: tokio::sync::Mutex::new(()),
        });
        let accept_shared = shared.clone();
        runtime.spawn(async move {
            let listener = TcpListener::from_std(listener).expect("register listener");
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                tokio::spawn(serve(client, accept_shared.clone()));
            }
        });
        FaultProxy {
            endpoint,
            shared,
            runtime: Some(runtime),
        }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Applies to requests arriving from now on; also releases held responses and cancels
    /// one-shot faults still pending from `fault_next`.
    pub fn set_mode(&self, mode: Mode) {
        self.shared.control.send_modify(|c| {
            c.mode = mode;
            c.next_faults = 0;
            c.release_generation += 1;
        });
    }

    /// The next `count` requests get `mode`; later ones get the mode set by `set_mode`.
    pub fn fault_next(&self, mode: Mode, count: u64) {
        self.shared.control.send_modify(|c| {
            c.next_mode = mode;
            c.next_faults = count;
        });
    }

    pub fn mode(&self) -> Mode {
        self.shared.control.borrow().mode
    }

    /// Delivers every response held so far.
    pub fn release_held(&self) {
        self.shared
            .control
            .send_modify(|c| c.release_generation += 1);
    }

    /// Requests read from clients, in any mode.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Requests sent to the SQS server (`Pass`, `Delay`, `Serial`, `DropResponse`, `Hold`).
    pub fn forwarded(&self) -> u64 {
        self.shared.forwarded.load(Ordering::SeqCst)
    }

    /// Requests handled in any mode but `Pass`.
    pub fn faulted(&self) -> u64 {
        self.shared.faulted.load(Ordering::SeqCst)
    }

    /// Responses waiting for `release_held()` right now.
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// What every request so far asked for: SQS's `X-Amz-Target` (`AmazonSQS.SendMessageBatch`),
    /// a query request's `SNS.` + its `Action` (`SNS.PublishBatch`), an S3 request's `S3.` + its
    /// operation and path (`S3.PutObject /bucket/key`; `S3.PUT /bucket/key` without the SDK's
    /// `x-id`).
    pub fn actions(&self) -> Vec<String> {
        self.shared.actions.lock().unwrap().clone()
    }

    /// The `event_id` attribute of every `SendMessageBatch` entry forwarded to the server so far,
    /// in arrival order: each message the relay got to SQS, so an event sent twice shows twice
    /// even where a FIFO queue's deduplication kept only one copy for consumers.
    pub fn sent_event_ids(&self) -> Vec<String> {
        self.shared.sent_event_ids.lock().unwrap().clone()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // `shutdown_background` is the one way to drop a runtime from inside another one.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

struct Request {
    /// Request line and headers, without the blank line.
    head: String,
    body: Vec<u8>,
    action: String,
    protocol: Protocol,
    /// The client asked to close after this exchange.
    close: bool,
}

async fn serve(mut client: TcpStream, shared: Arc<Shared>) {
    let mut buffered = Vec::new();
    loop {
        let request = match read_request(&mut client, &mut buffered).await {
            Ok(Some(request)) => request,
            Ok(None) | Err(_) => return,
        };
        // The relay reads an ordered queue's or a topic's attributes (its size limit) before
        // sending to it; the faults are meant for its sends, so these reads pass untouched and
        // use up no fault. Except where the fault is the refused read itself, or a region
        // mismatch, which refuses every call (and `check`'s read is how it is told).
        let reads_attributes = request.action.ends_with(".GetQueueAttributes")
            || request.action.ends_with(".GetTopicAttributes");
        let persistent = shared.control.borrow().mode;
        let denied_read =
            request.action == "SNS.GetTopicAttributes" && persistent == Mode::DenyTopicAttributes;
        let faulted_read =
            denied_read || matches!(persistent, Mode::WrongRegion | Mode::WrongSigningRegion);
        let mut control = if reads_attributes && !faulted_read {
            Control {
                mode: Mode::Pass,
                ..*shared.control.borrow()
            }
        } else {
            arrive(&shared)
        };
        if control.mode == Mode::DenyTopicAttributes && !denied_read {
            control.mode = Mode::Pass;
        }
        shared.requests.fetch_add(1, Ordering::SeqCst);
        if control.mode != Mode::Pass {
            shared.faulted.fetch_add(1, Ordering::SeqCst);
        }
        shared.actions.lock().unwrap().push(request.action.clone());

        let response = match control.mode {
            Mode::Pass => forward(&shared, &request).await,
            Mode::Delay(delay) => {
                tokio::time::sleep(delay).await;
                forward(&shared, &request).await
            }
            Mode::Serial(service) => {
                let _worker = shared.serial.lock().await;
                tokio::time::sleep(service).await;
                forward(&shared, &request).await
            }
            Mode::Error500 => match request.protocol {
                Protocol::SqsJson => canned("500 Internal Server Error", &[], INTERNAL_ERROR_BODY),
                Protocol::Query => {
                    query_error("500 Internal Server Error", "Receiver", "InternalError")
                }
                Protocol::S3Rest => s3_error("500 Internal Server Error", "InternalError"),
            },
            Mode::Throttle => match request.protocol {
                Protocol::SqsJson => canned(
                    "400 Bad Request",
                    &["x-amzn-query-error: ThrottlingException;Sender"],
                    THROTTLE_BODY,
                ),
                Protocol::Query => query_error("400 Bad Request", "Sender", "Throttling"),
                Protocol::S3Rest => s3_error("503 Slow Down", "SlowDown"),
            },
            Mode::BadInput => match request.protocol {
                Protocol::SqsJson => canned(
                    "400 Bad Request",
                    &["x-amzn-query-error: InvalidParameterValue;Sender"],
                    BAD_INPUT_BODY,
                ),
                Protocol::Query => query_error("400 Bad Request", "Sender", "InvalidParameter"),
                Protocol::S3Rest => s3_error("400 Bad Request", "InvalidArgument"),
            },
            Mode::WrongRegion | Mode::WrongSigningRegion => match request.protocol {
                Protocol::SqsJson => canned(
                    "400 Bad Request",
                    &["x-amzn-query-error: InvalidAddress;Sender"],
                    WRONG_REGION_SQS_BODY,
                ),
                Protocol::Query => query_error_saying(
                    "400 Bad Request",
                    "Sender",
                    "InvalidParameter",
                    "Invalid parameter: TopicArn",
                ),
                Protocol::S3Rest if control.mode == Mode::WrongRegion => s3_error_with(
                    "301 Moved Permanently",
                    "PermanentRedirect",
                    "The bucket you are attempting to access must be addressed using the specified endpoint. Please send all future requests to this endpoint.",
                    &["x-amz-bucket-region: eu-west-1"],
                ),
                Protocol::S3Rest => s3_error_with(
                    "400 Bad Request",
                    "AuthorizationHeaderMalformed",
                    "The authorization header is malformed; the region 'us-east-1' is wrong; expecting 'eu-west-1'",
                    &[],
                ),
            },
            Mode::Reset => {
                // Zero linger turns close into RST, as a crashed load balancer would send.
                let _ = client.set_zero_linger();
                return;
            }
            Mode::BlackHole => return std::future::pending().await,
            Mode::DropResponse => {
                let _ = forward(&shared, &request).await;
                return;
            }
            Mode::FailLastEntry => {
                let (bytes, keep_alive) = forward(&shared, &request).await;
                if request.action.ends_with(".SendMessageBatch") {
                    (fail_last_entry(bytes), keep_alive)
                } else {
                    (bytes, keep_alive)
                }
            }
            Mode::DenyTopicAttributes => {
                query_error("403 Forbidden", "Sender", "AuthorizationError")
            }
            Mode::Hold => {
                let response = forward(&shared, &request).await;
                shared.held.fetch_add(1, Ordering::SeqCst);
                let mut control_rx = shared.control.subscribe();
                let _ = control_rx
                    .wait_for(|c| c.release_generation != control.release_generation)
                    .await;
                shared.held.fetch_sub(1, Ordering::SeqCst);
                response
            }
        };
        let (bytes, keep_alive) = response;
        if client.write_all(&bytes).await.is_err() || !keep_alive || request.close {
            return;
        }
    }
}

/// A `SendMessageBatch` answer (length-framed JSON) with its last `Successful` entry reported
/// in `Failed` instead; anything else unchanged.
fn fail_last_entry(response: Vec<u8>) -> Vec<u8> {
    let Some(head_end) = find(&response, b"\r\n\r\n") else {
        return response;
    };
    let head = String::from_utf8_lossy(&response[..head_end]).into_owned();
    if !head.starts_with("HTTP/1.1 200") || header(&head, "content-length").is_none() {
        return response;
    }
    let Ok(mut body) = serde_json::from_slice::<serde_json::Value>(&response[head_end + 4..])
    else {
        return response;
    };
    let Some(entry) = body["Successful"].as_array_mut().and_then(Vec::pop) else {
        return response;
    };
    let failed = serde_json::json!({
        "Id": entry["Id"],
        "SenderFault": false,
        "Code": "InternalError",
        "Message": "injected partial failure",
    });
    match body["Failed"].as_array_mut() {
        Some(list) => list.push(failed),
        None => body["Failed"] = serde_json::json!([failed]),
    }
    let text = body.to_string();
    let mut out = String::new();
    for line in head.split("\r\n") {
        if line.to_ascii_lowercase().starts_with("content-length:") {
            out.push_str(&format!("Content-Length: {}\r\n", text.len()));
        } else {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("\r\n");
    out.push_str(&text);
    out.into_bytes()
}

/// The control in force for a request arriving now; takes one pending one-shot fault, if any.
fn arrive(shared: &Shared) -> Control {
    let mut seen = None;
    shared.control.send_if_modified(|c| {
        let mut now = *c;
        let one_shot = c.next_faults > 0;
        if one_shot {
            c.next_faults -= 1;
            now.mode = c.next_mode;
        }
        seen = Some(now);
        one_shot
    });
    seen.expect("send_if_modified runs its closure")
}

/// Reads one request (`http::next_request`); `Ok(None)` when the client closed the connection.
async fn read_request(
    client: &mut TcpStream,
    buffered: &mut Vec<u8>,
) -> std::io::Result<Option<Request>> {
    let (head, head_len) = match http::next_request(client, buffered, 16 * 1024).await {
        Ok(Some(request)) => request,
        Ok(None) => return Ok(None),
        // The SDK always sends a Content-Length; dropping the connection beats mis-framing
        // the stream.
        Err(()) => {
            eprintln!("fault proxy: a request head it cannot read (chunked, or malformed)");
            return Err(std::io::ErrorKind::InvalidData.into());
        }
    };
    let total = head_len + head.content_length;
    let body = buffered[head_len..total].to_vec();
    buffered.drain(..total);
    let head = head.raw;
    let (protocol, action) = operation(&head, &body);
    let close = header(&head, "connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
    Ok(Some(Request {
        head,
        body,
        action,
        protocol,
        close,
    }))
}

/// The request's protocol and what it asks for (see `FaultProxy::actions`).
fn operation(head: &str, body: &[u8]) -> (Protocol, String) {
    if let Some(target) = header(head, "x-amz-target") {
        return (Protocol::SqsJson, target.to_string());
    }
    let form = header(head, "content-type")
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if form || body.starts_with(b"Action=") {
        let action = String::from_utf8_lossy(body)
            .split('&')
            .find_map(|pair| pair.strip_prefix("Action=").map(str::to_string))
            .unwrap_or_default();
        return (Protocol::Query, format!("SNS.{action}"));
    }
    let mut line = head.split("\r\n").next().unwrap_or("").split(' ');
    let method = line.next().unwrap_or("");
    let target = line.next().unwrap_or("");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let operation = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("x-id="))
        .unwrap_or(method);
    (Protocol::S3Rest, format!("S3.{operation} {path}"))
}

/// Sends the request upstream and returns the response to relay and whether the client
/// connection can stay open after it.
async fn forward(shared: &Shared, request: &Request) -> (Vec<u8>, bool) {
    shared.forwarded.fetch_add(1, Ordering::SeqCst);
    if request.action.ends_with(".SendMessageBatch") {
        record_event_ids(shared, &request.body);
    }
    let exchange = async {
        let mut upstream = TcpStream::connect(&shared.upstream).await?;
        let mut head = String::new();
        for line in request.head.split("\r\n") {
            if !is_hop_by_hop(line) {
                head.push_str(line);
                head.push_str("\r\n");
            }
        }
        head.push_str("Connection: close\r\n\r\n");
        upstream.write_all(head.as_bytes()).await?;
        upstream.write_all(&request.body).await?;
        let mut response = Vec::new();
        upstream.read_to_end(&mut response).await?;
        std::io::Result::Ok(response)
    };
    match tokio::time::timeout(Duration::from_secs(120), exchange).await {
        Ok(Ok(response)) => reframe(response),
        Ok(Err(e)) => canned_close("502 Bad Gateway", &format!("upstream: {e}")),
        Err(_) => canned_close("504 Gateway Timeout", "upstream took over 120 s"),
    }
}

/// Notes the `event_id` message attribute of each entry of a `SendMessageBatch` body.
fn record_event_ids(shared: &Shared, body: &[u8]) {
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(body) else {
        return;
    };
    let ids = body["Entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            entry["MessageAttributes"]["event_id"]["StringValue"]
                .as_str()
                .map(str::to_string)
        });
    shared.sent_event_ids.lock().unwrap().extend(ids);
}

/// Drops the upstream's `Connection: close` so the client may keep its connection, when the
/// body is framed by length or chunks; otherwise the body ends at EOF and so must our answer.
fn reframe(response: Vec<u8>) -> (Vec<u8>, bool) {
    let Some(head_end) = find(&response, b"\r\n\r\n") else {
        return (response, false);
    };
    let head = String::from_utf8_lossy(&response[..head_end]).into_owned();
    let http11 = head.starts_with("HTTP/1.1");
    let length = header(&head, "content-length").and_then(|v| v.parse::<usize>().ok());
    let chunked = header(&head, "transfer-encoding").is_some_and(|v| v.contains("chunked"));
    let keep_alive = http11 && (length.is_some() || chunked);
    let mut out = Vec::with_capacity(response.len() + 20);
    for line in head.split("\r\n") {
        if !is_hop_by_hop(line) {
            out.extend_from_slice(line.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    if !keep_alive {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    let body = &response[head_end + 4..];
    let body = match length {
        Some(n) if !chunked => &body[..n.min(body.len())],
        _ => body,
    };
    out.extend_from_slice(body);
    (out, keep_alive)
}

fn canned(status: &str, extra_headers: &[&str], body: &str) -> (Vec<u8>, bool) {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/x-amz-json-1.0\r\n\
         Content-Length: {}\r\nx-amzn-RequestId: fault-proxy-{}\r\n",
        body.len(),
        super::random_hex(8)
    );
    for h in extra_headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    head.push_str(body);
    (head.into_bytes(), true)
}

/// An error as the query protocol (SNS) answers it; the SDK reads `Code`.
fn query_error(status: &str, fault: &str, code: &str) -> (Vec<u8>, bool) {
    query_error_saying(status, fault, code, &format!("injected {code}"))
}

fn query_error_saying(status: &str, fault: &str, code: &str, message: &str) -> (Vec<u8>, bool) {
    let request_id = format!("fault-proxy-{}", super::random_hex(8));
    let body = format!(
        "<ErrorResponse xmlns=\"http://sns.amazonaws.com/doc/2010-03-31/\"><Error>\
         <Type>{fault}</Type><Code>{code}</Code><Message>{message}</Message></Error>\
         <RequestId>{request_id}</RequestId></ErrorResponse>"
    );
    xml(status, &request_id, &body, &[])
}

/// An error as S3 answers it; the SDK reads `Code`.
fn s3_error(status: &str, code: &str) -> (Vec<u8>, bool) {
    s3_error_with(status, code, &format!("injected {code}"), &[])
}

fn s3_error_with(status: &str, code: &str, message: &str, headers: &[&str]) -> (Vec<u8>, bool) {
    let request_id = format!("fault-proxy-{}", super::random_hex(8));
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>\
         <Message>{message}</Message><RequestId>{request_id}</RequestId></Error>"
    );
    xml(status, &request_id, &body, headers)
}

fn xml(status: &str, request_id: &str, body: &str, headers: &[&str]) -> (Vec<u8>, bool) {
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    let bytes = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/xml\r\nContent-Length: {}\r\n\
         x-amzn-RequestId: {request_id}\r\nx-amz-request-id: {request_id}\r\n{extra}\r\n{body}",
        body.len()
    );
    (bytes.into_bytes(), true)
}

fn canned_close(status: &str, message: &str) -> (Vec<u8>, bool) {
    let body = serde_json::json!({ "__type": "ProxyError", "message": message }).to_string();
    let (bytes, _) = canned(status, &["Connection: close"], &body);
    (bytes, false)
}

fn is_hop_by_hop(line: &str) -> bool {
    let name = line.split(':').next().unwrap_or("").trim();
    ["connection", "keep-alive", "proxy-connection"]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h))
}

/// Value of the first header named `name` (case-insensitive) in an HTTP head.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n").skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
