//! Shared by the DaemonSet-in-containerd test: renders `kubectl kustomize deploy/base`, takes
//! the node DaemonSet's pod template apart the way kubelet does and builds the CRI
//! `PodSandboxConfig` and `ContainerConfig` from it, with each hostPath volume mapped to the
//! test's instance of that path (an explicit table: a volume the table does not know fails
//! the test), plus what kubelet itself adds to every container (the service-account token
//! volume, the termination-log file, `KUBERNETES_SERVICE_HOST/PORT`, the downward-API env).
//!
//! Also the two stand-ins the daemon talks to as it would on a node: a TLS front of the dev
//! API server (in-cluster config is HTTPS only), and kubelet's plugin watcher (GetInfo and
//! NotifyRegistrationStatus on the registration socket).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use netclaim::dev::cri::proto;
use netclaim::kubelet::proto::pluginregistration::{
    self as reg, InfoRequest, PluginInfo, RegistrationStatus,
};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream, UnixStream};

use super::repo;

/// The `netclaim-node` DaemonSet as `kubectl kustomize deploy/base` renders it.
pub fn rendered_node_daemonset() -> Value {
    super::kustomize::kustomize(&repo().join("deploy/base"))
        .into_iter()
        .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == "netclaim-node")
        .expect("deploy/base renders the netclaim-node DaemonSet")
}

/// A change to the rendered manifest, as a broken manifest would have it.
#[derive(Debug, Clone, Copy)]
#[allow(clippy::enum_variant_names, reason = "each variant names what it removes")]
pub enum Mutation {
    /// The container's volumeMount of this volume removed.
    RemoveVolumeMount(&'static str),
    /// This capability removed from `securityContext.capabilities.add`.
    RemoveCapability(&'static str),
    /// `mountPropagation` removed from the volumeMount of this volume (private).
    RemovePropagation(&'static str),
}

/// Applies `mutation` to the DaemonSet's only container; fails if there was nothing to change
/// (a mutation that changes nothing proves nothing).
pub fn mutate(daemonset: &mut Value, mutation: Mutation) {
    let container = &mut daemonset["spec"]["template"]["spec"]["containers"][0];
    let changed = match mutation {
        Mutation::RemoveVolumeMount(volume) => {
            let mounts = container["volumeMounts"].as_array_mut().unwrap();
            let before = mounts.len();
            mounts.retain(|m| m["name"] != volume);
            mounts.len() != before
        }
        Mutation::RemoveCapability(capability) => {
            let added = container["securityContext"]["capabilities"]["add"].as_array_mut().unwrap();
            let before = added.len();
            added.retain(|c| c != capability);
            added.len() != before
        }
        Mutation::RemovePropagation(volume) => container["volumeMounts"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|m| m["name"] == volume)
            .and_then(|m| m.as_object_mut().unwrap().remove("mountPropagation"))
            .is_some(),
    };
    assert!(changed, "{mutation:?} changes nothing in the rendered DaemonSet");
}

/// Where the test's instance of a node path is. Keyed by the hostPath the manifest names;
/// each entry says why the test may (or must) use another path for it.
#[derive(Debug)]
pub struct HostPathMap {
    entries: BTreeMap<String, PathBuf>,
}

impl HostPathMap {
    pub fn new(entries: impl IntoIterator<Item = (&'static str, PathBuf)>) -> Self {
        Self { entries: entries.into_iter().map(|(k, v)| (k.to_owned(), v)).collect() }
    }

    /// The test's path for the manifest's `host_path`; fails naming a path the table lacks
    /// (a new volume in the manifest must be given a test instance here, deliberately).
    fn resolve(&self, volume: &str, host_path: &str) -> PathBuf {
        self.entries.get(host_path).cloned().unwrap_or_else(|| {
            panic!(
                "volume {volume}: hostPath {host_path} has no test instance in the map {:?}",
                self.entries.keys()
            )
        })
    }
}

/// What kubelet knows that the manifest does not: the pod's identity and node, the API
/// server's service address, where it keeps the pod's files.
#[derive(Debug)]
pub struct KubeletContext {
    pub pod_name: String,
    pub pod_namespace: String,
    pub pod_uid: String,
    pub node_name: String,
    /// `KUBERNETES_SERVICE_HOST` / `_PORT`: the `kubernetes` Service, here the TLS front.
    pub api_host: String,
    pub api_port: u16,
    /// The service-account volume's files (token, ca.crt, namespace).
    pub service_account_dir: PathBuf,
    /// kubelet's per-pod dir (`/var/lib/kubelet/pods/<uid>`): termination-log files.
    pub pod_dir: PathBuf,
    /// `/var/log/pods/<ns>_<name>_<uid>`.
    pub log_dir: PathBuf,
}

/// kubelet's defaults for `procMount: Default` (pkg/securitycontext): the paths masked and
/// read-only in every unprivileged container.
const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
const DEFAULT_READONLY_PATHS: &[&str] =
    &["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];
/// kubelet's `oom_score_adj` for node-critical pods (pkg/kubelet/qos).
const CRITICAL_OOM_SCORE_ADJ: i64 = -997;

/// The sandbox kubelet asks for: host network when `hostNetwork`, host PID when `hostPID`,
/// no DNS config (kubelet without `clusterDNS` falls back to the node's resolv.conf).
pub fn sandbox_config(template: &Value, ctx: &KubeletContext) -> proto::PodSandboxConfig {
    let spec = &template["spec"];
    let host = |field: &str| spec[field].as_bool().unwrap_or(false);
    let mode = |on: bool, off: proto::NamespaceMode| {
        if on { proto::NamespaceMode::Node } else { off }
    };
    assert!(!host("hostIPC"), "hostIPC is not mapped by this test");
    std::fs::create_dir_all(&ctx.log_dir).unwrap();
    let labels = template["metadata"]["labels"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned())).collect())
        .unwrap_or_default();
    proto::PodSandboxConfig {
        metadata: Some(proto::PodSandboxMetadata {
            name: ctx.pod_name.clone(),
            uid: ctx.pod_uid.clone(),
            namespace: ctx.pod_namespace.clone(),
            attempt: 0,
        }),
        // A host-network sandbox has the node's UTS namespace: no hostname of its own.
        hostname: if host("hostNetwork") { String::new() } else { ctx.pod_name.clone() },
        log_directory: ctx.log_dir.display().to_string(),
        labels,
        linux: Some(proto::LinuxPodSandboxConfig {
            security_context: Some(proto::LinuxSandboxSecurityContext {
                namespace_options: Some(proto::NamespaceOption {
                    network: mode(host("hostNetwork"), proto::NamespaceMode::Pod).into(),
                    pid: mode(host("hostPID"), proto::NamespaceMode::Container).into(),
                    ipc: proto::NamespaceMode::Pod.into(),
                    target_id: String::new(),
                }),
                privileged: false,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// One mount of the container config and where it came from.
#[derive(Debug, Clone)]
pub struct MountRecord {
    /// The volume's name, or `kubelet:<what>` for kubelet's own.
    pub source: String,
    pub mount: proto::Mount,
}

/// A Kubernetes quantity (`50m`, `64Mi`, `1G`, `2`) in its base unit times `scale`
/// (`scale` 1000 for CPU millicores, 1 for bytes).
pub fn quantity(text: &str, scale: i64) -> i64 {
    let suffixes: [(&str, i64); 10] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("m", -1),
        ("", 1),
    ];
    let (number, factor) = suffixes
        .iter()
        .find_map(|(s, f)| text.strip_suffix(s).map(|n| (n, *f)))
        .expect("some suffix matches (the empty one always does)");
    let number: i64 = number.parse().unwrap_or_else(|e| panic!("quantity {text:?}: {e}"));
    if factor == -1 { number * scale / 1000 } else { number * factor * scale }
}

/// The container config kubelet builds for the template's only container, and the mounts
/// with their sources. `extra_args` are appended to the manifest's args (the site's device
/// selection, which the base leaves to the cluster).
#[allow(
    clippy::too_many_lines,
    reason = "one field of the CRI config after the other, as kubelet fills it"
)]
pub fn container_config(
    template: &Value,
    ctx: &KubeletContext,
    paths: &HostPathMap,
    extra_args: &[String],
) -> (proto::ContainerConfig, Vec<MountRecord>) {
    let spec = &template["spec"];
    let containers = spec["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "one container in the node DaemonSet");
    assert!(spec["initContainers"].is_null(), "init containers are not mapped by this test");
    let container = &containers[0];
    let name = container["name"].as_str().unwrap().to_owned();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
            .unwrap_or_default()
    };

    // Env: literal values, and the downward API fields kubelet resolves; then the service
    // environment kubelet adds for the `kubernetes` Service.
    let mut envs = Vec::new();
    for entry in container["env"].as_array().into_iter().flatten() {
        let key = entry["name"].as_str().unwrap().to_owned();
        let value = if let Some(value) = entry["value"].as_str() {
            value.to_owned()
        } else if let Some(path) = entry["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            match path {
                "spec.nodeName" => ctx.node_name.clone(),
                "metadata.name" => ctx.pod_name.clone(),
                "metadata.namespace" => ctx.pod_namespace.clone(),
                "metadata.uid" => ctx.pod_uid.clone(),
                other => panic!("env {key}: fieldPath {other} is not mapped by this test"),
            }
        } else {
            panic!("env {key}: {entry} is not mapped by this test");
        };
        envs.push(proto::KeyValue { key, value });
    }
    for (key, value) in [
        ("KUBERNETES_SERVICE_HOST", ctx.api_host.clone()),
        ("KUBERNETES_SERVICE_PORT", ctx.api_port.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS", ctx.api_port.to_string()),
    ] {
        envs.push(proto::KeyValue { key: key.to_owned(), value });
    }

    // Mounts: every volumeMount is a hostPath volume with a test instance.
    let volumes: BTreeMap<&str, &Value> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| (v["name"].as_str().unwrap(), v))
        .collect();
    let mut mounts = Vec::new();
    for volume_mount in container["volumeMounts"].as_array().into_iter().flatten() {
        let volume_name = volume_mount["name"].as_str().unwrap();
        assert!(volume_mount["subPath"].is_null(), "{volume_name}: subPath is not mapped");
        let volume = volumes
            .get(volume_name)
            .unwrap_or_else(|| panic!("volumeMount {volume_name} names no volume"));
        let host_path = volume["hostPath"]["path"]
            .as_str()
            .unwrap_or_else(|| panic!("volume {volume_name} is not a hostPath volume: {volume}"));
        let on_host = paths.resolve(volume_name, host_path);
        match volume["hostPath"]["type"].as_str().unwrap_or("") {
            "DirectoryOrCreate" => std::fs::create_dir_all(&on_host).unwrap(),
            "Directory" => assert!(
                on_host.is_dir(),
                "volume {volume_name}: type Directory, but {} is no directory (kubelet would \
                 not start the pod)",
                on_host.display()
            ),
            other => panic!("volume {volume_name}: hostPath type {other:?} is not mapped"),
        }
        let propagation = match volume_mount["mountPropagation"].as_str() {
            None | Some("None") => proto::MountPropagation::PropagationPrivate,
            Some("HostToContainer") => proto::MountPropagation::PropagationHostToContainer,
            Some("Bidirectional") => proto::MountPropagation::PropagationBidirectional,
            Some(other) => panic!("{volume_name}: mountPropagation {other}"),
        };
        mounts.push(MountRecord {
            source: volume_name.to_owned(),
            mount: proto::Mount {
                container_path: volume_mount["mountPath"].as_str().unwrap().to_owned(),
                host_path: on_host.display().to_string(),
                readonly: volume_mount["readOnly"].as_bool().unwrap_or(false),
                selinux_relabel: false,
                propagation: propagation.into(),
            },
        });
    }
    // kubelet's own: the service-account token volume (automountServiceAccountToken is on
    // unless the pod or its ServiceAccount turn it off), and the termination-log file.
    if spec["automountServiceAccountToken"].as_bool() != Some(false) {
        mounts.push(MountRecord {
            source: "kubelet:kube-api-access".to_owned(),
            mount: proto::Mount {
                container_path: "/var/run/secrets/kubernetes.io/serviceaccount".to_owned(),
                host_path: ctx.service_account_dir.display().to_string(),
                readonly: true,
                ..Default::default()
            },
        });
    }
    let termination_log = ctx.pod_dir.join(format!("containers/{name}/termination-log"));
    std::fs::create_dir_all(termination_log.parent().unwrap()).unwrap();
    std::fs::write(&termination_log, "").unwrap();
    mounts.push(MountRecord {
        source: "kubelet:termination-log".to_owned(),
        mount: proto::Mount {
            container_path: container["terminationMessagePath"]
                .as_str()
                .unwrap_or("/dev/termination-log")
                .to_owned(),
            host_path: termination_log.display().to_string(),
            ..Default::default()
        },
    });

    // Security context: as written; kubelet adds its default masked and read-only paths.
    let security = &container["securityContext"];
    assert!(spec["securityContext"].as_object().is_none_or(serde_json::Map::is_empty));
    let seccomp = match security["seccompProfile"]["type"].as_str() {
        Some("RuntimeDefault") => Some(proto::SecurityProfile {
            profile_type: proto::security_profile::ProfileType::RuntimeDefault.into(),
            localhost_ref: String::new(),
        }),
        Some("Unconfined") | None => Some(proto::SecurityProfile {
            profile_type: proto::security_profile::ProfileType::Unconfined.into(),
            localhost_ref: String::new(),
        }),
        Some(other) => panic!("seccompProfile {other} is not mapped"),
    };
    let privileged = security["privileged"].as_bool().unwrap_or(false);
    let security_context = proto::LinuxContainerSecurityContext {
        capabilities: Some(proto::Capability {
            add_capabilities: strings(&security["capabilities"]["add"]),
            drop_capabilities: strings(&security["capabilities"]["drop"]),
            add_ambient_capabilities: Vec::new(),
        }),
        privileged,
        namespace_options: Some(proto::NamespaceOption {
            network: if spec["hostNetwork"].as_bool() == Some(true) {
                proto::NamespaceMode::Node
            } else {
                proto::NamespaceMode::Pod
            }
            .into(),
            pid: if spec["hostPID"].as_bool() == Some(true) {
                proto::NamespaceMode::Node
            } else {
                proto::NamespaceMode::Container
            }
            .into(),
            ipc: proto::NamespaceMode::Pod.into(),
            target_id: String::new(),
        }),
        run_as_user: security["runAsUser"].as_i64().map(|value| proto::Int64Value { value }),
        readonly_rootfs: security["readOnlyRootFilesystem"].as_bool().unwrap_or(false),
        // kubelet sets no_new_privs only for allowPrivilegeEscalation: false.
        no_new_privs: security["allowPrivilegeEscalation"].as_bool() == Some(false),
        masked_paths: if privileged {
            Vec::new()
        } else {
            DEFAULT_MASKED_PATHS.iter().map(|p| (*p).to_owned()).collect()
        },
        readonly_paths: if privileged {
            Vec::new()
        } else {
            DEFAULT_READONLY_PATHS.iter().map(|p| (*p).to_owned()).collect()
        },
        seccomp,
    };
    let resources = &container["resources"];
    let cpu_request = resources["requests"]["cpu"].as_str().map_or(0, |q| quantity(q, 1000));
    let memory_limit = resources["limits"]["memory"].as_str().map_or(0, |q| quantity(q, 1));
    let critical = matches!(
        spec["priorityClassName"].as_str(),
        Some("system-node-critical" | "system-cluster-critical")
    );
    let resources = proto::LinuxContainerResources {
        cpu_period: 100_000,
        // No CPU limit: no quota. Shares from the request as kubelet computes them.
        cpu_quota: 0,
        cpu_shares: (cpu_request * 1024 / 1000).max(2),
        memory_limit_in_bytes: memory_limit,
        oom_score_adj: if critical { CRITICAL_OOM_SCORE_ADJ } else { 0 },
    };
    let log_path = format!("{name}/0.log");
    std::fs::create_dir_all(ctx.log_dir.join(&name)).unwrap();
    let mut args = strings(&container["args"]);
    args.extend(extra_args.iter().cloned());
    let config = proto::ContainerConfig {
        metadata: Some(proto::ContainerMetadata { name: name.clone(), attempt: 0 }),
        image: Some(proto::ImageSpec { image: container["image"].as_str().unwrap().to_owned() }),
        command: strings(&container["command"]),
        args,
        working_dir: container["workingDir"].as_str().unwrap_or("").to_owned(),
        envs,
        mounts: mounts.iter().map(|m| m.mount.clone()).collect(),
        log_path,
        linux: Some(proto::LinuxContainerConfig {
            resources: Some(resources),
            security_context: Some(security_context),
        }),
        ..Default::default()
    };
    (config, mounts)
}

/// The port a probe's `httpGet.port` names: a number, or the name of a container port.
pub fn probe_port(container: &Value, probe: &str) -> (String, u16) {
    let get = &container[probe]["httpGet"];
    let path = get["path"].as_str().unwrap().to_owned();
    let port = match &get["port"] {
        Value::Number(n) => u16::try_from(n.as_u64().unwrap()).unwrap(),
        Value::String(name) => {
            let port = container["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == name.as_str())
                .and_then(|p| p["containerPort"].as_u64());
            u16::try_from(port.unwrap_or_else(|| panic!("{probe}: no container port {name}")))
                .unwrap()
        }
        other => panic!("{probe}: port {other}"),
    };
    (path, port)
}

/// An HTTP GET as kubelet's prober sends it; the status code, or the error.
pub async fn http_get(port: u16, path: &str) -> Result<u16, String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream =
        TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| format!("connect: {e}"))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: kube-probe/1.36\r\n\
         Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.map_err(|e| format!("write: {e}"))?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.map_err(|e| format!("read: {e}"))?;
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no status line in {response:?}"))
}

/// A cluster CA and the API server's certificate for `127.0.0.1` signed by it (openssl), as
/// `(CA PEM, cert PEM, key PEM)` paths. Two certificates, not one self-signed: rustls (the
/// daemon's TLS) refuses a CA certificate as the server's own.
pub fn serving_certificate(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let file = |name: &str| dir.join(name);
    let openssl = |args: &[&str]| {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("running openssl (Debian package openssl)");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    openssl(
        &[&["req", "-x509"], &ec[..], &["-days", "1", "-subj", "/CN=netclaim-test-ca"]]
            .concat()
            .into_iter()
            .chain(["-keyout", "ca.key", "-out", "ca.crt"])
            .collect::<Vec<_>>(),
    );
    openssl(
        &[&["req"], &ec[..], &["-subj", "/CN=kube-apiserver"]]
            .concat()
            .into_iter()
            .chain(["-keyout", "apiserver.key", "-out", "apiserver.csr"])
            .collect::<Vec<_>>(),
    );
    std::fs::write(
        file("apiserver.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:kubernetes.default.svc\nbasicConstraints=CA:FALSE\n\
         extendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "apiserver.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "apiserver.ext",
        "-out",
        "apiserver.crt",
    ]);
    (file("ca.crt"), file("apiserver.crt"), file("apiserver.key"))
}

/// A TLS listener on `127.0.0.1:0` forwarding each connection to `backend` (the plain-HTTP
/// dev API server), as the `kubernetes` Service's HTTPS endpoint. Returns its port; the
/// task ends with the test's runtime.
pub async fn tls_front(cert: &Path, key: &Path, backend: String) -> u16 {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject as _;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(cert).unwrap().map(Result::unwrap).collect();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((inbound, _)) = listener.accept().await else { return };
            let acceptor = acceptor.clone();
            let backend = backend.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(inbound).await else { return };
                let Ok(mut outbound) = TcpStream::connect(&backend).await else { return };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut outbound).await;
            });
        }
    });
    port
}

/// A tonic channel over a Unix socket.
async fn unix_channel(path: &Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_owned();
    tonic::transport::Endpoint::try_from("http://localhost")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
}

/// kubelet's plugin watcher for one socket: `GetInfo`, then `NotifyRegistrationStatus`
/// (registered). Returns the plugin's info, or why it failed.
pub async fn register(socket: &Path) -> Result<PluginInfo, String> {
    let channel = unix_channel(socket).await.map_err(|e| format!("connect: {e}"))?;
    let mut client = reg::registration_client::RegistrationClient::new(channel);
    let info =
        client.get_info(InfoRequest {}).await.map_err(|e| format!("GetInfo: {e}"))?.into_inner();
    client
        .notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .map_err(|e| format!("NotifyRegistrationStatus: {e}"))?;
    Ok(info)
}

/// The messages of a container's CRI log file (`<time> <stream> <tag> <message>` lines).
pub fn cri_log_messages(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| line.splitn(4, ' ').nth(3).unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n")
}
