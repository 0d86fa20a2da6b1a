//! A newcomer's first run: the sandbox starts the control plane, the operator and the example
//! QuestDB (a real one when Java is installed) and stops once it is Ready. Nothing on the way
//! may read as a failure: a WARN or ERROR line means someone should look, and a normal start
//! gives nobody anything to look at.

use std::process::Command;

#[test]
fn a_normal_sandbox_start_prints_no_warning_or_error() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("sandbox.kubeconfig");
    let out = Command::new(env!("CARGO_BIN_EXE_questdb-sandbox"))
        .current_dir(root)
        .args(["--exit-when-ready", "--metrics-bind-address", "0"])
        .args(["--health-probe-bind-address", "0"])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .output()
        .expect("the sandbox runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("is Ready"),
        "the sandbox did not reach Ready\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    let plain = without_colours(&format!("{stderr}\n{stdout}"));
    let loud: Vec<&str> = plain
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(
        loud.is_empty(),
        "{} WARN/ERROR lines in a normal start:\n{}",
        loud.len(),
        loud.join("\n")
    );
}

/// The log with its ANSI colour sequences (`ESC [ ... m`) removed.
fn without_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}
