//! Group commit: which synced commit runs the journal's `fdatasync`, and when.
//!
//! A synced commit appends its line, then waits until one `fdatasync` covers it. One caller
//! at a time leads: it syncs every line appended so far, and the others (followers) wait
//! for it and find their line durable, or lead the next sync. Before it syncs, a leader
//! collects: while commits announced ahead ([`CommitNotice`]: a prepare call announces its
//! commit when it starts, before its API reads) have not appended yet, it waits until
//! [`GROUP_SIZE`] commits wait (or every announced one, when fewer are announced), at most
//! [`COLLECT_WINDOW`]. So a burst of concurrent prepares, whose commits are spread over the
//! time their reads take, costs about one sync per [`GROUP_SIZE`] prepares instead of one
//! each, its last commits sync as soon as they are all in, and a lone commit, with nothing
//! else announced, syncs at once. This is PostgreSQL's `commit_delay` with
//! `commit_siblings`, except that the wait ends when the group is full rather than after a
//! fixed delay.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How many waiting commits a leader collects before it syncs (fewer when fewer are
/// announced): a burst of `n` prepares costs about `n / GROUP_SIZE` syncs, and a commit of
/// it waits for about `GROUP_SIZE / n` of the burst's spread.
pub(crate) const GROUP_SIZE: usize = 16;

/// The longest a leader waits for announced commits before it syncs, so that one slow
/// prepare (a slow API read, a VF setting, a block claim) delays the commits of others by
/// this much at most.
pub(crate) const COLLECT_WINDOW: Duration = Duration::from_millis(20);

/// The leader, the followers and the announced commits of one store.
#[derive(Debug, Default)]
pub(super) struct Group {
    state: Mutex<GroupState>,
    /// Woken for the leader when a commit appends or an announcement is withdrawn.
    collect: Condvar,
    /// Woken for the followers when a leader is done.
    led: Condvar,
}

#[derive(Debug, Default)]
struct GroupState {
    /// Announced commits not withdrawn yet ([`CommitNotice`]).
    announced: usize,
    /// Synced commits that appended and wait for a sync, the leader included.
    waiting: usize,
    /// A leader is collecting or syncing.
    leading: bool,
}

/// A synced commit announced ahead by a caller that will make it soon; dropping it (after
/// the commit, or when the caller has nothing to commit after all) withdraws it.
#[derive(Debug)]
#[must_use = "the announcement lasts as long as the notice"]
pub struct CommitNotice {
    group: Arc<Group>,
}

impl Drop for CommitNotice {
    fn drop(&mut self) {
        let mut state = self.group.lock();
        state.announced = state.announced.saturating_sub(1);
        drop(state);
        self.group.collect.notify_one();
    }
}

/// The lead of one sync; dropping it lets the followers go on.
#[derive(Debug)]
pub(super) struct Leader<'g> {
    group: &'g Group,
}

impl Group {
    fn lock(&self) -> MutexGuard<'_, GroupState> {
        // The state is a few counters, consistent after any panic between updates.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Announces a commit to come.
    pub(super) fn announce(group: &Arc<Group>) -> CommitNotice {
        group.lock().announced += 1;
        CommitNotice { group: Arc::clone(group) }
    }

    /// Called by a synced commit once its line is appended: returns `None` once
    /// `durable()` holds (another caller's sync covered the line), or the lead, with which
    /// the caller syncs.
    pub(super) fn wait_or_lead(&self, durable: impl Fn() -> bool) -> Option<Leader<'_>> {
        let mut state = self.lock();
        state.waiting += 1;
        self.collect.notify_one();
        loop {
            if durable() {
                state.waiting -= 1;
                return None;
            }
            if !state.leading {
                state.leading = true;
                return Some(Leader { group: self });
            }
            state = self.led.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Leader<'_> {
    /// Waits until `size` commits wait, or every announced one when fewer are announced,
    /// at most `window`.
    pub(super) fn collect(&self, size: usize, window: Duration) {
        let deadline = Instant::now() + window;
        let mut state = self.group.lock();
        while state.waiting < state.announced.min(size) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { break };
            if left.is_zero() {
                break;
            }
            state = self
                .group
                .collect
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        let mut state = self.group.lock();
        state.leading = false;
        state.waiting -= 1;
        drop(state);
        self.group.led.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// A window no test waits for: a collection that depended on it would hang the test.
    const FOREVER: Duration = Duration::from_hours(1);

    fn lead(group: &Group) -> Leader<'_> {
        group.wait_or_lead(|| false).expect("nobody else leads")
    }

    #[test]
    fn a_lone_commit_with_nothing_announced_syncs_at_once() {
        let group = Arc::new(Group::default());
        let leader = lead(&group);
        leader.collect(GROUP_SIZE, FOREVER);
    }

    #[test]
    fn the_leader_waits_for_an_announced_commit_and_goes_once_it_appended() {
        let group = Arc::new(Group::default());
        let synced = AtomicBool::new(false);
        let notices = [Group::announce(&group), Group::announce(&group)];
        let leader = lead(&group);
        std::thread::scope(|scope| {
            // The other commit appends, then waits for the leader's sync to cover it.
            let other = scope.spawn(|| group.wait_or_lead(|| synced.load(Ordering::Acquire)));
            leader.collect(GROUP_SIZE, FOREVER);
            assert_eq!(group.lock().waiting, 2, "the leader went before the other appended");
            synced.store(true, Ordering::Release);
            drop(leader);
            let led = other.join().expect("the other commit does not panic");
            assert!(led.is_none(), "the other commit synced again");
        });
        drop(notices);
    }

    #[test]
    fn a_withdrawn_announcement_ends_the_collection() {
        let group = Arc::new(Group::default());
        let own = Group::announce(&group);
        let never = Group::announce(&group);
        let leader = lead(&group);
        std::thread::scope(|scope| {
            scope.spawn(move || drop(never));
            leader.collect(GROUP_SIZE, FOREVER);
        });
        assert_eq!(group.lock().announced, 1);
        drop(own);
    }

    #[test]
    fn an_announced_commit_that_never_comes_holds_the_leader_for_the_window_only() {
        let group = Arc::new(Group::default());
        let _own = Group::announce(&group);
        let _slow = Group::announce(&group);
        let leader = lead(&group);
        // Returns (after the window) although only one of the two announced commits waits.
        leader.collect(GROUP_SIZE, Duration::from_millis(10));
        assert_eq!(group.lock().waiting, 1);
    }

    #[test]
    fn a_full_group_ends_the_collection_before_every_announced_commit_came() {
        let group = Arc::new(Group::default());
        let synced = AtomicBool::new(false);
        let notices: Vec<CommitNotice> = (0..5).map(|_| Group::announce(&group)).collect();
        let leader = lead(&group);
        std::thread::scope(|scope| {
            let followers: Vec<_> = (0..2)
                .map(|_| scope.spawn(|| group.wait_or_lead(|| synced.load(Ordering::Acquire))))
                .collect();
            // Three of the five announced commits wait: a group of three is full.
            leader.collect(3, FOREVER);
            assert_eq!(group.lock().waiting, 3);
            synced.store(true, Ordering::Release);
            drop(leader);
            for follower in followers {
                let led = follower.join().expect("a follower does not panic");
                assert!(led.is_none(), "a follower synced again");
            }
        });
        drop(notices);
    }
}
