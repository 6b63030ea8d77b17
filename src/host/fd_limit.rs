//! The daemon's file-descriptor limit (`RLIMIT_NOFILE`): raising the soft limit to the hard
//! one at start.
//!
//! The daemon holds descriptors per pod beyond its fixed set (sockets, the runtime's
//! connections, journal and watches): the count per pod is measured by the scale bench and
//! written in docs/operations.md ("File descriptors"). The soft limit a container gets is
//! whatever its runtime sets: containerd 1.7's default OCI spec gives every container
//! `RLIMIT_NOFILE` 1024/1024, later runtimes often a soft 1024 under a large hard limit (the
//! soft 1024 exists for programs that still use `select(2)`, whose `fd_set` holds 1024
//! descriptors; this one does not). Raising the soft limit up to the hard one needs no
//! privilege (setrlimit(2)); raising the hard limit would need `CAP_SYS_RESOURCE`, which the
//! daemon does not ask for, so a hard limit that is too low is the operator's to change.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// The descriptor limits before and after [`raise_soft_to_hard`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdLimits {
    /// The soft limit the process started with.
    pub soft_before: u64,
    /// The soft limit now.
    pub soft: u64,
    /// The hard limit (unchanged).
    pub hard: u64,
}

/// Why the limit could not be read or raised.
#[derive(Debug, thiserror::Error)]
pub enum FdLimitError {
    /// `getrlimit(RLIMIT_NOFILE)` failed.
    #[error("getrlimit(RLIMIT_NOFILE)")]
    Get(#[source] nix::Error),
    /// `setrlimit(RLIMIT_NOFILE)` refused the raise.
    #[error("setrlimit(RLIMIT_NOFILE) to soft {soft}, hard {hard}")]
    Set {
        /// The soft limit asked for.
        soft: u64,
        /// The hard limit kept.
        hard: u64,
        /// The kernel's answer.
        #[source]
        source: nix::Error,
    },
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (nothing when they are
/// equal); returns both before and after. The kernel caps a hard limit at `fs.nr_open`, so
/// the hard limit is always a number it accepts as a soft limit too.
pub fn raise_soft_to_hard() -> Result<FdLimits, FdLimitError> {
    let (soft_before, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(FdLimitError::Get)?;
    if soft_before < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(|source| FdLimitError::Set {
            soft: hard,
            hard,
            source,
        })?;
    }
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(FdLimitError::Get)?;
    Ok(FdLimits { soft_before, soft, hard })
}

#[cfg(test)]
mod tests {
    use super::*;

    // nextest runs each test in a process of its own: lowering this process's soft limit
    // touches no other test.
    #[test]
    fn a_soft_limit_below_the_hard_one_is_raised_to_it_and_the_hard_one_kept() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let low = hard.min(256);
        setrlimit(Resource::RLIMIT_NOFILE, low, hard).unwrap();

        let limits = raise_soft_to_hard().unwrap();

        assert_eq!(limits, FdLimits { soft_before: low, soft: hard, hard });
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (hard, hard));
        // Once raised, a second call changes nothing.
        assert_eq!(raise_soft_to_hard().unwrap(), FdLimits { soft_before: hard, soft: hard, hard });
    }
}
