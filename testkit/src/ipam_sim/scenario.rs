//! The driver: the cluster's setup, the steps a seed picks, the teardown that must leave
//! nothing behind, and the scale run.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ipnetwork::IpNetwork;
use k8s_openapi::api::resource::v1::ResourceClaim;
use netclaim::controller::gc::{BlockFacts, ClusterFacts, Collector};
use netclaim::model::ClaimRef;
use netclaim::model::pod_network::{IpBlock, IpBlockSpec, PodNetwork};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::checks;
use super::node::{SimClock, SimNode};
use super::world::{ApiCounts, Call, Outcome, World};
use super::{DRIVER, OTHER_DRIVER, Rng, SimClaim, TICK};

/// The network every claim uses.
const NETWORK: &str = "medianet";
/// The other driver's network.
const OTHER_NETWORK: &str = "othernet";
/// Trace lines kept for a failure's report.
const TRACE_TAIL: usize = 300;

/// What one simulation run does.
#[expect(
    clippy::struct_excessive_bools,
    reason = "each bool switches one independent kind of step on or off, set by name in a scenario"
)]
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The seed: every choice comes from it.
    pub seed: u64,
    /// Nodes at the start.
    pub nodes: usize,
    /// Steps before the teardown.
    pub steps: usize,
    /// Claims alive at most.
    pub max_claims: usize,
    /// Injected API failures (5xx, timeouts after the effect).
    pub faults: bool,
    /// Crashes at API calls and disk operations.
    pub crashes: bool,
    /// Tenants asking for gateways, network/broadcast and other pods' addresses; PodNetwork
    /// edits that bypass the CRD's rules.
    pub hostile: bool,
    /// An administrator (or another node) deleting a live node's IPBlock.
    pub foreign_deletes: bool,
    /// Node deletions (and new nodes).
    pub node_churn: bool,
    /// The network's subnet, and its block prefix.
    pub subnet: String,
    /// Block prefix (IPv4).
    pub block_prefix: u8,
    /// The static range (also excluded from blocks).
    pub static_range: String,
    /// The gateway.
    pub gateway: String,
    /// `--block-release-grace`.
    pub grace: Duration,
    /// Print every trace line as it happens.
    pub verbose: bool,
}

impl SimConfig {
    /// The CI scenario: 4 nodes, a /22 cut into /28 blocks (blocks run out and are
    /// released often), every kind of step on.
    #[must_use]
    pub fn small(seed: u64) -> Self {
        SimConfig {
            seed,
            nodes: 4,
            steps: 400,
            max_claims: 24,
            faults: true,
            crashes: true,
            hostile: true,
            foreign_deletes: false,
            node_churn: true,
            subnet: "10.10.0.0/22".to_owned(),
            block_prefix: 28,
            static_range: "10.10.0.0/26".to_owned(),
            gateway: "10.10.0.1".to_owned(),
            grace: Duration::from_mins(1),
            verbose: std::env::var_os("IPAM_SIM_VERBOSE").is_some(),
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct SimReport {
    /// The seed.
    pub seed: u64,
    /// Steps run (teardown included).
    pub steps: usize,
    /// Prepares answered with success.
    pub prepared: usize,
    /// Prepares answered with an error.
    pub refused: usize,
    /// Unprepares answered with success.
    pub unprepared: usize,
    /// Node crashes.
    pub crashes: usize,
    /// API requests.
    pub counts: ApiCounts,
    /// A hash of the whole trace (equal for equal runs of one seed).
    pub trace_hash: u64,
}

/// Runs one seed on a current-thread runtime with paused time. `Err`: the broken
/// invariants, the seed and the last steps.
pub fn run(config: &SimConfig) -> Result<SimReport, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| format!("building the runtime: {e}"))?;
    runtime.block_on(async {
        let mut sim = Sim::new(config.clone());
        sim.setup();
        let outcome = sim.drive().await;
        sim.shutdown();
        outcome
    })
}

/// A finished prepare or unprepare, reported by its task.
#[derive(Debug)]
enum Done {
    Prepare { node: String, epoch: u64, claim: usize, result: Result<Vec<IpNetwork>, String> },
    Unprepare { node: String, epoch: u64, claim: usize, result: Result<(), String> },
    Upkeep { node: String, epoch: u64, reconciled: Option<bool> },
}

impl Done {
    fn order(&self) -> (String, u8, usize) {
        match self {
            Done::Prepare { node, claim, .. } => (node.clone(), 0, *claim),
            Done::Unprepare { node, claim, .. } => (node.clone(), 1, *claim),
            Done::Upkeep { node, .. } => (node.clone(), 2, 0),
        }
    }
}

pub(super) struct Sim {
    pub(super) cfg: SimConfig,
    rng: Rng,
    world: World,
    clock: Arc<SimClock>,
    nodes: BTreeMap<String, SimNode>,
    claims: BTreeMap<usize, SimClaim>,
    next_claim: usize,
    next_node: usize,
    collector: Collector,
    hostile_deleted: BTreeSet<String>,
    upkeep_running: BTreeSet<String>,
    tx: mpsc::UnboundedSender<Done>,
    rx: mpsc::UnboundedReceiver<Done>,
    trace: VecDeque<String>,
    report: SimReport,
    step: usize,
    /// Prepare attempts per claim (kubelet gives a pod up after a few).
    attempts: BTreeMap<usize, u32>,
    /// No more faults, crashes or hostile steps (the teardown).
    calm: bool,
}

impl Sim {
    pub(super) fn new(cfg: SimConfig) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Sim {
            rng: Rng::new(cfg.seed),
            report: SimReport { seed: cfg.seed, ..SimReport::default() },
            cfg,
            world: World::default(),
            clock: Arc::new(SimClock::new(1_800_000_000_000)),
            nodes: BTreeMap::new(),
            claims: BTreeMap::new(),
            next_claim: 0,
            next_node: 0,
            collector: Collector::default(),
            hostile_deleted: BTreeSet::new(),
            upkeep_running: BTreeSet::new(),
            tx,
            rx,
            trace: VecDeque::new(),
            step: 0,
            attempts: BTreeMap::new(),
            calm: false,
        }
    }

    fn log(&mut self, line: &str) {
        let line = format!("[{}] {line}", self.step);
        for byte in line.bytes() {
            self.report.trace_hash =
                (self.report.trace_hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
        if self.cfg.verbose {
            eprintln!("{line}");
        }
        if self.trace.len() == TRACE_TAIL {
            self.trace.pop_front();
        }
        self.trace.push_back(line);
    }

    fn network_json(&self) -> Value {
        json!({
            "apiVersion": "netclaim.dev/v1alpha1", "kind": "PodNetwork",
            "metadata": {"name": NETWORK, "generation": 1, "uid": "pn-1", "resourceVersion": "1"},
            "spec": {
                "provider": DRIVER,
                "parents": ["eth2"],
                "ipam": {
                    "subnets": [self.cfg.subnet],
                    "gateways": [self.cfg.gateway],
                    "exclude": [self.cfg.static_range],
                    "staticRanges": [self.cfg.static_range],
                    "blockSize": {"ipv4": self.cfg.block_prefix, "ipv6": 120}
                }
            }
        })
    }

    pub(super) fn setup(&mut self) {
        let ours: PodNetwork =
            serde_json::from_value(self.network_json()).expect("the simulation's network parses");
        let other: PodNetwork = serde_json::from_value(json!({
            "apiVersion": "netclaim.dev/v1alpha1", "kind": "PodNetwork",
            "metadata": {"name": OTHER_NETWORK, "generation": 1, "uid": "pn-2", "resourceVersion": "2"},
            "spec": {"provider": OTHER_DRIVER, "parents": ["eth3"],
                     "ipam": {"subnets": ["10.30.0.0/16"], "blockSize": {"ipv4": 26, "ipv6": 120}}}
        }))
        .expect("the other network parses");
        {
            let mut world = self.world.lock();
            world.networks.insert(NETWORK.to_owned(), ours);
            world.networks.insert(OTHER_NETWORK.to_owned(), other);
        }
        for _ in 0..self.cfg.nodes {
            self.add_node();
        }
    }

    /// A new node; the other driver runs there too and has a block on it.
    fn add_node(&mut self) {
        let name = format!("node-{}", self.next_node);
        let index = self.next_node;
        self.next_node += 1;
        {
            let mut world = self.world.lock();
            world.nodes.insert(name.clone());
            let cidr = format!("10.30.{}.0/26", index % 256);
            let block = IpBlock::new(IpBlockSpec {
                pod_network: OTHER_NETWORK.to_owned(),
                cidr,
                node_name: name.clone(),
                claim: None,
            });
            World::insert_block(&mut world, block);
        }
        let mut node = SimNode::new(name.clone(), self.cfg.seed ^ (index as u64 + 1));
        if let Err(err) = node.boot(&self.world, &self.clock, self.cfg.grace) {
            self.world.lock().violations.push(format!("{name}: {err}"));
        }
        self.nodes.insert(name.clone(), node);
        self.log(&format!("node {name} joins"));
    }

    pub(super) fn shutdown(&mut self) {
        for node in self.nodes.values_mut() {
            for task in node.tasks.drain(..) {
                task.abort();
            }
        }
    }

    /// Waits until every task is parked at a gate or done, and collects what finished.
    async fn quiesce(&mut self) {
        tokio::time::sleep(TICK).await;
        // Tasks of one step may finish in any order (their commits run on blocking
        // threads): what finished is handled in a fixed order.
        let mut finished = Vec::new();
        while let Ok(done) = self.rx.try_recv() {
            finished.push(done);
        }
        finished.sort_by_key(Done::order);
        for done in finished {
            self.finished(done);
        }
        let off: Vec<String> = self
            .nodes
            .values()
            .filter(|n| !n.deleted && n.disk.powered_off())
            .map(|n| n.name.clone())
            .collect();
        for name in off {
            self.log(&format!("{name}: power cut reached (disk operation failed), restarting"));
            self.crash(&name, true);
        }
        for node in self.nodes.values_mut() {
            node.reap();
        }
    }

    fn live(&self, node: &str, epoch: u64) -> bool {
        self.nodes.get(node).is_some_and(|n| !n.deleted && n.epoch == epoch)
    }

    fn finished(&mut self, done: Done) {
        match done {
            Done::Prepare { node, epoch, claim, result } => {
                if !self.live(&node, epoch) {
                    return;
                }
                // Forbidden: what the node's view forbade both when the prepare started and
                // now (a view that changed meanwhile may have been read either way).
                let now = self.forbidden(&node);
                let Some(c) = self.claims.get_mut(&claim) else { return };
                c.in_flight = false;
                c.forbidden = c.forbidden.intersection(&now).copied().collect();
                let name = c.name.clone();
                match result {
                    Ok(addresses) => {
                        self.report.prepared += 1;
                        let c = self.claims.get_mut(&claim).expect("looked up above");
                        if let Some(before) = &c.acked
                            && *before != addresses
                        {
                            let line = format!(
                                "claim {name}: a repeated prepare answered {addresses:?}, the first {before:?}"
                            );
                            self.world.lock().violations.push(line);
                        }
                        if c.want_prepared {
                            c.acked = Some(addresses.clone());
                        }
                        self.log(&format!("{node}: prepared {name} -> {addresses:?}"));
                    }
                    Err(err) => {
                        self.report.refused += 1;
                        self.log(&format!("{node}: prepare {name} failed: {err}"));
                    }
                }
            }
            Done::Unprepare { node, epoch, claim, result } => {
                if !self.live(&node, epoch) {
                    return;
                }
                let Some(c) = self.claims.get_mut(&claim) else { return };
                c.in_flight = false;
                let name = c.name.clone();
                match result {
                    Ok(()) => {
                        self.report.unprepared += 1;
                        let c = self.claims.remove(&claim).expect("looked up above");
                        self.world.lock().claims.remove(&(c.namespace.clone(), c.name.clone()));
                        self.log(&format!("{node}: unprepared {name}; claim deleted"));
                    }
                    Err(err) => self.log(&format!("{node}: unprepare {name} failed: {err}")),
                }
            }
            Done::Upkeep { node, epoch, reconciled } => {
                if !self.live(&node, epoch) {
                    return;
                }
                self.upkeep_running.remove(&node);
                if reconciled == Some(true)
                    && let Some(n) = self.nodes.get_mut(&node)
                {
                    n.reconcile_pending = false;
                }
                self.log(&format!("{node}: upkeep done (reconciled: {reconciled:?})"));
            }
        }
    }

    fn crash(&mut self, name: &str, power: bool) {
        self.report.crashes += 1;
        let Some(node) = self.nodes.get_mut(name) else { return };
        node.crash(&self.world, power);
        let boot = node.boot(&self.world, &self.clock, self.cfg.grace);
        if let Err(err) = boot {
            self.world.lock().violations.push(format!("{name} after a crash: {err}"));
        }
        self.upkeep_running.remove(name);
        for claim in self.claims.values_mut().filter(|c| c.node == name) {
            claim.in_flight = false;
        }
        self.log(&format!("{name}: {} and restart", if power { "power loss" } else { "kill -9" }));
    }

    fn live_nodes(&self) -> Vec<String> {
        self.nodes.values().filter(|n| !n.deleted).map(|n| n.name.clone()).collect()
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> Option<T> {
        if items.is_empty() { None } else { Some(items[self.rng.below(items.len())].clone()) }
    }

    fn subnet(&self) -> IpNetwork {
        self.cfg.subnet.parse().expect("the configured subnet parses")
    }

    /// The gateways, network and broadcast addresses `node` knows of now.
    fn forbidden(&self, node: &str) -> BTreeSet<IpAddr> {
        let subnet = self.subnet();
        let mut out = BTreeSet::from([subnet.network(), subnet.broadcast()]);
        let mut add = |network: &PodNetwork| {
            for gateway in network.spec.ipam.iter().flat_map(|i| i.gateways.iter()) {
                if let Ok(ip) = gateway.parse() {
                    out.insert(ip);
                }
            }
        };
        // The node's view, not the API's: a gateway its watch has not delivered yet is one it
        // cannot know.
        if let Some(n) = self.nodes.get(node)
            && let Some(network) = n.view.snapshot(NETWORK)
        {
            add(&network);
        }
        out
    }

    /// One run: the random steps, then the teardown; checks after each.
    pub(super) async fn drive(&mut self) -> Result<SimReport, String> {
        for step in 0..self.cfg.steps {
            self.step = step;
            self.quiesce().await;
            self.check("")?;
            self.random_step().await;
        }
        self.teardown().await?;
        self.report.counts = self.world.lock().counts;
        self.report.steps = self.step;
        Ok(self.report.clone())
    }

    fn check(&mut self, phase: &str) -> Result<(), String> {
        let broken = {
            let world = self.world.lock();
            checks::check(&world, &self.nodes, &self.claims, &self.hostile_deleted)
        };
        if broken.is_empty() {
            return Ok(());
        }
        Err(self.failure(phase, &broken))
    }

    fn failure(&self, phase: &str, broken: &[String]) -> String {
        let mut out = format!(
            "IPAM simulation seed {} broke an invariant at step {}{phase} (replay: IPAM_SIM_SEED={} IPAM_SIM_VERBOSE=1):\n",
            self.cfg.seed, self.step, self.cfg.seed
        );
        for line in broken {
            writeln!(out, "  BROKEN: {line}").expect("writing to a String cannot fail");
        }
        out.push_str("last steps:\n");
        for line in &self.trace {
            writeln!(out, "  {line}").expect("writing to a String cannot fail");
        }
        out
    }

    async fn random_step(&mut self) {
        let pending = self.world.lock().pending.len();
        let roll = self.rng.below(100);
        match roll {
            0..=49 if pending > 0 => self.release_one(),
            0..=61 => self.start_prepares(),
            62..=69 => self.start_unprepare(),
            70..=76 => self.new_claim(),
            77..=80 => self.start_upkeep(),
            81..=83 => {
                let secs = 1 + self.rng.below(40) as u64;
                self.log(&format!("time passes: {secs} s"));
                tokio::time::sleep(Duration::from_secs(secs)).await;
            }
            84..=87 => self.watch_sync(),
            88..=89 if self.cfg.crashes => {
                if let Some(name) = self.pick(&self.live_nodes()) {
                    let power = self.rng.chance(50);
                    self.crash(&name, power);
                }
            }
            90..=91 if self.cfg.crashes => {
                if let Some(name) = self.pick(&self.live_nodes()) {
                    let after = 1 + self.rng.below(40) as u64;
                    self.nodes[&name].disk.cut_power_after(after);
                    self.log(&format!(
                        "{name}: power goes off at the {after}th disk operation from now"
                    ));
                }
            }
            92..=93 if self.cfg.hostile => self.edit_network(),
            94..=96 => self.sweep(),
            97 if self.cfg.node_churn => self.delete_node(),
            98 if self.cfg.node_churn && self.live_nodes().len() < self.cfg.nodes + 2 => {
                self.add_node();
            }
            99 if self.cfg.foreign_deletes => self.delete_someones_block(),
            _ => {}
        }
    }

    fn release_one(&mut self) {
        let id = {
            let world = self.world.lock();
            let len = world.pending.len();
            let k = self.rng.below(len);
            world.pending.keys().nth(k).cloned().expect("k < len")
        };
        let roll = self.rng.below(100);
        let faults = self.cfg.faults && !self.calm;
        let crashes = self.cfg.crashes && !self.calm;
        let (what, applied_crash) = match roll {
            0..=4 if faults => ("fail before", None),
            5..=8 if faults => ("fail after", None),
            9..=11 if crashes => ("crash before", Some(false)),
            12..=14 if crashes => ("crash after", Some(true)),
            _ => ("done", None),
        };
        if let Some(applied) = applied_crash {
            if let Some((node, _, call)) = self.world.drop_call(&id, applied) {
                self.log(&format!("{node}: {} -> {what}", call.describe()));
                self.crash(&node, false);
            }
            return;
        }
        let outcome = match what {
            "fail before" => Outcome::FailBefore,
            "fail after" => Outcome::FailAfter,
            _ => Outcome::Done,
        };
        if let Some((node, _, call)) = self.world.release(&id, outcome) {
            let extra = match &call {
                Call::Create(_) => {
                    let c = self.world.lock().counts;
                    format!(" (creates {}, conflicts {})", c.creates, c.conflicts)
                }
                _ => String::new(),
            };
            self.log(&format!("{node}: {} -> {what}{extra}", call.describe()));
        }
    }

    fn claim_ref(c: &SimClaim) -> ClaimRef {
        ClaimRef { namespace: c.namespace.clone(), name: c.name.clone(), uid: c.uid.clone() }
    }

    fn start_prepares(&mut self) {
        let Some(node) = self.pick(&self.live_nodes()) else { return };
        let mut ids: Vec<usize> = self
            .claims
            .iter()
            .filter(|(_, c)| c.node == node && c.want_prepared && !c.in_flight)
            .filter(|(_, c)| c.acked.is_none())
            .map(|(id, _)| *id)
            .collect();
        // kubelet repeats a prepare now and then (after a restart, a timeout).
        if ids.is_empty() || self.rng.chance(10) {
            ids.extend(
                self.claims
                    .iter()
                    .filter(|(_, c)| {
                        c.node == node && c.want_prepared && !c.in_flight && c.acked.is_some()
                    })
                    .map(|(id, _)| *id)
                    .take(1),
            );
        }
        if ids.is_empty() {
            return;
        }
        let batch = 1 + self.rng.below(3);
        let start = self.rng.below(ids.len());
        let chosen: Vec<usize> =
            ids.iter().cycle().skip(start).take(batch.min(ids.len())).copied().collect();
        let forbidden = self.forbidden(&node);
        let mut refs = Vec::new();
        for id in &chosen {
            let attempts = self.attempts.entry(*id).or_default();
            *attempts += 1;
            let c = self.claims.get_mut(id).expect("chosen from the map");
            c.in_flight = true;
            // A repeated prepare answers from the record: what was forbidden when the claim
            // got its addresses is what counts (a gateway added later over a running pod's
            // address is a conflict for the controller to report, not a new lease).
            if c.acked.is_none() {
                c.forbidden.clone_from(&forbidden);
            }
            refs.push((*id, Self::claim_ref(c)));
        }
        let names: Vec<String> = refs.iter().map(|(_, r)| r.name.clone()).collect();
        self.log(&format!("{node}: kubelet prepares {names:?}"));
        let n = &self.nodes[&node];
        let Some(service) = n.service.clone() else { return };
        let (epoch, tx, name) = (n.epoch, self.tx.clone(), node.clone());
        let task = tokio::spawn(async move {
            let claims: Vec<ClaimRef> = refs.iter().map(|(_, r)| r.clone()).collect();
            let answers = service.prepare_claims(&claims).await;
            for (claim, answer) in answers {
                let id = refs.iter().find(|(_, r)| r.uid == claim.uid).map_or(0, |(id, _)| *id);
                let result = answer
                    .map(|_| {
                        service
                            .prepared(&claim.uid)
                            .map(|p| p.devices.iter().flat_map(|d| d.addresses.clone()).collect())
                            .unwrap_or_default()
                    })
                    .map_err(|e| e.to_string());
                let _ = tx.send(Done::Prepare { node: name.clone(), epoch, claim: id, result });
            }
        });
        self.nodes.get_mut(&node).expect("picked").tasks.push(task);
    }

    fn start_unprepare(&mut self) {
        let candidates: Vec<usize> = self
            .claims
            .iter()
            .filter(|(_, c)| !c.in_flight && self.nodes.get(&c.node).is_some_and(|n| !n.deleted))
            .filter(|(id, c)| {
                c.acked.is_some()
                    || !c.want_prepared
                    || self.attempts.get(*id).copied().unwrap_or(0) >= 3
            })
            .map(|(id, _)| *id)
            .collect();
        let Some(id) = self.pick(&candidates) else { return };
        let c = self.claims.get_mut(&id).expect("picked from the map");
        c.want_prepared = false;
        c.in_flight = true;
        let (claim, node) = (Self::claim_ref(c), c.node.clone());
        self.log(&format!("{node}: kubelet unprepares {}", claim.name));
        let n = &self.nodes[&node];
        let Some(service) = n.service.clone() else { return };
        let (epoch, tx, name) = (n.epoch, self.tx.clone(), node.clone());
        let task = tokio::spawn(async move {
            let result = service.unprepare_claim(&claim).await.map_err(|e| e.to_string());
            let _ = tx.send(Done::Unprepare { node: name, epoch, claim: id, result });
        });
        self.nodes.get_mut(&node).expect("picked").tasks.push(task);
    }

    /// A new claim on a node: mostly dynamic; sometimes a static address, and from hostile
    /// tenants the gateway, the network or broadcast address, or another pod's address.
    fn new_claim(&mut self) {
        if self.claims.len() >= self.cfg.max_claims || self.calm {
            return;
        }
        let Some(node) = self.pick(&self.live_nodes()) else { return };
        let subnet = self.subnet();
        let statics: IpNetwork = self.cfg.static_range.parse().expect("the static range parses");
        let roll = self.rng.below(100);
        let own = match roll {
            0..=69 => json!({}),
            70..=79 => {
                let offset = 2 + u32::try_from(self.rng.below(6)).expect("below 6 fits in a u32");
                let ip = std::net::Ipv4Addr::from(u32::from(first_v4(statics)) + offset);
                json!({"ipam": {"addresses": [format!("{ip}/{}", subnet.prefix())]}})
            }
            80..=84 => json!({"ipam": {"addresses": []}}),
            _ if !self.cfg.hostile => json!({}),
            85..=88 => {
                json!({"ipam": {"addresses": [format!("{}/{}", self.cfg.gateway, subnet.prefix())]}})
            }
            89..=91 => {
                json!({"ipam": {"addresses": [format!("{}/{}", subnet.network(), subnet.prefix())]}})
            }
            92..=93 => {
                json!({"ipam": {"addresses": [format!("{}/{}", subnet.broadcast(), subnet.prefix())]}})
            }
            _ => {
                let taken: Vec<IpNetwork> =
                    self.claims.values().filter_map(|c| c.acked.clone()).flatten().collect();
                match self.pick(&taken) {
                    Some(other) => json!({"ipam": {"addresses": [other.to_string()]}}),
                    None => json!({}),
                }
            }
        };
        let id = self.next_claim;
        self.next_claim += 1;
        let name = format!("c{id}");
        let namespace = format!("tenant-{}", id % 3);
        let uid = format!("uid-{name}");
        let object = claim_object(&namespace, &name, &uid, &node, &own);
        self.world.lock().claims.insert((namespace.clone(), name.clone()), object);
        self.log(&format!("{node}: new claim {namespace}/{name} {own}"));
        self.claims.insert(
            id,
            SimClaim {
                namespace,
                name,
                uid,
                node,
                want_prepared: true,
                acked: None,
                in_flight: false,
                forbidden: BTreeSet::new(),
            },
        );
    }

    fn start_upkeep(&mut self) {
        let Some(node) = self.pick(&self.live_nodes()) else { return };
        self.spawn_upkeep(&node);
    }

    /// The daemon's block upkeep: the start-up reconcile until it succeeds, then a release
    /// pass.
    fn spawn_upkeep(&mut self, node: &str) {
        if self.upkeep_running.contains(node) {
            return;
        }
        let n = &self.nodes[node];
        let Some(service) = n.service.clone() else { return };
        let (epoch, tx, name, reconcile) =
            (n.epoch, self.tx.clone(), node.to_owned(), n.reconcile_pending);
        self.upkeep_running.insert(node.to_owned());
        self.log(&format!(
            "{node}: block upkeep ({})",
            if reconcile { "reconcile" } else { "release" }
        ));
        let task = tokio::spawn(async move {
            let reconciled = if reconcile {
                Some(service.reconcile_blocks().await.is_ok())
            } else {
                service.release_idle_blocks().await;
                None
            };
            let _ = tx.send(Done::Upkeep { node: name, epoch, reconciled });
        });
        self.nodes.get_mut(node).expect("picked").tasks.push(task);
    }

    fn watch_sync(&mut self) {
        let Some(node) = self.pick(&self.live_nodes()) else { return };
        let networks = self.world.lock().networks.clone();
        self.nodes[&node].view.sync(&networks);
        self.log(&format!("{node}: the PodNetwork watch catches up"));
    }

    /// An edit that bypasses the CRD's rules (an old API server, `kubectl replace`).
    fn edit_network(&mut self) {
        let subnet = self.subnet();
        let blocks_in_subnet =
            1u32 << (u32::from(self.cfg.block_prefix) - u32::from(subnet.prefix()));
        let roll = self.rng.below(4);
        let leased: Vec<IpNetwork> =
            self.claims.values().filter_map(|c| c.acked.clone()).flatten().collect();
        let mut world = self.world.lock();
        let rv = World::next_resource_version(&mut world);
        let Some(network) = world.networks.get_mut(NETWORK) else { return };
        let Some(ipam) = network.spec.ipam.as_mut() else { return };
        let what = match roll {
            0 => {
                // A gateway added: maybe an address a pod holds.
                let ip = match leased.first() {
                    Some(l) if self.rng.chance(50) => l.ip().to_string(),
                    _ => "10.10.0.2".to_owned(),
                };
                ipam.gateways.push(ip.clone());
                format!("gateway {ip} added")
            }
            1 => {
                let block = u32::try_from(self.rng.below(blocks_in_subnet as usize))
                    .expect("below a u32 count fits in a u32");
                let size = 1u32 << (32 - u32::from(self.cfg.block_prefix));
                let start = std::net::Ipv4Addr::from(u32::from(first_v4(subnet)) + block * size);
                let cidr = format!("{start}/{}", self.cfg.block_prefix);
                ipam.exclude.push(cidr.clone());
                format!("exclude {cidr} added")
            }
            2 => {
                // The static range no longer excluded: blocks could be carved over it.
                ipam.exclude.retain(|e| *e != self.cfg.static_range);
                "exclude of the static range removed".to_owned()
            }
            _ => {
                ipam.gateways = vec![self.cfg.gateway.clone()];
                ipam.exclude = vec![self.cfg.static_range.clone()];
                "spec restored".to_owned()
            }
        };
        network.metadata.generation = Some(network.metadata.generation.unwrap_or(1) + 1);
        network.metadata.resource_version = Some(rv);
        drop(world);
        self.log(&format!("hostile PodNetwork edit: {what}"));
    }

    /// The controller's IPBlock sweep (`controller::gc::Collector`): blocks of deleted nodes
    /// and reservations of claims long gone, this driver's networks only.
    fn sweep(&mut self) {
        let now = tokio::time::Instant::now().into_std();
        let mut world = self.world.lock();
        let facts: Vec<BlockFacts> = world
            .blocks
            .values()
            .filter(|b| {
                world.networks.get(&b.spec.pod_network).is_some_and(|n| n.spec.provider == DRIVER)
            })
            .map(|b| BlockFacts {
                name: b.metadata.name.clone().unwrap_or_default(),
                uid: b.metadata.uid.clone().unwrap_or_default(),
                resource_version: b.metadata.resource_version.clone().unwrap_or_default(),
                pod_network: b.spec.pod_network.clone(),
                node: b.spec.node_name.clone(),
                claim_uid: b.spec.claim.as_ref().map(|c| c.uid.clone()),
                deleting: false,
            })
            .collect();
        let cluster = ClusterFacts {
            nodes: world.nodes.clone(),
            claims: world.claims.values().filter_map(|c| c.metadata.uid.clone()).collect(),
            allocated_pools: world
                .claims
                .values()
                .flat_map(|c| c.status.iter().flat_map(|s| s.allocation.iter()))
                .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
                .map(|r| r.pool.clone())
                .collect(),
        };
        let plan: Vec<(String, String, String)> = self
            .collector
            .plan(&facts, &cluster, now, self.cfg.grace)
            .into_iter()
            .map(|(b, reason)| (b.name.clone(), b.uid.clone(), reason.as_str().to_owned()))
            .collect();
        let mut lines = Vec::new();
        for (name, uid, reason) in plan {
            if world.blocks.get(&name).and_then(|b| b.metadata.uid.clone()) == Some(uid) {
                world.blocks.remove(&name);
                world.counts.deletes += 1;
                lines.push(format!("controller collects {name} ({reason})"));
            }
        }
        drop(world);
        self.log("controller sweep");
        for line in lines {
            self.log(&line);
        }
    }

    /// A node leaves the cluster for good: its pods and claims go with it.
    fn delete_node(&mut self) {
        let live = self.live_nodes();
        if live.len() <= 2 {
            return;
        }
        let Some(name) = self.pick(&live) else { return };
        let node = self.nodes.get_mut(&name).expect("picked");
        for task in node.tasks.drain(..) {
            task.abort();
        }
        node.deleted = true;
        self.upkeep_running.remove(&name);
        node.service = None;
        node.store = None;
        self.world.drop_calls_of(&name);
        let gone: Vec<usize> =
            self.claims.iter().filter(|(_, c)| c.node == name).map(|(id, _)| *id).collect();
        let mut world = self.world.lock();
        world.nodes.remove(&name);
        for id in gone {
            if let Some(c) = self.claims.remove(&id) {
                world.claims.remove(&(c.namespace, c.name));
            }
        }
        drop(world);
        self.log(&format!("node {name} deleted with its claims"));
    }

    /// Someone (an administrator, another node's identity) deletes a live node's block.
    fn delete_someones_block(&mut self) {
        let names: Vec<String> = {
            let world = self.world.lock();
            world
                .blocks
                .values()
                .filter(|b| b.spec.pod_network == NETWORK && b.spec.claim.is_none())
                .filter_map(|b| b.metadata.name.clone())
                .collect()
        };
        let Some(name) = self.pick(&names) else { return };
        self.world.lock().blocks.remove(&name);
        self.hostile_deleted.insert(name.clone());
        self.log(&format!("someone deletes IPBlock {name}"));
    }

    /// Every claim goes, time passes beyond the grace and the quarantine, the upkeep and the
    /// controller run: nothing may be left.
    async fn teardown(&mut self) -> Result<(), String> {
        self.calm = true;
        for node in self.nodes.values() {
            node.disk.cancel_power_cut();
        }
        self.log("teardown: every claim goes");
        for claim in self.claims.values_mut() {
            claim.want_prepared = false;
        }
        let mut rounds = 0;
        while !self.claims.is_empty() || !self.world.lock().pending.is_empty() {
            rounds += 1;
            self.step += 1;
            if rounds > 20_000 {
                let left: Vec<String> = self.claims.values().map(|c| c.name.clone()).collect();
                return Err(
                    self.failure(" (teardown)", &[format!("claims never unprepared: {left:?}")])
                );
            }
            self.quiesce().await;
            self.check(" (teardown)")?;
            if self.world.lock().pending.is_empty() {
                self.start_unprepare();
                // The daemons keep reconciling and releasing meanwhile.
                if rounds % 8 == 0 {
                    for node in self.live_nodes() {
                        self.spawn_upkeep(&node);
                    }
                }
            } else {
                self.release_one();
            }
        }
        let networks = self.world.lock().networks.clone();
        for node in self.nodes.values() {
            node.view.sync(&networks);
        }
        for _ in 0..3 {
            tokio::time::sleep(self.cfg.grace + Duration::from_secs(31)).await;
            for node in self.live_nodes() {
                self.spawn_upkeep(&node);
            }
            let mut rounds = 0;
            loop {
                rounds += 1;
                if rounds > 20_000 {
                    let running: Vec<String> = self.upkeep_running.iter().cloned().collect();
                    return Err(self.failure(
                        " (teardown)",
                        &[format!("block upkeep never ends on {running:?}")],
                    ));
                }
                self.step += 1;
                self.quiesce().await;
                self.check(" (teardown)")?;
                if self.world.lock().pending.is_empty() && self.upkeep_running.is_empty() {
                    break;
                }
                if !self.world.lock().pending.is_empty() {
                    self.release_one();
                }
            }
            self.sweep();
        }
        let left = {
            let world = self.world.lock();
            checks::leftovers(&world, &self.nodes)
        };
        if left.is_empty() { Ok(()) } else { Err(self.failure(" (after the teardown)", &left)) }
    }
}

fn first_v4(network: IpNetwork) -> std::net::Ipv4Addr {
    match network.network() {
        IpAddr::V4(v4) => v4,
        IpAddr::V6(_) => std::net::Ipv4Addr::UNSPECIFIED,
    }
}

/// A claim allocated `medianet-eth2` on `node`, its class naming the network.
pub(super) fn claim_object(
    namespace: &str,
    name: &str,
    uid: &str,
    node: &str,
    own: &Value,
) -> ResourceClaim {
    let params = |body: &Value| {
        let mut v = json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig"});
        if let (Some(v), Some(body)) = (v.as_object_mut(), body.as_object()) {
            v.extend(body.clone());
        }
        v
    };
    serde_json::from_value(json!({
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "spec": {},
        "status": {"allocation": {"devices": {
            "results": [{"request": "net", "driver": DRIVER, "pool": node, "device": "medianet-eth2",
                         "shareID": "3f1c0c3e-0000-4000-8000-000000000001"}],
            "config": [
                {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": params(&json!({"podNetwork": NETWORK}))}},
                {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params(own)}}
            ]
        }}}
    }))
    .expect("the simulation's claim parses")
}

/// The scale run's figures.
#[derive(Debug, Clone, Default)]
pub struct ScaleReport {
    /// Nodes.
    pub nodes: usize,
    /// Claims prepared.
    pub claims: usize,
    /// API requests.
    pub counts: ApiCounts,
    /// Blocks in the API at the end.
    pub blocks: usize,
    /// Most blocks on one node.
    pub max_blocks_per_node: usize,
    /// Peak resident memory of the process (VmHWM), KiB.
    pub vm_hwm_kib: u64,
    /// Invariants broken (checked once at the end).
    pub broken: Vec<String>,
}

/// `nodes` nodes prepare `per_node` dynamic claims each on one network `subnet` cut into
/// `/block_prefix` blocks, every call released in a seeded order, no faults; the invariants
/// are checked once at the end (a check per step would dominate the run).
pub fn run_scale(
    seed: u64,
    nodes: usize,
    per_node: usize,
    subnet: &str,
    block_prefix: u8,
    in_flight: usize,
) -> Result<ScaleReport, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| format!("building the runtime: {e}"))?;
    runtime.block_on(async {
        let mut sim = Sim::new(scale_config(seed, nodes, subnet, block_prefix)?);
        sim.setup();
        sim.calm = true;
        sim.add_scale_claims(per_node);
        let total = sim.claims.len();
        let mut by_node: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (id, claim) in &sim.claims {
            by_node.entry(claim.node.clone()).or_default().push(*id);
        }
        loop {
            sim.step += 1;
            sim.quiesce().await;
            let waiting = sim.claims.values().filter(|c| c.acked.is_none()).count();
            if waiting == 0 && sim.world.lock().pending.is_empty() {
                break;
            }
            // Every node keeps `in_flight` prepares going, one claim per call (a pod each).
            for (node, ids) in &by_node {
                let busy = ids.iter().filter(|id| sim.claims[*id].in_flight).count();
                let idle: Vec<usize> = ids
                    .iter()
                    .filter(|id| !sim.claims[*id].in_flight && sim.claims[*id].acked.is_none())
                    .copied()
                    .take(in_flight.saturating_sub(busy))
                    .collect();
                for id in idle {
                    sim.prepare_one(node, id);
                }
            }
            let pending = sim.world.lock().pending.len();
            for _ in 0..pending.min(64) {
                if sim.world.lock().pending.is_empty() {
                    break;
                }
                sim.release_one();
            }
            if sim.step > 50 * total + 10_000 {
                return Err(format!("the scale run did not converge: {waiting} claims unprepared"));
            }
        }
        let broken = {
            let world = sim.world.lock();
            checks::check(&world, &sim.nodes, &sim.claims, &sim.hostile_deleted)
        };
        let world = sim.world.lock();
        let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
        for block in world.blocks.values().filter(|b| b.spec.pod_network == NETWORK) {
            *per_node.entry(block.spec.node_name.as_str()).or_default() += 1;
        }
        let report = ScaleReport {
            nodes,
            claims: total,
            counts: world.counts,
            blocks: per_node.values().sum(),
            max_blocks_per_node: per_node.values().copied().max().unwrap_or(0),
            vm_hwm_kib: vm_hwm_kib(),
            broken,
        };
        drop(world);
        sim.shutdown();
        Ok(report)
    })
}

/// The scale run's cluster: `nodes` nodes on one network `subnet` cut into `/block_prefix`
/// blocks, its first block static, no faults, crashes or hostile tenants.
fn scale_config(
    seed: u64,
    nodes: usize,
    subnet: &str,
    block_prefix: u8,
) -> Result<SimConfig, String> {
    let mut cfg = SimConfig::small(seed);
    cfg.nodes = nodes;
    subnet.clone_into(&mut cfg.subnet);
    cfg.block_prefix = block_prefix;
    let first = first_v4(subnet.parse().map_err(|e| format!("{subnet}: {e}"))?);
    cfg.static_range = format!("{first}/{block_prefix}");
    cfg.gateway = std::net::Ipv4Addr::from(u32::from(first) + 1).to_string();
    cfg.grace = Duration::from_mins(10);
    cfg.max_claims = usize::MAX;
    cfg.faults = false;
    cfg.crashes = false;
    cfg.hostile = false;
    cfg.verbose = false;
    Ok(cfg)
}

impl Sim {
    /// The scale run's claims: `per_node` dynamic claims on every live node, each node's block
    /// upkeep running.
    fn add_scale_claims(&mut self, per_node: usize) {
        for node in self.live_nodes() {
            self.spawn_upkeep(&node);
            for _ in 0..per_node {
                let id = self.next_claim;
                self.next_claim += 1;
                let name = format!("c{id}");
                let uid = format!("uid-{name}");
                let object = claim_object("default", &name, &uid, &node, &json!({}));
                self.world.lock().claims.insert(("default".to_owned(), name.clone()), object);
                self.claims.insert(
                    id,
                    SimClaim {
                        namespace: "default".to_owned(),
                        name,
                        uid,
                        node: node.clone(),
                        want_prepared: true,
                        acked: None,
                        in_flight: false,
                        forbidden: BTreeSet::new(),
                    },
                );
            }
        }
    }

    /// One prepare call of one claim (the scale run).
    fn prepare_one(&mut self, node: &str, id: usize) {
        let Some(c) = self.claims.get_mut(&id) else { return };
        c.in_flight = true;
        let claim = Self::claim_ref(c);
        let n = &self.nodes[node];
        let Some(service) = n.service.clone() else { return };
        let (epoch, tx, name) = (n.epoch, self.tx.clone(), node.to_owned());
        let task = tokio::spawn(async move {
            let result = service
                .prepare_claim(&claim)
                .await
                .map(|_| {
                    service
                        .prepared(&claim.uid)
                        .map(|p| p.devices.iter().flat_map(|d| d.addresses.clone()).collect())
                        .unwrap_or_default()
                })
                .map_err(|e| e.to_string());
            let _ = tx.send(Done::Prepare { node: name, epoch, claim: id, result });
        });
        self.nodes.get_mut(node).expect("a live node").tasks.push(task);
    }
}

/// Peak resident memory of this process (`VmHWM` in /proc/self/status), KiB; 0 when unknown.
#[must_use]
pub fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}
