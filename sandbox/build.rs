//! Starts the one-time Go builds the sandbox's first start needs (the control plane, then the
//! CSI snapshot-controller) in the background as soon as cargo starts on this crate, so they run
//! while the Rust dependencies compile instead of after them. Measured on 2 cores from cold: the
//! Rust build and the control plane's Go build one after the other take about 1,105 s (645 s +
//! 460 s); overlapped, both are done in 788 s. The sandbox, when it starts, finds a build under
//! way (each build.sh takes a lock) and waits for the control plane's with progress lines; the
//! snapshot-controller's it does not wait for (only backups need it): the control plane starts
//! without it and adds it once its build ends. Nothing is started when the binaries are
//! cached, when QDB_CONTROL_PLANE_BIN names them, or without Go.

use std::path::Path;
use std::process::{Command, Stdio};

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let hack = Path::new(&manifest).join("../hack/control-plane");
    // Again only when the pinned versions change, not on every edit of the sandbox.
    println!("cargo:rerun-if-changed={}", hack.join("go.mod").display());
    println!(
        "cargo:rerun-if-changed={}",
        hack.join("kube-controller-manager/main.go").display()
    );
    let snapshot = Path::new(&manifest).join("../hack/snapshot-controller");
    println!(
        "cargo:rerun-if-changed={}",
        snapshot.join("go.mod").display()
    );
    println!("cargo:rerun-if-env-changed=QDB_CONTROL_PLANE_BIN");
    println!("cargo:rerun-if-env-changed=QDB_SANDBOX_NO_EARLY_BUILD");
    if std::env::var_os("QDB_CONTROL_PLANE_BIN").is_some()
        || std::env::var_os("QDB_SANDBOX_NO_EARLY_BUILD").is_some()
    {
        return;
    }
    let go = Command::new("go")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !go.is_ok_and(|s| s.success()) {
        return;
    }
    // One after the other, not side by side: two Go builds on 2 cores beside cargo's would
    // each take as long as both. Not waited for, and their output not on cargo's pipes (cargo
    // would wait for them to close): each build.sh writes its own log and the sandbox reports
    // progress while it waits.
    let scripts = format!(
        "bash '{}' --background; bash '{}' --background",
        hack.join("build.sh").display(),
        snapshot.join("build.sh").display()
    );
    let _ = Command::new("bash")
        .arg("-c")
        .arg(scripts)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}
