//! One local SQS-compatible server per test process, one queue per test.
//!
//! `OUTBOX_TEST_SQS=fauxqs` (default) or `moto` picks the server; both come from `.tools/`
//! (`scripts/test` installs them). Their launchers in `tests/sqs-servers/` bind 127.0.0.1 on a
//! port the OS picks and print `LISTENING http://127.0.0.1:PORT`.

use super::{log_tail, make_temp_dir, repo_root, spawn_kept, stop_at_exit, unique};
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_sdk_sqs::config::retry::RetryConfig;
use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName, QueueAttributeName,
};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Access key the tests hand to the relay and to their own SDK client.
pub const TEST_ACCESS_KEY_ID: &str = "AKIDTESTRELAY";
/// Secret key; tests grep relay output for it to prove secrets are never logged.
pub const TEST_SECRET_ACCESS_KEY: &str = "test-secret-key-do-not-log";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SqsKind {
    Fauxqs,
    Moto,
}

pub struct SqsServer {
    /// Which emulator; tests skip or shrink cases one of them cannot handle.
    kind: SqsKind,
    /// `http://127.0.0.1:PORT`.
    endpoint: String,
    /// Server output, quoted when it fails to start.
    log_path: PathBuf,
    /// The server process; it is shared by every test, so outages are simulated with a
    /// `FaultProxy`, never by stopping it. The death signal ends it with the test process.
    child: Mutex<Child>,
}

impl SqsServer {
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn kind(&self) -> SqsKind {
        self.kind
    }

    /// Everything the server has logged so far.
    pub fn log(&self) -> String {
        log_tail(&self.log_path, usize::MAX)
    }
}

/// The server chosen by `OUTBOX_TEST_SQS`, started on first use.
pub fn sqs() -> &'static SqsServer {
    static SQS: OnceLock<SqsServer> = OnceLock::new();
    SQS.get_or_init(|| {
        let kind = match std::env::var("OUTBOX_TEST_SQS").as_deref() {
            Err(_) | Ok("") | Ok("fauxqs") => SqsKind::Fauxqs,
            Ok("moto") => SqsKind::Moto,
            Ok(other) => panic!("OUTBOX_TEST_SQS={other:?}: expected `fauxqs` or `moto`"),
        };
        start(kind)
    })
}

fn start(kind: SqsKind) -> SqsServer {
    let tools = repo_root().join(".tools");
    let launchers = repo_root().join("tests/sqs-servers");
    let mut cmd = match kind {
        SqsKind::Fauxqs => {
            let entry = tools.join("node_modules/fauxqs/dist/app.js");
            assert!(
                entry.is_file(),
                "{} is missing: run `npm ci --prefix .tools` (scripts/test does it)",
                entry.display()
            );
            let mut cmd = Command::new("node");
            cmd.arg(launchers.join("fauxqs.mjs")).arg(entry);
            cmd
        }
        SqsKind::Moto => {
            let python = tools.join("venv/bin/python");
            assert!(
                python.is_file(),
                "{} is missing: create .tools/venv with moto[server] (scripts/test does it)",
                python.display()
            );
            let mut cmd = Command::new(python);
            cmd.arg(launchers.join("moto_server.py"));
            cmd
        }
    };
    let dir = make_temp_dir("sqs");
    let log_path = dir.join("server.log");
    let log = std::fs::File::create(&log_path).expect("create sqs server log");
    cmd.current_dir(&dir)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log.try_clone().expect("dup log fd"));
    let mut child = spawn_kept(cmd, libc::SIGKILL).expect("spawn SQS server");
    stop_at_exit(child.id(), libc::SIGKILL);

    // The first line is the address; the rest goes to the log so the pipe never fills up.
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut log = log;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(addr) = line.strip_prefix("LISTENING ") {
                let _ = tx.send(addr.trim().to_string());
            } else {
                let _ = writeln!(log, "{line}");
            }
        }
    });
    let endpoint = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(endpoint) => endpoint,
        Err(_) => {
            let _ = child.kill();
            panic!(
                "{kind:?} did not report its address in 60 s:\n{}",
                log_tail(&log_path, 8192)
            );
        }
    };
    SqsServer {
        kind,
        endpoint,
        log_path,
        child: Mutex::new(child),
    }
}

/// SDK client for the test side, talking straight to the server.
pub async fn sqs_client() -> aws_sdk_sqs::Client {
    sqs_client_at(sqs().endpoint())
}

/// SDK client for any endpoint (e.g. a [`super::FaultProxy`]).
pub fn sqs_client_at(endpoint: &str) -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(&test_sdk_config(endpoint))
}

/// What every test-side AWS client (SQS, SNS, S3) is built from: the test credentials,
/// `us-east-1`, `endpoint`, and no retries, so every injected fault surfaces as exactly one
/// error.
pub fn test_sdk_config(endpoint: &str) -> aws_config::SdkConfig {
    aws_config::SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            TEST_ACCESS_KEY_ID,
            TEST_SECRET_ACCESS_KEY,
            None,
            None,
            "outbox-relay-tests",
        )))
        .endpoint_url(endpoint)
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .operation_timeout(Duration::from_secs(60))
                .build(),
        )
        .build()
}

/// Raises (or lowers) a queue's `MaximumMessageSize`: the fix of a row refused for its size.
pub async fn set_max_message_size(queue_url: &str, bytes: usize) {
    sqs_client()
        .await
        .set_queue_attributes()
        .queue_url(queue_url)
        .attributes(
            aws_sdk_sqs::types::QueueAttributeName::MaximumMessageSize,
            bytes.to_string(),
        )
        .send()
        .await
        .expect("SetQueueAttributes");
}

/// Creates a queue named after `prefix` and unique in this run; a `.fifo` prefix makes a FIFO
/// queue. Returns its URL.
pub async fn create_queue(prefix: &str, attrs: &[(&str, &str)]) -> String {
    let (base, fifo) = match prefix.strip_suffix(".fifo") {
        Some(base) => (base, true),
        None => (prefix, false),
    };
    let mut name = format!("{base}-{}-{}", unique(), std::process::id());
    if fifo {
        name.push_str(".fifo");
    }
    let mut req = sqs_client().await.create_queue().queue_name(&name);
    if fifo {
        req = req.attributes(QueueAttributeName::FifoQueue, "true");
    }
    for (key, value) in attrs {
        req = req.attributes(QueueAttributeName::from(*key), *value);
    }
    req.send()
        .await
        .unwrap_or_else(|e| panic!("create queue {name}: {e:?}"))
        .queue_url
        .expect("CreateQueue returned no QueueUrl")
}

/// Receivers polling one queue at once on fauxqs, which drains big queues several times faster.
/// Moto gets one: its receive is not atomic, and parallel receivers got the same message twice.
const FAUXQS_RECEIVERS: usize = 4;
/// Consecutive empty receives (after `expected` arrived) that mean the queue has gone quiet.
const QUIET_RECEIVES: u32 = 3;
/// And how long no message must have arrived, so parallel receivers cannot end it too early.
const QUIET_TIME: Duration = Duration::from_millis(300);

/// Receives until at least `expected` messages came and the queue has gone quiet, or `timeout`.
/// Returns every message received, duplicates included, so tests can count copies.
///
/// Received messages are deleted (a FIFO group would stay blocked otherwise, and moto slows as
/// a queue fills) and are invisible for 10 minutes before that, so none is delivered twice by
/// the queue itself: every copy in the result was sent more than once.
pub async fn receive_all(queue_url: &str, expected: usize, timeout: Duration) -> Vec<Message> {
    struct Progress {
        messages: Vec<Message>,
        empty_streak: u32,
        last_message: Instant,
    }
    let client = sqs_client().await;
    let deadline = Instant::now() + timeout;
    let progress = Mutex::new(Progress {
        messages: Vec::new(),
        empty_streak: 0,
        last_message: Instant::now(),
    });
    let done = |p: &Progress| {
        p.messages.len() >= expected
            && p.empty_streak >= QUIET_RECEIVES
            && p.last_message.elapsed() >= QUIET_TIME
    };
    let receiver = || async {
        loop {
            if Instant::now() >= deadline || done(&progress.lock().unwrap()) {
                return;
            }
            let out = client
                .receive_message()
                .queue_url(queue_url)
                .max_number_of_messages(10)
                .message_attribute_names("All")
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .visibility_timeout(600)
                .wait_time_seconds(0)
                .send()
                .await
                .unwrap_or_else(|e| panic!("receive from {queue_url}: {e:?}"));
            let got = out.messages.unwrap_or_default();
            if got.is_empty() {
                progress.lock().unwrap().empty_streak += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            let mut delete = client.delete_message_batch().queue_url(queue_url);
            for (i, m) in got.iter().enumerate() {
                let entry = DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(m.receipt_handle().unwrap_or_default())
                    .build()
                    .expect("delete entry");
                delete = delete.entries(entry);
            }
            {
                let mut p = progress.lock().unwrap();
                p.empty_streak = 0;
                p.last_message = Instant::now();
                p.messages.extend(got);
            }
            // Appended before the delete: until then no other receiver can get the next
            // message of a FIFO group, so the result keeps each group's order.
            delete
                .send()
                .await
                .unwrap_or_else(|e| panic!("delete from {queue_url}: {e:?}"));
        }
    };
    let receivers = match sqs().kind() {
        SqsKind::Fauxqs => FAUXQS_RECEIVERS,
        SqsKind::Moto => 1,
    };
    futures_util::future::join_all((0..receivers).map(|_| receiver())).await;
    progress.into_inner().unwrap().messages
}
