//! Notifications of link, address and route changes in the calling thread's network
//! namespace (rtnetlink multicast groups), and of RDMA devices coming and going
//! ([`super::rdma_events`]), used to keep the inventory live.

use std::future::poll_fn;

use rtnetlink::sys::{AsyncSocket, TokioSocket, protocols::NETLINK_ROUTE};
use tokio::sync::mpsc;

/// The rtnetlink multicast groups followed (`RTNLGRP_*` of linux/rtnetlink.h): links, IPv4
/// and IPv6 addresses, IPv4 and IPv6 routes.
const GROUPS: [u32; 5] = [
    1,  // RTNLGRP_LINK
    5,  // RTNLGRP_IPV4_IFADDR
    7,  // RTNLGRP_IPV4_ROUTE
    9,  // RTNLGRP_IPV6_IFADDR
    11, // RTNLGRP_IPV6_ROUTE
];
/// Read buffer: a notification's content is never looked at, so a longer one may be cut.
const READ_BUFFER: usize = 16 * 1024;
/// Pause after a read error other than an overrun, so a broken socket cannot spin.
const ERROR_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

/// Subscribes to link, address and route changes. Each datagram of kernel notifications
/// becomes one `()` on the returned channel; callers debounce. The channel is bounded: when the
/// consumer lags, further notifications are dropped, which loses nothing because one pending
/// notification already means "rediscover".
///
/// The notifications are read as bytes and never decoded: only their arrival matters. (Through
/// rtnetlink's multicast connection every one was decoded in full into an unbounded queue;
/// a burst of pod starts, each with a host veth, made thousands, issue 36.) When the kernel
/// drops notifications because the socket's buffer is full (`ENOBUFS`), that too means
/// "rediscover".
///
/// # Errors
/// The socket could not be made or joined to the groups.
pub fn subscribe() -> Result<mpsc::Receiver<()>, std::io::Error> {
    let mut socket = TokioSocket::new(NETLINK_ROUTE)?;
    socket.socket_mut().bind_auto()?;
    for group in GROUPS {
        socket.socket_ref().add_membership(group)?;
    }
    let (sender, receiver) = mpsc::channel(1);
    // RDMA devices come and go without a link event (soft-RoCE links added or deleted, an
    // RDMA driver bound): their uevents trigger a rediscovery too. Without them the
    // inventory still follows links; RDMA changes then wait for the next link event.
    if let Err(err) = super::rdma_events::forward(sender.clone()) {
        tracing::warn!(error = %err, "RDMA uevents unavailable; RDMA changes follow link events");
    }
    tokio::spawn(async move {
        let mut buffer = Vec::with_capacity(READ_BUFFER);
        loop {
            buffer.clear();
            let read = poll_fn(|cx| socket.poll_recv(cx, &mut buffer)).await;
            if let Err(err) = &read
                && err.raw_os_error() != Some(nix::libc::ENOBUFS)
            {
                tracing::warn!(error = %err, "reading netlink notifications");
                tokio::time::sleep(ERROR_PAUSE).await;
            }
            match sender.try_send(()) {
                Ok(()) | Err(mpsc::error::TrySendError::Full(())) => {}
                Err(mpsc::error::TrySendError::Closed(())) => break,
            }
        }
    });
    Ok(receiver)
}
