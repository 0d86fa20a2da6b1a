//! moto (a local AWS API emulator) as a child process on 127.0.0.1, for tests that talk to
//! EC2 and Route53 through the real AWS SDK.
//!
//! moto_server comes from `$MOTO_SERVER` or `<repo>/.venv/bin/moto_server` (`bash .ci/moto.sh
//! install`). Without it a test fails, unless `SKIP_MOTO=1`. Each server gets a free loopback
//! port, is reset before use, and is killed on drop (also when a test panics).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct Moto {
    child: Child,
    pub port: u16,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("MOTO_SERVER") {
        let path = PathBuf::from(path);
        return path.exists().then_some(path);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/moto_server");
    venv.exists().then_some(venv)
}

impl Moto {
    /// A fresh moto, or `None` when it is absent and `SKIP_MOTO=1` says that is acceptable.
    /// AMI and instance type validation are on, as AWS validates both.
    pub async fn start() -> Option<Moto> {
        let Some(binary) = binary() else {
            if std::env::var("SKIP_MOTO").as_deref() == Ok("1") {
                eprintln!("SKIP_MOTO=1 and no moto_server: skipping");
                return None;
            }
            panic!(
                "moto_server not found: run `bash .ci/moto.sh install` (creates .venv) or set \
                 MOTO_SERVER=/path/to/moto_server; set SKIP_MOTO=1 to skip these tests"
            );
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free loopback port")
            .port();
        let child = Command::new(&binary)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("MOTO_ENABLE_AMI_VALIDATION", "true")
            .env("MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION", "true")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let mut moto = Moto { child, port };
        // Wait for readiness (moto's imports take seconds on a busy machine), bounded.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if http(port, "GET", "/moto-api/")
                .await
                .is_ok_and(|s| s == 200)
            {
                break;
            }
            if let Ok(Some(status)) = moto.child.try_wait() {
                panic!("moto_server exited early: {status}");
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "moto_server did not answer on port {port} within 60s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        moto.reset().await;
        Some(moto)
    }

    /// `http://127.0.0.1:<port>`, for `--aws-endpoint-url`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `POST /moto-api/reset`: forget every resource, so a test sees a fresh account.
    pub async fn reset(&mut self) {
        let status = http(self.port, "POST", "/moto-api/reset")
            .await
            .expect("reset");
        assert_eq!(status, 200, "moto reset");
    }
}

/// Minimal HTTP/1.1 request without a body; returns the status code.
async fn http(port: u16, method: &str, path: &str) -> std::io::Result<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "moto answer"))??;
    let head = String::from_utf8_lossy(&response);
    head.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no status line"))
}
