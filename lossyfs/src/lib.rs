//! A disk that loses what was not yet on it when the power goes: for tests only.
//!
//! [`LossyVolume::mount`] mounts a FUSE passthrough of a backing directory with the kernel's
//! writeback cache (`FUSE_WRITEBACK_CACHE`): a `write(2)` or a store into a `MAP_SHARED`
//! mapping leaves a dirty page in the kernel's page cache, and the page reaches this daemon
//! (which `pwrite`s it into the backing directory: "the disk") only when the kernel writes it
//! back:
//!
//! - `fsync`, `fdatasync`, `msync(MS_SYNC)`: written back before they return;
//! - `sync()`, `syncfs()`: written back, but (Linux 6.19 and stable backports such as this
//!   6.18.y) **not waited for** on a FUSE mount: they may return with the WRITE requests still
//!   queued for the daemon. [`LossyVolume::settle`] waits for them;
//! - the flusher, `vm.dirty_expire_centisecs` after the page was dirtied (or earlier past the
//!   global dirty limits: the mount gets a disk's share of them, not FUSE's default 1%);
//! - FUSE's own write-backs, which a disk's file system does not do: every `close(2)` of any
//!   descriptor of a file (also one only read, or one inherited by a child that exits or
//!   `exec`s), the last `munmap` after the last close, `chmod`/`chown`/`utimes` of a file,
//!   `lseek(SEEK_DATA/SEEK_HOLE)`, and `fallocate` punching or zeroing a range.
//!
//! [`LossyVolume::cut`] is the power going: from then on every request is answered with `EIO`
//! without touching the backing directory (when `cut` returns, no request is still writing
//! into it), so the dirty pages still in the kernel never get there. The test then kills the
//! processes using the mount and unmounts; the backing directory is what the disk held.
//! Directory operations (create, mkdir, rename, unlink, truncate, ...) are synchronous: done
//! on the disk before they return.
//!
//! Needs root (or `CAP_SYS_ADMIN`) and `/dev/fuse`: the mount is made with `mount(2)`, there
//! is no `fusermount` fallback. [`available`] says whether this machine can.

mod fs;

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

use fuser::{BackgroundSession, Config, Session, SessionACL};

use crate::fs::{LossyFs, Power};

/// Worker threads answering the kernel (a JVM does I/O from many threads).
const THREADS: usize = 4;

/// How long `unmount` waits for the session threads after the connection was ended.
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a clean unmount waits for the writeback its `syncfs` started.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// `/sys/fs/fuse/connections/<dev>` (an `O_PATH` descriptor: a later connection that
    /// reuses the name is not this one), whose `waiting` counts the requests the kernel has
    /// not had answered.
    conn: Option<Arc<OwnedFd>>,
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
pub struct Cutter {
    power: Arc<Power>,
    conn: Option<Arc<OwnedFd>>,
}

impl Cutter {
    /// As [`LossyVolume::cut`].
    pub fn cut(&self) {
        self.power.cut();
    }

    /// As [`LossyVolume::is_cut`].
    pub fn is_cut(&self) -> bool {
        self.power.is_cut()
    }

    /// As [`LossyVolume::settle`].
    pub fn settle(&self, timeout: Duration) -> bool {
        settle(self.conn.as_deref(), &self.power, timeout)
    }
}

impl std::fmt::Debug for Cutter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cutter")
            .field("cut", &self.power.is_cut())
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

/// Mounts the FUSE control file system on `/sys/fs/fuse/connections` when nothing has: a
/// mount's `abort` and `waiting` files are there (the cut and [`LossyVolume::settle`] need
/// them). systemd mounts it at boot (`sys-fs-fuse-connections.mount`); a machine or container
/// without systemd may not (seen: a fresh CI machine, where every settle then failed at once).
/// Best effort, once: root's, like the FUSE mount itself.
fn ensure_fusectl() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        let dir = Path::new("/sys/fs/fuse/connections");
        let mounted = std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| {
            m.lines()
                .any(|l| l.split_whitespace().nth(2) == Some("fusectl"))
        });
        if mounted || !dir.is_dir() {
            return;
        }
        // SAFETY: valid C strings; no data argument.
        unsafe {
            libc::mount(
                c"fusectl".as_ptr(),
                c"/sys/fs/fuse/connections".as_ptr(),
                c"fusectl".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
    });
}

/// Lets the mount hold as many dirty pages as a disk's file system would. The kernel gives a
/// FUSE mount's writeback 1% of the dirty-page limits and a strict limit: past about 1% of
/// `vm.dirty_ratio` of memory (45 MiB here) unsynced data is written back at once, not after
/// `vm.dirty_expire_centisecs`; a power cut would lose far less than it does on a disk.
/// Best effort: the knobs are root's (`strict_limit` since Linux 6.2).
fn relax_dirty_limits(major: u32, minor: u32) {
    let bdi = format!("/sys/class/bdi/{major}:{minor}");
    let _ = std::fs::write(format!("{bdi}/strict_limit"), "0");
    let _ = std::fs::write(format!("{bdi}/max_ratio"), "100");
}

/// Mounts a FUSE file system of `/dev/fuse` (returned: the kernel's INIT waits on it) at
/// `mountpoint` with mount(2).
fn mount_fuse(backing: &Path, mountpoint: &Path) -> io::Result<OwnedFd> {
    let device = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")?;
    let root_mode = std::fs::metadata(backing)?.mode() & libc::S_IFMT;
    // SAFETY: no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // default_permissions: the kernel checks permissions as for any file system (the daemon
    // is root); allow_other: processes of other users may use the mount.
    let options = format!(
        "fd={},rootmode={root_mode:o},user_id={uid},group_id={gid},default_permissions,allow_other",
        device.as_raw_fd()
    );
    let source =
        CString::new(format!("lossyfs:{}", backing.display())).map_err(io::Error::other)?;
    let target = cstring(mountpoint)?;
    let options = CString::new(options).map_err(io::Error::other)?;
    // SAFETY: valid C strings.
    let r = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            c"fuse.lossyfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            options.as_ptr().cast(),
        )
    };
    if r != 0 {
        let err = io::Error::last_os_error();
        return Err(io::Error::new(
            err.kind(),
            format!("mount(2) of FUSE at {}: {err}", mountpoint.display()),
        ));
    }
    Ok(OwnedFd::from(device))
}

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)
}

impl LossyVolume {
    /// Mounts a passthrough of `backing` (must exist) at `mountpoint` (created if missing).
    ///
    /// Also raises this process's soft `RLIMIT_NOFILE` to its hard limit (the daemon keeps a
    /// descriptor per inode the kernel holds) and lifts the mount's FUSE-specific dirty-page
    /// limits to a disk's (`/sys/class/bdi/<dev>/{strict_limit,max_ratio}`).
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
        config.n_threads = Some(THREADS);
        config.clone_fd = true;
        // Mounted here rather than by fuser, whose unmount-on-drop is a plain umount(2) of the
        // path: this volume's unmount is lazy and ends the connection itself.
        let device = mount_fuse(&backing, &mountpoint)?;
        // `SessionACL::All`: the database under test may run as another user (`allow_other`).
        let session = Session::from_fd(fs, device, SessionACL::All, config)
            .and_then(Session::spawn)
            .inspect_err(|_| {
                if let Ok(path) = cstring(&mountpoint) {
                    // SAFETY: valid C string.
                    unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
                }
            })?;
        let mut volume = LossyVolume {
            mountpoint,
            backing,
            power,
            session: Some(session),
            abort: None,
            conn: None,
        };
        ensure_fusectl();
        // The connection's name in fusectl is the kernel's dev_t of the mount.
        let dev = std::fs::metadata(&volume.mountpoint)?.dev();
        let kdev = (libc::major(dev) << 20) | libc::minor(dev);
        relax_dirty_limits(libc::major(dev), libc::minor(dev));
        let conn = format!("/sys/fs/fuse/connections/{kdev}");
        volume.abort = OpenOptions::new()
            .write(true)
            .open(format!("{conn}/abort"))
            .ok();
        volume.conn = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(&conn)
            .ok()
            .map(|f| Arc::new(OwnedFd::from(f)));
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
        Cutter {
            power: self.power.clone(),
            conn: self.conn.clone(),
        }
    }

    /// Waits (up to `timeout`) until the kernel has no request outstanding on this mount, and
    /// says whether it got there (`false` also when cut, or when the connection's counters
    /// are not readable: fusectl not mounted on `/sys/fs/fuse/connections`).
    ///
    /// Use it between a `sync()`/`syncfs()` and [`cut`] when what the sync started must count
    /// as on the disk. Recent kernels (this 6.18.44 among them; upstream commit
    /// "fs/writeback: skip AS_NO_DATA_INTEGRITY mappings in wait_sb_inodes()", sent to the
    /// stable trees) start the writeback of a FUSE writeback-cache mount's dirty pages in
    /// `sync()` and `syncfs()` but do not wait for it: they can return while the WRITE
    /// requests are still queued for this daemon. `fsync`, `fdatasync`, `msync(MS_SYNC)` and
    /// `close` do wait.
    ///
    /// [`cut`]: LossyVolume::cut
    pub fn settle(&self, timeout: Duration) -> bool {
        settle(self.conn.as_deref(), &self.power, timeout)
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
            // syncfs starts the writeback and the settling waits for it (see `settle`).
            result = syncfs(&self.mountpoint);
            let settled = match self.conn.as_deref() {
                Some(conn) => settle(Some(conn), &self.power, SETTLE_TIMEOUT),
                // No counters to watch: give the queued writes a moment.
                None => {
                    std::thread::sleep(Duration::from_millis(100));
                    true
                }
            };
            if !settled && result.is_ok() {
                result = Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the kernel still had requests outstanding on {} after {SETTLE_TIMEOUT:?}",
                        self.mountpoint.display()
                    ),
                ));
            }
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

// Volumes and cutters are handed between test threads.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<LossyVolume>();
    send_sync::<Cutter>();
};

impl Drop for LossyVolume {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Polls the connection's count of outstanding requests until it is zero (every request the
/// kernel had issued when the wait began has been answered: a count is only zero when all are).
fn settle(conn: Option<&OwnedFd>, power: &Power, timeout: Duration) -> bool {
    let Some(conn) = conn else {
        return false;
    };
    let deadline = Instant::now() + timeout;
    loop {
        if power.is_cut() {
            return false;
        }
        match waiting(conn) {
            Some(0) => return true,
            Some(_) => {}
            None => return false,
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The connection's `waiting` count (the file is not seekable: opened for each read).
fn waiting(conn: &OwnedFd) -> Option<u64> {
    // SAFETY: valid directory descriptor and C string; the descriptor is owned by `file`.
    let fd = unsafe {
        libc::openat(
            conn.as_raw_fd(),
            c"waiting".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: just opened, owned here.
    let mut file = unsafe { File::from_raw_fd(fd) };
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

fn syncfs(path: &Path) -> io::Result<()> {
    let dir = File::open(path)?;
    // SAFETY: valid descriptor.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
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
