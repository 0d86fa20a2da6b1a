//! The operator binary as a child process: started with `run`, killed when dropped (also on a
//! panic or an early return) so a failed bench never leaves it behind.

use std::ffi::OsString;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context as _};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Env vars `questdb-operator run` reads that must not leak from the caller's shell into a
/// benchmark (flags win over env, but only for the flags we pass).
const CLEARED_ENV: &[&str] = &[
    "KUBECONFIG",
    "WATCH_NAMESPACE",
    "LEADER_ELECT",
    "QUESTDB_CONCURRENCY",
    "METRICS_BIND_ADDRESS",
    "HEALTH_PROBE_BIND_ADDRESS",
];

/// The operator binary Cargo built alongside this bench (same profile), unless
/// `QUESTDB_OPERATOR_BIN` names another one.
pub fn binary() -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("QUESTDB_OPERATOR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_questdb-operator")));
    if !path.is_file() {
        bail!(
            "operator binary {} not found: build it with `cargo build --bin questdb-operator` \
             or set QUESTDB_OPERATOR_BIN",
            path.display()
        );
    }
    Ok(path)
}

/// A loopback address nobody listens on right now. The operator binds it a moment later; if
/// another process grabs it in between, the readiness wait fails and says so.
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?)
}

/// Where a `questdb-operator run` child talks and listens.
#[derive(Clone, Debug)]
pub struct RunArgs {
    pub kubeconfig: PathBuf,
    pub metrics: SocketAddr,
    pub health: SocketAddr,
    /// `--questdb-concurrency`; the operator's default when `None`.
    pub concurrency: Option<u16>,
}

impl RunArgs {
    /// Both endpoints on free loopback ports.
    pub fn on_free_ports(kubeconfig: PathBuf) -> anyhow::Result<Self> {
        Ok(Self {
            kubeconfig,
            metrics: free_addr()?,
            health: free_addr()?,
            concurrency: None,
        })
    }

    fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "run".into(),
            "--kubeconfig".into(),
            self.kubeconfig.clone().into(),
            "--metrics-bind-address".into(),
            self.metrics.to_string().into(),
            "--health-probe-bind-address".into(),
            self.health.to_string().into(),
        ];
        if let Some(c) = self.concurrency {
            args.push("--questdb-concurrency".into());
            args.push(c.to_string().into());
        }
        args
    }
}

pub struct Operator {
    child: Child,
    log: PathBuf,
}

/// Runs `binary` against the cluster of `kubeconfig_yaml` as a user would, once it answers
/// `/readyz`: the kubeconfig and `operator.log` in a temporary directory kept after the run (so
/// a failure can be investigated), metrics on any free port (not scraped).
pub async fn start_ready(
    binary: &Path,
    kubeconfig_yaml: &str,
    timeout: Duration,
) -> anyhow::Result<Operator> {
    let dir = tempfile::tempdir()
        .context("creating a temporary directory")?
        .keep();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, kubeconfig_yaml).context("writing the kubeconfig")?;
    let args = RunArgs {
        kubeconfig,
        metrics: SocketAddr::from(([127, 0, 0, 1], 0)),
        health: free_addr()?,
        concurrency: None,
    };
    let health = args.health;
    let mut operator = Operator::start(binary, &args, dir.join("operator.log"))?;
    super::wait::until(
        "the operator's /readyz",
        timeout,
        &mut operator,
        || async move { http_get(health, "/readyz").await.is_some() },
    )
    .await?;
    Ok(operator)
}

impl Operator {
    /// Starts `binary run ...`; its stdout and stderr go to `log` (warnings and errors only,
    /// unless `QDB_BENCH_OPERATOR_LOG` gives another `RUST_LOG` filter).
    pub fn start(binary: &Path, args: &RunArgs, log: PathBuf) -> anyhow::Result<Operator> {
        let mut command = Command::new(binary);
        command.args(args.to_args());
        Self::spawn(command, log, false)
    }

    /// Starts `command` as the operator, with the environment [`Operator::start`] gives it: its
    /// stderr goes to `log`, and its stdout too unless `pipe_stdout` (then read it with
    /// [`Operator::take_stdout`]).
    pub fn spawn(
        mut command: Command,
        log: PathBuf,
        pipe_stdout: bool,
    ) -> anyhow::Result<Operator> {
        let out = std::fs::File::create(&log)
            .with_context(|| format!("creating the operator log {}", log.display()))?;
        let err = out.try_clone()?;
        command
            .env(
                "RUST_LOG",
                std::env::var("QDB_BENCH_OPERATOR_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stderr(err);
        if pipe_stdout {
            command.stdout(Stdio::piped());
        } else {
            command.stdout(out);
        }
        for name in CLEARED_ENV {
            command.env_remove(name);
        }
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                // The operator goes with the benchmark however it ends (Ctrl-C, SIGKILL, a
                // panic): Drop covers only the orderly ends.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let program = command.get_program().to_owned();
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", Path::new(&program).display()))?;
        Ok(Operator { child, log })
    }

    /// The child's stdout, once, when [`Operator::spawn`] piped it.
    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.stdout.take()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// An error naming the log when the child has exited.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "the operator exited ({status}); its log is {}",
                self.log.display()
            );
        }
        Ok(())
    }

    pub fn memory(&self) -> anyhow::Result<Memory> {
        Memory::of(self.pid())
    }

    /// Resident memory at rest: read once the operator has had one period of its heap trim
    /// (`runtime::heap`) since the caller saw it go quiet, which hands back what the burst
    /// before freed. A wait of a fixed length on purpose: it measures a steady state, it does
    /// not wait for an event.
    pub async fn memory_at_rest(&mut self) -> anyhow::Result<Memory> {
        tokio::time::sleep(questdb_operator::runtime::heap::TRIM_EVERY + Duration::from_secs(1))
            .await;
        self.ensure_running()?;
        self.memory()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Resident memory of a process, from `/proc/<pid>/status`.
#[derive(Clone, Copy, Debug)]
pub struct Memory {
    /// VmRSS: resident now.
    pub rss_kib: u64,
    /// VmHWM: the peak resident size since the process started.
    pub hwm_kib: u64,
    /// RssAnon: the resident heap, stacks and other anonymous memory (what the caches cost).
    pub anon_kib: u64,
    /// RssFile: resident pages of mapped files, mostly the binary's own code and data.
    pub file_kib: u64,
}

impl Memory {
    pub fn of(pid: u32) -> anyhow::Result<Memory> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("reading /proc/{pid}/status"))?;
        let field = |name: &str| -> anyhow::Result<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
                .with_context(|| format!("no {name} in /proc/{pid}/status"))
        };
        Ok(Memory {
            rss_kib: field("VmRSS:")?,
            hwm_kib: field("VmHWM:")?,
            anon_kib: field("RssAnon:")?,
            file_kib: field("RssFile:")?,
        })
    }
}

/// One plain HTTP GET; the body of a 200 answer, `None` otherwise (also when nobody listens).
///
/// HTTP/1.0 so the server answers without chunked encoding and closes the connection: the body
/// is simply everything after the headers.
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.ok()?;
    let text = String::from_utf8(response).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status_line = head.lines().next()?;
    if status_line.split_whitespace().nth(1) != Some("200") {
        return None;
    }
    Some(body.to_string())
}

/// CPU seconds a process has used (user + system), from `/proc/<pid>/stat`.
pub fn cpu_secs(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis are
    // fixed: state is field 3, utime field 14, stime field 15.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .with_context(|| format!("unreadable /proc/{pid}/stat"))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| -> anyhow::Result<f64> {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .with_context(|| format!("no field {} in /proc/{pid}/stat", i + 3))
    };
    // SAFETY: sysconf only reads a configuration value.
    let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((ticks(11)? + ticks(12)?) / per_sec)
}
