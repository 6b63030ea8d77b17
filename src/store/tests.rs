//! Store tests: round trips, migration fixtures, locking, and the kill -9 crash test.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

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
    Lease {
        claim: claim.into(),
        request: "nic".into(),
        ip: ip.into(),
    }
}

#[test]
fn put_get_remove_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.get::<Lease>("a").unwrap(), None);
    store.put("a", &lease("uid-1", "10.0.0.1")).unwrap();
    store.put("a", &lease("uid-2", "10.0.0.2")).unwrap();
    assert_eq!(
        store.get::<Lease>("a").unwrap(),
        Some(lease("uid-2", "10.0.0.2"))
    );
    assert!(store.remove::<Lease>("a").unwrap());
    assert!(!store.remove::<Lease>("a").unwrap());
    assert_eq!(store.get::<Lease>("a").unwrap(), None);
}

#[test]
fn records_survive_reopen_sorted_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let keys = [
        "10.10.1.0/24/10.10.1.5",
        "fd00:10::/64/fd00:10::5",
        "uid/req:x",
        "ünï cödé",
        ".hidden",
    ];
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
    assert_eq!(
        loaded.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        expected
    );
    for (key, record) in loaded {
        assert_eq!(record.claim, key);
    }
    // File names stay inside the kind directory and never start with a dot.
    for entry in fs::read_dir(dir.path().join(Lease::KIND)).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(!name.starts_with('.') && !name.contains('/'), "{name}");
    }
}

#[test]
fn key_encoding_round_trips_and_rejects_bad_keys() {
    for key in ["a", "a.b", ".a", "%", "a/b:c d", "ü", "-_."] {
        let encoded = encode_key(key).unwrap();
        assert!(!encoded.starts_with('.'), "{encoded}");
        assert_eq!(decode_key(&encoded).as_deref(), Some(key));
    }
    assert!(matches!(encode_key(""), Err(StoreError::InvalidKey { .. })));
    assert!(matches!(
        encode_key(&"/".repeat(100)),
        Err(StoreError::InvalidKey { .. })
    ));
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

#[test]
fn v0_fixture_migrates_to_the_current_version_and_is_written_back() {
    let dir = tempfile::tempdir().unwrap();
    let kind_dir = dir.path().join(Lease::KIND);
    fs::create_dir_all(&kind_dir).unwrap();
    // Written by "version 0" of this record kind.
    fs::write(
        kind_dir.join("old.json"),
        r#"{"version":0,"key":"old","data":{"owner":"uid-0","ip":"10.0.0.9"}}"#,
    )
    .unwrap();
    fs::write(
        kind_dir.join("mid.json"),
        r#"{"version":1,"key":"mid","data":{"claim":"uid-1","ip":"10.0.0.8"}}"#,
    )
    .unwrap();
    let store = Store::open(dir.path()).unwrap();
    let loaded = store.load_all::<Lease>().unwrap();
    assert_eq!(
        loaded,
        vec![
            (
                "mid".into(),
                Lease {
                    claim: "uid-1".into(),
                    request: "default".into(),
                    ip: "10.0.0.8".into()
                }
            ),
            (
                "old".into(),
                Lease {
                    claim: "uid-0".into(),
                    request: "default".into(),
                    ip: "10.0.0.9".into()
                }
            ),
        ]
    );
    let on_disk: Value =
        serde_json::from_slice(&fs::read(kind_dir.join("old.json")).unwrap()).unwrap();
    assert_eq!(on_disk["version"], json!(Lease::VERSION));
    assert_eq!(on_disk["data"]["claim"], json!("uid-0"));
}

#[test]
fn newer_version_and_broken_migration_and_corruption_are_errors_naming_the_file() {
    let cases = [
        (r#"{"version":3,"key":"k","data":{}}"#, "newer than"),
        (
            r#"{"version":0,"key":"k","data":{"ip":"x"}}"#,
            "v0 record without owner",
        ),
        (
            r#"{"version":2,"key":"k","data":{"claim":"c","request":"r","ip":"x"}"#,
            "corrupt record",
        ),
        (
            r#"{"version":2,"key":"other","data":{"claim":"c","request":"r","ip":"x"}}"#,
            "does not match",
        ),
    ];
    for (content, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        let kind_dir = dir.path().join(Lease::KIND);
        fs::create_dir_all(&kind_dir).unwrap();
        fs::write(kind_dir.join("k.json"), content).unwrap();
        let store = Store::open(dir.path()).unwrap();
        let err = store.load_all::<Lease>().expect_err(expected).to_string();
        assert!(err.contains(expected) && err.contains("k.json"), "{err}");
    }
}

#[test]
fn stale_temp_files_are_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        store.put("a", &lease("uid", "10.0.0.1")).unwrap();
    }
    let stale = dir.path().join(Lease::KIND).join(".tmp.1234.0");
    fs::write(&stale, b"{\"version\":2,").unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert!(!stale.exists());
    assert_eq!(store.load_all::<Lease>().unwrap().len(), 1);
}

// ---- crash test: a child process writes in a loop, the parent kill -9s it ----

/// Runs `test` of this test binary as a child with `envs`, waits until it printed its first
/// `ack` line, lets it run `extra_micros` longer, then kills it with SIGKILL. Returns the
/// lines it printed and whether the kill interrupted it (rather than finding it exited).
pub(super) fn run_child_and_kill(
    test: &str,
    envs: &[(&str, String)],
    extra_micros: u64,
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
    while !lines.iter().any(|l: &String| l.starts_with("ack ")) {
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
    (
        lines,
        std::os::unix::process::ExitStatusExt::signal(&status) == Some(9),
    )
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
        store
            .put(
                &key,
                &CrashRecord {
                    seq,
                    payload: crash_payload(seq),
                },
            )
            .expect("child put");
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
            rng.u64(0..30_000),
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
        let loaded = store
            .load_all::<CrashRecord>()
            .unwrap_or_else(|e| panic!("round {round}: load: {e}"));
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
            assert!(
                found >= Some(*seq),
                "round {round}: {key} acked at {seq}, loaded {found:?}"
            );
        }
        let leftovers = fs::read_dir(dir.path().join(CrashRecord::KIND)).map_or(0, |d| {
            d.filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .count()
        });
        assert_eq!(leftovers, 0, "round {round}: temp files survived open");
    }
    eprintln!(
        "crash test: {rounds} rounds, {rounds_killed_mid_run} killed mid-run, {total_acks} acknowledged writes"
    );
    assert!(
        rounds_killed_mid_run >= rounds / 2,
        "children exited before the kill: {rounds_killed_mid_run}/{rounds}"
    );
    assert!(
        total_acks >= rounds,
        "children wrote too little to test anything: {total_acks} acks"
    );
}
