//! What IPAM keeps and persists: leases and their owners, release records under quarantine,
//! owned blocks, the changes committed together, and the store they are written to.

use std::net::IpAddr;
use std::time::Duration;

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

use crate::model::pod_network::IpBlockClaim;

/// How long a released address is not handed out to another claim (DESIGN §4).
pub const QUARANTINE: Duration = Duration::from_secs(30);

/// [`QUARANTINE`] in milliseconds.
pub(super) const QUARANTINE_MS: u64 = 30_000;

/// Who holds a lease: one allocated device of one claim.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseOwner {
    /// The `ResourceClaim`'s UID.
    pub claim_uid: String,
    /// The request name of the allocation result (`nic` or `nic/fast`).
    pub request: String,
    /// The allocated device.
    pub device: String,
    /// The allocation's `shareID` for a shared device (one claim can hold several shares
    /// of one parent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
}

/// One address bound to one owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// The pool (its subnet, network form): the node-local pool's, the static address's
    /// network, or the `PodNetwork` subnet the block lies in.
    pub subnet: IpNetwork,
    /// The leased address.
    pub address: IpAddr,
    /// Who holds it.
    pub owner: LeaseOwner,
    /// The `PodNetwork` of a block address or of a static address reserved cluster-wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_network: Option<String>,
    /// The owned block a `PodNetwork` address comes from (`None` for static addresses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<IpNetwork>,
}

impl ReleasedAddress {
    /// Its record key: address and release time, so pruning an old record never removes a
    /// newer release of the same address committed meanwhile.
    #[must_use]
    pub fn key(&self) -> String {
        format!("{}@{}", self.address, self.released_at_ms)
    }
}

impl Lease {
    /// A lease of a node-local pool or a static address.
    #[must_use]
    pub fn new(subnet: IpNetwork, address: IpAddr, owner: LeaseOwner) -> Lease {
        Lease { subnet, address, owner, pod_network: None, block: None }
    }

    /// The address with the pool's prefix length, as configured on the interface.
    #[must_use]
    pub fn interface_address(&self) -> IpNetwork {
        // The prefix comes from a valid network of the same family, so it always fits.
        IpNetwork::new(self.address, self.subnet.prefix()).unwrap_or(self.subnet)
    }

    /// The network and CIDR of the owned block this address comes from, if any. A lease
    /// finds its block by these, never by a name derived from them: blocks created by an
    /// older release carry names of another scheme.
    #[must_use]
    pub fn block_key(&self) -> Option<(&str, IpNetwork)> {
        match (&self.pod_network, self.block) {
            (Some(network), Some(block)) => Some((network.as_str(), block)),
            _ => None,
        }
    }
}

/// An address given back, quarantined until [`QUARANTINE`] after `released_at_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleasedAddress {
    /// The address.
    pub address: IpAddr,
    /// When it was released (wall clock, ms since the Unix epoch).
    pub released_at_ms: u64,
    /// The claim that held it (which may take it back at once).
    pub claim_uid: String,
}

/// A block of a `PodNetwork` this node owns in the API (an `IPBlock` whose `spec.nodeName`
/// is this node), or a static address's /32 or /128 reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnedBlock {
    /// The `IPBlock` object's name as the API has it
    /// ([`crate::model::pod_network::ip_block_name`] for blocks this release creates; older
    /// ones keep theirs: a block is always addressed by its stored name).
    pub name: String,
    /// The `PodNetwork`.
    pub pod_network: String,
    /// The block.
    pub cidr: IpNetwork,
    /// The object's UID: deletes carry it as a precondition, so a block another node created
    /// under the same name after ours was gone is never deleted by us.
    pub uid: String,
    /// A static address's reservation: the claim that holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<IpBlockClaim>,
}

/// What this node knows of one owned block.
#[derive(Debug, Clone)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent facts about one block, each read on its own"
)]
pub struct BlockState {
    /// The block.
    pub block: OwnedBlock,
    /// Whether its record is durable in the store (a block claimed in the API is recorded
    /// with the first commit that uses it; one claimed before a crash is adopted from the
    /// API's list at the next start).
    pub recorded: bool,
    /// When its last lease went (ms since the epoch); `None` while an address is leased.
    pub empty_since_ms: Option<u64>,
    /// Addresses leased in it (a full block is skipped without a scan).
    pub leased: u128,
    /// Its deletion in the API is under way: no new addresses from it.
    pub releasing: bool,
    /// Recorded here but gone from the API while addresses in it are still leased, or
    /// deleted or changed in the API under this node (its watch): the leases are kept
    /// (their pods run) but count as conflicts, no new address is handed out from it, and
    /// the block is claimed again when possible (decisions 0014, 0017).
    pub lost: bool,
    /// Whether the API confirmed it since this process started (created or adopted now, or
    /// found by the start-up reconcile): a block loaded from the store may have been deleted
    /// or taken by another node while the daemon was down, so it hands out nothing before.
    pub verified: bool,
    /// Whether the intent to release it is durable ([`BlockRelease`]): it never serves
    /// again, and its deletion is retried (after a restart too) until the API has it gone.
    pub release_journaled: bool,
}

/// The durable intent to delete an owned block (or reservation) in the API, committed before
/// the delete: a crash between the delete and the removal of the block's record then leaves
/// a block that is known to be going, never one that serves again from a record of a block
/// the API no longer has (decision 0017).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockRelease {
    /// The `IPBlock` object's name (the record's key).
    pub name: String,
    /// Its UID (the delete's precondition).
    pub uid: String,
}

/// IPAM changes committed together (with a prepared claim's record, or alone): after a
/// crash all or none of them are there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpamCommit {
    /// Leases to write.
    pub put_leases: Vec<Lease>,
    /// Leases to remove.
    pub remove_leases: Vec<Lease>,
    /// Release records to write (with the removal of their leases).
    pub put_released: Vec<ReleasedAddress>,
    /// Release records past their quarantine (or superseded) to remove.
    pub remove_released: Vec<ReleasedAddress>,
    /// Owned blocks to record.
    pub put_blocks: Vec<OwnedBlock>,
    /// Owned blocks (by name) to forget; their release intents go with them.
    pub remove_blocks: Vec<String>,
    /// Release intents to record ([`BlockRelease`]), before the blocks' deletes in the API.
    pub releasing_blocks: Vec<BlockRelease>,
}

impl IpamCommit {
    /// Whether nothing changes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        *self == IpamCommit::default()
    }
}
