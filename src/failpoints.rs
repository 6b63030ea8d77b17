//! Named crash points for the kill -9 tests: the places between two durable steps where a
//! crash must leave nothing lost, nothing leaked and nothing handed out twice.
//!
//! A point is written `failpoint!("attach.after_record")` and costs nothing unless the crate
//! is built with the `failpoints` feature (the `fail` crate's registry then evaluates it).
//! The daemon arms points from `NETCLAIM_CRASH_AT` at start ([`arm_from_env`]): a
//! comma-separated list of `<point>` or `<point>@<hit>` (crash at the hit-th pass, 1 = the
//! first). A crash is `SIGKILL` to the daemon itself: no destructor runs and no buffer is
//! flushed, exactly what `kill -9` or the OOM killer does.
//!
//! [`POINTS`] lists every point, so a test can crash at each of them in turn.

/// Every crash point of the daemon, in the order a claim passes them.
pub const POINTS: &[&str] = &[
    // After each VF a sriov-vf prepare changed (its snapshot durable, the claim not recorded).
    "claims.prepare.after_vf_apply",
    // Metadata files written, the claim and its leases not committed yet.
    "claims.prepare.before_commit",
    // The pod record (plans, netns) durable, the kernel not touched yet.
    "attach.after_record",
    // After each completed netlink step of an attach (`@<n>`: after the n-th step).
    "podnet.attach.after_step",
    // Every interface attached, the results not persisted yet.
    "attach.before_results",
    // StopPodSandbox answered: the children's addresses removed, their links not yet.
    "attach.stop.after_quiesce",
    // After each completed step of a detach.
    "podnet.detach.after_step",
    // The claim and its leases removed on disk, still held in memory.
    "claims.unprepare.after_commit",
    // A compaction renamed its file over the journal, the directory not synced yet.
    "store.compact.after_rename",
];

/// Why `NETCLAIM_CRASH_AT` was refused.
#[derive(Debug, thiserror::Error)]
pub enum CrashPointError {
    /// A name that is not in [`POINTS`].
    #[error("NETCLAIM_CRASH_AT: unknown crash point {0:?}")]
    UnknownPoint(String),
    /// A hit count that is not a positive number.
    #[error("NETCLAIM_CRASH_AT: {0:?}: the hit after `@` must be a number from 1")]
    BadHit(String),
    /// The feature is off in this build.
    #[error("NETCLAIM_CRASH_AT is set but this build has no crash points (feature `failpoints`)")]
    NotBuilt,
}

/// Marks a crash point (see the module docs); nothing without the `failpoints` feature.
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        ::fail::fail_point!($name);
    };
}

/// Arms the points named in `NETCLAIM_CRASH_AT`, if set.
pub fn arm_from_env() -> Result<(), CrashPointError> {
    let Ok(spec) = std::env::var("NETCLAIM_CRASH_AT") else { return Ok(()) };
    let points = parse(&spec)?;
    arm(points)
}

fn parse(spec: &str) -> Result<Vec<(&'static str, u32)>, CrashPointError> {
    spec.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            let (name, hit) = match item.split_once('@') {
                Some((name, hit)) => (
                    name,
                    hit.parse::<u32>()
                        .ok()
                        .filter(|h| *h > 0)
                        .ok_or_else(|| CrashPointError::BadHit(item.to_owned()))?,
                ),
                None => (item, 1),
            };
            let name = POINTS
                .iter()
                .find(|p| **p == name)
                .ok_or_else(|| CrashPointError::UnknownPoint(name.to_owned()))?;
            Ok((*name, hit))
        })
        .collect()
}

#[cfg(feature = "failpoints")]
fn arm(points: Vec<(&'static str, u32)>) -> Result<(), CrashPointError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    for (name, hit) in points {
        let passes = AtomicU32::new(0);
        fail::cfg_callback(name, move || {
            if passes.fetch_add(1, Ordering::SeqCst) + 1 == hit {
                tracing::warn!(point = name, hit, "crash point reached: SIGKILL");
                // SIGKILL cannot be caught: the process ends here, as with kill -9.
                let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::SIGKILL);
            }
        })
        .map_err(CrashPointError::UnknownPoint)?;
    }
    Ok(())
}

#[cfg(not(feature = "failpoints"))]
fn arm(points: Vec<(&'static str, u32)>) -> Result<(), CrashPointError> {
    if points.is_empty() { Ok(()) } else { Err(CrashPointError::NotBuilt) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_and_hits_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse("attach.after_record, podnet.attach.after_step@3").unwrap(),
            [("attach.after_record", 1), ("podnet.attach.after_step", 3)]
        );
        assert!(parse("").unwrap().is_empty());
        let err = parse("attach.after_recrod").unwrap_err();
        assert_eq!(
            err.to_string(),
            "NETCLAIM_CRASH_AT: unknown crash point \"attach.after_recrod\""
        );
        assert!(matches!(parse("attach.after_record@0"), Err(CrashPointError::BadHit(_))));
        assert!(matches!(parse("attach.after_record@x"), Err(CrashPointError::BadHit(_))));
    }
}
