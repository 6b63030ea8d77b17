//! Every PodNetwork as the controller's watch last saw it (the overlap check judges one
//! network against all of them), and a readiness that every waiting reconcile sees.
//!
//! kube-runtime's `Store::wait_until_ready` keeps its readiness in a oneshot channel behind a
//! mutex: the receiver holds one waker, the last task that polled it, so of several reconciles
//! waiting at start only the last is woken when the first list completes; the others wait for
//! good and their networks are never judged (seen in about one start in three with two
//! networks). Readiness here is a `tokio::sync::watch` channel, whose change wakes every
//! receiver.

use std::sync::Arc;

use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use tokio::sync::watch;

use crate::model::pod_network::PodNetwork;

/// The watch stopped before the first list completed (the controller is shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the PodNetwork cache is gone")]
pub struct CacheGone;

/// Read side: cloned into every reconcile.
#[derive(Clone)]
pub struct NetworkCache {
    store: Store<PodNetwork>,
    ready: watch::Receiver<bool>,
}

/// Write side: applies the watch's events, then announces readiness after the first complete
/// list.
pub struct NetworkCacheWriter {
    writer: reflector::store::Writer<PodNetwork>,
    ready: watch::Sender<bool>,
}

impl NetworkCache {
    /// An empty cache, not ready, and its writer.
    #[must_use]
    pub fn new() -> (NetworkCache, NetworkCacheWriter) {
        let writer = reflector::store::Writer::default();
        let store = writer.as_reader();
        let (ready_tx, ready_rx) = watch::channel(false);
        (NetworkCache { store, ready: ready_rx }, NetworkCacheWriter { writer, ready: ready_tx })
    }

    /// Waits until the first list has been applied; every waiter is woken.
    ///
    /// # Errors
    ///
    /// [`CacheGone`] when the writer went away before.
    pub async fn ready(&self) -> Result<(), CacheGone> {
        let mut ready = self.ready.clone();
        ready.wait_for(|ready| *ready).await.map(|_| ()).map_err(|_| CacheGone)
    }

    /// Every network in the cache.
    #[must_use]
    pub fn state(&self) -> Vec<Arc<PodNetwork>> {
        self.store.state()
    }
}

impl NetworkCacheWriter {
    /// Applies one watch event (before it is passed on, so a reconcile it triggers sees it).
    pub fn apply(&mut self, event: &watcher::Event<PodNetwork>) {
        self.writer.apply_watcher_event(event);
        if matches!(event, watcher::Event::InitDone) {
            self.ready.send_replace(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};

    use futures::task::{ArcWake, waker};

    use super::*;

    struct Counter(AtomicUsize);

    impl ArcWake for Counter {
        fn wake_by_ref(this: &Arc<Self>) {
            this.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Two reconciles wait for the first list, as two networks present at start do; the
    /// list completes; both must be woken and then find the cache ready. Polled by hand, so
    /// the interleaving is the one that lost a network, every time.
    #[test]
    fn every_waiting_reconcile_is_woken_when_the_first_list_completes() {
        let (cache, mut writer) = NetworkCache::new();
        let counters =
            [Arc::new(Counter(AtomicUsize::new(0))), Arc::new(Counter(AtomicUsize::new(0)))];
        let mut waits = [Box::pin(cache.ready()), Box::pin(cache.ready())];
        for (wait, counter) in waits.iter_mut().zip(&counters) {
            let waker = waker(Arc::clone(counter));
            assert!(wait.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        }
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitDone);
        for (i, (wait, counter)) in waits.iter_mut().zip(&counters).enumerate() {
            assert_eq!(counter.0.load(Ordering::SeqCst), 1, "waiter {i} was not woken");
            let waker = waker(Arc::clone(counter));
            assert_eq!(
                wait.as_mut().poll(&mut Context::from_waker(&waker)),
                Poll::Ready(Ok(())),
                "waiter {i}"
            );
        }
    }

    #[test]
    fn a_writer_gone_before_the_list_ends_the_wait() {
        let (cache, writer) = NetworkCache::new();
        drop(writer);
        let waker = futures::task::noop_waker();
        let mut wait = Box::pin(cache.ready());
        assert_eq!(
            wait.as_mut().poll(&mut Context::from_waker(&waker)),
            Poll::Ready(Err(CacheGone))
        );
    }
}
