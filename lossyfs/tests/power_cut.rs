//! The power cut: what was on the disk (the backing directory) survives, what the kernel still
//! held as dirty pages does not. Run as root; they fail (not skip) when FUSE cannot be mounted.
//!
//! The tests run one at a time (`SERIAL`): `sync()` writes back every mount's dirty pages, and a
//! forked child's exit closes its copies of every descriptor of the process, which on FUSE
//! writes the files' dirty pages back — either would save another test's unsynced writes.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lossyfs::LossyVolume;

static SERIAL: Mutex<()> = Mutex::new(());

const PAGE: usize = 4096;

struct Fixture {
    volume: Option<LossyVolume>,
    mnt: PathBuf,
    disk: PathBuf,
    _dir: tempfile::TempDir,
    _serial: MutexGuard<'static, ()>,
}

impl Fixture {
    fn new() -> Fixture {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(why) = lossyfs::available() {
            panic!("lossyfs cannot mount a FUSE file system here: {why}");
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let disk = dir.path().join("backing");
        fs::create_dir(&disk).unwrap();
        let volume = LossyVolume::mount(&disk, &dir.path().join("mnt")).expect("mount");
        Fixture {
            mnt: volume.mountpoint().to_path_buf(),
            disk: volume.backing().to_path_buf(),
            volume: Some(volume),
            _dir: dir,
            _serial: serial,
        }
    }

    /// A path through the mount.
    fn mnt(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// The same path on the disk (the backing directory).
    fn disk(&self, rel: &str) -> PathBuf {
        self.disk.join(rel)
    }

    fn volume(&self) -> &LossyVolume {
        self.volume.as_ref().expect("mounted")
    }

    fn cut(&self) {
        self.volume().cut();
        assert!(self.volume().is_cut());
    }

    fn unmount(&mut self) {
        let started = Instant::now();
        self.volume
            .take()
            .expect("mounted")
            .unmount()
            .expect("unmount");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "unmount took {:?}",
            started.elapsed()
        );
        assert_not_mounted(&self.mnt);
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        drop(self.volume.take());
        if !std::thread::panicking() {
            assert_not_mounted(&self.mnt);
        }
    }
}

fn assert_not_mounted(mnt: &Path) {
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    let m = mnt.to_str().unwrap();
    assert!(
        !mounts.lines().any(|l| l.split(' ').nth(1) == Some(m)),
        "{m} is still mounted:\n{mounts}"
    );
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn bytes(b: u8, n: usize) -> Vec<u8> {
    vec![b; n]
}

fn concat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn rw(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

fn cpath(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// A `MAP_SHARED` read-write mapping of a whole file.
struct Map {
    ptr: *mut u8,
    len: usize,
}

impl Map {
    fn new(file: &File, len: usize) -> Map {
        // SAFETY: a fresh shared mapping of `len` bytes of an open file.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(
            ptr,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        Map {
            ptr: ptr.cast(),
            len,
        }
    }

    fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset + data.len() <= self.len);
        // SAFETY: within the mapping.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset), data.len()) };
    }

    fn msync(&self, offset: usize, len: usize) {
        // SAFETY: a page-aligned range within the mapping.
        let r = unsafe { libc::msync(self.ptr.add(offset).cast(), len, libc::MS_SYNC) };
        assert_eq!(r, 0, "msync: {}", std::io::Error::last_os_error());
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[test]
fn unsynced_plain_write_is_gone_after_the_cut() {
    let mut fx = Fixture::new();
    // A file on the disk: written and fsynced.
    let old = bytes(b'A', 2 * PAGE);
    let mut existing = rw(&fx.mnt("existing"));
    existing.write_all(&old).unwrap();
    existing.sync_all().unwrap();
    assert_eq!(read(&fx.disk("existing")), old, "fsync reaches the disk");

    // Not synced: an append to it (O_APPEND: the kernel places it) and a new file.
    let mut appender = OpenOptions::new()
        .append(true)
        .open(fx.mnt("existing"))
        .unwrap();
    appender.write_all(&bytes(b'B', 3 * PAGE)).unwrap();
    let mut new = File::create(fx.mnt("new")).unwrap();
    new.write_all(&bytes(b'N', 3 * PAGE + 100)).unwrap();
    // Another open of the file (a reader, as a database's) reads the cached pages and does
    // not write them back.
    let mut reader = File::open(fx.mnt("new")).unwrap();
    let mut seen = Vec::new();
    reader.read_to_end(&mut seen).unwrap();
    assert_eq!(seen, bytes(b'N', 3 * PAGE + 100));
    assert_eq!(
        fs::metadata(fx.mnt("existing")).unwrap().len(),
        5 * PAGE as u64
    );
    assert_eq!(read(&fx.disk("new")), b"", "nothing was written back yet");

    fx.cut();
    // close() writes a file's dirty pages back on FUSE: after the cut it fails instead.
    drop((reader, new, appender, existing));
    fx.unmount();

    assert_eq!(read(&fx.disk("existing")), old, "the synced bytes stay");
    // The file's creation reached the disk (a directory operation is done when it returns);
    // its data did not.
    assert_eq!(read(&fx.disk("new")), b"");
}

#[test]
fn fsynced_write_survives_the_cut_and_the_unsynced_tail_does_not() {
    let mut fx = Fixture::new();
    let mut log = File::create(fx.mnt("log")).unwrap();
    log.write_all(&bytes(b'S', 2 * PAGE + 10)).unwrap();
    log.sync_data().unwrap();
    assert_eq!(read(&fx.disk("log")), bytes(b'S', 2 * PAGE + 10));
    log.write_all(&bytes(b'U', 2 * PAGE)).unwrap();

    let mut meta = File::create(fx.mnt("meta")).unwrap();
    meta.write_all(&bytes(b'X', PAGE)).unwrap();
    meta.sync_all().unwrap();
    meta.write_all(&bytes(b'Y', PAGE)).unwrap();
    // An overwrite inside the synced part, not synced.
    meta.write_all_at(b"overwritten", 0).unwrap();

    fx.cut();
    drop((log, meta));
    fx.unmount();

    assert_eq!(read(&fx.disk("log")), bytes(b'S', 2 * PAGE + 10));
    assert_eq!(read(&fx.disk("meta")), bytes(b'X', PAGE));
}

#[test]
fn mmap_write_without_msync_is_gone_after_the_cut() {
    let mut fx = Fixture::new();
    let file = rw(&fx.mnt("column"));
    file.write_all_at(&bytes(b'O', 2 * PAGE), 0).unwrap();
    file.sync_all().unwrap();
    let map = Map::new(&file, 2 * PAGE);
    map.write(0, &bytes(b'M', PAGE));
    map.write(PAGE + 7, b"mapped");

    fx.cut();
    drop(map);
    drop(file);
    fx.unmount();

    assert_eq!(read(&fx.disk("column")), bytes(b'O', 2 * PAGE));
}

#[test]
fn msynced_mmap_write_survives_the_cut_and_a_later_unsynced_one_does_not() {
    let mut fx = Fixture::new();
    let file = rw(&fx.mnt("column"));
    file.write_all_at(&bytes(b'O', 2 * PAGE), 0).unwrap();
    file.sync_all().unwrap();
    let map = Map::new(&file, 2 * PAGE);
    map.write(0, &bytes(b'M', PAGE));
    map.msync(0, PAGE);
    assert_eq!(
        read(&fx.disk("column")),
        concat(&[&bytes(b'M', PAGE), &bytes(b'O', PAGE)]),
        "msync(MS_SYNC) reaches the disk"
    );
    map.write(PAGE, &bytes(b'N', PAGE));

    fx.cut();
    drop(map);
    drop(file);
    fx.unmount();

    assert_eq!(
        read(&fx.disk("column")),
        concat(&[&bytes(b'M', PAGE), &bytes(b'O', PAGE)])
    );
}

#[test]
fn sync_syscall_and_settle_before_the_cut_keep_everything() {
    let mut fx = Fixture::new();
    let mut plain = File::create(fx.mnt("plain")).unwrap();
    plain.write_all(&bytes(b'P', 2 * PAGE)).unwrap();
    let mapped = rw(&fx.mnt("mapped"));
    mapped.set_len(2 * PAGE as u64).unwrap();
    let map = Map::new(&mapped, 2 * PAGE);
    map.write(0, &bytes(b'M', 2 * PAGE));
    fs::create_dir(fx.mnt("dir")).unwrap();
    let mut nested = File::create(fx.mnt("dir/nested")).unwrap();
    nested.write_all(b"nested").unwrap();

    // SAFETY: no preconditions.
    unsafe { libc::sync() };
    // On this kernel sync() starts the writeback of a FUSE writeback-cache mount but does not
    // wait for it ("fs/writeback: skip AS_NO_DATA_INTEGRITY mappings in wait_sb_inodes()",
    // also in the stable trees): it can return with WRITE requests still queued for the
    // daemon, and a cut right away would lose them (seen here: 14 in 200 syncfs + cut).
    // Waiting until the kernel has no request outstanding makes what sync() started count.
    // (sync() writes back every file system of the machine: other processes' lossy volumes
    // too.)
    assert!(
        fx.volume().settle(Duration::from_secs(10)),
        "writeback settles"
    );
    // After the sync: lost at the cut.
    plain.write_all(&bytes(b'Q', PAGE)).unwrap();

    fx.cut();
    drop((map, mapped, plain, nested));
    fx.unmount();

    assert_eq!(read(&fx.disk("plain")), bytes(b'P', 2 * PAGE));
    assert_eq!(read(&fx.disk("mapped")), bytes(b'M', 2 * PAGE));
    assert_eq!(read(&fx.disk("dir/nested")), b"nested");
}

#[test]
fn clean_unmount_and_drop_keep_everything_written() {
    for how in ["unmount", "drop"] {
        let mut fx = Fixture::new();
        // Kept open (a close would write them back by itself).
        let mut plain = File::create(fx.mnt("plain")).unwrap();
        plain.write_all(&bytes(b'P', 2 * PAGE + 1)).unwrap();
        let mapped = rw(&fx.mnt("mapped"));
        mapped.set_len(2 * PAGE as u64).unwrap();
        let map = Map::new(&mapped, 2 * PAGE);
        map.write(PAGE, &bytes(b'M', PAGE));
        assert_eq!(read(&fx.disk("plain")), b"", "{how}: not yet written back");

        match how {
            "unmount" => fx.unmount(),
            _ => {
                let started = Instant::now();
                drop(fx.volume.take());
                assert!(started.elapsed() < Duration::from_secs(10));
                assert_not_mounted(&fx.mnt);
            }
        }
        assert_eq!(read(&fx.disk("plain")), bytes(b'P', 2 * PAGE + 1), "{how}");
        assert_eq!(
            read(&fx.disk("mapped")),
            concat(&[&bytes(0, PAGE), &bytes(b'M', PAGE)]),
            "{how}"
        );
        // The connection is gone: these fail (ENOTCONN) but return.
        drop((map, mapped, plain));
    }
}

fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> std::io::Result<()> {
    let (from, to) = (cpath(from), cpath(to));
    // SAFETY: valid C strings.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn metadata_operations_pass_through_to_the_disk() {
    let mut fx = Fixture::new();

    // mkdir, nested.
    fs::create_dir_all(fx.mnt("a/b")).unwrap();
    assert!(fx.disk("a/b").is_dir());
    fs::write(fx.mnt("a/b/inner"), b"inner").unwrap();
    fs::write(fx.mnt("a/f"), b"f").unwrap();
    assert_eq!(read(&fx.disk("a/b/inner")), b"inner", "close writes back");

    // Rename of a file.
    fs::rename(fx.mnt("a/f"), fx.mnt("a/g")).unwrap();
    assert!(!fx.disk("a/f").exists());
    assert_eq!(read(&fx.disk("a/g")), b"f");

    // Rename of a directory with a file in it, open across the rename.
    let inner = rw(&fx.mnt("a/b/inner"));
    fs::rename(fx.mnt("a/b"), fx.mnt("c")).unwrap();
    assert!(!fx.disk("a/b").exists());
    assert_eq!(read(&fx.disk("c/inner")), b"inner");
    inner.write_all_at(b"INNER", 0).unwrap();
    inner.sync_all().unwrap();
    assert_eq!(read(&fx.disk("c/inner")), b"INNER");
    fs::write(fx.mnt("c/new"), b"new").unwrap();
    assert_eq!(read(&fx.disk("c/new")), b"new");
    // Into another directory, then used by its new path.
    fs::rename(fx.mnt("c"), fx.mnt("a/c2")).unwrap();
    assert_eq!(read(&fx.mnt("a/c2/inner")), b"INNER");
    assert_eq!(read(&fx.disk("a/c2/inner")), b"INNER");
    fs::write(fx.mnt("a/c2/third"), b"3").unwrap();
    assert_eq!(read(&fx.disk("a/c2/third")), b"3");
    drop(inner);

    // readdir.
    assert_eq!(listing(&fx.mnt("a/c2")), ["inner", "new", "third"]);
    assert_eq!(listing(&fx.mnt("a")), listing(&fx.disk("a")));
    assert_eq!(listing(&fx.mnt("a")), ["c2", "g"]);
    // A directory larger than one readdir reply.
    fs::create_dir(fx.mnt("many")).unwrap();
    for i in 0..600 {
        File::create(fx.mnt(&format!("many/file-with-a-longish-name-{i:04}"))).unwrap();
    }
    let many = listing(&fx.mnt("many"));
    assert_eq!(many.len(), 600);
    assert_eq!(many, listing(&fx.disk("many")));

    // Hard link: one file under two names.
    fs::hard_link(fx.mnt("a/g"), fx.mnt("a/h")).unwrap();
    let (dg, dh) = (
        fs::metadata(fx.disk("a/g")).unwrap(),
        fs::metadata(fx.disk("a/h")).unwrap(),
    );
    assert_eq!((dg.ino(), dg.nlink()), (dh.ino(), 2));
    assert_eq!(fs::metadata(fx.mnt("a/g")).unwrap().nlink(), 2);
    assert_eq!(
        fs::metadata(fx.mnt("a/g")).unwrap().ino(),
        fs::metadata(fx.mnt("a/h")).unwrap().ino()
    );
    fs::write(fx.mnt("a/h"), b"via h").unwrap();
    assert_eq!(read(&fx.mnt("a/g")), b"via h");
    assert_eq!(read(&fx.disk("a/g")), b"via h");

    // Unlink of an open file: still readable and writable by its descriptor.
    let mut open = rw(&fx.mnt("unlinked"));
    open.write_all(b"hello").unwrap();
    fs::remove_file(fx.mnt("unlinked")).unwrap();
    assert!(!fx.disk("unlinked").exists());
    assert!(!fx.mnt("unlinked").exists());
    open.write_all(b" world").unwrap();
    open.sync_all().unwrap();
    let mut back = String::new();
    open.seek(SeekFrom::Start(0)).unwrap();
    open.read_to_string(&mut back).unwrap();
    assert_eq!(back, "hello world");
    assert_eq!(open.metadata().unwrap().nlink(), 0);
    assert_eq!(open.metadata().unwrap().len(), 11);
    drop(open);

    // Truncate: by path and by descriptor.
    fs::write(fx.mnt("t"), bytes(b't', 10_000)).unwrap();
    let t = cpath(&fx.mnt("t"));
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::truncate(t.as_ptr(), 100) }, 0);
    assert_eq!(fs::metadata(fx.disk("t")).unwrap().len(), 100);
    let tf = rw(&fx.mnt("t"));
    tf.set_len(50).unwrap();
    assert_eq!(fs::metadata(fx.disk("t")).unwrap().len(), 50);
    tf.set_len(3 * PAGE as u64).unwrap();
    assert_eq!(fs::metadata(fx.disk("t")).unwrap().len(), 3 * PAGE as u64);
    drop(tf);
    assert_eq!(
        read(&fx.disk("t")),
        concat(&[&bytes(b't', 50), &bytes(0, 3 * PAGE - 50)])
    );

    // fallocate: allocating, keeping the size, punching a hole; SEEK_DATA/SEEK_HOLE.
    let fa = rw(&fx.mnt("fa"));
    let fd = fa.as_raw_fd();
    // SAFETY: valid descriptor.
    assert_eq!(unsafe { libc::fallocate(fd, 0, 0, 1 << 20) }, 0);
    let d = fs::metadata(fx.disk("fa")).unwrap();
    assert_eq!(d.len(), 1 << 20);
    assert!(
        d.blocks() * 512 >= 1 << 20,
        "allocated: {} blocks",
        d.blocks()
    );
    // SAFETY: valid descriptor.
    let keep = unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 1 << 20, 1 << 20) };
    assert_eq!(keep, 0, "{}", std::io::Error::last_os_error());
    let d = fs::metadata(fx.disk("fa")).unwrap();
    assert_eq!(d.len(), 1 << 20);
    assert!(d.blocks() * 512 >= 2 << 20);
    drop(fa);
    let sparse = rw(&fx.mnt("sparse"));
    sparse.write_all_at(b"data", 1 << 20).unwrap();
    sparse.sync_all().unwrap();
    // SAFETY: valid descriptor.
    let data = unsafe { libc::lseek(sparse.as_raw_fd(), 0, libc::SEEK_DATA) };
    assert!(data >= 0, "SEEK_DATA: {}", std::io::Error::last_os_error());
    assert!(data as u64 <= 1 << 20);
    drop(sparse);

    // Symlink.
    std::os::unix::fs::symlink("a/g", fx.mnt("s")).unwrap();
    assert_eq!(fs::read_link(fx.mnt("s")).unwrap(), Path::new("a/g"));
    assert_eq!(fs::read_link(fx.disk("s")).unwrap(), Path::new("a/g"));
    assert_eq!(read(&fx.mnt("s")), b"via h");

    // chmod, utimes.
    fs::set_permissions(fx.mnt("a/g"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(fx.disk("a/g")).unwrap().mode() & 0o7777, 0o640);
    let when = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    File::options()
        .write(true)
        .open(fx.mnt("a/g"))
        .unwrap()
        .set_modified(when)
        .unwrap();
    assert_eq!(fs::metadata(fx.disk("a/g")).unwrap().mtime(), 1_000_000_000);
    // A new file and directory get the mode asked for, not one masked twice.
    fs::create_dir(fx.mnt("modes")).unwrap();
    fs::set_permissions(fx.mnt("modes"), fs::Permissions::from_mode(0o775)).unwrap();
    assert_eq!(
        fs::metadata(fx.disk("modes")).unwrap().mode() & 0o7777,
        0o775
    );

    // rename flags.
    fs::write(fx.mnt("x"), b"x").unwrap();
    fs::write(fx.mnt("y"), b"y").unwrap();
    let err = renameat2(&fx.mnt("x"), &fx.mnt("y"), libc::RENAME_NOREPLACE).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EEXIST));
    renameat2(&fx.mnt("x"), &fx.mnt("y"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(
        (read(&fx.disk("x")), read(&fx.disk("y"))),
        (b"y".to_vec(), b"x".to_vec())
    );
    assert_eq!(
        (read(&fx.mnt("x")), read(&fx.mnt("y"))),
        (b"y".to_vec(), b"x".to_vec())
    );
    // Rename over an existing file.
    fs::rename(fx.mnt("x"), fx.mnt("y")).unwrap();
    assert_eq!(read(&fx.disk("y")), b"y");
    assert!(!fx.disk("x").exists());

    // rmdir, unlink.
    fs::create_dir(fx.mnt("gone")).unwrap();
    fs::remove_dir(fx.mnt("gone")).unwrap();
    assert!(!fx.disk("gone").exists());
    fs::remove_file(fx.mnt("a/h")).unwrap();
    assert!(!fx.disk("a/h").exists());
    assert_eq!(fs::metadata(fx.disk("a/g")).unwrap().nlink(), 1);
    assert_eq!(
        fs::remove_dir(fx.mnt("a")).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );

    // statfs is the backing file system's.
    // SAFETY: `st` is written by statvfs before it is read.
    let (mut a, mut b): (libc::statvfs, libc::statvfs) = unsafe { std::mem::zeroed() };
    let (pm, pd) = (cpath(&fx.mnt), cpath(&fx.disk));
    assert_eq!(unsafe { libc::statvfs(pm.as_ptr(), &mut a) }, 0);
    assert_eq!(unsafe { libc::statvfs(pd.as_ptr(), &mut b) }, 0);
    assert_eq!((a.f_blocks, a.f_bsize), (b.f_blocks, b.f_bsize));

    fx.unmount();
    assert_eq!(
        listing(&fx.disk),
        ["a", "fa", "many", "modes", "s", "sparse", "t", "y"]
    );
}

/// Writes forever to `path` through a descriptor and a shared mapping, syncing and reopening
/// now and then. Runs in a forked child: only system calls, nothing allocated.
fn write_forever(path: &CString) -> ! {
    const LEN: usize = 1 << 20;
    static BUF: [u8; 65536] = [0x5a; 65536];
    // SAFETY: system calls on memory owned here; the child never returns.
    unsafe {
        let mut fd = libc::open(path.as_ptr(), libc::O_RDWR);
        let map = libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        let mut i: usize = 0;
        loop {
            libc::pwrite(
                fd,
                BUF.as_ptr().cast(),
                BUF.len(),
                ((i % 16) * BUF.len()) as libc::off_t,
            );
            if map != libc::MAP_FAILED {
                *(map as *mut u8).add((i * PAGE) % LEN) = i as u8;
                if i.is_multiple_of(16) {
                    libc::msync(map, LEN, libc::MS_SYNC);
                }
            }
            if i.is_multiple_of(8) {
                libc::fsync(fd);
            }
            if i.is_multiple_of(32) {
                libc::close(fd);
                fd = libc::open(path.as_ptr(), libc::O_RDWR);
            }
            i = i.wrapping_add(1);
        }
    }
}

/// Kills and reaps the child if the test fails before it did.
struct KillOnDrop(Option<libc::pid_t>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            // SAFETY: our child, not reaped yet.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// Runs `f` on a thread; panics if it has not returned within `limit`.
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what} did not return within {limit:?}"))
}

#[test]
fn after_the_cut_io_never_hangs_and_the_writer_can_be_killed() {
    let mut fx = Fixture::new();
    let target = fx.mnt("spin");
    rw(&target).set_len(1 << 20).unwrap();
    let ctarget = cpath(&target);
    let mine = rw(&fx.mnt("mine"));
    mine.write_all_at(b"before", 0).unwrap();

    // SAFETY: the child only makes system calls (`write_forever`).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        write_forever(&ctarget);
    }
    let mut reaper = KillOnDrop(Some(pid));
    std::thread::sleep(Duration::from_millis(300));
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(
        unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) },
        0,
        "writer died early"
    );
    assert!(fs::metadata(fx.disk("spin")).unwrap().len() >= 1 << 20);

    fx.cut();
    let on_disk = read(&fx.disk("spin"));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        read(&fx.disk("spin")),
        on_disk,
        "the disk changed after the cut"
    );

    // This process's I/O on the mount returns: the write lands in the page cache, fsync and
    // close fail.
    let r = within(Duration::from_secs(5), "write, fsync, close", move || {
        mine.write_all_at(b"after", 0).unwrap();
        let fsynced = mine.sync_all();
        // SAFETY: the descriptor is given up here.
        let closed = unsafe { libc::close(std::os::fd::IntoRawFd::into_raw_fd(mine)) };
        (fsynced.map_err(|e| e.raw_os_error()), closed)
    });
    assert_eq!(r.0, Err(Some(libc::EIO)));
    let create = File::create(fx.mnt("after-cut"));
    assert_eq!(create.unwrap_err().raw_os_error(), Some(libc::EIO));

    // SAFETY: our child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let reaped = within(
        Duration::from_secs(5),
        "the killed writer's exit",
        move || {
            let mut status = 0;
            // SAFETY: our child.
            let r = unsafe { libc::waitpid(pid, &mut status, 0) };
            (r, status)
        },
    );
    assert_eq!(reaped.0, pid);
    reaper.0 = None;
    assert!(libc::WIFSIGNALED(reaped.1) && libc::WTERMSIG(reaped.1) == libc::SIGKILL);

    fx.unmount();
    assert_eq!(
        read(&fx.disk("spin")),
        on_disk,
        "the disk changed after the cut"
    );
    assert_eq!(read(&fx.disk("mine")), b"", "never synced");
    assert!(!fx.disk("after-cut").exists());
}
