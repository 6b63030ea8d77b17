//! The store: records kept in an append-only journal and an in-memory index.

use std::any::Any;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::disk::{Disk, DiskFile, OsDisk};
use super::error::io_err;
use super::format::{
    Entry, FORMAT_NAME, FORMAT_VERSION, Header, Op, Stored, checksum, decode_record, encode_entry,
    encode_line, encoded_size, snapshot_text,
};
use super::group::{COLLECT_WINDOW, CommitNotice, GROUP_SIZE, Group};
use super::record::check_key;
use super::{Batch, Record, StoreError};

/// Name of the lock file in the state dir.
const LOCK_FILE: &str = "LOCK";
/// Name of the journal in the state dir.
pub(super) const JOURNAL_FILE: &str = "journal";
/// Compaction writes here first.
pub(super) const JOURNAL_TEMP: &str = "journal.tmp";
/// Compact only past this size, so a small state is never rewritten on every commit.
pub(super) const COMPACT_MIN_BYTES: u64 = 256 * 1024;
/// How long `open` waits for the lock. A previous daemon may still be exiting, and a fork
/// in this process (the fd is `O_CLOEXEC`, but a forked child holds the lock until it
/// execs) holds it for a moment.
const LOCK_PATIENCE: Duration = Duration::from_secs(2);

/// The open journal and the state it describes.
#[derive(Debug)]
struct Journal {
    disk: Arc<dyn Disk>,
    root: PathBuf,
    path: PathBuf,
    /// The journal opened for append; `None` after a compaction renamed a new journal into
    /// place and reopening it failed (retried before the next append).
    file: Option<Box<dyn DiskFile>>,
    len: u64,
    records: BTreeMap<(String, String), Stored>,
    live_bytes: u64,
    /// A compaction renamed its file over the journal but the directory sync failed, so the
    /// rename may not survive power loss. The next append compacts again first: a retried
    /// `fsync` can report success for a write-back that failed earlier (the error is
    /// reported once), while a new rename and a new directory sync cannot.
    rewrite_pending: bool,
    poisoned: bool,
    /// Appends so far (sequence number of the last one).
    seq: u64,
    /// Bumped whenever `file` is opened anew, so the syncer knows its duplicate is stale.
    generation: u64,
    /// Sequence number of the last append known durable.
    durable_seq: Arc<AtomicU64>,
    /// `fdatasync`/`fsync` calls made (shared with the store).
    syncs: Arc<AtomicU64>,
}

/// How far a commit must have gone when it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// On disk (`fdatasync`): survives `kill -9` and power loss.
    Synced,
    /// In the page cache: survives `kill -9` of the daemon (the kernel keeps the written
    /// bytes and writes them back), not power loss or a kernel crash. For records of kernel
    /// state that a reboot destroys too (pod interfaces: decision 0010).
    Buffered,
}

/// The handle `fdatasync` runs on, kept apart from the appending one.
#[derive(Debug, Default)]
struct Syncer {
    /// A duplicate of the journal's append handle, with the journal generation it belongs to.
    handle: Option<(u64, Box<dyn DiskFile>)>,
}

/// The state dir, opened and locked for this process.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    /// Held (flock) for the life of the store; released by the kernel even on `kill -9`.
    _lock: Box<dyn Any + Send + Sync>,
    journal: Mutex<Journal>,
    /// The handle the leader of a group commit syncs on.
    syncer: Mutex<Syncer>,
    /// Which commit syncs, and when (group commit: `super::group`).
    group: Arc<Group>,
    /// The longest a group commit's leader waits for announced commits
    /// ([`COLLECT_WINDOW`]; tests that count syncs under any load lengthen it).
    collect_window: Duration,
    /// Sequence number of the last append known durable (shared with the journal, whose
    /// compaction makes everything durable).
    durable_seq: Arc<AtomicU64>,
    /// `fdatasync`/`fsync` calls made since the store was opened ([`Store::syncs`]).
    syncs: Arc<AtomicU64>,
}

impl Store {
    /// Opens (creating if needed, mode 0700) and locks the state dir, and loads the
    /// journal, dropping a torn last line.
    pub fn open(root: impl Into<PathBuf>) -> Result<Store, StoreError> {
        Store::open_on(Arc::new(OsDisk), root.into())
    }

    /// [`Store::open`] over the given file system calls (tests inject failures here).
    pub(crate) fn open_on(disk: Arc<dyn Disk>, root: PathBuf) -> Result<Store, StoreError> {
        let lock_path = root.join(LOCK_FILE);
        let lock = disk
            .lock_dir(&root, &lock_path, LOCK_PATIENCE)
            .map_err(io_err("lock", &lock_path))?
            .ok_or_else(|| StoreError::Locked { path: lock_path.clone() })?;
        let temp = root.join(JOURNAL_TEMP);
        match disk.remove_file(&temp) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(StoreError::Io { op: "remove", path: temp, source });
            }
        }
        let path = root.join(JOURNAL_FILE);
        let bytes = match disk.read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let text = snapshot_text(&BTreeMap::new())?;
                replace_journal(&*disk, &root, &text)?;
                disk.sync_dir(&root).map_err(io_err("fsync", &root))?;
                text.into_bytes()
            }
            Err(source) => return Err(StoreError::Io { op: "read", path, source }),
        };
        let (mut journal, version) = load_journal(disk, root.clone(), path, &bytes)?;
        if version < FORMAT_VERSION {
            // Format upgrades: 1 → 2, 2 → 3 and 3 → 4 add record kinds
            // (`ipam-block-releases` in 3, `vfio-bindings` and `ethtool-snapshots` in 4),
            // optional fields and record versions that each kind migrates when decoded, so
            // the records are read as they are; the rewrite puts the new header in place
            // (synced, renamed, directory synced) before anything of the new kinds is
            // appended.
            journal.compact()?;
        }
        let durable_seq = Arc::clone(&journal.durable_seq);
        let syncs = Arc::clone(&journal.syncs);
        Ok(Store {
            root,
            _lock: lock,
            journal: Mutex::new(journal),
            syncer: Mutex::new(Syncer::default()),
            group: Arc::default(),
            collect_window: COLLECT_WINDOW,
            durable_seq,
            syncs,
        })
    }

    /// Sets how long a group commit's leader waits for announced commits: a test that counts
    /// the syncs of a burst must not depend on how fast a loaded machine runs the burst
    /// ([`COLLECT_WINDOW`] only bounds the wait a slow prepare adds to the others).
    #[cfg(test)]
    pub(crate) fn set_collect_window(&mut self, window: Duration) {
        self.collect_window = window;
    }

    /// `fdatasync` and `fsync` calls this store made since it was opened (journal group
    /// commits, compactions), failed ones included: what a burst of commits costs the disk.
    #[must_use]
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// The state dir.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the store refuses every write until it is reopened (a failed `fdatasync`, or
    /// a failed append that could not be cut back).
    pub fn is_poisoned(&self) -> bool {
        self.lock_journal().poisoned
    }

    fn lock_journal(&self) -> MutexGuard<'_, Journal> {
        // A panic while holding the lock cannot leave the journal half-applied: memory is
        // updated only after a successful append, so the data is still consistent.
        self.journal.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Commits a batch durably: when this returns, every change survives `kill -9` and
    /// power loss; after a crash during the call, either all or none of them do.
    ///
    /// Group commit: the line is appended under the journal lock, the `fdatasync` runs
    /// outside it, and one `fdatasync` covers every line appended before it started, so
    /// concurrent commits share it and a buffered commit never waits for one. Before it
    /// syncs, the commit that runs it waits a moment for commits announced with
    /// [`Store::announce_commit`] (see `group`).
    pub fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        self.commit_with(batch, Durability::Synced)
    }

    /// Commits a batch as [`Durability`] says.
    pub fn commit_with(&self, batch: Batch, durability: Durability) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let seq = {
            let mut journal = self.lock_journal();
            let sizes = journal.append(&batch.ops)?;
            journal.apply_sized(batch.ops, &sizes);
            journal.seq
        };
        if durability == Durability::Buffered {
            return Ok(());
        }
        self.sync_through(seq)?;
        let mut journal = self.lock_journal();
        if journal.len > COMPACT_MIN_BYTES && journal.len > 2 * journal.live_bytes {
            // The commit is already durable; a failed compaction only leaves a longer
            // journal, retried on the next commit. Buffered commits never compact: the
            // rewrite and its syncs would land on their caller's latency.
            if let Err(e) = journal.compact() {
                tracing::warn!(error = %e, "state journal compaction failed");
            }
        }
        Ok(())
    }

    /// Announces a synced commit this caller will make soon (a prepare, from its start: its
    /// API reads come first), so that a commit ready earlier waits for it, a moment at most,
    /// and both share one `fdatasync`. Drop the notice once committed, or when there is
    /// nothing to commit after all.
    pub fn announce_commit(&self) -> CommitNotice {
        Group::announce(&self.group)
    }

    /// Makes every append up to `seq` durable. One caller at a time leads: it collects the
    /// announced commits (`group`), then syncs everything appended so far; the others wait
    /// and find their line durable, or lead the next sync. After a failed `fdatasync` the
    /// store is poisoned, so every commit it carried, and every later one, fails.
    fn sync_through(&self, seq: u64) -> Result<(), StoreError> {
        let durable = || self.durable_seq.load(Ordering::Acquire) >= seq;
        let Some(leader) = self.group.wait_or_lead(durable) else {
            return Ok(());
        };
        {
            let journal = self.lock_journal();
            if journal.poisoned {
                return Err(StoreError::Poisoned { path: journal.path.clone() });
            }
        }
        leader.collect(GROUP_SIZE, self.collect_window);
        let result = self.sync_appended();
        drop(leader);
        result
    }

    /// Syncs every line appended so far (the leader of a group commit).
    fn sync_appended(&self) -> Result<(), StoreError> {
        let mut syncer = self.syncer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (target, path) = {
            let mut journal = self.lock_journal();
            if journal.poisoned {
                return Err(StoreError::Poisoned { path: journal.path.clone() });
            }
            if journal.file.is_none() || journal.rewrite_pending {
                // A compaction after this line was appended renamed the journal and could
                // not finish: the line sits in a file whose name may not survive power loss.
                // Rewriting now (snapshot synced, rename, directory synced) makes it durable.
                let result = journal.compact();
                if result.is_err() {
                    journal.poisoned = true;
                }
                return result;
            }
            if syncer
                .handle
                .as_ref()
                .is_none_or(|(generation, _)| *generation != journal.generation)
            {
                let file = journal.file.as_ref().map(|f| f.duplicate()).transpose();
                let file = file.map_err(io_err("dup", &journal.path))?;
                syncer.handle = file.map(|f| (journal.generation, f));
            }
            (journal.seq, journal.path.clone())
        };
        let Some((_, handle)) = syncer.handle.as_mut() else {
            return Err(StoreError::Poisoned { path });
        };
        // fdatasync: the appended bytes and the new size, not the timestamps.
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if let Err(source) = handle.sync_data() {
            // After a failed fdatasync the kernel may have dropped the dirty pages and a
            // retry can report success for bytes that never reached the disk; lines of other
            // commits share the failure. Refuse every later write until a restart reloads
            // the journal from disk (what PostgreSQL does since 2018 for the same reason).
            self.lock_journal().poisoned = true;
            return Err(StoreError::Io { op: "fdatasync", path, source });
        }
        self.durable_seq.fetch_max(target, Ordering::AcqRel);
        Ok(())
    }

    /// Writes (creates or replaces) one record durably.
    pub fn put<R: Record>(&self, key: &str, record: &R) -> Result<(), StoreError> {
        self.put_with(key, record, Durability::Synced)
    }

    /// Writes (creates or replaces) one record as [`Durability`] says.
    pub fn put_with<R: Record>(
        &self,
        key: &str,
        record: &R,
        durability: Durability,
    ) -> Result<(), StoreError> {
        let mut batch = Batch::new();
        batch.put(key, record)?;
        self.commit_with(batch, durability)
    }

    /// Removes one record durably; `false` when there was none.
    pub fn remove<R: Record>(&self, key: &str) -> Result<bool, StoreError> {
        self.remove_with::<R>(key, Durability::Synced)
    }

    /// Removes one record as [`Durability`] says; `false` when there was none.
    pub fn remove_with<R: Record>(
        &self,
        key: &str,
        durability: Durability,
    ) -> Result<bool, StoreError> {
        check_key::<R>(key)?;
        if !self.lock_journal().records.contains_key(&(R::KIND.to_owned(), key.to_owned())) {
            return Ok(false);
        }
        let mut batch = Batch::new();
        batch.remove::<R>(key)?;
        self.commit_with(batch, durability)?;
        Ok(true)
    }

    /// Reads one record (migrating an older version in memory).
    pub fn get<R: Record>(&self, key: &str) -> Result<Option<R>, StoreError> {
        let stored =
            self.lock_journal().records.get(&(R::KIND.to_owned(), key.to_owned())).cloned();
        stored.map(|s| decode_record::<R>(key, &s).map(|(record, _)| record)).transpose()
    }

    /// Every record of a kind, sorted by key. Records of an older version are migrated and
    /// written back, so each migration runs once.
    pub fn load_all<R: Record>(&self) -> Result<Vec<(String, R)>, StoreError> {
        let stored: Vec<(String, Stored)> = {
            let journal = self.lock_journal();
            journal
                .records
                .range((R::KIND.to_owned(), String::new())..)
                .take_while(|((kind, _), _)| kind == R::KIND)
                .map(|((_, key), s)| (key.clone(), s.clone()))
                .collect()
        };
        let mut out = Vec::with_capacity(stored.len());
        let mut upgrades = Batch::new();
        for (key, s) in stored {
            let (record, migrated) = decode_record::<R>(&key, &s)?;
            if migrated {
                upgrades.put(&key, &record)?;
            }
            out.push((key, record));
        }
        self.commit(upgrades)?;
        Ok(out)
    }
}

impl Journal {
    /// Appends one line (into the page cache: the caller syncs); on a failed write the
    /// journal is cut back to its previous length so no partial line sits before later
    /// commits. Returns each op's encoded size (see [`op_size`](super::format::op_size)).
    fn append(&mut self, ops: &[Op]) -> Result<Vec<u64>, StoreError> {
        if self.poisoned {
            return Err(StoreError::Poisoned { path: self.path.clone() });
        }
        if self.rewrite_pending {
            self.compact()?;
        }
        let (json, sizes) = encode_entry(ops)?;
        let line = encode_line(&json);
        if self.file.is_none() {
            self.file =
                Some(self.disk.open_append(&self.path).map_err(io_err("open", &self.path))?);
            self.generation += 1;
        }
        let Some(file) = self.file.as_mut() else {
            return Err(StoreError::Poisoned { path: self.path.clone() });
        };
        match file.write_all(line.as_bytes()).map_err(io_err("append", &self.path)) {
            Ok(()) => {
                self.len += line.len() as u64;
                self.seq += 1;
                Ok(sizes)
            }
            Err(e) => {
                // The cut-back reaches the disk with the next fdatasync, which also carries
                // the size; until then the torn tail is never followed by a synced line.
                if file.set_len(self.len).is_err() {
                    self.poisoned = true;
                }
                Err(e)
            }
        }
    }

    /// Applies appended ops with the sizes [`Journal::append`] measured (no second
    /// serialisation under the journal lock).
    fn apply_sized(&mut self, ops: Vec<Op>, sizes: &[u64]) {
        for (op, size) in ops.into_iter().zip(sizes) {
            apply_op(&mut self.records, &mut self.live_bytes, op, Some(*size));
        }
    }

    /// Rewrites the journal with only the live records. Until the rename nothing changes;
    /// once it is done the new file is the journal whatever fails next, so later appends
    /// never go to the old, unlinked file (they would be acknowledged and then lost).
    fn compact(&mut self) -> Result<(), StoreError> {
        let text = snapshot_text(&self.records)?;
        // The temp file's fsync.
        self.syncs.fetch_add(1, Ordering::Relaxed);
        replace_journal(&*self.disk, &self.root, &text)?;
        crate::failpoint!("store.compact.after_rename");
        self.file = None;
        self.len = text.len() as u64;
        self.rewrite_pending = true;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.disk.sync_dir(&self.root).map_err(io_err("fsync", &self.root))?;
        self.rewrite_pending = false;
        // The synced snapshot holds every append so far, under a durable name.
        self.durable_seq.fetch_max(self.seq, Ordering::AcqRel);
        self.file = Some(self.disk.open_append(&self.path).map_err(io_err("open", &self.path))?);
        self.generation += 1;
        Ok(())
    }
}

/// Applies committed operations to the in-memory index.
fn apply_ops(records: &mut BTreeMap<(String, String), Stored>, live_bytes: &mut u64, ops: Vec<Op>) {
    for op in ops {
        apply_op(records, live_bytes, op, None);
    }
}

/// Applies one operation; `size` is its encoded size when known (else measured).
fn apply_op(
    records: &mut BTreeMap<(String, String), Stored>,
    live_bytes: &mut u64,
    op: Op,
    size: Option<u64>,
) {
    match op {
        Op::Put { kind, key, version, data } => {
            let bytes = size.unwrap_or_else(|| encoded_size(&data));
            *live_bytes += bytes;
            if let Some(old) = records.insert((kind, key), Stored { version, data, bytes }) {
                *live_bytes -= old.bytes;
            }
        }
        Op::Remove { kind, key } => {
            if let Some(old) = records.remove(&(kind, key)) {
                *live_bytes -= old.bytes;
            }
        }
    }
}

/// Writes `text` to the temp file, syncs it and renames it over the journal. On error the
/// journal is unchanged. The caller syncs the directory to make the rename durable.
fn replace_journal(disk: &dyn Disk, root: &Path, text: &str) -> Result<(), StoreError> {
    let temp = root.join(JOURNAL_TEMP);
    let path = root.join(JOURNAL_FILE);
    let result = (|| {
        let mut file = disk.create(&temp).map_err(io_err("create", &temp))?;
        file.write_all(text.as_bytes()).map_err(io_err("write", &temp))?;
        // Data must be on disk before the rename makes it the journal.
        file.sync_all().map_err(io_err("fsync", &temp))?;
        disk.rename(&temp, &path).map_err(io_err("rename", &path))
    })();
    if result.is_err() {
        let _ = disk.remove_file(&temp);
    }
    result
}

/// Reads the journal: header, then committed lines; a last line without its newline is a
/// torn append and is cut off. Returns the journal and its header's format version.
fn load_journal(
    disk: Arc<dyn Disk>,
    root: PathBuf,
    path: PathBuf,
    bytes: &[u8],
) -> Result<(Journal, u32), StoreError> {
    let corrupt = |offset: usize, reason: String| StoreError::Corrupt {
        path: path.clone(),
        offset: offset as u64,
        reason,
    };
    let header_end = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| corrupt(0, "no header line".to_owned()))?;
    let header: Header = serde_json::from_slice(&bytes[..header_end])
        .map_err(|e| corrupt(0, format!("header: {e}")))?;
    if header.format != FORMAT_NAME {
        return Err(corrupt(0, format!("header format {:?}", header.format)));
    }
    if header.version > FORMAT_VERSION {
        return Err(StoreError::NewerFormat { path, version: header.version });
    }
    // Versions 1 and 2 share the line format; the caller rewrites an older journal.
    let mut file = disk.open_append(&path).map_err(io_err("open", &path))?;
    let mut records = BTreeMap::new();
    let mut live_bytes = 0;
    let mut offset = header_end + 1;
    while offset < bytes.len() {
        let Some(newline) = bytes[offset..].iter().position(|b| *b == b'\n') else {
            break; // torn last append: never acknowledged
        };
        let line = std::str::from_utf8(&bytes[offset..offset + newline])
            .map_err(|e| corrupt(offset, format!("not UTF-8: {e}")))?;
        let (sum, json) =
            line.split_once(' ').ok_or_else(|| corrupt(offset, "no checksum".to_owned()))?;
        if sum != checksum(json) {
            return Err(corrupt(offset, "checksum mismatch".to_owned()));
        }
        let entry: Entry =
            serde_json::from_str(json).map_err(|e| corrupt(offset, e.to_string()))?;
        apply_ops(&mut records, &mut live_bytes, entry.ops);
        offset += newline + 1;
    }
    if offset < bytes.len() {
        file.set_len(offset as u64)
            .and_then(|()| file.sync_data())
            .map_err(io_err("truncate", &path))?;
    }
    let journal = Journal {
        disk,
        root,
        path,
        file: Some(file),
        len: offset as u64,
        records,
        live_bytes,
        rewrite_pending: false,
        poisoned: false,
        seq: 0,
        generation: 0,
        durable_seq: Arc::new(AtomicU64::new(0)),
        syncs: Arc::new(AtomicU64::new(0)),
    };
    Ok((journal, header.version))
}
