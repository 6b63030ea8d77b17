//! The simulated API server: `IPBlock`s, `PodNetwork`s and `ResourceClaim`s in ordered maps,
//! with the semantics the node relies on (name uniqueness on create, UID preconditions on
//! delete, field selectors on lists, resourceVersions), and every call a node makes parked
//! at a gate until the simulation releases it with an outcome (done, failed before or after
//! taking effect, or the caller crashing around it).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaim;
use netclaim::claims::networks::{BlockApiError, Created, Deleted, IpBlockApi};
use netclaim::claims::{ClaimSource, ReadError};
use netclaim::model::cause::cause;
use netclaim::model::pod_network::{IpBlock, PodNetwork};
use tokio::sync::oneshot;

/// One call a node made, waiting at its gate.
#[derive(Debug, Clone)]
pub enum Call {
    /// `list` with the field selector `spec.nodeName=<node>`.
    ListNode(String),
    /// `list` with the label selector of one network.
    ListNetwork(String),
    /// `create` (a 409 is followed by a `get`, as the adapter does).
    Create(Box<IpBlock>),
    /// `delete` with a UID precondition.
    Delete {
        /// Object name.
        name: String,
        /// The precondition.
        uid: String,
    },
    /// `get` of a ResourceClaim.
    GetClaim {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

impl Call {
    /// One line for the trace.
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            Call::ListNode(node) => format!("list blocks node={node}"),
            Call::ListNetwork(net) => format!("list blocks network={net}"),
            Call::Create(block) => {
                format!("create {}", block.metadata.name.as_deref().unwrap_or("?"))
            }
            Call::Delete { name, uid } => format!("delete {name} uid={uid}"),
            Call::GetClaim { namespace, name } => format!("get claim {namespace}/{name}"),
        }
    }
}

/// What the gate hands back.
#[derive(Debug)]
enum Reply {
    Blocks(Result<Vec<IpBlock>, BlockApiError>),
    Created(Result<Created, BlockApiError>),
    Deleted(Result<Deleted, BlockApiError>),
    Claim(Result<ResourceClaim, ReadError>),
}

/// A parked call.
#[derive(Debug)]
pub struct Pending {
    /// The caller.
    pub node: String,
    /// The caller's life (a crash starts a new one).
    pub epoch: u64,
    /// The call.
    pub call: Call,
    reply: oneshot::Sender<Reply>,
}

/// API requests counted (the scale figures).
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiCounts {
    /// Creates of blocks that succeeded.
    pub creates: u64,
    /// Creates that met an existing object (409: a lost race or an adoption).
    pub conflicts: u64,
    /// Deletes.
    pub deletes: u64,
    /// Lists.
    pub lists: u64,
    /// Claim GETs.
    pub claim_gets: u64,
    /// Calls failed by injection.
    pub faults: u64,
}

impl ApiCounts {
    /// Writes to the API (creates, including those that collided, and deletes).
    #[must_use]
    pub fn writes(&self) -> u64 {
        self.creates + self.conflicts + self.deletes
    }
}

/// The objects and the calls in flight.
#[derive(Debug, Default)]
pub struct WorldState {
    /// IPBlocks by name.
    pub blocks: BTreeMap<String, IpBlock>,
    /// PodNetworks by name.
    pub networks: BTreeMap<String, PodNetwork>,
    /// ResourceClaims by (namespace, name).
    pub claims: BTreeMap<(String, String), ResourceClaim>,
    /// Nodes that exist.
    pub nodes: BTreeSet<String>,
    /// Calls parked at their gates, by caller, call and arrival: the order the seed picks
    /// from must not depend on which of two nodes' tasks got to its gate first (their
    /// store commits run on blocking threads), so the key leads with what is fixed.
    pub pending: BTreeMap<CallKey, Pending>,
    next_call: u64,
    resource_version: u64,
    next_uid: u64,
    /// Requests served.
    pub counts: ApiCounts,
    /// Invariants broken inside a call (a node touching what is not its own).
    pub violations: Vec<String>,
}

/// A parked call's place in the order: (node, the call described, arrival number).
pub type CallKey = (String, String, u64);

/// How a released call ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done, answered.
    Done,
    /// Failed with a 5xx before it took effect.
    FailBefore,
    /// Took effect, then the answer was lost (a timeout).
    FailAfter,
}

/// The simulated API server; clones share it.
#[derive(Debug, Clone, Default)]
pub struct World(Arc<Mutex<WorldState>>);

fn api_error(op: &'static str, name: &str, why: &str) -> BlockApiError {
    BlockApiError {
        op,
        name: name.to_owned(),
        source: cause(std::io::Error::other(why.to_owned())),
    }
}

impl World {
    /// The state, locked.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, WorldState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Parks `call` of `node` and waits for the simulation to answer it. A caller that
    /// crashed never gets an answer: its task is aborted.
    async fn gate(&self, node: &str, epoch: u64, call: Call) -> Reply {
        let (tx, rx) = oneshot::channel();
        {
            let mut state = self.lock();
            let key = (node.to_owned(), call.describe(), state.next_call);
            state.next_call += 1;
            state.pending.insert(key, Pending { node: node.to_owned(), epoch, call, reply: tx });
        }
        match rx.await {
            Ok(reply) => reply,
            // The node crashed: the simulation dropped the gate with the task.
            Err(_) => std::future::pending().await,
        }
    }

    /// Stores a new object with a fresh UID and resourceVersion.
    pub fn insert_block(state: &mut WorldState, mut block: IpBlock) -> IpBlock {
        state.next_uid += 1;
        state.resource_version += 1;
        block.metadata.uid = Some(format!("uid-{}", state.next_uid));
        block.metadata.resource_version = Some(state.resource_version.to_string());
        let name = block.metadata.name.clone().unwrap_or_default();
        state.blocks.insert(name, block.clone());
        block
    }

    /// Bumps and returns the resourceVersion (for edits of networks).
    pub fn next_resource_version(state: &mut WorldState) -> String {
        state.resource_version += 1;
        state.resource_version.to_string()
    }

    /// Answers parked call `id` with `outcome`; returns the caller, its epoch and the call.
    pub fn release(&self, id: &CallKey, outcome: Outcome) -> Option<(String, u64, Call)> {
        let mut state = self.lock();
        let pending = state.pending.remove(id)?;
        let Pending { node, epoch, call, reply } = pending;
        let answer = if outcome == Outcome::FailBefore {
            state.counts.faults += 1;
            Self::failed(&call)
        } else {
            let answer = Self::execute(&mut state, &node, &call);
            if outcome == Outcome::FailAfter {
                state.counts.faults += 1;
                Self::failed(&call)
            } else {
                answer
            }
        };
        drop(state);
        let _ = reply.send(answer);
        Some((node, epoch, call))
    }

    /// Applies parked call `id` and drops its answer (the caller crashed after the server
    /// acted); `applied: false` drops it unapplied (the caller crashed before sending).
    pub fn drop_call(&self, id: &CallKey, applied: bool) -> Option<(String, u64, Call)> {
        let mut state = self.lock();
        let Pending { node, epoch, call, .. } = state.pending.remove(id)?;
        if applied {
            let _ = Self::execute(&mut state, &node, &call);
        }
        Some((node, epoch, call))
    }

    /// Forgets every parked call of `node` (it crashed), unapplied.
    pub fn drop_calls_of(&self, node: &str) {
        self.lock().pending.retain(|_, p| p.node != node);
    }

    fn failed(call: &Call) -> Reply {
        let why = "the server answered 503 (injected)";
        match call {
            Call::ListNode(n) | Call::ListNetwork(n) => {
                Reply::Blocks(Err(api_error("list", n, why)))
            }
            Call::Create(b) => Reply::Created(Err(api_error(
                "create",
                b.metadata.name.as_deref().unwrap_or(""),
                why,
            ))),
            Call::Delete { name, .. } => Reply::Deleted(Err(api_error("delete", name, why))),
            Call::GetClaim { .. } => {
                Reply::Claim(Err(ReadError::Failed(cause(std::io::Error::other(why)))))
            }
        }
    }

    fn execute(state: &mut WorldState, node: &str, call: &Call) -> Reply {
        match call {
            Call::ListNode(of) => {
                state.counts.lists += 1;
                let found =
                    state.blocks.values().filter(|b| b.spec.node_name == *of).cloned().collect();
                Reply::Blocks(Ok(found))
            }
            Call::ListNetwork(net) => {
                state.counts.lists += 1;
                let found =
                    state.blocks.values().filter(|b| b.spec.pod_network == *net).cloned().collect();
                Reply::Blocks(Ok(found))
            }
            Call::Create(block) => {
                let name = block.metadata.name.clone().unwrap_or_default();
                if block.spec.node_name != node {
                    state.violations.push(format!(
                        "node {node} created IPBlock {name} naming node {}",
                        block.spec.node_name
                    ));
                }
                if let Some(existing) = state.blocks.get(&name) {
                    state.counts.conflicts += 1;
                    return Reply::Created(Ok(Created::Exists(existing.clone())));
                }
                state.counts.creates += 1;
                Reply::Created(Ok(Created::Created(Self::insert_block(state, (**block).clone()))))
            }
            Call::Delete { name, uid } => {
                state.counts.deletes += 1;
                let Some(existing) = state.blocks.get(name) else {
                    return Reply::Deleted(Ok(Deleted::Gone));
                };
                if existing.metadata.uid.as_deref() != Some(uid.as_str()) {
                    return Reply::Deleted(Ok(Deleted::NotOurs));
                }
                let provider =
                    state.networks.get(&existing.spec.pod_network).map(|n| n.spec.provider.clone());
                if provider.as_deref() != Some(super::DRIVER) && provider.is_some() {
                    state.violations.push(format!(
                        "node {node} deleted IPBlock {name} of network {} (provider {})",
                        existing.spec.pod_network,
                        provider.unwrap_or_default()
                    ));
                }
                if existing.spec.node_name != node {
                    state.violations.push(format!(
                        "node {node} deleted IPBlock {name} of node {}",
                        existing.spec.node_name
                    ));
                }
                state.blocks.remove(name);
                Reply::Deleted(Ok(Deleted::Deleted))
            }
            Call::GetClaim { namespace, name } => {
                state.counts.claim_gets += 1;
                let found = state.claims.get(&(namespace.clone(), name.clone())).cloned();
                Reply::Claim(found.ok_or(ReadError::NotFound))
            }
        }
    }
}

/// One node's connection to the world: every call goes through a gate.
#[derive(Debug, Clone)]
pub struct NodeApi {
    /// The world.
    pub world: World,
    /// The node.
    pub node: String,
    /// Its life.
    pub epoch: u64,
}

impl IpBlockApi for NodeApi {
    fn list_node(&self, node: &str) -> BoxFuture<'_, Result<Vec<IpBlock>, BlockApiError>> {
        let call = Call::ListNode(node.to_owned());
        Box::pin(async move {
            match self.world.gate(&self.node, self.epoch, call).await {
                Reply::Blocks(r) => r,
                _ => Err(api_error("list", node_of(&self.node), "wrong reply")),
            }
        })
    }

    fn list_network(&self, network: &str) -> BoxFuture<'_, Result<Vec<IpBlock>, BlockApiError>> {
        let call = Call::ListNetwork(network.to_owned());
        Box::pin(async move {
            match self.world.gate(&self.node, self.epoch, call).await {
                Reply::Blocks(r) => r,
                _ => Err(api_error("list", node_of(&self.node), "wrong reply")),
            }
        })
    }

    fn create(&self, block: IpBlock) -> BoxFuture<'_, Result<Created, BlockApiError>> {
        let call = Call::Create(Box::new(block));
        Box::pin(async move {
            match self.world.gate(&self.node, self.epoch, call).await {
                Reply::Created(r) => r,
                _ => Err(api_error("create", node_of(&self.node), "wrong reply")),
            }
        })
    }

    fn delete<'a>(
        &'a self,
        name: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Deleted, BlockApiError>> {
        let call = Call::Delete { name: name.to_owned(), uid: uid.to_owned() };
        Box::pin(async move {
            match self.world.gate(&self.node, self.epoch, call).await {
                Reply::Deleted(r) => r,
                _ => Err(api_error("delete", name, "wrong reply")),
            }
        })
    }
}

fn node_of(node: &str) -> &str {
    node
}

impl ClaimSource for NodeApi {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ReadError> {
        let call = Call::GetClaim { namespace: namespace.to_owned(), name: name.to_owned() };
        match self.world.gate(&self.node, self.epoch, call).await {
            Reply::Claim(r) => r,
            _ => Err(ReadError::NotFound),
        }
    }

    async fn pod_claim_names(
        &self,
        _namespace: &str,
        _pod: &str,
    ) -> Result<Option<Vec<String>>, ReadError> {
        Ok(None)
    }
}
