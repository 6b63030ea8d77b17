//! The RDMA half of `LinkPort` for one pod: looking an RDMA device up by name in a netns and
//! moving it to another (`RDMA_NLDEV_CMD_SET` with `RDMA_NLDEV_NET_NS_FD`), over
//! `rdma_netlink::RdmaSocket`. A `NETLINK_RDMA` socket answers for the netns of the thread that
//! opened it (in exclusive mode a dump lists only that netns' devices, and the kernel looks the
//! device index up there), so each operation runs on a dedicated OS thread that entered the
//! namespace first and ends with the operation; no tokio worker ever calls `setns`.

use std::fs::File;
use std::os::fd::AsFd as _;

use crate::podnet::ports::{LinkOpError, Side};

/// Runs `work` with a fresh RDMA socket on a new thread inside `netns` (`side` and `op` name
/// it in errors).
async fn in_netns<T: Send + 'static>(
    netns: &File,
    side: Side,
    op: String,
    work: impl FnOnce(&mut rdma_netlink::RdmaSocket) -> Result<T, rdma_netlink::Error> + Send + 'static,
) -> Result<T, LinkOpError> {
    let protocol = |message: String| LinkOpError::Protocol { op: op.clone(), side, message };
    let netns =
        netns.try_clone().map_err(|err| protocol(format!("duplicating the netns: {err}")))?;
    let (sender, receiver) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("netns-rdma".to_owned())
        .spawn(move || {
            let result = nix::sched::setns(netns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|errno| Err(std::io::Error::from(errno)))
                .and_then(|()| {
                    rdma_netlink::RdmaSocket::open()
                        .and_then(|mut socket| work(&mut socket))
                        .map_err(Ok)
                });
            // The receiver only goes away when the caller was cancelled; nothing to report to.
            let _ignored = sender.send(result);
        })
        .map_err(|err| protocol(format!("spawning the netns thread: {err}")))?;
    let answer = receiver
        .await
        .map_err(|_| protocol("the netns thread ended without an answer".to_owned()))?;
    answer.map_err(|failure| match failure {
        Err(source) => LinkOpError::Netns { path: format!("the {side} netns"), source },
        Ok(err) => match err.errno() {
            Some(errno) => LinkOpError::Kernel {
                op: op.clone(),
                side,
                errno,
                message: std::io::Error::from_raw_os_error(errno).to_string(),
            },
            None => protocol(err.to_string()),
        },
    })
}

/// The index of RDMA device `name` as `netns` (the `side` netns) sees it.
pub(super) async fn device_index(
    netns: &File,
    side: Side,
    name: &str,
) -> Result<Option<u32>, LinkOpError> {
    let wanted = name.to_owned();
    let devices = in_netns(
        netns,
        side,
        "RDMA_NLDEV_CMD_GET dump".to_owned(),
        rdma_netlink::RdmaSocket::devices,
    )
    .await?;
    Ok(devices.into_iter().find(|device| device.name == wanted).map(|device| device.index))
}

/// Moves RDMA device `index` of `from` (the `side` netns) into `to`.
pub(super) async fn move_device(
    from: &File,
    side: Side,
    index: u32,
    to: &File,
) -> Result<(), LinkOpError> {
    let target = to.try_clone().map_err(|err| LinkOpError::Protocol {
        op: format!("RDMA_NLDEV_CMD_SET {index} netns"),
        side,
        message: format!("duplicating the target netns: {err}"),
    })?;
    in_netns(
        from,
        side,
        format!("RDMA_NLDEV_CMD_SET device {index} RDMA_NLDEV_NET_NS_FD"),
        move |socket| socket.move_to_netns(index, target.as_fd()),
    )
    .await
}
