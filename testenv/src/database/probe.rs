//! Probes run for real against the pod's address, as the kubelet's prober does
//! (pkg/kubelet/prober/worker.go: one worker per probe, `periodSeconds` apart, the result
//! flips after `successThreshold` / `failureThreshold` consecutive outcomes; pkg/probe/http:
//! a status from 200 to 399 is a success). Periods and initial delays are capped at
//! [`timings::PROBE_PERIOD_MAX`] so tests see readiness within a second.

use std::time::Duration;

use anyhow::{bail, Context};
use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::timings;

/// `GET path` over HTTP/1.1 from `addr` (`host:port`): the status code and the body. A small
/// client for probes and for tests that talk to a database (`/exec?query=...`).
pub async fn http_get(addr: &str, path: &str, timeout: Duration) -> anyhow::Result<(u16, String)> {
    tokio::time::timeout(timeout, get(addr, path))
        .await
        .with_context(|| format!("GET http://{addr}{path}: no answer in {timeout:?}"))?
}

async fn get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let (head_len, status, length, chunked) = loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            bail!("{addr} closed the connection before answering");
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let status = head
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse::<u16>().ok())
                .with_context(|| format!("{addr}: not an HTTP response: {head}"))?;
            let header = |name: &str| {
                head.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim()
                        .eq_ignore_ascii_case(name)
                        .then(|| v.trim().to_string())
                })
            };
            let length = header("content-length").and_then(|l| l.parse::<usize>().ok());
            let chunked = header("transfer-encoding").is_some_and(|t| t.contains("chunked"));
            break (end + 4, status, length, chunked);
        }
    };
    loop {
        let body = &buf[head_len..];
        let complete = match (length, chunked) {
            (Some(l), _) => body.len() >= l,
            (None, true) => dechunk(body).is_some(),
            (None, false) => false,
        };
        if complete {
            break;
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = &buf[head_len..];
    let body = if chunked {
        dechunk(body).unwrap_or_else(|| body.to_vec())
    } else {
        body.to_vec()
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// The body of a complete chunked encoding, `None` while the last chunk has not arrived.
fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = body.windows(2).position(|w| w == b"\r\n")?;
        let size_text = String::from_utf8_lossy(&body[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        body = &body[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        if body.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Startup,
    Readiness,
    Liveness,
}

#[derive(Clone, Debug)]
enum Action {
    Http {
        addr: String,
        path: String,
    },
    Tcp {
        addr: String,
    },
    /// exec and gRPC probes cannot run outside a container: they always succeed.
    Pass,
}

#[derive(Clone, Debug)]
pub(crate) struct Check {
    pub kind: Kind,
    action: Action,
    period: Duration,
    timeout: Duration,
    initial_delay: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl Check {
    /// The container's probes of each kind it declares, aimed at `pod_ip`.
    pub(crate) fn of(container: &Container, pod_ip: &str) -> Vec<Check> {
        [
            (Kind::Startup, &container.startup_probe),
            (Kind::Readiness, &container.readiness_probe),
            (Kind::Liveness, &container.liveness_probe),
        ]
        .into_iter()
        .filter_map(|(kind, p)| p.as_ref().map(|p| Check::new(kind, p, container, pod_ip)))
        .collect()
    }

    fn new(kind: Kind, p: &Probe, container: &Container, pod_ip: &str) -> Check {
        let port = |port: &IntOrString| match port {
            IntOrString::Int(n) => Some(*n),
            IntOrString::String(name) => container
                .ports
                .iter()
                .flatten()
                .find(|cp| cp.name.as_deref() == Some(name.as_str()))
                .map(|cp| cp.container_port),
        };
        let action = if let Some(h) = &p.http_get {
            let host = h
                .host
                .clone()
                .filter(|h| !h.is_empty())
                .unwrap_or(pod_ip.into());
            match port(&h.port) {
                Some(port) if h.scheme.as_deref().unwrap_or("HTTP") == "HTTP" => Action::Http {
                    addr: format!("{host}:{port}"),
                    path: h.path.clone().unwrap_or_else(|| "/".into()),
                },
                Some(port) => Action::Tcp {
                    addr: format!("{host}:{port}"),
                },
                // The kubelet fails such a probe; so does this (nothing listens on port 0).
                None => Action::Tcp {
                    addr: format!("{host}:0"),
                },
            }
        } else if let Some(t) = &p.tcp_socket {
            let host = t
                .host
                .clone()
                .filter(|h| !h.is_empty())
                .unwrap_or(pod_ip.into());
            Action::Tcp {
                addr: format!("{host}:{}", port(&t.port).unwrap_or(0)),
            }
        } else {
            Action::Pass
        };
        let secs =
            |s: Option<i32>, default: i32| Duration::from_secs(s.unwrap_or(default).max(0) as u64);
        Check {
            kind,
            action,
            period: secs(p.period_seconds, 10).min(timings::PROBE_PERIOD_MAX),
            timeout: secs(p.timeout_seconds, 1).max(Duration::from_secs(1)),
            initial_delay: secs(p.initial_delay_seconds, 0).min(timings::PROBE_PERIOD_MAX),
            success_threshold: p.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: p.failure_threshold.unwrap_or(3).max(1) as u32,
        }
    }

    async fn run(&self) -> bool {
        match &self.action {
            Action::Http { addr, path } => {
                matches!(http_get(addr, path, self.timeout).await, Ok((code, _)) if (200..400).contains(&code))
            }
            Action::Tcp { addr } => matches!(
                tokio::time::timeout(self.timeout, tokio::net::TcpStream::connect(addr)).await,
                Ok(Ok(_))
            ),
            Action::Pass => true,
        }
    }
}

/// One worker per check, each sending every outcome until `stop`.
pub(crate) fn spawn(
    checks: Vec<Check>,
    results: UnboundedSender<(Kind, bool)>,
    stop: CancellationToken,
) {
    for check in checks {
        let (results, stop) = (results.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(check.initial_delay) => {}
            }
            loop {
                let ok = tokio::select! {
                    _ = stop.cancelled() => return,
                    ok = check.run() => ok,
                };
                if results.send((check.kind, ok)).is_err() {
                    return;
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(check.period) => {}
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::dechunk;

    #[test]
    fn a_chunked_body_is_complete_only_with_its_last_chunk() {
        assert_eq!(dechunk(b"3\r\nabc\r\n2\r\nde\r\n"), None);
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").as_deref(),
            Some(&b"abcde"[..])
        );
    }
}
