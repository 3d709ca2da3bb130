//! The composer: one [`MachineProvisioner`] plus ordered software layers, each coupled or
//! decoupled, driven to Ready by [`Composer::provision`] or one step at a time by
//! [`Composer::reconcile`].
//!
//! `provision` is a loop over the same step `reconcile` takes, with deadlines and
//! cancellation around it: there is one engine.
//!
//! # When a step fails
//! The machine ends [`Phase::Failed`](crate::Phase::Failed) with the failed layer's name
//! and the step's own message, never Ready. What is left on the machine differs by kind,
//! because cloud-init runs every script part it is given:
//! - a failing step in a **coupled** layer stops that layer's script; cloud-init still
//!   runs the other coupled layers' scripts and reports the failure, and no decoupled
//!   layer starts;
//! - a failing step in a **decoupled** layer stops that layer and every decoupled layer
//!   after it; what ran before stays, and a later reconcile resumes from the first layer
//!   whose `is_applied` says no.
//!
//! The workspace's `tests/tests/local_failures.rs` checks both on real machines over SSH.

mod bootstrap;
mod fleet;
mod provision;
mod step;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use bootstrap::{BootstrapState, BootstrapStep, Bootstrapper};
pub use fleet::FleetResult;
pub use provision::Provisioned;
pub(crate) use step::name_taken;

use crate::bootstrap_data::ByReference;
use crate::error::{Error, Result};
use crate::machine::Machine;
use crate::name::MachineName;
use crate::observe::EventSink;
use crate::provisioner::MachineProvisioner;
use crate::software::{CompletionCheck, CoupledSoftware, DecoupledSoftware, Mode};
use crate::spec::MachineSpec;
use crate::transport::Connector;
use crate::user_data::{self, UserData, UserDataFormat, UserDataPart};

/// What to do with a machine whose provisioning failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Leave it for someone to look at (the default: evidence is worth more than the
    /// cost of a machine for a while).
    #[default]
    KeepForDebugging,
    /// Deprovision it before returning the error.
    DeleteOnFailure,
}

/// The longest deadline [`ComposerSettings::validate`] accepts: 30 days. Longer ones are
/// refused rather than risk arithmetic overflow in timers; no phase needs more.
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// The longest poll interval [`ComposerSettings::validate`] accepts: 1 hour.
pub const MAX_POLL_INTERVAL: Duration = Duration::from_secs(3600);

/// How long each phase may take. Every deadline must be greater than zero and at most
/// [`MAX_DURATION`].
///
/// `#[non_exhaustive]`: start from [`Deadlines::default`] and adjust with the `with_*`
/// methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Deadlines {
    /// From the start until the provider has accepted the machine.
    #[serde(with = "humantime_serde")]
    pub create: Duration,
    /// From creation until the provider reports it running.
    #[serde(with = "humantime_serde")]
    pub boot: Duration,
    /// From running until every layer is done (reachability included).
    #[serde(with = "humantime_serde")]
    pub bootstrap: Duration,
    /// From the start of a deprovision until the machine is gone.
    #[serde(with = "humantime_serde")]
    pub delete: Duration,
}

impl Default for Deadlines {
    /// 2 minutes to create, 10 to boot, 20 to bootstrap, 10 to delete.
    fn default() -> Self {
        Deadlines {
            create: Duration::from_secs(120),
            boot: Duration::from_secs(600),
            bootstrap: Duration::from_secs(1200),
            delete: Duration::from_secs(600),
        }
    }
}

impl Deadlines {
    /// Sets the create deadline.
    pub fn with_create(mut self, d: Duration) -> Self {
        self.create = d;
        self
    }

    /// Sets the boot deadline.
    pub fn with_boot(mut self, d: Duration) -> Self {
        self.boot = d;
        self
    }

    /// Sets the bootstrap deadline.
    pub fn with_bootstrap(mut self, d: Duration) -> Self {
        self.bootstrap = d;
        self
    }

    /// Sets the delete deadline.
    pub fn with_delete(mut self, d: Duration) -> Self {
        self.delete = d;
        self
    }
}

/// How the composer drives machines. Read from YAML in camelCase (`pollInterval`,
/// `onFailure`), as every other document of the project; the snake_case names of
/// earlier releases are still accepted.
///
/// The defaults: deadlines of 2 minutes to create, 10 to boot, 20 to bootstrap and 10
/// to delete; a 2 s poll interval; failed machines kept for debugging.
///
/// `#[non_exhaustive]`: start from [`ComposerSettings::default`] and adjust with the
/// `with_*` methods:
///
/// ```
/// use std::time::Duration;
/// use machine_core::{ComposerSettings, Deadlines, FailurePolicy};
///
/// let settings = ComposerSettings::default()
///     .with_deadlines(Deadlines::default().with_boot(Duration::from_secs(300)))
///     .with_poll_interval(Duration::from_millis(500))
///     .with_on_failure(FailurePolicy::DeleteOnFailure);
/// settings.validate().unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[non_exhaustive]
pub struct ComposerSettings {
    /// Per-phase deadlines for `provision` and `deprovision`.
    #[serde(default)]
    pub deadlines: Deadlines,
    /// How long to wait before looking again at a machine that is booting, unreachable
    /// or still bootstrapping. Must be greater than zero and at most
    /// [`MAX_POLL_INTERVAL`].
    #[serde(
        default = "default_poll",
        with = "humantime_serde",
        alias = "poll_interval"
    )]
    pub poll_interval: Duration,
    /// What `provision` does with a machine that failed.
    #[serde(default, alias = "on_failure")]
    pub on_failure: FailurePolicy,
}

fn default_poll() -> Duration {
    Duration::from_secs(2)
}

impl Default for ComposerSettings {
    fn default() -> Self {
        ComposerSettings {
            deadlines: Deadlines::default(),
            poll_interval: default_poll(),
            on_failure: FailurePolicy::default(),
        }
    }
}

impl ComposerSettings {
    /// Sets the per-phase deadlines.
    pub fn with_deadlines(mut self, deadlines: Deadlines) -> Self {
        self.deadlines = deadlines;
        self
    }

    /// Sets the poll interval.
    pub fn with_poll_interval(mut self, poll: Duration) -> Self {
        self.poll_interval = poll;
        self
    }

    /// Sets what `provision` does with a machine that failed.
    pub fn with_on_failure(mut self, policy: FailurePolicy) -> Self {
        self.on_failure = policy;
        self
    }

    /// Reads settings from YAML (durations such as `90s` or `5m`) and validates them.
    pub fn from_yaml(yaml: &str) -> Result<Self> {
        let s: ComposerSettings = crate::spec::from_yaml(yaml)?;
        s.validate().map_err(|e| crate::at_document_line(e, yaml))?;
        Ok(s)
    }

    /// Refuses zero durations, deadlines over [`MAX_DURATION`] and a poll interval over
    /// [`MAX_POLL_INTERVAL`], naming the field (`deadlines.boot`, `pollInterval`).
    pub fn validate(&self) -> Result<()> {
        let d = &self.deadlines;
        for (field, value, max) in [
            ("deadlines.create", d.create, MAX_DURATION),
            ("deadlines.boot", d.boot, MAX_DURATION),
            ("deadlines.bootstrap", d.bootstrap, MAX_DURATION),
            ("deadlines.delete", d.delete, MAX_DURATION),
            ("pollInterval", self.poll_interval, MAX_POLL_INTERVAL),
        ] {
            if value.is_zero() {
                return Err(Error::invalid_spec(field, "must be greater than zero"));
            }
            if value > max {
                return Err(Error::invalid_spec(
                    field,
                    format!(
                        "{} is longer than the largest allowed, {}",
                        humantime::format_duration(value),
                        humantime::format_duration(max)
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// When to look at a machine again, as kube-runtime's `Action` says it.
///
/// `#[non_exhaustive]`: kinds of action may be added (a `match` outside this crate needs
/// a catch-all arm); build one with [`Action::requeue`] or [`Action::await_change`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a controller returns the action, or the machine is never looked at again"]
#[non_exhaustive]
pub enum Action {
    /// Reconcile again after this long (zero: at once, progress was made).
    Requeue(Duration),
    /// Nothing to do until something changes (Ready, Failed, or gone).
    AwaitChange,
}

impl Action {
    /// Reconcile again after `after`.
    pub const fn requeue(after: Duration) -> Action {
        Action::Requeue(after)
    }

    /// Wait for a change.
    pub const fn await_change() -> Action {
        Action::AwaitChange
    }

    /// How long until the next look, or `None` to wait for a change: what a
    /// controller's own action type needs, whatever kinds of action are added.
    pub const fn requeue_after(&self) -> Option<Duration> {
        match self {
            Action::Requeue(d) => Some(*d),
            Action::AwaitChange => None,
        }
    }

    /// The action a controller's error policy returns for a failed reconcile, given its
    /// usual poll interval `poll`:
    /// - throttled: after the error's `retry_after` (else `poll`);
    /// - transient, timeout, conflict: after `poll`;
    /// - quota exceeded: after ten times `poll` (capacity rarely frees up in seconds);
    /// - invalid spec, permanent, unauthorized, not found, cancelled: wait for a change,
    ///   since trying the same thing again gives the same answer.
    pub fn for_error(e: &Error, poll: Duration) -> Action {
        use crate::ErrorKind as K;
        match e.kind() {
            K::Throttled => Action::Requeue(e.retry_after().unwrap_or(poll)),
            K::Transient | K::Timeout | K::Conflict => Action::Requeue(poll),
            K::QuotaExceeded => Action::Requeue(poll.saturating_mul(10)),
            _ => Action::AwaitChange,
        }
    }
}

/// The outcome of one reconcile step.
#[derive(Debug, Clone)]
#[must_use = "the action says when to look at the machine again"]
#[non_exhaustive]
pub struct Reconciled {
    /// The machine as seen after the step, with the composer's phase and conditions;
    /// `None` when there is no machine (after a deletion).
    pub machine: Option<Machine>,
    /// When to look again.
    pub action: Action,
}

/// A software layer in the role it plays on the machine. Each variant takes only a layer
/// that implements its role's trait, so a layer cannot be given a mode it lacks.
#[derive(Clone)]
#[non_exhaustive]
pub enum Layer {
    /// Rendered into user data at creation.
    Coupled(Arc<dyn CoupledSoftware>),
    /// Applied over a transport once the machine runs.
    Decoupled(Arc<dyn DecoupledSoftware>),
}

impl Layer {
    /// The layer's name.
    pub fn name(&self) -> &str {
        match self {
            Layer::Coupled(l) => l.name(),
            Layer::Decoupled(l) => l.name(),
        }
    }

    /// How the layer reaches the machine.
    pub fn mode(&self) -> Mode {
        match self {
            Layer::Coupled(_) => Mode::Coupled,
            Layer::Decoupled(_) => Mode::Decoupled,
        }
    }
}

impl fmt::Debug for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.mode())
    }
}

/// Chains a machine provisioner with software layers. Cheap to share behind an `Arc`;
/// every method takes `&self`.
pub struct Composer {
    provider: Arc<dyn MachineProvisioner>,
    layers: Vec<Layer>,
    connector: Option<Arc<dyn Connector>>,
    completion: Option<Arc<dyn CompletionCheck>>,
    /// The software steps on a running machine: the decoupled layers, after the
    /// completion check when there is coupled software to wait for.
    bootstrapper: Bootstrapper,
    settings: ComposerSettings,
    events: EventSink,
    /// Where the user data waits when it goes by reference; `None`: inline.
    by_reference: Option<ByReference>,
}

impl fmt::Debug for Composer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Composer")
            .field("provider", &self.provider.to_string())
            .field("layers", &self.layers)
            .field("connector", &self.connector.is_some())
            .field("completion", &self.completion.is_some())
            .field("settings", &self.settings)
            .field("by_reference", &self.by_reference)
            .finish()
    }
}

/// Builds a [`Composer`]; [`ComposerBuilder::build`] checks the combination.
pub struct ComposerBuilder {
    provider: Arc<dyn MachineProvisioner>,
    layers: Vec<Layer>,
    connector: Option<Arc<dyn Connector>>,
    completion: Option<Arc<dyn CompletionCheck>>,
    settings: ComposerSettings,
    events: Option<EventSink>,
    by_reference: Option<ByReference>,
}

impl ComposerBuilder {
    /// Adds a layer, after the layers already added.
    pub fn layer(mut self, layer: Layer) -> Self {
        self.layers.push(layer);
        self
    }

    /// Adds a coupled layer: its user-data parts go into the machine's user data.
    ///
    /// Only a [`CoupledSoftware`] is accepted here, and only a [`DecoupledSoftware`] by
    /// [`ComposerBuilder::decoupled`]: a layer given a mode it lacks does not compile.
    ///
    /// ```compile_fail
    /// use std::sync::Arc;
    /// use machine_core::sim::{SimCloud, SimConfig, SimProvider};
    /// use machine_core::user_data::UserDataPart;
    /// use machine_core::{Composer, CoupledSoftware, MachineSpec, Result, Software};
    ///
    /// /// A layer that exists only as user data.
    /// struct CloudConfigOnly;
    /// impl Software for CloudConfigOnly {
    ///     fn name(&self) -> &str { "only-user-data" }
    /// }
    /// impl CoupledSoftware for CloudConfigOnly {
    ///     fn user_data_parts(&self, _: &MachineSpec) -> Result<Vec<UserDataPart>> {
    ///         Ok(Vec::new())
    ///     }
    /// }
    ///
    /// let provider = Arc::new(SimProvider::new(SimCloud::new(), SimConfig::default()).unwrap());
    /// // Does not compile: CloudConfigOnly is not DecoupledSoftware.
    /// let _ = Composer::builder(provider).decoupled(Arc::new(CloudConfigOnly));
    /// ```
    pub fn coupled(self, software: Arc<dyn CoupledSoftware>) -> Self {
        self.layer(Layer::Coupled(software))
    }

    /// Adds a decoupled layer: applied over the connector's transport once the machine
    /// runs, after the coupled software finished.
    pub fn decoupled(self, software: Arc<dyn DecoupledSoftware>) -> Self {
        self.layer(Layer::Decoupled(software))
    }

    /// Sets how transports to running machines are opened (needed for decoupled layers
    /// and completion checks).
    pub fn connector(mut self, connector: Arc<dyn Connector>) -> Self {
        self.connector = Some(connector);
        self
    }

    /// Sets how completion of coupled software is observed. Without one, a machine with
    /// only coupled layers is Ready as soon as it runs: the composer cannot see inside it.
    pub fn completion(mut self, check: Arc<dyn CompletionCheck>) -> Self {
        self.completion = Some(check);
        self
    }

    /// Sets deadlines, poll interval and failure policy.
    pub fn settings(mut self, settings: ComposerSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Sends progress events to `events` (share one sink between composers to see a
    /// whole fleet in one stream).
    pub fn events(mut self, events: EventSink) -> Self {
        self.events = Some(events);
        self
    }

    /// Delivers the user data by reference (see [`crate::bootstrap_data`]): the composed
    /// user data is put in `delivery`'s store before each create, the machine gets only
    /// a stub that fetches and verifies it, and the document is withdrawn once the
    /// bootstrap finished and when the machine is deleted. Needs a completion check when
    /// there are coupled layers: it is how the composer knows the machine fetched its
    /// data, and how a stub that could not is reported Failed.
    pub fn by_reference(mut self, delivery: ByReference) -> Self {
        self.by_reference = Some(delivery);
        self
    }

    /// Checks that layer names are unique, decoupled
    /// layers and completion checks have a connector, coupled layers have a provider
    /// that takes user data, and coupled and decoupled layers together have a completion
    /// check. Errors name the layer (`layers[i]`) or `completion`.
    pub fn build(self) -> Result<Composer> {
        self.settings.validate().map_err(|e| e.within("settings"))?;
        let caps = self.provider.capabilities();
        let mut names = std::collections::HashSet::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let name = layer.name();
            let field = format!("layers[{i}]");
            if !names.insert(name) {
                return Err(Error::invalid_spec(
                    field,
                    format!("layer name {name:?} is used twice"),
                ));
            }
            match layer.mode() {
                Mode::Decoupled if self.connector.is_none() => {
                    return Err(Error::invalid_spec(
                        field,
                        format!("decoupled layer {name:?} needs a connector to reach machines"),
                    ));
                }
                Mode::Coupled if caps.user_data.is_none() => {
                    return Err(Error::invalid_spec(
                        field,
                        format!(
                            "coupled layer {name:?}: {} cannot deliver user data",
                            self.provider
                        ),
                    ));
                }
                _ => {}
            }
        }
        let first = |mode: Mode| {
            self.layers
                .iter()
                .find(|l| l.mode() == mode)
                .map(Layer::name)
        };
        if let (Some(coupled), Some(decoupled), None) = (
            first(Mode::Coupled),
            first(Mode::Decoupled),
            &self.completion,
        ) {
            // Without a check the decoupled layer would start while the user data is
            // still running on the machine.
            return Err(Error::invalid_spec(
                "completion",
                format!(
                    "coupled layer {coupled:?} and decoupled layer {decoupled:?} need a \
                     completion check, so that the decoupled layer starts after the user \
                     data finished: add .completion(...) (SentinelFile, or \
                     bootstrap_cloudinit::CloudInitStatus)"
                ),
            ));
        }
        if let (Some(coupled), Some(by_reference), None) =
            (first(Mode::Coupled), &self.by_reference, &self.completion)
        {
            return Err(Error::invalid_spec(
                "completion",
                format!(
                    "coupled layer {coupled:?} goes by reference through {}: add a completion \
                     check, so that the document is withdrawn once the machine has it and a \
                     stub that cannot fetch it is reported Failed",
                    by_reference.store()
                ),
            ));
        }
        if self.completion.is_some() && self.connector.is_none() {
            return Err(Error::invalid_spec(
                "completion",
                "a completion check needs a connector to reach machines",
            ));
        }
        let has_coupled = self.layers.iter().any(|l| l.mode() == Mode::Coupled);
        let mut bootstrapper = Bootstrapper::new();
        // Completion is only awaited when there is coupled software to finish.
        if let Some(check) = self.completion.clone().filter(|_| has_coupled) {
            bootstrapper = bootstrapper.with_completion(check);
        }
        for layer in &self.layers {
            if let Layer::Decoupled(l) = layer {
                bootstrapper = bootstrapper.with_layer(l.clone());
            }
        }
        Ok(Composer {
            provider: self.provider,
            layers: self.layers,
            bootstrapper,
            connector: self.connector,
            completion: self.completion,
            settings: self.settings,
            events: self.events.unwrap_or_default(),
            by_reference: self.by_reference,
        })
    }
}

impl Composer {
    /// Starts building a composer around `provider`.
    pub fn builder(provider: Arc<dyn MachineProvisioner>) -> ComposerBuilder {
        ComposerBuilder {
            provider,
            layers: Vec::new(),
            connector: None,
            completion: None,
            settings: ComposerSettings::default(),
            events: None,
            by_reference: None,
        }
    }

    /// The connector running machines are reached through, when there is one.
    pub fn connector(&self) -> Option<&Arc<dyn Connector>> {
        self.connector.as_ref()
    }

    /// The machine provisioner.
    pub fn provider(&self) -> &Arc<dyn MachineProvisioner> {
        &self.provider
    }

    /// The layers, in order.
    pub fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// The settings.
    pub fn settings(&self) -> &ComposerSettings {
        &self.settings
    }

    /// The delivery by reference, when the user data goes by reference.
    pub fn by_reference(&self) -> Option<&ByReference> {
        self.by_reference.as_ref()
    }

    /// The progress event sink; call `subscribe` on it.
    pub fn events(&self) -> &EventSink {
        &self.events
    }

    fn coupled(&self) -> impl Iterator<Item = &Arc<dyn CoupledSoftware>> {
        self.layers.iter().filter_map(|l| match l {
            Layer::Coupled(c) => Some(c),
            Layer::Decoupled(_) => None,
        })
    }

    /// The software steps this composer takes on a running machine, for callers that
    /// apply the same layers to machines they already hold.
    pub fn bootstrapper(&self) -> &Bootstrapper {
        &self.bootstrapper
    }

    /// The user data `spec`'s machine will be created with: every coupled layer's parts
    /// in order, then the completion check's, joined (MIME multipart when more than one)
    /// and fitted to the provider's budget (gzip when over it and accepted). Data that
    /// still does not fit is an invalid-spec error here, before any API call.
    ///
    /// Whatever kind each layer is, cloud-init then merges every cloud-config part
    /// additively and runs the script parts in this order (see [`user_data::assemble`]);
    /// what that merge would still resolve silently (one key given different values by
    /// two layers, host keys from two layers, ...) is refused here with an invalid-spec
    /// error naming both layers, and `runcmd` stops at its first failed command so that
    /// cloud-init records the failure (see [`user_data::compose`]).
    ///
    /// By reference ([`ComposerBuilder::by_reference`]) this is the same document, not
    /// fitted to the provider's budget (the provider is handed a stub): what cloud-init
    /// runs on the machine, the store's document plus the completion check's parts,
    /// which travel in the stub. The machine's coupled revision is this document's.
    pub fn user_data(&self, spec: &MachineSpec) -> Result<Option<UserData>> {
        let Some(composed) = self.compose(spec)? else {
            return Ok(None);
        };
        if self.by_reference.is_some() {
            return Ok(Some(composed.assembled));
        }
        let Some(delivery) = &self.provider.capabilities().user_data else {
            return Err(Error::invalid_spec(
                "userData",
                format!("{} cannot deliver user data", self.provider),
            ));
        };
        user_data::fit(composed.assembled, &composed.parts, delivery).map(Some)
    }

    /// Every coupled layer's parts and the completion check's, composed and assembled;
    /// `None` when no layer has a part.
    fn compose(&self, spec: &MachineSpec) -> Result<Option<Composed>> {
        let mut by_layer = Vec::new();
        for layer in self.coupled() {
            let name = layer.name();
            let parts = layer
                .user_data_parts(spec)
                .map_err(|e| e.context(format_args!("layer {name}")))?;
            check_host_keys_pinned(layer.as_ref(), spec, &parts)?;
            by_layer.push((name, parts));
        }
        if by_layer.iter().all(|(_, parts)| parts.is_empty()) {
            return Ok(None);
        }
        let mut completion_parts = 0;
        if let Some(check) = &self.completion {
            let parts = check.user_data_parts(spec);
            completion_parts = parts.len();
            by_layer.push(("completion check", parts));
        }
        let parts = user_data::compose(by_layer.iter().map(|(n, p)| (*n, p.as_slice())))?;
        let Some(assembled) = user_data::assemble(&parts)? else {
            return Ok(None);
        };
        Ok(Some(Composed {
            assembled,
            parts,
            completion_parts,
        }))
    }

    /// The document a store holds for `spec`'s machine (every layer's parts, without the
    /// completion check's, gzipped when over the store's limit) and the completion
    /// check's parts, which travel in the stub.
    fn document(
        &self,
        spec: &MachineSpec,
        store: &dyn crate::bootstrap_data::BootstrapDataStore,
    ) -> Result<Option<(UserData, Vec<UserDataPart>)>> {
        let Some(composed) = self.compose(spec)? else {
            return Ok(None);
        };
        let split = composed.parts.len() - composed.completion_parts;
        let (layers, completion) = composed.parts.split_at(split);
        let Some(document) = user_data::assemble(layers)? else {
            return Ok(None);
        };
        let budget = crate::UserDataDelivery::new(
            store.max_bytes(),
            crate::SizeBasis::Raw,
            UserDataFormat::ALL.to_vec(),
        )
        // Ignition's replace takes no gzip of ours; cloud-init unpacks it.
        .with_gzip(document.format != UserDataFormat::Ignition);
        let document = user_data::fit(document, layers, &budget)
            .map_err(|e| e.context(format_args!("the document for {store}")))?;
        Ok(Some((document, completion.to_vec())))
    }

    /// Withdraws from the store every document whose machine does not exist and that was
    /// stored more than `older_than` ago: what a create abandoned after its put (a crash,
    /// a dropped future) left. Returns the names withdrawn; nothing without delivery by
    /// reference.
    ///
    /// `older_than` must cover a create in flight in another replica (the time between
    /// its put and its machine being found): the create deadline is a safe choice.
    pub async fn sweep_bootstrap_data(&self, older_than: Duration) -> Result<Vec<MachineName>> {
        let Some(by_reference) = &self.by_reference else {
            return Ok(Vec::new());
        };
        let store = by_reference.store();
        let now = std::time::SystemTime::now();
        let mut swept = Vec::new();
        for doc in store.list().await? {
            let age = now.duration_since(doc.stored_at).unwrap_or_default();
            if age < older_than || self.provider.find(&doc.name).await?.is_some() {
                continue;
            }
            store.withdraw(&doc.name).await?;
            tracing::info!(machine = %doc.name, store = %store, "swept an orphaned bootstrap document");
            swept.push(doc.name);
        }
        Ok(swept)
    }
}

/// A composition: every part as inline, assembled, and how many trailing parts are the
/// completion check's.
struct Composed {
    assembled: UserData,
    parts: Vec<UserDataPart>,
    completion_parts: usize,
}

/// Every host key a layer's user data installs is one the layer names in
/// [`crate::Software::host_keys`], so the composer pins it (a key installed but not pinned
/// would have to be trusted on first use, or refused).
fn check_host_keys_pinned(
    layer: &dyn CoupledSoftware,
    spec: &MachineSpec,
    parts: &[crate::UserDataPart],
) -> Result<()> {
    let carried = user_data::carried_host_keys(layer.name(), parts)?;
    if carried.is_empty() {
        return Ok(());
    }
    // Compare the key itself (type and base64), not the comment.
    let bare = |k: &str| k.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
    let named: Vec<String> = layer.host_keys(spec)?.iter().map(|k| bare(k)).collect();
    match carried.iter().find(|k| !named.contains(&bare(k))) {
        None => Ok(()),
        Some(_) => Err(Error::invalid_spec(
            "ssh_keys",
            format!(
                "layer {:?} installs a host key it does not name in its host_keys, so the composer could not pin it: return every public key of its ssh_keys from host_keys (CloudConfigLayer does)",
                layer.name()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn zero_and_negative_durations_are_refused() {
        let e = ComposerSettings::from_yaml(
            "deadlines: {create: 0s, boot: 1m, bootstrap: 1m, delete: 1m}\n",
        )
        .unwrap_err();
        assert_eq!(e.field(), Some("deadlines.create"));
        let e = ComposerSettings::from_yaml("pollInterval: 0s\n").unwrap_err();
        assert_eq!(e.field(), Some("pollInterval"));
        let e = ComposerSettings::from_yaml("pollInterval: -5s\n").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
        assert!(e.to_string().contains("line 1"), "{e}");
        let ok = ComposerSettings::from_yaml("pollInterval: 500ms\nonFailure: DeleteOnFailure\n")
            .unwrap();
        assert_eq!(ok.poll_interval, Duration::from_millis(500));
        assert_eq!(ok.on_failure, FailurePolicy::DeleteOnFailure);
        // The snake_case names of earlier releases still read.
        let old =
            ComposerSettings::from_yaml("poll_interval: 500ms\non_failure: DeleteOnFailure\n")
                .unwrap();
        assert_eq!(old, ok);
    }

    #[test]
    fn errors_map_to_the_action_a_controller_returns() {
        let poll = Duration::from_secs(5);
        let throttled = Error::throttled("slow down", Some(Duration::from_secs(30)));
        assert_eq!(
            Action::for_error(&throttled, poll),
            Action::Requeue(Duration::from_secs(30))
        );
        assert_eq!(
            Action::for_error(&Error::transient("reset"), poll),
            Action::Requeue(poll)
        );
        assert_eq!(
            Action::for_error(&Error::invalid_spec("image", "no such image"), poll),
            Action::AwaitChange
        );
        assert_eq!(
            Action::for_error(&Error::permanent("layer failed"), poll),
            Action::AwaitChange
        );
    }
}
