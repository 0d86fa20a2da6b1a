//! Throughput of the lossy layer against the plain backing file system, and how much unsynced
//! data the kernel keeps before it writes back on its own.
//!
//! `cargo run --release -p lossyfs --example bench [MiB]` (as root; default 256 MiB).

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use lossyfs::LossyVolume;

const CHUNK: usize = 1 << 20;

/// Writes `mib` MiB in 1 MiB writes, then fsyncs: (seconds writing, seconds in fsync).
fn write_and_fsync(path: &Path, mib: usize) -> (f64, f64) {
    let chunk = vec![0xa5u8; CHUNK];
    let mut f = File::create(path).unwrap();
    let started = Instant::now();
    for _ in 0..mib {
        f.write_all(&chunk).unwrap();
    }
    let written = started.elapsed();
    f.sync_all().unwrap();
    (
        written.as_secs_f64(),
        (started.elapsed() - written).as_secs_f64(),
    )
}

fn report(what: &str, mib: usize, (write, fsync): (f64, f64)) {
    println!(
        "{what:<8} {mib} MiB in 1 MiB writes + fsync: {:>7.1} MB/s  (writes {:.2} s, fsync {:.2} s)",
        (mib * CHUNK) as f64 / 1e6 / (write + fsync),
        write,
        fsync
    );
}

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("MiB"))
        .unwrap_or(256);
    if let Err(why) = lossyfs::available() {
        panic!("lossyfs cannot mount here: {why}");
    }
    let dir = tempfile::tempdir().unwrap();
    let (backing, plain) = (dir.path().join("backing"), dir.path().join("plain"));
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&plain).unwrap();
    let volume = LossyVolume::mount(&backing, &dir.path().join("mnt")).unwrap();

    for round in 0..2 {
        let layer = write_and_fsync(&volume.mountpoint().join("bench"), mib);
        let direct = write_and_fsync(&plain.join("bench"), mib);
        println!("round {round}:");
        report("lossyfs", mib, layer);
        report("plain", mib, direct);
        fs::remove_file(volume.mountpoint().join("bench")).unwrap();
        fs::remove_file(plain.join("bench")).unwrap();
    }

    drop(volume);

    // Unsynced data the kernel writes back by itself (the dirty-page limits of a FUSE mount),
    // long before vm.dirty_expire_centisecs: each size on a fresh volume, cut after 1 s.
    println!("written without sync, on the disk 1 s later (the kernel's own writeback):");
    let chunk = vec![0x5au8; CHUNK];
    for size in [4, 16, 32, 64, 128, 256] {
        let backing = dir.path().join(format!("unsynced-{size}"));
        fs::create_dir(&backing).unwrap();
        let volume = LossyVolume::mount(&backing, &dir.path().join("mnt")).unwrap();
        let mut f = File::create(volume.mountpoint().join("file")).unwrap();
        for _ in 0..size {
            f.write_all(&chunk).unwrap();
        }
        std::thread::sleep(Duration::from_secs(1));
        volume.cut();
        let on_disk = fs::metadata(backing.join("file")).unwrap().blocks() * 512;
        println!(
            "  {size:>4} MiB written: {:>6.1} MiB on the disk",
            on_disk as f64 / CHUNK as f64
        );
        drop(f);
        drop(volume);
        fs::remove_dir_all(&backing).unwrap();
    }
}
