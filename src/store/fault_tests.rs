//! The store on a simulated disk: injected I/O errors and power loss at every point, checked
//! against what was acknowledged. Unlike the kill -9 test (the page cache survives a killed
//! process), these lose every byte that was not synced, so a missing `fdatasync`, `fsync` or
//! directory sync makes them fail.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::journal::JOURNAL_FILE;
use super::sim_disk::{DirWriteback, SimDisk, SimOp};
use super::*;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Item {
    value: u64,
    payload: String,
}

impl Record for Item {
    const KIND: &'static str = "fault-test";
    const VERSION: u32 = 1;
}

fn root() -> PathBuf {
    PathBuf::from("/state")
}

fn open(disk: &SimDisk) -> Result<Store, StoreError> {
    Store::open_on(Arc::new(disk.clone()), root())
}

/// What a key may hold after a crash: its last acknowledged value, or a value a later
/// commit tried to write (a failed or interrupted commit may or may not have reached the
/// disk). `None` stands for "absent".
#[derive(Debug, Default)]
struct Expected {
    keys: BTreeMap<String, (Option<u64>, Vec<Option<u64>>)>,
}

impl Expected {
    fn acked(&mut self, key: &str, value: Option<u64>) {
        self.keys.insert(key.to_owned(), (value, Vec::new()));
    }

    fn attempted(&mut self, key: &str, value: Option<u64>) {
        self.keys.entry(key.to_owned()).or_default().1.push(value);
    }

    fn check(&self, store: &Store, context: &str) {
        let found: BTreeMap<String, Item> = store.load_all().unwrap().into_iter().collect();
        for (key, (acked, attempted)) in &self.keys {
            let now = found.get(key).map(|e| e.value);
            assert!(
                now == *acked || attempted.contains(&now),
                "{context}: key {key} holds {now:?}, acknowledged {acked:?}, attempted since {attempted:?}"
            );
        }
        for key in found.keys() {
            assert!(self.keys.contains_key(key), "{context}: key {key} was never written");
        }
    }
}

fn entry(value: u64, size: usize) -> Item {
    Item { value, payload: "p".repeat(size) }
}

/// Puts three keys in turn with ~4 KiB records until the journal has been compacted once,
/// then three more, recording what was acknowledged; returns the last value and how many
/// commits failed.
fn write_until_compacted(disk: &SimDisk, store: &Store, expected: &mut Expected) -> (u64, usize) {
    let path = root().join(JOURNAL_FILE);
    let mut failures = 0;
    let mut longest = 0;
    let mut after_compaction = None;
    for value in 1..400 {
        let key = format!("k{}", value % 3);
        if store.put(&key, &entry(value, 4000)).is_ok() {
            expected.acked(&key, Some(value));
        } else {
            failures += 1;
            expected.attempted(&key, Some(value));
        }
        let len = disk.contents(&path).map_or(0, |c| c.len());
        if after_compaction.is_none() && len < longest {
            after_compaction = Some(value + 3);
        }
        longest = longest.max(len);
        if after_compaction == Some(value) {
            return (value, failures);
        }
    }
    panic!("no compaction in 400 commits");
}

#[test]
fn a_compaction_that_fails_after_its_rename_never_acknowledges_a_commit_it_then_loses() {
    // After the rename the new file is the journal. When the directory sync keeps failing
    // (the renames may reach the disk or not, in order), or the journal cannot be reopened
    // and no new file can be created (a full fd table: EMFILE), later commits must fail, not
    // go to the old, unlinked file and be acknowledged.
    type Arm = fn(&SimDisk);
    let cases: [(&str, Arm); 2] = [
        ("directory sync failing from the compaction on", |disk| {
            disk.fail_from(SimOp::SyncDir, 1, nix::libc::EIO);
        }),
        ("EMFILE from the reopen after the rename on", |disk| {
            disk.fail_from(SimOp::OpenAppend, 1, nix::libc::EMFILE);
            disk.fail_from(SimOp::Create, 2, nix::libc::EMFILE);
        }),
    ];
    for (case, arm) in cases {
        for kept in 0..4 {
            let disk = SimDisk::new(7);
            let store = open(&disk).unwrap();
            arm(&disk);
            let mut expected = Expected::default();
            let (last, _) = write_until_compacted(&disk, &store, &mut expected);
            if store.put("after", &entry(last + 1, 10)).is_ok() {
                expected.acked("after", Some(last + 1));
            }
            drop(store);
            disk.power_loss_with(DirWriteback::Prefix(kept));
            let store = open(&disk).unwrap();
            expected.check(&store, &format!("{case}, {kept} directory changes kept"));
        }
    }
}

#[test]
fn a_failed_directory_sync_is_retried_by_a_new_rewrite_before_the_next_commit() {
    let disk = SimDisk::new(11);
    let store = open(&disk).unwrap();
    // The compaction's directory sync and the retry's both fail: the commits that meet them
    // fail too; the third attempt succeeds.
    disk.fail(SimOp::SyncDir, 1, nix::libc::EIO);
    disk.fail(SimOp::SyncDir, 1, nix::libc::EIO);
    let mut expected = Expected::default();
    let (_, failures) = write_until_compacted(&disk, &store, &mut expected);
    assert_eq!(failures, 1, "the commit that met the retried rewrite's failure fails");
    drop(store);
    disk.power_loss_with(DirWriteback::All);
    expected.check(&open(&disk).unwrap(), "after retried rewrite");
}

#[test]
fn a_failed_append_is_cut_back_and_the_next_commit_lands_after_it() {
    let disk = SimDisk::new(3);
    let store = open(&disk).unwrap();
    store.put("a", &entry(1, 10)).unwrap();
    disk.fail(SimOp::Write, 1, nix::libc::ENOSPC);
    let err = store.put("a", &entry(2, 10)).unwrap_err();
    assert!(
        matches!(&err, StoreError::Io { source, .. } if source.raw_os_error() == Some(nix::libc::ENOSPC)),
        "{err}"
    );
    store.put("b", &entry(3, 10)).unwrap();
    drop(store);
    disk.power_loss();
    let store = open(&disk).unwrap();
    assert_eq!(store.get::<Item>("a").unwrap().map(|e| e.value), Some(1));
    assert_eq!(store.get::<Item>("b").unwrap().map(|e| e.value), Some(3));
}

#[test]
fn a_failed_fdatasync_poisons_the_store_and_a_reopen_keeps_every_acknowledged_commit() {
    // After a failed fdatasync the kernel may have dropped the dirty pages, so a retried one
    // can succeed without the bytes; with group commit the failed sync also carried other
    // commits' lines. Nothing is acknowledged after it until the journal is read again.
    let disk = SimDisk::new(4);
    let store = open(&disk).unwrap();
    store.put("a", &entry(1, 10)).unwrap();
    assert!(!store.is_poisoned());
    disk.fail(SimOp::SyncData, 1, nix::libc::EIO);
    let err = store.put("a", &entry(2, 10)).unwrap_err();
    assert!(store.is_poisoned(), "readiness reports it");
    assert!(
        matches!(&err, StoreError::Io { op: "fdatasync", source, .. } if source.raw_os_error() == Some(nix::libc::EIO)),
        "{err}"
    );
    let err = store.put("b", &entry(3, 10)).unwrap_err();
    assert!(matches!(err, StoreError::Poisoned { .. }), "{err}");
    let err = store.put_with("c", &entry(4, 10), Durability::Buffered).unwrap_err();
    assert!(matches!(err, StoreError::Poisoned { .. }), "{err}");
    drop(store);
    disk.power_loss();
    let store = open(&disk).unwrap();
    let a = store.get::<Item>("a").unwrap().map(|e| e.value);
    assert!(a == Some(1) || a == Some(2), "a = {a:?}");
    assert_eq!(store.get::<Item>("b").unwrap(), None);
    assert!(!store.is_poisoned());
    store.put("b", &entry(5, 10)).unwrap();
}

#[test]
fn an_append_that_cannot_be_cut_back_poisons_the_store_until_it_is_reopened() {
    let disk = SimDisk::new(5);
    let store = open(&disk).unwrap();
    store.put("a", &entry(1, 10)).unwrap();
    disk.fail(SimOp::Write, 1, nix::libc::ENOSPC);
    disk.fail(SimOp::SetLen, 1, nix::libc::EIO);
    assert!(store.put("a", &entry(2, 10)).is_err());
    let err = store.put("b", &entry(3, 10)).unwrap_err();
    assert!(matches!(err, StoreError::Poisoned { .. }), "{err}");
    drop(store);
    disk.power_loss();
    let store = open(&disk).unwrap();
    assert_eq!(store.get::<Item>("a").unwrap().map(|e| e.value), Some(1));
    assert_eq!(store.get::<Item>("b").unwrap(), None);
}

#[test]
fn a_buffered_commit_survives_a_killed_process_and_a_later_synced_commit_makes_it_durable() {
    let disk = SimDisk::new(6);
    let store = open(&disk).unwrap();
    store.put("a", &entry(1, 10)).unwrap();
    let synced = disk.syncs_done();
    store.put_with("b", &entry(2, 10), Durability::Buffered).unwrap();
    assert!(store.remove_with::<Item>("a", Durability::Buffered).unwrap());
    assert_eq!(disk.syncs_done(), synced, "a buffered commit never syncs");
    // kill -9: the page cache stays, so a new process reads what was buffered.
    drop(store);
    let store = open(&disk).unwrap();
    assert_eq!(store.get::<Item>("b").unwrap().map(|e| e.value), Some(2));
    assert_eq!(store.get::<Item>("a").unwrap(), None);
    // A synced commit carries every line before it to the disk.
    store.put_with("c", &entry(3, 10), Durability::Buffered).unwrap();
    store.put("d", &entry(4, 10)).unwrap();
    store.put_with("e", &entry(5, 10), Durability::Buffered).unwrap();
    drop(store);
    disk.power_loss();
    let store = open(&disk).unwrap();
    for (key, value) in [("b", 2), ("c", 3), ("d", 4)] {
        assert_eq!(store.get::<Item>(key).unwrap().map(|e| e.value), Some(value), "{key}");
    }
    // `e` may or may not have been written back; either way the journal opens.
    assert!(matches!(store.get::<Item>("e").unwrap().map(|e| e.value), None | Some(5)));
}

/// Waits (bounded, so a regression fails instead of hanging CI) until `done` holds.
fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn commits_behind_a_running_fdatasync_share_the_next_one_and_a_buffered_commit_waits_for_none() {
    let disk = SimDisk::new(7);
    let store = Arc::new(open(&disk).unwrap());
    let before = disk.syncs_done();
    disk.hold_syncs();
    let first = std::thread::spawn({
        let store = Arc::clone(&store);
        move || store.put("a", &entry(1, 10))
    });
    wait_for("the first commit is in its fdatasync", || disk.syncs_waiting() == 1);
    // The journal lock is free while a sync runs: a buffered commit returns at once.
    let (sent, buffered) = std::sync::mpsc::channel();
    std::thread::spawn({
        let store = Arc::clone(&store);
        move || sent.send(store.put_with("b", &entry(2, 10), Durability::Buffered))
    });
    let buffered = buffered.recv_timeout(std::time::Duration::from_secs(20));
    assert!(
        matches!(buffered, Ok(Ok(()))),
        "the buffered commit waited for the sync: {buffered:?}"
    );
    let queued: Vec<_> = ["c", "d", "e"]
        .into_iter()
        .enumerate()
        .map(|(i, key)| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || store.put(key, &entry(3 + i as u64, 10)))
        })
        .collect();
    let journal = root().join(JOURNAL_FILE);
    wait_for("the queued commits appended their lines", || {
        disk.contents(&journal).is_some_and(|c| c.split(|b| *b == b'\n').count() == 7)
    });
    disk.release_syncs();
    first.join().unwrap().unwrap();
    for commit in queued {
        commit.join().unwrap().unwrap();
    }
    assert_eq!(
        disk.syncs_done() - before,
        2,
        "one fdatasync for the first, one for the three behind it"
    );
    drop(store);
    disk.power_loss();
    let store = open(&disk).unwrap();
    for (key, value) in [("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)] {
        assert_eq!(store.get::<Item>(key).unwrap().map(|e| e.value), Some(value), "{key}");
    }
}

/// A small deterministic generator (xorshift), so a failing seed replays exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One round: a random workload of two-key batches (puts of small and large records, and
/// removals), the power cut at a random disk operation, and a restart. Checks durability
/// (every acknowledged batch is there) and atomicity (both keys of a batch agree).
fn power_cut_round(seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let disk = SimDisk::new(seed);
    // Some rounds cut the power before the store is even open.
    disk.cut_power_at(1 + rng.below(400));
    let mut expected = Expected::default();
    if let Ok(store) = open(&disk) {
        for value in 1..=120 {
            let pair = rng.below(6);
            let (x, y) = (format!("x{pair}"), format!("y{pair}"));
            let put = rng.below(5) != 0;
            let mut batch = Batch::new();
            let new = if put {
                // Large records make the journal pass the compaction threshold.
                let size = if rng.below(3) == 0 { 9000 } else { 50 };
                let e = entry(value, size);
                batch.put(&x, &e).unwrap().put(&y, &e).unwrap();
                Some(value)
            } else {
                batch.remove::<Item>(&x).unwrap().remove::<Item>(&y).unwrap();
                None
            };
            if store.commit(batch).is_ok() {
                expected.acked(&x, new);
                expected.acked(&y, new);
            } else {
                expected.attempted(&x, new);
                expected.attempted(&y, new);
            }
        }
    }
    disk.power_loss();
    let store = open(&disk).unwrap_or_else(|e| panic!("seed {seed}: reopen: {e}"));
    expected.check(&store, &format!("seed {seed}"));
    for pair in 0..6 {
        let x = store.get::<Item>(&format!("x{pair}")).unwrap();
        let y = store.get::<Item>(&format!("y{pair}")).unwrap();
        assert_eq!(x, y, "seed {seed}: batch of pair {pair} torn");
    }
    // The recovered store takes new commits.
    store.put("x0", &entry(999, 10)).unwrap();
}

#[test]
fn power_loss_at_any_disk_operation_keeps_every_acknowledged_batch_whole() {
    // `NETCLAIM_STORE_SEED` replays one round.
    if let Some(seed) = std::env::var("NETCLAIM_STORE_SEED").ok().and_then(|s| s.parse().ok()) {
        power_cut_round(seed);
        return;
    }
    for seed in 1..=200 {
        power_cut_round(seed);
    }
}

#[test]
fn a_corrupt_line_in_the_middle_fails_the_open_with_its_offset() {
    let disk = SimDisk::new(1);
    {
        let store = open(&disk).unwrap();
        store.put("a", &entry(1, 10)).unwrap();
        store.put("b", &entry(2, 10)).unwrap();
    }
    let path = root().join(JOURNAL_FILE);
    let mut bytes = disk.contents(&path).unwrap();
    let header_end = bytes.iter().position(|b| *b == b'\n').unwrap();
    bytes[header_end + 20] ^= 0x01;
    disk.write_durably(&path, &bytes);
    let err = open(&disk).unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt { offset, .. } if *offset == header_end as u64 + 1),
        "{err}"
    );
}

mod journal_reader {
    //! The journal reader over outside bytes: a damaged or foreign file never panics the
    //! daemon; it opens with a prefix of the committed batches (a torn tail is dropped) or
    //! fails with an error that names the offset of the bad line.

    use proptest::prelude::*;

    use super::*;

    /// A journal with a few committed batches, written by the store itself.
    fn valid_journal() -> Vec<u8> {
        let disk = SimDisk::new(1);
        let store = open(&disk).unwrap();
        for value in 0..6 {
            store.put(&format!("k{value}"), &entry(value, 20)).unwrap();
        }
        drop(store);
        disk.contents(&root().join(JOURNAL_FILE)).unwrap()
    }

    fn open_bytes(bytes: &[u8]) -> Result<Store, StoreError> {
        let disk = SimDisk::new(2);
        disk.write_durably(&root().join(JOURNAL_FILE), bytes);
        open(&disk)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn arbitrary_bytes_open_or_fail_naming_the_offset(
            bytes in proptest::collection::vec(any::<u8>(), 0..4096),
        ) {
            match open_bytes(&bytes) {
                Ok(store) => {
                    // Only a header and whole checksummed lines can load.
                    prop_assert!(store.load_all::<Item>().is_ok());
                }
                Err(StoreError::Corrupt { offset, reason, .. }) => {
                    prop_assert!(offset <= bytes.len() as u64);
                    prop_assert!(!reason.is_empty());
                }
                Err(StoreError::NewerFormat { .. }) => {}
                Err(other) => prop_assert!(false, "unexpected error {other}"),
            }
        }

        #[test]
        fn a_damaged_valid_journal_keeps_a_prefix_or_names_the_bad_line(
            cut in any::<usize>(),
            flip in any::<usize>(),
            mask in 1u8..=255,
            do_flip in any::<bool>(),
        ) {
            let mut bytes = valid_journal();
            let lines: Vec<usize> = bytes
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'\n')
                .map(|(i, _)| i + 1)
                .collect();
            if do_flip {
                let at = flip % bytes.len();
                bytes[at] ^= mask;
            } else {
                bytes.truncate(cut % (bytes.len() + 1));
            }
            match open_bytes(&bytes) {
                Ok(store) => {
                    let keys: Vec<String> =
                        store.load_all::<Item>().unwrap().into_iter().map(|(k, _)| k).collect();
                    // Batches are kept in order: k0..kn for some n.
                    let expected: Vec<String> = (0..keys.len()).map(|i| format!("k{i}")).collect();
                    prop_assert_eq!(keys, expected);
                }
                Err(StoreError::Corrupt { offset, .. }) => {
                    prop_assert!(offset == 0 || lines.contains(&usize::try_from(offset).unwrap()),
                        "offset {offset} is not a line start");
                }
                // A flip in the header's version digit reads as a newer format, which is
                // refused (never read as ours).
                Err(StoreError::NewerFormat { .. }) => {}
                Err(other) => prop_assert!(false, "unexpected error {other}"),
            }
        }
    }
}
