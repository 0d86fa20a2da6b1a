//! The registry of live QuestDB processes, keyed by the directory they run on: the two-writers
//! watcher. QuestDB refuses a second start on a locked root (`cannot lock table name registry
//! file`), but a test must see that the operator *tried*, so every start on a directory that
//! already has a live process is recorded, whatever happens to it next.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// A QuestDB that runs now.
#[derive(Clone, Debug)]
pub struct DatabaseProcess {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub node: String,
    pub pid: u32,
    /// Its root directory (`-d`): the PersistentVolume's directory.
    pub dir: PathBuf,
    pub started: SystemTime,
    pub(crate) node_index: u32,
}

impl DatabaseProcess {
    /// Paused by a partition of its node (see `Fault::Partition`). The pause follows the
    /// fault asynchronously: a test that needs the database silent waits for this.
    pub fn paused(&self) -> bool {
        super::process::is_stopped(self.pid)
    }
}

/// A QuestDB that ended, and how.
#[derive(Clone, Debug)]
pub struct DatabaseExit {
    pub namespace: String,
    pub pod: String,
    pub node: String,
    pub pid: u32,
    /// The exit code, when it exited by itself.
    pub code: Option<i32>,
    /// The signal that ended it (9: SIGKILL, 15: SIGTERM not handled).
    pub signal: Option<i32>,
}

#[derive(Default)]
pub(crate) struct Registry {
    live: Mutex<BTreeMap<u32, DatabaseProcess>>,
    exits: Mutex<Vec<DatabaseExit>>,
    violations: Mutex<Vec<String>>,
    killed: Mutex<Vec<u32>>,
}

impl Registry {
    pub(crate) fn register(&self, p: DatabaseProcess) {
        let mut live = self.live.lock().unwrap();
        for other in live.values().filter(|o| o.dir == p.dir) {
            let v = format!(
                "{}: two writers on {}: pod {}/{} (uid {}, pid {}) on node {} started while pod {}/{} (uid {}, pid {}) on node {} runs there",
                k8s_openapi::jiff::Timestamp::now(),
                p.dir.display(),
                p.namespace, p.pod, p.uid, p.pid, p.node,
                other.namespace, other.pod, other.uid, other.pid, other.node,
            );
            tracing::error!("{v}");
            self.violations.lock().unwrap().push(v);
        }
        live.insert(p.pid, p);
    }

    pub(crate) fn unregister(&self, pid: u32, status: std::process::ExitStatus) {
        use std::os::unix::process::ExitStatusExt;
        if let Some(p) = self.live.lock().unwrap().remove(&pid) {
            self.exits.lock().unwrap().push(DatabaseExit {
                namespace: p.namespace,
                pod: p.pod,
                node: p.node,
                pid,
                code: status.code(),
                signal: status.signal(),
            });
        }
    }

    pub(crate) fn holds(&self, dir: &Path) -> bool {
        self.live.lock().unwrap().values().any(|p| p.dir == dir)
    }

    /// SIGKILL the process group of each live process `which` selects.
    pub(crate) fn kill(&self, which: impl Fn(&DatabaseProcess) -> bool) {
        let live = self.live.lock().unwrap();
        for p in live.values().filter(|p| which(p)) {
            // Each QuestDB leads its own process group (see process.rs).
            // SAFETY: kill(2) with a negative pid signals that group; no memory is involved.
            unsafe { libc::kill(-(p.pid as i32), libc::SIGKILL) };
            self.killed.lock().unwrap().push(p.pid);
        }
    }

    /// Waits (briefly) until every process killed so far is dead, so that nothing writes into
    /// a directory about to be removed.
    pub(crate) fn reap_killed(&self) {
        let pids = std::mem::take(&mut *self.killed.lock().unwrap());
        let deadline = Instant::now() + Duration::from_secs(5);
        for pid in pids {
            while alive(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    pub(crate) fn live(&self) -> Vec<DatabaseProcess> {
        self.live.lock().unwrap().values().cloned().collect()
    }

    pub(crate) fn exits(&self) -> Vec<DatabaseExit> {
        self.exits.lock().unwrap().clone()
    }

    pub(crate) fn violations(&self) -> Vec<String> {
        self.violations.lock().unwrap().clone()
    }
}

/// Alive and not yet a zombie (a zombie holds no files and runs no code).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(pod: &str, pid: u32, dir: &str) -> DatabaseProcess {
        DatabaseProcess {
            namespace: "ns".into(),
            pod: pod.into(),
            uid: format!("uid-{pod}"),
            node: format!("node-{pod}"),
            pid,
            dir: dir.into(),
            started: SystemTime::now(),
            node_index: 0,
        }
    }

    #[test]
    fn a_second_process_on_a_directory_is_a_violation_naming_both_pods() {
        let r = Registry::default();
        r.register(process("a", 1, "/v/1"));
        r.register(process("b", 2, "/v/2"));
        assert!(r.violations().is_empty());
        r.register(process("c", 3, "/v/1"));
        let v = r.violations();
        assert_eq!(v.len(), 1);
        assert!(
            v[0].contains("ns/a") && v[0].contains("ns/c") && v[0].contains("/v/1"),
            "{v:?}"
        );
        use std::os::unix::process::ExitStatusExt;
        r.unregister(1, std::process::ExitStatus::from_raw(9));
        r.unregister(3, std::process::ExitStatus::from_raw(55 << 8));
        r.register(process("d", 4, "/v/1"));
        assert_eq!(
            r.violations().len(),
            1,
            "a directory is free once its process exited"
        );
        let exits = r.exits();
        assert_eq!((exits[0].signal, exits[0].code), (Some(9), None));
        assert_eq!(exits[1].code, Some(55));
    }
}
