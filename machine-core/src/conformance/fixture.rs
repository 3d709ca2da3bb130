//! What the suite is given: the clients it drives and what it needs to know of the
//! provider and its backend.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::error::ErrorKind;
use crate::machine::{Labels, Machine, Phase, ProviderId};
use crate::name::MachineName;
use crate::provisioner::MachineProvisioner;
use crate::spec::MachineSpec;
use crate::transport::Connector;

use super::faults::FaultHook;

/// Makes a new instance of the provider under test, with the same owner and backend: what
/// a restarted process, or another replica of a controller, would build. Nothing is
/// shared with earlier instances but the backend (no cache, no memory of launches).
pub type FreshProvider =
    Arc<dyn Fn() -> BoxFuture<'static, Arc<dyn MachineProvisioner>> + Send + Sync>;

/// The clients the suite drives: all on one backend (one account, one inventory).
#[derive(Clone)]
#[non_exhaustive]
pub struct Clients {
    /// The provider under test.
    pub provider: Arc<dyn MachineProvisioner>,
    /// Another client instance with the same owner: a restarted process or a second
    /// replica of a controller. It must see and adopt `provider`'s machines.
    pub replica: Arc<dyn MachineProvisioner>,
    /// A client with a different owner. It must never see, adopt or delete
    /// `provider`'s machines.
    pub other_owner: Arc<dyn MachineProvisioner>,
    /// Makes new instances of the provider (same owner, same backend), for the crash-point
    /// and replica cases. Those cases fail, saying so, when it is not set: a provider
    /// that cannot be built twice cannot prove it survives a restart.
    pub fresh: Option<FreshProvider>,
}

impl Clients {
    /// The three clients.
    pub fn new(
        provider: Arc<dyn MachineProvisioner>,
        replica: Arc<dyn MachineProvisioner>,
        other_owner: Arc<dyn MachineProvisioner>,
    ) -> Self {
        Clients {
            provider,
            replica,
            other_owner,
            fresh: None,
        }
    }

    /// Sets how new instances of the provider are made (the `fresh` field).
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use machine_core::conformance::Clients;
    /// # use machine_core::sim::{SimCloud, SimConfig, SimProvider};
    /// # use machine_core::MachineProvisioner;
    /// let cloud = SimCloud::new();
    /// let sim = {
    ///     let cloud = cloud.clone();
    ///     move |owner: &str| -> Arc<dyn MachineProvisioner> {
    ///         Arc::new(SimProvider::new(cloud.clone(), SimConfig::default().with_owner(owner)).unwrap())
    ///     }
    /// };
    /// let make = sim.clone();
    /// let clients = Clients::new(sim("me"), sim("me"), sim("them"))
    ///     .with_fresh(move || {
    ///         let p = make("me");
    ///         Box::pin(async move { p })
    ///     });
    /// ```
    pub fn with_fresh(
        mut self,
        fresh: impl Fn() -> BoxFuture<'static, Arc<dyn MachineProvisioner>> + Send + Sync + 'static,
    ) -> Self {
        self.fresh = Some(Arc::new(fresh));
        self
    }

    /// A new instance of the provider; panics, naming the missing setting, without one.
    pub(crate) async fn new_instance(&self, case: &str) -> Arc<dyn MachineProvisioner> {
        let fresh = self.fresh.as_ref().unwrap_or_else(|| {
            panic!(
                "{}: the case {case} needs new provider instances: set Clients::with_fresh",
                self.provider
            )
        });
        fresh().await
    }
}

impl fmt::Debug for Clients {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Clients")
            .field("provider", &self.provider.to_string())
            .field("replica", &self.replica.to_string())
            .field("other_owner", &self.other_owner.to_string())
            .field("fresh", &self.fresh.is_some())
            .finish()
    }
}

/// What the suite needs to know about a provider.
#[non_exhaustive]
pub struct Fixture {
    /// Builds a spec the provider can create for a machine named `name` (image, size,
    /// provider settings filled in). The suite adds its own labels.
    pub spec: Box<dyn Fn(&MachineName) -> MachineSpec + Send + Sync>,
    /// A well-formed provider ID of this provider that names no machine.
    pub unknown_id: ProviderId,
    /// A prefix for machine names, unique to this run so that runs never collide.
    pub prefix: String,
    /// How long to wait for a machine to be gone after delete.
    pub timeout: Duration,
    /// How long a new machine may take to run (phase Provisioned or later), as the
    /// provider declares for its backend.
    pub boot_timeout: Duration,
    /// How often to look while waiting.
    pub poll: Duration,
    /// Sizes the provider takes, each as [`MachineSpec::size`] is written and as
    /// [`Machine::size`] reads it back (an instance type, `2x4096`). Empty: the provider
    /// takes no size, and must refuse a spec with one rather than ignore it.
    pub sizes: Vec<String>,
    /// Whether a running machine has an SSH endpoint in [`crate::Access::ssh`]: the
    /// provider knows how its machines are reached. `true` by default.
    pub ssh_access: bool,
    /// How to reach a running machine, as a composer would; where set, the power case
    /// checks that a stopped machine is unreachable and a started one reachable again,
    /// not only its phase. `None` where the backend runs no guest (an API simulator).
    pub connector: Option<Arc<dyn Connector>>,
    /// Makes the backend answer with faults (quota, capacity, permission, throttle), so
    /// that the suite sees each come back with its kind. `None` where no fault can be
    /// put between the provider and its backend.
    pub faults: Option<Arc<dyn FaultHook>>,
    /// How many machines the backend can hold at once (a pool of servers); `None` when
    /// the suite's few machines always fit. The replica case creates at most this many
    /// at a time.
    pub capacity: Option<usize>,
    /// Rounds of each crash-point case (8 by default): in each, a create or delete is
    /// abandoned at another await point.
    pub crash_rounds: usize,
    /// Rounds of the replica case (3 by default).
    pub replica_rounds: usize,
    /// Provider instances racing in each round of the replica case (3 by default).
    pub replicas: usize,
    /// Names created at once in each round of the replica case (4 by default, fewer when
    /// [`Fixture::capacity`] says so).
    pub replica_names: usize,
}

impl fmt::Debug for Fixture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fixture")
            .field("unknown_id", &self.unknown_id)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("boot_timeout", &self.boot_timeout)
            .field("poll", &self.poll)
            .field("sizes", &self.sizes)
            .field("ssh_access", &self.ssh_access)
            .field("connector", &self.connector.is_some())
            .field("faults", &self.faults.is_some())
            .field("capacity", &self.capacity)
            .field("crash_rounds", &self.crash_rounds)
            .field("replica_rounds", &self.replica_rounds)
            .field("replicas", &self.replicas)
            .field("replica_names", &self.replica_names)
            .finish_non_exhaustive()
    }
}

impl Fixture {
    /// A fixture with a run-unique prefix, 60 s timeouts, a 50 ms poll, no sizes, SSH
    /// access expected, no connector, no fault hook, unlimited capacity, 8 crash rounds
    /// and 3 replica rounds of 3 replicas creating 4 names.
    ///
    /// # Panics
    /// When `unknown_id` is not a provider ID URI: a bug in the calling test.
    pub fn new(
        unknown_id: &str,
        spec: impl Fn(&MachineName) -> MachineSpec + Send + Sync + 'static,
    ) -> Self {
        Fixture {
            spec: Box::new(spec),
            unknown_id: ProviderId::new(unknown_id)
                .expect("fixture unknown_id must be a provider ID"),
            prefix: format!("c{:x}", fastrand::u32(..) & 0xffffff),
            timeout: Duration::from_secs(60),
            boot_timeout: Duration::from_secs(60),
            poll: Duration::from_millis(50),
            sizes: Vec::new(),
            ssh_access: true,
            connector: None,
            faults: None,
            capacity: None,
            crash_rounds: 8,
            replica_rounds: 3,
            replicas: 3,
            replica_names: 4,
        }
    }

    pub(crate) fn name(&self, what: &str) -> MachineName {
        MachineName::new(format!("{}-{what}", self.prefix))
            .expect("conformance names are DNS labels")
    }

    pub(crate) fn spec(&self, what: &str) -> MachineSpec {
        let mut spec = (self.spec)(&self.name(what));
        spec.labels
            .insert("conformance-run".into(), self.prefix.clone());
        spec.labels.insert("conformance-case".into(), what.into());
        spec
    }

    pub(crate) fn run_selector(&self) -> Labels {
        Labels::from([("conformance-run".to_owned(), self.prefix.clone())])
    }

    pub(crate) fn case_selector(&self, what: &str) -> Labels {
        let mut selector = self.run_selector();
        selector.insert("conformance-case".into(), what.into());
        selector
    }

    pub(crate) async fn wait_gone(&self, p: &dyn MachineProvisioner, id: &ProviderId) {
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            match p.get(id).await {
                Ok(m) if m.phase == Phase::Deleted => return,
                Err(e) if e.kind() == ErrorKind::NotFound => return,
                Ok(_) => {}
                Err(e) if e.is_retryable() => {}
                Err(e) => panic!("{p}: get({id}) while waiting for deletion failed: {e}"),
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{p}: machine {id} was not gone {:?} after delete",
                self.timeout
            );
            tokio::time::sleep(self.poll).await;
        }
    }

    pub(crate) async fn cleanup(&self, p: &dyn MachineProvisioner, m: &Machine) {
        p.delete(&m.provider_id)
            .await
            .unwrap_or_else(|e| panic!("{p}: delete({}) failed: {e}", m.provider_id));
        self.wait_gone(p, &m.provider_id).await;
    }

    pub(crate) async fn get(&self, p: &dyn MachineProvisioner, id: &ProviderId) -> Machine {
        p.get(id)
            .await
            .unwrap_or_else(|e| panic!("{p}: get({id}) failed: {e}"))
    }

    /// Polls `id` until its phase satisfies `want` (described as `what`), within the
    /// boot timeout; a Failed machine or a retryable error on the way is a broken
    /// promise only when the time is up.
    pub(crate) async fn wait_for(
        &self,
        p: &dyn MachineProvisioner,
        id: &ProviderId,
        what: &str,
        want: impl Fn(Phase) -> bool,
    ) -> Machine {
        let deadline = tokio::time::Instant::now() + self.boot_timeout;
        loop {
            let seen = match p.get(id).await {
                Ok(m) if want(m.phase) => return m,
                Ok(m) => {
                    assert_ne!(
                        m.phase,
                        Phase::Failed,
                        "{p}: machine {id} failed while waiting for it to be {what}: {:?}",
                        m.failure
                    );
                    m.phase.to_string()
                }
                Err(e) if e.is_retryable() => e.to_string(),
                Err(e) => panic!("{p}: get({id}) failed while waiting for {what}: {e}"),
            };
            assert!(
                tokio::time::Instant::now() < deadline,
                "{p}: machine {id} was not {what} within {:?}: still {seen}",
                self.boot_timeout
            );
            tokio::time::sleep(self.poll).await;
        }
    }

    pub(crate) async fn create(
        &self,
        p: &dyn MachineProvisioner,
        what: &str,
    ) -> (MachineSpec, Machine) {
        let spec = self.spec(what);
        let m = p
            .create(&spec, None)
            .await
            .unwrap_or_else(|e| panic!("{p}: create({}) failed: {e}", spec.name));
        (spec, m)
    }
}
