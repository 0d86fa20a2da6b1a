//! Talks to a running QuestDB over its HTTP API (`/exec`), authenticated with the database's
//! own HTTP credentials: checkpoints for backups and the facts a backup records.
//!
//! QuestDB answers `/exec` with JSON: `{"columns":[{"name":..}],"dataset":[[..]]}` for a query,
//! `{"ddl":"OK"}` for a statement, and `{"error":"..","position":N}` for a refused one (with
//! HTTP 400, or 200 for some statements: the body decides, not the status).

use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine as _;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::Deserialize;

use crate::api::TableFacts;

/// How long one request may take, connect included. QuestDB answers the operator's queries
/// (metadata, counts on the designated timestamp, checkpoint status) in milliseconds; a
/// database that takes longer is slow or hostile, and the operator's workers are shared.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read: the operator's queries return a row per table at most. A database
/// (any image a tenant chose) answering with an endless body is cut off here, never buffered
/// into the operator's memory.
pub(crate) const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// At most this many tables are counted for a backup's record.
pub(crate) const MAX_TABLES_RECORDED: usize = 64;

/// A QuestDB's HTTP endpoint and the basic-auth login it requires.
#[derive(Clone)]
pub struct Database {
    addr: SocketAddr,
    authorization: Option<String>,
}

impl std::fmt::Debug for Database {
    // Never the credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("addr", &self.addr)
            .field("authenticated", &self.authorization.is_some())
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("cannot reach the database at {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the database did not answer within {0:?}")]
    Timeout(Duration),
    #[error("HTTP error talking to the database: {0}")]
    Http(String),
    #[error("the database refused the login (HTTP {0})")]
    Unauthorized(u16),
    #[error("the database refused `{query}`: {message}")]
    Refused { query: String, message: String },
    #[error("the database's answer is larger than {MAX_BODY_BYTES} bytes")]
    TooLarge,
    #[error("unexpected answer from the database (HTTP {status}): {body}")]
    Unexpected { status: u16, body: String },
}

/// The rows of a query, as JSON values.
#[derive(Debug, Default, Deserialize)]
pub struct Rows {
    #[serde(default)]
    pub columns: Vec<Column>,
    #[serde(default)]
    pub dataset: Vec<Vec<serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
pub struct Column {
    pub name: String,
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    error: Option<String>,
    #[serde(flatten)]
    rows: Rows,
}

/// The HTTP user and password of a credentials Secret (never printed).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Login {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl Login {
    /// `QDB_HTTP_USER` and `QDB_HTTP_PASSWORD` of a credentials Secret.
    pub(crate) fn from_secret(secret: &k8s_openapi::api::core::v1::Secret) -> Option<Login> {
        let data = secret.data.as_ref()?;
        let get = |k: &str| Some(String::from_utf8_lossy(&data.get(k)?.0).into_owned());
        Some(Login {
            user: get(crate::desired::credentials::HTTP_USER)?,
            password: get(crate::desired::credentials::HTTP_PASSWORD)?,
        })
    }
}

impl Database {
    /// The database's HTTP endpoint at `addr`, with `login` when it requires one.
    pub(crate) fn at(addr: SocketAddr, login: Option<&Login>) -> Self {
        Self::new(addr, login.map(|l| (l.user.as_str(), l.password.as_str())))
    }

    pub fn new(addr: SocketAddr, login: Option<(&str, &str)>) -> Self {
        let authorization = login.map(|(user, password)| {
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            format!("Basic {token}")
        });
        Self {
            addr,
            authorization,
        }
    }

    /// Where it is asked.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Runs one statement or query through `/exec`.
    pub(crate) async fn exec(&self, query: &str) -> Result<Rows, QueryError> {
        self.exec_within(query, REQUEST_TIMEOUT).await
    }

    /// [`Database::exec`] with a time limit of the caller's choosing (a statement that syncs
    /// the database's files takes longer than a query).
    pub async fn exec_within(&self, query: &str, limit: Duration) -> Result<Rows, QueryError> {
        let request = self.request(query);
        let (status, body) = tokio::time::timeout(limit, self.send(request))
            .await
            .map_err(|_| QueryError::Timeout(limit))??;
        if status == 401 || status == 403 {
            return Err(QueryError::Unauthorized(status));
        }
        match serde_json::from_slice::<Answer>(&body) {
            Ok(Answer {
                error: Some(message),
                ..
            }) => Err(QueryError::Refused {
                query: query.to_string(),
                message,
            }),
            Ok(Answer { rows, .. }) if status < 300 => Ok(rows),
            _ => Err(QueryError::Unexpected {
                status,
                body: String::from_utf8_lossy(&body).chars().take(200).collect(),
            }),
        }
    }

    fn request(&self, query: &str) -> http::Request<Empty<Bytes>> {
        let uri = format!("/exec?query={}", percent_encode(query));
        let mut builder = http::Request::get(uri).header(http::header::HOST, self.addr.to_string());
        if let Some(auth) = &self.authorization {
            builder = builder.header(http::header::AUTHORIZATION, auth);
        }
        builder.body(Empty::new()).expect("a valid request")
    }

    async fn send(&self, request: http::Request<Empty<Bytes>>) -> Result<(u16, Bytes), QueryError> {
        let stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|source| QueryError::Connect {
                addr: self.addr,
                source,
            })?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| QueryError::Http(e.to_string()))?;
        let driver = tokio::spawn(connection);
        let result = async {
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| QueryError::Http(e.to_string()))?;
            let status = response.status().as_u16();
            let body = http_body_util::Limited::new(response.into_body(), MAX_BODY_BYTES)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        QueryError::TooLarge
                    } else {
                        QueryError::Http(e.to_string())
                    }
                })?
                .to_bytes();
            Ok((status, body))
        }
        .await;
        driver.abort();
        result
    }

    /// `CHECKPOINT CREATE`, waiting up to `limit` for its answer (it syncs the database's
    /// files first). QuestDB refuses a second one until RELEASE. Only its successful answer says
    /// the checkpoint is complete: `checkpoint_status()` reports it from its start.
    pub(crate) async fn checkpoint_create(&self, limit: Duration) -> Result<(), QueryError> {
        self.exec_within("CHECKPOINT CREATE", limit).await.map(drop)
    }

    /// `CHECKPOINT RELEASE`; a release without an open checkpoint is accepted.
    pub(crate) async fn checkpoint_release(&self) -> Result<(), QueryError> {
        self.exec("CHECKPOINT RELEASE").await.map(drop)
    }

    /// The open checkpoint's `started_at` (the database's clock, as it reports it), or `None`
    /// when none is open, from `checkpoint_status()`: the only thing that tells one checkpoint
    /// from another.
    pub(crate) async fn checkpoint_started_at(&self) -> Result<Option<String>, QueryError> {
        let rows = self
            .exec("select in_progress, started_at from checkpoint_status()")
            .await?;
        let row = rows.dataset.first();
        let open = row
            .and_then(|r| r.first())
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false);
        Ok(open.then(|| {
            row.and_then(|r| r.get(1))
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string()
        }))
    }

    /// The QuestDB version the database reports (`build()`: "Build Information: QuestDB 9.2.0,
    /// JDK ..."), `None` when its answer names none.
    pub(crate) async fn version(&self) -> Result<Option<String>, QueryError> {
        let rows = self.exec("select build()").await?;
        let text = rows
            .dataset
            .first()
            .and_then(|r| r.first())
            .and_then(|v| v.as_str())
            .unwrap_or("");
        Ok(parse_version(text))
    }

    /// Row count and newest designated timestamp of each table (the first
    /// [`MAX_TABLES_RECORDED`] by name).
    pub(crate) async fn table_facts(&self) -> Result<Vec<TableFacts>, QueryError> {
        let mut facts = Vec::new();
        for (name, ts) in self.tables().await?.into_iter().take(MAX_TABLES_RECORDED) {
            facts.push(self.table_fact(&name, ts.as_deref()).await?);
        }
        Ok(facts)
    }

    /// Every table's name and designated timestamp column, by name.
    pub(crate) async fn tables(&self) -> Result<Vec<(String, Option<String>)>, QueryError> {
        let tables = self
            .exec("select table_name, designatedTimestamp from tables() order by table_name")
            .await?;
        Ok(tables
            .dataset
            .iter()
            .filter_map(|row| {
                let name = row.first()?.as_str()?.to_string();
                let ts = row
                    .get(1)
                    .and_then(|v| v.as_str())
                    .filter(|s| !s.is_empty())
                    .map(str::to_string);
                Some((name, ts))
            })
            .collect())
    }

    /// One table's row count and newest designated timestamp (`ts`: its column).
    pub(crate) async fn table_fact(
        &self,
        name: &str,
        ts: Option<&str>,
    ) -> Result<TableFacts, QueryError> {
        let query = match ts {
            Some(ts) => format!(
                "select count(), max({}) from {}",
                quote_ident(ts),
                quote_ident(name)
            ),
            None => format!("select count() from {}", quote_ident(name)),
        };
        let rows = self.exec(&query).await?;
        let first = rows.dataset.first();
        Ok(TableFacts {
            name: name.to_string(),
            rows: first
                .and_then(|r| r.first())
                .and_then(serde_json::Value::as_i64)
                .unwrap_or(0),
            max_timestamp: first
                .and_then(|r| r.get(1))
                .and_then(|v| v.as_str())
                .map(str::to_string),
        })
    }

    /// `select reload_config()`: QuestDB re-reads `server.conf` and applies what it can reload;
    /// true when it found something to apply.
    pub(crate) async fn reload_config(&self) -> Result<bool, QueryError> {
        let rows = self.exec("select reload_config()").await?;
        Ok(rows
            .dataset
            .first()
            .and_then(|r| r.first())
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false))
    }

    /// The `SHOW PARAMETERS` rows of `keys` (keys the version does not know are not there).
    pub(crate) async fn parameters(
        &self,
        keys: &[&str],
    ) -> Result<Vec<crate::desired::reload::Parameter>, QueryError> {
        let list = keys
            .iter()
            .map(|k| format!("'{}'", k.replace('\'', "''")))
            .collect::<Vec<_>>()
            .join(",");
        let rows = self
            .exec(&format!(
                "select property_path, value, value_source, sensitive, reloadable from (show parameters) where property_path in ({list})"
            ))
            .await?;
        let text = |v: Option<&serde_json::Value>| {
            v.and_then(|v| v.as_str()).unwrap_or_default().to_string()
        };
        let flag =
            |v: Option<&serde_json::Value>| v.and_then(serde_json::Value::as_bool).unwrap_or(false);
        Ok(rows
            .dataset
            .iter()
            .map(|r| crate::desired::reload::Parameter {
                key: text(r.first()),
                value: text(r.get(1)),
                source: text(r.get(2)),
                sensitive: flag(r.get(3)),
                reloadable: flag(r.get(4)),
            })
            .collect())
    }
}

/// The version in `build()`'s answer: the word after "QuestDB", up to a comma or space.
fn parse_version(build: &str) -> Option<String> {
    let rest = build.split("QuestDB ").nth(1)?;
    let version: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '-')
        .collect();
    (!version.is_empty()).then_some(version)
}

impl Database {
    /// `ALTER TABLE ... RESUME WAL`: a suspended table takes writes and applies its WAL again.
    pub(crate) async fn resume_wal(&self, table: &str) -> Result<(), QueryError> {
        self.exec(&format!("ALTER TABLE {} RESUME WAL", quote_ident(table)))
            .await
            .map(|_| ())
    }
}

/// A double-quoted identifier (QuestDB doubles an embedded quote).
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// RFC 3986 percent-encoding of a query-string value: everything but the unreserved set.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_read_from_builds_answer() {
        assert_eq!(
            parse_version("Build Information: QuestDB 9.2.0, JDK 17.0.15, Commit Hash abc")
                .as_deref(),
            Some("9.2.0")
        );
        assert_eq!(
            parse_version("Build Information: QuestDB 9.3.0-SNAPSHOT").as_deref(),
            Some("9.3.0-SNAPSHOT")
        );
        assert_eq!(parse_version("something else"), None);
    }

    #[test]
    fn queries_survive_the_url_whatever_they_hold() {
        assert_eq!(
            percent_encode("select count() from \"a b\"&x=1"),
            "select%20count%28%29%20from%20%22a%20b%22%26x%3D1"
        );
        assert_eq!(percent_encode("é"), "%C3%A9");
    }

    #[test]
    fn a_table_name_cannot_break_out_of_its_quotes() {
        assert_eq!(quote_ident("we\"ird"), "\"we\"\"ird\"");
    }

    #[test]
    fn debug_output_never_shows_the_password() {
        let db = Database::new("127.0.0.1:9000".parse().unwrap(), Some(("admin", "s3cret")));
        let shown = format!("{db:?}");
        assert!(!shown.contains("s3cret") && !shown.contains("YWRtaW46czNjcmV0"));
    }

    /// A database server that answers every request with `answer` (raw HTTP), at `addr`.
    async fn hostile(answer: &'static [u8], endless: bool) -> SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = [0u8; 4096];
                    let _ = socket.read(&mut request).await;
                    let _ = socket.write_all(answer).await;
                    // An endless chunked body: a chunk of 64 KiB, forever.
                    let chunk = format!("10000\r\n{}\r\n", "x".repeat(0x10000));
                    while endless && socket.write_all(chunk.as_bytes()).await.is_ok() {}
                    // Silent: the connection stays open, unanswered.
                    let _held = socket;
                    std::future::pending::<()>().await
                });
            }
        });
        addr
    }

    /// The harm: one tenant's image answering `/exec` with an endless body gets the operator
    /// OOM-killed, and with it every database's failover, move, backup and checkpoint release.
    #[tokio::test]
    async fn an_endless_answer_is_cut_off_at_the_body_limit() {
        let addr = hostile(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
            true,
        )
        .await;
        let db = Database::new(addr, None);
        let started = std::time::Instant::now();
        let err = db.exec("select 1").await.expect_err("cut off");
        assert!(matches!(err, QueryError::TooLarge), "{err}");
        assert!(
            started.elapsed() < REQUEST_TIMEOUT,
            "cut at the limit, not the timeout"
        );
    }

    /// The harm: a database that never answers holding a shared worker; it is given up after
    /// the request time limit.
    #[tokio::test(start_paused = true)]
    async fn a_silent_database_is_given_up_after_the_request_limit() {
        let addr = hostile(b"", false).await;
        let db = Database::new(addr, None);
        let err = db.exec("select 1").await.expect_err("given up");
        assert!(
            matches!(err, QueryError::Timeout(d) if d == REQUEST_TIMEOUT),
            "{err}"
        );
    }
}
