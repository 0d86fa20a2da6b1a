//! The kubectl scenario scripts in `e2e/` against the `questdb-sandbox` binary (on the real
//! control plane when Go is available):
//! what a user does by hand, checked on every CI run.

use std::process::Command;

#[test]
fn e2e_scenarios_pass_against_the_sandbox() {
    // The scenarios are what a user types: without kubectl they cannot run, and a run that
    // skipped them would pass having checked nothing. .ci/test builds kubectl when it is missing.
    let version = Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .expect("kubectl on the PATH (.ci/test builds it when it is missing)");
    assert!(version.status.success(), "kubectl version --client fails");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out = Command::new("bash")
        .arg(format!("{root}/e2e/sandbox.sh"))
        .arg(env!("CARGO_BIN_EXE_questdb-sandbox"))
        .env("E2E_TIMEOUT", "120s")
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("e2e: all scenarios passed"),
        "e2e scenarios failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    // The sandbox-only scenario and the backup one (the sandbox serves snapshots) ran, not
    // skipped.
    assert!(
        stdout.contains("ok: node faults"),
        "the node-fault scenario did not run\n--- stdout\n{stdout}"
    );
    assert!(
        stdout.contains("ok: backup, verify, restore"),
        "the backup scenario did not run\n--- stdout\n{stdout}"
    );
}
