//! Notifications of link, address and route changes in the calling thread's network
//! namespace (rtnetlink multicast groups), and of RDMA devices coming and going
//! ([`super::rdma_events`]), used to keep the inventory live.

use futures::StreamExt;
use rtnetlink::MulticastGroup;
use tokio::sync::mpsc;

/// Subscribes to link, address and route changes. Each kernel notification becomes one `()`
/// on the returned channel; callers debounce. The channel is bounded: when the consumer lags,
/// further notifications are dropped, which loses nothing because one pending notification
/// already means "rediscover".
pub fn subscribe() -> Result<mpsc::Receiver<()>, std::io::Error> {
    let groups = [
        MulticastGroup::Link,
        MulticastGroup::Ipv4Ifaddr,
        MulticastGroup::Ipv6Ifaddr,
        MulticastGroup::Ipv4Route,
        MulticastGroup::Ipv6Route,
    ];
    let (connection, _handle, mut messages) = rtnetlink::new_multicast_connection(&groups)?;
    tokio::spawn(connection);
    let (sender, receiver) = mpsc::channel(1);
    // RDMA devices come and go without a link event (soft-RoCE links added or deleted, an
    // RDMA driver bound): their uevents trigger a rediscovery too. Without them the
    // inventory still follows links; RDMA changes then wait for the next link event.
    if let Err(err) = super::rdma_events::forward(sender.clone()) {
        tracing::warn!(error = %err, "RDMA uevents unavailable; RDMA changes follow link events");
    }
    tokio::spawn(async move {
        while messages.next().await.is_some() {
            match sender.try_send(()) {
                Ok(()) | Err(mpsc::error::TrySendError::Full(())) => {}
                Err(mpsc::error::TrySendError::Closed(())) => break,
            }
        }
    });
    Ok(receiver)
}
