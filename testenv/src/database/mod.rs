//! Real QuestDB for database pods, chosen per control plane with [`Databases::Real`]: the
//! kubelet stand-in runs `java` with the Maven jar of the image's version on the pod's
//! PersistentVolume directory, on a loopback address of its own, probes it for real and
//! reports exits, restarts and back-offs as a kubelet does. Everything a test or the operator
//! would see from a container runtime is emulated on the host: files instead of mounts,
//! loopback addresses instead of a pod network, a TCP proxy instead of host-port iptables.
//!
//! Deviations a test must not rely on: no cgroups (resources are not enforced), no user
//! namespaces (the process runs as the test's user), mounts are copies (a ConfigMap mounted
//! without `subPath` is written next to what the directory holds instead of hiding it),
//! `$(VAR)` references in env values are not expanded, exec probes always succeed.

mod disk;
mod env;
mod forward;
mod jar;
mod mounts;
mod probe;
mod process;
mod runner;
mod status;
mod watcher;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::Client;
use tokio_util::sync::CancellationToken;

pub(crate) use disk::too_small as disk_too_small;
pub use disk::XFS_MIN_BYTES;
pub use probe::http_get;
pub use watcher::{DatabaseExit, DatabaseProcess};

pub(crate) use runner::{start, PodHandle};

/// What runs in a database pod (a container whose image is `questdb/questdb:<version>`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Databases {
    /// Nothing runs: the kubelet reports the pod Running and Ready once its volumes attach.
    #[default]
    Fake,
    /// A real QuestDB process per pod (needs Java 17; jars come from Maven).
    Real,
}

impl Databases {
    /// [`Databases::Real`] when `java -version` works, else [`Databases::Fake`]: for tests that
    /// are meaningful either way. Tests that need a database say `Databases::Real` and fail
    /// without Java.
    pub fn real_if_java() -> Self {
        if java_available() {
            Databases::Real
        } else {
            Databases::Fake
        }
    }
}

/// Set (to anything) for plain volume directories instead of lossy layers: durability
/// assertions then prove only that a process crash loses nothing.
pub const PLAIN_VOLUMES_ENV: &str = "QDB_TEST_PLAIN_VOLUMES";

impl VolumeLayer {
    fn from_env() -> VolumeLayer {
        if std::env::var_os(PLAIN_VOLUMES_ENV).is_some_and(|v| !v.is_empty()) {
            VolumeLayer::Plain
        } else {
            VolumeLayer::Lossy
        }
    }
}

/// The error of a control plane asked for real databases on a machine without Java.
pub const NEEDS_JAVA: &str =
    "real QuestDB needs Java 17: install a JRE (Debian: openjdk-17-jre-headless)";

/// Whether `java -version` runs (checked once per process).
pub fn java_available() -> bool {
    static JAVA: OnceLock<bool> = OnceLock::new();
    *JAVA.get_or_init(|| {
        std::process::Command::new(process::java())
            .arg("-version")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// A loopback network `127.a.b.0/24` for a node's real databases, unique on this machine:
/// QuestDB binds its ports on its pod's address, and a network two processes shared (two tests
/// under nextest, a sandbox beside a test run) let one test's probes and queries reach the
/// other's database: Ready on a database that never started, 401 from another's credentials.
/// A network is reserved by a listener on its `.1` address at [`RESERVATION_PORT`], held for
/// the process's life (the kernel frees it when the process ends, however it ends); the first
/// candidate is spread by the process id. `a` stays below [`CLOUD_LOOPBACK_FIRST`]: the cloud's
/// instances take addresses above it.
pub(crate) fn node_network() -> (u8, u8) {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let networks = (CLOUD_LOOPBACK_FIRST - 10) * 256;
    let at = |k: u32| ((10 + k / 256) as u8, (k % 256) as u8);
    let start = (std::process::id() % (CLOUD_LOOPBACK_FIRST - 10)) * 256;
    let (a, b) = at(reserve(
        &NEXT,
        networks,
        start,
        "network for databases",
        |k| {
            let (a, b) = at(k);
            [127, a, b, 1]
        },
    ));
    (a, b)
}

/// The first of `count` candidates from `start` on (spread by the process id), whose
/// `address(k)` this process can hold at [`RESERVATION_PORT`] (the listener kept for its life).
fn reserve(
    next: &std::sync::atomic::AtomicU32,
    count: u32,
    start: u32,
    what: &str,
    address: impl Fn(u32) -> [u8; 4],
) -> u32 {
    static HELD: std::sync::Mutex<Vec<std::net::TcpListener>> = std::sync::Mutex::new(Vec::new());
    loop {
        let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert!(n < count, "every loopback {what} is taken");
        let k = (start + n) % count;
        let at = std::net::SocketAddr::from((address(k), RESERVATION_PORT));
        if let Ok(listener) = std::net::TcpListener::bind(at) {
            HELD.lock().unwrap().push(listener);
            return k;
        }
    }
}

/// The port a process holds on a node network's `.1` address while the network is its own.
const RESERVATION_PORT: u16 = 47_999;

/// A loopback `/16` prefix (`127.a`, `a` from [`CLOUD_LOOPBACK_FIRST`] to 254) for one
/// real-database cloud's instance addresses, unique on this machine as [`node_network`]'s are:
/// the instances' host ports are bound on those addresses, and two tests that drew the same
/// prefix (by process id) fought over them ("address already in use": one database never
/// reachable through its node). Reserved by a listener on `127.a.0.1` at [`RESERVATION_PORT`]
/// for the process's life.
pub fn cloud_loopback_prefix() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let a = |k: u32| (CLOUD_LOOPBACK_FIRST + k) as u8;
    let prefixes = 255 - CLOUD_LOOPBACK_FIRST;
    let start = std::process::id() % prefixes;
    let k = reserve(&NEXT, prefixes, start, "prefix for clouds", |k| {
        [127, a(k), 0, 1]
    });
    format!("127.{}", a(k))
}

/// First second octet of the loopback range left to a cloud's instance addresses
/// (`127.200.0.0` to `127.254.255.255`): instance nodes keep the address their cloud gave, and
/// it must never be a pod's or a worker's.
pub const CLOUD_LOOPBACK_FIRST: u32 = 200;

/// The image every database pod runs, as the operator renders it.
const IMAGE_REPOSITORY: &str = "questdb/questdb";

/// `Some(version)` for a QuestDB image (any registry prefix; the tag is the version),
/// `Some(Err)` for a QuestDB image whose version cannot be known (a digest, no tag), `None`
/// for any other image.
pub(crate) fn questdb_version(image: &str) -> Option<Result<String, String>> {
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    let (repo, tag) = match name.rsplit_once(':') {
        Some((r, t)) if !t.contains('/') => (r, Some(t)),
        _ => (name, None),
    };
    let ours = repo == IMAGE_REPOSITORY || repo.ends_with(&format!("/{IMAGE_REPOSITORY}"));
    if !ours {
        return None;
    }
    Some(match (tag, digest) {
        (Some(t), _) if t != "latest" => Ok(t.to_string()),
        (_, Some(d)) => Err(format!(
            "a digest ({d}) names no QuestDB version; use a version tag"
        )),
        _ => Err("the tag `latest` names no QuestDB version; use a version tag".into()),
    })
}

/// The container of `pod` that runs QuestDB, if any.
pub(crate) fn database_container(pod: &Pod) -> Option<&Container> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.image.as_deref().and_then(questdb_version).is_some())
}

/// What the kubelets, the CSI driver and the control plane share in Real mode: the
/// directories (volumes, logs, container file systems) under the control plane's temporary
/// directory, and the registry of live processes.
pub struct Runtime {
    client: Client,
    volumes: PathBuf,
    logs: PathBuf,
    rootfs: PathBuf,
    registry: watcher::Registry,
    stop: CancellationToken,
    /// Volumes whose PV is deleted; their directories go once no process holds them.
    released: Mutex<BTreeSet<String>>,
    /// Where the volume layers of each node are mounted.
    mounts: PathBuf,
    /// The volumes mounted on a node now, by (node index, volume handle): each a lossy layer
    /// over the volume's directory, so that a power cut loses what the node's kernel had not
    /// written back, as a disk does (see [`VolumeLayer`]).
    layers: Mutex<BTreeMap<(u32, String), lossyfs::LossyVolume>>,
    layer: VolumeLayer,
    /// The volumes of a real size (XFS on a loop device), by handle.
    disks: Arc<disk::Disks>,
    /// The database pods whose claims are mounted now, by pod uid: what each node's kubelet
    /// reports volume figures of (`crate::kubelet_api`).
    mounted_pods: Mutex<BTreeMap<String, MountedPod>>,
}

/// How big a volume is, as CreateVolume makes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VolumeSize {
    /// A directory of the host's file system (its free space is the host's).
    Unbounded,
    /// An XFS file system of this many bytes ([`disk`]).
    Xfs(u64),
}

/// A database pod whose PersistentVolumeClaims are mounted on its node (from its container's
/// first start until its pod stops, restarts included).
#[derive(Clone, Debug)]
pub(crate) struct MountedPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node_index: u32,
    /// When its volumes were first mounted on the node.
    pub since: std::time::SystemTime,
    pub claims: Vec<MountedClaim>,
}

/// One PersistentVolumeClaim volume of a [`MountedPod`].
#[derive(Clone, Debug)]
pub(crate) struct MountedClaim {
    /// The pod's name for the volume (`spec.volumes[].name`).
    pub volume: String,
    /// `spec.volumes[].persistentVolumeClaim.claimName`.
    pub claim: String,
    /// The directory the pod's process sees for it (a lossy layer's mount point, or the
    /// volume's directory).
    pub dir: PathBuf,
}

/// How a database pod sees its PersistentVolume.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VolumeLayer {
    /// Through a FUSE layer with the kernel's writeback cache (`lossyfs`): what QuestDB wrote
    /// sits in the node's page cache until the kernel writes it back (`dirty_expire`, 30 s by
    /// default) or QuestDB syncs it (fsync, msync, sync); a power cut throws that away and
    /// keeps what reached the volume's directory, which is what an EBS volume keeps. A clean
    /// shutdown (the pod stopped, the instance stopped normally) writes everything back.
    #[default]
    Lossy,
    /// The volume's directory itself: the host's page cache keeps everything at a "power cut"
    /// (only a process crash is modelled). For tests that assert nothing about durability and
    /// must not depend on FUSE.
    Plain,
}

impl Runtime {
    pub(crate) fn new(
        dir: &Path,
        client: Client,
        stop: CancellationToken,
    ) -> anyhow::Result<Arc<Runtime>> {
        let rt = Runtime {
            client,
            volumes: dir.join("volumes"),
            logs: dir.join("pod-logs"),
            rootfs: dir.join("rootfs"),
            registry: watcher::Registry::default(),
            stop,
            released: Mutex::default(),
            mounts: dir.join("node-mounts"),
            layers: Mutex::default(),
            layer: VolumeLayer::from_env(),
            disks: Arc::new(disk::Disks::new(dir.join(disk::IMAGES_DIR))?),
            mounted_pods: Mutex::default(),
        };
        for d in [&rt.volumes, &rt.logs, &rt.rootfs, &rt.mounts] {
            std::fs::create_dir_all(d)?;
        }
        Ok(Arc::new(rt))
    }

    /// The directory that holds the data of the volume with this CSI handle.
    pub fn volume_dir(&self, handle: &str) -> PathBuf {
        self.volumes.join(handle.replace(['/', '\\'], "_"))
    }

    /// CreateVolume: the volume's directory exists from now on; for [`VolumeSize::Xfs`] it is
    /// the mount point of a file system of that size.
    pub(crate) async fn provision(&self, handle: &str, size: VolumeSize) -> anyhow::Result<()> {
        self.released.lock().unwrap().remove(handle);
        let dir = self.volume_dir(handle);
        match size {
            VolumeSize::Unbounded => Ok(std::fs::create_dir_all(dir)?),
            VolumeSize::Xfs(bytes) => {
                let (disks, handle) = (self.disks.clone(), handle.to_string());
                tokio::task::spawn_blocking(move || disks.create_xfs(&handle, &dir, bytes)).await?
            }
        }
    }

    /// ControllerExpandVolume and NodeExpandVolume: a sized volume's file system grows to
    /// `bytes` while it is mounted (and used); a directory has nothing to grow.
    pub(crate) async fn expand(&self, handle: &str, bytes: u64) -> anyhow::Result<()> {
        let (disks, handle) = (self.disks.clone(), handle.to_string());
        tokio::task::spawn_blocking(move || disks.grow(&handle, bytes)).await??;
        Ok(())
    }

    /// DeleteVolume: the directory (and a sized volume's file system) goes once no process
    /// runs on it (a partitioned node's QuestDB may still hold it, as an EBS volume stays while
    /// attached).
    pub(crate) async fn release(&self, handle: &str) {
        self.released.lock().unwrap().insert(handle.to_string());
        self.sweep().await;
    }

    pub(crate) async fn sweep(&self) {
        let due: Vec<String> = {
            let mut released = self.released.lock().unwrap();
            let due: Vec<String> = released
                .iter()
                .filter(|h| !self.registry.holds(&self.volume_dir(h)))
                .cloned()
                .collect();
            for h in &due {
                released.remove(h);
            }
            due
        };
        for handle in due {
            let (disks, dir, h) = (self.disks.clone(), self.volume_dir(&handle), handle.clone());
            let deleted = tokio::task::spawn_blocking(move || {
                // A sized volume is unmounted first: a node's layer may still hold it (busy),
                // and it is tried again at the next sweep.
                disks.delete(&h)?;
                match std::fs::remove_dir_all(&dir) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        Err(anyhow::Error::new(e)
                            .context(format!("deleting the volume's directory {}", dir.display())))
                    }
                    _ => Ok(()),
                }
            })
            .await
            .map_err(anyhow::Error::new)
            .and_then(|r| r);
            if let Err(e) = deleted {
                tracing::warn!(%handle, error = %format!("{e:#}"), "deleting a volume; tried again");
                if self.disks.is_sized(&handle) {
                    self.released.lock().unwrap().insert(handle);
                }
            }
        }
    }

    /// The pod's claims are mounted on its node (again, after a restart of its container):
    /// `claims` holds each claim volume's name, claim name and the directory the pod sees.
    pub(crate) fn pod_mounted(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        node_index: u32,
        claims: Vec<MountedClaim>,
    ) {
        let mut pods = self.mounted_pods.lock().unwrap();
        let since = pods
            .get(uid)
            .map_or_else(std::time::SystemTime::now, |p| p.since);
        pods.insert(
            uid.to_string(),
            MountedPod {
                namespace: namespace.into(),
                name: name.into(),
                uid: uid.into(),
                node_index,
                since,
                claims,
            },
        );
    }

    /// The pod's claims are unmounted from its node (its containers stopped for good).
    pub(crate) fn pod_unmounted(&self, uid: &str) {
        self.mounted_pods.lock().unwrap().remove(uid);
    }

    /// The database pods whose claims are mounted on the node now.
    pub(crate) fn mounted_pods(&self, node_index: u32) -> Vec<MountedPod> {
        self.mounted_pods
            .lock()
            .unwrap()
            .values()
            .filter(|p| p.node_index == node_index)
            .cloned()
            .collect()
    }

    /// The node's power goes: its volume layers are cut first (from then on nothing more
    /// reaches a volume), then every QuestDB on it is SIGKILLed. In that order because a
    /// process that exits closes its files, and a close writes dirty pages back.
    pub(crate) fn kill_node(&self, node_index: u32) {
        self.cut_node(node_index);
        self.registry.kill(|p| p.node_index == node_index);
    }

    /// Cuts every volume layer mounted on the node (see [`Runtime::kill_node`]).
    pub(crate) fn cut_node(&self, node_index: u32) {
        for ((node, _), layer) in self.layers.lock().unwrap().iter() {
            if *node == node_index {
                layer.cut();
            }
        }
    }

    /// SIGKILL every QuestDB (the control plane stops); what they wrote no longer matters.
    pub(crate) fn kill_all(&self) {
        for layer in self.layers.lock().unwrap().values() {
            layer.cut();
        }
        self.registry.kill(|_| true);
        self.registry.reap_killed();
        let layers = std::mem::take(&mut *self.layers.lock().unwrap());
        drop(layers);
    }

    /// The control plane stops, its processes are dead and its layers unmounted
    /// ([`Runtime::kill_all`]): every sized volume is unmounted and its loop device detached
    /// (loop devices belong to the machine, and outlive a process that does not free them).
    pub(crate) fn detach_disks(&self) {
        self.disks.detach_all();
    }

    /// The cut handles of every layer of the volume, to settle them: a `sync()` (QuestDB's
    /// CHECKPOINT CREATE calls it) waits on a disk's file system for the write-back it started;
    /// on this kernel it does not wait for a FUSE mount's, so a snapshot cut right after a
    /// checkpoint settles these first (`Cutter::settle`, blocking), as `sync()` would have.
    pub(crate) fn volume_layers(&self, handle: &str) -> Vec<lossyfs::Cutter> {
        self.layers
            .lock()
            .unwrap()
            .iter()
            .filter(|((_, h), _)| h == handle)
            .map(|(_, l)| l.cutter())
            .collect()
    }

    /// Nothing of a database runs or is mounted on the node.
    pub(crate) fn node_quiet(&self, node_index: u32) -> bool {
        !self
            .registry
            .live()
            .iter()
            .any(|p| p.node_index == node_index)
            && !self
                .layers
                .lock()
                .unwrap()
                .keys()
                .any(|(node, _)| *node == node_index)
    }

    /// Mounts the volume `handle` on the node for a pod (idempotent: a layer mounted and not
    /// cut is reused; a cut one, from before a power cut, is replaced). Returns the directory
    /// the pod sees.
    pub(crate) async fn mount_volume(
        self: &Arc<Self>,
        node_index: u32,
        handle: &str,
    ) -> std::io::Result<PathBuf> {
        let backing = self.volume_dir(handle);
        if self.layer == VolumeLayer::Plain {
            return Ok(backing);
        }
        let key = (node_index, handle.to_string());
        let stale = {
            let mut layers = self.layers.lock().unwrap();
            match layers.get(&key) {
                Some(l) if !l.is_cut() => return Ok(l.mountpoint().to_path_buf()),
                Some(_) => layers.remove(&key),
                None => None,
            }
        };
        let mountpoint = self
            .mounts
            .join(format!("node-{node_index}"))
            .join(handle.replace(['/', '\\'], "_"));
        let mounted = tokio::task::spawn_blocking(move || {
            drop(stale);
            lossyfs::LossyVolume::mount(&backing, &mountpoint)
        })
        .await
        .map_err(std::io::Error::other)?
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "mounting the volume's lossy layer (set {PLAIN_VOLUMES_ENV}=1 for plain directories): {e}; {}",
                    lossyfs::available().err().unwrap_or_default()
                ),
            )
        })?;
        let dir = mounted.mountpoint().to_path_buf();
        self.layers.lock().unwrap().insert(key, mounted);
        Ok(dir)
    }

    /// The pod no longer uses the volume on this node: a clean unmount writes back what the
    /// kernel holds, unless the layer was cut.
    pub(crate) async fn unmount_volume(&self, node_index: u32, handle: &str) {
        let layer = self
            .layers
            .lock()
            .unwrap()
            .remove(&(node_index, handle.to_string()));
        if let Some(layer) = layer {
            let _ = tokio::task::spawn_blocking(move || layer.unmount()).await;
        }
    }

    /// The volume directory behind a path a pod sees (its QuestDB root), so that two
    /// processes on two nodes' layers over one volume are known to share it.
    pub(crate) fn backing_of(&self, seen: &Path) -> PathBuf {
        for layer in self.layers.lock().unwrap().values() {
            if let Ok(rest) = seen.strip_prefix(layer.mountpoint()) {
                return layer.backing().join(rest);
            }
        }
        seen.to_path_buf()
    }

    /// Each time a second live QuestDB was started on a directory that already had one.
    pub fn two_writer_violations(&self) -> Vec<String> {
        self.registry.violations()
    }

    pub fn processes(&self) -> Vec<DatabaseProcess> {
        self.registry.live()
    }

    pub fn exits(&self) -> Vec<DatabaseExit> {
        self.registry.exits()
    }

    /// The last `lines` lines of the newest logs of the pod `namespace/name` (its current and
    /// previous container), or a line saying there is none.
    pub fn log_tail(&self, namespace: &str, name: &str, lines: usize) -> String {
        let prefix = format!("{namespace}_{name}_");
        let mut logs: Vec<(std::time::SystemTime, PathBuf)> = vec![];
        for pod_dir in std::fs::read_dir(&self.logs)
            .into_iter()
            .flatten()
            .flatten()
        {
            if !pod_dir.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            for c in std::fs::read_dir(pod_dir.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                for f in std::fs::read_dir(c.path()).into_iter().flatten().flatten() {
                    let modified = f
                        .metadata()
                        .and_then(|m| m.modified())
                        .unwrap_or(std::time::UNIX_EPOCH);
                    logs.push((modified, f.path()));
                }
            }
        }
        if logs.is_empty() {
            return format!("(no QuestDB log for pod {namespace}/{name})");
        }
        logs.sort();
        logs.iter()
            .rev()
            .take(2)
            .rev()
            .map(|(_, p)| {
                format!(
                    "---- {} ----\n{}",
                    p.display(),
                    crate::process::tail(p, lines)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn pod_log(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        container: &str,
        restart: i32,
    ) -> PathBuf {
        // The kubelet's layout: /var/log/pods/<namespace>_<name>_<uid>/<container>/<restart>.log
        // (pkg/kubelet/kuberuntime/helpers.go `BuildContainerLogsDirectory`).
        self.logs
            .join(format!("{namespace}_{name}_{uid}"))
            .join(container)
            .join(format!("{restart}.log"))
    }
}

#[cfg(test)]
mod tests {

    /// The harm: two tests on one machine given the same pod addresses, so one's probes and
    /// queries reach the other's database. A network is held while this process runs: no
    /// other process (nor this one) can take it.
    #[test]
    fn a_node_network_is_reserved_for_the_life_of_the_process() {
        let first = node_network();
        let second = node_network();
        assert_ne!(first, second);
        for (a, b) in [first, second] {
            let again = std::net::TcpListener::bind(std::net::SocketAddr::from((
                [127, a, b, 1],
                RESERVATION_PORT,
            )));
            assert!(again.is_err(), "127.{a}.{b}.0/24 is held");
        }
    }
    use super::{cloud_loopback_prefix, node_network, questdb_version, RESERVATION_PORT};

    /// The harm: two tests' clouds on one prefix, one's host ports taken by the other's
    /// ("address already in use": a database never reachable through its node).
    #[test]
    fn a_cloud_loopback_prefix_is_reserved_for_the_life_of_the_process() {
        let first = cloud_loopback_prefix();
        let second = cloud_loopback_prefix();
        assert_ne!(first, second);
        for prefix in [first, second] {
            let a: u8 = prefix.strip_prefix("127.").unwrap().parse().unwrap();
            assert!(
                u32::from(a) >= super::CLOUD_LOOPBACK_FIRST && a < 255,
                "{prefix}"
            );
            let again = std::net::TcpListener::bind(std::net::SocketAddr::from((
                [127, a, 0, 1],
                RESERVATION_PORT,
            )));
            assert!(again.is_err(), "{prefix}.0.0/16 is held");
        }
    }

    #[test]
    fn the_tag_of_a_questdb_image_is_its_version_wherever_it_is_pulled_from() {
        for image in [
            "questdb/questdb:9.2.0",
            "docker.io/questdb/questdb:9.2.0",
            "registry.example.com:5000/mirror/questdb/questdb:9.2.0",
        ] {
            assert_eq!(questdb_version(image), Some(Ok("9.2.0".into())), "{image}");
        }
        assert!(questdb_version("questdb/questdb").unwrap().is_err());
        assert!(questdb_version("questdb/questdb:latest").unwrap().is_err());
        assert!(questdb_version("questdb/questdb@sha256:abc")
            .unwrap()
            .is_err());
        assert_eq!(questdb_version("busybox:1.36"), None);
        assert_eq!(questdb_version("notquestdb/questdb:9.2.0"), None);
        assert_eq!(questdb_version("localhost:5000/questdb"), None);
    }
}
