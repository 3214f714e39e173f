//! Just enough HTTP/1.1 to read the requests the relay sends, for the harness's endpoints and
//! those of the benchmarks (the fault proxy in front of the AWS server, the benchmarks' SQS/S3
//! sink and OTLP collector): keep-alive requests with a head and a `Content-Length` body (none
//! is an empty body), as the AWS SDK and the OTLP exporter send them. Chunked bodies are
//! refused rather than misread. The one reader of requests: a second copy drifts.

use std::future::Future;
use std::sync::Arc;

use tokio::io::AsyncReadExt;
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
