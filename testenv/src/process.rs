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

/// Waits for `component` serving on `port`; when it exits because another process took the
/// port between [`free_port`] releasing it and the component binding it (a client's ephemeral
/// port, or another test's control plane: seen under load), it is started again on another
/// port, at most twice. Returns the component and the port it serves on.
pub async fn ready_on_a_free_port<R, P, Fut>(
    mut component: Component,
    mut port: u16,
    timeout: Duration,
    respawn: R,
    probe: P,
) -> anyhow::Result<(Component, u16)>
where
    R: Fn(u16) -> anyhow::Result<Component>,
    P: Fn(u16) -> Fut,
    Fut: Future<Output = bool>,
{
    for attempt in 0.. {
        match component.wait_ready(timeout, || probe(port)).await {
            Ok(()) => return Ok((component, port)),
            Err(e) if attempt < 2 && format!("{e:#}").contains("address already in use") => {
                eprintln!(
                    "{}: port {port} was taken before it bound it; starting it on another",
                    component.name
                );
                port = free_port()?;
                component = respawn(port)?;
            }
            Err(e) => return Err(e),
        }
    }
    unreachable!("the loop returns")
}

/// A free loopback port (bound, then released: a component binds it right after).
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("no free loopback port")?;
    Ok(l.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(dir: &Path, script: &str) -> anyhow::Result<Component> {
        Component::spawn(
            "component",
            Path::new("/bin/sh"),
            &["-c".into(), script.into()],
            dir,
        )
    }

    /// A component whose port was taken before it bound it is started again elsewhere, not
    /// reported as a control plane that cannot start (which failed a whole test under load).
    #[tokio::test]
    async fn a_port_taken_before_the_component_binds_it_is_replaced() {
        let dir = std::env::temp_dir().join(format!("qdb-port-retry-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let taken = free_port().unwrap();
        let first = sh(
            &dir,
            &format!("echo 'failed to listen on 127.0.0.1:{taken}: bind: address already in use'; exit 1"),
        )
        .unwrap();
        let (mut running, port) = ready_on_a_free_port(
            first,
            taken,
            Duration::from_secs(10),
            |_| sh(&dir, "sleep 30"),
            |port| async move { port != taken },
        )
        .await
        .expect("started again on another port");
        assert_ne!(port, taken);
        assert!(running.is_running());
        running.kill();

        // Any other early exit is the component's own failure, reported at once.
        let broken = sh(&dir, "echo 'unknown flag: --nope'; exit 2").unwrap();
        let err = ready_on_a_free_port(
            broken,
            taken,
            Duration::from_secs(10),
            |_| sh(&dir, "sleep 30"),
            |_| async { false },
        )
        .await
        .err()
        .expect("no retry for another failure");
        assert!(format!("{err:#}").contains("unknown flag"), "{err:#}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
