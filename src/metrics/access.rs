//! Who may read `/metrics` in the secure mode, decided the way Kubernetes components that
//! delegate to the API server decide it (controller-runtime's secure metrics filter,
//! kube-rbac-proxy): the request's bearer token is authenticated with a TokenReview, and the
//! user it names is authorised with a SubjectAccessReview for the non-resource URL
//! (`get /metrics`), which RBAC grants through a ClusterRole's `nonResourceURLs`.
//!
//! Verdicts are cached so a scrape every few seconds costs no API calls: keyed by the
//! SHA-256 of the token (the token itself is never kept), bounded in size, allowed verdicts
//! for [`ALLOWED_TTL`], refusals for the shorter [`DENIED_TTL`] (a newly granted role takes
//! effect quickly; a revoked one within two minutes, as with kube-rbac-proxy's cache). A
//! failed review (API unreachable) is not cached and answers 503.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

/// How long an allowed token is trusted without asking again.
pub const ALLOWED_TTL: Duration = Duration::from_mins(2);
/// How long a refused token (unknown, or not allowed) is refused without asking again.
pub const DENIED_TTL: Duration = Duration::from_secs(30);
/// Tokens whose verdict is kept; a full cache drops its oldest entry. Scrapers are a
/// handful of Prometheus replicas: the bound only stops a flood of random tokens from
/// growing memory.
pub const CACHE_ENTRIES: usize = 1024;

/// The user a token belongs to, as a TokenReview answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    /// User name (`system:serviceaccount:<ns>:<name>`).
    pub name: String,
    /// UID, empty when the authenticator gives none.
    pub uid: String,
    /// Groups.
    pub groups: Vec<String>,
}

/// A review could not be made (the API server unreachable or refusing the reviewer).
#[derive(Debug, thiserror::Error)]
#[error("{what}: {message}")]
pub struct ReviewError {
    /// `TokenReview` or `SubjectAccessReview`.
    pub what: &'static str,
    /// The cause as text (the adapter's error).
    pub message: String,
}

/// The API server's TokenReview and SubjectAccessReview, as the endpoint needs them (the
/// adapter is `k8s::access_review::KubeAccessReview`).
pub trait AccessReviewer: Send + Sync + 'static {
    /// Who `token` is, `None` when the API server does not know it.
    fn authenticate(
        &self,
        token: &str,
    ) -> impl Future<Output = Result<Option<UserInfo>, ReviewError>> + Send;
    /// Whether `user` may `verb` the non-resource URL `path`.
    fn authorize(
        &self,
        user: &UserInfo,
        verb: &str,
        path: &str,
    ) -> impl Future<Output = Result<bool, ReviewError>> + Send;
}

/// What the endpoint answers a request for a protected path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// 200: the user may read it.
    Allowed,
    /// 401: no bearer token, or one the API server does not know.
    Unauthenticated,
    /// 403: the user may not read it.
    Forbidden(String),
    /// 503: the review could not be made.
    Unavailable(String),
}

type Key = [u8; 32];

#[derive(Default)]
struct Cache {
    entries: HashMap<Key, (Access, Instant)>,
    order: VecDeque<Key>,
}

impl Cache {
    fn get(&mut self, key: &Key, now: Instant) -> Option<Access> {
        match self.entries.get(key) {
            Some((access, until)) if *until > now => Some(access.clone()),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    fn put(&mut self, key: Key, access: Access, until: Instant) {
        if self.entries.insert(key, (access, until)).is_none() {
            self.order.push_back(key);
        }
        // The order may name entries already dropped as expired: skip those.
        while self.entries.len() > CACHE_ENTRIES {
            match self.order.pop_front() {
                Some(oldest) => {
                    self.entries.remove(&oldest);
                }
                None => break,
            }
        }
        if self.order.len() > 2 * CACHE_ENTRIES {
            self.order.retain(|key| self.entries.contains_key(key));
        }
    }
}

/// The access decision with its cache, over `R`'s reviews.
pub struct DelegatedAccess<R> {
    reviewer: R,
    cache: Mutex<Cache>,
}

impl<R> std::fmt::Debug for DelegatedAccess<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelegatedAccess").finish_non_exhaustive()
    }
}

/// The bearer token of an `Authorization` header value (`Bearer <token>`, the scheme
/// case-insensitive as RFC 9110 says), if any.
#[must_use]
pub fn bearer_token(header: Option<&str>) -> Option<&str> {
    let (scheme, token) = header?.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl<R: AccessReviewer> DelegatedAccess<R> {
    /// A decision over `reviewer` with an empty cache.
    pub fn new(reviewer: R) -> Self {
        Self { reviewer, cache: Mutex::new(Cache::default()) }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the bearer of `authorization` (the header's value) may `get` `path`.
    pub async fn check(&self, authorization: Option<&str>, path: &str) -> Access {
        let Some(token) = bearer_token(authorization) else { return Access::Unauthenticated };
        // The path is part of the key: a verdict for one URL says nothing of another.
        let key: Key = Sha256::new()
            .chain_update(path.as_bytes())
            .chain_update([0])
            .chain_update(token.as_bytes())
            .finalize()
            .into();
        if let Some(access) = self.cache().get(&key, Instant::now()) {
            return access;
        }
        let access = match self.review(token, path).await {
            Ok(access) => access,
            Err(err) => {
                tracing::warn!(%err, path, "could not review a metrics scraper's token");
                return Access::Unavailable(err.to_string());
            }
        };
        let ttl = if access == Access::Allowed { ALLOWED_TTL } else { DENIED_TTL };
        self.cache().put(key, access.clone(), Instant::now() + ttl);
        access
    }

    async fn review(&self, token: &str, path: &str) -> Result<Access, ReviewError> {
        let Some(user) = self.reviewer.authenticate(token).await? else {
            return Ok(Access::Unauthenticated);
        };
        Ok(if self.reviewer.authorize(&user, "get", path).await? {
            Access::Allowed
        } else {
            Access::Forbidden(format!("{} may not get {path}", user.name))
        })
    }
}

/// An object-safe face of [`DelegatedAccess`], so the endpoint's state needs no type
/// parameter.
pub(crate) trait Gate: Send + Sync {
    /// [`DelegatedAccess::check`].
    fn check<'a>(
        &'a self,
        authorization: Option<&'a str>,
        path: &'a str,
    ) -> Pin<Box<dyn Future<Output = Access> + Send + 'a>>;
}

impl<R: AccessReviewer> Gate for DelegatedAccess<R> {
    fn check<'a>(
        &'a self,
        authorization: Option<&'a str>,
        path: &'a str,
    ) -> Pin<Box<dyn Future<Output = Access> + Send + 'a>> {
        Box::pin(DelegatedAccess::check(self, authorization, path))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::{Access, AccessReviewer, DelegatedAccess, ReviewError, UserInfo, bearer_token};

    /// Tokens → users, and the users allowed; counts the reviews made.
    #[derive(Default)]
    struct FakeReviews {
        tokens: HashMap<&'static str, &'static str>,
        allowed: Mutex<Vec<&'static str>>,
        down: std::sync::atomic::AtomicBool,
        calls: AtomicUsize,
    }

    impl AccessReviewer for FakeReviews {
        async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.down.load(Ordering::Relaxed) {
                return Err(ReviewError { what: "TokenReview", message: "refused".into() });
            }
            Ok(self.tokens.get(token).map(|name| UserInfo {
                name: (*name).to_owned(),
                uid: String::new(),
                groups: vec!["system:authenticated".to_owned()],
            }))
        }

        async fn authorize(
            &self,
            user: &UserInfo,
            verb: &str,
            path: &str,
        ) -> Result<bool, ReviewError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            let allowed = self.allowed.lock().unwrap();
            Ok(verb == "get" && path == "/metrics" && allowed.contains(&user.name.as_str()))
        }
    }

    fn access() -> DelegatedAccess<FakeReviews> {
        DelegatedAccess::new(FakeReviews {
            tokens: HashMap::from([("good", "prometheus"), ("other", "nobody")]),
            allowed: Mutex::new(vec!["prometheus"]),
            ..FakeReviews::default()
        })
    }

    #[test]
    fn only_a_bearer_token_counts() {
        assert_eq!(bearer_token(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(Some("Basic abc")), None);
        assert_eq!(bearer_token(Some("Bearer ")), None);
        assert_eq!(bearer_token(None), None);
    }

    #[tokio::test]
    async fn verdicts_follow_the_reviews_and_are_cached_per_token_and_path() {
        let access = access();
        assert_eq!(access.check(None, "/metrics").await, Access::Unauthenticated);
        assert_eq!(access.check(Some("Bearer nope"), "/metrics").await, Access::Unauthenticated);
        assert!(matches!(
            access.check(Some("Bearer other"), "/metrics").await,
            Access::Forbidden(_)
        ));
        assert_eq!(access.check(Some("Bearer good"), "/metrics").await, Access::Allowed);
        let calls = access.reviewer.calls.load(Ordering::Relaxed);
        // Cached: a revoked grant is still honoured until the entry expires, with no call.
        access.reviewer.allowed.lock().unwrap().clear();
        assert_eq!(access.check(Some("Bearer good"), "/metrics").await, Access::Allowed);
        assert!(matches!(
            access.check(Some("Bearer other"), "/metrics").await,
            Access::Forbidden(_)
        ));
        assert_eq!(access.check(Some("Bearer nope"), "/metrics").await, Access::Unauthenticated);
        assert_eq!(access.reviewer.calls.load(Ordering::Relaxed), calls, "answered from the cache");
        // Another path is another question.
        assert!(matches!(access.check(Some("Bearer good"), "/other").await, Access::Forbidden(_)));
        assert!(access.reviewer.calls.load(Ordering::Relaxed) > calls);
    }

    #[tokio::test]
    async fn a_failed_review_answers_unavailable_and_is_not_cached() {
        let access = access();
        access.reviewer.down.store(true, Ordering::Relaxed);
        assert!(matches!(
            access.check(Some("Bearer good"), "/metrics").await,
            Access::Unavailable(_)
        ));
        access.reviewer.down.store(false, Ordering::Relaxed);
        assert_eq!(access.check(Some("Bearer good"), "/metrics").await, Access::Allowed);
    }

    #[test]
    fn the_cache_keeps_at_most_its_bound_and_drops_expired_entries() {
        let mut cache = super::Cache::default();
        let now = std::time::Instant::now();
        let later = now + std::time::Duration::from_mins(1);
        for i in 0..(super::CACHE_ENTRIES + 10) {
            let mut key = [0u8; 32];
            key[..8].copy_from_slice(&(i as u64).to_le_bytes());
            cache.put(key, Access::Allowed, later);
        }
        assert_eq!(cache.entries.len(), super::CACHE_ENTRIES);
        let first = [0u8; 32];
        assert_eq!(cache.get(&first, now), None, "the oldest entry was dropped");
        let mut last = [0u8; 32];
        last[..8].copy_from_slice(&((super::CACHE_ENTRIES + 9) as u64).to_le_bytes());
        assert_eq!(cache.get(&last, now), Some(Access::Allowed));
        assert_eq!(cache.get(&last, later), None, "expired");
    }
}
