//! `ResourceClaim`s behind the [`ClaimSource`] port without an API server: claims and pods
//! put in a map, or made up from the names asked for; GETs counted, and optionally slowed
//! down so that overlapping calls can be seen.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::claims::{ClaimSource, ReadError};

/// Makes up the claim `(namespace, name)` when it is not in the map; `None`: not found.
type MadeUp = Box<dyn Fn(&str, &str) -> Option<ResourceClaim> + Send + Sync>;

/// Claims and pods by namespace and name ([`MapClaims::put`], [`MapClaims::put_pod`]) or
/// made up ([`MapClaims::made_by`]); counts GETs and the most in flight at once.
#[derive(Default)]
pub struct MapClaims {
    claims: Mutex<HashMap<(String, String), ResourceClaim>>,
    /// Pods: their claim names in `spec.resourceClaims` order.
    pods: Mutex<HashMap<(String, String), Vec<String>>>,
    made_up: Option<MadeUp>,
    delay: Option<Duration>,
    gets: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

impl fmt::Debug for MapClaims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MapClaims")
            .field("claims", &self.claims)
            .field("pods", &self.pods)
            .field("made_up", &self.made_up.is_some())
            .field("delay", &self.delay)
            .field("gets", &self.gets)
            .finish_non_exhaustive()
    }
}

impl MapClaims {
    /// No claims and no pods yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A claim not in the map is what `make(namespace, name)` gives (`None`: not found).
    #[must_use]
    pub fn made_by(
        make: impl Fn(&str, &str) -> Option<ResourceClaim> + Send + Sync + 'static,
    ) -> Self {
        MapClaims { made_up: Some(Box::new(make)), ..Self::default() }
    }

    /// Each GET takes `delay` (tokio's clock), so calls in flight overlap.
    #[must_use]
    pub fn with_delay(self, delay: Duration) -> Self {
        MapClaims { delay: Some(delay), ..self }
    }

    /// Adds or replaces `claim` (by its namespace and name).
    ///
    /// # Panics
    ///
    /// When `claim` has no namespace or no name: a test wrote it wrong.
    pub fn put(&self, claim: ResourceClaim) {
        let key = (
            claim.metadata.namespace.clone().expect("a test claim has a namespace"),
            claim.metadata.name.clone().expect("a test claim has a name"),
        );
        lock(&self.claims).insert(key, claim);
    }

    /// Forgets every claim put (as if deleted from the API).
    pub fn clear(&self) {
        lock(&self.claims).clear();
    }

    /// Adds or replaces pod `namespace/pod` with its claims in `spec.resourceClaims` order.
    pub fn put_pod(&self, namespace: &str, pod: &str, claim_names: Vec<String>) {
        lock(&self.pods).insert((namespace.to_owned(), pod.to_owned()), claim_names);
    }

    /// How many GETs were made.
    pub fn gets(&self) -> usize {
        self.gets.load(Ordering::SeqCst)
    }

    /// The most GETs in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }
}

/// A test's map stays usable after a panicking test thread poisoned it.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ClaimSource for MapClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ReadError> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        if let Some(delay) = self.delay {
            tokio::time::sleep(delay).await;
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let stored = lock(&self.claims).get(&(namespace.to_owned(), name.to_owned())).cloned();
        stored
            .or_else(|| self.made_up.as_ref().and_then(|make| make(namespace, name)))
            .ok_or(ReadError::NotFound)
    }

    async fn pod_claim_names(
        &self,
        namespace: &str,
        pod: &str,
    ) -> Result<Option<Vec<String>>, ReadError> {
        Ok(lock(&self.pods).get(&(namespace.to_owned(), pod.to_owned())).cloned())
    }
}

impl ClaimSource for Arc<MapClaims> {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ReadError> {
        MapClaims::get(self, namespace, name).await
    }

    async fn pod_claim_names(
        &self,
        namespace: &str,
        pod: &str,
    ) -> Result<Option<Vec<String>>, ReadError> {
        MapClaims::pod_claim_names(self, namespace, pod).await
    }
}
