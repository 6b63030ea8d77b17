//! Which `IPBlock`s the controller deletes (pure): blocks nobody can release any more.
//!
//! A node releases its own blocks (empty ones after `--block-release-grace`, all of a deleted
//! network's empty ones at once); the controller handles what no node will:
//!
//! - **a block of a deleted node**: collected once no ResourceClaim has an allocation of this
//!   driver on that node (`status.allocation.devices.results[]` with our driver and
//!   `pool == <node>`: such a claim's pod may still hold an address of the block), and, for a
//!   static reservation, once the reserved claim (by UID) is gone. The node must be seen
//!   missing by two sweeps in a row, so a Node object deleted and re-registered (kubelet
//!   does that) is not mistaken for a deleted node.
//! - **a static reservation whose claim is gone**, on a node that exists: normally the node
//!   deletes it at unprepare; if the claim vanished while the node's daemon was down or lost
//!   its state, nothing else would. It is collected after the claim has been seen missing
//!   for `--block-release-grace` (by this controller's clock; a new leader starts over), long
//!   past the node's own release and its 30 s address quarantine, so the address is never
//!   handed to a second claim while the first pod can still hold it.
//!
//! Ordinary blocks of live nodes are the nodes' business and never touched.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// What the planner needs of one `IPBlock`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockFacts {
    /// Object name.
    pub name: String,
    /// Object UID (the delete's precondition).
    pub uid: String,
    /// resourceVersion read (the delete's precondition).
    pub resource_version: String,
    /// `spec.podNetwork`.
    pub pod_network: String,
    /// `spec.nodeName`.
    pub node: String,
    /// `spec.claim.uid` of a static reservation.
    pub claim_uid: Option<String>,
    /// Already being deleted.
    pub deleting: bool,
}

/// What the planner needs of the cluster, read after the blocks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterFacts {
    /// Names of the Nodes that exist.
    pub nodes: BTreeSet<String>,
    /// UIDs of the ResourceClaims that exist.
    pub claims: BTreeSet<String>,
    /// Pools (node names) with at least one claim allocated there by this driver.
    pub allocated_pools: BTreeSet<String>,
}

/// Why a block is collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// Its node is gone and no claim uses it.
    NodeGone,
    /// Its static reservation's claim is gone for longer than the grace.
    ClaimGone,
}

impl Reason {
    /// Metric label.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NodeGone => "node-gone",
            Reason::ClaimGone => "claim-gone",
        }
    }
}

/// The planner's memory between sweeps: the nodes missing at the last sweep, and since when
/// each reserved claim has been missing.
#[derive(Debug, Default)]
pub struct Collector {
    nodes_missing: BTreeSet<String>,
    claim_missing_since: BTreeMap<String, Instant>,
}

impl Collector {
    /// Decides which of `blocks` to delete at `now`, given `cluster` read after them.
    pub fn plan<'a>(
        &mut self,
        blocks: &'a [BlockFacts],
        cluster: &ClusterFacts,
        now: Instant,
        grace: Duration,
    ) -> Vec<(&'a BlockFacts, Reason)> {
        let missing_nodes: BTreeSet<&str> = blocks
            .iter()
            .map(|b| b.node.as_str())
            .filter(|node| !cluster.nodes.contains(*node))
            .collect();
        // A node seen missing for the first time this sweep waits for the next one.
        let previously_missing = std::mem::replace(
            &mut self.nodes_missing,
            missing_nodes.iter().map(|node| (*node).to_owned()).collect(),
        );
        let missing_claims: BTreeSet<&str> = blocks
            .iter()
            .filter_map(|b| b.claim_uid.as_deref())
            .filter(|uid| !cluster.claims.contains(*uid))
            .collect();
        self.claim_missing_since.retain(|uid, _| missing_claims.contains(uid.as_str()));
        for uid in &missing_claims {
            self.claim_missing_since.entry((*uid).to_owned()).or_insert(now);
        }

        let mut out = Vec::new();
        for block in blocks.iter().filter(|b| !b.deleting) {
            let claim_gone = block.claim_uid.as_ref().map(|uid| !cluster.claims.contains(uid));
            if !cluster.nodes.contains(&block.node) {
                let in_use =
                    cluster.allocated_pools.contains(&block.node) || claim_gone == Some(false);
                if !in_use && previously_missing.contains(&block.node) {
                    out.push((block, Reason::NodeGone));
                }
            } else if claim_gone == Some(true) {
                let since = block
                    .claim_uid
                    .as_ref()
                    .and_then(|uid| self.claim_missing_since.get(uid))
                    .copied()
                    .unwrap_or(now);
                if now.saturating_duration_since(since) >= grace {
                    out.push((block, Reason::ClaimGone));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(name: &str, node: &str, claim: Option<&str>) -> BlockFacts {
        BlockFacts {
            name: name.to_owned(),
            uid: format!("uid-{name}"),
            resource_version: "1".to_owned(),
            pod_network: "net".to_owned(),
            node: node.to_owned(),
            claim_uid: claim.map(str::to_owned),
            deleting: false,
        }
    }

    fn cluster(nodes: &[&str], claims: &[&str], pools: &[&str]) -> ClusterFacts {
        let set = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect();
        ClusterFacts { nodes: set(nodes), claims: set(claims), allocated_pools: set(pools) }
    }

    fn names(planned: &[(&BlockFacts, Reason)]) -> Vec<(String, Reason)> {
        planned.iter().map(|(b, r)| (b.name.clone(), *r)).collect()
    }

    const GRACE: Duration = Duration::from_mins(10);

    #[test]
    fn a_deleted_nodes_blocks_go_once_no_claim_is_allocated_there() {
        let blocks = [block("a", "gone", None), block("b", "live", None)];
        let mut gc = Collector::default();
        let t0 = Instant::now();
        // A claim is still allocated on the gone node: kept, however long.
        let busy = cluster(&["live"], &["c1"], &["gone"]);
        assert!(gc.plan(&blocks, &busy, t0, GRACE).is_empty());
        assert!(gc.plan(&blocks, &busy, t0 + Duration::from_secs(30), GRACE).is_empty());
        // The claim went: collected (the node has been missing since the first sweep).
        let idle = cluster(&["live"], &[], &[]);
        let planned = gc.plan(&blocks, &idle, t0 + Duration::from_mins(1), GRACE);
        assert_eq!(names(&planned), [("a".to_owned(), Reason::NodeGone)]);
    }

    #[test]
    fn a_node_must_be_missing_in_two_sweeps() {
        let blocks = [block("a", "flaky", None)];
        let mut gc = Collector::default();
        let t0 = Instant::now();
        let without = cluster(&[], &[], &[]);
        assert!(gc.plan(&blocks, &without, t0, GRACE).is_empty());
        // Back (re-registered): forgotten.
        assert!(
            gc.plan(&blocks, &cluster(&["flaky"], &[], &[]), t0 + Duration::from_secs(1), GRACE)
                .is_empty()
        );
        // Missing again: a fresh first sighting, then collected on the next sweep.
        assert!(gc.plan(&blocks, &without, t0 + Duration::from_secs(2), GRACE).is_empty());
        let planned = gc.plan(&blocks, &without, t0 + Duration::from_secs(3), GRACE);
        assert_eq!(names(&planned), [("a".to_owned(), Reason::NodeGone)]);
    }

    #[test]
    fn a_static_reservation_on_a_gone_node_waits_for_its_claim() {
        let blocks = [block("s", "gone", Some("claim-uid"))];
        let mut gc = Collector::default();
        let t0 = Instant::now();
        let with_claim = cluster(&[], &["claim-uid"], &[]);
        assert!(gc.plan(&blocks, &with_claim, t0, GRACE).is_empty());
        assert!(gc.plan(&blocks, &with_claim, t0 + Duration::from_secs(1), GRACE).is_empty());
        // The claim is gone: collected at once (the node is gone, no grace needed).
        let planned = gc.plan(&blocks, &cluster(&[], &[], &[]), t0 + Duration::from_secs(2), GRACE);
        assert_eq!(names(&planned), [("s".to_owned(), Reason::NodeGone)]);
    }

    #[test]
    fn a_static_reservation_on_a_live_node_goes_after_the_grace() {
        let blocks = [block("s", "live", Some("claim-uid")), block("n", "live", None)];
        let mut gc = Collector::default();
        let t0 = Instant::now();
        let live = cluster(&["live"], &["claim-uid"], &["live"]);
        assert!(gc.plan(&blocks, &live, t0, GRACE).is_empty());
        let claim_gone = cluster(&["live"], &[], &["live"]);
        let t1 = t0 + Duration::from_secs(5);
        assert!(gc.plan(&blocks, &claim_gone, t1, GRACE).is_empty());
        assert!(
            gc.plan(&blocks, &claim_gone, t1 + GRACE.saturating_sub(Duration::from_secs(1)), GRACE)
                .is_empty()
        );
        let planned = gc.plan(&blocks, &claim_gone, t1 + GRACE, GRACE);
        assert_eq!(names(&planned), [("s".to_owned(), Reason::ClaimGone)]);
    }

    #[test]
    fn blocks_being_deleted_are_left_alone() {
        let mut deleting = block("a", "gone", None);
        deleting.deleting = true;
        let blocks = [deleting];
        let mut gc = Collector::default();
        let t0 = Instant::now();
        let empty = cluster(&[], &[], &[]);
        assert!(gc.plan(&blocks, &empty, t0, GRACE).is_empty());
        assert!(gc.plan(&blocks, &empty, t0 + Duration::from_secs(1), GRACE).is_empty());
    }
}
