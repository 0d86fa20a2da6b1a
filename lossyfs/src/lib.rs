//! A disk that loses what was not yet on it when the power goes: for tests only.
//!
//! [`LossyVolume::mount`] mounts a FUSE passthrough of a backing directory with the kernel's
//! writeback cache (`FUSE_WRITEBACK_CACHE`): a `write(2)` or a store into a `MAP_SHARED`
//! mapping leaves a dirty page in the kernel's page cache, and the page reaches this daemon
//! (which `pwrite`s it into the backing directory: "the disk") only when the kernel writes it
//! back: `fsync`/`fdatasync`/`msync(MS_SYNC)`/`sync()`/`syncfs()`, the flusher
//! (`vm.dirty_expire_centisecs` after the page was dirtied, or earlier under dirty-memory
//! pressure), or a `close(2)` (FUSE writes a file's dirty pages back on every `close` of a
//! descriptor of it, and on the last `munmap` after the last close).
//!
//! [`LossyVolume::cut`] is the power going: from then on every request is answered with `EIO`
//! without touching the backing directory (when `cut` returns, no request is still writing
//! into it), so the dirty pages still in the kernel never get there. The test then kills the
//! processes using the mount and unmounts; the backing directory is what the disk held.
//!
//! Needs root (or `CAP_SYS_ADMIN`) and `/dev/fuse`: the mount is made with `mount(2)`, there
//! is no `fusermount` fallback. [`available`] says whether this machine can.

mod fs;

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

use fuser::{BackgroundSession, Config, MountOption, Session, SessionACL};

use crate::fs::{LossyFs, Power};

/// Worker threads answering the kernel (a JVM does I/O from many threads).
const THREADS: usize = 4;

/// How long `unmount` waits for the session threads after the connection was ended.
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);

/// A mounted lossy passthrough of a backing directory. Dropping it unmounts (as [`unmount`],
/// errors ignored).
///
/// [`unmount`]: LossyVolume::unmount
pub struct LossyVolume {
    mountpoint: PathBuf,
    backing: PathBuf,
    power: Arc<Power>,
    session: Option<BackgroundSession>,
    /// `/sys/fs/fuse/connections/<dev>/abort` of this mount, opened while the mount was
    /// surely ours: ends the connection even if a lazily unmounted file is still open.
    abort: Option<File>,
}

impl std::fmt::Debug for LossyVolume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LossyVolume")
            .field("mountpoint", &self.mountpoint)
            .field("backing", &self.backing)
            .field("cut", &self.power.is_cut())
            .field("mounted", &self.session.is_some())
            .finish()
    }
}

/// Cuts the power of a [`LossyVolume`] from anywhere (another thread, a struct that does not
/// own the volume).
#[derive(Clone)]
pub struct Cutter(Arc<Power>);

impl Cutter {
    /// As [`LossyVolume::cut`].
    pub fn cut(&self) {
        self.0.cut();
    }

    /// As [`LossyVolume::is_cut`].
    pub fn is_cut(&self) -> bool {
        self.0.is_cut()
    }
}

impl std::fmt::Debug for Cutter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cutter")
            .field("cut", &self.0.is_cut())
            .finish()
    }
}

fn raise_nofile_limit() {
    // Each inode the kernel holds keeps an O_PATH descriptor here.
    // SAFETY: `lim` is written by getrlimit before it is read.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)
}

impl LossyVolume {
    /// Mounts a passthrough of `backing` (must exist) at `mountpoint` (created if missing).
    pub fn mount(backing: &Path, mountpoint: &Path) -> io::Result<LossyVolume> {
        let backing = backing.canonicalize()?;
        if !backing.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("backing {} is not a directory", backing.display()),
            ));
        }
        std::fs::create_dir_all(mountpoint)?;
        let mountpoint = mountpoint.canonicalize()?;
        raise_nofile_limit();

        let power = Arc::new(Power::default());
        let fs = LossyFs::new(&backing, power.clone())?;
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName(format!("lossyfs:{}", backing.display())),
            MountOption::Subtype("lossyfs".into()),
            // The kernel checks permissions as for any file system (the daemon is root).
            MountOption::DefaultPermissions,
        ];
        // `allow_other`: the database under test may run as another user.
        config.acl = SessionACL::All;
        config.n_threads = Some(THREADS);
        config.clone_fd = true;
        // Mounts with mount(2) and answers the kernel's INIT before returning.
        let session = Session::new(fs, &mountpoint, &config)?.spawn()?;
        let mut volume = LossyVolume {
            mountpoint,
            backing,
            power,
            session: Some(session),
            abort: None,
        };
        // The connection's name in fusectl is the kernel's dev_t of the mount.
        let dev = std::fs::metadata(&volume.mountpoint)?.dev();
        let kdev = (libc::major(dev) << 20) | libc::minor(dev);
        volume.abort = OpenOptions::new()
            .write(true)
            .open(format!("/sys/fs/fuse/connections/{kdev}/abort"))
            .ok();
        Ok(volume)
    }

    /// Where the volume is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The directory that is "the disk".
    pub fn backing(&self) -> &Path {
        &self.backing
    }

    /// The power goes: nothing more reaches the backing directory (every request, from now
    /// on, is answered with `EIO`; when this returns, no request is still writing into it).
    /// Idempotent.
    pub fn cut(&self) {
        self.power.cut();
    }

    /// Whether the power was cut.
    pub fn is_cut(&self) -> bool {
        self.power.is_cut()
    }

    /// A handle that cuts this volume's power from elsewhere.
    pub fn cutter(&self) -> Cutter {
        Cutter(self.power.clone())
    }

    /// A clean shutdown: unless cut, first writes back what the kernel holds (`syncfs` on the
    /// mount), then unmounts (lazily: open files of killed processes can't block it), ends the
    /// connection (files still open elsewhere get `ENOTCONN`) and the session threads.
    pub fn unmount(mut self) -> io::Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        let mut result = Ok(());
        if !self.power.is_cut() {
            result = syncfs(&self.mountpoint);
        }
        let path = cstring(&self.mountpoint)?;
        // SAFETY: valid C string.
        if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
            let err = io::Error::last_os_error();
            if result.is_ok() {
                result = Err(err);
            }
        }
        // A lazily unmounted file system lives on while a file of it is open (a process not
        // yet reaped, a descriptor of the test): end the connection so the threads end. If it
        // is gone already, the write is a no-op.
        if let Some(mut abort) = self.abort.take() {
            let _ = abort.write_all(b"1");
        }
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("lossyfs-join".into())
            .spawn(move || {
                let _ = tx.send(session.join());
            })?;
        let joined = match rx.recv_timeout(JOIN_TIMEOUT) {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the FUSE session of {} did not end within {JOIN_TIMEOUT:?}",
                    self.mountpoint.display()
                ),
            )),
        };
        result.and(joined)
    }
}

impl Drop for LossyVolume {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

fn syncfs(path: &Path) -> io::Result<()> {
    let dir = File::open(path)?;
    // SAFETY: valid descriptor.
    if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this machine can mount the layer: `Err` says why, in words a test failure can print.
/// Probes once per process (opens `/dev/fuse`, mounts and unmounts a volume in the temp dir).
pub fn available() -> Result<(), String> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE.get_or_init(probe).clone()
}

fn probe() -> Result<(), String> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| {
            format!(
                "cannot open /dev/fuse ({e}): the kernel needs FUSE (`modprobe fuse`) and a \
                 container the device (`--device /dev/fuse`)"
            )
        })?;
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "lossyfs-probe-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let (backing, mnt) = (dir.join("backing"), dir.join("mnt"));
    let result = (|| {
        std::fs::create_dir_all(&backing)
            .map_err(|e| format!("cannot create {}: {e}", backing.display()))?;
        let volume = LossyVolume::mount(&backing, &mnt).map_err(|e| {
            format!(
                "cannot mount a FUSE file system ({e}): lossyfs mounts with mount(2), which \
                 needs root or CAP_SYS_ADMIN (there is no fusermount fallback)"
            )
        })?;
        std::fs::write(volume.mountpoint().join("probe"), b"probe")
            .map_err(|e| format!("cannot write through the mounted layer: {e}"))?;
        volume
            .unmount()
            .map_err(|e| format!("cannot unmount the layer: {e}"))?;
        match std::fs::read(backing.join("probe")) {
            Ok(b) if b == b"probe" => Ok(()),
            other => Err(format!(
                "a file written through the layer did not reach the backing directory: {other:?}"
            )),
        }
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
