//! One QuestDB process: `java` with the server's module from the jar, small heaps, its output
//! in a log file, in a process group of its own (signals reach anything it starts), killed
//! with its owner: on drop (`kill_on_drop`), and by the kernel when the thread that started it
//! goes (`PR_SET_PDEATHSIG`), also when the test process is SIGKILLed.

use std::path::{Path, PathBuf};
use std::process::Stdio;

/// The JVM flags of a test-sized QuestDB: about 285 MB RSS. The heap is 256 MiB, not 96: 9.2.0
/// holds ~93 MiB of live heap right after start (`-Xlog:gc`: full GCs at 92M->92M with a
/// 96 MiB heap), so the pgwire context pool the shared network worker fills at start failed
/// with an OutOfMemoryError now and then; the worker died (the log shows only the NPE of the
/// constructor's cleanup), the health port stayed Ready, and 9000/8812 never answered.
const JVM_FLAGS: &[&str] = &[
    "-Xms32m",
    "-Xmx256m",
    "-XX:MaxDirectMemorySize=64m",
    "-XX:+UseSerialGC",
];

/// The official image's variable for extra JVM options (questdb/questdb
/// `docker/docker-entrypoint.sh`).
pub(crate) const JVM_OPTIONS_ENV: &str = "JVM_PREPEND";

/// Environment defaults of a test-sized QuestDB, unless the pod sets them. The native memory
/// limit is a cap, not a reservation.
pub(crate) const SMALL_DEFAULTS: &[(&str, &str)] = &[
    ("QDB_SHARED_WORKER_COUNT", "1"),
    ("QDB_RAM_USAGE_LIMIT_BYTES", "536870912"),
];

/// `$JAVA_HOME/bin/java` when JAVA_HOME is set, else `java` from the PATH.
pub(crate) fn java() -> PathBuf {
    std::env::var_os("JAVA_HOME")
        .map(|h| PathBuf::from(h).join("bin/java"))
        .filter(|j| j.is_file())
        .unwrap_or_else(|| PathBuf::from("java"))
}

/// Starts QuestDB on `root` with exactly `env` (a container inherits nothing from the host
/// but what it needs to find `java`). `-f` as the official image passes it: it re-extracts
/// the web console and never overwrites an existing `conf/server.conf` (checked on 9.2.0).
pub(crate) fn spawn(
    jar: &Path,
    root: &Path,
    env: &[(String, String)],
    log: &Path,
) -> std::io::Result<tokio::process::Child> {
    if let Some(parent) = log.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let out = std::fs::File::create(log)?;
    let err = out.try_clone()?;
    let mut cmd = tokio::process::Command::new(java());
    // QuestDB unpacks its native library (about 5 MB) into the JVM's temp directory at every
    // start and never removes it: there, it goes with the control plane's directory instead
    // of piling up in /tmp.
    // (`<dir>/pod-logs/<pod>/<container>/<n>.log` -> `<dir>/java-tmp`: not beside the logs,
    // which are read back file by file, nor on the volume, which snapshots copy.)
    let tmp = log
        .ancestors()
        .nth(4)
        .map_or_else(|| root.to_path_buf(), |d| d.join("java-tmp"));
    std::fs::create_dir_all(&tmp)?;
    // The official image's entrypoint puts `JVM_PREPEND`'s words on the java command line,
    // after its own flags; the JVM takes the last `-Xmx` it is given.
    let prepended = env
        .iter()
        .find(|(k, _)| k == JVM_OPTIONS_ENV)
        .map(|(_, v)| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .unwrap_or_default();
    cmd.args(JVM_FLAGS)
        .args(prepended)
        .arg(format!("-Djava.io.tmpdir={}", tmp.display()))
        .arg("-p")
        .arg(jar)
        .args(["-m", "io.questdb/io.questdb.ServerMain", "-d"])
        .arg(root)
        .arg("-f")
        .current_dir(root)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .process_group(0);
    for key in ["PATH", "JAVA_HOME", "LANG", "TZ"] {
        if let Some(v) = std::env::var_os(key) {
            cmd.env(key, v);
        }
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.spawn()
}

/// Sends `signal` to the process group `pid` leads.
pub(crate) fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a process group id; no memory is involved.
    unsafe { libc::kill(-(pid as i32), signal) };
}

/// The exit code a kubelet reports: the code, or 128 + the signal that ended the process.
pub(crate) fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

/// Whether `pid` is stopped (state `T` in `/proc/<pid>/stat`): paused by a partition's
/// SIGSTOP, which the node's supervisor sends when it sees the fault, not when it is set.
pub(crate) fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // The command name, in parentheses, may hold spaces: the state follows its end.
            let after = &stat[stat.rfind(')')? + 1..];
            after.split_whitespace().next().map(|state| state == "T")
        })
        .unwrap_or(false)
}

/// The memory `pid` holds resident (`VmRSS` of `/proc/<pid>/status`). A container's cgroup is
/// charged this and the page cache of the files it writes: the stand-in's OOM killer counts
/// the resident memory only, so it kills no sooner than a real node would.
pub(crate) fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
