//! The kubectl scenario scripts in `e2e/` against the `questdb-sandbox` binary (on the real
//! control plane when Go is available):
//! what a user does by hand, checked on every CI run.

use std::process::Command;

#[test]
fn e2e_scenarios_pass_against_the_sandbox() {
    if Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        // kubectl is part of the machine image; without it there is nothing to drive.
        eprintln!("kubectl not found: skipping the e2e scenarios");
        return;
    }
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
    // The sandbox-only scenario ran, not skipped.
    assert!(
        stdout.contains("ok: node faults"),
        "the node-fault scenario did not run\n--- stdout\n{stdout}"
    );
}
