//! One simulated node: the real claim service (`netclaim::claims::ClaimService`) with its real
//! journal store on a simulated disk, its API calls gated through the [`World`], and its own,
//! possibly stale, view of the `PodNetwork`s. A crash drops the service and every task it
//! runs, then loads it again from what the disk kept.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use netclaim::claims::networks::{IpBlockApi, NetworkPorts, NetworkReadError, PodNetworkSource};
use netclaim::claims::{ClaimService, ServiceIdentity};
use netclaim::ipam::Clock;
use netclaim::model::pod_network::PodNetwork;
use netclaim::store::Store;
use netclaim::testing::devices::FixedDevices;
use netclaim::testing::facts::{FactsBuilder as _, physical_nic};
use netclaim::testing::sim_store::SimStoreDisk;
use tokio::task::JoinHandle;

use super::world::{NodeApi, World};

/// The claim service of a simulated node.
pub type Service = ClaimService<NodeApi, FixedDevices, Arc<Store>>;

/// IPAM time: tokio's paused clock from a fixed wall-clock start, so a seed replays exactly.
#[derive(Debug)]
pub struct SimClock {
    start: tokio::time::Instant,
    base_ms: u64,
}

impl SimClock {
    /// A clock at `base_ms` now.
    #[must_use]
    pub fn new(base_ms: u64) -> Self {
        SimClock { start: tokio::time::Instant::now(), base_ms }
    }
}

impl Clock for SimClock {
    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.base_ms.saturating_add(elapsed)
    }
}

/// The networks as this node's watch last delivered them.
#[derive(Debug, Default)]
pub struct NodeView(Mutex<BTreeMap<String, PodNetwork>>);

impl NodeView {
    /// Delivers the world's networks (a watch catching up).
    pub fn sync(&self, networks: &BTreeMap<String, PodNetwork>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = networks.clone();
    }

    /// The network `name` as this node sees it now.
    #[must_use]
    pub fn snapshot(&self, name: &str) -> Option<PodNetwork> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).get(name).cloned()
    }
}

impl PodNetworkSource for NodeView {
    fn get(&self, name: &str) -> BoxFuture<'_, Result<Option<PodNetwork>, NetworkReadError>> {
        let found = self.0.lock().unwrap_or_else(PoisonError::into_inner).get(name).cloned();
        Box::pin(async move { Ok(found) })
    }

    fn changed(&self) -> BoxFuture<'_, ()> {
        // The simulation runs the block upkeep as steps of its own.
        Box::pin(std::future::pending())
    }
}

/// A simulated node.
pub struct SimNode {
    /// Node name (its pool).
    pub name: String,
    /// Its disk (survives crashes).
    pub disk: SimStoreDisk,
    /// Its life: bumped by every crash.
    pub epoch: u64,
    /// The running service (`None`: the store did not open or load; a finding).
    pub service: Option<Arc<Service>>,
    /// Its store (to read the durable leases).
    pub store: Option<Arc<Store>>,
    /// Its view of the networks.
    pub view: Arc<NodeView>,
    /// Tasks of this life (aborted at a crash).
    pub tasks: Vec<JoinHandle<()>>,
    /// Deleted from the cluster: never runs again.
    pub deleted: bool,
    /// Whether the start-up reconcile is still to succeed.
    pub reconcile_pending: bool,
}

impl std::fmt::Debug for SimNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The service, store and tasks print nothing useful; a node is told apart by its name,
        // its life and whether it is gone.
        f.debug_struct("SimNode")
            .field("name", &self.name)
            .field("epoch", &self.epoch)
            .field("deleted", &self.deleted)
            .field("reconcile_pending", &self.reconcile_pending)
            .finish_non_exhaustive()
    }
}

impl SimNode {
    /// A node with an empty disk, not started.
    #[must_use]
    pub fn new(name: String, seed: u64) -> Self {
        SimNode {
            name,
            disk: SimStoreDisk::new(seed),
            epoch: 0,
            service: None,
            store: None,
            view: Arc::new(NodeView::default()),
            tasks: Vec::new(),
            deleted: false,
            reconcile_pending: false,
        }
    }

    /// Starts (or restarts) the daemon: opens the store, loads the claim service on it.
    pub fn boot(
        &mut self,
        world: &World,
        clock: &Arc<SimClock>,
        grace: Duration,
    ) -> Result<(), String> {
        self.epoch += 1;
        self.view.sync(&world.lock().networks);
        let store = Arc::new(self.disk.open().map_err(|e| format!("opening the store: {e}"))?);
        let api = NodeApi { world: world.clone(), node: self.name.clone(), epoch: self.epoch };
        let devices = FixedDevices::any(physical_nic("eth2").shared(), BTreeMap::new());
        let service = ClaimService::load_with_clock(
            ServiceIdentity { driver: super::DRIVER.to_owned(), node: self.name.clone() },
            api.clone(),
            devices,
            Arc::clone(&store),
            Arc::clone(clock) as Arc<dyn Clock>,
        )
        .map_err(|e| format!("loading the claim service: {e}"))?
        .with_pod_networks(NetworkPorts {
            networks: Arc::clone(&self.view) as Arc<dyn PodNetworkSource>,
            blocks: Arc::new(api) as Arc<dyn IpBlockApi>,
            release_grace: grace,
        });
        self.service = Some(Arc::new(service));
        self.store = Some(store);
        self.reconcile_pending = true;
        Ok(())
    }

    /// kill -9 (or power loss when `power`): every task of this life is gone, its calls
    /// parked at gates are dropped unanswered, the service and store are dropped.
    pub fn crash(&mut self, world: &World, power: bool) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
        world.drop_calls_of(&self.name);
        self.service = None;
        self.store = None;
        if power || self.disk.powered_off() {
            self.disk.power_loss();
        } else {
            // kill -9: the page cache survives, and so does the machine.
            self.disk.cancel_power_cut();
        }
    }

    /// Forgets finished tasks.
    pub fn reap(&mut self) {
        self.tasks.retain(|t| !t.is_finished());
    }
}
