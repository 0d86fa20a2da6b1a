//! A pgwire login and nothing more: whether the database accepts a user and password now. The
//! only way to know a rotated password took, since `SHOW PARAMETERS` masks passwords.
//!
//! PostgreSQL's frontend/backend protocol 3.0 ("Message Flow", "Start-up"): a StartupMessage,
//! the server's AuthenticationCleartextPassword (QuestDB 9.2.0 asks for cleartext, checked), a
//! PasswordMessage, then AuthenticationOk or an ErrorResponse ("invalid username/password").

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Protocol version 3.0.
const PROTOCOL: i32 = 196_608;
/// No server message of a login is near this: a larger length is not a pgwire server.
const MAX_MESSAGE: usize = 64 * 1024;

/// Whether `user` logs in with `password` at `addr` within `limit`: `Ok(false)` is a refusal,
/// `Err` anything else (unreachable, timed out, not pgwire, an authentication method other
/// than a cleartext password).
pub(crate) async fn logs_in(
    addr: SocketAddr,
    user: &str,
    password: &str,
    limit: Duration,
) -> std::io::Result<bool> {
    tokio::time::timeout(limit, attempt(addr, user, password))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "pgwire login timed out"))?
}

async fn attempt(addr: SocketAddr, user: &str, password: &str) -> std::io::Result<bool> {
    let mut stream = TcpStream::connect(addr).await?;
    let mut startup = PROTOCOL.to_be_bytes().to_vec();
    for part in ["user", user, "database", "qdb"] {
        startup.extend_from_slice(part.as_bytes());
        startup.push(0);
    }
    startup.push(0);
    stream.write_all(&framed(None, &startup)).await?;
    match read_message(&mut stream).await? {
        (b'R', body) if auth_code(&body) == Some(3) => {}
        (b'R', body) if auth_code(&body) == Some(0) => return Ok(true),
        (b'E', _) => return Ok(false),
        (kind, _) => return Err(unexpected(kind)),
    }
    let mut secret = password.as_bytes().to_vec();
    secret.push(0);
    stream.write_all(&framed(Some(b'p'), &secret)).await?;
    let accepted = match read_message(&mut stream).await? {
        (b'R', body) if auth_code(&body) == Some(0) => true,
        (b'E', _) => false,
        (kind, _) => return Err(unexpected(kind)),
    };
    if accepted {
        // Terminate: the session ends without an error in the database's log.
        let _ = stream.write_all(&framed(Some(b'X'), &[])).await;
    }
    Ok(accepted)
}

fn framed(kind: Option<u8>, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 5);
    out.extend(kind);
    out.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

async fn read_message(stream: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let kind = stream.read_u8().await?;
    let len = stream.read_i32().await?;
    let len = usize::try_from(len)
        .ok()
        .filter(|l| (4..=MAX_MESSAGE).contains(l))
        .ok_or_else(|| unexpected(kind))?;
    let mut body = vec![0; len - 4];
    stream.read_exact(&mut body).await?;
    Ok((kind, body))
}

fn auth_code(body: &[u8]) -> Option<i32> {
    Some(i32::from_be_bytes(body.get(..4)?.try_into().ok()?))
}

fn unexpected(kind: u8) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("not a pgwire cleartext login (message {:?})", kind as char),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A server that asks for a cleartext password and accepts only `right`.
    async fn server(right: &'static str) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let len = s.read_i32().await.unwrap() as usize;
                    let mut startup = vec![0; len - 4];
                    s.read_exact(&mut startup).await.unwrap();
                    s.write_all(&framed(Some(b'R'), &3i32.to_be_bytes()))
                        .await
                        .unwrap();
                    let (_, body) = read_message(&mut s).await.unwrap();
                    let answer = if body == format!("{right}\0").as_bytes() {
                        framed(Some(b'R'), &0i32.to_be_bytes())
                    } else {
                        framed(Some(b'E'), b"SERROR\0Minvalid username/password\0\0")
                    };
                    s.write_all(&answer).await.unwrap();
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn the_right_password_logs_in_and_a_wrong_one_is_refused() {
        let addr = server("new").await;
        let limit = Duration::from_secs(5);
        assert!(logs_in(addr, "admin", "new", limit).await.unwrap());
        assert!(!logs_in(addr, "admin", "old", limit).await.unwrap());
    }

    #[tokio::test]
    async fn a_silent_or_foreign_server_is_an_error_not_a_refusal() {
        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap();
        let e = logs_in(addr, "admin", "x", Duration::from_millis(200))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);

        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = http.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = http.accept().await.unwrap();
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        });
        let e = logs_in(addr, "admin", "x", Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    }
}
