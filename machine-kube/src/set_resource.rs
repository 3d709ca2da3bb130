//! The `MachineSet` custom resource: how many machines of one template to keep, how a
//! change of the template rolls out and how sick machines are replaced, reconciled by
//! machine-core's [`FleetReconciler`](machine_core::fleet::FleetReconciler). Its status
//! has a Deployment's counts, and its scale subresource lets `kubectl scale` and
//! autoscalers set `spec.replicas`.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use kube::core::{Expression, Selector};
use kube::{CustomResource, CustomResourceExt};
use machine_core::fleet::{
    DeletePolicy, HealthCheck, IntOrPercent, MAX_SET_NAME_LEN, MachineSet, Probe, Rollout,
};
use machine_core::{Error, MachineName, Result};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::conditions::Condition;
use crate::resource::{MachineObjectSpec, finish_crd, machine_spec};

/// The label every `Machine` object of a set carries, naming the set: the set's own
/// part of its selector, so that its machines are found even where the spec's selector
/// is empty, and never another set's.
pub const SET_NAME_LABEL: &str = "machine-provisioning.dev/set-name";

/// The desired state of a set of machines.
///
/// Each machine is named `<set>-<slot>-<generation>` (machine-core's fleet naming), so
/// the set's name is a DNS label of at most 49 characters; the CRD refuses other names
/// at admission. Each machine is shown as a `Machine` object of that name, owned by the
/// set (see the status).
///
/// A change of the template's decoupled layers' content is applied to running machines
/// in place, one at a time; a change of anything coupled (the machine spec, a coupled
/// layer, the provider's settings) replaces machines within `strategy`.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "machine-provisioning.dev",
    version = "v1alpha1",
    kind = "MachineSet",
    root = "MachineSetObject",
    namespaced,
    status = "MachineSetObjectStatus",
    shortname = "mset",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Current","type":"integer","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Updated","type":"integer","jsonPath":".status.updatedReplicas"}"#,
    printcolumn = r#"{"name":"Available","type":"integer","jsonPath":".status.availableReplicas"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetObjectSpec {
    /// How many machines to keep (the scale subresource's `spec.replicas`).
    #[serde(default = "one")]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// Which `Machine` objects are the set's, besides its own label
    /// `machine-provisioning.dev/set-name`: the template's labels must match it. Empty
    /// by default (the set's label alone).
    #[serde(default, skip_serializing_if = "LabelSelector::is_empty")]
    pub selector: LabelSelector,
    /// What each machine is made from.
    pub template: MachineTemplate,
    /// How a change of the template rolls out.
    #[serde(default, skip_serializing_if = "SetStrategy::is_default")]
    pub strategy: SetStrategy,
    /// Which machines go first when the set scales down (unhealthy ones always first).
    #[serde(default, skip_serializing_if = "SetDeletePolicy::is_default")]
    pub delete_policy: SetDeletePolicy,
    /// When a machine is unhealthy, and how many are replaced at once.
    #[serde(default, skip_serializing_if = "SetHealthCheck::is_default")]
    pub health_check: SetHealthCheck,
}

fn one() -> i32 {
    1
}

/// A Kubernetes label selector (`metav1.LabelSelector`): every `matchLabels` pair and
/// every expression must hold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels that must be there with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Set-based requirements.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

impl LabelSelector {
    fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }
}

/// One set-based requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    /// The label's key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    #[schemars(extend("enum" = ["In", "NotIn", "Exists", "DoesNotExist"]))]
    pub operator: String,
    /// The values, for `In` and `NotIn` (at least one); none for the others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// The template of the set's machines: the labels and annotations of their `Machine`
/// objects, and the `Machine` spec they are made from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplate {
    /// Labels and annotations put on each machine's `Machine` object.
    #[serde(default, skip_serializing_if = "TemplateMetadata::is_empty")]
    pub metadata: TemplateMetadata,
    /// The provider, layers and machine spec, as a `Machine` object names them.
    pub spec: MachineObjectSpec,
}

/// Labels and annotations of the machines' `Machine` objects.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// Kubernetes labels (the selector must match them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Kubernetes annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl TemplateMetadata {
    fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }
}

/// A count (`3`) or a percentage of the replicas (`"25%"`), as a Deployment's
/// `maxSurge` is written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum IntOrString {
    /// A count.
    Int(i64),
    /// A percentage such as `25%`.
    String(String),
}

impl JsonSchema for IntOrString {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "IntOrString".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // Kubernetes' own shape for intstr.IntOrString.
        // Kubernetes' own shape for intstr.IntOrString (the API server takes the
        // extension alone; kube would empty the types of an `anyOf` anyway).
        schemars::json_schema!({ "x-kubernetes-int-or-string": true })
    }
}

impl IntOrString {
    /// The count or percentage, refused (naming `field`) when negative or neither.
    fn read(&self, field: &str) -> Result<IntOrPercent> {
        let bad = |why: String| Error::invalid_spec(field, why);
        match self {
            IntOrString::Int(n) => u32::try_from(*n)
                .map(IntOrPercent::Int)
                .map_err(|_| bad(format!("is {n}; a count is 0 or more"))),
            IntOrString::String(s) => {
                let Some(p) = s.strip_suffix('%') else {
                    return Err(bad(format!(
                        "{s:?} is not a percentage such as \"25%\" (a count is written without quotes)"
                    )));
                };
                if !p.bytes().all(|b| b.is_ascii_digit()) || p.is_empty() {
                    return Err(bad(format!("{s:?} is not a percentage such as \"25%\"")));
                }
                p.parse()
                    .map(IntOrPercent::Percent)
                    .map_err(|_| bad(format!("{s:?} is not a percentage of at most 100%")))
            }
        }
    }
}

/// How a change of the template rolls out: as a Deployment's rolling update (defaults
/// 25% and 25%). A decoupled layer's change is applied in place, at most
/// `maxUnavailable` (at least one) machines at a time; anything coupled replaces
/// machines, at most `maxSurge` over `replicas` and at most `maxUnavailable` under it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetStrategy {
    /// How many machines over `replicas` may exist during a rollout (rounded up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrString>,
    /// How many of `replicas` may be unavailable during a rollout (rounded down).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
}

impl SetStrategy {
    fn is_default(&self) -> bool {
        *self == SetStrategy::default()
    }
}

/// Which machines go first when the set scales down, after unhealthy and not Ready
/// ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SetDeletePolicy {
    /// The oldest first.
    #[default]
    Oldest,
    /// The newest first.
    Newest,
    /// Any.
    Random,
}

impl SetDeletePolicy {
    fn is_default(&self) -> bool {
        *self == SetDeletePolicy::Oldest
    }
}

/// When a machine is unhealthy and how remediation is bounded. Durations are written
/// as Kubernetes writes them (`90s`, `30m`, `1h30m`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetHealthCheck {
    /// A machine not Ready this long after it was created is unhealthy (default 30m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_timeout: Option<String>,
    /// With more machines unhealthy than this (a count or a percentage of the
    /// replicas), none is replaced: a storm, not a sick machine (default 40%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unhealthy: Option<IntOrString>,
    /// The least time between two replacements of unhealthy machines (default 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation_interval: Option<String>,
    /// A probe of Ready machines over the transport the layers use; none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<SetProbe>,
}

impl SetHealthCheck {
    fn is_default(&self) -> bool {
        *self == SetHealthCheck::default()
    }
}

/// A probe: a connection to the machine, and a command that must exit 0 when one is
/// given.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetProbe {
    /// A command that must exit 0; without one, reaching the machine is the probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// How often each machine is probed (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    /// How long a machine may fail its probe before it is unhealthy (default 2m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_after: Option<String>,
    /// How long one probe may take (default 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// What the controller last saw of the set and decided.
///
/// The counts are a Deployment's: `replicas` machines of the set not being deleted,
/// `readyReplicas` Ready, `updatedReplicas` made from the current template (coupled
/// revision and decoupled layers), `availableReplicas` Ready, healthy and not being
/// updated, `unavailableReplicas` the desired replicas minus the available ones.
/// `conditions`: `Available` (at least `replicas - maxUnavailable` available:
/// `kubectl wait --for=condition=Available`), `Progressing`, `RolloutPaused` (a
/// machine's update or replacement failed; the message names it), `RemediationPaused`
/// (more unhealthy than `maxUnhealthy`), `SpecApplied` (the spec is used, or why not)
/// and `Synced` (the last reconcile went through, or its error).
///
/// Each machine is a `Machine` object of its name, owned by the set (`controller:
/// true`, `blockOwnerDeletion: true`) and labelled `machine-provisioning.dev/set-name`: a view the set's
/// controller writes from the fleet's listing (the `Machine` controller leaves objects a
/// set controls alone). Its spec is the set's current template; its status shows the
/// machine, `SpecApplied` says whether the machine is what the template asks (or that
/// the set updates or replaces it), and `applied` what it was made from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetObjectStatus {
    /// The generation of the spec the counts answer (or that was refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// Machines of the set that are not being deleted (the scale subresource's
    /// `status.replicas`).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// Machines Ready.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub ready_replicas: i32,
    /// Machines made from the current template.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub updated_replicas: i32,
    /// Machines that serve: Ready, healthy, not being updated.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub available_replicas: i32,
    /// Desired replicas minus available ones.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub unavailable_replicas: i32,
    /// Machines found unhealthy.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub unhealthy_replicas: i32,
    /// The template's revision: its coupled revision and its decoupled layers' digests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_revision: Option<String>,
    /// The set's selector in its string form (`key=value,...`), for the scale
    /// subresource (`kubectl get machines -l "$(...)"`, autoscalers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Kubernetes conditions, one per type.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Why the spec cannot be used, naming the field; gone once it is fixed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_error: Option<String>,
}

/// The CustomResourceDefinition of `MachineSet`: the one kube derives, with
/// `metadata.name` narrowed to a set name (a DNS label of at most
/// [`MAX_SET_NAME_LEN`](machine_core::fleet::MAX_SET_NAME_LEN) characters, so that its
/// machines' names stay DNS labels) and without formats the API server warns about.
pub fn machine_set_crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    finish_crd(MachineSetObject::crd(), MAX_SET_NAME_LEN)
}

/// A Go duration (`90s`, `1h30m`) as Kubernetes writes `metav1.Duration`, refused
/// (naming `field`) when it does not read or is negative.
fn duration(field: &str, s: &str) -> Result<Duration> {
    let d = kube::core::Duration::from_str(s).map_err(|e| {
        Error::invalid_spec(field, format!("{s:?}: {e} (write it as 90s, 30m or 1h30m)"))
    })?;
    if d.is_negative() {
        return Err(Error::invalid_spec(field, format!("{s:?} is negative")));
    }
    Ok(d.into())
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters (alphanumerics, `-`, `_`, `.`, alphanumeric at both ends).
fn check_label_key(field: &str, key: &str) -> Result<()> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !ok {
            return Err(Error::invalid_spec(
                field,
                format!("the prefix of {key:?} is not a DNS subdomain"),
            ));
        }
    }
    if name.is_empty() || !label_value_ok(name) {
        return Err(Error::invalid_spec(
            field,
            format!(
                "{key:?} is not a label key: a name of at most 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends, with an optional DNS prefix and '/'"
            ),
        ));
    }
    Ok(())
}

/// A label value: empty, or at most 63 alphanumerics, `-`, `_`, `.`, alphanumeric at
/// both ends.
fn label_value_ok(v: &str) -> bool {
    let b = v.as_bytes();
    v.is_empty()
        || (v.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric())
}

/// machine-core's field of a [`MachineSet`] as the field of the `MachineSet` object.
pub(crate) fn kube_field(core: &str) -> String {
    let (head, rest) = match core.find(['.', '[']) {
        Some(i) => (&core[..i], &core[i..]),
        None => (core, ""),
    };
    let mapped = match head {
        "name" => "metadata.name",
        "replicas" => "spec.replicas",
        "template" => "spec.template.spec.machine",
        "rollout" => "spec.strategy",
        "health" => "spec.healthCheck",
        "deletePolicy" => "spec.deletePolicy",
        other => return format!("spec.{other}{rest}"),
    };
    format!("{mapped}{rest}")
}

/// What a `MachineSet` object asks for, read and checked; errors name the object's
/// field.
#[derive(Debug, Clone)]
pub(crate) struct SetSpec {
    /// machine-core's set.
    pub(crate) set: MachineSet,
    /// The selector in its string form, with the set's own label.
    pub(crate) selector: String,
}

impl MachineSetObjectSpec {
    /// The set named `name` this spec asks for (without the composer's checks: the
    /// reconciler makes those with the registry); errors name the object's field.
    pub(crate) fn read(&self, name: &str) -> Result<SetSpec> {
        MachineName::new(name).map_err(|e| Error::invalid_spec("metadata.name", e.message()))?;
        if name.len() > MAX_SET_NAME_LEN {
            return Err(Error::invalid_spec(
                "metadata.name",
                format!(
                    "is {} characters; a set's name has at most {MAX_SET_NAME_LEN}, so that its machines' names (<set>-<slot>-<generation>) stay DNS labels",
                    name.len()
                ),
            ));
        }
        let replicas = u32::try_from(self.replicas).map_err(|_| {
            Error::invalid_spec(
                "spec.replicas",
                format!("is {}; a set has 0 or more replicas", self.replicas),
            )
        })?;
        let template = machine_spec(&self.template.spec.machine, name)
            .map_err(|e| e.within("spec.template"))?;
        let meta = &self.template.metadata;
        for (key, value) in &meta.labels {
            let field = format!("spec.template.metadata.labels.{key}");
            check_label_key(&field, key)?;
            if !label_value_ok(value) {
                return Err(Error::invalid_spec(
                    field,
                    format!(
                        "{value:?} is not a label value: at most 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends"
                    ),
                ));
            }
        }
        if meta.labels.contains_key(SET_NAME_LABEL) {
            return Err(Error::invalid_spec(
                format!("spec.template.metadata.labels.{SET_NAME_LABEL}"),
                "is set by the controller on each machine's object",
            ));
        }
        for key in meta.annotations.keys() {
            check_label_key(&format!("spec.template.metadata.annotations.{key}"), key)?;
        }
        let (parsed, selector) = self.selector(name)?;
        let mut labels = meta.labels.clone();
        labels.insert(SET_NAME_LABEL.to_owned(), name.to_owned());
        if !kube::core::SelectorExt::matches(&parsed, &labels) {
            return Err(Error::invalid_spec(
                "spec.selector",
                format!(
                    "does not select the template's labels (spec.template.metadata.labels {:?}): the set would not own the machines it makes",
                    meta.labels
                ),
            ));
        }
        let mut rollout = Rollout::default();
        if let Some(v) = &self.strategy.max_surge {
            rollout = rollout.with_max_surge(v.read("spec.strategy.maxSurge")?);
        }
        if let Some(v) = &self.strategy.max_unavailable {
            rollout = rollout.with_max_unavailable(v.read("spec.strategy.maxUnavailable")?);
        }
        let h = &self.health_check;
        let mut health = HealthCheck::default();
        if let Some(d) = &h.startup_timeout {
            health = health.with_startup_timeout(duration("spec.healthCheck.startupTimeout", d)?);
        }
        if let Some(v) = &h.max_unhealthy {
            health = health.with_max_unhealthy(v.read("spec.healthCheck.maxUnhealthy")?);
        }
        if let Some(d) = &h.remediation_interval {
            health = health
                .with_remediation_interval(duration("spec.healthCheck.remediationInterval", d)?);
        }
        if let Some(p) = &h.probe {
            let mut probe = match &p.command {
                Some(c) => Probe::command(c.clone()),
                None => Probe::reachable(),
            };
            if let Some(d) = &p.interval {
                probe = probe.with_interval(duration("spec.healthCheck.probe.interval", d)?);
            }
            if let Some(d) = &p.unhealthy_after {
                probe = probe
                    .with_unhealthy_after(duration("spec.healthCheck.probe.unhealthyAfter", d)?);
            }
            if let Some(d) = &p.timeout {
                probe = probe.with_timeout(duration("spec.healthCheck.probe.timeout", d)?);
            }
            health = health.with_probe(probe);
        }
        let policy = match self.delete_policy {
            SetDeletePolicy::Oldest => DeletePolicy::Oldest,
            SetDeletePolicy::Newest => DeletePolicy::Newest,
            SetDeletePolicy::Random => DeletePolicy::Random,
        };
        let set = MachineSet::new(name, replicas, template)
            .with_rollout(rollout)
            .with_delete_policy(policy)
            .with_health(health);
        set.validate()
            .map_err(|e| Error::invalid_spec(kube_field(e.field().unwrap_or("")), e.message()))?;
        Ok(SetSpec { set, selector })
    }

    /// The selector with the set's own label: parsed, and in its string form.
    fn selector(&self, name: &str) -> Result<(Selector, String)> {
        let mut exprs: Vec<Expression> = Vec::new();
        for (key, value) in &self.selector.match_labels {
            let field = format!("spec.selector.matchLabels.{key}");
            check_label_key(&field, key)?;
            if !label_value_ok(value) {
                return Err(Error::invalid_spec(
                    field,
                    format!("{value:?} is not a label value"),
                ));
            }
            exprs.push(Expression::Equal(key.clone(), value.clone()));
        }
        for (i, r) in self.selector.match_expressions.iter().enumerate() {
            let at = format!("spec.selector.matchExpressions[{i}]");
            check_label_key(&format!("{at}.key"), &r.key)?;
            if let Some(v) = r.values.iter().find(|v| !label_value_ok(v)) {
                return Err(Error::invalid_spec(
                    format!("{at}.values"),
                    format!("{v:?} is not a label value"),
                ));
            }
            let values = r.values.iter().cloned().collect();
            let expr = match r.operator.as_str() {
                "In" | "NotIn" if r.values.is_empty() => {
                    return Err(Error::invalid_spec(
                        format!("{at}.values"),
                        format!("must name at least one value for {}", r.operator),
                    ));
                }
                "Exists" | "DoesNotExist" if !r.values.is_empty() => {
                    return Err(Error::invalid_spec(
                        format!("{at}.values"),
                        format!("must be empty for {}", r.operator),
                    ));
                }
                "In" => Expression::In(r.key.clone(), values),
                "NotIn" => Expression::NotIn(r.key.clone(), values),
                "Exists" => Expression::Exists(r.key.clone()),
                "DoesNotExist" => Expression::DoesNotExist(r.key.clone()),
                other => {
                    return Err(Error::invalid_spec(
                        format!("{at}.operator"),
                        format!("{other:?} is not In, NotIn, Exists or DoesNotExist"),
                    ));
                }
            };
            exprs.push(expr);
        }
        exprs.push(Expression::Equal(
            SET_NAME_LABEL.to_owned(),
            name.to_owned(),
        ));
        let selector: Selector = exprs.into_iter().collect();
        let text = selector.to_string();
        Ok((selector, text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_core_fields_map_to_the_objects_fields() {
        assert_eq!(kube_field("name"), "metadata.name");
        assert_eq!(kube_field("rollout"), "spec.strategy");
        assert_eq!(kube_field("rollout.maxSurge"), "spec.strategy.maxSurge");
        assert_eq!(
            kube_field("health.probe.command"),
            "spec.healthCheck.probe.command"
        );
        assert_eq!(
            kube_field("template.labels.machine-core/set"),
            "spec.template.spec.machine.labels.machine-core/set"
        );
    }

    #[test]
    fn counts_and_percentages_read_as_a_deployment_writes_them() {
        let f = "spec.strategy.maxSurge";
        assert_eq!(IntOrString::Int(3).read(f).unwrap(), IntOrPercent::Int(3));
        assert_eq!(
            IntOrString::String("25%".into()).read(f).unwrap(),
            IntOrPercent::Percent(25)
        );
        for bad in [
            IntOrString::Int(-1),
            IntOrString::String("3".into()),
            IntOrString::String("x%".into()),
            IntOrString::String("-5%".into()),
        ] {
            let e = bad.read(f).unwrap_err();
            assert_eq!(e.field(), Some(f), "{bad:?}: {e}");
        }
    }

    #[test]
    fn durations_read_as_kubernetes_writes_them() {
        assert_eq!(duration("d", "1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(duration("d", "90s").unwrap(), Duration::from_secs(90));
        assert_eq!(duration("d", "-5s").unwrap_err().field(), Some("d"));
        assert_eq!(duration("d", "5").unwrap_err().field(), Some("d"));
    }

    #[test]
    fn label_keys_and_values_follow_kubernetes_rules() {
        for ok in ["app", "example.com/app", "a_b.c-d"] {
            check_label_key("f", ok).unwrap();
        }
        for bad in ["", "-app", "Example.com/app", "a/b/c", &"x".repeat(64)] {
            assert!(check_label_key("f", bad).is_err(), "{bad:?}");
        }
        assert!(label_value_ok(""));
        assert!(!label_value_ok("a b"));
    }
}
