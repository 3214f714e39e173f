//! Just enough HTTP/1.1 to read the requests the relay sends, for the harness's endpoints and
//! those of the benchmarks (the fault proxy in front of the AWS server, the benchmarks' SQS/S3
//! sink and OTLP collector): keep-alive requests with a head and a `Content-Length` body (none
//! is an empty body), as the AWS SDK and the OTLP exporter send them. Chunked bodies are
//! refused rather than misread. The one reader of requests: a second copy drifts.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Request heads larger than this are refused; the clients' are well under 2 KiB.
const MAX_HEAD: usize = 16 * 1024;

/// What an endpoint needs of a request's head.
pub struct Head {
    /// The request line and headers as sent, without the blank line after them.
    pub raw: String,
    /// `POST`, `PUT`, ...
    pub method: String,
    /// The request target, e.g. `/v1/traces` or an S3 object key.
    pub path: String,
    /// `X-Amz-Target` (SQS's JSON protocol names the operation there), or empty.
    pub target: String,
    /// `Content-Length`: how much body to read before answering.
    pub content_length: usize,
}

/// Accepts connections until aborted, each served by `serve` on a task of its own with the
/// endpoint's shared `state`. No Nagle delay: answers are small and go at once.
pub fn accept_all<S, F>(
    listener: TcpListener,
    state: Arc<S>,
    serve: fn(TcpStream, Arc<S>) -> F,
) -> JoinHandle<()>
where
    S: Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(serve(stream, Arc::clone(&state)));
        }
    })
}

/// The next request read into `buf` (reading `chunk` bytes at a time): its head, and where its
/// body lies in `buf` (`head_len..head_len + content_length`; the caller drains both after
/// answering). `Ok(None)`: the client closed the connection; `Err(())`: a malformed or
/// oversized head, which the caller answers with a 400 and a close.
pub async fn next_request(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    chunk: usize,
) -> Result<Option<(Head, usize)>, ()> {
    let (head, head_len) = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4) {
            break (parse_head(&buf[..end]).ok_or(())?, end);
        }
        if buf.len() > MAX_HEAD {
            return Err(());
        }
        if !read_more(stream, buf, chunk).await {
            return Ok(None);
        }
    };
    while buf.len() < head_len + head.content_length {
        if !read_more(stream, buf, chunk).await {
            return Ok(None);
        }
    }
    Ok(Some((head, head_len)))
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>, chunk: usize) -> bool {
    let start = buf.len();
    buf.resize(start + chunk, 0);
    match stream.read(&mut buf[start..]).await {
        Ok(0) | Err(_) => {
            buf.truncate(start);
            false
        }
        Ok(n) => {
            buf.truncate(start + n);
            true
        }
    }
}

fn parse_head(head: &[u8]) -> Option<Head> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_string();
    let path = request_line.next()?.to_string();
    let raw = text.trim_end_matches("\r\n").to_string();
    let mut length = None;
    let mut target = String::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse().ok();
        } else if name.eq_ignore_ascii_case("x-amz-target") {
            target = value.to_string();
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return None;
        }
    }
    Some(Head {
        raw,
        method,
        path,
        target,
        content_length: length.unwrap_or(0),
    })
}

/// One HTTP/1.1 request as a client, the connection closed after it: status, head and body
/// (the console's tests and benchmark). A form body is sent url-encoded.
pub async fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let fetch = async {
        let mut stream = TcpStream::connect(addr).await?;
        let mut text = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            text.push_str(&format!("Host: {addr}\r\n"));
        }
        for (k, v) in headers {
            text.push_str(&format!("{k}: {v}\r\n"));
        }
        if method == "POST" {
            text.push_str("Content-Type: application/x-www-form-urlencoded\r\nContent-Length: ");
            text.push_str(&format!("{}\r\n", body.len()));
        }
        text.push_str("\r\n");
        text.push_str(body);
        stream.write_all(text.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        std::io::Result::Ok(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(20), fetch)
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer in 20 s"))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: bad response {text:?}"));
    (status, head.to_string(), body.to_string())
}
