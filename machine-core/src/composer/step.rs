//! The one step both `reconcile` and `provision` take: look at the machine as it is now
//! and move it one action toward Ready.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::bootstrap::{BootstrapState, BootstrapStep};
use super::{Action, Composer, Reconciled};
use crate::bootstrap_data::{self, ByReference};
use crate::conditions as C;
use crate::error::{Error, ErrorKind, Result};
use crate::machine::{Machine, Phase, ProviderId};
use crate::name::MachineName;
use crate::observe::{Timeline, TimelineRecorder};
use crate::revision;
use crate::spec::MachineSpec;
use crate::transport::Transport;
use crate::user_data::{self, UserData, UserDataFormat};

/// What a caller of `step` remembers between steps. `reconcile` starts from nothing each
/// time (level-triggered); `provision` keeps it to save calls and connections.
pub(crate) struct StepState {
    user_data: Option<Option<UserData>>,
    /// The coupled revision of the spec and its user data, with them.
    revision: String,
    provider_id: Option<ProviderId>,
    transport: Option<Arc<dyn Transport>>,
    bootstrap: BootstrapState,
    last_phase: Option<Phase>,
    /// The status the caller last recorded: its conditions keep their transition times,
    /// and a machine it saw Ready is not bootstrapped again while it keeps running.
    previous: Option<Machine>,
    /// End the step when the machine enters a new phase (created, running), so that the
    /// caller applies the new phase's deadline to what comes next. `provision` sets it;
    /// `reconcile` has no deadlines and goes as far as it can in one step.
    stop_at_phase_change: bool,
    pub(crate) timeline: TimelineRecorder,
}

impl StepState {
    pub(crate) fn new() -> Self {
        StepState {
            user_data: None,
            revision: String::new(),
            provider_id: None,
            transport: None,
            bootstrap: BootstrapState::default(),
            last_phase: None,
            previous: None,
            stop_at_phase_change: false,
            timeline: TimelineRecorder::start(),
        }
    }

    /// State for `provision`: one phase per step.
    pub(crate) fn phased() -> Self {
        StepState {
            stop_at_phase_change: true,
            ..StepState::new()
        }
    }

    /// State for a `reconcile` that knows the status recorded last time.
    fn after(previous: Option<&Machine>) -> Self {
        StepState {
            provider_id: previous.map(|m| m.provider_id.clone()),
            last_phase: previous.map(|m| m.phase),
            previous: previous.cloned(),
            ..StepState::new()
        }
    }

    pub(crate) fn timeline(&self) -> &Timeline {
        &self.timeline.timeline
    }
}

impl Composer {
    /// Takes one step toward Ready for `spec`'s machine and says when to look again.
    ///
    /// Level-triggered: it looks at the machine as the provider reports it now. With no
    /// machine it renders the user data (refusing what does not fit before any API call)
    /// and creates one; while it boots it asks to be requeued after the poll interval;
    /// once it runs it connects, checks coupled completion, and applies at most one
    /// decoupled layer that is not yet applied. It never waits for a machine to boot, so
    /// a controller never parks a worker on it.
    ///
    /// A machine its provider reports [`Phase::Stopped`] is neither Ready nor Failed: the
    /// composer never powers machines on or off (that is its owner's decision), so the
    /// step reports it Stopped with `InfrastructureReady` false (reason `Stopped`) and
    /// asks to look again after the poll interval; once it is started, the next step
    /// continues where it was (a machine that was Ready is verified again, since
    /// Stopped replaced Ready in its status). `provision` likewise waits for a stopped
    /// machine to run, within the deadline of the phase it is in.
    ///
    /// Errors decide the requeue, as in kube-runtime: retryable kinds are worth trying
    /// again; a permanent one (a layer's command failed) needs a change first.
    ///
    /// `previous` is the machine as the last reconcile returned it (a controller keeps it
    /// in the object's status), or `None`. With it, conditions keep their
    /// `lastTransition` while their status holds, so a controller that writes status back
    /// does not retrigger itself; and a machine that was Ready stays Ready without a
    /// connection while its provider reports it running. Pass `None` to verify the
    /// software again from scratch.
    pub async fn reconcile(
        &self,
        spec: &MachineSpec,
        previous: Option<&Machine>,
    ) -> Result<Reconciled> {
        spec.validate()?;
        let previous = previous.filter(|m| m.name == spec.name);
        self.step(spec, &mut StepState::after(previous))
            .instrument(tracing::info_span!("reconcile", machine = %spec.name))
            .await
    }

    /// Takes one step toward `name`'s machine being gone: deletes it if it exists and is
    /// not already going; `machine` is `None` once it is gone.
    pub async fn reconcile_deletion(&self, name: &MachineName) -> Result<Reconciled> {
        let Some(m) = self.provider.find(name).await? else {
            // Whatever an abandoned create of this name left in the store goes too.
            self.withdraw(name).await?;
            return Ok(Reconciled {
                machine: None,
                action: Action::AwaitChange,
            });
        };
        if m.phase != Phase::Deleting {
            self.withdraw(name).await?;
            self.provider.delete(&m.provider_id).await?;
            self.events.emit(name, Phase::Deleting, || {
                format!("deleting {}", m.provider_id)
            });
        }
        let machine = match self.provider.get(&m.provider_id).await {
            Ok(m) if m.phase == Phase::Deleted => None,
            Ok(m) => Some(m),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let action = match machine {
            Some(_) => Action::Requeue(self.settings.poll_interval),
            None => {
                self.events
                    .emit(name, Phase::Deleted, || "deleted".to_owned());
                Action::AwaitChange
            }
        };
        Ok(Reconciled { machine, action })
    }

    pub(crate) async fn step(&self, spec: &MachineSpec, st: &mut StepState) -> Result<Reconciled> {
        if st.user_data.is_none() {
            let user_data = self.user_data(spec)?;
            st.revision = revision::coupled_revision(spec, user_data.as_ref());
            st.user_data = Some(user_data);
        }
        let observed = match &st.provider_id {
            Some(id) => match self.provider.get(id).await {
                Ok(m) if m.phase != Phase::Deleted => Some(m),
                Ok(_) => None,
                Err(e) if e.kind() == ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            },
            None => match self.provider.find(&spec.name).await? {
                Some(m) => Some(same_set(spec, m)?),
                None => None,
            },
        };
        let (mut m, created_now) = match observed {
            Some(m) => (m, false),
            None => {
                let stub;
                let user_data = match &self.by_reference {
                    None => st.user_data.as_ref().and_then(Option::as_ref),
                    Some(by_reference) => {
                        // Put before the create: an abandoned create leaves a document
                        // the next put replaces or a sweep withdraws, never a machine
                        // whose document was never stored.
                        stub = self
                            .stub(spec, by_reference)
                            .instrument(tracing::info_span!("put"))
                            .await?;
                        stub.as_ref()
                    }
                };
                // Stamped through the provider, so that any process reads it back.
                let stamped = spec
                    .clone()
                    .with_label(revision::REVISION_LABEL, st.revision.clone());
                let m = self
                    .provider
                    .create(&stamped, user_data)
                    .instrument(tracing::info_span!("create"))
                    .await?;
                self.events
                    .emit(&spec.name, m.phase, || format!("created {}", m.provider_id));
                st.last_phase = Some(m.phase);
                (m, true)
            }
        };
        st.timeline.mark(|t| &mut t.created);
        st.provider_id = Some(m.provider_id.clone());
        self.expect_clients(&m).await?;
        self.add_pinned_host_keys(spec, &mut m)?;
        let previous = st
            .previous
            .take()
            .filter(|p| p.provider_id == m.provider_id);
        if let Some(p) = &previous {
            m.keep_conditions_of(p);
            // Cloud-init's verdict does not change once given: a machine seen finished
            // (an in-place update of a Ready one, a resumed bootstrap) is not asked again.
            if p.condition(C::BOOTSTRAP_COMPLETE).is_some_and(|c| c.status) {
                st.bootstrap.completion_seen();
            }
        }
        // After the previous conditions: their transition times hold while the status does.
        if let Some(made_from) = m.revision() {
            if made_from == st.revision {
                m.set_condition(
                    C::UP_TO_DATE,
                    true,
                    C::CURRENT,
                    "made from the spec's revision",
                );
            } else {
                let message = format!(
                    "made from revision {made_from}, the spec and coupled layers now give {}: only a new machine can take the change",
                    st.revision
                );
                m.set_condition(C::UP_TO_DATE, false, C::COUPLED_CHANGED, message);
            }
        }
        if created_now && st.stop_at_phase_change {
            self.note_phase(&m, st);
            return Ok(Reconciled {
                machine: Some(m),
                action: Action::Requeue(Duration::ZERO),
            });
        }

        let action = match m.phase {
            Phase::Pending | Phase::Provisioning | Phase::Deleting => {
                Action::Requeue(self.settings.poll_interval)
            }
            Phase::Deleted => Action::Requeue(Duration::ZERO),
            Phase::Failed => Action::AwaitChange,
            Phase::Stopped => {
                m.set_condition(
                    C::INFRASTRUCTURE_READY,
                    false,
                    C::STOPPED,
                    "the provider reports the machine stopped",
                );
                // Its transport, if any, went with the power.
                st.transport = None;
                Action::Requeue(self.settings.poll_interval)
            }
            Phase::Provisioned | Phase::Bootstrapping | Phase::Ready => {
                let first_seen_running = st.timeline().running.is_none();
                st.timeline.mark(|t| &mut t.running);
                m.set_condition(
                    C::INFRASTRUCTURE_READY,
                    true,
                    C::RUNNING,
                    "the provider reports the machine running",
                );
                if previous.as_ref().is_some_and(|p| p.phase == Phase::Ready) {
                    // Ready stays Ready while the provider reports it running: no
                    // connection, no re-check on every resync.
                    m.phase = Phase::Ready;
                    Action::AwaitChange
                } else if first_seen_running && st.stop_at_phase_change {
                    Action::Requeue(Duration::ZERO)
                } else {
                    self.bootstrap_step(&mut m, st)
                        .instrument(tracing::info_span!("bootstrap"))
                        .await?
                }
            }
        };
        if m.phase == Phase::Ready {
            st.timeline.mark(|t| &mut t.ready);
        }
        self.note_phase(&m, st);
        Ok(Reconciled {
            machine: Some(m),
            action,
        })
    }

    /// Software steps on a running machine; sets `m`'s phase to Bootstrapping or Ready.
    async fn bootstrap_step(&self, m: &mut Machine, st: &mut StepState) -> Result<Action> {
        if self.bootstrapper.is_empty() {
            m.phase = Phase::Ready;
            return Ok(Action::AwaitChange);
        }
        m.phase = Phase::Bootstrapping;
        self.note_phase(m, st);
        let Some(connector) = &self.connector else {
            // build() refuses decoupled layers and checks without a connector.
            return Err(Error::permanent("no connector configured"));
        };
        let transport = match &st.transport {
            Some(t) => t.clone(),
            None => match connector.connect(m).await {
                Ok(t) => {
                    st.timeline.mark(|t| &mut t.reachable);
                    st.transport = Some(t.clone());
                    t
                }
                Err(e) if e.is_retryable() => {
                    m.set_condition(C::REACHABLE, false, C::UNREACHABLE, e.to_string());
                    return Ok(Action::Requeue(self.settings.poll_interval));
                }
                Err(e) => return Err(e.context(format_args!("connecting to {}", m.name))),
            },
        };
        m.set_condition(
            C::REACHABLE,
            true,
            C::CONNECTED,
            "a transport reached the machine",
        );

        loop {
            let step = self
                .bootstrapper
                .step(m, transport.as_ref(), &mut st.bootstrap)
                .await;
            match step {
                Err(e) => return self.transport_error(m, st, e),
                Ok(BootstrapStep::Waiting) => {
                    return Ok(Action::Requeue(self.settings.poll_interval));
                }
                Ok(BootstrapStep::Failed(_)) => return Ok(Action::AwaitChange),
                Ok(BootstrapStep::CompletionDone) => st.timeline.mark(|t| &mut t.complete),
                Ok(BootstrapStep::AlreadyApplied(_)) => {}
                Ok(done @ BootstrapStep::Applied(_)) => {
                    self.events
                        .emit(&m.name, Phase::Bootstrapping, || done.to_string());
                    // One action per step: come back at once for the next layer.
                    if !self.bootstrapper.is_done(&st.bootstrap) {
                        return Ok(Action::Requeue(Duration::ZERO));
                    }
                }
                Ok(_) => break,
            }
        }
        // The machine has what it fetched: its document goes before the provider's own
        // withdrawal, and before Ready.
        self.withdraw(&m.name).await?;
        self.provider
            .bootstrap_finished(m)
            .await
            .map_err(|e| e.context(format_args!("finishing the bootstrap of {}", m.name)))?;
        m.phase = Phase::Ready;
        Ok(Action::AwaitChange)
    }

    /// Stores `spec`'s document and returns the stub the provider is handed, fitted to
    /// its budget; `None` when there is no coupled user data.
    async fn stub(
        &self,
        spec: &MachineSpec,
        by_reference: &ByReference,
    ) -> Result<Option<UserData>> {
        let store = by_reference.store();
        let Some((document, completion)) = self.document(spec, store.as_ref())? else {
            return Ok(None);
        };
        let location = store.put(&spec.name, &document.bytes).await.map_err(|e| {
            e.context(format_args!(
                "storing the user data of {} in {store}",
                spec.name
            ))
        })?;
        let window = by_reference.fetch_window();
        let stub = if document.format == UserDataFormat::Ignition {
            if !completion.is_empty() {
                return Err(Error::invalid_spec(
                    "completion",
                    "an Ignition document cannot carry the completion check's parts",
                ));
            }
            bootstrap_data::ignition_stub(&location, &document.bytes, window)?
        } else {
            bootstrap_data::cloud_init_stub(&location, &document.bytes, &completion, window)?
        };
        let Some(delivery) = &self.provider.capabilities().user_data else {
            return Err(Error::invalid_spec(
                "userData",
                format!("{} cannot deliver user data", self.provider),
            ));
        };
        user_data::fit(stub, &[], delivery)
            .map(Some)
            .map_err(|e| e.context("the stub of user data by reference"))
    }

    /// Tells the store where a booting machine fetches from, when the user data goes by
    /// reference and the machine reports addresses.
    async fn expect_clients(&self, m: &Machine) -> Result<()> {
        let Some(by_reference) = &self.by_reference else {
            return Ok(());
        };
        if !matches!(
            m.phase,
            Phase::Pending | Phase::Provisioning | Phase::Provisioned | Phase::Bootstrapping
        ) {
            return Ok(());
        }
        let ips: Vec<std::net::IpAddr> = m
            .addresses
            .iter()
            .filter_map(|a| a.address.parse().ok())
            .collect();
        if ips.is_empty() {
            return Ok(());
        }
        by_reference
            .store()
            .expect_clients(&m.name, &ips)
            .await
            .map_err(|e| {
                e.context(format_args!(
                    "binding the user data of {} to its addresses",
                    m.name
                ))
            })
    }

    /// Withdraws `name`'s document from the store, when the user data goes by reference.
    async fn withdraw(&self, name: &MachineName) -> Result<()> {
        let Some(by_reference) = &self.by_reference else {
            return Ok(());
        };
        let store = by_reference.store();
        store.withdraw(name).await.map_err(|e| {
            e.context(format_args!(
                "withdrawing the user data of {name} from {store}"
            ))
        })
    }

    /// Adds the host keys coupled layers put on the machine to its access info, so that
    /// the connector pins them.
    fn add_pinned_host_keys(&self, spec: &MachineSpec, m: &mut Machine) -> Result<()> {
        for layer in self.coupled() {
            for key in layer.host_keys(spec)? {
                if !m.access.host_keys.contains(&key) {
                    m.access.host_keys.push(key);
                }
            }
        }
        Ok(())
    }

    /// Emits a progress event when the phase differs from the last one noted.
    fn note_phase(&self, m: &Machine, st: &mut StepState) {
        if st.last_phase == Some(m.phase) {
            return;
        }
        st.last_phase = Some(m.phase);
        tracing::debug!(machine = %m.name, phase = %m.phase, "phase");
        self.events.emit(&m.name, m.phase, || match &m.failure {
            Some(f) => format!("{}: {}", f.reason, f.message),
            None => format!("phase {}", m.phase),
        });
    }

    /// A retryable error on the transport drops the connection and requeues; any other
    /// error is the step's error.
    fn transport_error(&self, m: &mut Machine, st: &mut StepState, e: Error) -> Result<Action> {
        if e.is_retryable() {
            st.transport = None;
            m.set_condition(C::REACHABLE, false, C::CONNECTION_LOST, e.to_string());
            Ok(Action::Requeue(self.settings.poll_interval))
        } else {
            Err(e)
        }
    }
}

/// Whether `e` is [`same_set`]'s refusal: the spec's name is another's machine.
pub(crate) fn name_taken(e: &Error) -> bool {
    e.kind() == ErrorKind::Conflict && e.field() == Some("name")
}

/// `m`, found by `spec`'s name, if it belongs to the same set as `spec` (or, like it, to
/// none). Otherwise it is not this spec's machine: adopting it would let a fleet take a
/// standalone machine (and delete it when it scales down), or a standalone spec a
/// fleet's member. The error is a conflict on the field `name`, which a fleet reads as
/// "this name is taken" and moves on to its slot's next generation.
fn same_set(spec: &MachineSpec, m: Machine) -> Result<Machine> {
    let ours = spec.labels.get(crate::fleet::SET_LABEL);
    let theirs = m.labels.get(crate::fleet::SET_LABEL);
    if ours == theirs {
        return Ok(m);
    }
    let whose =
        |set: Option<&String>| set.map_or_else(|| "no set".to_owned(), |s| format!("set {s}"));
    Err(Error::new(
        ErrorKind::Conflict,
        format!(
            "a machine named {} ({}) already exists and belongs to {}, not to {} as this spec does: it is another's machine, so it is neither adopted nor changed; give this one another name",
            spec.name,
            m.provider_id,
            whose(theirs),
            whose(ours)
        ),
    )
    .with_field("name"))
}
