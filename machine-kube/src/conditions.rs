//! Kubernetes conditions (`metav1.Condition`'s shape) in `status.conditions`, the
//! controller's own and the machine's mapped from machine-core's.

use std::time::SystemTime;

use k8s_openapi::jiff::Timestamp;
use machine_core::conditions as C;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The machine runs with all its software. `kubectl wait --for=condition=Ready`.
/// Reasons: `Ready`; else the machine's phase (`Pending`, `Provisioning`,
/// `Provisioned`, `Bootstrapping`, `Stopped`, `Failed`, `Deleting`), or `NoMachine`.
pub const READY: &str = "Ready";
/// The machine is what the spec of the condition's `observedGeneration` asks. False
/// reasons: `Applying` (decoupled layers are being applied in place), `NeedsNewMachine`
/// (the change cannot be made to a machine that exists), `InvalidSpec`.
pub const SPEC_APPLIED: &str = "SpecApplied";
/// The last reconcile went through. False reasons: the error's kind (`Throttled`,
/// `Transient`, `QuotaExceeded`, `Unauthorized`, `Permanent`, ...), `KubernetesAPI`, or
/// `CleanupBlocked` when a deletion cannot go on.
pub const SYNCED: &str = "Synced";

/// Reason of a true `Ready`.
pub const REASON_READY: &str = "Ready";
/// Reason of `Ready` when no machine is made (the spec is refused).
pub const REASON_NO_MACHINE: &str = "NoMachine";
/// Reason of a true `SpecApplied`.
pub const REASON_APPLIED: &str = "Applied";
/// Reason of `SpecApplied` while layers added to the spec are applied in place.
pub const REASON_APPLYING: &str = "Applying";
/// Reason of `SpecApplied` when the change needs a new machine.
pub const REASON_NEEDS_NEW_MACHINE: &str = "NeedsNewMachine";
/// Reason of `SpecApplied` when the spec cannot be used.
pub const REASON_INVALID_SPEC: &str = "InvalidSpec";
/// Reason of a true `Synced`.
pub const REASON_RECONCILED: &str = "ReconcileSucceeded";
/// Reason of `Synced` when the Kubernetes API failed.
pub const REASON_KUBERNETES_API: &str = "KubernetesAPI";
/// Reason of `Synced` when a deletion cannot go on; the message says why.
pub const REASON_CLEANUP_BLOCKED: &str = "CleanupBlocked";

/// The prefix of a decoupled layer's condition type: `LayerApplied.<layer>`
/// (machine-core's `LayerApplied/<layer>`: a condition type's prefix before `/` must be
/// a lowercase DNS subdomain, so the slash becomes a dot).
pub const LAYER_APPLIED_PREFIX: &str = "LayerApplied.";

/// Whether a condition holds, as Kubernetes writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    /// It holds.
    True,
    /// It does not.
    False,
    /// The controller cannot tell yet.
    Unknown,
}

impl From<bool> for ConditionStatus {
    fn from(holds: bool) -> Self {
        if holds {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}

/// One condition, in `metav1.Condition`'s shape and with its validation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// What the condition is about, in CamelCase.
    #[serde(rename = "type")]
    #[schemars(
        length(max = 316),
        regex(
            pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
        )
    )]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// The object generation the condition was set from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// When the status last changed (RFC 3339, seconds).
    #[schemars(with = "String", extend("format" = "date-time"))]
    pub last_transition_time: String,
    /// Why, in CamelCase.
    #[schemars(
        length(min = 1, max = 1024),
        regex(pattern = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    )]
    pub reason: String,
    /// What happened, for people.
    #[schemars(length(max = 32768))]
    pub message: String,
}

/// `t` as Kubernetes writes a `metav1.Time`: RFC 3339 in UTC, whole seconds.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let ts = Timestamp::try_from(t).unwrap_or(Timestamp::UNIX_EPOCH);
    let secs = Timestamp::from_second(ts.as_second()).unwrap_or(Timestamp::UNIX_EPOCH);
    secs.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `s` (RFC 3339) as a time, if it reads.
pub(crate) fn parse_time(s: &str) -> Option<SystemTime> {
    s.parse::<Timestamp>().ok().map(SystemTime::from)
}

/// The Kubernetes condition type of machine-core's condition type `kind`.
pub(crate) fn k8s_type(kind: &str) -> String {
    let mapped = match kind.strip_prefix(C::LAYER_APPLIED_PREFIX) {
        Some(layer) => format!("{LAYER_APPLIED_PREFIX}{layer}"),
        None => kind.to_owned(),
    };
    if valid_type(&mapped) {
        return mapped;
    }
    // A name Kubernetes does not take as a type: keep what it can, and a digest of
    // the whole so that two such names stay two conditions.
    let kept: String = mapped
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(280)
        .collect();
    let digest = fnv(kind);
    format!(
        "{}-{digest:08x}",
        kept.trim_matches(|c: char| !c.is_ascii_alphanumeric())
    )
}

/// machine-core's condition type of the Kubernetes type `t`, given the machine's
/// decoupled layer names (a layer's type is mapped from its name, which may not map back).
pub(crate) fn core_type(t: &str, layers: &[String]) -> Option<String> {
    if t.starts_with(LAYER_APPLIED_PREFIX) {
        return layers
            .iter()
            .map(|l| C::layer_applied(l))
            .find(|core| k8s_type(core) == t);
    }
    match t {
        READY | SPEC_APPLIED | SYNCED => None,
        other => Some(other.to_owned()),
    }
}

fn valid_type(t: &str) -> bool {
    let name = t.rsplit_once('/').map_or(t, |(_, n)| n);
    !t.contains('/')
        && !name.is_empty()
        && name.len() <= 316
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric()
}

/// A small stable digest (FNV-1a, 32 bits).
fn fnv(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// A condition list being built from the previous one: a condition whose status holds
/// keeps its `lastTransitionTime`, so an unchanged status reads back equal.
pub(crate) struct Conditions<'a> {
    previous: &'a [Condition],
    generation: Option<i64>,
    now: String,
    pub(crate) list: Vec<Condition>,
}

impl<'a> Conditions<'a> {
    pub(crate) fn new(previous: &'a [Condition], generation: Option<i64>) -> Self {
        Conditions {
            previous,
            generation,
            now: rfc3339(SystemTime::now()),
            list: Vec::new(),
        }
    }

    /// Sets a condition; a changed status takes `changed_at` (now when `None`).
    pub(crate) fn set(
        &mut self,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: impl Into<String>,
        changed_at: Option<SystemTime>,
    ) {
        let last_transition_time = match self
            .previous
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
        {
            Some(p) => p.last_transition_time.clone(),
            None => changed_at.map_or_else(|| self.now.clone(), rfc3339),
        };
        let condition = Condition {
            type_: type_.to_owned(),
            status,
            observed_generation: self.generation,
            last_transition_time,
            reason: reason.to_owned(),
            message: truncate(message.into(), 32768),
        };
        match self.list.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => *c = condition,
            None => self.list.push(condition),
        }
    }

    /// Keeps the previous condition of `type_` as it was, if there is one.
    pub(crate) fn keep(&mut self, type_: &str) {
        if let Some(p) = self.previous.iter().find(|c| c.type_ == type_)
            && !self.list.iter().any(|c| c.type_ == type_)
        {
            self.list.push(p.clone());
        }
    }

    /// Sets the machine's own conditions, mapped.
    pub(crate) fn machine(&mut self, machine: &machine_core::Machine) {
        for c in &machine.conditions {
            let reason = if valid_reason(&c.reason) {
                c.reason.clone()
            } else {
                "Unspecified".to_owned()
            };
            self.set(
                &k8s_type(&c.kind),
                c.status.into(),
                &reason,
                c.message.clone(),
                Some(c.last_transition),
            );
        }
    }
}

fn valid_reason(r: &str) -> bool {
    let b = r.as_bytes();
    !b.is_empty()
        && r.len() <= 1024
        && b[0].is_ascii_alphabetic()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b',' | b':'))
        && b[b.len() - 1] != b','
        && b[b.len() - 1] != b':'
}

/// `s` cut to at most `max` bytes, at a character boundary.
pub(crate) fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// The condition of `type_` in `list`.
pub fn find<'c>(list: &'c [Condition], type_: &str) -> Option<&'c Condition> {
    list.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_core_types_map_to_valid_kubernetes_types_and_back() {
        let layers = vec!["web".to_owned(), "Odd Name/x".to_owned()];
        assert_eq!(k8s_type("InfrastructureReady"), "InfrastructureReady");
        assert_eq!(k8s_type("LayerApplied/web"), "LayerApplied.web");
        let odd = k8s_type("LayerApplied/Odd Name/x");
        assert!(valid_type(&odd), "{odd}");
        assert_ne!(odd, k8s_type("LayerApplied/Odd Name-x"));
        assert_eq!(
            core_type("LayerApplied.web", &layers).as_deref(),
            Some("LayerApplied/web")
        );
        assert_eq!(
            core_type(&odd, &layers).as_deref(),
            Some("LayerApplied/Odd Name/x")
        );
        assert_eq!(core_type(READY, &layers), None);
    }

    #[test]
    fn times_are_whole_seconds_in_utc_and_read_back() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_800_000_000_500);
        let s = rfc3339(t);
        assert_eq!(s, "2027-01-15T08:00:00Z");
        assert_eq!(
            parse_time(&s),
            Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000))
        );
    }

    #[test]
    fn a_condition_whose_status_holds_keeps_its_transition_time() {
        let mut first = Conditions::new(&[], Some(1));
        first.set(
            READY,
            ConditionStatus::False,
            "Provisioning",
            "booting",
            None,
        );
        let previous = vec![Condition {
            last_transition_time: "2020-01-01T00:00:00Z".into(),
            ..first.list[0].clone()
        }];
        let mut again = Conditions::new(&previous, Some(2));
        again.set(
            READY,
            ConditionStatus::False,
            "Bootstrapping",
            "layers",
            None,
        );
        assert_eq!(again.list[0].last_transition_time, "2020-01-01T00:00:00Z");
        assert_eq!(again.list[0].observed_generation, Some(2));
        let mut flipped = Conditions::new(&previous, Some(2));
        flipped.set(READY, ConditionStatus::True, "Ready", "up", None);
        assert_ne!(flipped.list[0].last_transition_time, "2020-01-01T00:00:00Z");
    }
}
