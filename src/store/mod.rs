//! Durable, crash-safe record store under the state dir: one JSON file per record, replaced
//! atomically, with a versioned envelope and a migration path.
//!
//! Layout: `<state-dir>/<kind>/<encoded key>.json`, each file
//! `{"version": N, "key": "...", "data": {...}}`. A write goes to a temp file in the same
//! directory, is fsynced, renamed over the record and the directory is fsynced, so after a
//! `kill -9` (or a power loss) a record is either its old or its new value, never torn, and a
//! `put` that returned is on disk. Temp files left by a crash are removed at open. A `LOCK`
//! file (flock) keeps a second daemon off the same state dir. See
//! `docs/decisions/0002-state-store.md` for why this and not an embedded database.

mod leases;

#[cfg(test)]
mod tests;

use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Name of the lock file in the state dir.
const LOCK_FILE: &str = "LOCK";
/// Records end in this; anything else in a kind directory is ignored or cleaned.
const RECORD_SUFFIX: &str = ".json";
/// Temp files start with this (a leading dot can never come out of [`encode_key`]).
const TEMP_PREFIX: &str = ".tmp.";
/// Longest encoded key: leaves room for the suffix within `NAME_MAX` (255).
const MAX_ENCODED_KEY: usize = 200;

/// A kind of record kept in the store, with its on-disk schema version.
pub trait Record: Serialize + DeserializeOwned {
    /// Directory of this kind under the state dir (`claims`, `ipam-leases`).
    const KIND: &'static str;
    /// Version of the `data` schema written now.
    const VERSION: u32;

    /// Upgrades `data` written at version `from` (< [`Record::VERSION`]) to version
    /// `from + 1`. The store applies it step by step on load and writes the result back.
    fn migrate(from: u32, data: Value) -> Result<Value, String> {
        let _ = data;
        Err(format!("no migration from version {from}"))
    }
}

/// The envelope around every record on disk.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope<D> {
    version: u32,
    key: String,
    data: D,
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Another process holds the state dir.
    #[error("state dir {path} is locked by another process")]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// A record file does not decode.
    #[error("corrupt record {path}: {source}")]
    Corrupt {
        /// The record file.
        path: PathBuf,
        /// The decoder's message.
        #[source]
        source: serde_json::Error,
    },
    /// A record file's key does not match its name.
    #[error("record {path} holds key {key:?}, which does not match its file name")]
    KeyMismatch {
        /// The record file.
        path: PathBuf,
        /// The key inside.
        key: String,
    },
    /// A record could not be encoded.
    #[error("encode {kind} record {key:?}: {source}")]
    Encode {
        /// Record kind.
        kind: &'static str,
        /// Record key.
        key: String,
        /// The encoder's message.
        #[source]
        source: serde_json::Error,
    },
    /// A record written by a newer netclaim.
    #[error("record {path} has version {version}, newer than {supported} (downgrade?)")]
    NewerVersion {
        /// The record file.
        path: PathBuf,
        /// Its version.
        version: u32,
        /// The newest this build reads.
        supported: u32,
    },
    /// A migration step failed.
    #[error("migrate record {path} from version {from}: {reason}")]
    Migrate {
        /// The record file.
        path: PathBuf,
        /// The version the failing step starts from.
        from: u32,
        /// What went wrong.
        reason: String,
    },
    /// A key that cannot be stored.
    #[error("invalid record key {key:?}: {reason}")]
    InvalidKey {
        /// The key.
        key: String,
        /// Why.
        reason: &'static str,
    },
}

fn io_err<'p>(op: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> StoreError + 'p {
    move |source| StoreError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The state dir, opened and locked for this process.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    /// Held (flock) for the life of the store; released by the kernel even on `kill -9`.
    _lock: File,
    temp_counter: AtomicU64,
}

impl Store {
    /// Opens (creating if needed, mode 0700) and locks the state dir, and removes temp
    /// files a crash left behind.
    pub fn open(root: impl Into<PathBuf>) -> Result<Store, StoreError> {
        let root = root.into();
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)
            .map_err(io_err("create", &root))?;
        let lock_path = root.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(io_err("open", &lock_path))?;
        lock_with_patience(&lock, &lock_path)?;
        let store = Store {
            root,
            _lock: lock,
            temp_counter: AtomicU64::new(0),
        };
        store.remove_stale_temp_files()?;
        Ok(store)
    }

    /// The state dir.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn remove_stale_temp_files(&self) -> Result<(), StoreError> {
        for kind_dir in read_dir_paths(&self.root)? {
            if !kind_dir.is_dir() {
                continue;
            }
            let mut removed = false;
            for path in read_dir_paths(&kind_dir)? {
                if file_name(&path).starts_with(TEMP_PREFIX) {
                    fs::remove_file(&path).map_err(io_err("remove", &path))?;
                    removed = true;
                }
            }
            if removed {
                sync_dir(&kind_dir)?;
            }
        }
        Ok(())
    }

    fn kind_dir<R: Record>(&self) -> PathBuf {
        self.root.join(R::KIND)
    }

    fn ensure_kind_dir<R: Record>(&self) -> Result<PathBuf, StoreError> {
        let dir = self.kind_dir::<R>();
        if !dir.is_dir() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(io_err("create", &dir))?;
            // The new directory entry must itself be durable before records in it are.
            sync_dir(&self.root)?;
        }
        Ok(dir)
    }

    fn record_path<R: Record>(&self, key: &str) -> Result<PathBuf, StoreError> {
        Ok(self
            .kind_dir::<R>()
            .join(format!("{}{RECORD_SUFFIX}", encode_key(key)?)))
    }

    /// Writes (creates or replaces) a record durably: when this returns, the record
    /// survives `kill -9` and power loss.
    pub fn put<R: Record>(&self, key: &str, record: &R) -> Result<(), StoreError> {
        let path = self.record_path::<R>(key)?;
        let envelope = Envelope {
            version: R::VERSION,
            key: key.to_owned(),
            data: record,
        };
        let bytes = serde_json::to_vec(&envelope).map_err(|source| StoreError::Encode {
            kind: R::KIND,
            key: key.to_owned(),
            source,
        })?;
        let dir = self.ensure_kind_dir::<R>()?;
        self.replace_file(&dir, &path, &bytes)
    }

    fn replace_file(&self, dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        let n = self.temp_counter.fetch_add(1, Ordering::Relaxed);
        let temp = dir.join(format!("{TEMP_PREFIX}{}.{n}", std::process::id()));
        let result = (|| {
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&temp)
                .map_err(io_err("create", &temp))?;
            file.write_all(bytes).map_err(io_err("write", &temp))?;
            // Data must be on disk before the rename makes it visible under the real name.
            file.sync_all().map_err(io_err("fsync", &temp))?;
            fs::rename(&temp, path).map_err(io_err("rename", path))?;
            // The rename itself is durable only once the directory is synced.
            sync_dir(dir)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&temp);
        }
        result
    }

    /// Reads one record (migrating an older version in memory).
    pub fn get<R: Record>(&self, key: &str) -> Result<Option<R>, StoreError> {
        let path = self.record_path::<R>(key)?;
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(StoreError::Io {
                    op: "read",
                    path,
                    source,
                });
            }
        };
        let (_, record, _) = decode_record::<R>(&path, &bytes)?;
        Ok(Some(record))
    }

    /// Removes a record durably; `false` when there was none.
    pub fn remove<R: Record>(&self, key: &str) -> Result<bool, StoreError> {
        let path = self.record_path::<R>(key)?;
        match fs::remove_file(&path) {
            Ok(()) => {
                sync_dir(&self.kind_dir::<R>())?;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(StoreError::Io {
                op: "remove",
                path,
                source,
            }),
        }
    }

    /// Loads every record of a kind, sorted by key. Records of an older version are migrated
    /// and written back, so each migration runs once. A record that does not decode fails
    /// the load: forgetting it could hand its address to a second claim.
    pub fn load_all<R: Record>(&self) -> Result<Vec<(String, R)>, StoreError> {
        let dir = self.kind_dir::<R>();
        if !dir.is_dir() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for path in read_dir_paths(&dir)? {
            let name = file_name(&path);
            let Some(stem) = name.strip_suffix(RECORD_SUFFIX) else {
                continue;
            };
            if name.starts_with('.') {
                continue;
            }
            let bytes = fs::read(&path).map_err(io_err("read", &path))?;
            let (key, record, migrated) = decode_record::<R>(&path, &bytes)?;
            if decode_key(stem).as_deref() != Some(key.as_str()) {
                return Err(StoreError::KeyMismatch { path, key });
            }
            if migrated {
                self.put(&key, &record)?;
            }
            out.push((key, record));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// Decodes a record file: `(key, record, whether it was migrated)`.
fn decode_record<R: Record>(path: &Path, bytes: &[u8]) -> Result<(String, R, bool), StoreError> {
    let corrupt = |source| StoreError::Corrupt {
        path: path.to_path_buf(),
        source,
    };
    let envelope: Envelope<Value> = serde_json::from_slice(bytes).map_err(corrupt)?;
    if envelope.version > R::VERSION {
        return Err(StoreError::NewerVersion {
            path: path.to_path_buf(),
            version: envelope.version,
            supported: R::VERSION,
        });
    }
    let mut data = envelope.data;
    for from in envelope.version..R::VERSION {
        data = R::migrate(from, data).map_err(|reason| StoreError::Migrate {
            path: path.to_path_buf(),
            from,
            reason,
        })?;
    }
    let record = serde_json::from_value(data).map_err(corrupt)?;
    Ok((envelope.key, record, envelope.version < R::VERSION))
}

/// How long `open` waits for the lock. A previous daemon may still be exiting, and a fork in
/// this process (the fd is `O_CLOEXEC`, but a forked child holds the lock until it execs)
/// holds it for a moment.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

fn lock_with_patience(lock: &File, path: &Path) -> Result<(), StoreError> {
    let deadline = std::time::Instant::now() + LOCK_PATIENCE;
    loop {
        match lock.try_lock() {
            Ok(()) => return Ok(()),
            Err(fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Locked {
                    path: path.to_path_buf(),
                });
            }
            Err(fs::TryLockError::Error(source)) => {
                return Err(StoreError::Io {
                    op: "lock",
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
    }
}

fn read_dir_paths(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    fs::read_dir(dir)
        .map_err(io_err("list", dir))?
        .map(|entry| entry.map(|e| e.path()).map_err(io_err("list", dir)))
        .collect()
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync", dir))
}

/// Keys become file names: `[A-Za-z0-9_-]` and inner dots stay, every other byte is `%XX`,
/// so any key (a claim UID, `10.10.1.0/24/10.10.1.5`) maps to one safe name and back.
fn encode_key(key: &str) -> Result<String, StoreError> {
    if key.is_empty() {
        return Err(StoreError::InvalidKey {
            key: key.to_owned(),
            reason: "empty",
        });
    }
    let mut out = String::with_capacity(key.len());
    for (i, byte) in key.bytes().enumerate() {
        let plain =
            byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' || (byte == b'.' && i > 0);
        if plain {
            out.push(char::from(byte));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{byte:02X}");
        }
    }
    if out.len() > MAX_ENCODED_KEY {
        return Err(StoreError::InvalidKey {
            key: key.to_owned(),
            reason: "too long",
        });
    }
    Ok(out)
}

fn decode_key(name: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(name.len());
    let mut iter = name.bytes();
    while let Some(b) = iter.next() {
        if b == b'%' {
            let hex = [iter.next()?, iter.next()?];
            bytes.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            bytes.push(b);
        }
    }
    String::from_utf8(bytes).ok()
}
