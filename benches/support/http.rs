//! A bare HTTP POST to a database (ILP over HTTP), read only as far as its answer's head.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// POSTs `body` to `addr` (`host:port`) with `authorization` as the header when given; the
/// answer's status code and its head. The status line is the acknowledgement: QuestDB may keep
/// the connection open after it, so nothing past the head is waited for, and each read waits
/// `answer_within` at most.
pub async fn post(
    addr: &str,
    path: &str,
    authorization: Option<&str>,
    body: &str,
    answer_within: Duration,
) -> anyhow::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(answer_within, stream.read(&mut chunk)).await??;
        anyhow::ensure!(n > 0, "connection closed before an answer");
        answer.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_default();
    Ok((code, text))
}
