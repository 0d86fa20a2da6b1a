//! A container's file system, emulated on the host: its volumeMounts become a table from
//! container paths to host directories (a PersistentVolume's directory, an emptyDir under the
//! pod's directory), everything else lies in a directory of the pod's own (the image's
//! writable layer). ConfigMap and Secret volumes are written as files where the container
//! would see them, e.g. `server.conf` mounted with `subPath` at
//! `/var/lib/questdb/conf/server.conf` lands in `<pv dir>/conf/server.conf`. Init containers
//! that only `mkdir` are run as that mkdir; others are skipped.
//! Sources: pkg/volume/configmap (items, `optional`, the messages), pkg/kubelet/kubelet_pods.go
//! `makeMounts` (subPath).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, KeyToPath, Pod, Volume};

use super::env::Sources;

pub(crate) struct MountTable {
    /// Container path → host directory, longest path first.
    entries: Vec<(String, PathBuf)>,
    rootfs: PathBuf,
}

impl MountTable {
    /// The directory mounts of `container`: PersistentVolumeClaims (`claims`: volume name →
    /// the volume's directory) and emptyDirs; `pod_dir` holds the rest.
    pub(crate) fn of(
        pod: &Pod,
        container: &Container,
        claims: &BTreeMap<String, PathBuf>,
        pod_dir: &Path,
    ) -> MountTable {
        let volumes = volumes(pod);
        let mut entries = vec![];
        for m in container.volume_mounts.iter().flatten() {
            let Some(v) = volumes.get(&m.name) else {
                continue;
            };
            let base = if v.persistent_volume_claim.is_some() {
                match claims.get(&m.name) {
                    Some(dir) => dir.clone(),
                    None => continue,
                }
            } else if v.empty_dir.is_some() {
                pod_dir.join("volumes").join(&m.name)
            } else {
                continue;
            };
            let host = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                Some(sub) => base.join(sub.trim_start_matches('/')),
                None => base,
            };
            entries.push((normal(&m.mount_path), host));
        }
        entries.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        MountTable {
            entries,
            rootfs: pod_dir.join("rootfs"),
        }
    }

    /// Where the container's `path` is on the host.
    pub(crate) fn map(&self, path: &str) -> PathBuf {
        let path = normal(path);
        for (mount, host) in &self.entries {
            if path == *mount {
                return host.clone();
            }
            if let Some(rest) = path
                .strip_prefix(mount.as_str())
                .and_then(|r| r.strip_prefix('/'))
            {
                return host.join(rest);
            }
        }
        self.rootfs.join(path.trim_start_matches('/'))
    }

    /// Creates every mounted directory, as a mount would.
    pub(crate) fn create(&self) -> std::io::Result<()> {
        for (_, host) in &self.entries {
            std::fs::create_dir_all(host)?;
        }
        std::fs::create_dir_all(&self.rootfs)
    }
}

fn normal(path: &str) -> String {
    let p = path.trim_end_matches('/');
    if p.is_empty() {
        "/".into()
    } else {
        p.to_string()
    }
}

fn volumes(pod: &Pod) -> BTreeMap<String, Volume> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .map(|v| (v.name.clone(), v.clone()))
        .collect()
}

/// Writes the ConfigMap and Secret files `container` mounts; `Err` is the kubelet's
/// `MountVolume.SetUp failed` message (the pod stays `ContainerCreating`).
pub(crate) async fn write_files(
    sources: &mut Sources<'_>,
    pod: &Pod,
    container: &Container,
    table: &MountTable,
) -> Result<(), String> {
    let volumes = volumes(pod);
    for m in container.volume_mounts.iter().flatten() {
        let Some(v) = volumes.get(&m.name) else {
            continue;
        };
        let files = match volume_files(sources, v).await {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(e) => {
                return Err(format!(
                    "MountVolume.SetUp failed for volume {:?} : {e}",
                    m.name
                ))
            }
        };
        let target = table.map(&m.mount_path);
        let read_only = m.read_only == Some(true);
        let write = |path: &Path, content: &[u8]| -> Result<(), String> {
            replace_file(path, content, read_only).map_err(|e| {
                format!(
                    "MountVolume.SetUp failed for volume {:?} : writing {}: {e}",
                    m.name,
                    path.display()
                )
            })
        };
        match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => {
                if let Some(content) = files.get(sub) {
                    write(&target, content)?;
                }
            }
            None => {
                for (rel, content) in &files {
                    write(&target.join(rel), content)?;
                }
            }
        }
    }
    Ok(())
}

/// Brings the ConfigMap and Secret volumes `container` mounts as directories up to date, as the
/// kubelet does at its periodic pod sync: a file whose content changed is replaced atomically
/// ([`replace_file`]; the kubelet's atomic writer swaps a `..data` link, which a reader sees the
/// same way). subPath mounts are never refreshed (the
/// Kubernetes documentation: "A container using a ConfigMap as a subPath volume mount will not
/// receive ConfigMap updates"). A source that cannot be read now is tried at the next sync.
pub(crate) async fn refresh_files(
    sources: &mut Sources<'_>,
    pod: &Pod,
    container: &Container,
    table: &MountTable,
) {
    let volumes = volumes(pod);
    for m in container.volume_mounts.iter().flatten() {
        if m.sub_path.as_deref().is_some_and(|s| !s.is_empty()) {
            continue;
        }
        let Some(v) = volumes.get(&m.name) else {
            continue;
        };
        let Ok(Some(files)) = volume_files(sources, v).await else {
            continue;
        };
        let target = table.map(&m.mount_path);
        for (rel, content) in &files {
            let path = target.join(rel);
            if std::fs::read(&path).is_ok_and(|now| now == *content) {
                continue;
            }
            if let Err(e) = replace_file(&path, content, m.read_only == Some(true)) {
                tracing::debug!(path = %path.display(), error = %e, "refreshing a mounted file failed; trying at the next sync");
            }
        }
    }
}

/// Writes `content` at `path` as the kubelet's atomic writer does: staged beside it, then
/// renamed over it, so a reader sees the old file or the new one, never a torn one (and a
/// read-only file of the last start does not refuse the write).
fn replace_file(path: &Path, content: &[u8], read_only: bool) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let staged = path.with_file_name(format!(
        "..{}.staged",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file")
    ));
    std::fs::write(&staged, content)?;
    if read_only {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o444))?;
    }
    std::fs::rename(&staged, path)
}

/// The files of a ConfigMap or Secret volume (path → content); `None` for other volumes.
async fn volume_files(
    sources: &mut Sources<'_>,
    v: &Volume,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, String> {
    let (values, items, what, name, optional) = if let Some(c) = &v.config_map {
        let values = sources.config_map(&c.name).await?.cloned();
        (
            values,
            &c.items,
            "configmap",
            c.name.clone(),
            c.optional == Some(true),
        )
    } else if let Some(s) = &v.secret {
        let name = s.secret_name.clone().unwrap_or_default();
        let values = sources.secret(&name).await?.cloned();
        (values, &s.items, "secret", name, s.optional == Some(true))
    } else {
        return Ok(None);
    };
    let Some(values) = values else {
        if optional {
            return Ok(Some(BTreeMap::new()));
        }
        return Err(format!("{what} {name:?} not found"));
    };
    let mut out = BTreeMap::new();
    match items {
        None => {
            for (k, v) in values {
                out.insert(k, v.into_bytes());
            }
        }
        Some(items) => {
            for KeyToPath { key, path, .. } in items {
                match values.get(key) {
                    Some(v) => {
                        out.insert(path.clone(), v.clone().into_bytes());
                    }
                    None if optional => {}
                    None => {
                        return Err(format!("{what} references non-existent config key: {key}"))
                    }
                }
            }
        }
    }
    Ok(Some(out))
}

/// Runs the init containers that only create directories (`mkdir [-p] DIR...`) or a symbolic
/// link (`ln -s[fn] TARGET LINK`); the names of those it could not run are returned (they are
/// reported completed all the same). A link's target is a path the pod's main container
/// resolves, so it points where that container's mounts put it on the host.
pub(crate) fn run_init(
    pod: &Pod,
    claims: &BTreeMap<String, PathBuf>,
    pod_dir: &Path,
) -> std::io::Result<Vec<String>> {
    let mut skipped = vec![];
    for c in pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
    {
        let argv: Vec<String> = c
            .command
            .iter()
            .flatten()
            .chain(c.args.iter().flatten())
            .cloned()
            .collect();
        let program = argv
            .first()
            .map(|a| a.rsplit('/').next().unwrap_or(a))
            .unwrap_or_default();
        let table = MountTable::of(pod, c, claims, pod_dir);
        match program {
            "mkdir" => {
                table.create()?;
                for dir in argv.iter().skip(1).filter(|a| !a.starts_with('-')) {
                    std::fs::create_dir_all(table.map(dir))?;
                }
            }
            "ln" => {
                let flags: String = argv
                    .iter()
                    .skip(1)
                    .filter(|a| a.starts_with('-'))
                    .flat_map(|a| a.chars().skip(1))
                    .collect();
                let paths: Vec<&String> = argv
                    .iter()
                    .skip(1)
                    .filter(|a| !a.starts_with('-'))
                    .collect();
                let (Some(main), [target, link]) = (
                    pod.spec.as_ref().and_then(|s| s.containers.first()),
                    paths.as_slice(),
                ) else {
                    skipped.push(c.name.clone());
                    continue;
                };
                if !flags.contains('s') {
                    skipped.push(c.name.clone());
                    continue;
                }
                table.create()?;
                let target = MountTable::of(pod, main, claims, pod_dir).map(target);
                let link = table.map(link);
                if flags.contains('f') {
                    match std::fs::remove_file(&link) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                        _ => {}
                    }
                }
                std::os::unix::fs::symlink(target, link)?;
            }
            _ => skipped.push(c.name.clone()),
        }
    }
    Ok(skipped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_under_the_claims_mount_land_in_the_volume_directory() {
        let pod: Pod = serde_json::from_value(json!({
            "spec": {
                "containers": [{"name": "db", "volumeMounts": [
                    {"name": "data", "mountPath": "/var/lib/questdb"},
                    {"name": "config", "mountPath": "/var/lib/questdb/conf/server.conf", "subPath": "server.conf"},
                    {"name": "scratch", "mountPath": "/tmp/scratch/"},
                ]}],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "db-data"}},
                    {"name": "config", "configMap": {"name": "db"}},
                    {"name": "scratch", "emptyDir": {}},
                ],
            },
        }))
        .unwrap();
        let claims = BTreeMap::from([("data".to_string(), PathBuf::from("/v/vol-1"))]);
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let t = MountTable::of(&pod, c, &claims, Path::new("/pods/u"));
        assert_eq!(t.map("/var/lib/questdb"), PathBuf::from("/v/vol-1"));
        assert_eq!(
            t.map("/var/lib/questdb/conf/server.conf"),
            PathBuf::from("/v/vol-1/conf/server.conf")
        );
        assert_eq!(
            t.map("/tmp/scratch/x"),
            PathBuf::from("/pods/u/volumes/scratch/x")
        );
        assert_eq!(
            t.map("/etc/hosts"),
            PathBuf::from("/pods/u/rootfs/etc/hosts")
        );
        assert_eq!(
            t.map("/var/lib/questdbx"),
            PathBuf::from("/pods/u/rootfs/var/lib/questdbx")
        );
    }
}
