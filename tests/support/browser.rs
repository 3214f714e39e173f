//! Headless Chromium (Debian's package) for the console's tests, driven by
//! tests/console/browser.mjs with playwright-core from .tools: one JSON command a line in, one
//! JSON answer a line out. Blocking I/O on the test's runtime thread, through
//! `block_in_place` (the tests that use it run on the multi-thread runtime).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{json, Value};

use super::{repo_root, spawn_kept};

pub struct Browser {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Browser {
    /// Starts the browser; its first line says it is ready.
    pub fn start() -> Browser {
        let mut cmd = Command::new("node");
        cmd.arg(repo_root().join("tests/console/browser.mjs"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = spawn_kept(cmd, libc::SIGKILL).unwrap_or_else(|e| {
            panic!("node tests/console/browser.mjs (scripts/test installs node, playwright-core and chromium): {e}")
        });
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut browser = Browser {
            child,
            stdin,
            stdout,
        };
        let ready = browser.read();
        assert_eq!(
            ready["ready"],
            json!(true),
            "the browser did not start: {ready}"
        );
        browser
    }

    fn read(&mut self) -> Value {
        let mut line = String::new();
        let n = tokio::task::block_in_place(|| self.stdout.read_line(&mut line))
            .expect("read the browser's answer");
        assert!(n > 0, "the browser exited (its stderr is above)");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("browser said {line:?}: {e}"))
    }

    /// Sends one command and returns its answer; a command the browser could not carry out
    /// fails the test.
    pub fn run(&mut self, command: Value) -> Value {
        let line = format!("{command}\n");
        tokio::task::block_in_place(|| self.stdin.write_all(line.as_bytes()))
            .expect("write to the browser");
        let answer = self.read();
        assert_eq!(answer["ok"], json!(true), "browser {command}: {answer}");
        answer
    }

    /// Loads `url`; returns the HTTP status.
    pub fn goto(&mut self, url: &str) -> u64 {
        self.run(json!({"op": "goto", "url": url}))["status"]
            .as_u64()
            .unwrap_or(0)
    }

    pub fn click(&mut self, selector: &str) {
        self.run(json!({"op": "click", "selector": selector}));
    }

    pub fn fill(&mut self, selector: &str, value: &str) {
        self.run(json!({"op": "fill", "selector": selector, "value": value}));
    }

    /// The visible text of every element `selector` matches.
    pub fn texts(&mut self, selector: &str) -> Vec<String> {
        let answer = self.run(json!({"op": "texts", "selector": selector}));
        answer["texts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|t| t.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The page's visible text.
    pub fn text(&mut self) -> String {
        self.texts("body").join("\n")
    }

    pub fn screenshot(&mut self, path: &std::path::Path) {
        self.run(json!({"op": "shot", "path": path}));
    }

    /// Whether anything ran in the page: the test's marker set, a dialog opened, or a script
    /// the Content-Security-Policy blocked.
    pub fn ran_anything(&mut self) -> (bool, u64, u64) {
        let a = self.run(json!({"op": "pwned"}));
        (
            a["pwned"].as_bool().unwrap_or(true),
            a["dialogs"].as_u64().unwrap_or(u64::MAX),
            a["violations"].as_u64().unwrap_or(u64::MAX),
        )
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.stdin.write_all(b"{\"op\":\"close\"}\n");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
