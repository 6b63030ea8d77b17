//! The dev kubelet of `netclaim dev` (DESIGN §8): turns the Pods of its node into claims,
//! prepared resources and pod sandboxes, and reports Pod status.
//!
//! For each Pod (bound to the node, or unbound when the cluster has one node: the kubelet then
//! binds it; with several nodes the allocator binds pods): claims from
//! `resourceClaimTemplateName` entries are created like the
//! resourceclaim controller does ([`pod_claims`]) and recorded in
//! `status.resourceClaimStatuses`; once the allocator has allocated every claim, the Pod is
//! added to their `reservedFor`, `NodePrepareResources` is called over the driver's real DRA
//! socket ([`dra_client`]), and the sandbox runs ([`sandbox`]): a bare network namespace
//! announced over the in-process NRI runtime (then `CreateContainer` for each container, which
//! the plugin may refuse), or a real sandbox through CRI, whose containers get the CDI devices
//! the driver returned for the claims they use ([`cdi`]), as kubelet passes them, when the
//! runtime reads the driver's CDI spec dir. Status goes `Pending` → `Running`, or
//! `Failed` with a condition naming the failing step ([`pod_status`]); errors are retried with
//! backoff (waits, e.g. for allocation, are not errors) and become Warning Events on the Pod.
//!
//! A Pod being deleted (the API server sets `deletionTimestamp` on bound pods) is torn down in
//! reverse: sandbox stopped and removed (netns too), `NodeUnprepareResources`, claims
//! unreserved, generated claims deleted (the dev API server has no garbage collector), then
//! the Pod is deleted for good. On shutdown every pod is torn down the same way, so nothing is
//! left on the host. Work on pods runs in parallel, bounded by a semaphore.

pub mod cdi;
pub mod dra_client;
pub mod pod_claims;
pub mod pod_status;
pub mod sandbox;

mod worker;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::PostParams;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::{Semaphore, watch};

use self::dra_client::{DraClient, DraClientError};
use self::sandbox::SandboxBackend;
use self::worker::{Context, Desired, worker};

/// `reportingController` of the dev kubelet's Events.
const REPORTER: &str = "netclaim-dev-kubelet";
/// Per-call timeout of DRA calls (kubelet uses 45 s; the dev driver is local).
const DRA_TIMEOUT: Duration = Duration::from_secs(30);
/// How long shutdown waits for pods to be torn down.
const SHUTDOWN_LIMIT: Duration = Duration::from_mins(1);

/// Settings of the dev kubelet.
#[derive(Debug, Clone)]
pub struct DevKubeletConfig {
    /// The node it runs.
    pub node_name: String,
    /// The driver's DRA socket (`<plugin-dir>/dra.sock`).
    pub dra_socket: PathBuf,
    /// Where sandboxes run.
    pub backend: SandboxBackend,
    /// Most pods set up or torn down at once.
    pub max_parallel: usize,
    /// Failed attempts of a step before the pod is `Failed`.
    pub max_attempts: u32,
    /// Bind pods without `spec.nodeName` to this node (the one node of a one-node cluster);
    /// with several nodes the allocator places pods and each kubelet runs only its own.
    pub bind_unbound_pods: bool,
}

impl DevKubeletConfig {
    /// Defaults: 8 pods in parallel, 5 attempts, unbound pods bound to this node.
    #[must_use]
    pub fn new(node_name: &str, dra_socket: PathBuf, backend: SandboxBackend) -> Self {
        Self {
            node_name: node_name.to_owned(),
            dra_socket,
            backend,
            max_parallel: 8,
            max_attempts: 5,
            bind_unbound_pods: true,
        }
    }
}

/// Errors of the dev kubelet that stop it.
#[derive(Debug, thiserror::Error)]
pub enum DevKubeletError {
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        /// What we were doing.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The DRA client could not be built.
    #[error(transparent)]
    Dra(#[from] DraClientError),
}

/// A pod's sandbox as the dev kubelet runs it (for the demo, which pings from inside it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningSandbox {
    /// `namespace/name` of the Pod.
    pub pod: String,
    /// Sandbox ID.
    pub id: String,
    /// The pod's network namespace.
    pub netns_path: Option<PathBuf>,
}

/// The sandboxes that run now, by Pod UID. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Sandboxes(Arc<Mutex<BTreeMap<String, RunningSandbox>>>);

impl Sandboxes {
    /// The sandbox of the Pod with `uid`.
    #[must_use]
    pub fn get(&self, uid: &str) -> Option<RunningSandbox> {
        self.lock().get(uid).cloned()
    }

    /// How many sandboxes run.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none runs.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, RunningSandbox>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Creates (or keeps) the Node object the node daemon and the allocator refer to, Ready.
pub async fn register_node(client: &Client, node_name: &str) -> Result<Node, DevKubeletError> {
    let nodes: Api<Node> = Api::all(client.clone());
    if let Some(node) = nodes.get_opt(node_name).await.map_err(|source| DevKubeletError::Api {
        action: format!("get node {node_name}"),
        source,
    })? {
        return Ok(node);
    }
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node_name, "labels": {
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
        }},
        "status": {"conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "netclaim dev kubelet is posting ready status",
        }]},
    }))
    .map_err(|e| DevKubeletError::Api {
        action: "building the Node".to_owned(),
        source: kube::Error::SerdeError(e),
    })?;
    nodes.create(&PostParams::default(), &node).await.map_err(|source| DevKubeletError::Api {
        action: format!("create node {node_name}"),
        source,
    })
}

/// The dev kubelet.
pub struct DevKubelet {
    context: Arc<Context>,
}

impl DevKubelet {
    /// A kubelet for `config.node_name` talking to the API through `client`.
    pub fn new(client: Client, config: DevKubeletConfig) -> Result<Self, DevKubeletError> {
        let dra = DraClient::connect_lazy(&config.dra_socket, DRA_TIMEOUT)?;
        let reporter =
            Reporter { controller: REPORTER.to_owned(), instance: Some(config.node_name.clone()) };
        let context = Context {
            recorder: Recorder::new(client.clone(), reporter),
            limit: Semaphore::new(config.max_parallel.max(1)),
            client,
            config,
            dra,
            sandboxes: Sandboxes::default(),
        };
        Ok(Self { context: Arc::new(context) })
    }

    /// The sandboxes this kubelet runs (live view).
    #[must_use]
    pub fn sandboxes(&self) -> Sandboxes {
        self.context.sandboxes.clone()
    }

    /// Runs until `shutdown` completes, then tears every pod down before returning.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let pods: Api<Pod> = Api::all(self.context.client.clone());
        let mut config = watcher::Config::default();
        if !self.context.config.bind_unbound_pods {
            // Only this node's pods, as kubelet watches (`spec.nodeName=<node>`): with N
            // nodes every kubelet watching every pod made each pod write cost N decodes, a
            // pod is seen once bound, and unbinding is not a thing.
            config = config.fields(&format!("spec.nodeName={}", self.context.config.node_name));
        }
        let stream = watcher(pods, config).default_backoff();
        tokio::pin!(stream);
        tokio::pin!(shutdown);
        let mut workers: HashMap<String, (watch::Sender<Desired>, tokio::task::JoinHandle<()>)> =
            HashMap::new();
        let mut listed: Option<Vec<String>> = None;
        loop {
            let event = tokio::select! {
                () = &mut shutdown => break,
                event = stream.next() => event,
            };
            workers.retain(|_, (_, task)| !task.is_finished());
            match event {
                None => break,
                Some(Err(err)) => tracing::debug!(%err, "pod watch error (retrying)"),
                Some(Ok(watcher::Event::Init)) => listed = Some(Vec::new()),
                Some(Ok(watcher::Event::InitDone)) => {
                    let seen = listed.take().unwrap_or_default();
                    for (uid, (sender, _)) in &workers {
                        if !seen.contains(uid) {
                            sender.send_replace(Desired::Gone);
                        }
                    }
                }
                Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => {
                    let Some(uid) = pod.metadata.uid.clone() else { continue };
                    if let Some(seen) = listed.as_mut() {
                        seen.push(uid.clone());
                    }
                    let node = pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_name.as_deref())
                        .filter(|n| !n.is_empty());
                    let ours = match node {
                        Some(node) => node == self.context.config.node_name,
                        None => self.context.config.bind_unbound_pods,
                    };
                    if !ours {
                        continue;
                    }
                    if let Some((sender, _)) = workers.get(&uid) {
                        sender.send_replace(Desired::Pod(Box::new(pod)));
                    } else {
                        // A pod first seen while being deleted gets a worker too: it has
                        // nothing to tear down and finishes the deletion, as kubelet does.
                        let (sender, receiver) = watch::channel(Desired::Pod(Box::new(pod)));
                        let task = tokio::spawn(worker(Arc::clone(&self.context), receiver));
                        workers.insert(uid, (sender, task));
                    }
                }
                Some(Ok(watcher::Event::Delete(pod))) => {
                    if let Some(uid) = pod.metadata.uid.as_deref()
                        && let Some((sender, _)) = workers.get(uid)
                    {
                        sender.send_replace(Desired::Gone);
                    }
                }
            }
        }
        for (sender, _) in workers.values() {
            sender.send_replace(Desired::Shutdown);
        }
        let all = futures::future::join_all(workers.into_values().map(|(_, task)| task));
        if tokio::time::timeout(SHUTDOWN_LIMIT, all).await.is_err() {
            tracing::warn!("some pods were not torn down within {SHUTDOWN_LIMIT:?}");
        }
    }
}
