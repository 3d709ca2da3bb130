//! Driving a machine to Ready (or gone) with deadlines and cancellation: a loop over
//! [`Composer::step`].

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::step::StepState;
use super::{Action, Composer, FailurePolicy};
use crate::error::{Error, Result};
use crate::machine::{Machine, Phase};
use crate::name::MachineName;
use crate::observe::Timeline;
use crate::spec::MachineSpec;

/// A machine that reached Ready, with where its time went.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Provisioned {
    /// The machine, in phase Ready.
    pub machine: Machine,
    /// Where the time went.
    pub timeline: Timeline,
}

#[derive(Clone, Copy)]
enum Stage {
    Create,
    Boot,
    Bootstrap,
}

impl Stage {
    /// The settings field of this phase's deadline, as errors name it.
    fn field(self) -> &'static str {
        match self {
            Stage::Create => "deadlines.create",
            Stage::Boot => "deadlines.boot",
            Stage::Bootstrap => "deadlines.bootstrap",
        }
    }
}

impl Composer {
    /// Drives `spec`'s machine to Ready: creates (or adopts) it, waits for it to run,
    /// checks coupled completion and applies decoupled layers.
    ///
    /// Each phase has its deadline ([`super::Deadlines`]): create from the start, boot
    /// from creation, bootstrap from running. Passing one is a timeout error that says
    /// which phase and what was last seen (the unreachable host's error, the failing
    /// layer), not just "timed out". Retryable errors are retried until the deadline;
    /// others fail at once. On failure the [`FailurePolicy`] applies.
    ///
    /// Cancelling `cancel` stops at the next await point with a cancelled error; the
    /// machine, if it was created, is tagged with its name, so [`Composer::deprovision`]
    /// finds it. Cancellation does not trigger the failure policy: the caller decides.
    pub async fn provision(
        &self,
        spec: &MachineSpec,
        cancel: &CancellationToken,
    ) -> Result<Provisioned> {
        spec.validate()?;
        let span = tracing::info_span!("provision", machine = %spec.name);
        let result = self.provision_loop(spec, cancel).instrument(span).await;
        match result {
            Ok(p) => Ok(p),
            Err(e) if e.kind() == crate::ErrorKind::Cancelled => Err(e),
            // The name is another's machine: never deleted on this spec's behalf.
            Err(e) if super::step::name_taken(&e) => Err(e),
            Err(e) => {
                if self.settings.on_failure == FailurePolicy::DeleteOnFailure {
                    tracing::warn!(machine = %spec.name, error = %e, "provisioning failed; deleting the machine");
                    if let Err(de) = self.deprovision(&spec.name, cancel).await {
                        tracing::error!(machine = %spec.name, error = %de, "deleting the failed machine failed too");
                        return Err(
                            e.context(format_args!("(deleting it afterwards failed: {de})"))
                        );
                    }
                }
                Err(e)
            }
        }
    }

    async fn provision_loop(
        &self,
        spec: &MachineSpec,
        cancel: &CancellationToken,
    ) -> Result<Provisioned> {
        let start = Instant::now();
        // One phase per step, so each step runs under its own phase's deadline.
        let mut st = StepState::phased();
        let mut last_seen = String::from("nothing yet");
        let cancelled = || Error::cancelled(format!("provisioning {} was cancelled", spec.name));
        loop {
            let (stage, deadline) = self.stage(start, st.timeline());
            let outcome = tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(cancelled()),
                r = tokio::time::timeout_at(deadline, self.step(spec, &mut st)) => r,
            };
            let wait = match outcome {
                Err(_elapsed) => return Err(self.timeout(spec, stage, &last_seen)),
                Ok(Ok(r)) => {
                    let m = r.machine.as_ref();
                    if let Some(m) = m {
                        last_seen = describe(m);
                        match m.phase {
                            Phase::Ready => {
                                return Ok(Provisioned {
                                    machine: m.clone(),
                                    timeline: st.timeline().clone(),
                                });
                            }
                            Phase::Failed => {
                                let f = m.failure.as_ref();
                                return Err(Error::permanent(format!(
                                    "machine {} failed: {}",
                                    spec.name,
                                    f.map_or_else(
                                        || "no reason given".to_owned(),
                                        |f| format!("{}: {}", f.reason, f.message)
                                    )
                                )));
                            }
                            _ => {}
                        }
                    }
                    match r.action {
                        Action::Requeue(after) => after,
                        Action::AwaitChange => self.settings.poll_interval,
                    }
                }
                Ok(Err(e)) if e.is_retryable() => {
                    tracing::debug!(machine = %spec.name, error = %e, "retryable error; trying again");
                    last_seen = e.to_string();
                    e.retry_after().unwrap_or(self.settings.poll_interval)
                }
                Ok(Err(e)) => return Err(e),
            };
            if wait.is_zero() {
                continue;
            }
            // The step may have moved the machine into a new phase: wait against the
            // deadline of the phase it is in now.
            let (stage, deadline) = self.stage(start, st.timeline());
            let wake = Instant::now()
                .checked_add(wait)
                .unwrap_or(deadline)
                .min(deadline);
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(cancelled()),
                _ = tokio::time::sleep_until(wake) => {}
            }
            if Instant::now() >= deadline {
                return Err(self.timeout(spec, stage, &last_seen));
            }
        }
    }

    /// The phase a machine is in, by its timeline, and when that phase's time is up:
    /// each phase's deadline counts from when that phase began.
    fn stage(&self, start: Instant, t: &Timeline) -> (Stage, Instant) {
        let d = &self.settings.deadlines;
        let (stage, began, limit) = match (t.created, t.running) {
            (None, _) => (Stage::Create, Duration::ZERO, d.create),
            (Some(created), None) => (Stage::Boot, created, d.boot),
            (Some(_), Some(running)) => (Stage::Bootstrap, running, d.bootstrap),
        };
        (stage, after(start, began + limit))
    }

    fn timeout(&self, spec: &MachineSpec, stage: Stage, last_seen: &str) -> Error {
        let d = &self.settings.deadlines;
        let (what, limit) = match stage {
            Stage::Create => ("was not created", d.create),
            Stage::Boot => ("did not start running", d.boot),
            Stage::Bootstrap => ("did not finish bootstrapping", d.bootstrap),
        };
        Error::timeout(format!(
            "machine {} {what} within {} (the {} deadline); last seen: {last_seen}",
            spec.name,
            humantime::format_duration(limit),
            stage.field(),
        ))
    }

    /// Deletes `name`'s machine and waits until it is gone, within the delete deadline.
    /// Succeeds when there is no such machine. Cancelling `cancel` stops it at once, even
    /// while it waits between looks.
    pub async fn deprovision(&self, name: &MachineName, cancel: &CancellationToken) -> Result<()> {
        let limit = self.settings.deadlines.delete;
        let deadline = after(Instant::now(), limit);
        let cancelled = || Error::cancelled(format!("deprovisioning {name} was cancelled"));
        let span = tracing::info_span!("deprovision", machine = %name);
        async {
            loop {
                let r = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return Err(cancelled()),
                    r = tokio::time::timeout_at(deadline, self.reconcile_deletion(name)) => r,
                };
                let wait = match r {
                    Err(_) => None,
                    Ok(Ok(r)) if r.machine.is_none() => return Ok(()),
                    Ok(Ok(_)) => Some(self.settings.poll_interval),
                    Ok(Err(e)) if e.is_retryable() => {
                        Some(e.retry_after().unwrap_or(self.settings.poll_interval))
                    }
                    Ok(Err(e)) => return Err(e),
                };
                match wait.and_then(|w| Instant::now().checked_add(w)) {
                    Some(wake) if wake < deadline => tokio::select! {
                        biased;
                        _ = cancel.cancelled() => return Err(cancelled()),
                        _ = tokio::time::sleep_until(wake) => {}
                    },
                    _ => {
                        return Err(Error::timeout(format!(
                            "machine {name} was not gone within {} (the deadlines.delete deadline)",
                            humantime::format_duration(limit)
                        )));
                    }
                }
            }
        }
        .instrument(span)
        .await
    }
}

/// `start + d`, or a far-off instant when that does not fit (validated settings never
/// get there; this keeps a hand-built one from panicking).
fn after(start: Instant, d: Duration) -> Instant {
    start
        .checked_add(d)
        .unwrap_or_else(|| start + super::MAX_DURATION)
}

fn describe(m: &Machine) -> String {
    let mut s = format!("phase {}", m.phase);
    for c in m.conditions.iter().filter(|c| !c.status) {
        s.push_str(&format!(
            "; {}={} ({}: {})",
            c.kind, c.status, c.reason, c.message
        ));
    }
    s
}
