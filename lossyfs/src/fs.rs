//! The FUSE passthrough: every request is done on the backing directory by file descriptor
//! (each inode the kernel knows holds an `O_PATH` descriptor of its backing file, as libfuse's
//! `passthrough_ll` does), so renames of files and directories, hard links and unlinked open
//! files need no path bookkeeping. After the cut every request but `forget`/`release`/
//! `releasedir` is answered with `EIO` without touching the backing directory.

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

/// How long the kernel may cache attributes and names: only this mount changes the backing
/// directory, so the kernel's cache is never stale for longer than its own requests take.
const TTL: Duration = Duration::from_secs(1);

/// The largest write request: the kernel's default `max_pages_limit` (256 pages).
const MAX_WRITE: u32 = 1 << 20;

/// Whether the power is gone, shared by the volume, its cutters and the filesystem.
#[derive(Debug, Default)]
pub(crate) struct Power {
    cut: AtomicBool,
    /// Held (shared) by every request while it works on the backing directory, taken
    /// (exclusively) by `cut` once: when `cut` returns, no request is still writing.
    gate: RwLock<()>,
}

impl Power {
    pub(crate) fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        // Wait for the requests that passed the check before the flag was set.
        drop(self.gate.write().unwrap_or_else(|e| e.into_inner()));
    }

    pub(crate) fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }

    /// Admission of a request that touches the backing directory: `EIO` once cut.
    fn enter(&self) -> Result<RwLockReadGuard<'_, ()>, Errno> {
        let guard = self.gate.read().unwrap_or_else(|e| e.into_inner());
        if self.is_cut() {
            return Err(Errno::EIO);
        }
        Ok(guard)
    }
}

struct Node {
    /// `O_PATH | O_NOFOLLOW` descriptor of the backing file.
    fd: Arc<OwnedFd>,
    key: (u64, u64),
    nlookup: u64,
}

/// The kernel's inode numbers (our own, never reused) ↔ backing files (by `st_dev, st_ino`,
/// so hard links are one inode).
struct Inodes {
    nodes: HashMap<u64, Node>,
    by_key: HashMap<(u64, u64), u64>,
    next: u64,
}

impl Inodes {
    fn fd(&self, ino: INodeNo) -> Result<Arc<OwnedFd>, Errno> {
        self.nodes
            .get(&ino.0)
            .map(|n| n.fd.clone())
            .ok_or(Errno::ESTALE)
    }

    /// One more kernel reference to the backing file `fd` with status `st`.
    fn remember(&mut self, fd: OwnedFd, st: &libc::stat) -> u64 {
        let key = (st.st_dev, st.st_ino);
        if let Some(&ino) = self.by_key.get(&key) {
            if let Some(node) = self.nodes.get_mut(&ino) {
                node.nlookup += 1;
                return ino;
            }
        }
        let ino = self.next;
        self.next += 1;
        self.nodes.insert(
            ino,
            Node {
                fd: Arc::new(fd),
                key,
                nlookup: 1,
            },
        );
        self.by_key.insert(key, ino);
        ino
    }

    fn forget(&mut self, ino: u64, n: u64) {
        if ino == fuser::INodeNo::ROOT.0 {
            return;
        }
        let Some(node) = self.nodes.get_mut(&ino) else {
            return;
        };
        node.nlookup = node.nlookup.saturating_sub(n);
        if node.nlookup == 0 {
            let key = node.key;
            self.nodes.remove(&ino);
            if self.by_key.get(&key) == Some(&ino) {
                self.by_key.remove(&key);
            }
        }
    }
}

/// An open directory stream (`readdir` resumes from the kernel's offset, a `d_off` cookie).
struct DirStream {
    dir: *mut libc::DIR,
    /// The offset the stream is at, `None` when unknown (the kernel's next offset is sought).
    pos: Option<u64>,
}

// SAFETY: the `DIR` is only used behind its mutex, by one thread at a time.
unsafe impl Send for DirStream {}

impl Drop for DirStream {
    fn drop(&mut self) {
        // SAFETY: `dir` came from `fdopendir` and is closed once.
        unsafe { libc::closedir(self.dir) };
    }
}

pub(crate) struct LossyFs {
    power: Arc<Power>,
    inodes: Mutex<Inodes>,
    files: RwLock<HashMap<u64, Arc<OwnedFd>>>,
    dirs: Mutex<HashMap<u64, Arc<Mutex<DirStream>>>>,
    next_fh: AtomicU64,
    /// This process's umask: the kernel already applied the caller's, ours must not apply again.
    umask: u32,
    euid: u32,
}

fn last_errno() -> Errno {
    Errno::from_i32(
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO),
    )
}

fn check(ret: libc::c_int) -> Result<libc::c_int, Errno> {
    if ret < 0 {
        Err(last_errno())
    } else {
        Ok(ret)
    }
}

fn check_size(ret: isize) -> Result<usize, Errno> {
    if ret < 0 {
        Err(last_errno())
    } else {
        Ok(ret as usize)
    }
}

fn cname(name: &OsStr) -> Result<CString, Errno> {
    CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)
}

/// `/proc/self/fd/N`: reopens (or acts on) exactly the file `fd` refers to, even unlinked.
fn proc_path(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL in a number")
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn open_at(dir: RawFd, name: &CStr, flags: libc::c_int, mode: u32) -> Result<OwnedFd, Errno> {
    // SAFETY: valid C string; the returned descriptor is owned here.
    let fd = check(unsafe { libc::openat(dir, name.as_ptr(), flags, mode as libc::c_uint) })?;
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn stat_fd(fd: RawFd) -> Result<libc::stat, Errno> {
    // SAFETY: `st` is written by the kernel before it is read.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe {
        libc::fstatat(
            fd,
            c"".as_ptr(),
            &mut st,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

fn system_time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nsecs as u64)
    }
}

fn file_type(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn attr(ino: u64, st: &libc::stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: system_time(st.st_atime, st.st_atime_nsec),
        mtime: system_time(st.st_mtime, st.st_mtime_nsec),
        ctime: system_time(st.st_ctime, st.st_ctime_nsec),
        crtime: UNIX_EPOCH,
        kind: file_type(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

fn timespec(t: Option<TimeOrNow>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(TimeOrNow::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            },
            Err(e) => {
                let d = e.duration();
                let (mut secs, mut nanos) = (-(d.as_secs() as i64), -(d.subsec_nanos() as i64));
                if nanos < 0 {
                    secs -= 1;
                    nanos += 1_000_000_000;
                }
                libc::timespec {
                    tv_sec: secs as libc::time_t,
                    tv_nsec: nanos as libc::c_long,
                }
            }
        },
    }
}

/// The flags the backing file is opened with. With the writeback cache the kernel reads pages
/// of files opened write-only (a partial page write) and handles `O_APPEND` itself (it sends
/// writes at explicit offsets); the host never loses power, so no `O_SYNC`; `O_DIRECT` would
/// need aligned buffers.
fn backing_flags(flags: i32) -> i32 {
    let mut f = flags
        & !(libc::O_APPEND
            | libc::O_DIRECT
            | libc::O_SYNC
            | libc::O_DSYNC
            | libc::O_NOCTTY
            | libc::O_NOFOLLOW);
    if f & libc::O_ACCMODE == libc::O_WRONLY {
        f = (f & !libc::O_ACCMODE) | libc::O_RDWR;
    }
    f | libc::O_CLOEXEC
}

fn umask_of_process() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

impl LossyFs {
    pub(crate) fn new(backing: &Path, power: Arc<Power>) -> io::Result<LossyFs> {
        let c = CString::new(backing.as_os_str().as_bytes())?;
        let to_io = |e: Errno| io::Error::from_raw_os_error(e.code());
        let root = open_at(
            libc::AT_FDCWD,
            &c,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            0,
        )
        .map_err(to_io)?;
        let st = stat_fd(root.as_raw_fd()).map_err(to_io)?;
        let key = (st.st_dev, st.st_ino);
        let mut inodes = Inodes {
            nodes: HashMap::new(),
            by_key: HashMap::new(),
            next: INodeNo::ROOT.0 + 1,
        };
        inodes.nodes.insert(
            INodeNo::ROOT.0,
            Node {
                fd: Arc::new(root),
                key,
                nlookup: 1,
            },
        );
        inodes.by_key.insert(key, INodeNo::ROOT.0);
        Ok(LossyFs {
            power,
            inodes: Mutex::new(inodes),
            files: RwLock::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            umask: umask_of_process(),
            // SAFETY: no preconditions.
            euid: unsafe { libc::geteuid() },
        })
    }

    fn node(&self, ino: INodeNo) -> Result<Arc<OwnedFd>, Errno> {
        lock(&self.inodes).fd(ino)
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<OwnedFd>, Errno> {
        self.files
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&fh.0)
            .cloned()
            .ok_or(Errno::EBADF)
    }

    fn add_file(&self, fd: OwnedFd) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fh, Arc::new(fd));
        fh
    }

    /// Looks `name` up in `parent` and counts one kernel reference to it.
    fn lookup_entry(&self, parent: RawFd, name: &CStr) -> Result<FileAttr, Errno> {
        let fd = open_at(
            parent,
            name,
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0,
        )?;
        let st = stat_fd(fd.as_raw_fd())?;
        let ino = lock(&self.inodes).remember(fd, &st);
        Ok(attr(ino, &st))
    }

    /// Gives a freshly created `name` in `parent` the exact `mode` (our umask must not apply
    /// twice) and the caller as owner.
    fn settle_new(
        &self,
        req: &Request,
        parent: RawFd,
        name: &CStr,
        mode: Option<u32>,
    ) -> Result<(), Errno> {
        if let Some(mode) = mode {
            if mode & self.umask & 0o7777 != 0 {
                // SAFETY: valid C string.
                check(unsafe { libc::fchmodat(parent, name.as_ptr(), mode & 0o7777, 0) })?;
            }
        }
        if req.uid() != self.euid {
            // SAFETY: valid C string.
            check(unsafe {
                libc::fchownat(
                    parent,
                    name.as_ptr(),
                    req.uid(),
                    req.gid(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            })?;
        }
        Ok(())
    }

    fn do_getattr(&self, ino: INodeNo, fh: Option<FileHandle>) -> Result<FileAttr, Errno> {
        let _g = self.power.enter()?;
        let st = match fh.and_then(|fh| self.file(fh).ok()) {
            Some(fd) => {
                // SAFETY: `st` is written by the kernel before it is read.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
                st
            }
            None => stat_fd(self.node(ino)?.as_raw_fd())?,
        };
        Ok(attr(ino.0, &st))
    }

    #[allow(clippy::too_many_arguments)]
    fn do_setattr(
        &self,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        fh: Option<FileHandle>,
    ) -> Result<FileAttr, Errno> {
        let g = self.power.enter()?;
        let node = self.node(ino)?;
        let file = fh.and_then(|fh| self.file(fh).ok());
        let path = proc_path(node.as_raw_fd());
        if let Some(mode) = mode {
            // SAFETY: valid descriptor / C string.
            check(unsafe {
                match &file {
                    Some(fd) => libc::fchmod(fd.as_raw_fd(), mode & 0o7777),
                    None => libc::chmod(path.as_ptr(), mode & 0o7777),
                }
            })?;
        }
        if uid.is_some() || gid.is_some() {
            // SAFETY: valid descriptor and empty C string.
            check(unsafe {
                libc::fchownat(
                    node.as_raw_fd(),
                    c"".as_ptr(),
                    uid.unwrap_or(u32::MAX),
                    gid.unwrap_or(u32::MAX),
                    libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
                )
            })?;
        }
        if let Some(size) = size {
            // SAFETY: valid descriptor / C string.
            check(unsafe {
                match &file {
                    Some(fd) => libc::ftruncate(fd.as_raw_fd(), size as libc::off_t),
                    None => libc::truncate(path.as_ptr(), size as libc::off_t),
                }
            })?;
        }
        if atime.is_some() || mtime.is_some() {
            let times = [timespec(atime), timespec(mtime)];
            // SAFETY: valid descriptor / C string and two timespecs.
            check(unsafe {
                match &file {
                    Some(fd) => libc::futimens(fd.as_raw_fd(), times.as_ptr()),
                    None => libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), 0),
                }
            })?;
        }
        drop(g);
        self.do_getattr(ino, fh)
    }

    fn do_create_entry(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        make: impl FnOnce(RawFd, &CStr) -> libc::c_int,
        mode: Option<u32>,
    ) -> Result<FileAttr, Errno> {
        let _g = self.power.enter()?;
        let pfd = self.node(parent)?;
        let name = cname(name)?;
        check(make(pfd.as_raw_fd(), &name))?;
        self.settle_new(req, pfd.as_raw_fd(), &name, mode)?;
        self.lookup_entry(pfd.as_raw_fd(), &name)
    }

    fn do_create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Result<(FileAttr, u64), Errno> {
        let _g = self.power.enter()?;
        let pfd = self.node(parent)?;
        let name = cname(name)?;
        let fd = open_at(
            pfd.as_raw_fd(),
            &name,
            backing_flags(flags) | libc::O_CREAT | libc::O_NOFOLLOW,
            mode,
        )?;
        if mode & self.umask & 0o7777 != 0 {
            // SAFETY: valid descriptor.
            check(unsafe { libc::fchmod(fd.as_raw_fd(), mode & 0o7777) })?;
        }
        if req.uid() != self.euid {
            // SAFETY: valid descriptor.
            check(unsafe { libc::fchown(fd.as_raw_fd(), req.uid(), req.gid()) })?;
        }
        let path = open_at(
            libc::AT_FDCWD,
            &proc_path(fd.as_raw_fd()),
            libc::O_PATH | libc::O_CLOEXEC,
            0,
        )?;
        let st = stat_fd(path.as_raw_fd())?;
        let ino = lock(&self.inodes).remember(path, &st);
        let fh = self.add_file(fd);
        Ok((attr(ino, &st), fh))
    }

    fn do_readdir(
        &self,
        fh: FileHandle,
        offset: u64,
        reply: &mut ReplyDirectory,
    ) -> Result<(), Errno> {
        let _g = self.power.enter()?;
        let stream = lock(&self.dirs).get(&fh.0).cloned().ok_or(Errno::EBADF)?;
        let mut d = lock(&stream);
        if d.pos != Some(offset) {
            // SAFETY: `dir` is open; the offset is a cookie from this stream (or 0).
            unsafe { libc::seekdir(d.dir, offset as libc::c_long) };
            d.pos = Some(offset);
        }
        loop {
            // SAFETY: errno is thread-local; `readdir64` returns an entry valid until the next
            // call on this stream, which the mutex serialises.
            unsafe { *libc::__errno_location() = 0 };
            let ent = unsafe { libc::readdir64(d.dir) };
            if ent.is_null() {
                let err = io::Error::last_os_error().raw_os_error().unwrap_or(0);
                if err != 0 {
                    return Err(Errno::from_i32(err));
                }
                return Ok(());
            }
            // SAFETY: non-null entry from readdir64.
            let ent = unsafe { &*ent };
            let name = unsafe { CStr::from_ptr(ent.d_name.as_ptr()) };
            let kind = match ent.d_type {
                libc::DT_DIR => FileType::Directory,
                libc::DT_REG => FileType::RegularFile,
                libc::DT_LNK => FileType::Symlink,
                libc::DT_FIFO => FileType::NamedPipe,
                libc::DT_SOCK => FileType::Socket,
                libc::DT_CHR => FileType::CharDevice,
                libc::DT_BLK => FileType::BlockDevice,
                _ => {
                    // SAFETY: `st` is written before read; valid directory fd and name.
                    let mut st: libc::stat = unsafe { std::mem::zeroed() };
                    let r = unsafe {
                        libc::fstatat(
                            libc::dirfd(d.dir),
                            name.as_ptr(),
                            &mut st,
                            libc::AT_SYMLINK_NOFOLLOW,
                        )
                    };
                    if r < 0 {
                        continue;
                    }
                    file_type(st.st_mode)
                }
            };
            let next = ent.d_off as u64;
            if reply.add(
                INodeNo(ent.d_ino),
                next,
                kind,
                OsStr::from_bytes(name.to_bytes()),
            ) {
                // Full: this entry is not sent, the kernel asks again from `d.pos`.
                d.pos = None;
                return Ok(());
            }
            d.pos = Some(next);
        }
    }
}

/// Replies `Ok` values or the error.
macro_rules! answer {
    ($reply:ident, $res:expr, |$v:pat_param| $ok:expr) => {
        match $res {
            Ok($v) => $ok,
            Err(e) => $reply.error(e),
        }
    };
}

impl Filesystem for LossyFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        config
            .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
            .map_err(|_| io::Error::other("the kernel does not offer FUSE_WRITEBACK_CACHE"))?;
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let res = (|| {
            let _g = self.power.enter()?;
            let pfd = self.node(parent)?;
            self.lookup_entry(pfd.as_raw_fd(), &cname(name)?)
        })();
        answer!(reply, res, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        lock(&self.inodes).forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        answer!(reply, self.do_getattr(ino, fh), |a| reply.attr(&TTL, &a));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let res = self.do_setattr(ino, mode, uid, gid, size, atime, mtime, fh);
        answer!(reply, res, |a| reply.attr(&TTL, &a));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let res = (|| {
            let _g = self.power.enter()?;
            let fd = self.node(ino)?;
            let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
            // SAFETY: `buf` is writable for its length.
            let n = check_size(unsafe {
                libc::readlinkat(
                    fd.as_raw_fd(),
                    c"".as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            })?;
            buf.truncate(n);
            Ok(buf)
        })();
        answer!(reply, res, |b| reply.data(&b));
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let res = self.do_create_entry(
            req,
            parent,
            name,
            // SAFETY: valid descriptor and C string.
            |dir, n| unsafe { libc::mknodat(dir, n.as_ptr(), mode, rdev as libc::dev_t) },
            Some(mode),
        );
        answer!(reply, res, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let res = self.do_create_entry(
            req,
            parent,
            name,
            // SAFETY: valid descriptor and C string.
            |dir, n| unsafe { libc::mkdirat(dir, n.as_ptr(), mode) },
            Some(mode),
        );
        answer!(reply, res, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let res = (|| {
            let _g = self.power.enter()?;
            let pfd = self.node(parent)?;
            let name = cname(name)?;
            // SAFETY: valid descriptor and C string.
            check(unsafe { libc::unlinkat(pfd.as_raw_fd(), name.as_ptr(), 0) })
        })();
        answer!(reply, res, |_| reply.ok());
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let res = (|| {
            let _g = self.power.enter()?;
            let pfd = self.node(parent)?;
            let name = cname(name)?;
            // SAFETY: valid descriptor and C string.
            check(unsafe { libc::unlinkat(pfd.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) })
        })();
        answer!(reply, res, |_| reply.ok());
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let res = match CString::new(target.as_os_str().as_bytes()) {
            Ok(target) => self.do_create_entry(
                req,
                parent,
                link_name,
                // SAFETY: valid descriptor and C strings.
                |dir, n| unsafe { libc::symlinkat(target.as_ptr(), dir, n.as_ptr()) },
                None,
            ),
            Err(_) => Err(Errno::EINVAL),
        };
        answer!(reply, res, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let res = (|| {
            let _g = self.power.enter()?;
            let from = self.node(parent)?;
            let to = self.node(newparent)?;
            let (name, newname) = (cname(name)?, cname(newname)?);
            // SAFETY: valid descriptors and C strings.
            check(unsafe {
                libc::syscall(
                    libc::SYS_renameat2,
                    from.as_raw_fd(),
                    name.as_ptr(),
                    to.as_raw_fd(),
                    newname.as_ptr(),
                    flags.bits(),
                ) as libc::c_int
            })
        })();
        answer!(reply, res, |_| reply.ok());
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let res = (|| {
            let _g = self.power.enter()?;
            let fd = self.node(ino)?;
            let to = self.node(newparent)?;
            let newname = cname(newname)?;
            // SAFETY: valid descriptors and C strings. AT_EMPTY_PATH needs
            // CAP_DAC_READ_SEARCH; without it the /proc magic link does the same.
            let r = unsafe {
                libc::linkat(
                    fd.as_raw_fd(),
                    c"".as_ptr(),
                    to.as_raw_fd(),
                    newname.as_ptr(),
                    libc::AT_EMPTY_PATH,
                )
            };
            if r < 0 {
                let err = last_errno();
                if err != Errno::EPERM && err != Errno::ENOENT {
                    return Err(err);
                }
                let path = proc_path(fd.as_raw_fd());
                // SAFETY: as above.
                check(unsafe {
                    libc::linkat(
                        libc::AT_FDCWD,
                        path.as_ptr(),
                        to.as_raw_fd(),
                        newname.as_ptr(),
                        libc::AT_SYMLINK_FOLLOW,
                    )
                })?;
            }
            self.lookup_entry(to.as_raw_fd(), &newname)
        })();
        answer!(reply, res, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let res = (|| {
            let _g = self.power.enter()?;
            let node = self.node(ino)?;
            let fd = open_at(
                libc::AT_FDCWD,
                &proc_path(node.as_raw_fd()),
                backing_flags(flags.0) & !(libc::O_CREAT | libc::O_EXCL),
                0,
            )?;
            Ok(self.add_file(fd))
        })();
        // KEEP_CACHE: without it the kernel invalidates the file's page cache on every open,
        // writing its dirty pages back first (`launder_folio`): a second open of a file would
        // save what the first one had not synced.
        answer!(reply, res, |fh| reply
            .opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE));
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let res = (|| {
            let _g = self.power.enter()?;
            let fd = self.file(fh)?;
            let mut buf = vec![0u8; size as usize];
            let mut done = 0;
            while done < buf.len() {
                // SAFETY: the destination is within `buf`.
                let n = check_size(unsafe {
                    libc::pread(
                        fd.as_raw_fd(),
                        buf[done..].as_mut_ptr().cast(),
                        buf.len() - done,
                        (offset + done as u64) as libc::off_t,
                    )
                })?;
                if n == 0 {
                    break;
                }
                done += n;
            }
            buf.truncate(done);
            Ok(buf)
        })();
        answer!(reply, res, |b| reply.data(&b));
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let res = (|| {
            let _g = self.power.enter()?;
            let fd = self.file(fh)?;
            let mut done = 0;
            while done < data.len() {
                // SAFETY: the source is within `data`.
                let n = check_size(unsafe {
                    libc::pwrite(
                        fd.as_raw_fd(),
                        data[done..].as_ptr().cast(),
                        data.len() - done,
                        (offset + done as u64) as libc::off_t,
                    )
                })?;
                if n == 0 {
                    return Err(Errno::EIO);
                }
                done += n;
            }
            Ok(done as u32)
        })();
        answer!(reply, res, |n| reply.written(n));
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        answer!(reply, self.power.enter(), |_| reply.ok());
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // Closing the backing descriptor changes nothing on the disk: also after the cut.
        self.files
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        // The kernel wrote the dirty pages back (WRITE requests, answered after `pwrite`)
        // before it sends FSYNC: they are on the disk already. The backing file is synced too
        // so that a sync costs what a device's flush costs (the durability bench's rows per
        // second under `cairo.commit.mode=sync` would otherwise be a free sync's).
        let res = (|| {
            let _g = self.power.enter()?;
            let fd = self.file(fh)?;
            // SAFETY: an open descriptor.
            let r = unsafe {
                if datasync {
                    libc::fdatasync(fd.as_raw_fd())
                } else {
                    libc::fsync(fd.as_raw_fd())
                }
            };
            if r != 0 {
                return Err(last_errno());
            }
            Ok(())
        })();
        answer!(reply, res, |_| reply.ok());
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let res = (|| {
            let _g = self.power.enter()?;
            let node = self.node(ino)?;
            let fd = open_at(
                libc::AT_FDCWD,
                &proc_path(node.as_raw_fd()),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                0,
            )?;
            // SAFETY: `fd` is an open directory; the stream takes it over.
            let dir = unsafe { libc::fdopendir(fd.as_raw_fd()) };
            if dir.is_null() {
                return Err(last_errno());
            }
            std::mem::forget(fd);
            let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
            lock(&self.dirs).insert(fh, Arc::new(Mutex::new(DirStream { dir, pos: Some(0) })));
            Ok(fh)
        })();
        answer!(reply, res, |fh| reply
            .opened(FileHandle(fh), FopenFlags::empty()));
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        match self.do_readdir(fh, offset, &mut reply) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        lock(&self.dirs).remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Directory operations are done on the backing directory before they are answered.
        answer!(reply, self.power.enter(), |_| reply.ok());
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let res = (|| {
            let _g = self.power.enter()?;
            let fd = self.node(ino).or_else(|_| self.node(INodeNo::ROOT))?;
            // SAFETY: `st` is written by the kernel before it is read.
            let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
            check(unsafe { libc::fstatvfs(fd.as_raw_fd(), &mut st) })?;
            Ok(st)
        })();
        answer!(reply, res, |st| reply.statfs(
            st.f_blocks,
            st.f_bfree,
            st.f_bavail,
            st.f_files,
            st.f_ffree,
            st.f_bsize as u32,
            st.f_namemax as u32,
            st.f_frsize as u32,
        ));
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let res = (|| {
            let _g = self.power.enter()?;
            let node = self.node(ino)?;
            let path = proc_path(node.as_raw_fd());
            // SAFETY: valid C string.
            check(unsafe { libc::faccessat(libc::AT_FDCWD, path.as_ptr(), mask.bits(), 0) })
        })();
        answer!(reply, res, |_| reply.ok());
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        answer!(
            reply,
            self.do_create(req, parent, name, mode, flags),
            |(a, fh)| reply.created(
                &TTL,
                &a,
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_KEEP_CACHE
            )
        );
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let res = (|| {
            let _g = self.power.enter()?;
            let fd = self.file(fh)?;
            // SAFETY: valid descriptor.
            check(unsafe {
                libc::fallocate(
                    fd.as_raw_fd(),
                    mode,
                    offset as libc::off_t,
                    length as libc::off_t,
                )
            })
        })();
        answer!(reply, res, |_| reply.ok());
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let res = (|| {
            let _g = self.power.enter()?;
            let fd = self.file(fh)?;
            // SAFETY: valid descriptor. Only SEEK_DATA/SEEK_HOLE come here; the position of
            // the backing descriptor is not used by anything else (I/O is positional).
            let r = unsafe { libc::lseek(fd.as_raw_fd(), offset as libc::off_t, whence) };
            if r < 0 {
                return Err(last_errno());
            }
            Ok(r)
        })();
        answer!(reply, res, |r| reply.offset(r));
    }

    // Not supported: the kernel remembers ENOSYS and stops asking (xattrs: EOPNOTSUPP to the
    // caller; copy_file_range: the generic copy through read/write).

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS);
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::ENOSYS);
    }
}
