//! Leader election through a `coordination.k8s.io/v1` Lease, as client-go's
//! `leaderelection` does it, so that of several controller replicas one reconciles.
//!
//! A replica takes the Lease when it is free or its holder stopped renewing it; the
//! holder renews it every `retry_period`. Expiry is judged on the follower's own clock:
//! a Lease is expired once the follower has seen the same record for `lease_duration`,
//! so clocks that disagree do not matter. The leader stops reconciling (drops its
//! controller, and every reconcile in flight with it) once it failed to renew for
//! `renew_deadline`, which is shorter than `lease_duration`: by the time a follower
//! takes the Lease over, the old leader has stopped.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use machine_core::{Error, Result};

/// How one replica takes part in the election.
#[derive(Debug, Clone)]
pub struct LeaderElection {
    namespace: String,
    name: String,
    identity: String,
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
}

impl LeaderElection {
    /// Takes part in the election over the Lease `name` in `namespace` as `identity`
    /// (unique per replica: the pod's name), with client-go's default timing: a 15 s
    /// lease, a 10 s renew deadline, a try every 2 s.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        LeaderElection {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Sets the timing: how long a Lease holds without a renewal (whole seconds, as the
    /// Lease records it), how long the leader keeps trying to renew before it stops
    /// leading, and how often replicas try. Refused (InvalidSpec) unless
    /// `lease_duration > renew_deadline > 1.2 * retry_period > 0`, as client-go asks.
    pub fn with_timing(
        mut self,
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Self> {
        if lease_duration.as_secs() == 0 || lease_duration.subsec_nanos() != 0 {
            return Err(Error::invalid_spec(
                "leaseDuration",
                "must be a whole number of seconds, at least 1",
            ));
        }
        if renew_deadline >= lease_duration {
            return Err(Error::invalid_spec(
                "renewDeadline",
                "must be shorter than the lease duration",
            ));
        }
        if retry_period.is_zero() || retry_period.mul_f64(1.2) >= renew_deadline {
            return Err(Error::invalid_spec(
                "retryPeriod",
                "must be greater than zero and 1.2 times it shorter than the renew deadline",
            ));
        }
        self.lease_duration = lease_duration;
        self.renew_deadline = renew_deadline;
        self.retry_period = retry_period;
        Ok(self)
    }

    /// This replica's identity, as the Lease's `holderIdentity` names it.
    pub fn identity(&self) -> &str {
        &self.identity
    }
}

/// One replica's view of the Lease.
pub(crate) struct Elector {
    api: Api<Lease>,
    election: LeaderElection,
    /// The Lease's spec as last read, and when (on this replica's clock) it last changed.
    observed: Option<(LeaseSpec, Instant)>,
}

impl Elector {
    pub(crate) fn new(client: Client, election: LeaderElection) -> Self {
        Elector {
            api: Api::namespaced(client, &election.namespace),
            election,
            observed: None,
        }
    }

    /// Returns once this replica holds the Lease: when the try that took it started.
    pub(crate) async fn acquire(&mut self) -> Instant {
        loop {
            let started = Instant::now();
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    tracing::info!(identity = %self.election.identity, lease = %self.election.name, "leading");
                    return started;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "reading the lease failed"),
            }
            tokio::time::sleep(self.election.retry_period).await;
        }
    }

    /// Renews the Lease every retry period; returns when a renewal did not go through
    /// within the renew deadline, when this replica must stop leading.
    pub(crate) async fn keep(&mut self, acquired_at: Instant) {
        let mut renewed_at = acquired_at;
        loop {
            tokio::time::sleep(self.election.retry_period).await;
            let started = Instant::now();
            let left =
                (renewed_at + self.election.renew_deadline).saturating_duration_since(started);
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => renewed_at = started,
                Ok(Ok(false)) => tracing::warn!("the lease was taken by another replica"),
                Ok(Err(e)) => tracing::warn!(error = %e, "renewing the lease failed"),
                Err(_) => tracing::warn!("renewing the lease did not answer in time"),
            }
            if Instant::now() >= renewed_at + self.election.renew_deadline {
                tracing::warn!(identity = %self.election.identity, "stopped leading");
                return;
            }
        }
    }

    /// Gives the Lease up (on shutdown), so that another replica takes over at once.
    pub(crate) async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.election.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(&self.election.identity) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        if let Err(e) = self
            .api
            .replace(&self.election.name, &PostParams::default(), &lease)
            .await
        {
            tracing::warn!(error = %e, "releasing the lease failed");
        }
    }

    /// One try: creates the Lease, renews it when held, or takes it over when it is
    /// free or expired. `Ok(true)` when this replica holds it now; a conflict (another
    /// replica wrote it first) is `Ok(false)`.
    pub(crate) async fn try_acquire_or_renew(&mut self) -> kube::Result<bool> {
        let me = self.election.identity.clone();
        let now = MicroTime(Timestamp::now());
        let duration = i32::try_from(self.election.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.election.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.election.name.clone()),
                    namespace: Some(self.election.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(duration),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(&created);
                    Ok(true)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        self.observe(&lease);
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let mine = holder == me;
        if !holder.is_empty() && !mine {
            let held_for = Duration::from_secs(
                u64::try_from(spec.lease_duration_seconds.unwrap_or(duration).max(1)).unwrap_or(1),
            );
            let seen_since = self
                .observed
                .as_ref()
                .map_or_else(Instant::now, |(_, t)| *t);
            if seen_since.elapsed() < held_for {
                return Ok(false);
            }
        }
        let mut next = spec.clone();
        next.holder_identity = Some(me.clone());
        next.lease_duration_seconds = Some(duration);
        next.renew_time = Some(now.clone());
        if !mine {
            next.acquire_time = Some(now);
            next.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        lease.spec = Some(next);
        // The resourceVersion read stays in the object: a replica that wrote in between
        // makes this a 409, and it lost.
        match self
            .api
            .replace(&self.election.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                self.observe(&written);
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn observe(&mut self, lease: &Lease) {
        let spec = lease.spec.clone().unwrap_or_default();
        if self.observed.as_ref().is_none_or(|(seen, _)| *seen != spec) {
            self.observed = Some((spec, Instant::now()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_is_checked_as_client_go_does() {
        let e = LeaderElection::new("ns", "l", "a");
        let s = Duration::from_secs;
        assert!(e.clone().with_timing(s(15), s(10), s(2)).is_ok());
        assert!(e.clone().with_timing(s(10), s(10), s(2)).is_err());
        assert!(
            e.clone()
                .with_timing(
                    Duration::from_millis(1500),
                    s(1),
                    Duration::from_millis(100)
                )
                .is_err()
        );
        assert!(
            e.clone()
                .with_timing(s(3), s(2), Duration::from_millis(1700))
                .is_err()
        );
        assert!(e.with_timing(s(3), s(2), Duration::ZERO).is_err());
    }
}
