//! The file system calls the store makes, behind one trait: the operating system's in
//! production ([`OsDisk`]), a simulated disk with a page cache, power loss and injected errors
//! in tests (`sim_disk`).
//!
//! The seam is narrow on purpose: exactly the calls whose ordering makes the journal crash
//! safe (append, `fdatasync`, create, `fsync`, `rename`, directory `fsync`), so a test can fail
//! any one of them or cut the power between any two and check what survives.

use std::any::Any;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

/// An open file of the store: the journal (opened for append) or a compaction temp file.
pub(crate) trait DiskFile: Send + Debug {
    /// Appends (journal) or writes at the current position (new temp file).
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// `fdatasync(2)`: the written bytes and the size are durable when this returns.
    fn sync_data(&mut self) -> io::Result<()>;
    /// `fsync(2)`: data and metadata durable.
    fn sync_all(&mut self) -> io::Result<()>;
    /// `ftruncate(2)`.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    /// `dup(2)`: a second handle on the same open file, so one thread can `fdatasync` while
    /// another appends (group commit).
    fn duplicate(&self) -> io::Result<Box<dyn DiskFile>>;
}

/// The directory operations of the store.
pub(crate) trait Disk: Send + Sync + Debug {
    /// Creates the state dir (mode 0700, parents included) and takes the exclusive lock that
    /// keeps a second daemon off it, waiting up to `patience`. The lock lasts as long as the
    /// returned guard. `Ok(None)` when another process holds it past the patience.
    fn lock_dir(
        &self,
        root: &Path,
        lock_file: &Path,
        patience: Duration,
    ) -> io::Result<Option<Box<dyn Any + Send + Sync>>>;
    /// The whole content of a file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Opens an existing file for appending.
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn DiskFile>>;
    /// Creates or truncates a file (mode 0600) for writing.
    fn create(&self, path: &Path) -> io::Result<Box<dyn DiskFile>>;
    /// `rename(2)`: atomically replaces `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Unlinks a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// `fsync(2)` on a directory: makes its entries (a new name, a rename) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The operating system's file system.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct OsDisk;

/// A file of the operating system's file system.
#[derive(Debug)]
struct OsFile(File);

impl DiskFile for OsFile {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.0.write_all(bytes)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn sync_all(&mut self) -> io::Result<()> {
        self.0.sync_all()
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn duplicate(&self) -> io::Result<Box<dyn DiskFile>> {
        Ok(Box::new(OsFile(self.0.try_clone()?)))
    }
}

impl Disk for OsDisk {
    fn lock_dir(
        &self,
        root: &Path,
        lock_file: &Path,
        patience: Duration,
    ) -> io::Result<Option<Box<dyn Any + Send + Sync>>> {
        fs::DirBuilder::new().recursive(true).mode(0o700).create(root)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(lock_file)?;
        // flock, released by the kernel when the last fd closes, even on kill -9.
        let deadline = Instant::now() + patience;
        loop {
            match lock.try_lock() {
                Ok(()) => return Ok(Some(Box::new(lock))),
                Err(fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(fs::TryLockError::WouldBlock) => return Ok(None),
                Err(fs::TryLockError::Error(e)) => return Err(e),
            }
        }
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        Ok(Box::new(OsFile(OpenOptions::new().append(true).open(path)?)))
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        Ok(Box::new(OsFile(
            OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?,
        )))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}
