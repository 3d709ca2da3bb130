//! The software steps on a running machine, shared by the composer and by anything that
//! applies layers to machines it did not create (bootstrap-ssh's `LayerRunner`): wait
//! for coupled software to finish, then apply each decoupled layer not yet applied.

use std::fmt;
use std::sync::Arc;

use tracing::Instrument;

use crate::conditions as C;
use crate::error::Result;
use crate::machine::Machine;
use crate::software::{Completion, CompletionCheck, DecoupledSoftware};
use crate::transport::Transport;

/// Checks coupled completion and applies decoupled layers on a running machine, one
/// action per [`Bootstrapper::step`]. The composer takes its steps through one; so can a
/// caller that already holds running machines and a transport to each.
///
/// It never connects and never waits: the caller owns the transport (and reconnects when
/// an error is retryable) and decides how long to wait when the coupled software is still
/// running.
#[derive(Clone, Default)]
pub struct Bootstrapper {
    completion: Option<Arc<dyn CompletionCheck>>,
    layers: Vec<Arc<dyn DecoupledSoftware>>,
}

impl fmt::Debug for Bootstrapper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.layers.iter().map(|l| l.name()).collect();
        f.debug_struct("Bootstrapper")
            .field("completion", &self.completion.is_some())
            .field("layers", &names)
            .finish()
    }
}

/// What a [`Bootstrapper`] remembers between steps on one machine. A fresh one checks
/// completion and every layer again (each layer's `is_applied` skips what is done).
#[derive(Debug, Clone, Default)]
pub struct BootstrapState {
    completion_done: bool,
    layers_done: usize,
}

impl BootstrapState {
    /// Skips the completion check: the coupled software was already seen finished on
    /// this machine (its `BootstrapComplete` condition), so only layers are left.
    pub(crate) fn completion_seen(&mut self) {
        self.completion_done = true;
    }
}

/// What one [`Bootstrapper::step`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BootstrapStep {
    /// The coupled software is still running: look again later.
    Waiting,
    /// The completion check reported the coupled software finished.
    CompletionDone,
    /// The named layer was found already applied.
    AlreadyApplied(String),
    /// The named layer was applied now.
    Applied(String),
    /// The coupled software failed; the machine is marked Failed with this message.
    Failed(String),
    /// Nothing is left to do: the machine has all its software.
    Done,
}

impl fmt::Display for BootstrapStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootstrapStep::Waiting => f.write_str("coupled software still running"),
            BootstrapStep::CompletionDone => f.write_str("coupled software complete"),
            BootstrapStep::AlreadyApplied(name) => write!(f, "layer {name} already applied"),
            BootstrapStep::Applied(name) => write!(f, "layer {name} applied"),
            BootstrapStep::Failed(why) => write!(f, "coupled software failed: {why}"),
            BootstrapStep::Done => f.write_str("all software applied"),
        }
    }
}

impl Bootstrapper {
    /// Nothing to wait for and no layer: every step is [`BootstrapStep::Done`].
    pub fn new() -> Self {
        Bootstrapper::default()
    }

    /// Before any layer, waits until `check` says the coupled software finished.
    pub fn with_completion(mut self, check: Arc<dyn CompletionCheck>) -> Self {
        self.completion = Some(check);
        self
    }

    /// Adds a layer, applied after the ones added before.
    pub fn with_layer(mut self, layer: Arc<dyn DecoupledSoftware>) -> Self {
        self.layers.push(layer);
        self
    }

    /// The decoupled layers, in order.
    pub fn layers(&self) -> &[Arc<dyn DecoupledSoftware>] {
        &self.layers
    }

    /// The digest of the decoupled layers as a set, for `machine` (see
    /// [`crate::revision::LAYER_SET_PATH`]).
    pub fn layer_set_digest(&self, machine: &Machine) -> String {
        let digests: Vec<Option<String>> = self.layers.iter().map(|l| l.digest(machine)).collect();
        crate::revision::layer_set_digest(
            self.layers
                .iter()
                .zip(&digests)
                .map(|(l, d)| (l.name(), d.as_deref())),
        )
    }

    /// Records that every layer is applied: the set's digest, on the machine. Layers
    /// without digests record nothing (a fleet does not compare them), so a composer of
    /// such layers writes nowhere it did not before.
    async fn record_set(&self, machine: &Machine, transport: &dyn Transport) -> Result<()> {
        if self.layers.iter().all(|l| l.digest(machine).is_none()) {
            return Ok(());
        }
        transport
            .upload(
                &crate::transport::FileUpload::new(
                    crate::revision::LAYER_SET_PATH,
                    format!("{}\n", self.layer_set_digest(machine)),
                )
                .mode(0o644),
            )
            .await
            .map_err(|e| e.context("recording the layers applied"))
    }

    /// Whether there is nothing to do on any machine (no check, no layer), so no
    /// transport is needed.
    pub fn is_empty(&self) -> bool {
        self.completion.is_none() && self.layers.is_empty()
    }

    /// Whether `state` has nothing left to do.
    pub fn is_done(&self, state: &BootstrapState) -> bool {
        (self.completion.is_none() || state.completion_done)
            && state.layers_done >= self.layers.len()
    }

    /// Takes one action on `machine` over `transport`: checks completion once (until it
    /// reports done), else looks at the next layer and applies it unless already
    /// applied. Records the outcome in `machine`'s conditions (`BootstrapComplete`,
    /// `LayerApplied/<name>`); a failed completion marks the machine Failed.
    ///
    /// Errors are the transport's or the layer's (a failed apply is wrapped with
    /// `layer <name>`); a retryable one is worth a new transport and another step.
    pub async fn step(
        &self,
        machine: &mut Machine,
        transport: &dyn Transport,
        state: &mut BootstrapState,
    ) -> Result<BootstrapStep> {
        if let Some(check) = self.completion.as_ref().filter(|_| !state.completion_done) {
            return Ok(match check.check(machine, transport).await? {
                Completion::Done => {
                    state.completion_done = true;
                    machine.set_condition(
                        C::BOOTSTRAP_COMPLETE,
                        true,
                        C::COMPLETE,
                        "coupled software finished",
                    );
                    BootstrapStep::CompletionDone
                }
                Completion::Pending => {
                    machine.set_condition(
                        C::BOOTSTRAP_COMPLETE,
                        false,
                        C::WAITING,
                        "coupled software still running",
                    );
                    BootstrapStep::Waiting
                }
                Completion::Failed(message) => {
                    machine.set_condition(C::BOOTSTRAP_COMPLETE, false, C::FAILED, message.clone());
                    machine.fail(C::BOOTSTRAP_FAILED, message.clone());
                    BootstrapStep::Failed(message)
                }
            });
        }
        // A machine seen afresh (a reconcile's) carries no record of earlier steps.
        for layer in self.layers.iter().take(state.layers_done) {
            let condition = C::layer_applied(layer.name());
            if !machine.condition(&condition).is_some_and(|c| c.status) {
                machine.set_condition(&condition, true, C::APPLIED, "applied");
            }
        }
        let Some(layer) = self.layers.get(state.layers_done) else {
            return Ok(BootstrapStep::Done);
        };
        let name = layer.name();
        let condition = C::layer_applied(name);
        let digest = layer.digest(machine);
        let recorded = match &digest {
            Some(_) => read_digest(transport, name).await?,
            None => None,
        };
        let applied = match (&digest, &recorded) {
            (Some(want), Some(have)) => want == have,
            // No record to compare (no digest, or a machine made before): the layer
            // itself says.
            _ => layer.is_applied(machine, transport).await?,
        };
        if applied {
            if let Some(want) = digest.filter(|d| recorded.as_ref() != Some(d)) {
                write_digest(transport, name, &want).await?;
            }
            state.layers_done += 1;
            if state.layers_done == self.layers.len() {
                self.record_set(machine, transport).await?;
            }
            machine.set_condition(&condition, true, C::APPLIED, "already applied");
            return Ok(BootstrapStep::AlreadyApplied(name.to_owned()));
        }
        let changed = recorded.is_some();
        let applied = layer
            .apply(machine, transport)
            .instrument(tracing::info_span!("layer", layer = name, changed))
            .await;
        if let Err(e) = applied {
            machine.set_condition(&condition, false, C::APPLY_FAILED, e.to_string());
            return Err(e.context(format_args!("layer {name}")));
        }
        if let Some(want) = &digest {
            write_digest(transport, name, want).await?;
        }
        state.layers_done += 1;
        if state.layers_done == self.layers.len() {
            self.record_set(machine, transport).await?;
        }
        let why = if changed {
            "applied again: the layer changed"
        } else {
            "applied"
        };
        machine.set_condition(&condition, true, C::APPLIED, why);
        Ok(BootstrapStep::Applied(name.to_owned()))
    }
}

/// The digest recorded for `layer` on the machine, if any.
async fn read_digest(transport: &dyn Transport, layer: &str) -> Result<Option<String>> {
    let bytes = transport
        .read_file(&crate::revision::layer_digest_path(layer), 1024)
        .await?;
    Ok(bytes.map(|b| String::from_utf8_lossy(&b).trim().to_owned()))
}

/// Records `digest` as `layer`'s applied digest on the machine.
async fn write_digest(transport: &dyn Transport, layer: &str, digest: &str) -> Result<()> {
    transport
        .upload(
            &crate::transport::FileUpload::new(
                crate::revision::layer_digest_path(layer),
                format!("{digest}\n"),
            )
            .mode(0o644),
        )
        .await
        .map_err(|e| e.context(format_args!("recording layer {layer}'s digest")))
}
