//! A minimal SQS endpoint that only answers SendMessageBatch and GetQueueAttributes (JSON
//! protocol), and S3's PutObject (any `PUT`, body counted and dropped, for offloaded bodies),
//! at once or after a fixed delay. It costs next to nothing, so what a drain against it shows is the relay's and
//! the database's own limit, and the delay stands in for SQS's in-region round trip.
//!
//! Every entry is accepted. The Rust SDK (aws-sdk-sqs 1.119) does not check MD5 digests, and
//! fills a missing `MD5OfMessageBody` with an empty string, so none is computed here: no digest
//! crate, no hashing cost charged to the bench process.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::support::http;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub struct Sink {
    /// For the relays' `--sqs-endpoint-url` (and `--s3-endpoint-url`).
    pub endpoint: String,
    /// What the listener counted, shared with its connection tasks.
    state: Arc<State>,
    /// The accept loop, aborted on drop so the port closes with the run.
    accept: JoinHandle<()>,
}

struct State {
    /// How long each answer waits: SQS's round trip, or none.
    delay: Duration,
    /// Entries received, duplicates included.
    entries: AtomicU64,
    /// SendMessageBatch requests answered.
    requests: AtomicU64,
    /// PutObject requests (offloaded bodies), answered without keeping the body.
    objects: AtomicU64,
    /// The next `MessageId` handed out, so that every answer's ids differ.
    next_message_id: AtomicU64,
    /// Steady runs only: when each event arrived, keyed by the number in its `event_id`.
    arrivals: Option<Mutex<Vec<(u64, Instant)>>>,
    /// FIFO queues only: the highest event number seen per message group, to count entries
    /// that arrived behind a later event of their group.
    fifo_order: Mutex<FifoOrder>,
}

#[derive(Default)]
struct FifoOrder {
    /// The highest event number seen per message group.
    last_in_group: HashMap<String, u64>,
    /// Entries that arrived behind a later event of their group.
    behind: u64,
    /// FIFO entries that came without a `MessageGroupId`.
    missing_group_id: u64,
}

#[derive(Deserialize)]
struct SendMessageBatch {
    /// Which queue: `.fifo` turns the ordering check on.
    #[serde(rename = "QueueUrl")]
    queue_url: String,
    /// The batch's entries, every one answered as successful.
    #[serde(rename = "Entries")]
    entries: Vec<Entry>,
}

#[derive(Deserialize)]
struct GetQueueAttributes {
    /// Which queue: the answer follows its name.
    #[serde(rename = "QueueUrl")]
    queue_url: String,
}

/// What the sink says of every queue: SQS's largest message size, and FIFO by the name.
const MAXIMUM_MESSAGE_SIZE: usize = 1024 * 1024;

#[derive(Deserialize)]
struct Entry {
    /// Echoed in the answer, as SQS does.
    #[serde(rename = "Id")]
    id: String,
    /// FIFO only: the group the ordering check follows.
    #[serde(rename = "MessageGroupId")]
    group_id: Option<String>,
    /// Where the event's `event_id` (with its number) arrives.
    #[serde(rename = "MessageAttributes", default)]
    attributes: HashMap<String, Attribute>,
}

#[derive(Deserialize)]
struct Attribute {
    /// A String attribute's value (event ids are strings).
    #[serde(rename = "StringValue")]
    string_value: Option<String>,
}

impl Sink {
    /// Listens on a loopback port the OS picks. `record_arrivals` keeps a timestamp per event
    /// (steady runs); drains only count.
    pub async fn start(delay: Duration, record_arrivals: bool) -> Sink {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind sink");
        let addr: SocketAddr = listener.local_addr().expect("sink address");
        let state = Arc::new(State {
            delay,
            entries: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            objects: AtomicU64::new(0),
            next_message_id: AtomicU64::new(1),
            arrivals: record_arrivals.then(|| Mutex::new(Vec::with_capacity(1 << 16))),
            fifo_order: Mutex::new(FifoOrder::default()),
        });
        let accept = http::accept_all(listener, Arc::clone(&state), serve);
        Sink {
            endpoint: format!("http://{addr}"),
            state,
            accept,
        }
    }

    /// A queue URL on this sink; the name decides standard or FIFO, as on SQS.
    pub fn queue_url(&self, name: &str) -> String {
        format!("{}/000000000000/{name}", self.endpoint)
    }

    pub fn entries(&self) -> u64 {
        self.state.entries.load(Ordering::Relaxed)
    }

    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::Relaxed)
    }

    /// PutObject requests served (an offloaded body each, resends included).
    pub fn objects(&self) -> u64 {
        self.state.objects.load(Ordering::Relaxed)
    }

    /// Entries that reached a FIFO queue behind a later event of the same group, and entries
    /// without a group ID (SQS would refuse those).
    pub fn fifo_violations(&self) -> (u64, u64) {
        let order = self.state.fifo_order.lock().unwrap();
        (order.behind, order.missing_group_id)
    }

    /// Arrival times recorded so far (first arrival per event is the one that counts).
    pub fn arrivals(&self) -> Vec<(u64, Instant)> {
        match &self.state.arrivals {
            Some(a) => a.lock().unwrap().clone(),
            None => Vec::new(),
        }
    }

    pub fn arrivals_len(&self) -> usize {
        self.state
            .arrivals
            .as_ref()
            .map_or(0, |a| a.lock().unwrap().len())
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One keep-alive connection: read a request, answer it, repeat until the client closes.
async fn serve(mut stream: TcpStream, state: Arc<State>) {
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    loop {
        let (head, head_len) = match http::next_request(&mut stream, &mut buf, 16 * 1024).await {
            Ok(Some(request)) => request,
            Ok(None) => return,
            Err(()) => {
                let _ = respond(&mut stream, 400, &error_body("malformed request")).await;
                return;
            }
        };
        let received = Instant::now();
        let body = &buf[head_len..head_len + head.content_length];
        let (status, answer) = if head.method == "PUT" {
            // S3's PutObject (path-style): headers only in the answer; the SDK needs no body.
            state.objects.fetch_add(1, Ordering::Relaxed);
            (200, String::new())
        } else if head.method != "POST" {
            (
                400,
                error_body(&format!("{} is not served here", head.method)),
            )
        } else if head.target == "AmazonSQS.SendMessageBatch" {
            match serde_json::from_slice::<SendMessageBatch>(body) {
                Ok(batch) => (200, accept(&state, &batch, received)),
                Err(e) => (400, error_body(&format!("bad SendMessageBatch body: {e}"))),
            }
        } else if head.target == "AmazonSQS.GetQueueAttributes" {
            // The relay reads each queue's MaximumMessageSize before planning requests and asks
            // again with every claim until it gets an answer: a refusal here would add a round
            // trip to every claim that SQS does not.
            match serde_json::from_slice::<GetQueueAttributes>(body) {
                Ok(request) => (200, queue_attributes(&request.queue_url)),
                Err(e) => (
                    400,
                    error_body(&format!("bad GetQueueAttributes body: {e}")),
                ),
            }
        } else {
            (
                400,
                error_body(&format!("{} is not served here", head.target)),
            )
        };
        buf.drain(..head_len + head.content_length);
        if !state.delay.is_zero() {
            tokio::time::sleep(state.delay).await;
        }
        if respond(&mut stream, status, &answer).await.is_err() {
            return;
        }
    }
}

fn accept(state: &State, batch: &SendMessageBatch, received: Instant) -> String {
    state.requests.fetch_add(1, Ordering::Relaxed);
    state
        .entries
        .fetch_add(batch.entries.len() as u64, Ordering::Relaxed);
    let numbers = batch.entries.iter().map(|e| {
        e.attributes
            .get("event_id")
            .and_then(|a| a.string_value.as_deref())
            .and_then(event_number)
    });
    if let Some(arrivals) = &state.arrivals {
        let mut arrivals = arrivals.lock().unwrap();
        arrivals.extend(numbers.clone().flatten().map(|n| (n, received)));
    }
    if batch.queue_url.ends_with(".fifo") {
        let mut order = state.fifo_order.lock().unwrap();
        for (entry, number) in batch.entries.iter().zip(numbers) {
            let (Some(group), Some(n)) = (&entry.group_id, number) else {
                order.missing_group_id += 1;
                continue;
            };
            match order.last_in_group.get_mut(group) {
                Some(last) if *last > n => order.behind += 1,
                Some(last) => *last = n,
                None => {
                    order.last_in_group.insert(group.clone(), n);
                }
            }
        }
    }
    let mut out = String::with_capacity(64 + batch.entries.len() * 96);
    out.push_str("{\"Successful\":[");
    for (i, entry) in batch.entries.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let id = state.next_message_id.fetch_add(1, Ordering::Relaxed);
        // Entry IDs are the relay's row ids (digits only), so they need no JSON escaping;
        // serde_json keeps that true for anything else.
        out.push_str("{\"Id\":");
        out.push_str(&serde_json::to_string(&entry.id).expect("string"));
        out.push_str(&format!(
            ",\"MessageId\":\"00000000-0000-4000-8000-{id:012x}\"}}"
        ));
    }
    out.push_str("],\"Failed\":[]}");
    out
}

fn queue_attributes(queue_url: &str) -> String {
    let mut attributes = serde_json::Map::new();
    attributes.insert(
        "MaximumMessageSize".to_string(),
        MAXIMUM_MESSAGE_SIZE.to_string().into(),
    );
    if queue_url.ends_with(".fifo") {
        attributes.insert("FifoQueue".to_string(), "true".into());
    }
    serde_json::json!({ "Attributes": attributes }).to_string()
}

/// The number at the end of an event ID such as `bench-1234` or `s2000-17`.
fn event_number(event_id: &str) -> Option<u64> {
    event_id.rsplit('-').next()?.parse().ok()
}

fn error_body(message: &str) -> String {
    serde_json::json!({"__type": "com.amazonaws.sqs#InvalidParameterValue", "message": message})
        .to_string()
}

async fn respond(stream: &mut TcpStream, status: u16, body: &str) -> std::io::Result<()> {
    let reason = if status == 200 { "OK" } else { "Bad Request" };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\n\
         Content-Type: application/x-amz-json-1.0\r\n\
         Content-Length: {}\r\n\
         x-amzn-RequestId: 00000000-0000-0000-0000-000000000000\r\n\
         \r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await
}
