//! The real `outbox-relay` binary as a child process, with its output captured line by line.

use super::{spawn_kept, unique, TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long `scrape`, `metric` and `http_status` wait for the metrics address to be logged.
const METRICS_ADDR_TIMEOUT: Duration = Duration::from_secs(20);

/// Whether relays' output is echoed to stderr as it comes. libtest captures the echo and shows
/// it only for a failing test; the simulation (no libtest, many relays per seed) turns it off
/// and keeps the lines in [`RelayProcess::output`].
pub static ECHO: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Variables of the test's own environment that would change what the relay does.
const SCRUBBED_PREFIXES: &[&str] = &["AWS_", "OUTBOX_", "DATABASE_URL", "PG", "RUST_LOG", "OTEL_"];

pub struct RelayProcess {
    /// Prefix of its echoed output, to tell replicas apart in a failing test's log.
    name: String,
    child: Mutex<Child>,
    /// Every stdout and stderr line so far, in arrival order.
    lines: Arc<Mutex<Vec<String>>>,
    /// Output readers that reached EOF, so `wait_exit` can return with the output complete.
    readers_done: Arc<AtomicUsize>,
    /// Learned from the log once; the relay binds port 0 in tests.
    metrics_addr: OnceLock<String>,
}

impl RelayProcess {
    /// Starts `outbox-relay ARGS` with test credentials and `envs` on top of a scrubbed
    /// environment.
    pub fn spawn(args: &[String], envs: &[(String, String)]) -> RelayProcess {
        Self::spawn_named(&format!("relay-{}", unique()), args, envs)
    }

    pub fn spawn_named(name: &str, args: &[String], envs: &[(String, String)]) -> RelayProcess {
        Self::spawn_binary(
            Path::new(env!("CARGO_BIN_EXE_outbox-relay")),
            name,
            args,
            envs,
        )
    }

    /// [`RelayProcess::spawn_named`] for another build of the relay than this one's, e.g. a
    /// release before it.
    pub fn spawn_binary(
        binary: &Path,
        name: &str,
        args: &[String],
        envs: &[(String, String)],
    ) -> RelayProcess {
        let mut cmd = Command::new(binary);
        cmd.args(args);
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if SCRUBBED_PREFIXES.iter().any(|p| key.starts_with(p)) {
                cmd.env_remove(&*key);
            }
        }
        cmd.env("NO_COLOR", "1")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", TEST_SECRET_ACCESS_KEY)
            // Keep a developer's ~/.aws out of the credential and region chain.
            .env("AWS_CONFIG_FILE", "/dev/null")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
            // `OUTBOX_TEST_RELAY_LOG=debug` (or any filter) while looking into a failure.
            .env(
                "RUST_LOG",
                std::env::var("OUTBOX_TEST_RELAY_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = spawn_kept(cmd, libc::SIGKILL).expect("spawn outbox-relay");

        let lines = Arc::new(Mutex::new(Vec::new()));
        let readers_done = Arc::new(AtomicUsize::new(0));
        let stdout: Box<dyn Read + Send> = Box::new(child.stdout.take().unwrap());
        let stderr: Box<dyn Read + Send> = Box::new(child.stderr.take().unwrap());
        for stream in [stdout, stderr] {
            let (name, lines, done) = (name.to_string(), lines.clone(), readers_done.clone());
            // Spawned from the test's thread, so libtest captures the echo and shows it only
            // when the test fails.
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                let mut raw = Vec::new();
                while matches!(reader.read_until(b'\n', &mut raw), Ok(n) if n > 0) {
                    let line = String::from_utf8_lossy(&raw).trim_end().to_string();
                    if ECHO.load(Ordering::Relaxed) {
                        eprintln!("[{name}] {line}");
                    }
                    lines.lock().unwrap().push(line);
                    raw.clear();
                }
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
        RelayProcess {
            name: name.to_string(),
            child: Mutex::new(child),
            lines,
            readers_done,
            metrics_addr: OnceLock::new(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.lock().unwrap().id()
    }

    /// All output so far, one line per line.
    pub fn output(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// The first line so far, or within `timeout`, that contains `needle`.
    pub async fn wait_for_line(&self, needle: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let found = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
                .cloned();
            if found.is_some() || Instant::now() >= deadline {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `127.0.0.1:PORT` from the relay's `metrics_addr=…` log field (text or JSON format).
    pub async fn metrics_addr(&self, timeout: Duration) -> String {
        if let Some(addr) = self.metrics_addr.get() {
            return addr.clone();
        }
        let line = self
            .wait_for_line("metrics_addr", timeout)
            .await
            .unwrap_or_else(|| {
                panic!(
                    "{} logged no metrics_addr in {timeout:?}; output:\n{}",
                    self.name,
                    self.output()
                )
            });
        let addr = parse_metrics_addr(&line)
            .unwrap_or_else(|| panic!("cannot find an address in log line: {line}"));
        self.metrics_addr.get_or_init(|| addr).clone()
    }

    /// The address a command logged in field `field` (`console_addr`), waiting for the line.
    pub async fn logged_addr(&self, field: &str, timeout: Duration) -> String {
        let line = self.wait_for_line(field, timeout).await.unwrap_or_else(|| {
            panic!(
                "{} logged no {field} in {timeout:?}; output:\n{}",
                self.name,
                self.output()
            )
        });
        parse_logged_addr(&line, field)
            .unwrap_or_else(|| panic!("cannot find {field} in log line: {line}"))
    }

    /// Body of `GET /metrics`.
    pub async fn scrape(&self) -> String {
        let (status, body) = self.http_get("/metrics").await;
        assert_eq!(status, 200, "{} GET /metrics: {body}", self.name);
        body
    }

    /// Current value of one series, named exactly as exposed, labels included, e.g.
    /// `outbox_send_failures_total{kind="config"}`.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        metric_value(&self.scrape().await, series)
    }

    /// Status code of `GET path` on the metrics listener (`/healthz`, `/readyz`).
    pub async fn http_status(&self, path: &str) -> u16 {
        self.http_get(path).await.0
    }

    /// Status code and body of `GET path` on the metrics listener (`/readyz` says why).
    pub async fn http_get(&self, path: &str) -> (u16, String) {
        let addr = self.metrics_addr(METRICS_ADDR_TIMEOUT).await;
        let fetch = async {
            let mut stream = tokio::net::TcpStream::connect(&addr).await?;
            // HTTP/1.0 so the server closes the connection and the body ends at EOF.
            let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
            stream.write_all(request.as_bytes()).await?;
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw).await?;
            std::io::Result::Ok(raw)
        };
        let raw = tokio::time::timeout(Duration::from_secs(10), fetch)
            .await
            .unwrap_or_else(|_| panic!("{} GET {path}: no answer in 10 s", self.name))
            .unwrap_or_else(|e| panic!("{} GET {path}: {e}", self.name));
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{} GET {path}: bad response {text:?}", self.name));
        (status, body.to_string())
    }

    pub fn kill9(&self) {
        self.signal(libc::SIGKILL);
    }

    pub fn sigterm(&self) {
        self.signal(libc::SIGTERM);
    }

    pub fn sigstop(&self) {
        self.signal(libc::SIGSTOP);
    }

    pub fn sigcont(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        let mut child = self.child.lock().unwrap();
        // Once reaped, the pid may belong to someone else.
        if matches!(child.try_wait(), Ok(None)) {
            // SAFETY: plain kill(2) on our own live child.
            unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        }
    }

    /// Exit status once the process has ended and its output is fully read, or `None` if it is
    /// still running after `timeout`.
    pub async fn wait_exit(&self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.lock().unwrap().try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // A grandchild holding the pipes open must not hang the test, hence the bound.
        let drained = Instant::now() + Duration::from_secs(2);
        while self.readers_done.load(Ordering::SeqCst) < 2 && Instant::now() < drained {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Some(status)
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs a command that is expected to exit (e.g. `migrate`, `check`) and returns its status
/// and output; panics if it is still running after `timeout`.
pub async fn run_to_end(
    args: &[String],
    envs: &[(String, String)],
    timeout: Duration,
) -> (ExitStatus, String) {
    let relay = RelayProcess::spawn(args, envs);
    match relay.wait_exit(timeout).await {
        Some(status) => (status, relay.output()),
        None => panic!(
            "outbox-relay {args:?} still running after {timeout:?}; output:\n{}",
            relay.output()
        ),
    }
}

/// The address after `metrics_addr=` (text logs) or `"metrics_addr":` (JSON logs).
pub fn parse_metrics_addr(line: &str) -> Option<String> {
    parse_logged_addr(line, "metrics_addr")
}

/// The address after `FIELD=` (text logs) or `"FIELD":` (JSON logs).
pub fn parse_logged_addr(line: &str, field: &str) -> Option<String> {
    let rest = line
        .split_once(&format!("{field}="))
        .or_else(|| line.split_once(&format!("\"{field}\":")))?
        .1;
    let rest = rest.trim_start_matches(['"', '\'']);
    let end = rest
        .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ',' | '}' | ']'))
        .unwrap_or(rest.len());
    (end > 0).then(|| rest[..end].to_string())
}

/// Value of the series `series` (name plus labels, exactly as exposed) in Prometheus text.
pub fn metric_value(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        if line.starts_with('#') {
            return None;
        }
        // Label values may hold spaces, so the series ends at the last `}` when there is one.
        let split_at = match line.find('{') {
            Some(_) => line.rfind('}')? + 1,
            None => line.find(char::is_whitespace)?,
        };
        let (key, rest) = line.split_at(split_at);
        if key != series {
            return None;
        }
        rest.split_whitespace().next()?.parse().ok()
    })
}
