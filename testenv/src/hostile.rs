//! A tenant's image that turns its database port against the operator: a pod of
//! [`ENDLESS_ANSWER_IMAGE`] answers every HTTP request on the database's HTTP port with a `200`
//! whose chunked body never ends (what a malicious or broken image can do; the operator reads
//! the answers of `/exec` and `/status`). The stand-in kubelet serves it on the pod's address
//! once the pod runs; the counters say how much the operator asked for and was sent.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{debug, warn};

/// The image whose pods answer without end.
pub const ENDLESS_ANSWER_IMAGE: &str = "hostile.questdb.test/endless-answer";

/// QuestDB's HTTP port, where the operator asks (`http.net.bind.to`).
const HTTP_PORT: u16 = 9000;
/// One chunk of the endless body.
const CHUNK: usize = 64 * 1024;
/// The most of a request read before answering (the operator's are a few hundred bytes).
const REQUEST_MAX: usize = 64 * 1024;

static REQUESTS: AtomicU64 = AtomicU64::new(0);
static BYTES_SENT: AtomicU64 = AtomicU64::new(0);

/// Requests the endless pods of this process have answered.
pub fn requests_answered() -> u64 {
    REQUESTS.load(Ordering::Relaxed)
}

/// Body bytes they have sent (what a client that never stops reading would have to hold).
pub fn bytes_sent() -> u64 {
    BYTES_SENT.load(Ordering::Relaxed)
}

/// Whether a container image is the endless one (any tag).
pub fn is_endless(image: &str) -> bool {
    image
        .strip_prefix(ENDLESS_ANSWER_IMAGE)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(':') || rest.starts_with('@'))
}

/// Serves the endless answer on `ip`'s HTTP port until the process ends.
pub(crate) fn serve(ip: &str) {
    let addr = format!("{ip}:{HTTP_PORT}");
    tokio::spawn(async move {
        let listener = match tokio::net::TcpListener::bind(&addr).await {
            Ok(l) => l,
            Err(e) => {
                warn!(%addr, error = %e, "endless-answer pod could not listen");
                return;
            }
        };
        debug!(%addr, "endless-answer pod listening");
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(answer(stream));
        }
    });
}

async fn answer(mut stream: tokio::net::TcpStream) {
    // The request's head, then the answer whatever it asked.
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < REQUEST_MAX {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    REQUESTS.fetch_add(1, Ordering::Relaxed);
    let head =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    if stream.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let mut chunk = format!("{CHUNK:x}\r\n").into_bytes();
    chunk.extend(std::iter::repeat_n(b'7', CHUNK));
    chunk.extend_from_slice(b"\r\n");
    // Until the client hangs up: a client without a cap reads for as long as it waits.
    while stream.write_all(&chunk).await.is_ok() {
        BYTES_SENT.fetch_add(CHUNK as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_endless_image_is_endless() {
        assert!(is_endless("hostile.questdb.test/endless-answer:9.2.0"));
        assert!(is_endless("hostile.questdb.test/endless-answer"));
        assert!(!is_endless("hostile.questdb.test/endless-answer-not"));
        assert!(!is_endless("questdb/questdb:9.2.0"));
    }
}
