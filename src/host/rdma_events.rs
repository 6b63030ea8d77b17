//! Notifications of RDMA devices appearing and going away, which no link event announces
//! (`rdma link add`/`delete` of a soft-RoCE device, an RDMA driver bound or unbound, the
//! `uverbs`/`umad` character devices registered): the kernel's uevents of the `infiniband`,
//! `infiniband_verbs` and `infiniband_mad` classes, read from a `NETLINK_KOBJECT_UEVENT`
//! socket (multicast group 1, the kernel's own uevents; reading them needs no privilege).
//! Each becomes one `()` on the inventory's trigger channel, like a link event.
//!
//! Uevents are chosen over the RDMA netlink monitor group (`RDMA_NL_GROUP_NOTIFY`,
//! `rdma monitor`) because that group exists only from Linux 6.11 (6.1 has none), while
//! `ib_register_device` has sent a `KOBJ_ADD` uevent for every registration on every kernel
//! we support. Since Linux 4.18 the kernel sends uevents of devices without a netns tag only
//! to the initial network namespace, where the daemon runs (`hostNetwork`).

use std::io;

use netlink_sys::{
    AsyncSocket, AsyncSocketExt, SocketAddr, TokioSocket, protocols::NETLINK_KOBJECT_UEVENT,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The kernel's uevent multicast group (udev's own re-broadcasts use group 2).
const KERNEL_GROUP: u32 = 1;
/// Largest uevent the kernel builds (`UEVENT_BUFFER_SIZE`).
const UEVENT_BUFFER_SIZE: usize = 2048;
/// `ENOBUFS`: the socket overflowed and uevents were lost, one of which may have been ours.
const ENOBUFS: i32 = 105;

/// Whether a kernel uevent (`ACTION@DEVPATH` then NUL-separated `KEY=value` fields) is of
/// an RDMA class.
#[must_use]
pub fn is_rdma_uevent(message: &[u8]) -> bool {
    message.split(|byte| *byte == 0).any(|field| {
        matches!(
            field,
            b"SUBSYSTEM=infiniband" | b"SUBSYSTEM=infiniband_verbs" | b"SUBSYSTEM=infiniband_mad"
        )
    })
}

/// Sends `()` on `sender` for each RDMA uevent (a full channel drops it: one pending
/// notification already means "rediscover"), until the receiver is dropped. Must be called
/// inside a tokio runtime (it spawns the reader, whose handle is returned).
pub fn forward(sender: mpsc::Sender<()>) -> Result<JoinHandle<()>, io::Error> {
    let mut socket = TokioSocket::new(NETLINK_KOBJECT_UEVENT)?;
    socket.socket_mut().bind(&SocketAddr::new(0, KERNEL_GROUP))?;
    Ok(tokio::spawn(async move {
        loop {
            let mut message = Vec::with_capacity(UEVENT_BUFFER_SIZE);
            // Ends with the receiver, not only at the next uevent after it is gone (the
            // socket and this task would otherwise outlive the daemon's inventory).
            let received = tokio::select! {
                () = sender.closed() => break,
                received = socket.recv(&mut message) => received,
            };
            let relevant = match received {
                Ok(()) => is_rdma_uevent(&message),
                Err(err) if err.raw_os_error() == Some(ENOBUFS) => true,
                Err(err) => {
                    tracing::warn!(error = %err, "reading RDMA uevents stopped");
                    break;
                }
            };
            if relevant {
                match sender.try_send(()) {
                    Ok(()) | Err(mpsc::error::TrySendError::Full(())) => {}
                    Err(mpsc::error::TrySendError::Closed(())) => break,
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uevents_of_the_rdma_classes_are_recognised() {
        let add = b"add@/devices/virtual/infiniband/rxe0\0ACTION=add\0\
            DEVPATH=/devices/virtual/infiniband/rxe0\0SUBSYSTEM=infiniband\0NAME=rxe0\0SEQNUM=1\0";
        assert!(is_rdma_uevent(add));
        let verbs = b"remove@/devices/virtual/infiniband_verbs/uverbs0\0ACTION=remove\0\
            SUBSYSTEM=infiniband_verbs\0MAJOR=231\0MINOR=192\0DEVNAME=infiniband/uverbs0\0";
        assert!(is_rdma_uevent(verbs));
    }

    #[tokio::test]
    async fn the_reader_ends_with_its_receiver() {
        let (sender, receiver) = mpsc::channel(1);
        let reader = forward(sender).unwrap();
        drop(receiver);
        // Without the receiver the reader ends at once, not at some later uevent.
        reader.await.unwrap();
    }

    #[test]
    fn other_uevents_are_not() {
        let net = b"add@/devices/virtual/net/veth0\0ACTION=add\0SUBSYSTEM=net\0\
            INTERFACE=veth0\0IFINDEX=7\0";
        assert!(!is_rdma_uevent(net));
        // A value that merely contains the word is not the class.
        let named = b"add@/devices/x\0ACTION=add\0SUBSYSTEM=infiniband_fake\0";
        assert!(!is_rdma_uevent(named));
    }
}
