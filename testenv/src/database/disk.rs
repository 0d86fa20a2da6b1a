//! Volumes of a real size, for claims whose StorageClass asks for XFS
//! (`csi.storage.k8s.io/fstype: xfs`): what the EBS CSI driver's CreateVolume, NodeStageVolume
//! (mkfs, mount), NodeExpandVolume (an online grow) and DeleteVolume amount to on one machine.
//! Each is a sparse image file of the claim's size under the control plane's temporary
//! directory, formatted `mkfs.xfs`, attached to a loop device (`losetup --find --show`) and
//! mounted on the volume's directory (`Runtime::volume_dir`), so that everything above it (the
//! nodes' lossy layers, QuestDB) sees a directory as before, one that fills up. An expansion
//! grows the image (ftruncate), tells the loop device (`losetup -c`) and grows the mounted file
//! system (`xfs_growfs`), while QuestDB runs on it. XFS, not ext4: an online ext4 resize needs
//! CAP_SYS_RESOURCE, which a test container may lack; XFS refuses file systems under 300 MiB.
//! Needs root (loop devices, mounts) and xfsprogs (`.ci/questdb.sh` installs it).
//!
//! Deviations: EBS rounds a size up to whole GiB (gp3: at least 1 GiB) and limits how often a
//! volume may be modified; neither is modelled, so a test can fill a 320 MiB volume quickly and
//! grow it at once. The file system's capacity is less than the image: XFS keeps its log
//! (64 MiB on a small volume) out of it, as it does on an EBS volume.
//!
//! Loop devices are global to the machine: every one made here is detached when its volume is
//! deleted and when the control plane stops; one left by a test process that died without
//! stopping (SIGKILL) is reclaimed by the next control plane that starts (see [`reclaim`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use anyhow::{bail, Context};
use tracing::{info, warn};

/// The smallest file system `mkfs.xfs` makes ("Filesystem must be larger than 300MB").
pub const XFS_MIN_BYTES: u64 = 300 << 20;

/// The file a control plane's image directory holds while the process that owns it runs: its
/// pid and start time (`/proc/<pid>/stat` field 22), so that a later process can tell a leak.
const OWNER_FILE: &str = "owner";
/// Where the control plane keeps its images: `<tempdir qdb-control-plane-*>/volume-images`.
pub(crate) const IMAGES_DIR: &str = "volume-images";

/// One sized volume: its image, its loop device, where it is mounted.
#[derive(Clone, Debug)]
struct Disk {
    image: PathBuf,
    device: String,
    mountpoint: PathBuf,
}

#[derive(Default)]
struct Held {
    /// The control plane has stopped: a volume made now is undone at once.
    closed: bool,
    disks: BTreeMap<String, Disk>,
}

/// The sized volumes of one control plane. Every method blocks (it runs commands): call them
/// from `spawn_blocking`.
pub(crate) struct Disks {
    images: PathBuf,
    held: Mutex<Held>,
}

impl Disks {
    /// `images`: the directory for the image files (made now). Reclaims what dead test processes
    /// left attached (best effort, never failing).
    pub(crate) fn new(images: PathBuf) -> std::io::Result<Disks> {
        std::fs::create_dir_all(&images)?;
        let me = std::process::id();
        if let Some(start) = start_time(me) {
            std::fs::write(images.join(OWNER_FILE), format!("{me} {start}\n"))?;
        }
        reclaim();
        Ok(Disks {
            images,
            held: Mutex::default(),
        })
    }

    /// Whether the volume `handle` is a sized one.
    pub(crate) fn is_sized(&self, handle: &str) -> bool {
        self.held.lock().unwrap().disks.contains_key(handle)
    }

    /// CreateVolume + NodeStageVolume for an XFS volume of `bytes`, mounted on `mountpoint`.
    /// Idempotent: a volume made already is left as it is.
    pub(crate) fn create_xfs(
        &self,
        handle: &str,
        mountpoint: &Path,
        bytes: u64,
    ) -> anyhow::Result<()> {
        if self.is_sized(handle) {
            return Ok(());
        }
        if bytes < XFS_MIN_BYTES {
            bail!("{}", too_small(bytes));
        }
        let image = self
            .images
            .join(format!("{}.img", handle.replace(['/', '\\'], "_")));
        std::fs::create_dir_all(mountpoint)
            .with_context(|| format!("creating the mount point {}", mountpoint.display()))?;
        let file = std::fs::File::create(&image)
            .with_context(|| format!("creating the image {}", image.display()))?;
        // Sparse: what `truncate -s` does.
        file.set_len(bytes)
            .with_context(|| format!("sizing the image {} to {bytes} bytes", image.display()))?;
        drop(file);
        // As the kernel reports them (mountinfo, a loop device's backing file).
        let image = std::fs::canonicalize(&image)?;
        let mountpoint = &std::fs::canonicalize(mountpoint)?;
        let made = (|| {
            run(Command::new("mkfs.xfs").args(["-q", "-f"]).arg(&image))?;
            let device = attach(&image)?;
            if let Err(e) = run(Command::new("mount").arg(&device).arg(mountpoint)) {
                let _ = run(Command::new("losetup").arg("-d").arg(&device));
                return Err(e);
            }
            Ok(device)
        })();
        let device = match made {
            Ok(d) => d,
            Err(e) => {
                let _ = std::fs::remove_file(&image);
                return Err(e);
            }
        };
        let disk = Disk {
            image,
            device,
            mountpoint: mountpoint.to_path_buf(),
        };
        let mut held = self.held.lock().unwrap();
        if held.closed {
            drop(held);
            let _ = teardown(&disk, true);
            bail!("the control plane has stopped");
        }
        info!(%handle, device = %disk.device, bytes, "fake CSI: XFS volume made");
        held.disks.insert(handle.to_string(), disk);
        Ok(())
    }

    /// ControllerExpandVolume + NodeExpandVolume: the image grows to `bytes`, then the mounted
    /// file system, online. False when `handle` is not a sized volume (nothing to grow).
    pub(crate) fn grow(&self, handle: &str, bytes: u64) -> anyhow::Result<bool> {
        let Some(disk) = self.held.lock().unwrap().disks.get(handle).cloned() else {
            return Ok(false);
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&disk.image)
            .with_context(|| format!("opening the image {}", disk.image.display()))?;
        let have = file.metadata()?.len();
        if bytes > have {
            file.set_len(bytes).with_context(|| {
                format!(
                    "growing the image {} to {bytes} bytes",
                    disk.image.display()
                )
            })?;
        }
        drop(file);
        run(Command::new("losetup").arg("-c").arg(&disk.device))?;
        run(Command::new("xfs_growfs").arg(&disk.mountpoint))?;
        info!(%handle, device = %disk.device, from = have, to = bytes, "fake CSI: XFS volume grown");
        Ok(true)
    }

    /// DeleteVolume: unmounted, detached, its image removed. False when `handle` is not a
    /// sized volume. An unmount that fails (a node's layer still holds the volume) is an error,
    /// to be tried again.
    pub(crate) fn delete(&self, handle: &str) -> anyhow::Result<bool> {
        let Some(disk) = self.held.lock().unwrap().disks.get(handle).cloned() else {
            return Ok(false);
        };
        teardown(&disk, false)?;
        self.held.lock().unwrap().disks.remove(handle);
        Ok(true)
    }

    /// The control plane stops: every volume is unmounted (lazily if something still holds it)
    /// and its loop device detached; none is made from now on.
    pub(crate) fn detach_all(&self) {
        let disks = {
            let mut held = self.held.lock().unwrap();
            held.closed = true;
            std::mem::take(&mut held.disks)
        };
        for (handle, disk) in disks {
            if let Err(e) = teardown(&disk, true) {
                warn!(%handle, device = %disk.device, error = %format!("{e:#}"), "detaching a volume's loop device");
            }
        }
    }
}

impl Drop for Disks {
    /// What the control plane's stop did not detach (a start that failed half way).
    fn drop(&mut self) {
        self.detach_all();
    }
}

/// The error of a claim too small for XFS.
pub(crate) fn too_small(bytes: u64) -> String {
    format!(
        "an XFS volume must be at least 300Mi ({XFS_MIN_BYTES} bytes): mkfs.xfs refuses smaller file systems; {bytes} bytes requested (EBS would round up to 1Gi, this test environment does not round)"
    )
}

/// Unmounts and detaches `disk` and removes its image. `force`: a busy mount is detached lazily
/// (`umount -l`) and the loop device freed once its last user goes (`losetup -d` on a busy
/// device sets autoclear).
fn teardown(disk: &Disk, force: bool) -> anyhow::Result<()> {
    if is_mounted(&disk.mountpoint) {
        let unmounted = run(Command::new("umount").arg(&disk.mountpoint));
        match unmounted {
            Ok(()) => {}
            Err(_) if force => run(Command::new("umount").arg("-l").arg(&disk.mountpoint))?,
            Err(e) => return Err(e),
        }
    }
    if backing_file(&disk.device).is_some_and(|b| Path::new(&b) == disk.image) {
        run(Command::new("losetup").arg("-d").arg(&disk.device))?;
    }
    match std::fs::remove_file(&disk.image) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", disk.image.display()))
        }
        _ => Ok(()),
    }
}

/// `losetup --find --show image`: the device. Tried again a few times: two processes that
/// look for a free device at once may be given the same one, and one of them fails.
fn attach(image: &Path) -> anyhow::Result<String> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match output(
            Command::new("losetup")
                .args(["--find", "--show"])
                .arg(image),
        ) {
            Ok(out) => return Ok(out.trim().to_string()),
            Err(e) if attempt >= 5 => return Err(e),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(100 * attempt)),
        }
    }
}

/// Runs `cmd`; an error names the command and holds what it printed on stderr.
fn run(cmd: &mut Command) -> anyhow::Result<()> {
    output(cmd).map(drop)
}

fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let line = format!("{cmd:?}").replace('"', "");
    let out = cmd.output().with_context(|| {
        format!("running {line} (xfsprogs and util-linux are needed for sized volumes)")
    })?;
    if !out.status.success() {
        bail!(
            "{line} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The file behind a loop device (`/dev/loopN`), as the kernel reports it.
fn backing_file(device: &str) -> Option<String> {
    let name = device.rsplit('/').next()?;
    let path = format!("/sys/block/{name}/loop/backing_file");
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// Mount points and their sources (`/proc/self/mountinfo`: the fifth field, and the one after
/// the ` - ` separator and the file system type).
fn mounts() -> Vec<(PathBuf, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (head, tail) = l.split_once(" - ")?;
            let point = head.split(' ').nth(4)?;
            let source = tail.split(' ').nth(1)?;
            Some((PathBuf::from(unescape(point)), unescape(source)))
        })
        .collect()
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn is_mounted(point: &Path) -> bool {
    mounts().iter().any(|(p, _)| p == point)
}

/// A process's start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Detaches the loop devices that back an image of a control plane whose process has ended
/// without stopping it (SIGKILL, a timeout): unmounted first (lazily), then `losetup -d`.
/// Only images under a `qdb-control-plane-*/volume-images/` directory whose owner file names
/// a process that no longer runs are touched; nothing else on the machine is.
pub(crate) fn reclaim() {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let device = format!("/dev/{name}");
        let Some(backing) = backing_file(&device) else {
            continue;
        };
        let image = Path::new(&backing);
        let Some(dir) = image.parent() else { continue };
        let ours = dir.file_name().is_some_and(|n| n == IMAGES_DIR)
            && dir
                .parent()
                .and_then(Path::file_name)
                .is_some_and(|n| n.to_string_lossy().starts_with("qdb-control-plane-"));
        if !ours {
            continue;
        }
        let Ok(owner) = std::fs::read_to_string(dir.join(OWNER_FILE)) else {
            continue;
        };
        let mut words = owner.split_whitespace();
        let (Some(pid), Some(start)) = (
            words.next().and_then(|w| w.parse::<u32>().ok()),
            words.next().and_then(|w| w.parse::<u64>().ok()),
        ) else {
            continue;
        };
        if start_time(pid) == Some(start) {
            continue;
        }
        for (point, _) in mounts().into_iter().filter(|(_, s)| *s == device) {
            if let Err(e) = run(Command::new("umount").arg("-l").arg(&point)) {
                warn!(%device, point = %point.display(), error = %format!("{e:#}"), "unmounting a leaked volume");
            }
        }
        match run(Command::new("losetup").arg("-d").arg(&device)) {
            Ok(()) => {
                info!(%device, image = %backing, pid, "detached a loop device a test process left behind")
            }
            Err(e) => warn!(%device, error = %format!("{e:#}"), "detaching a leaked loop device"),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(super::unescape(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(super::unescape("/dev/loop3"), "/dev/loop3");
        assert_eq!(super::unescape(r"x\"), r"x\");
    }

    #[test]
    fn this_process_has_a_start_time() {
        assert!(super::start_time(std::process::id()).is_some());
    }

    /// The harm: a test process killed before its control plane stopped leaves its loop
    /// devices attached, and the machine runs out of them. The next control plane's start
    /// detaches them, and only them.
    #[test]
    fn a_loop_device_a_dead_process_left_is_detached_by_the_next_start() {
        use super::*;
        let make = |owner: &str| {
            let root = tempfile::Builder::new()
                .prefix("qdb-control-plane-")
                .tempdir()
                .unwrap();
            let images = root.path().join(IMAGES_DIR);
            std::fs::create_dir_all(&images).unwrap();
            std::fs::write(images.join(OWNER_FILE), owner).unwrap();
            let image = images.join("vol-test.img");
            std::fs::File::create(&image)
                .unwrap()
                .set_len(1 << 20)
                .unwrap();
            let image = std::fs::canonicalize(image).unwrap();
            let device = attach(&image).unwrap();
            (root, image, device)
        };
        let mut child = Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let me = std::process::id();
        let (_dead_root, dead_image, dead_device) = make(&format!("{dead} 1\n"));
        let (_live_root, live_image, live_device) =
            make(&format!("{me} {}\n", start_time(me).unwrap()));
        reclaim();
        let backs = |device: &str, image: &Path| {
            backing_file(device).is_some_and(|b| Path::new(&b) == image)
        };
        let kept = backs(&live_device, &live_image);
        let _ = run(Command::new("losetup").arg("-d").arg(&live_device));
        assert!(kept, "a live control plane's device is left alone");
        assert!(
            !backs(&dead_device, &dead_image),
            "{dead_device} still backs {}",
            dead_image.display()
        );
    }
}
