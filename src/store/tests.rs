//! Store tests: round trips, migration fixtures, locking, and the kill -9 crash test.

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use std::path::{Path, PathBuf};

use super::format::{EntryRef, Op, encode_entry, encode_line, op_size};
use super::journal::{COMPACT_MIN_BYTES, JOURNAL_FILE, JOURNAL_TEMP};
use super::*;

/// A record kind for tests, at version 2; version 0 stored `{"owner": "...", "ip": "..."}`,
/// version 1 renamed `owner` to `claim`, version 2 added `request`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Lease {
    claim: String,
    request: String,
    ip: String,
}

impl Record for Lease {
    const KIND: &'static str = "test-leases";
    const VERSION: u32 = 2;

    fn migrate(from: u32, mut data: Value) -> Result<Value, String> {
        let object = data.as_object_mut().ok_or("not an object")?;
        match from {
            0 => {
                let owner = object.remove("owner").ok_or("v0 record without owner")?;
                object.insert("claim".into(), owner);
            }
            1 => {
                object.insert("request".into(), json!("default"));
            }
            _ => return Err(format!("unknown version {from}")),
        }
        Ok(data)
    }
}

fn lease(claim: &str, ip: &str) -> Lease {
    Lease { claim: claim.into(), request: "nic".into(), ip: ip.into() }
}

#[test]
fn put_get_remove_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.get::<Lease>("a").unwrap(), None);
    store.put("a", &lease("uid-1", "10.0.0.1")).unwrap();
    store.put("a", &lease("uid-2", "10.0.0.2")).unwrap();
    assert_eq!(store.get::<Lease>("a").unwrap(), Some(lease("uid-2", "10.0.0.2")));
    assert!(store.remove::<Lease>("a").unwrap());
    assert!(!store.remove::<Lease>("a").unwrap());
    assert_eq!(store.get::<Lease>("a").unwrap(), None);
}

#[test]
fn records_survive_reopen_sorted_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let keys = ["10.10.1.0/24/10.10.1.5", "fd00:10::5", "uid/req:x", "ünï cödé", ".hidden", "a\nb"];
    {
        let store = Store::open(dir.path()).unwrap();
        for (i, key) in keys.iter().enumerate() {
            store.put(key, &lease(key, &format!("10.0.0.{i}"))).unwrap();
        }
    }
    let store = Store::open(dir.path()).unwrap();
    let loaded = store.load_all::<Lease>().unwrap();
    let mut expected: Vec<&str> = keys.to_vec();
    expected.sort_unstable();
    assert_eq!(loaded.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), expected);
    for (key, record) in loaded {
        assert_eq!(record.claim, key);
    }
}

/// Another record kind, to check that kinds do not see each other's keys.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Other(u32);

impl Record for Other {
    const KIND: &'static str = "test-other";
    const VERSION: u32 = 1;
}

#[test]
fn kinds_are_separate_and_empty_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.put("k", &lease("c", "10.0.0.1")).unwrap();
    store.put("k", &Other(7)).unwrap();
    assert!(store.remove::<Other>("k").unwrap());
    assert_eq!(store.get::<Lease>("k").unwrap(), Some(lease("c", "10.0.0.1")));
    assert!(store.load_all::<Other>().unwrap().is_empty());
    assert!(matches!(store.put("", &Other(1)), Err(StoreError::EmptyKey { .. })));
}

#[test]
fn second_open_of_the_same_dir_is_refused_until_the_first_closes() {
    let dir = tempfile::tempdir().unwrap();
    let first = Store::open(dir.path()).unwrap();
    let err = Store::open(dir.path()).expect_err("locked");
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    drop(first);
    Store::open(dir.path()).expect("lock released");
}

/// Writes a journal by hand: the header, then one committed line per JSON entry.
fn write_journal(dir: &Path, header: &str, entries: &[&str]) -> PathBuf {
    let mut text = format!("{header}\n");
    for entry in entries {
        text.push_str(&encode_line(entry));
    }
    let path = dir.join(JOURNAL_FILE);
    fs::write(&path, text).unwrap();
    path
}

const HEADER_V1: &str = r#"{"format":"netclaim-state","version":1}"#;

#[test]
fn v0_fixture_migrates_to_the_current_version_and_is_written_back() {
    let dir = tempfile::tempdir().unwrap();
    // Records written by "version 0" and "version 1" of this record kind.
    write_journal(
        dir.path(),
        HEADER_V1,
        &[
            r#"{"ops":[{"op":"put","kind":"test-leases","key":"old","version":0,"data":{"owner":"uid-0","ip":"10.0.0.9"}}]}"#,
            r#"{"ops":[{"op":"put","kind":"test-leases","key":"mid","version":1,"data":{"claim":"uid-1","ip":"10.0.0.8"}}]}"#,
        ],
    );
    let expected = vec![
        (
            "mid".to_owned(),
            Lease { claim: "uid-1".into(), request: "default".into(), ip: "10.0.0.8".into() },
        ),
        (
            "old".to_owned(),
            Lease { claim: "uid-0".into(), request: "default".into(), ip: "10.0.0.9".into() },
        ),
    ];
    {
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.get::<Lease>("old").unwrap(), Some(expected[1].1.clone()));
        assert_eq!(store.load_all::<Lease>().unwrap(), expected);
    }
    let text = fs::read_to_string(dir.path().join(JOURNAL_FILE)).unwrap();
    let last: Value =
        serde_json::from_str(text.lines().last().unwrap().split_once(' ').unwrap().1).unwrap();
    assert_eq!(last["ops"].as_array().unwrap().len(), 2, "both upgrades in one batch: {last}");
    assert!(
        last["ops"].as_array().unwrap().iter().all(|op| op["version"] == json!(Lease::VERSION))
    );
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.load_all::<Lease>().unwrap(), expected);
}

#[test]
fn a_format_1_journal_is_rewritten_in_the_current_format_with_its_records() {
    let dir = tempfile::tempdir().unwrap();
    write_journal(
        dir.path(),
        HEADER_V1,
        &[
            r#"{"ops":[{"op":"put","kind":"test-leases","key":"k","version":2,"data":{"claim":"c","request":"r","ip":"10.0.0.1"}}]}"#,
        ],
    );
    {
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.load_all::<Lease>().unwrap().len(), 1);
    }
    let text = fs::read_to_string(dir.path().join(JOURNAL_FILE)).unwrap();
    assert!(
        text.starts_with(&format!(
            r#"{{"format":"netclaim-state","version":{}}}"#,
            crate::store::FORMAT_VERSION
        )),
        "a release before the current format refuses this journal now: {text}"
    );
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.load_all::<Lease>().unwrap()[0].1.ip, "10.0.0.1");
}

/// A rollback (issue 31 item 7): a release that finds a newer journal refuses to start, and
/// its message names both formats, the state dir and the two ways on; the journal is left as
/// it was.
#[test]
fn a_newer_format_is_refused_naming_both_versions_and_the_way_back() {
    let dir = tempfile::tempdir().unwrap();
    let newer = format!(r#"{{"format":"netclaim-state","version":{}}}"#, FORMAT_VERSION + 1);
    let path = write_journal(dir.path(), &newer, &[]);
    let before = fs::read(&path).unwrap();
    let err = Store::open(dir.path()).unwrap_err();
    assert!(
        matches!(err, StoreError::NewerFormat { version, .. } if version == FORMAT_VERSION + 1)
    );
    let state_dir = dir.path().display();
    assert_eq!(
        err.to_string(),
        format!(
            "state dir {state_dir} is format {}, this release reads up to format {FORMAT_VERSION}: \
             run the newer release, or unprepare every claim on this node (drain it) and remove \
             {state_dir} before rolling back",
            FORMAT_VERSION + 1
        )
    );
    assert_eq!(fs::read(&path).unwrap(), before, "the newer journal is not touched");
}

#[test]
fn newer_versions_broken_migrations_and_corruption_are_named_errors() {
    let put = |version: u32, data: &str| {
        format!(
            r#"{{"ops":[{{"op":"put","kind":"test-leases","key":"k","version":{version},"data":{data}}}]}}"#
        )
    };
    // (header, entries, extra bytes appended raw, expected error text at open or load)
    let good = put(2, r#"{"claim":"c","request":"r","ip":"x"}"#);
    let newer = format!(r#"{{"format":"netclaim-state","version":{}}}"#, FORMAT_VERSION + 1);
    let newer_error = format!("is format {}", FORMAT_VERSION + 1);
    let cases: Vec<(&str, Vec<String>, String, &str)> = vec![
        (HEADER_V1, vec![put(3, "{}")], String::new(), "newer than 2"),
        (HEADER_V1, vec![put(0, r#"{"ip":"x"}"#)], String::new(), "v0 record without owner"),
        (HEADER_V1, vec![put(2, r#"{"claim":"c"}"#)], String::new(), "missing field"),
        (&newer, vec![], String::new(), &newer_error),
        (r#"{"format":"other","version":1}"#, vec![], String::new(), "header format"),
        // A complete line with a bad checksum is corruption, even when it is the last.
        (HEADER_V1, vec![good.clone()], format!("0000000000000000 {good}\n"), "checksum mismatch"),
        (HEADER_V1, vec![], "garbage\n".to_owned(), "no checksum"),
    ];
    for (header, entries, raw, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        let entries: Vec<&str> = entries.iter().map(String::as_str).collect();
        let path = write_journal(dir.path(), header, &entries);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(raw.as_bytes()).unwrap();
        let err = match Store::open(dir.path()) {
            Err(e) => e.to_string(),
            Ok(store) => store.load_all::<Lease>().expect_err(expected).to_string(),
        };
        assert!(err.contains(expected), "expected {expected:?} in: {err}");
    }
}

#[test]
fn a_torn_last_line_is_dropped_and_truncated() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let mut batch = Batch::new();
        batch.put("a", &lease("a", "10.0.0.1")).unwrap().put("b", &lease("b", "10.0.0.2")).unwrap();
        store.commit(batch).unwrap();
        let mut batch = Batch::new();
        batch.put("c", &lease("c", "10.0.0.3")).unwrap().remove::<Lease>("a").unwrap();
        store.commit(batch).unwrap();
    }
    let path = dir.path().join(JOURNAL_FILE);
    let full = fs::read(&path).unwrap();
    let second_line_start = full[..full.len() - 1].iter().rposition(|b| *b == b'\n').unwrap() + 1;
    // Every cut inside the last batch loses the whole batch and nothing else.
    for cut in [second_line_start + 1, second_line_start + 30, full.len() - 1] {
        fs::write(&path, &full[..cut]).unwrap();
        let store = Store::open(dir.path()).unwrap();
        let keys: Vec<String> =
            store.load_all::<Lease>().unwrap().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["a", "b"], "cut at {cut}");
        drop(store);
        assert_eq!(fs::read(&path).unwrap().len(), second_line_start, "torn line truncated");
    }
}

#[test]
fn compaction_keeps_the_records_and_shrinks_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let big = "x".repeat(4000);
    for i in 0..400 {
        store.put(&format!("k{}", i % 4), &lease(&format!("{i}"), &big)).unwrap();
    }
    store.put("gone", &lease("g", "1")).unwrap();
    store.remove::<Lease>("gone").unwrap();
    let len = fs::metadata(dir.path().join(JOURNAL_FILE)).unwrap().len();
    assert!(len < 2 * COMPACT_MIN_BYTES, "journal was not compacted: {len} bytes");
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    let loaded = store.load_all::<Lease>().unwrap();
    let claims: Vec<&str> = loaded.iter().map(|(_, l)| l.claim.as_str()).collect();
    assert_eq!(claims, ["396", "397", "398", "399"]);
}

#[test]
fn a_stale_compaction_temp_file_is_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        store.put("a", &lease("uid", "10.0.0.1")).unwrap();
    }
    let stale = dir.path().join(JOURNAL_TEMP);
    fs::write(&stale, b"{\"format\":").unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert!(!stale.exists());
    assert_eq!(store.load_all::<Lease>().unwrap().len(), 1);
}

/// When the parent kills the child.
#[derive(Debug, Clone, Copy)]
pub(super) enum KillAt {
    /// This many microseconds after the child printed its first `ack` line: mid-write.
    AfterFirstAck(u64),
    /// This many microseconds after spawning: possibly while it opens and replays the store.
    AfterSpawn(u64),
}

/// Runs `test` of this test binary as a child with `envs` and kills it with SIGKILL at
/// `kill_at`. Returns the lines it printed and whether the kill interrupted it (rather than
/// finding it exited).
pub(super) fn run_child_and_kill(
    test: &str,
    envs: &[(&str, String)],
    kill_at: KillAt,
) -> (Vec<String>, bool) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let started = Instant::now();
    let extra_micros = match kill_at {
        KillAt::AfterFirstAck(micros) => micros,
        KillAt::AfterSpawn(micros) => {
            std::thread::sleep(Duration::from_micros(micros));
            0
        }
    };
    while matches!(kill_at, KillAt::AfterFirstAck(_))
        && !lines.iter().any(|l: &String| l.starts_with("ack "))
    {
        match rx.recv_timeout(Duration::from_secs(30).saturating_sub(started.elapsed())) {
            Ok(line) => lines.push(line),
            Err(e) => {
                let _ = child.kill();
                panic!("child printed no ack within 30 s ({e}); output: {lines:?}");
            }
        }
    }
    std::thread::sleep(Duration::from_micros(extra_micros));
    // Child::kill sends SIGKILL on Unix.
    child.kill().unwrap();
    let status = child.wait().unwrap();
    reader.join().unwrap();
    lines.extend(rx.try_iter());
    (lines, std::os::unix::process::ExitStatusExt::signal(&status) == Some(9))
}

/// Set in the child: the state dir to write to.
const CRASH_CHILD_ENV: &str = "NETCLAIM_STORE_CRASH_CHILD_DIR";
const CRASH_KEYS: u64 = 8;

/// A record whose payload is derived from its sequence number, so a torn or mixed record
/// is detectable.
#[derive(Debug, Serialize, Deserialize)]
struct CrashRecord {
    seq: u64,
    payload: String,
}

impl Record for CrashRecord {
    const KIND: &'static str = "crash";
    const VERSION: u32 = 1;
}

fn crash_payload(seq: u64) -> String {
    // 1 to ~48 KiB, so writes span many pages and a kill can land mid-write.
    let len = usize::try_from(1 + (seq * 7919) % 48_000).unwrap();
    let unit = format!("{seq:x}-");
    unit.repeat(len / unit.len() + 1)[..len].to_owned()
}

/// The child: writes records forever (bounded by a deadline in case the parent dies),
/// printing `ack <key> <seq>` after each `put` returned.
fn crash_writer(dir: &str) {
    let store = Store::open(dir).expect("child opens the store");
    let mut seq = store
        .load_all::<CrashRecord>()
        .expect("child loads")
        .iter()
        .map(|(_, r)| r.seq)
        .max()
        .unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(20);
    let stdout = std::io::stdout();
    while Instant::now() < deadline {
        seq += 1;
        let key = format!("k{}", seq % CRASH_KEYS);
        store.put(&key, &CrashRecord { seq, payload: crash_payload(seq) }).expect("child put");
        let mut out = stdout.lock();
        writeln!(out, "ack {key} {seq}").expect("stdout");
        out.flush().expect("stdout");
    }
}

#[test]
fn kill_9_at_random_moments_never_leaves_a_torn_record() {
    if let Ok(dir) = std::env::var(CRASH_CHILD_ENV) {
        crash_writer(&dir);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut acked: HashMap<String, u64> = HashMap::new();
    let mut total_acks = 0usize;
    let mut rounds_killed_mid_run = 0;
    let rounds = 40;
    let mut rng = fastrand::Rng::with_seed(0x6e65_7463_6c61_696d);
    for round in 0..rounds {
        let envs = [(CRASH_CHILD_ENV, dir.path().to_string_lossy().into_owned())];
        let (lines, killed) = run_child_and_kill(
            "store::tests::kill_9_at_random_moments_never_leaves_a_torn_record",
            &envs,
            // Every fourth round the kill may land while the child opens the store.
            if round % 4 == 0 {
                KillAt::AfterSpawn(rng.u64(0..20_000))
            } else {
                KillAt::AfterFirstAck(rng.u64(0..30_000))
            },
        );
        if killed {
            rounds_killed_mid_run += 1;
        }
        for line in lines {
            let mut parts = line.split_whitespace();
            if parts.next() == Some("ack") {
                let key = parts.next().unwrap().to_owned();
                let seq: u64 = parts.next().unwrap().parse().unwrap();
                total_acks += 1;
                acked.insert(key, seq);
            }
        }
        // The store always loads whole: every record decodes and is self-consistent, and
        // every acknowledged write is there (or a newer one).
        let store = Store::open(dir.path()).unwrap_or_else(|e| panic!("round {round}: open: {e}"));
        let loaded =
            store.load_all::<CrashRecord>().unwrap_or_else(|e| panic!("round {round}: load: {e}"));
        let loaded: HashMap<String, CrashRecord> = loaded.into_iter().collect();
        for (key, record) in &loaded {
            assert_eq!(
                record.payload,
                crash_payload(record.seq),
                "round {round}: torn record {key}"
            );
            assert_eq!(
                format!("k{}", record.seq % CRASH_KEYS),
                *key,
                "round {round}: record under the wrong key"
            );
        }
        for (key, seq) in &acked {
            let found = loaded.get(key).map(|r| r.seq);
            assert!(found >= Some(*seq), "round {round}: {key} acked at {seq}, loaded {found:?}");
        }
        assert!(
            !dir.path().join(JOURNAL_TEMP).exists(),
            "round {round}: temp journal survived open"
        );
    }
    eprintln!(
        "crash test: {rounds} rounds, {rounds_killed_mid_run} killed mid-run, {total_acks} acknowledged writes"
    );
    assert!(
        rounds_killed_mid_run >= rounds / 2,
        "children exited before the kill: {rounds_killed_mid_run}/{rounds}"
    );
    assert!(
        total_acks >= rounds * 3 / 4,
        "children wrote too little to test anything: {total_acks} acks"
    );
}

/// The journal line is serialised op by op (to size each record without a second pass); its
/// bytes are exactly those of the whole entry serialised at once, escapes included.
#[test]
fn an_entry_encoded_op_by_op_is_the_entry_serialised_whole() {
    let ops = [
        Op::Put {
            kind: "test-leases".to_owned(),
            key: "claim-1/\"quoted\"\n".to_owned(),
            version: 2,
            data: raw(
                &json!({"claim": "c", "ip": "10.0.0.1", "nested": {"list": [1, "two", null]}}),
            ),
        },
        Op::Remove { kind: "test-leases".to_owned(), key: "claim-2".to_owned() },
        Op::Put { kind: "k".to_owned(), key: "é".to_owned(), version: 1, data: raw(&json!("x")) },
    ];
    for count in 0..=ops.len() {
        let (json, sizes) = encode_entry(&ops[..count]).unwrap();
        assert_eq!(json, serde_json::to_string(&EntryRef { ops: &ops[..count] }).unwrap());
        assert_eq!(sizes.len(), count);
        for (op, size) in ops.iter().zip(&sizes) {
            assert_eq!(*size, op_size(serde_json::to_string(op).unwrap().len()));
        }
    }
}

fn raw(value: &serde_json::Value) -> Box<serde_json::value::RawValue> {
    serde_json::value::to_raw_value(&value).unwrap()
}

/// Ops read and write exactly as the journal lines of earlier releases spell them (the data
/// kept as its text, key order included), and a malformed op is refused by name.
#[test]
fn an_op_reads_and_writes_as_earlier_releases_spelled_it() {
    for line in [
        r#"{"op":"put","kind":"claims","key":"uid-1","version":5,"data":{"z":1,"a":[1,"two",null],"n":{"b":true}}}"#,
        r#"{"op":"remove","kind":"claims","key":"uid-1"}"#,
        r#"{"op":"put","kind":"k","key":"\"quoted\"\n","version":1,"data":"x"}"#,
    ] {
        let op: Op = serde_json::from_str(line).unwrap();
        assert_eq!(serde_json::to_string(&op).unwrap(), line);
    }
    for (line, why) in [
        (r#"{"op":"put","kind":"k","key":"a","data":{}}"#, "missing field `version`"),
        (r#"{"op":"put","kind":"k","key":"a","version":1}"#, "missing field `data`"),
        (r#"{"op":"remove","kind":"k","key":"a","version":1}"#, "a remove carries no version"),
        (
            r#"{"op":"put","kind":"k","key":"a","version":1,"data":1,"extra":2}"#,
            "unknown field `extra`",
        ),
        (r#"{"op":"rename","kind":"k","key":"a"}"#, "unknown variant `rename`"),
    ] {
        let err = serde_json::from_str::<Op>(line).unwrap_err().to_string();
        assert!(err.contains(why), "{line}: {err}");
    }
}
