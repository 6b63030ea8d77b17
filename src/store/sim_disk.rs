//! A simulated disk for the store's tests: a page cache in front of durable storage, power
//! loss that keeps only what was synced, and errors injected into any one call.
//!
//! The model is the one POSIX promises and no more (what ext4, XFS and btrfs may do on power
//! loss, after `fsync(2)`'s contract):
//! - written bytes sit in the page cache until `fdatasync`/`fsync` on that file; at power loss
//!   an unsynced tail may have been written back in part, so each file keeps its synced bytes
//!   plus a random prefix of what followed them (never a hole, never bytes that were not
//!   written);
//! - a new name, a rename or an unlink is durable after `fsync` on the directory; until then
//!   power loss keeps any prefix of the directory changes since the last sync (file systems
//!   write directory changes back in order, but whenever they like);
//! - a file handle keeps its inode: writes through a handle whose name was renamed over go to
//!   an inode no directory holds, and are gone after power loss however often they are synced.
//!
//! Every call counts as one operation; [`SimDisk::cut_power_at`] makes operation `n` and all
//! later ones fail (the machine is off), [`SimDisk::fail`] makes one call fail with an errno
//! and no effect (a failing write stores a short prefix first, as a full disk does), and
//! [`SimDisk::power_loss`] turns the disk back on with only the durable state.

use std::any::Any;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::disk::{Disk, DiskFile};

/// The calls of the store, for fault injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SimOp {
    Lock,
    Read,
    OpenAppend,
    Create,
    Write,
    SyncData,
    SyncAll,
    SetLen,
    Rename,
    Remove,
    SyncDir,
}

#[derive(Debug, Default)]
struct Inode {
    /// What readers see: the page cache.
    cached: Vec<u8>,
    /// What survives power loss.
    durable: Vec<u8>,
}

#[derive(Debug)]
struct Fault {
    op: SimOp,
    /// Fail the `nth` matching call from now (1 = the next).
    nth: u32,
    errno: i32,
    /// Keep failing every matching call after that (a full fd table, a dead disk).
    persistent: bool,
}

#[derive(Debug, Default)]
struct State {
    inodes: Vec<Inode>,
    names: BTreeMap<PathBuf, usize>,
    durable_names: BTreeMap<PathBuf, usize>,
    /// The directory after each change since the last directory sync, oldest first.
    unsynced_names: Vec<BTreeMap<PathBuf, usize>>,
    faults: Vec<Fault>,
    /// Operations so far.
    ops: u64,
    /// The operation number at which the power goes off.
    cut_at: Option<u64>,
    /// Handles from before the last power loss are dead.
    epoch: u64,
    /// A fixed seed for the partial write-back at power loss.
    rng: u64,
}

/// How much of the directory changes made since the last directory sync survive power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DirWriteback {
    /// All of them (the kernel wrote them back just before the power went).
    All,
    /// A random prefix.
    Random,
    /// The first this many.
    Prefix(usize),
}

/// Holds `fdatasync` calls at their start while set, so a test can act while one is in
/// flight.
#[derive(Debug, Default)]
struct SyncHold {
    held: bool,
    /// Calls waiting at the hold now.
    waiting: usize,
    /// `fdatasync` calls that went through so far.
    done: u64,
}

/// A simulated disk; clones share it.
#[derive(Debug, Clone)]
pub(crate) struct SimDisk {
    state: Arc<Mutex<State>>,
    hold: Arc<(Mutex<SyncHold>, std::sync::Condvar)>,
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(nix::libc::EIO)
}

impl SimDisk {
    /// An empty disk; `seed` drives the partial write-back of unsynced bytes at power loss.
    pub(crate) fn new(seed: u64) -> SimDisk {
        SimDisk {
            state: Arc::new(Mutex::new(State { rng: seed | 1, ..State::default() })),
            hold: Arc::default(),
        }
    }

    fn hold_state(&self) -> MutexGuard<'_, SyncHold> {
        self.hold.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes every `fdatasync` from now wait at its start until [`SimDisk::release_syncs`].
    pub(crate) fn hold_syncs(&self) {
        self.hold_state().held = true;
    }

    /// Lets held and later `fdatasync` calls through.
    pub(crate) fn release_syncs(&self) {
        self.hold_state().held = false;
        self.hold.1.notify_all();
    }

    /// `fdatasync` calls waiting at the hold now.
    pub(crate) fn syncs_waiting(&self) -> usize {
        self.hold_state().waiting
    }

    /// `fdatasync` calls made so far (held ones once they went through).
    pub(crate) fn syncs_done(&self) -> u64 {
        self.hold_state().done
    }

    fn pass_sync_hold(&self) {
        let mut hold = self.hold_state();
        hold.waiting += 1;
        while hold.held {
            hold = self.hold.1.wait(hold).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        hold.waiting -= 1;
        hold.done += 1;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Fails the `nth` next call of `op` with `errno`.
    pub(crate) fn fail(&self, op: SimOp, nth: u32, errno: i32) {
        self.lock().faults.push(Fault { op, nth, errno, persistent: false });
    }

    /// Fails the `nth` next call of `op` and every later one with `errno`.
    pub(crate) fn fail_from(&self, op: SimOp, nth: u32, errno: i32) {
        self.lock().faults.push(Fault { op, nth, errno, persistent: true });
    }

    /// The power goes off at operation number `op` (counted from the disk's creation): that
    /// call and every later one fail with EIO and change nothing.
    pub(crate) fn cut_power_at(&self, op: u64) {
        self.lock().cut_at = Some(op);
    }

    /// Operations counted so far (for [`SimDisk::cut_power_at`] relative to now).
    pub(crate) fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// Forgets a [`SimDisk::cut_power_at`] not reached yet (the process died first).
    pub(crate) fn cancel_power_cut(&self) {
        self.lock().cut_at = None;
    }

    /// Whether the power is off ([`SimDisk::cut_power_at`] reached).
    pub(crate) fn powered_off(&self) -> bool {
        let state = self.lock();
        state.cut_at.is_some_and(|at| state.ops >= at)
    }

    /// Power loss and restart: every file keeps its synced bytes plus a random prefix of its
    /// unsynced tail, the directory a random prefix of its unsynced changes, open handles die.
    pub(crate) fn power_loss(&self) {
        self.power_loss_with(DirWriteback::Random);
    }

    /// [`SimDisk::power_loss`] with a chosen fate for the unsynced directory changes.
    pub(crate) fn power_loss_with(&self, dir: DirWriteback) {
        let mut state = self.lock();
        let State { inodes, names, durable_names, unsynced_names, rng, .. } = &mut *state;
        let mut random = |bound: usize| {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            usize::try_from(*rng % (bound as u64 + 1)).unwrap_or(0)
        };
        for inode in inodes.iter_mut() {
            if inode.cached.starts_with(&inode.durable) && inode.cached.len() > inode.durable.len()
            {
                let kept = random(inode.cached.len() - inode.durable.len());
                inode.durable = inode.cached[..inode.durable.len() + kept].to_vec();
            }
            inode.cached = inode.durable.clone();
        }
        let kept = match dir {
            DirWriteback::All => unsynced_names.len(),
            DirWriteback::Random => random(unsynced_names.len()),
            DirWriteback::Prefix(n) => n.min(unsynced_names.len()),
        };
        if kept > 0 {
            *durable_names = unsynced_names[kept - 1].clone();
        }
        unsynced_names.clear();
        *names = durable_names.clone();
        state.cut_at = None;
        state.faults.clear();
        state.epoch += 1;
    }

    /// A file's content as readers see it now.
    pub(crate) fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.lock();
        state.names.get(path).map(|i| state.inodes[*i].cached.clone())
    }

    /// Replaces a file's content, durably (a test preparing a damaged journal).
    pub(crate) fn write_durably(&self, path: &Path, bytes: &[u8]) {
        let mut state = self.lock();
        let inode = state.inodes.len();
        state.inodes.push(Inode { cached: bytes.to_vec(), durable: bytes.to_vec() });
        state.names.insert(path.to_path_buf(), inode);
        state.durable_names.insert(path.to_path_buf(), inode);
    }

    /// Counts one call of `op`: `Err` when the power is off or a fault is armed for it.
    fn enter(state: &mut State, op: SimOp) -> io::Result<()> {
        state.ops += 1;
        if state.cut_at.is_some_and(|at| state.ops >= at) {
            return Err(eio());
        }
        let mut fired = None;
        for (i, fault) in state.faults.iter_mut().enumerate() {
            if fault.op == op {
                fault.nth = fault.nth.saturating_sub(1);
                if fault.nth == 0 {
                    fired = Some(i);
                    break;
                }
            }
        }
        let Some(i) = fired else { return Ok(()) };
        let errno = state.faults[i].errno;
        if !state.faults[i].persistent {
            state.faults.remove(i);
        }
        Err(io::Error::from_raw_os_error(errno))
    }

    fn file(&self, inode: usize) -> Box<dyn DiskFile> {
        let epoch = self.lock().epoch;
        Box::new(SimFile { disk: self.clone(), inode, epoch })
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{} does not exist", path.display()))
}

impl Disk for SimDisk {
    fn lock_dir(
        &self,
        _root: &Path,
        _lock_file: &Path,
        _patience: Duration,
    ) -> io::Result<Option<Box<dyn Any + Send + Sync>>> {
        // One process: there is nobody to lock out.
        SimDisk::enter(&mut self.lock(), SimOp::Lock)?;
        Ok(Some(Box::new(())))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut state = self.lock();
        SimDisk::enter(&mut state, SimOp::Read)?;
        let inode = *state.names.get(path).ok_or_else(|| not_found(path))?;
        Ok(state.inodes[inode].cached.clone())
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        let inode = {
            let mut state = self.lock();
            SimDisk::enter(&mut state, SimOp::OpenAppend)?;
            *state.names.get(path).ok_or_else(|| not_found(path))?
        };
        Ok(self.file(inode))
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn DiskFile>> {
        let inode = {
            let mut state = self.lock();
            SimDisk::enter(&mut state, SimOp::Create)?;
            if let Some(inode) = state.names.get(path).copied() {
                state.inodes[inode].cached.clear();
                inode
            } else {
                let inode = state.inodes.len();
                state.inodes.push(Inode::default());
                state.names.insert(path.to_path_buf(), inode);
                state.dir_changed();
                inode
            }
        };
        Ok(self.file(inode))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.lock();
        SimDisk::enter(&mut state, SimOp::Rename)?;
        let inode = state.names.remove(from).ok_or_else(|| not_found(from))?;
        state.names.insert(to.to_path_buf(), inode);
        state.dir_changed();
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        SimDisk::enter(&mut state, SimOp::Remove)?;
        state.names.remove(path).ok_or_else(|| not_found(path))?;
        state.dir_changed();
        Ok(())
    }

    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        // The store keeps every file in one directory.
        let mut state = self.lock();
        SimDisk::enter(&mut state, SimOp::SyncDir)?;
        state.durable_names = state.names.clone();
        state.unsynced_names.clear();
        Ok(())
    }
}

impl State {
    fn dir_changed(&mut self) {
        self.unsynced_names.push(self.names.clone());
    }
}

#[derive(Debug)]
struct SimFile {
    disk: SimDisk,
    inode: usize,
    epoch: u64,
}

impl SimFile {
    fn enter(&self, op: SimOp) -> io::Result<MutexGuard<'_, State>> {
        let mut state = self.disk.lock();
        if state.epoch != self.epoch {
            return Err(eio());
        }
        SimDisk::enter(&mut state, op).map(|()| state)
    }
}

impl DiskFile for SimFile {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        // Both the journal (O_APPEND) and a new temp file are only ever written at their end.
        let inode = self.inode;
        let mut state = match self.enter(SimOp::Write) {
            Ok(state) => state,
            Err(e) if e.raw_os_error() == Some(nix::libc::EIO) => return Err(e),
            Err(e) => {
                // A full disk takes what fits, then fails: half of it here.
                self.disk.lock().inodes[inode].cached.extend_from_slice(&bytes[..bytes.len() / 2]);
                return Err(e);
            }
        };
        state.inodes[inode].cached.extend_from_slice(bytes);
        Ok(())
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.disk.pass_sync_hold();
        let inode = self.inode;
        let mut state = self.enter(SimOp::SyncData)?;
        let node = &mut state.inodes[inode];
        node.durable.clone_from(&node.cached);
        Ok(())
    }

    fn sync_all(&mut self) -> io::Result<()> {
        let inode = self.inode;
        let mut state = self.enter(SimOp::SyncAll)?;
        let node = &mut state.inodes[inode];
        node.durable.clone_from(&node.cached);
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let inode = self.inode;
        let mut state = self.enter(SimOp::SetLen)?;
        let len = usize::try_from(len).map_err(|_| eio())?;
        state.inodes[inode].cached.resize(len, 0);
        Ok(())
    }

    fn duplicate(&self) -> io::Result<Box<dyn DiskFile>> {
        // A second descriptor of the same inode; a handle from before a power loss stays dead.
        Ok(Box::new(SimFile { disk: self.disk.clone(), inode: self.inode, epoch: self.epoch }))
    }
}
