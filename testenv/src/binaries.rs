//! Where the control-plane binaries are: built once by `hack/control-plane/build.sh` into a
//! cache keyed by the pinned versions, found again on every later run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{bail, Context};

/// Set to a directory holding `etcd`, `kube-apiserver`, `kube-controller-manager` and
/// `kube-scheduler` to use those instead of building.
pub const BIN_DIR_ENV: &str = "QDB_CONTROL_PLANE_BIN";

pub fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/control-plane/build.sh")
}

/// The directory of the binaries, building them on first use (progress goes to stderr).
pub fn dir() -> anyhow::Result<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| locate().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn locate() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV) {
        return Ok(PathBuf::from(dir));
    }
    let script = build_script();
    let out = Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "control plane: {} failed ({}); the line above says why",
            script.display(),
            out.status
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout
        .lines()
        .last()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .context("control plane: build.sh printed no directory")?;
    Ok(PathBuf::from(dir))
}

/// Whether a Go toolchain is on the PATH (the sandbox falls back to the simulator without).
pub fn go_available() -> bool {
    std::env::var_os(BIN_DIR_ENV).is_some()
        || Command::new("go")
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
}
