//! Child processes of the control plane: each logs to its own file, dies with its owner (also
//! when a test panics or the process is killed), and is waited on with a readiness probe that
//! fails fast, naming the component and its log, when the process exits early.

use std::fs::File;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

pub struct Component {
    pub name: &'static str,
    pub log: PathBuf,
    child: Child,
}

impl Component {
    pub fn spawn(
        name: &'static str,
        binary: &Path,
        args: &[String],
        dir: &Path,
    ) -> anyhow::Result<Component> {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let mut cmd = Command::new(binary);
        cmd.args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                // The child goes when the thread that spawned it does, even after SIGKILL of
                // the test process; Drop handles the orderly cases.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("{name}: cannot start {}", binary.display()))?;
        Ok(Component { name, log, child })
    }

    /// Polls `probe` until it is true; errors at once if the process exits, or at `timeout`.
    pub async fn wait_ready<F, Fut>(
        &mut self,
        timeout: Duration,
        mut probe: F,
    ) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited early ({status}); log {}:\n{}",
                    self.name,
                    self.log.display(),
                    tail(&self.log, 15)
                );
            }
            if probe().await {
                return Ok(());
            }
            if started.elapsed() > timeout {
                bail!(
                    "{} not ready after {timeout:?}; log {}:\n{}",
                    self.name,
                    self.log.display(),
                    tail(&self.log, 15)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of a log file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A free loopback port (bound, then released: a component binds it right after).
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("no free loopback port")?;
    Ok(l.local_addr()?.port())
}
