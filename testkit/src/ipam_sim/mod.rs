//! A deterministic simulation of the cluster IPAM protocol (issue 30 items 7 and 8, decision
//! 0017): N nodes run the real node-side IPAM (`ClaimService` with its journal store on a
//! simulated disk) against an in-memory API server ([`world`]) whose every call is parked at
//! a gate; a seeded driver picks one step at a time (release a call with an outcome, start a
//! prepare or unprepare, crash a node at an API call or a disk operation, edit the network,
//! sweep as the controller, delete a node, let time pass) and checks the invariants after
//! each (`checks`).
//!
//! Replay: everything runs on one current-thread runtime with paused time; the driver waits
//! for quiescence by sleeping on that clock, which tokio advances only when no task is
//! runnable and no blocking task (the store commits) is in flight. Calls, claims and nodes
//! live in ordered maps, so a seed replays exactly (`IPAM_SIM_SEED=<n>`).

mod checks;
pub mod node;
mod scenario;
pub mod world;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use ipnetwork::IpNetwork;

pub use scenario::{ScaleReport, SimConfig, SimReport, run, run_scale, vm_hwm_kib};
pub use world::ApiCounts;

/// The driver name of the simulated nodes.
pub const DRIVER: &str = super::DRIVER;
/// The other driver, whose network and blocks must never be touched.
pub const OTHER_DRIVER: &str = "other.example.com";

/// Seeded generator (SplitMix64): the only source of choices.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next_u64() % (n.max(1) as u64)).unwrap_or(0)
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u32) -> bool {
        self.next_u64() % 100 < u64::from(percent)
    }
}

/// A claim as kubelet sees it.
#[derive(Debug, Clone)]
pub(crate) struct SimClaim {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) node: String,
    /// Whether kubelet wants it prepared (else unprepared).
    pub(crate) want_prepared: bool,
    /// The addresses of the last prepare kubelet got an answer for (until an unprepare is
    /// answered).
    pub(crate) acked: Option<Vec<IpNetwork>>,
    /// A call for it is in flight.
    pub(crate) in_flight: bool,
    /// Addresses it may never get (gateways, network and broadcast addresses at the time its
    /// prepare started).
    pub(crate) forbidden: BTreeSet<IpAddr>,
}

/// Default quiescence tick and release grace of the small simulations.
pub(crate) const TICK: Duration = Duration::from_millis(1);
