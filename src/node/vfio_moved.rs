//! Wiring: the host interfaces the publisher keeps published while discovery cannot see them
//! are the NICs moved into pods (the attach service) and the functions bound to vfio-pci for
//! claims (the claims service: a bound VF has no netdev, DESIGN §2). One watch of their union.

use std::collections::BTreeSet;

use tokio::sync::watch;

/// A watch of the union of `moved` and `vfio`, kept current by a task that ends when both
/// senders are gone.
pub(super) fn union(
    mut moved: watch::Receiver<BTreeSet<String>>,
    mut vfio: watch::Receiver<BTreeSet<String>>,
) -> watch::Receiver<BTreeSet<String>> {
    let both = |a: &watch::Receiver<BTreeSet<String>>, b: &watch::Receiver<BTreeSet<String>>| {
        a.borrow().union(&b.borrow()).cloned().collect::<BTreeSet<String>>()
    };
    let (sender, receiver) = watch::channel(both(&moved, &vfio));
    tokio::spawn(async move {
        let (mut moved_open, mut vfio_open) = (true, true);
        while moved_open || vfio_open {
            tokio::select! {
                changed = moved.changed(), if moved_open => moved_open = changed.is_ok(),
                changed = vfio.changed(), if vfio_open => vfio_open = changed.is_ok(),
            }
            let now = both(&moved, &vfio);
            sender.send_if_modified(|current| {
                let changed = *current != now;
                *current = now;
                changed
            });
        }
    });
    receiver
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[tokio::test]
    async fn the_union_follows_both_and_outlives_one() {
        let (moved, moved_rx) = watch::channel(set(&["eth1"]));
        let (vfio, vfio_rx) = watch::channel(set(&[]));
        let mut union = union(moved_rx, vfio_rx);
        assert_eq!(*union.borrow(), set(&["eth1"]));
        vfio.send_replace(set(&["enp1s0v0"]));
        union.changed().await.unwrap();
        assert_eq!(*union.borrow_and_update(), set(&["eth1", "enp1s0v0"]));
        drop(moved);
        vfio.send_replace(set(&[]));
        union.changed().await.unwrap();
        assert_eq!(*union.borrow_and_update(), set(&["eth1"]), "the last of the gone sender stays");
        drop(vfio);
        assert!(union.changed().await.is_err(), "the task ends with both senders");
    }
}
