//! A real Prometheus server (Debian's `prometheus` package, which scripts/test installs for
//! promtool) scraping the relays a test registers, with rule files of the test's choice, and its
//! HTTP API.
//!
//! Targets go in a file-based service discovery file that the test rewrites as relays come up,
//! so relays that bind port 0 can be added while the server runs.

use super::pg::free_port;
use super::{log_tail, make_temp_dir, spawn_kept};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The job every target is scraped under: the one the dashboard's and the alerts' selectors name.
pub const JOB: &str = "outbox-relay";

/// The `namespace` label every target gets, as Kubernetes service discovery gives a pod's: the
/// KEDA ScaledObject's query names the relays' namespace (an overlay fills it in).
pub const TARGET_NAMESPACE: &str = "outbox-relay-test";

/// How often targets are scraped and rules evaluated.
pub const SCRAPE_INTERVAL: Duration = Duration::from_secs(1);

/// A scraped relay: its `host:port` and its target labels of its own.
type Target = (String, Vec<(String, String)>);

pub struct Prometheus {
    /// `127.0.0.1:PORT` of its HTTP API.
    addr: String,
    /// Config, targets file, TSDB and log.
    dir: PathBuf,
    /// The `host:port` of every relay scraped, in the order added, with the labels of its own
    /// besides the job's and the namespace's.
    targets: Mutex<Vec<Target>>,
    child: Mutex<Child>,
}

impl Prometheus {
    /// Starts Prometheus with `rule_files` loaded and no target yet; returns once it is ready.
    pub async fn start(rule_files: &[&Path]) -> Prometheus {
        let dir = make_temp_dir("prometheus");
        std::fs::write(dir.join("targets.json"), "[]").expect("write empty targets file");
        let rules: String = rule_files
            .iter()
            .map(|p| format!("  - {:?}\n", p.display().to_string()))
            .collect();
        let interval = format!("{}s", SCRAPE_INTERVAL.as_secs());
        let config = format!(
            "global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n  \
             evaluation_interval: {interval}\nrule_files:\n{rules}scrape_configs:\n  \
             - job_name: {JOB}\n    file_sd_configs:\n      - files: [{:?}]\n        \
             refresh_interval: {interval}\n",
            dir.join("targets.json").display().to_string()
        );
        std::fs::write(dir.join("prometheus.yml"), config).expect("write prometheus.yml");

        // A port picked free may be taken before Prometheus binds it: then it exits, and
        // another port is tried.
        for _ in 0..3 {
            let addr = format!("127.0.0.1:{}", free_port());
            let child = spawn(&dir, &addr);
            let prometheus = Prometheus {
                addr,
                dir: dir.clone(),
                targets: Mutex::new(Vec::new()),
                child: Mutex::new(child),
            };
            if prometheus.until_ready().await {
                return prometheus;
            }
        }
        panic!(
            "prometheus did not start on three ports:\n{}",
            log_tail(&dir.join("prometheus.log"), 4000)
        );
    }

    /// True once `/-/ready` answers 200; false if the process exited first.
    async fn until_ready(&self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(_)) = self.child.lock().unwrap().try_wait() {
                return false;
            }
            if let Ok((200, _)) = self.get("/-/ready").await {
                return true;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready after 60 s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Adds a relay's metrics address (`127.0.0.1:PORT`) to the scraped targets.
    pub fn add_target(&self, addr: &str) {
        self.add_target_labelled(addr, &[]);
    }

    /// Adds a relay with target labels of its own, as service discovery gives each deployment
    /// its own (`namespace`, `service`): the alerts aggregate `without (instance, pod)`, so
    /// relays of different tables must differ in some other label.
    pub fn add_target_labelled(&self, addr: &str, labels: &[(&str, &str)]) {
        let mut targets = self.targets.lock().unwrap();
        let labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        targets.push((addr.to_string(), labels));
        self.write_targets(&targets);
    }

    /// No longer scrapes `addr`, as Kubernetes drops a pod that is terminating from its
    /// endpoints.
    pub fn remove_target(&self, addr: &str) {
        let mut targets = self.targets.lock().unwrap();
        targets.retain(|(a, _)| a != addr);
        self.write_targets(&targets);
    }

    /// One target group per target, each with its labels. The file is replaced by a rename, so
    /// Prometheus never reads half of it.
    fn write_targets(&self, targets: &[Target]) {
        let groups: Vec<serde_json::Value> = targets
            .iter()
            .map(|(addr, labels)| {
                let mut all = serde_json::Map::new();
                all.insert("namespace".into(), TARGET_NAMESPACE.into());
                for (k, v) in labels {
                    all.insert(k.clone(), v.clone().into());
                }
                serde_json::json!({ "targets": [addr], "labels": all })
            })
            .collect();
        let tmp = self.dir.join("targets.json.tmp");
        std::fs::write(&tmp, serde_json::Value::Array(groups).to_string())
            .expect("write targets file");
        std::fs::rename(&tmp, self.dir.join("targets.json")).expect("replace targets file");
    }

    pub fn targets(&self) -> Vec<String> {
        let targets = self.targets.lock().unwrap();
        targets.iter().map(|(addr, _)| addr.clone()).collect()
    }

    /// Everything the server has logged so far.
    pub fn log(&self) -> String {
        log_tail(&self.dir.join("prometheus.log"), usize::MAX)
    }

    /// `data` of a successful API answer to `GET /api/v1/{endpoint}?{params}`, or what went
    /// wrong (an HTTP status, or the API's `errorType` and `error`).
    pub async fn api(
        &self,
        endpoint: &str,
        params: &[(&str, &str)],
    ) -> Result<serde_json::Value, String> {
        let query = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish();
        let path = format!("/api/v1/{endpoint}?{query}");
        let (status, body) = self
            .get(&path)
            .await
            .map_err(|e| format!("GET {path}: {e}"))?;
        let answer: serde_json::Value = serde_json::from_str(&body)
            .map_err(|e| format!("GET {path}: HTTP {status}, not JSON ({e}): {body}"))?;
        if answer["status"] != "success" {
            return Err(format!(
                "{}: {}",
                answer["errorType"].as_str().unwrap_or("HTTP error"),
                answer["error"].as_str().unwrap_or(&body)
            ));
        }
        Ok(answer["data"].clone())
    }

    /// The series `expr` returns at `at` (the instant query's `result`), or the API's error.
    pub async fn query(&self, expr: &str, at: f64) -> Result<Vec<serde_json::Value>, String> {
        let at = at.to_string();
        let data = self.api("query", &[("query", expr), ("time", &at)]).await?;
        match data["resultType"].as_str() {
            Some("vector") | Some("matrix") => {
                Ok(data["result"].as_array().cloned().unwrap_or_default())
            }
            // A scalar or string is one value, not a series: no panel or alert wants one.
            other => Err(format!("{expr} returned a {other:?}, not series")),
        }
    }

    /// The series `expr` returns over `[start, end]` every `step` seconds, or the API's error.
    pub async fn query_range(
        &self,
        expr: &str,
        start: f64,
        end: f64,
        step: f64,
    ) -> Result<Vec<serde_json::Value>, String> {
        let (start, end, step) = (start.to_string(), end.to_string(), step.to_string());
        let data = self
            .api(
                "query_range",
                &[
                    ("query", expr),
                    ("start", &start),
                    ("end", &end),
                    ("step", &step),
                ],
            )
            .await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// Waits until the instant query `expr` returns a series; panics naming `what` after
    /// `timeout`, with the last answer and the targets' scrape state.
    pub async fn wait_for_series(&self, what: &str, expr: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let answer = self.query(expr, now()).await;
            if matches!(&answer, Ok(series) if !series.is_empty()) {
                return;
            }
            if Instant::now() >= deadline {
                let targets = self.api("targets", &[]).await;
                panic!(
                    "timed out after {timeout:?} waiting until Prometheus shows {what} \
                     ({expr}): {answer:?}\ntargets: {targets:?}\nlog:\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Status and body of `GET path`.
    async fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        let fetch = async {
            let mut stream = tokio::net::TcpStream::connect(&self.addr).await?;
            // HTTP/1.0: the server closes the connection and the body ends at EOF.
            let request = format!("GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr);
            stream.write_all(request.as_bytes()).await?;
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw).await?;
            std::io::Result::Ok(raw)
        };
        let raw = tokio::time::timeout(Duration::from_secs(30), fetch)
            .await
            .map_err(|_| std::io::Error::new(ErrorKind::TimedOut, "no answer in 30 s"))??;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::new(ErrorKind::InvalidData, text.to_string()))?;
        Ok((status, body.to_string()))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn(dir: &Path, addr: &str) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("prometheus.log"))
        .expect("open prometheus log");
    let mut cmd = Command::new("prometheus");
    cmd.arg(format!(
        "--config.file={}",
        dir.join("prometheus.yml").display()
    ))
    .arg(format!(
        "--storage.tsdb.path={}",
        dir.join("data").display()
    ))
    .arg(format!("--web.listen-address={addr}"))
    .arg("--log.level=warn")
    .current_dir(dir)
    .stdin(Stdio::null())
    .stdout(log.try_clone().expect("dup log fd"))
    .stderr(log);
    match spawn_kept(cmd, libc::SIGKILL) {
        Ok(child) => child,
        Err(e) if e.kind() == ErrorKind::NotFound => panic!(
            "prometheus is not installed (not on PATH): run scripts/test, which installs it \
             (Debian package `prometheus`, the one that brings promtool), or install it yourself"
        ),
        Err(e) => panic!("cannot run prometheus: {e}"),
    }
}

/// Now, in the seconds since the epoch that the API's `time`, `start` and `end` take.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}
