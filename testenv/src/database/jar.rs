//! The "image pull" of a real database: the Maven jar `org.questdb:questdb:<version>`, from the
//! local Maven repository or fetched once with `mvn dependency:get` under a file lock (two test
//! binaries may start together, as in hack/control-plane/build.sh). Both outcomes are kept for
//! the life of the process, so an unknown version costs one Maven run, not one per retry.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};

type Outcome = Result<PathBuf, String>;

/// The jar of QuestDB `version`, or why there is none (for `ErrImagePull`).
pub(crate) async fn resolve(version: &str) -> Outcome {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Outcome>>>>> =
        OnceLock::new();
    let cell = CACHE
        .get_or_init(Mutex::default)
        .lock()
        .unwrap()
        .entry(version.to_string())
        .or_default()
        .clone();
    cell.get_or_init(|| {
        let v = version.to_string();
        async move {
            tokio::task::spawn_blocking(move || fetch(&v))
                .await
                .unwrap_or_else(|e| Err(format!("fetching the jar panicked: {e}")))
        }
    })
    .await
    .clone()
}

/// `~/.m2/repository`, from $HOME.
fn local_repository() -> PathBuf {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".m2/repository")
}

fn repository() -> PathBuf {
    local_repository().join("org/questdb/questdb")
}

fn jar_path(version: &str) -> PathBuf {
    repository()
        .join(version)
        .join(format!("questdb-{version}.jar"))
}

fn fetch(version: &str) -> Outcome {
    if version.is_empty()
        || !version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    {
        return Err(format!("{version:?} is not a QuestDB version"));
    }
    let jar = jar_path(version);
    if jar.is_file() {
        return Ok(jar);
    }
    let lock_dir = repository();
    std::fs::create_dir_all(&lock_dir)
        .map_err(|e| format!("creating {}: {e}", lock_dir.display()))?;
    let lock_path = lock_dir.join(format!(".qdb-testenv-fetch-{version}.lock"));
    let lock = std::fs::File::create(&lock_path)
        .map_err(|e| format!("creating {}: {e}", lock_path.display()))?;
    // Released when `lock` is closed.
    // SAFETY: flock(2) on a descriptor this function owns.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
        return Err(format!(
            "locking {}: {}",
            lock_path.display(),
            std::io::Error::last_os_error()
        ));
    }
    if jar.is_file() {
        return Ok(jar);
    }
    eprintln!(
        "questdb-testenv: fetching QuestDB {version} (org.questdb:questdb:{version}) with Maven, once per machine"
    );
    // Maven's local repository named, not left to Maven: Java takes `user.home` from the
    // passwd entry, not from $HOME, so where the two differ (a CI container, an isolated
    // home) Maven would fetch into one directory while this reads the other.
    let local = local_repository();
    let out = Command::new("mvn")
        .args(["-B", "-q", "dependency:get", "-Dtransitive=false"])
        .arg(format!("-Dmaven.repo.local={}", local.display()))
        .arg(format!("-Dartifact=org.questdb:questdb:{version}"))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run Maven (mvn) to fetch QuestDB {version}: {e}"))?;
    if out.status.success() && jar.is_file() {
        return Ok(jar);
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let why = text
        .lines()
        .find_map(|l| {
            l.split_once("Couldn't download artifact: ")
                .map(|(_, r)| r.to_string())
        })
        .or_else(|| {
            text.lines()
                .find(|l| l.contains("ERROR"))
                .map(str::to_string)
        })
        .unwrap_or_else(|| format!("mvn exited with {}", out.status));
    let why: String = why.chars().take(300).collect();
    Err(format!(
        "QuestDB {version} is not available from Maven (org.questdb:questdb:{version}): {why}"
    ))
}
