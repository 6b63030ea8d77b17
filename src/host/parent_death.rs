//! Ending with the process that started us: the node daemons of `netclaim dev --nodes N`
//! are child processes, and a parent killed with SIGKILL cannot stop them, so each child asks
//! the kernel for a signal when its parent dies (`prctl(PR_SET_PDEATHSIG)`).
//!
//! The parent names itself in [`PARENT_ENV`] (an internal variable between `netclaim dev` and
//! the daemons it starts, like `NETCLAIM_CRASH_AT`; not a flag). The child sets the signal at
//! start and then checks `getppid()` against that pid: a parent that died before the `prctl`
//! left the child re-parented (to init or a subreaper), and no signal will ever come.
//!
//! PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process
//! (prctl(2)), so the parent must fork from a thread that lives as long as it does: `netclaim
//! dev` forks each daemon on a thread of its own that stays to reap it.

use nix::sys::signal::Signal;
use nix::unistd::{Pid, getppid};

/// The variable naming the pid the daemon must not outlive.
pub const PARENT_ENV: &str = "NETCLAIM_EXIT_WITH_PARENT";

/// The signal the daemon gets when its parent dies: its usual stop (stop taking kubelet
/// calls, finish in-flight work, remove its sockets).
pub const PARENT_DEATH_SIGNAL: Signal = Signal::SIGTERM;

/// Why the daemon cannot tie its life to its parent's.
#[derive(Debug, thiserror::Error)]
pub enum ParentDeathError {
    /// [`PARENT_ENV`] is not a pid.
    #[error("{PARENT_ENV}={0:?} is not a process id")]
    Invalid(String),
    /// The kernel refused `prctl(PR_SET_PDEATHSIG)`.
    #[error("prctl(PR_SET_PDEATHSIG)")]
    Prctl(#[source] nix::Error),
    /// The parent died before the signal was set: nobody will stop this process.
    #[error("the process that started this one (pid {expected}) is gone (parent now pid {now})")]
    ParentGone {
        /// The pid [`PARENT_ENV`] named.
        expected: i32,
        /// The parent now.
        now: i32,
    },
}

/// When [`PARENT_ENV`] is set: gets [`PARENT_DEATH_SIGNAL`] when that parent dies, or fails
/// when it has died already. Nothing when the variable is not set (a daemon run by a
/// DaemonSet or by hand).
pub fn exit_with_parent_from_env() -> Result<(), ParentDeathError> {
    match std::env::var_os(PARENT_ENV) {
        None => Ok(()),
        Some(value) => {
            let text = value.to_string_lossy();
            let pid = text
                .parse::<i32>()
                .ok()
                .filter(|pid| *pid > 1)
                .ok_or_else(|| ParentDeathError::Invalid(text.clone().into_owned()))?;
            exit_with_parent(Pid::from_raw(pid))
        }
    }
}

/// Gets [`PARENT_DEATH_SIGNAL`] when the parent dies; fails when the parent is not
/// `expected` (any more).
pub fn exit_with_parent(expected: Pid) -> Result<(), ParentDeathError> {
    nix::sys::prctl::set_pdeathsig(PARENT_DEATH_SIGNAL).map_err(ParentDeathError::Prctl)?;
    // After the prctl: a parent that dies from now on sends the signal; one that died before
    // has left us another parent.
    let now = getppid();
    if now == expected {
        Ok(())
    } else {
        Err(ParentDeathError::ParentGone { expected: expected.as_raw(), now: now.as_raw() })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use super::*;

    /// The signal stays set for this (test) thread's process; the test harness's parent
    /// outlives it, and SIGTERM to a finished test binary is harmless. The check against the
    /// expected parent is what a child racing its parent's death relies on.
    #[test]
    fn the_signal_is_set_and_a_wrong_parent_is_refused() {
        exit_with_parent(getppid()).unwrap();
        assert_eq!(nix::sys::prctl::get_pdeathsig().unwrap(), Some(PARENT_DEATH_SIGNAL));
        let wrong = Pid::from_raw(getppid().as_raw().wrapping_add(1).max(2));
        let err = exit_with_parent(wrong).unwrap_err();
        assert!(matches!(err, ParentDeathError::ParentGone { .. }), "{err}");
        nix::sys::prctl::set_pdeathsig(None).unwrap();
    }
}
