//! Leader election on a `coordination.k8s.io/v1` Lease (kube-runtime has none), with the
//! semantics of client-go's `leaderelection` package.
//!
//! - The holder renews every `retry_period` (2 s) under a `lease_duration` (15 s).
//! - A candidate takes the lease over only when the holder has not renewed for a whole
//!   `lease_duration` *by the candidate's own clock*: it remembers when it last saw the
//!   record change (client-go's `observedTime`), so clock skew between nodes never shortens
//!   a lease. A released lease (no holder) is taken at once.
//! - Writes carry the resourceVersion read (optimistic concurrency): of two candidates racing
//!   for an expired lease, the API server lets one write land and answers 409 to the other,
//!   which re-reads and sees the winner.
//! - A leader that cannot renew within `renew_deadline` (10 s, shorter than the lease) stops
//!   leading at that moment, before anyone else may take over; every API call of a leader is
//!   cut off at that deadline so a hung connection cannot keep it leading.
//! - [`LeaderElector::release`] clears the holder so a standby takes over on its next poll
//!   instead of waiting out the lease (client-go's `ReleaseOnCancel`).
//!
//! [`LeaseObserver`] and the record functions are the pure decision logic; [`LeaderElector`]
//! does the API calls.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;

/// How long a lease lasts without renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long a leader keeps leading without a successful renewal.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often the leader renews and a candidate retries.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// A candidate's API call gives up after this long (it retries on the next period).
const CANDIDATE_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Immediate re-reads after a write conflict before waiting a period.
const CONFLICT_RETRIES: u32 = 3;

/// Which lease, who we are, and the timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// Our holder identity (unique per process).
    pub identity: String,
    /// [`LEASE_DURATION`].
    pub lease_duration: Duration,
    /// [`RENEW_DEADLINE`].
    pub renew_deadline: Duration,
    /// [`RETRY_PERIOD`].
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// The lease `namespace/name` held as `identity`, with the default timing.
    #[must_use]
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            lease_duration: LEASE_DURATION,
            renew_deadline: RENEW_DEADLINE,
            retry_period: RETRY_PERIOD,
        }
    }
}

/// A holder identity for this process: the pod's name (`POD_NAME`, from the downward API),
/// else the host name (a pod's host name is its name too), and a random suffix, so two
/// processes on one host, or a restarted one, never share it.
#[must_use]
pub fn default_identity() -> String {
    use std::hash::{BuildHasher as _, Hasher as _};

    let name = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "netclaim".to_owned());
    // std's RandomState is seeded from the OS's random source per process.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    format!("{name}_{:016x}", hasher.finish())
}

/// The holder fields of a Lease, as the decision reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The holder; `None` when released or never held.
    pub holder: Option<String>,
    /// `leaseDurationSeconds`.
    pub lease_duration: Duration,
    /// When the holder acquired it.
    pub acquire_time: Option<Timestamp>,
    /// When the holder last renewed it.
    pub renew_time: Option<Timestamp>,
    /// How often the lease changed hands.
    pub transitions: i32,
}

impl LeaseRecord {
    /// Reads the record of `spec` (absent fields: no holder, zero duration).
    #[must_use]
    pub fn from_spec(spec: Option<&LeaseSpec>) -> Self {
        let spec = spec.cloned().unwrap_or_default();
        LeaseRecord {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            lease_duration: Duration::from_secs(
                u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
            ),
            acquire_time: spec.acquire_time.map(|t| t.0),
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }

    /// The Lease spec carrying this record.
    #[must_use]
    pub fn to_spec(&self) -> LeaseSpec {
        LeaseSpec {
            holder_identity: self.holder.clone(),
            // Whole seconds on the wire, rounded up: a lease is never announced shorter
            // than its holder assumes.
            lease_duration_seconds: Some(
                i32::try_from(self.lease_duration.as_millis().div_ceil(1000)).unwrap_or(i32::MAX),
            ),
            acquire_time: self.acquire_time.map(MicroTime),
            renew_time: self.renew_time.map(MicroTime),
            lease_transitions: Some(self.transitions),
            ..LeaseSpec::default()
        }
    }
}

/// The record after `identity` takes the lease from whoever had it (or from nobody).
#[must_use]
pub fn acquired(
    previous: Option<&LeaseRecord>,
    identity: &str,
    now: Timestamp,
    duration: Duration,
) -> LeaseRecord {
    LeaseRecord {
        holder: Some(identity.to_owned()),
        lease_duration: duration,
        acquire_time: Some(now),
        renew_time: Some(now),
        transitions: previous.map_or(0, |p| p.transitions.saturating_add(1)),
    }
}

/// The record after its holder renews it.
#[must_use]
pub fn renewed(current: &LeaseRecord, now: Timestamp, duration: Duration) -> LeaseRecord {
    LeaseRecord { renew_time: Some(now), lease_duration: duration, ..current.clone() }
}

/// The record after its holder lets go: no holder, and a one-second duration so that even a
/// candidate that ignores the empty holder waits no longer than that.
#[must_use]
pub fn released(current: &LeaseRecord, now: Timestamp) -> LeaseRecord {
    LeaseRecord {
        holder: None,
        lease_duration: Duration::from_secs(1),
        acquire_time: Some(now),
        renew_time: Some(now),
        transitions: current.transitions,
    }
}

/// What to do after reading the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// We hold it: renew.
    Renew,
    /// Nobody holds it, or the holder's lease ran out by our clock: take it.
    Acquire,
    /// Someone else holds it until `expires_at` (our clock) unless they renew.
    Wait {
        /// The holder.
        holder: String,
        /// When it would expire without another renewal.
        expires_at: Instant,
    },
}

/// A candidate's memory of the lease between reads: the last record and when it was first
/// seen in that state (client-go's `observedRecord` and `observedTime`).
#[derive(Debug, Clone)]
pub struct LeaseObserver {
    last: Option<LeaseRecord>,
    observed_at: Instant,
}

impl LeaseObserver {
    /// Nothing observed yet.
    #[must_use]
    pub fn new(now: Instant) -> Self {
        Self { last: None, observed_at: now }
    }

    /// Records a read (or our own successful write) of `record` at `now`; the clock restarts
    /// only when the record changed, so a holder that stopped renewing runs out.
    pub fn observe(&mut self, record: &LeaseRecord, now: Instant) {
        if self.last.as_ref() != Some(record) {
            self.last = Some(record.clone());
            self.observed_at = now;
        }
    }

    /// The last record observed.
    #[must_use]
    pub fn last(&self) -> Option<&LeaseRecord> {
        self.last.as_ref()
    }

    /// What `identity` should do with the last observed record at `now`.
    #[must_use]
    pub fn decide(&self, identity: &str, now: Instant) -> Decision {
        let Some(record) = &self.last else { return Decision::Acquire };
        match &record.holder {
            None => Decision::Acquire,
            Some(holder) if holder == identity => Decision::Renew,
            Some(holder) => {
                let expires_at = self.observed_at + record.lease_duration;
                if now >= expires_at {
                    Decision::Acquire
                } else {
                    Decision::Wait { holder: holder.clone(), expires_at }
                }
            }
        }
    }
}

/// A failed API call of the election (logged and retried; never fatal).
#[derive(Debug, thiserror::Error)]
pub enum LeaderElectionError {
    /// The API call failed.
    #[error("lease {namespace}/{name}: {source}")]
    Api {
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The API call did not answer in time.
    #[error("lease {namespace}/{name}: no answer within {timeout:?}")]
    Timeout {
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
        /// How long we waited.
        timeout: Duration,
    },
}

/// The outcome of one try.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Attempt {
    /// We hold the lease as of this write.
    Held,
    /// Someone else holds it.
    Waiting { holder: String, expires_at: Instant },
    /// A write lost a race: read again now.
    Conflict,
}

/// One participant of the election.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    observer: LeaseObserver,
    /// When the request of our last successful acquire/renew was sent (the lease runs from
    /// no earlier than that on the server).
    last_held: Option<Instant>,
    /// The resourceVersion our last read or write saw.
    resource_version: Option<String>,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("config", &self.config)
            .field("leading", &self.is_leading(Instant::now()))
            .finish_non_exhaustive()
    }
}

impl LeaderElector {
    /// A participant on `client` for `config`.
    #[must_use]
    pub fn new(client: kube::Client, config: LeaseConfig) -> Self {
        let api = Api::namespaced(client, &config.namespace);
        Self {
            api,
            config,
            observer: LeaseObserver::new(Instant::now()),
            last_held: None,
            resource_version: None,
        }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// Whether we lead at `now`: our last renewal is younger than the renew deadline.
    #[must_use]
    pub fn is_leading(&self, now: Instant) -> bool {
        self.last_held.is_some_and(|held| now < held + self.config.renew_deadline)
    }

    /// When leading ends unless a renewal lands first.
    fn leading_until(&self) -> Option<Instant> {
        self.last_held.map(|held| held + self.config.renew_deadline)
    }

    fn api_error(&self, source: kube::Error) -> LeaderElectionError {
        LeaderElectionError::Api {
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            source,
        }
    }

    /// Tries once to acquire or renew (re-reading after a lost race), and returns when to try
    /// next. Leadership as of the return is [`LeaderElector::is_leading`].
    pub async fn try_acquire_or_renew(&mut self) -> Result<Instant, LeaderElectionError> {
        let started = Instant::now();
        let mut conflicts = 0;
        loop {
            let attempt_started = Instant::now();
            // A leader's call may last until its deadline at most; a candidate's a few
            // seconds (it retries next period).
            let deadline = if self.is_leading(attempt_started) {
                self.leading_until().unwrap_or(attempt_started)
            } else {
                attempt_started + CANDIDATE_CALL_TIMEOUT
            };
            let timeout = deadline.saturating_duration_since(attempt_started);
            let outcome = match tokio::time::timeout(timeout, self.attempt(attempt_started)).await {
                Ok(outcome) => outcome,
                Err(_elapsed) => Err(LeaderElectionError::Timeout {
                    namespace: self.config.namespace.clone(),
                    name: self.config.name.clone(),
                    timeout,
                }),
            };
            match outcome? {
                Attempt::Held => {
                    self.last_held = Some(attempt_started);
                    return Ok(started + self.config.retry_period);
                }
                Attempt::Waiting { expires_at, .. } => {
                    self.last_held = None;
                    // Wake up right when the lease would run out, not up to a period later.
                    return Ok((started + self.config.retry_period).min(expires_at));
                }
                Attempt::Conflict if conflicts < CONFLICT_RETRIES => conflicts += 1,
                Attempt::Conflict => return Ok(started + self.config.retry_period),
            }
        }
    }

    async fn attempt(&mut self, now: Instant) -> Result<Attempt, LeaderElectionError> {
        let current = self.api.get_opt(&self.config.name).await.map_err(|e| self.api_error(e))?;
        let Some(mut lease) = current else {
            let record =
                acquired(None, &self.config.identity, Timestamp::now(), self.lease_duration());
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(record.to_spec()),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.written(&created, now);
                    Ok(Attempt::Held)
                }
                Err(kube::Error::Api(status)) if status.is_already_exists() => {
                    Ok(Attempt::Conflict)
                }
                Err(e) => Err(self.api_error(e)),
            };
        };
        let record = LeaseRecord::from_spec(lease.spec.as_ref());
        self.observer.observe(&record, now);
        self.resource_version.clone_from(&lease.metadata.resource_version);
        let next = match self.observer.decide(&self.config.identity, now) {
            Decision::Wait { holder, expires_at } => {
                return Ok(Attempt::Waiting { holder, expires_at });
            }
            Decision::Renew => renewed(&record, Timestamp::now(), self.lease_duration()),
            Decision::Acquire => acquired(
                Some(&record),
                &self.config.identity,
                Timestamp::now(),
                self.lease_duration(),
            ),
        };
        lease.spec = Some(next.to_spec());
        match self.api.replace(&self.config.name, &PostParams::default(), &lease).await {
            Ok(written) => {
                self.written(&written, now);
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(status)) if status.is_conflict() => Ok(Attempt::Conflict),
            Err(e) => Err(self.api_error(e)),
        }
    }

    fn lease_duration(&self) -> Duration {
        self.config.lease_duration
    }

    fn written(&mut self, lease: &Lease, now: Instant) {
        self.observer.observe(&LeaseRecord::from_spec(lease.spec.as_ref()), now);
        self.resource_version.clone_from(&lease.metadata.resource_version);
    }

    /// Lets go of the lease if we hold it, so a standby takes over at once. Stops leading
    /// first: the caller must have stopped acting before calling this.
    pub async fn release(&mut self) -> Result<(), LeaderElectionError> {
        let was_leading = self.last_held.take().is_some();
        let Some(record) = self.observer.last().cloned() else { return Ok(()) };
        if !was_leading || record.holder.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.config.name.clone()),
                namespace: Some(self.config.namespace.clone()),
                // Only the lease as we last wrote it: a lease someone else took meanwhile
                // is theirs (409, nothing to release).
                resource_version: self.resource_version.clone(),
                ..ObjectMeta::default()
            },
            spec: Some(released(&record, Timestamp::now()).to_spec()),
        };
        let params = PostParams::default();
        let call = self.api.replace(&self.config.name, &params, &lease);
        match tokio::time::timeout(CANDIDATE_CALL_TIMEOUT, call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(kube::Error::Api(status))) if status.is_conflict() || status.is_not_found() => {
                Ok(())
            }
            Ok(Err(e)) => Err(self.api_error(e)),
            Err(_elapsed) => Err(LeaderElectionError::Timeout {
                namespace: self.config.namespace.clone(),
                name: self.config.name.clone(),
                timeout: CANDIDATE_CALL_TIMEOUT,
            }),
        }
    }
}

/// Runs the election until `stop` turns true, publishing leadership on `leading` (true from
/// a successful acquire until a renewal misses its deadline). Does not release: the caller
/// stops acting first, then calls [`LeaderElector::release`] on the returned elector.
pub async fn run(
    mut elector: LeaderElector,
    leading: &tokio::sync::watch::Sender<bool>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> LeaderElector {
    let set = |value: bool| {
        leading.send_if_modified(|current| std::mem::replace(current, value) != value);
    };
    loop {
        if *stop.borrow() {
            break;
        }
        let mut next = match elector.try_acquire_or_renew().await {
            Ok(next) => next,
            Err(err) => {
                tracing::warn!(%err, "leader election: acquire/renew failed");
                Instant::now() + elector.config.retry_period
            }
        };
        let now = Instant::now();
        let is_leading = elector.is_leading(now);
        if is_leading != *leading.borrow() {
            if is_leading {
                tracing::info!(
                    identity = %elector.config.identity,
                    namespace = %elector.config.namespace,
                    lease = %elector.config.name,
                    "leader election: became the leader"
                );
            } else {
                tracing::warn!(
                    identity = %elector.config.identity,
                    "leader election: not the leader any more (renewal missed its deadline or the lease was taken)"
                );
            }
        }
        set(is_leading);
        if let Some(until) = elector.leading_until().filter(|_| is_leading) {
            // Wake at the deadline too, to stop leading the moment it passes.
            next = next.min(until);
        }
        tokio::select! {
            () = tokio::time::sleep_until(next.into()) => {}
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
        if !elector.is_leading(Instant::now()) && *leading.borrow() {
            tracing::warn!(
                identity = %elector.config.identity,
                "leader election: not the leader any more (renewal missed its deadline)"
            );
            set(false);
        }
    }
    elector
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: Option<&str>, renewed_at: i64) -> LeaseRecord {
        let at = Timestamp::from_second(renewed_at).expect("a valid time");
        LeaseRecord {
            holder: holder.map(str::to_owned),
            lease_duration: LEASE_DURATION,
            acquire_time: Some(at),
            renew_time: Some(at),
            transitions: 3,
        }
    }

    #[test]
    fn a_free_or_missing_lease_is_acquired_at_once() {
        let t0 = Instant::now();
        let observer = LeaseObserver::new(t0);
        assert_eq!(observer.decide("me", t0), Decision::Acquire);
        let mut observer = LeaseObserver::new(t0);
        observer.observe(&record(None, 100), t0);
        assert_eq!(observer.decide("me", t0), Decision::Acquire);
    }

    #[test]
    fn our_own_lease_is_renewed() {
        let t0 = Instant::now();
        let mut observer = LeaseObserver::new(t0);
        observer.observe(&record(Some("me"), 100), t0);
        assert_eq!(observer.decide("me", t0 + Duration::from_mins(1)), Decision::Renew);
    }

    #[test]
    fn another_holder_is_waited_out_by_our_clock_from_the_last_change_seen() {
        let t0 = Instant::now();
        let mut observer = LeaseObserver::new(t0);
        // The holder's renewTime is far in the past by wall clock (skew, or a long-dead
        // holder): it still gets a whole lease from the moment we first saw it.
        observer.observe(&record(Some("other"), 100), t0);
        let expires_at = t0 + LEASE_DURATION;
        assert_eq!(
            observer.decide("me", t0 + Duration::from_secs(14)),
            Decision::Wait { holder: "other".into(), expires_at }
        );
        // Seeing the same record again does not restart the clock...
        observer.observe(&record(Some("other"), 100), t0 + Duration::from_secs(10));
        assert_eq!(observer.decide("me", expires_at), Decision::Acquire);
        // ...a renewal does.
        observer.observe(&record(Some("other"), 112), t0 + Duration::from_secs(12));
        assert_eq!(
            observer.decide("me", t0 + Duration::from_secs(20)),
            Decision::Wait {
                holder: "other".into(),
                expires_at: t0 + Duration::from_secs(12) + LEASE_DURATION
            }
        );
    }

    #[test]
    fn records_count_transitions_and_release_clears_the_holder() {
        let now = Timestamp::from_second(200).expect("a valid time");
        let theirs = record(Some("other"), 100);
        let taken = acquired(Some(&theirs), "me", now, LEASE_DURATION);
        assert_eq!(taken.holder.as_deref(), Some("me"));
        assert_eq!(taken.transitions, 4);
        assert_eq!(taken.acquire_time, Some(now));
        let later = Timestamp::from_second(202).expect("a valid time");
        let renewal = renewed(&taken, later, LEASE_DURATION);
        assert_eq!((renewal.acquire_time, renewal.renew_time), (Some(now), Some(later)));
        assert_eq!(renewal.transitions, 4);
        let gone = released(&renewal, later);
        assert_eq!(gone.holder, None);
        assert_eq!(gone.lease_duration, Duration::from_secs(1));
        assert_eq!(gone.transitions, 4);
        assert_eq!(acquired(None, "me", now, LEASE_DURATION).transitions, 0);
    }

    #[test]
    fn specs_round_trip_and_an_empty_holder_is_none() {
        let rec = record(Some("me"), 100);
        assert_eq!(LeaseRecord::from_spec(Some(&rec.to_spec())), rec);
        let spec = LeaseSpec { holder_identity: Some(String::new()), ..LeaseSpec::default() };
        assert_eq!(LeaseRecord::from_spec(Some(&spec)).holder, None);
    }

    #[test]
    fn identities_differ_per_call() {
        assert_ne!(default_identity(), default_identity());
    }
}
