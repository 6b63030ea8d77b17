//! netclaim as a library: attach a macvlan with addresses and routes into a network namespace
//! (and detach it again), with no cluster, no kubelet and no NRI — the same plan and apply
//! steps the node daemon runs at RunPodSandbox and StopPodSandbox.
//!
//! ```text
//! attach_macvlan attach --parent eth1 --netns /run/netns/pod1 \
//!     --config '{"apiVersion":"netclaim.dev/v1alpha1","kind":"NetworkConfig",
//!                "interface":{"name":"net1"},"ipam":{"addresses":["10.0.0.2/24"]}}'
//! attach_macvlan detach --parent eth1 --netns /run/netns/pod1 --config '…the same…'
//! ```
//!
//! Runs as root in the netns that holds `--parent` (e.g. `ip netns exec node1 …`). The config
//! is a `NetworkConfig` (DESIGN §3) as a claim would carry it; the mode defaults to macvlan
//! bridge on a shared parent.

use std::path::PathBuf;
use std::process::ExitCode;

use netclaim::host::netlink::{HostNetlink, NetlinkOps};
use netclaim::model::network_config::{
    ConfigEntry, ConfigSource, DeviceFacts, DeviceKind, Sharing, resolve,
};
use netclaim::podnet::{
    AttachPlan, AttachRequest, HostDevice, PodNetns, VlanUsers, attach, detach, plan_attach,
};

/// The command line: `attach|detach --parent IF --netns PATH --config JSON`.
struct Args {
    detach: bool,
    parent: String,
    netns: PathBuf,
    config: serde_json::Value,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let detach = match args.next().as_deref() {
        Some("attach") => false,
        Some("detach") => true,
        other => return Err(format!("first argument: attach or detach, not {other:?}")),
    };
    let (mut parent, mut netns, mut config) = (None, None, None);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--parent" => parent = Some(value),
            "--netns" => netns = Some(PathBuf::from(value)),
            "--config" => {
                config = Some(serde_json::from_str(&value).map_err(|e| format!("--config: {e}"))?);
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(Args {
        detach,
        parent: parent.ok_or("--parent is required")?,
        netns: netns.ok_or("--netns is required")?,
        config: config.ok_or("--config is required")?,
    })
}

/// Plans the attach of `args` against the parent as the kernel shows it now.
async fn plan(host: &HostNetlink, args: &Args) -> Result<AttachPlan, String> {
    let links = host.links().await.map_err(|e| format!("listing host links: {e}"))?;
    let parent = links
        .iter()
        .find(|link| link.name == args.parent)
        .ok_or_else(|| format!("--parent: no link named {:?}", args.parent))?;
    let facts = DeviceFacts {
        sharing: Sharing::Shared,
        kind: DeviceKind::Virtual,
        if_name: parent.name.clone(),
        mtu: parent.mtu,
        min_mtu: 68,
        max_mtu: parent.mtu,
        pf_mtu: None,
        passthru_children: 0,
        other_children: 0,
        ipvlan_children: 0,
        rdma: None,
    };
    let entry = ConfigEntry {
        source: ConfigSource::Claim,
        requests: Vec::new(),
        parameters: args.config.clone(),
    };
    // What this kernel and build can attach, probed as the daemon does at start: a mode or
    // VLAN the node cannot attach is refused here rather than half-way through the apply.
    let kernel = tokio::task::spawn_blocking(netclaim::host::kernel_probe::probe)
        .await
        .map_err(|e| format!("probing the kernel: {e}"))?;
    let support = netclaim::podnet::plan::node_support(&kernel);
    let config =
        resolve(&[entry], "net", &facts, &support).map_err(|e| format!("--config: {e}"))?;
    let device = HostDevice {
        if_name: parent.name.clone(),
        kind: facts.kind,
        sharing: facts.sharing,
        mtu: parent.mtu,
        mac: parent.mac,
    };
    let pod = PodNetns { pod_uid: "example".to_owned(), path: args.netns.clone() };
    let name = config.interface.name.clone().unwrap_or_else(|| "net1".to_owned());
    plan_attach(&AttachRequest {
        claim_uid: "example-claim",
        config: &config,
        device: &device,
        pod: &pod,
        interface_name: &name,
        pool_addresses: &[],
    })
    .map_err(|e| format!("planning: {e}"))
}

async fn run(args: Args) -> Result<(), String> {
    let host = HostNetlink::current().map_err(|e| format!("netlink socket: {e}"))?;
    let plan = plan(&host, &args).await?;
    let vlans = VlanUsers::new();
    if args.detach {
        let ops = NetlinkOps::open_for_detach(&host, &args.netns)
            .await
            .map_err(|e| format!("--netns {}: {e}", args.netns.display()))?;
        let report = detach(&ops, &vlans, &plan).await;
        if !report.is_clean() {
            return Err(format!("detach left something behind: {report:?}"));
        }
        println!("detached {} from {}", plan.interface_name, args.netns.display());
        return Ok(());
    }
    let ops = NetlinkOps::open(&host, &args.netns)
        .await
        .map_err(|e| format!("--netns {}: {e}", args.netns.display()))?;
    // On failure the completed steps are already undone: nothing is left half-configured.
    let attached = attach(&ops, &vlans, &plan).await.map_err(|e| format!("attach: {e}"))?;
    let addresses: Vec<String> = attached.addresses.iter().map(ToString::to_string).collect();
    println!(
        "attached {} (mtu {}, mac {}) with {} in {}",
        attached.name,
        attached.mtu,
        attached.mac.map(|m| m.to_string()).unwrap_or_default(),
        addresses.join(", "),
        args.netns.display()
    );
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(why) => {
            eprintln!("attach_macvlan: {why}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("attach_macvlan: tokio runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("attach_macvlan: {why}");
            ExitCode::FAILURE
        }
    }
}
