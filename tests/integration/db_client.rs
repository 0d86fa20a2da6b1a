//! Real clients of a real QuestDB, as users reach it: HTTP (`/exec`, ILP over HTTP on
//! `/write`) with or without basic auth, and pgwire through `psql`. Every assertion about data
//! counts rows with `count()`; no client's own "success" is trusted.

use std::time::Duration;

use base64::Engine as _;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// User and password for HTTP basic auth or pgwire.
pub type Login<'a> = Option<(&'a str, &'a str)>;

/// A plain HTTP/1.1 request (`Connection: close`); the status code and body. An error is a
/// connection that failed, not a refused request.
pub async fn http(
    addr: &str,
    method: &str,
    path_and_query: &str,
    login: Login<'_>,
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect"))??;
    let mut request = format!(
        "{method} {path_and_query} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some((user, password)) = login {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        request.push_str(&format!("Authorization: Basic {token}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await?;
    tokio::time::timeout(Duration::from_secs(30), read_response(&mut stream))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "read"))?
}

/// One HTTP/1.1 response: by Content-Length, chunks, or to the end of the connection (QuestDB
/// keeps a connection open after some answers, whatever the request asked).
async fn read_response(stream: &mut TcpStream) -> std::io::Result<(u16, String)> {
    let mut reader = tokio::io::BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let mut body = Vec::new();
    if let Some(len) = header("content-length").and_then(|l| l.parse::<usize>().ok()) {
        body.resize(len, 0);
        reader.read_exact(&mut body).await?;
    } else if header("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).await?;
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0; n + 2];
            reader.read_exact(&mut chunk).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else if code != 204 && code != 304 {
        reader.read_to_end(&mut body).await?;
    }
    Ok((code, String::from_utf8_lossy(&body).to_string()))
}

/// `GET /exec?query=...`: the status code and the JSON body.
pub async fn exec(addr: &str, sql: &str, login: Login<'_>) -> std::io::Result<(u16, String)> {
    let path = format!("/exec?query={}", url_encode(sql));
    http(addr, "GET", &path, login, "").await
}

/// ILP over HTTP: `POST /write`; the status code (204: committed).
pub async fn ilp_http(addr: &str, lines: &str, login: Login<'_>) -> std::io::Result<u16> {
    Ok(http(addr, "POST", "/write", login, lines).await?.0)
}

/// `select count() from <table>`, or None when the query fails (no such table included).
pub async fn count(addr: &str, table: &str, login: Login<'_>) -> Option<i64> {
    let (code, body) = exec(addr, &format!("select count() from {table}"), login)
        .await
        .ok()?;
    if code != 200 {
        return None;
    }
    let json: serde_json::Value = serde_json::from_str(&body).ok()?;
    json["dataset"][0][0].as_i64()
}

/// The value and source (`default`, `conf`, `env`) of one setting, from `SHOW PARAMETERS`.
pub async fn parameter(addr: &str, key: &str, login: Login<'_>) -> Option<(String, String)> {
    let (code, body) = exec(addr, "show parameters", login).await.ok()?;
    if code != 200 {
        return None;
    }
    let json: serde_json::Value = serde_json::from_str(&body).ok()?;
    let columns: Vec<String> = json["columns"]
        .as_array()?
        .iter()
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect();
    let col = |name: &str| columns.iter().position(|c| c == name);
    let (k, v, s) = (col("property_path")?, col("value")?, col("value_source")?);
    json["dataset"].as_array()?.iter().find_map(|row| {
        (row[k].as_str() == Some(key)).then(|| {
            (
                row[v].as_str().unwrap_or_default().to_string(),
                row[s].as_str().unwrap_or_default().to_string(),
            )
        })
    })
}

/// Runs one SQL statement with `psql` over pgwire; stdout, or stderr as the error (a refused
/// login included).
pub async fn psql(
    host: &str,
    port: u16,
    user: &str,
    password: &str,
    sql: &str,
) -> Result<String, String> {
    let out = tokio::process::Command::new("psql")
        .args([
            "-h",
            host,
            "-p",
            &port.to_string(),
            "-U",
            user,
            "-d",
            "qdb",
            "-tA",
            "-c",
            sql,
        ])
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "5")
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("psql could not run (install postgresql-client): {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// ILP over TCP as a client with a JWK does: sends the kid, signs the server's challenge
/// (SHA256withECDSA, DER, base64) and writes `lines`. Returns once the lines are sent: ILP/TCP
/// has no acknowledgement, so a refused key "succeeds" too, which is why tests count rows.
pub async fn ilp_tcp(
    addr: &str,
    key: Option<&questdb_operator::ilp_auth::testing::TestKey>,
    lines: &str,
) -> std::io::Result<()> {
    let mut stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect"))??;
    if let Some(key) = key {
        stream
            .write_all(format!("{}\n", key.kid).as_bytes())
            .await?;
        let mut challenge = Vec::new();
        let mut byte = [0u8; 1];
        loop {
            // QuestDB sends no challenge for a kid it does not know (and closes later): the
            // client's lines then go nowhere, as a real client's would.
            let Ok(read) =
                tokio::time::timeout(Duration::from_secs(10), stream.read(&mut byte)).await
            else {
                break;
            };
            if read? == 0 || byte[0] == b'\n' {
                break;
            }
            challenge.push(byte[0]);
        }
        let signature = sign(key, &challenge);
        // A refused client may find the connection closed already: no error, as for a real one.
        let _ = stream.write_all(format!("{signature}\n").as_bytes()).await;
    }
    if stream.write_all(lines.as_bytes()).await.is_err() {
        return Ok(());
    }
    let _ = stream.flush().await;
    // A server that refused the key closes the connection; one that accepted commits the rows
    // on its commit interval or when the connection ends.
    let _ = stream.shutdown().await;
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
    Ok(())
}

fn sign(key: &questdb_operator::ilp_auth::testing::TestKey, challenge: &[u8]) -> String {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
    let d = URL_SAFE_NO_PAD.decode(&key.d).expect("d is base64url");
    let mut public = vec![4u8];
    public.extend(URL_SAFE_NO_PAD.decode(&key.x).expect("x is base64url"));
    public.extend(URL_SAFE_NO_PAD.decode(&key.y).expect("y is base64url"));
    let rng = ring::rand::SystemRandom::new();
    let pair = EcdsaKeyPair::from_private_key_and_public_key(
        &ECDSA_P256_SHA256_ASN1_SIGNING,
        &d,
        &public,
        &rng,
    )
    .expect("a valid P-256 key");
    let sig = pair.sign(&rng, challenge).expect("signing works");
    STANDARD.encode(sig.as_ref())
}

/// Every WAL table named `table` has applied what its sequencer took and is not suspended: rows
/// acknowledged before are now readable.
pub async fn wal_applied(addr: &str, table: &str, login: Option<(&str, &str)>) -> bool {
    exec(
        addr,
        "select * from wal_tables() where writerTxn = sequencerTxn and not suspended",
        login,
    )
    .await
    .is_ok_and(|(code, body)| code == 200 && body.contains(table))
}
