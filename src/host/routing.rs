//! `podnet::RoutingPort` over rtnetlink and `/proc/sys` (decision 0020): rules and table
//! routes on the pod socket, VRF devices, enslaving, and the interface's sysctls.
//!
//! Which path each sysctl takes:
//! - `net.ipv4.conf.<if>.*` (but `forwarding`): one `RTM_NEWLINK` on the pod socket with
//!   `IFLA_AF_SPEC` → `AF_INET` → `IFLA_INET_CONF`, one `IPV4_DEVCONF_*` attribute per key
//!   (`inet_set_link_af`; `inet_validate_link_af` refuses an id the kernel does not know with
//!   `EINVAL`). No thread. netlink-packet-route's `DevConfRequest` leaves out every zero value
//!   (so `rp_filter: 0` could not be sent), so the nested attributes are built here.
//! - `net.ipv4.conf.<if>.forwarding`: `/proc/sys`, because its handler also turns LRO off on
//!   the device (`devinet_sysctl_forward` → `dev_disable_lro`), which the netlink path skips.
//! - `net.ipv6.conf.<if>.*`: `/proc/sys` only: `inet6_set_link_af` accepts only the token and
//!   the address generation mode, not `IFLA_INET6_CONF`.
//! - `net.ipv{4,6}.neigh.<if>.*`: `/proc/sys`. `RTM_SETNEIGHTBL` with `NDTA_PARMS` /
//!   `NDTPA_IFINDEX` could set them, but its attributes are in other units than the sysctl
//!   names (milliseconds for `base_reachable_time` in seconds, jiffies behind `retrans_time`)
//!   and the thread is there anyway for IPv6.
//! - `net.ipv4.{tcp,udp}_l3mdev_accept`: `/proc/sys` (netns-wide, no netlink).
//!
//! `/proc/sys/net` shows the network namespace of the task that opens it, so the writes run on
//! a thread of their own that entered the pod netns first (and ends with the writes).

use std::fs::File;
use std::io::Write as _;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::PathBuf;

use futures::TryStreamExt;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::link::{
    AfSpecInet, AfSpecUnspec, InfoData, InfoVrf, LinkAttribute, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{RouteAttribute, RouteHeader};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::packet_core::{DefaultNla, Emitable, NLA_F_NESTED};
use rtnetlink::{LinkUnspec, LinkVrf};

use super::netlink::{NetlinkOps, op_error, route_message};
use crate::model::network_config::{Sysctl, SysctlFamily};
use crate::podnet::plan::{SourceRule, TableRoute};
use crate::podnet::ports::{LinkOpError, RoutingPort, Side, VrfState};

/// `IFLA_INET_CONF` inside the `AF_INET` part of `IFLA_AF_SPEC`.
const IFLA_INET_CONF: u16 = 1;

pub(super) fn rule_message(rule: &SourceRule) -> RuleMessage {
    let mut message = RuleMessage::default();
    message.header.family = match rule.from {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    message.header.src_len = if rule.from.is_ipv4() { 32 } else { 128 };
    // An unset action makes every lookup through the rule fail (`fib4_rule_action` answers
    // EINVAL for anything but the known actions), so it is set: look the table up.
    message.header.action = RuleAction::ToTable;
    message.header.table = u8::try_from(rule.table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC);
    message.attributes.push(RuleAttribute::Source(rule.from));
    message.attributes.push(RuleAttribute::Table(rule.table));
    message.attributes.push(RuleAttribute::Priority(rule.priority));
    message
}

pub(super) fn table_route_message(
    index: u32,
    route: &TableRoute,
) -> netlink_packet_route::route::RouteMessage {
    let mut message = route_message(index, &route.route);
    message.header.table = u8::try_from(route.table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC);
    message.attributes.push(RouteAttribute::Table(route.table));
    message
}

/// The `/proc/sys` file of a setting.
fn proc_path(sysctl: &Sysctl, if_name: &str) -> PathBuf {
    let mut path = PathBuf::from("/proc/sys");
    for part in sysctl.family.prefix().split('.') {
        path.push(part);
    }
    if sysctl.family != SysctlFamily::Ipv4Netns {
        // Interface names may hold dots; /proc keeps them in the directory name.
        path.push(if_name);
    }
    path.push(&sysctl.attribute);
    path
}

/// The `IFLA_INET_CONF` attributes of `settings`, nested: one `u32` per devconf id.
fn inet_conf(settings: &[(u16, u32)]) -> LinkAttribute {
    let mut nested = Vec::new();
    for (id, value) in settings {
        let nla = DefaultNla::new(*id, value.to_ne_bytes().to_vec());
        let start = nested.len();
        nested.resize(start + nla.buffer_len(), 0);
        nla.emit(&mut nested[start..]);
    }
    let conf = DefaultNla::new(IFLA_INET_CONF | NLA_F_NESTED, nested);
    LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet(vec![AfSpecInet::Other(conf)])])
}

/// A `/proc/sys` write: path, key (for errors), value.
pub(super) type ProcWrite = (PathBuf, String, String);

/// The two parts of setting `sysctls` on pod link `index` named `if_name`: the
/// `IFLA_INET_CONF` message (with its op name for errors), if any setting takes that path, and
/// the `/proc/sys` writes (path, key, value) of the others, in order.
pub(super) fn sysctl_parts(
    index: u32,
    if_name: &str,
    sysctls: &[Sysctl],
) -> (Option<(LinkMessage, String)>, Vec<ProcWrite>) {
    let devconf: Vec<(u16, u32)> = sysctls.iter().filter_map(Sysctl::inet_devconf).collect();
    let inet = (!devconf.is_empty()).then(|| {
        let mut message = LinkUnspec::new_with_index(index).build();
        message.attributes.push(inet_conf(&devconf));
        let keys: Vec<String> =
            sysctls.iter().filter(|s| s.inet_devconf().is_some()).map(|s| s.key(if_name)).collect();
        (message, format!("RTM_NEWLINK IFLA_INET_CONF {}", keys.join(", ")))
    });
    let writes = sysctls
        .iter()
        .filter(|s| s.inet_devconf().is_none())
        .map(|s| (proc_path(s, if_name), s.key(if_name), s.value.clone()))
        .collect();
    (inet, writes)
}

/// Writes `writes` (path, key, value) on a thread that entered `netns` first.
pub(super) async fn write_proc(
    netns: &File,
    writes: Vec<(PathBuf, String, String)>,
) -> Result<(), LinkOpError> {
    let netns = netns
        .try_clone()
        .map_err(|source| LinkOpError::Netns { path: "the pod netns".to_owned(), source })?;
    let (sender, receiver) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("netns-sysctl".to_owned())
        .spawn(move || {
            let result = (|| -> Result<(), LinkOpError> {
                nix::sched::setns(netns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).map_err(
                    |errno| LinkOpError::Netns {
                        path: "the pod netns".to_owned(),
                        source: errno.into(),
                    },
                )?;
                for (path, key, value) in writes {
                    let written = std::fs::OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .and_then(|mut file| file.write_all(value.as_bytes()));
                    if let Err(err) = written {
                        let errno = err.raw_os_error().unwrap_or(0);
                        return Err(LinkOpError::Kernel {
                            op: format!("sysctls[{key:?}] = {value} ({})", path.display()),
                            side: Side::Pod,
                            errno,
                            message: err.to_string(),
                        });
                    }
                }
                Ok(())
            })();
            // The receiver only goes away when the caller was cancelled.
            let _ignored = sender.send(result);
            // The thread ends here, with its netns.
        })
        .map_err(|source| LinkOpError::Netns { path: "the pod netns".to_owned(), source })?;
    receiver.await.map_err(|_| LinkOpError::Netns {
        path: "the pod netns".to_owned(),
        source: std::io::Error::other("the sysctl thread ended without an answer"),
    })?
}

impl RoutingPort for NetlinkOps {
    async fn add_rule(&self, rule: &SourceRule) -> Result<(), LinkOpError> {
        let mut request = self.handle(Side::Pod).await?.rule().add();
        *request.message_mut() = rule_message(rule);
        request
            .execute()
            .await
            .map_err(|err| op_error(format!("RTM_NEWRULE {rule}"), Side::Pod, err))
    }

    async fn delete_rule(&self, rule: &SourceRule) -> Result<(), LinkOpError> {
        self.handle(Side::Pod)
            .await?
            .rule()
            .del(rule_message(rule))
            .execute()
            .await
            .map_err(|err| op_error(format!("RTM_DELRULE {rule}"), Side::Pod, err))
    }

    async fn add_table_route(&self, index: u32, route: &TableRoute) -> Result<(), LinkOpError> {
        self.handle(Side::Pod)
            .await?
            .route()
            .add(table_route_message(index, route))
            .execute()
            .await
            .map_err(|err| op_error(format!("RTM_NEWROUTE {route}"), Side::Pod, err))
    }

    async fn delete_table_route(&self, index: u32, route: &TableRoute) -> Result<(), LinkOpError> {
        self.handle(Side::Pod)
            .await?
            .route()
            .del(table_route_message(index, route))
            .execute()
            .await
            .map_err(|err| op_error(format!("RTM_DELROUTE {route}"), Side::Pod, err))
    }

    async fn vrf(&self, name: &str) -> Result<Option<VrfState>, LinkOpError> {
        let handle = self.handle(Side::Pod).await?;
        let links: Vec<_> = handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|err| op_error("RTM_GETLINK dump", Side::Pod, err))?;
        let Some(vrf) = links.iter().find(|link| {
            link.attributes.iter().any(|a| matches!(a, LinkAttribute::IfName(n) if n == name))
        }) else {
            return Ok(None);
        };
        let index = vrf.header.index;
        let table = vrf.attributes.iter().find_map(|a| match a {
            LinkAttribute::LinkInfo(infos) => infos.iter().find_map(|info| match info {
                LinkInfo::Data(InfoData::Vrf(data)) => data.iter().find_map(|d| match d {
                    InfoVrf::TableId(table) => Some(*table),
                    _ => None,
                }),
                _ => None,
            }),
            _ => None,
        });
        let members = links
            .iter()
            .filter(|link| {
                link.attributes
                    .iter()
                    .any(|a| matches!(a, LinkAttribute::Controller(m) if *m == index))
            })
            .count();
        Ok(Some(VrfState { index, table, members: u32::try_from(members).unwrap_or(u32::MAX) }))
    }

    async fn create_vrf(&self, name: &str, table: u32) -> Result<(), LinkOpError> {
        self.handle(Side::Pod)
            .await?
            .link()
            .add(LinkVrf::new(name, table).up().build())
            .execute()
            .await
            .map_err(|err| {
                op_error(format!("RTM_NEWLINK vrf {name} table {table}"), Side::Pod, err)
            })
    }

    async fn set_master(&self, index: u32, master: u32) -> Result<(), LinkOpError> {
        let message = LinkUnspec::new_with_index(index).controller(master).build();
        self.handle(Side::Pod)
            .await?
            .link()
            .set(message)
            .execute()
            .await
            .map_err(|err| op_error(format!("RTM_NEWLINK {index} master {master}"), Side::Pod, err))
    }

    async fn set_sysctls(
        &self,
        index: u32,
        if_name: &str,
        sysctls: &[Sysctl],
    ) -> Result<(), LinkOpError> {
        let (inet, writes) = sysctl_parts(index, if_name, sysctls);
        if let Some((message, op)) = inet {
            self.handle(Side::Pod)
                .await?
                .link()
                .set(message)
                .execute()
                .await
                .map_err(|err| op_error(op, Side::Pod, err))?;
        }
        if writes.is_empty() {
            return Ok(());
        }
        write_proc(self.pod_netns()?, writes).await
    }
}

#[cfg(test)]
mod tests {
    use rtnetlink::packet_core::Nla as _;

    use super::*;

    #[test]
    fn proc_paths_keep_dotted_interface_names() {
        let sysctl = Sysctl {
            family: SysctlFamily::Ipv6Conf,
            attribute: "accept_ra".into(),
            value: "0".into(),
        };
        assert_eq!(
            proc_path(&sysctl, "net1.100"),
            PathBuf::from("/proc/sys/net/ipv6/conf/net1.100/accept_ra")
        );
        let netns = Sysctl {
            family: SysctlFamily::Ipv4Netns,
            attribute: "tcp_l3mdev_accept".into(),
            value: "1".into(),
        };
        assert_eq!(
            proc_path(&netns, "net1"),
            PathBuf::from("/proc/sys/net/ipv4/tcp_l3mdev_accept")
        );
    }

    #[test]
    fn inet_conf_nests_one_u32_per_id_zero_values_included() {
        let LinkAttribute::AfSpecUnspec(spec) = inet_conf(&[(8, 0), (22, 1)]) else {
            panic!("an AF_SPEC attribute");
        };
        let [AfSpecUnspec::Inet(inet)] = spec.as_slice() else { panic!("one AF_INET part") };
        let [AfSpecInet::Other(conf)] = inet.as_slice() else { panic!("one IFLA_INET_CONF") };
        let mut value = vec![0; conf.value_len()];
        conf.emit_value(&mut value);
        // Two NLAs of 8 bytes: length 8, type, then the value.
        assert_eq!(value.len(), 16);
        assert_eq!(&value[0..2], &8u16.to_ne_bytes());
        assert_eq!(&value[2..4], &8u16.to_ne_bytes());
        assert_eq!(&value[4..8], &0u32.to_ne_bytes());
        assert_eq!(&value[10..12], &22u16.to_ne_bytes());
        assert_eq!(&value[12..16], &1u32.to_ne_bytes());
    }
}
