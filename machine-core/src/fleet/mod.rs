//! Fleets that live: a [`MachineSet`] says how many machines of one template to keep, and
//! a [`FleetReconciler`] takes one non-blocking step at a time toward it, as the
//! composer does for one machine, returning a [`FleetStatus`] and when to look again.
//!
//! What changed decides how the fleet converges (see [`crate::revision`]):
//! - a **decoupled** layer that changed is applied again **in place**, machine by
//!   machine (at most `maxUnavailable`, at least one, at a time), each counted
//!   unavailable while it updates;
//! - anything **coupled** (a coupled layer, the completion check's parts) or a change of
//!   the spec's shaping fields needs a **new machine**: replacements honour `maxSurge` and
//!   `maxUnavailable` as a Kubernetes Deployment does.
//!
//! Health: a machine is unhealthy when it is Failed, not Ready within the startup
//! timeout, or when its probe (a connection, and a command where one is given) has failed
//! for longer than the probe's threshold. Unhealthy machines are deleted and their place
//! refilled, never more than `maxUnhealthy` at a time: past that, remediation stops and
//! the status says so, so that a storm cannot delete the fleet.
//!
//! # Names and crash safety
//! Machines are named `<set>-<slot>-<generation>`: a slot is one replica's place, the
//! generation counts the machines that held it. A replacement takes the next generation
//! of its slot (one more than any machine of the slot listed, deleting ones included), so
//! a name is never reused while a machine of that name is still going. Every decision is
//! made from the provider's listing of the set's machines (label `machine-core/set`),
//! their stamped revisions and creation times (label `machine-core/created`), never from
//! memory alone: a reconciler killed at any point, or two at once, compute the same
//! names, and create is idempotent by name. The reconciler's memory (which machines it
//! saw Ready with which layers, probe results) only saves calls; a new process verifies
//! each machine once. The one thing a listing cannot show, that a rollout paused at a
//! failing template, is in the status each step returns: a caller that keeps it hands
//! it to the next process's reconciler ([`FleetReconciler::resume`]).

mod names;
mod reconciler;

pub use names::{CREATED_LABEL, SET_LABEL, SLOT_LABEL};
pub use reconciler::{ChangeKind, FleetReconciled, FleetReconciler, PlannedChange};

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::machine::Condition;
use crate::name::check_dns_label;
use crate::spec::MachineSpec;

/// The longest set name: `<set>-<slot>-<generation>` must stay a DNS label (63
/// characters) for slots and generations up to six digits each.
pub const MAX_SET_NAME_LEN: usize = 49;

/// A count given as a number or a percentage of the replicas (`3`, `"25%"`), as a
/// Kubernetes Deployment's `maxSurge` and `maxUnavailable` are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntOrPercent {
    /// A number of machines.
    Int(u32),
    /// A percentage of the replicas, 0 to 100.
    Percent(u32),
}

impl IntOrPercent {
    /// The count for `replicas`: a percentage rounded up (`round_up`, as for surge) or
    /// down (as for unavailability).
    pub fn resolve(self, replicas: u32, round_up: bool) -> u32 {
        match self {
            IntOrPercent::Int(n) => n,
            IntOrPercent::Percent(p) => {
                let scaled = u64::from(replicas) * u64::from(p);
                let n = if round_up {
                    scaled.div_ceil(100)
                } else {
                    scaled / 100
                };
                u32::try_from(n).unwrap_or(u32::MAX)
            }
        }
    }

    fn check(self, field: &str) -> Result<()> {
        match self {
            IntOrPercent::Percent(p) if p > 100 => {
                Err(Error::invalid_spec(field, format!("{p}% is over 100%")))
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for IntOrPercent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IntOrPercent::Int(n) => write!(f, "{n}"),
            IntOrPercent::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl Serialize for IntOrPercent {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            IntOrPercent::Int(n) => s.serialize_u32(*n),
            IntOrPercent::Percent(_) => s.serialize_str(&self.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for IntOrPercent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u32),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(IntOrPercent::Int(n)),
            Raw::Text(t) => {
                let t = t.trim();
                match t.strip_suffix('%').map(str::trim) {
                    Some(p) => p.parse().map(IntOrPercent::Percent).map_err(|_| {
                        serde::de::Error::custom(format!("{t:?} is not a percentage such as 25%"))
                    }),
                    None => t.parse().map(IntOrPercent::Int).map_err(|_| {
                        serde::de::Error::custom(format!(
                            "{t:?} is neither a count nor a percentage such as 25%"
                        ))
                    }),
                }
            }
        }
    }
}

/// How machines are replaced when something coupled changed, and how many may be updated
/// in place at once. The defaults are a Deployment's: 25% surge, 25% unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[non_exhaustive]
pub struct Rollout {
    /// How many machines over `replicas` may exist during a rollout (rounded up).
    #[serde(default = "default_quarter")]
    pub max_surge: IntOrPercent,
    /// How many of `replicas` may be unavailable during a rollout or an in-place update
    /// (rounded down). An in-place update goes one machine at a time even at 0.
    #[serde(default = "default_quarter")]
    pub max_unavailable: IntOrPercent,
}

fn default_quarter() -> IntOrPercent {
    IntOrPercent::Percent(25)
}

impl Default for Rollout {
    fn default() -> Self {
        Rollout {
            max_surge: default_quarter(),
            max_unavailable: default_quarter(),
        }
    }
}

impl Rollout {
    /// Sets `max_surge`.
    pub fn with_max_surge(mut self, n: IntOrPercent) -> Self {
        self.max_surge = n;
        self
    }

    /// Sets `max_unavailable`.
    pub fn with_max_unavailable(mut self, n: IntOrPercent) -> Self {
        self.max_unavailable = n;
        self
    }
}

/// Which machines go first when the set scales down. Unhealthy machines always go
/// first, then machines not Ready, then by this order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum DeletePolicy {
    /// The oldest machines first (by creation time).
    #[default]
    Oldest,
    /// The newest machines first.
    Newest,
    /// Any, chosen at random.
    Random,
}

/// A health probe, run over the composer's connector against every Ready machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[non_exhaustive]
pub struct Probe {
    /// A command that must exit 0; without one, reaching the machine is the probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// How often each machine is probed.
    #[serde(default = "default_probe_interval", with = "humantime_serde")]
    pub interval: Duration,
    /// How long a machine may fail its probe before it is unhealthy.
    #[serde(default = "default_probe_threshold", with = "humantime_serde")]
    pub unhealthy_after: Duration,
    /// How long one probe may take.
    #[serde(default = "default_probe_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

fn default_probe_interval() -> Duration {
    Duration::from_secs(30)
}
fn default_probe_threshold() -> Duration {
    Duration::from_secs(120)
}
fn default_probe_timeout() -> Duration {
    Duration::from_secs(10)
}

impl Probe {
    /// Reaching the machine is the probe, every 30 s; unhealthy after 2 minutes of
    /// failures; 10 s per probe.
    pub fn reachable() -> Self {
        Probe {
            command: None,
            interval: default_probe_interval(),
            unhealthy_after: default_probe_threshold(),
            timeout: default_probe_timeout(),
        }
    }

    /// A command that must exit 0, with the other settings as [`Probe::reachable`].
    pub fn command(command: impl Into<String>) -> Self {
        Probe {
            command: Some(command.into()),
            ..Probe::reachable()
        }
    }

    /// Sets the interval.
    pub fn with_interval(mut self, d: Duration) -> Self {
        self.interval = d;
        self
    }

    /// Sets how long failures may last before the machine is unhealthy.
    pub fn with_unhealthy_after(mut self, d: Duration) -> Self {
        self.unhealthy_after = d;
        self
    }

    /// Sets the timeout of one probe.
    pub fn with_timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }
}

/// When a machine is unhealthy, and how remediation is bounded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[non_exhaustive]
pub struct HealthCheck {
    /// A machine not Ready this long after it was created is unhealthy.
    #[serde(default = "default_startup", with = "humantime_serde")]
    pub startup_timeout: Duration,
    /// A probe of Ready machines; none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<Probe>,
    /// The most unhealthy machines remediated: with more unhealthy at once, remediation
    /// stops (a storm, not a sick machine) and the status says so. Default 40%.
    #[serde(default = "default_max_unhealthy")]
    pub max_unhealthy: IntOrPercent,
    /// The least time between two remediations started.
    #[serde(default = "default_remediation_interval", with = "humantime_serde")]
    pub remediation_interval: Duration,
}

fn default_startup() -> Duration {
    Duration::from_secs(30 * 60)
}
fn default_max_unhealthy() -> IntOrPercent {
    IntOrPercent::Percent(40)
}
fn default_remediation_interval() -> Duration {
    Duration::from_secs(10)
}

impl Default for HealthCheck {
    /// 30 minutes to become Ready, no probe, at most 40% unhealthy remediated, 10 s
    /// between remediations.
    fn default() -> Self {
        HealthCheck {
            startup_timeout: default_startup(),
            probe: None,
            max_unhealthy: default_max_unhealthy(),
            remediation_interval: default_remediation_interval(),
        }
    }
}

impl HealthCheck {
    /// Sets the startup timeout.
    pub fn with_startup_timeout(mut self, d: Duration) -> Self {
        self.startup_timeout = d;
        self
    }

    /// Sets the probe.
    pub fn with_probe(mut self, probe: Probe) -> Self {
        self.probe = Some(probe);
        self
    }

    /// Sets the most unhealthy machines remediated.
    pub fn with_max_unhealthy(mut self, n: IntOrPercent) -> Self {
        self.max_unhealthy = n;
        self
    }

    /// Sets the least time between remediations.
    pub fn with_remediation_interval(mut self, d: Duration) -> Self {
        self.remediation_interval = d;
        self
    }
}

/// A fleet's desired state: `replicas` machines made from `template`, named after the set.
///
/// Read from YAML or JSON in camelCase; `#[non_exhaustive]`: build it with
/// [`MachineSet::new`] and the `with_*` methods.
///
/// ```
/// use machine_core::fleet::{IntOrPercent, MachineSet, Rollout};
/// use machine_core::{MachineName, MachineSpec};
///
/// let template = MachineSpec::new(MachineName::new("web")?).with_image("debian-12");
/// let set = MachineSet::new("web", 5, template)
///     .with_rollout(Rollout::default().with_max_surge(IntOrPercent::Int(1)));
/// set.validate()?;
/// # Ok::<(), machine_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[non_exhaustive]
pub struct MachineSet {
    /// The set's name: a DNS label of at most [`MAX_SET_NAME_LEN`] characters, the prefix
    /// of its machines' names and the value of their [`SET_LABEL`].
    pub name: String,
    /// How many machines to keep.
    pub replicas: u32,
    /// What each machine is made from; its name is replaced by each machine's own.
    pub template: MachineSpec,
    /// How changes roll out.
    #[serde(default)]
    pub rollout: Rollout,
    /// Which machines go first when scaling down.
    #[serde(default)]
    pub delete_policy: DeletePolicy,
    /// When machines are unhealthy, and how they are remediated.
    #[serde(default)]
    pub health: HealthCheck,
}

impl MachineSet {
    /// `replicas` machines of `template`, named after `name`, with the default rollout,
    /// delete policy and health check.
    pub fn new(name: impl Into<String>, replicas: u32, template: MachineSpec) -> Self {
        MachineSet {
            name: name.into(),
            replicas,
            template,
            rollout: Rollout::default(),
            delete_policy: DeletePolicy::default(),
            health: HealthCheck::default(),
        }
    }

    /// Sets the rollout.
    pub fn with_rollout(mut self, rollout: Rollout) -> Self {
        self.rollout = rollout;
        self
    }

    /// Sets the delete policy.
    pub fn with_delete_policy(mut self, policy: DeletePolicy) -> Self {
        self.delete_policy = policy;
        self
    }

    /// Sets the health check.
    pub fn with_health(mut self, health: HealthCheck) -> Self {
        self.health = health;
        self
    }

    /// Sets the replicas.
    pub fn with_replicas(mut self, replicas: u32) -> Self {
        self.replicas = replicas;
        self
    }

    /// Reads a set from YAML and validates it; errors name the field and line.
    pub fn from_yaml(yaml: &str) -> Result<Self> {
        let set: MachineSet = crate::spec::from_yaml(yaml)?;
        set.validate()
            .map_err(|e| crate::locate::at_document_line(e, yaml))?;
        Ok(set)
    }

    /// Checks what serde cannot; errors name the field.
    pub fn validate(&self) -> Result<()> {
        check_dns_label("name", &self.name)?;
        if self.name.len() > MAX_SET_NAME_LEN {
            return Err(Error::invalid_spec(
                "name",
                format!(
                    "is {} characters; a set's name has at most {MAX_SET_NAME_LEN}, so that its machines' names stay DNS labels",
                    self.name.len()
                ),
            ));
        }
        self.template.validate().map_err(|e| e.within("template"))?;
        for key in [
            SET_LABEL,
            SLOT_LABEL,
            CREATED_LABEL,
            crate::revision::REVISION_LABEL,
        ] {
            if self.template.labels.contains_key(key) {
                return Err(Error::invalid_spec(
                    format!("template.labels.{key}"),
                    "is set by the fleet reconciler on each machine",
                ));
            }
        }
        let r = &self.rollout;
        r.max_surge.check("rollout.maxSurge")?;
        r.max_unavailable.check("rollout.maxUnavailable")?;
        if r.max_surge.resolve(self.replicas.max(1), true) == 0
            && r.max_unavailable.resolve(self.replicas.max(1), false) == 0
        {
            return Err(Error::invalid_spec(
                "rollout",
                format!(
                    "maxSurge {} and maxUnavailable {} are both zero for {} replicas: no machine could ever be replaced",
                    r.max_surge, r.max_unavailable, self.replicas
                ),
            ));
        }
        self.health.max_unhealthy.check("health.maxUnhealthy")?;
        crate::spec::check_duration(
            "health.startupTimeout",
            self.health.startup_timeout,
            crate::spec::MAX_TIMEOUT,
        )?;
        if let Some(p) = &self.health.probe {
            for (field, d) in [
                ("health.probe.interval", p.interval),
                ("health.probe.unhealthyAfter", p.unhealthy_after),
                ("health.probe.timeout", p.timeout),
            ] {
                crate::spec::check_duration(field, d, crate::spec::MAX_TIMEOUT)?;
            }
            if p.command
                .as_ref()
                .is_some_and(|c| c.trim().is_empty() || c.contains('\0'))
            {
                return Err(Error::invalid_spec(
                    "health.probe.command",
                    "is empty or holds a NUL byte",
                ));
            }
        }
        Ok(())
    }
}

/// What a fleet is, as observed by one [`FleetReconciler::reconcile`] step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct FleetStatus {
    /// Machines of the set that are not being deleted.
    pub replicas: u32,
    /// Machines Ready.
    pub ready: u32,
    /// Machines made from the template's revision with every decoupled layer as it is now.
    pub updated: u32,
    /// Machines Ready, healthy and not being updated: what serves (an outdated machine
    /// serves until its replacement does).
    pub available: u32,
    /// `replicas` asked minus `available`, never below zero.
    pub unavailable: u32,
    /// Machines found unhealthy.
    pub unhealthy: u32,
    /// The template's revision: its coupled revision for a machine named after the set,
    /// and the decoupled layers' digests.
    pub observed_revision: String,
    /// `Available`, `Progressing`, `RolloutPaused`, `RemediationPaused`.
    pub conditions: Vec<Condition>,
}

impl FleetStatus {
    /// The condition of `kind`, if set.
    pub fn condition(&self, kind: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }
}

/// The fleet's condition types and reasons.
pub mod conditions {
    /// At least `replicas - maxUnavailable` machines are available.
    pub const AVAILABLE: &str = "Available";
    /// Machines are being created, updated, replaced or deleted toward the desired state.
    pub const PROGRESSING: &str = "Progressing";
    /// A rollout stopped at a machine whose update or replacement failed; the message
    /// names it and its error. It resumes when the template changes again.
    pub const ROLLOUT_PAUSED: &str = "RolloutPaused";
    /// More machines are unhealthy than `maxUnhealthy`: remediation stopped.
    pub const REMEDIATION_PAUSED: &str = "RemediationPaused";
}
