//! Where the control-plane binaries are: built once by `hack/control-plane/build.sh` (and the
//! CSI snapshot-controller by `hack/snapshot-controller/build.sh`) into a cache keyed by the
//! pinned versions, found again on every later run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{bail, Context};

/// Set to a directory holding `etcd`, `kube-apiserver`, `kube-controller-manager` and
/// `kube-scheduler` to use those instead of building.
pub const BIN_DIR_ENV: &str = "QDB_CONTROL_PLANE_BIN";

/// Set to a directory holding `snapshot-controller` and the three `snapshot.storage.k8s.io_*`
/// CRD files to use those instead of building.
pub const SNAPSHOT_DIR_ENV: &str = "QDB_SNAPSHOT_CONTROLLER_DIR";

pub fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/control-plane/build.sh")
}

pub fn snapshot_build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/snapshot-controller/build.sh")
}

/// The directory of the binaries, building them on first use (progress goes to stderr).
pub fn dir() -> anyhow::Result<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        locate(BIN_DIR_ENV, &build_script(), "control plane").map_err(|e| format!("{e:#}"))
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// The directory of the CSI snapshot-controller and its CRDs, building them on first use.
pub fn snapshot_dir() -> anyhow::Result<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        locate(
            SNAPSHOT_DIR_ENV,
            &snapshot_build_script(),
            "snapshot-controller",
        )
        .map_err(|e| format!("{e:#}"))
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// The directory of the CSI snapshot-controller when it is built already (or given), without
/// building it: `None` while its first build has not ended.
pub fn snapshot_dir_if_built() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(SNAPSHOT_DIR_ENV) {
        return Some(PathBuf::from(dir));
    }
    let out = Command::new("bash")
        .arg(snapshot_build_script())
        .arg("--if-built")
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| printed_dir(&out.stdout))
        .flatten()
}

/// The directory a build script prints on its last line.
fn printed_dir(stdout: &[u8]) -> Option<PathBuf> {
    String::from_utf8_lossy(stdout)
        .lines()
        .last()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(PathBuf::from)
}

fn locate(env: &str, script: &Path, what: &str) -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os(env) {
        return Ok(PathBuf::from(dir));
    }
    let out = Command::new("bash")
        .arg(script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{what}: {} failed ({}); the line above says why",
            script.display(),
            out.status
        );
    }
    printed_dir(&out.stdout)
        .with_context(|| format!("{what}: {} printed no directory", script.display()))
}

/// Whether a Go toolchain is on the PATH, or both sets of binaries are given: the sandbox needs
/// one or the other.
pub fn go_available() -> bool {
    (std::env::var_os(BIN_DIR_ENV).is_some() && std::env::var_os(SNAPSHOT_DIR_ENV).is_some())
        || Command::new("go")
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
}
