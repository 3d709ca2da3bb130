//! The provider conformance suite: the [`MachineProvisioner`] contract as code.
//!
//! Like object_store's integration module, these are public async functions that every
//! provider's tests call against its simulator or a real backend. A provider written by
//! a stranger proves itself by passing them. They panic with a message naming the broken
//! promise, as test helpers do, and clean up what they create.
//!
//! ```no_run
//! # async fn demo() {
//! use std::sync::Arc;
//! use machine_core::conformance::{self, Fixture};
//! use machine_core::sim::{SimCloud, SimConfig, SimProvider};
//!
//! let cloud = SimCloud::new();
//! let provider = Arc::new(SimProvider::new(cloud.clone(), SimConfig::default()).unwrap());
//! let second = Arc::new(SimProvider::new(cloud, SimConfig::default()).unwrap());
//! let fixture = Fixture::new("sim:///m-none", |name| machine_core::MachineSpec::new(name.clone()));
//! conformance::run_all(provider, second, &fixture).await;
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::capabilities::{Capabilities, PowerOp};
use crate::composer::Composer;
use crate::error::{ErrorKind, Result};
use crate::machine::{Labels, Machine, Phase, ProviderId};
use crate::name::MachineName;
use crate::provisioner::MachineProvisioner;
use crate::spec::MachineSpec;
use crate::steps::{Step, StepLayer};
use crate::user_data::{UserData, UserDataFormat};

/// What the suite needs to know about a provider.
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
    /// How often to look while waiting.
    pub poll: Duration,
}

impl Fixture {
    /// A fixture with a run-unique prefix, a 60 s timeout and a 50 ms poll.
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
            poll: Duration::from_millis(50),
        }
    }

    fn name(&self, what: &str) -> MachineName {
        MachineName::new(format!("{}-{what}", self.prefix))
            .expect("conformance names are DNS labels")
    }

    fn spec(&self, what: &str) -> MachineSpec {
        let mut spec = (self.spec)(&self.name(what));
        spec.labels
            .insert("conformance-run".into(), self.prefix.clone());
        spec.labels.insert("conformance-case".into(), what.into());
        spec
    }

    fn run_selector(&self) -> Labels {
        Labels::from([("conformance-run".to_owned(), self.prefix.clone())])
    }

    async fn wait_gone(&self, p: &dyn MachineProvisioner, id: &ProviderId) {
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

    async fn cleanup(&self, p: &dyn MachineProvisioner, m: &Machine) {
        p.delete(&m.provider_id)
            .await
            .unwrap_or_else(|e| panic!("{p}: delete({}) failed: {e}", m.provider_id));
        self.wait_gone(p, &m.provider_id).await;
    }
}

/// Create, get, find, list and delete one machine, checking each answer.
pub async fn create_get_find_list_delete(p: &dyn MachineProvisioner, fx: &Fixture) {
    let spec = fx.spec("crud");
    let none = p
        .find(&spec.name)
        .await
        .unwrap_or_else(|e| panic!("{p}: find failed: {e}"));
    assert!(
        none.is_none(),
        "{p}: find({}) returned a machine before create",
        spec.name
    );

    let m = p
        .create(&spec, None)
        .await
        .unwrap_or_else(|e| panic!("{p}: create failed: {e}"));
    assert_eq!(m.name, spec.name, "{p}: created machine has another name");
    assert!(
        !m.provider_id.scheme().is_empty(),
        "{p}: provider ID has no scheme"
    );
    assert_ne!(m.phase, Phase::Deleted, "{p}: a new machine is Deleted");

    let got = p
        .get(&m.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{p}: get failed: {e}"));
    assert_eq!(got.name, spec.name, "{p}: get returned another machine");
    assert_eq!(got.provider_id, m.provider_id);

    let found = p
        .find(&spec.name)
        .await
        .unwrap_or_else(|e| panic!("{p}: find failed: {e}"));
    assert_eq!(
        found.map(|f| f.provider_id),
        Some(m.provider_id.clone()),
        "{p}: find by name does not return the created machine"
    );

    let listed = p
        .list(&fx.run_selector())
        .await
        .unwrap_or_else(|e| panic!("{p}: list failed: {e}"));
    assert!(
        listed.iter().any(|l| l.provider_id == m.provider_id),
        "{p}: list by the run's label misses the created machine"
    );
    for l in &listed {
        assert_eq!(
            l.labels.get("conformance-run"),
            Some(&fx.prefix),
            "{p}: list returned a machine without the selected label"
        );
    }

    p.delete(&m.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{p}: delete failed: {e}"));
    fx.wait_gone(p, &m.provider_id).await;
    let after = p
        .find(&spec.name)
        .await
        .unwrap_or_else(|e| panic!("{p}: find failed: {e}"));
    assert!(after.is_none(), "{p}: find still returns a deleted machine");
    let listed = p
        .list(&fx.run_selector())
        .await
        .unwrap_or_else(|e| panic!("{p}: list failed: {e}"));
    assert!(
        listed.iter().all(|l| l.provider_id != m.provider_id),
        "{p}: list still returns a deleted machine"
    );
}

/// List selects by every label of the selector.
pub async fn list_selects_by_labels(p: &dyn MachineProvisioner, fx: &Fixture) {
    let a = fx.spec("list-a").with_label("tier", "web");
    let b = fx.spec("list-b").with_label("tier", "db");
    let ma = p
        .create(&a, None)
        .await
        .unwrap_or_else(|e| panic!("{p}: create failed: {e}"));
    let mb = p
        .create(&b, None)
        .await
        .unwrap_or_else(|e| panic!("{p}: create failed: {e}"));
    let mut selector = fx.run_selector();
    selector.insert("tier".into(), "web".into());
    let listed = p
        .list(&selector)
        .await
        .unwrap_or_else(|e| panic!("{p}: list failed: {e}"));
    let ids: Vec<_> = listed.iter().map(|m| &m.provider_id).collect();
    assert!(
        ids.contains(&&ma.provider_id),
        "{p}: list misses a machine with the selected labels"
    );
    assert!(
        !ids.contains(&&mb.provider_id),
        "{p}: list returns a machine without the selected labels"
    );
    fx.cleanup(p, &ma).await;
    fx.cleanup(p, &mb).await;
}

/// A second create with the same name returns the first machine and makes no other.
pub async fn create_twice_gives_one_machine(p: &dyn MachineProvisioner, fx: &Fixture) {
    let spec = fx.spec("twice");
    let first = p
        .create(&spec, None)
        .await
        .unwrap_or_else(|e| panic!("{p}: create failed: {e}"));
    let second = p
        .create(&spec, None)
        .await
        .unwrap_or_else(|e| panic!("{p}: second create failed: {e}"));
    assert_eq!(
        first.provider_id, second.provider_id,
        "{p}: a second create made a second machine"
    );
    let mut selector = fx.run_selector();
    selector.insert("conformance-case".into(), "twice".into());
    let listed = p
        .list(&selector)
        .await
        .unwrap_or_else(|e| panic!("{p}: list failed: {e}"));
    assert_eq!(
        listed.len(),
        1,
        "{p}: {} machines named {} exist",
        listed.len(),
        spec.name
    );
    fx.cleanup(p, &first).await;
}

/// Deleting twice, and deleting what is gone, succeed.
pub async fn delete_twice_succeeds(p: &dyn MachineProvisioner, fx: &Fixture) {
    let m = p
        .create(&fx.spec("delete-twice"), None)
        .await
        .unwrap_or_else(|e| panic!("{p}: create failed: {e}"));
    p.delete(&m.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{p}: delete failed: {e}"));
    p.delete(&m.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{p}: second delete failed: {e}"));
    fx.wait_gone(p, &m.provider_id).await;
    p.delete(&m.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{p}: delete of a gone machine failed: {e}"));
}

/// An unknown ID is not-found for get, and deleting it succeeds.
pub async fn unknown_id_is_not_found(p: &dyn MachineProvisioner, fx: &Fixture) {
    let e = p
        .get(&fx.unknown_id)
        .await
        .expect_err("get of an unknown id succeeded");
    assert_eq!(
        e.kind(),
        ErrorKind::NotFound,
        "{p}: get of an unknown id: {e}"
    );
    p.delete(&fx.unknown_id)
        .await
        .unwrap_or_else(|e| panic!("{p}: delete of an unknown id failed: {e}"));
}

/// A new client instance (a restarted process) finds the machine an old one made and
/// adopts it on create instead of making another.
pub async fn new_client_adopts(
    old: &dyn MachineProvisioner,
    new: &dyn MachineProvisioner,
    fx: &Fixture,
) {
    let spec = fx.spec("adopt");
    let m = old
        .create(&spec, None)
        .await
        .unwrap_or_else(|e| panic!("{old}: create failed: {e}"));
    let found = new
        .find(&spec.name)
        .await
        .unwrap_or_else(|e| panic!("{new}: find failed: {e}"));
    assert_eq!(
        found.map(|f| f.provider_id),
        Some(m.provider_id.clone()),
        "{new}: a new client does not find the old client's machine"
    );
    let again = new
        .create(&spec, None)
        .await
        .unwrap_or_else(|e| panic!("{new}: create failed: {e}"));
    assert_eq!(
        again.provider_id, m.provider_id,
        "{new}: a new client made a second machine instead of adopting"
    );
    fx.cleanup(new, &m).await;
}

/// User data given at create reads back the same, where the provider can show it.
pub async fn user_data_round_trips(p: &dyn MachineProvisioner, fx: &Fixture) {
    if p.capabilities().user_data.is_none() {
        return;
    }
    let ud = UserData::new(
        UserDataFormat::CloudConfig,
        format!(
            "#cloud-config\n# conformance {}\nruncmd:\n  - [echo, \"a: b # c\"]\n",
            fx.prefix
        ),
    );
    let m = p
        .create(&fx.spec("userdata"), Some(&ud))
        .await
        .unwrap_or_else(|e| panic!("{p}: create failed: {e}"));
    let back = p
        .user_data(&m.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{p}: user_data failed: {e}"));
    if let Some(back) = back {
        assert_eq!(
            back.decoded().unwrap_or_else(|e| panic!("{p}: {e}")),
            ud.bytes,
            "{p}: user data does not round-trip"
        );
    }
    fx.cleanup(p, &m).await;
}

/// User data over the declared limit is refused with an invalid-spec error on
/// `userData` before any API call, by the composer; and by the provider itself when
/// handed such data directly.
pub async fn oversized_user_data_is_refused_before_any_call(
    p: Arc<dyn MachineProvisioner>,
    fx: &Fixture,
) {
    let Some(delivery) = p.capabilities().user_data.clone() else {
        return;
    };
    let counting = Arc::new(Counting {
        inner: p.clone(),
        calls: AtomicU64::new(0),
    });
    // Random alphanumerics barely compress, so gzip cannot save it.
    let noise: String = (0..delivery.max_bytes * 2)
        .map(|_| fastrand::alphanumeric())
        .collect();
    let layer = StepLayer::new("noise", vec![Step::write_file("/etc/noise", noise.clone())])
        .expect("valid layer");
    let composer = Composer::builder(counting.clone())
        .coupled(Arc::new(layer))
        .build()
        .expect("composer");
    let spec = fx.spec("oversized");
    let e = composer
        .provision(&spec, &CancellationToken::new())
        .await
        .expect_err("oversized user data was accepted");
    assert_eq!(
        e.kind(),
        ErrorKind::InvalidSpec,
        "{p}: oversized user data: {e}"
    );
    assert_eq!(
        e.field(),
        Some("userData"),
        "{p}: oversized user data error names no field: {e}"
    );
    assert_eq!(
        counting.calls.load(Ordering::SeqCst),
        0,
        "{p}: API calls were made for user data that cannot fit"
    );

    let direct = UserData::new(
        UserDataFormat::ShellScript,
        format!("#!/bin/sh\n# {noise}\n"),
    );
    let e = p
        .create(&spec, Some(&direct))
        .await
        .expect_err("provider accepted user data over its limit");
    assert_eq!(
        e.kind(),
        ErrorKind::InvalidSpec,
        "{p}: oversized user data: {e}"
    );
    let found = p
        .find(&spec.name)
        .await
        .unwrap_or_else(|e| panic!("{p}: find failed: {e}"));
    assert!(
        found.is_none(),
        "{p}: a machine was created with refused user data"
    );
}

/// A provision cancelled just after the create call leaves a machine that deprovision
/// finds and deletes.
pub async fn cancelled_provision_is_found_by_deprovision(
    p: Arc<dyn MachineProvisioner>,
    fx: &Fixture,
) {
    let cancel = CancellationToken::new();
    let wrapper = Arc::new(CancelAfterCreate {
        inner: p.clone(),
        cancel: cancel.clone(),
    });
    let composer = Composer::builder(wrapper).build().expect("composer");
    let spec = fx.spec("cancel");
    let e = composer
        .provision(&spec, &cancel)
        .await
        .expect_err("a cancelled provision succeeded");
    assert_eq!(
        e.kind(),
        ErrorKind::Cancelled,
        "{p}: cancelled provision: {e}"
    );
    let found = p
        .find(&spec.name)
        .await
        .unwrap_or_else(|e| panic!("{p}: find failed: {e}"));
    let m = found.unwrap_or_else(|| {
        panic!("{p}: the machine created before cancellation cannot be found by name")
    });
    let composer = Composer::builder(p.clone()).build().expect("composer");
    composer
        .deprovision(&spec.name, &CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("{p}: deprovision after cancellation failed: {e}"));
    fx.wait_gone(p.as_ref(), &m.provider_id).await;
    assert!(
        p.find(&spec.name)
            .await
            .unwrap_or_else(|e| panic!("{p}: find failed: {e}"))
            .is_none()
    );
}

/// Runs every case; `second` must be another client instance on the same backend and
/// owner, for the adoption case.
pub async fn run_all(
    p: Arc<dyn MachineProvisioner>,
    second: Arc<dyn MachineProvisioner>,
    fx: &Fixture,
) {
    unknown_id_is_not_found(p.as_ref(), fx).await;
    create_get_find_list_delete(p.as_ref(), fx).await;
    list_selects_by_labels(p.as_ref(), fx).await;
    create_twice_gives_one_machine(p.as_ref(), fx).await;
    delete_twice_succeeds(p.as_ref(), fx).await;
    new_client_adopts(p.as_ref(), second.as_ref(), fx).await;
    user_data_round_trips(p.as_ref(), fx).await;
    oversized_user_data_is_refused_before_any_call(p.clone(), fx).await;
    cancelled_provision_is_found_by_deprovision(p, fx).await;
}

/// Counts calls to the provider (capabilities excluded).
struct Counting {
    inner: Arc<dyn MachineProvisioner>,
    calls: AtomicU64,
}

impl fmt::Display for Counting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Counting({})", self.inner)
    }
}

impl Counting {
    fn tick(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl MachineProvisioner for Counting {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        self.tick();
        self.inner.create(spec, user_data).await
    }
    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        self.tick();
        self.inner.get(id).await
    }
    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        self.tick();
        self.inner.find(name).await
    }
    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        self.tick();
        self.inner.list(selector).await
    }
    async fn delete(&self, id: &ProviderId) -> Result<()> {
        self.tick();
        self.inner.delete(id).await
    }
    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
        self.tick();
        self.inner.user_data(id).await
    }
    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        self.tick();
        self.inner.power(id, op).await
    }
    async fn console_output(&self, id: &ProviderId) -> Result<Option<String>> {
        self.tick();
        self.inner.console_output(id).await
    }
}

/// Cancels a token as soon as a create call returns, then yields, so that the
/// provision that made the call sees the cancellation before it can go on.
struct CancelAfterCreate {
    inner: Arc<dyn MachineProvisioner>,
    cancel: CancellationToken,
}

impl fmt::Display for CancelAfterCreate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CancelAfterCreate({})", self.inner)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl MachineProvisioner for CancelAfterCreate {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        let r = self.inner.create(spec, user_data).await;
        self.cancel.cancel();
        tokio::task::yield_now().await;
        r
    }
    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        self.inner.get(id).await
    }
    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        self.inner.find(name).await
    }
    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        self.inner.list(selector).await
    }
    async fn delete(&self, id: &ProviderId) -> Result<()> {
        self.inner.delete(id).await
    }
    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
        self.inner.user_data(id).await
    }
    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        self.inner.power(id, op).await
    }
    async fn console_output(&self, id: &ProviderId) -> Result<Option<String>> {
        self.inner.console_output(id).await
    }
}
