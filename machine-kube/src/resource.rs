//! The `Machine` custom resource: a machine-core [`MachineSpec`] plus the provider and
//! layers it is composed from, by the names the controller registered; its status says,
//! in Kubernetes' own shapes, what the controller made of it.

use kube::{CustomResource, CustomResourceExt};
use machine_core::{
    Address, Error, Failure, Labels, MachineName, MachineSpec, NodeRef, Phase, ProviderId, Result,
    SshEndpoint,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::conditions::Condition;

/// The API group of the resource.
pub const GROUP: &str = "machine-provisioning.dev";

/// The finalizer the controller puts on every object whose machine it may create, so
/// that deleting the object deletes the machine first. It is never put on an object the
/// controller refuses (a name that is not a machine name, a provider it does not know),
/// so such objects delete at once.
pub const FINALIZER: &str = "machine-provisioning.dev/deprovision";

/// The annotation, set with the finalizer in the same write, naming the provider the
/// object's machine is made at: a machine is only created once it is there, so a
/// deletion finds the machine even when the controller stopped between the create and
/// the status write, or the spec names another provider since.
pub const PROVIDER_ANNOTATION: &str = "machine-provisioning.dev/provider";

/// The desired state of one machine.
///
/// `machine` is machine-core's [`MachineSpec`] document without its name (the object's
/// name is the machine's name, so it must be a DNS label: the CRD refuses other names at
/// admission). Its CRD schema is generated from `MachineSpec`, so the API server checks
/// it at `kubectl apply` (an unknown field is refused under kubectl's default strict
/// field validation, and pruned, with a warning, for clients that skip it); only its
/// `provider` settings are an open object, since each provider reads its own. The
/// controller still reads it with machine-core's reader, whose errors name the field, and
/// reports them in the status.
///
/// A change of `layers` that only adds decoupled layers is applied to the running
/// machine; any other change (the provider, `machine`, a coupled layer, a removed layer)
/// needs a new machine, and the `SpecApplied` condition says so.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "machine-provisioning.dev",
    version = "v1alpha1",
    kind = "Machine",
    root = "MachineObject",
    namespaced,
    status = "MachineObjectStatus",
    shortname = "mach",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.machine.phase"}"#,
    printcolumn = r#"{"name":"ProviderID","type":"string","jsonPath":".status.machine.providerID"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MachineObjectSpec {
    /// The provider that creates the machine, by the name the controller registered.
    pub provider: String,
    /// The software layers, by registered name, in the order they are applied.
    #[serde(default)]
    pub layers: Vec<String>,
    /// The machine: size, image, labels, SSH access, provider settings (machine-core's
    /// `MachineSpec` without `name`).
    #[serde(default = "empty_object")]
    #[schemars(schema_with = "machine_template")]
    pub machine: Value,
}

/// What the controller last saw and decided.
///
/// `conditions` are Kubernetes conditions (`kubectl wait --for=condition=Ready`):
/// `Ready` (the machine runs with its software), `SpecApplied` (the machine is what the
/// spec of `observedGeneration` asks, or why not), `Synced` (the last reconcile
/// succeeded, or its error), then the machine's own (`InfrastructureReady`,
/// `Reachable`, `BootstrapComplete`, `LayerApplied.<layer>`, `Duplicates`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineObjectStatus {
    /// The object generation the status answers: the spec of this generation is applied,
    /// or the `SpecApplied` condition says why it is not. While a change is still being
    /// applied it stays at the generation before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// Kubernetes conditions, one per type.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The machine as the last reconcile saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<ObservedMachine>,
    /// What the machine was made from, and the decoupled layers applied to it since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<AppliedSpec>,
    /// Why the spec cannot be used, naming the field; the controller waits for a change
    /// of the object instead of retrying. Gone once the spec is fixed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_error: Option<String>,
}

/// A machine as the provider (and, for software phases, the composer) reported it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedMachine {
    /// The provider's identity for it (Kubernetes' `spec.providerID` of its node).
    #[serde(rename = "providerID")]
    pub provider_id: ProviderId,
    /// Where it is in its life.
    pub phase: Phase,
    /// Typed addresses, in the provider's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<Address>,
    /// How to reach it.
    #[serde(default, skip_serializing_if = "MachineAccess::is_empty")]
    pub access: MachineAccess,
    /// Its labels, as stored at the provider.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
    /// Its size as the provider reads it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// Why it failed, when phase is `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// The node it became, when linked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeRef>,
}

/// How to reach a machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineAccess {
    /// The SSH endpoint, when the machine has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<SshEndpoint>,
    /// Host public keys the machine is known to have, in OpenSSH format.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_keys: Vec<String>,
}

impl MachineAccess {
    fn is_empty(&self) -> bool {
        self.ssh.is_none() && self.host_keys.is_empty()
    }
}

/// What the machine was made from: recorded with the first status that shows the
/// machine, and for decoupled layers updated once they are applied to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedSpec {
    /// The object generation whose spec this is.
    #[schemars(range(min = 0))]
    pub generation: i64,
    /// The provider it was made at.
    pub provider: String,
    /// Its layers, by registered name, in order.
    #[serde(default)]
    pub layers: Vec<String>,
    /// Those of `layers` that went into its user data at creation: a change of these
    /// needs a new machine.
    #[serde(default)]
    pub coupled_layers: Vec<String>,
    /// `spec.machine` as it was made from.
    #[serde(default = "empty_object")]
    #[schemars(schema_with = "open_object")]
    pub machine: Value,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

fn open_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true })
}

/// `MachineSpec`'s schema with `name` optional: the object's name is the machine's name.
fn machine_template(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = MachineSpec::json_schema(generator);
    if let Some(required) = schema.get_mut("required").and_then(|r| r.as_array_mut()) {
        required.retain(|field| field != "name");
    }
    schema
}

impl MachineObjectSpec {
    /// The machine-core spec of the machine named `name`: `machine` read with
    /// machine-core's reader, errors naming the field under `spec.machine`.
    pub fn machine_spec(&self, name: &str) -> Result<MachineSpec> {
        machine_spec(&self.machine, name)
    }
}

/// `machine` (a `spec.machine` document) read as the spec of the machine `name`.
pub(crate) fn machine_spec(machine: &Value, name: &str) -> Result<MachineSpec> {
    let mut doc = machine.clone();
    let Some(fields) = doc.as_object_mut() else {
        return Err(Error::invalid_spec("spec.machine", "is not an object"));
    };
    if let Some(given) = fields.get("name")
        && given.as_str() != Some(name)
    {
        return Err(Error::invalid_spec(
            "spec.machine.name",
            format!("must be left out or equal the object's name {name:?}"),
        ));
    }
    // The name's own error names `name`; here it is the object's metadata.name.
    MachineName::new(name).map_err(|e| Error::invalid_spec("metadata.name", e.message()))?;
    fields.insert("name".into(), name.into());
    let json = serde_json::to_string(&doc)
        .map_err(|e| Error::invalid_spec("spec.machine", e.to_string()))?;
    MachineSpec::from_json(&json).map_err(|e| e.within("spec.machine"))
}

/// A machine name: a DNS label (RFC 1123), as [`MachineName`] checks it. Kubernetes
/// object names may be DNS subdomains (`web.1`) of up to 253 characters; the CRD's
/// schema narrows them to this at admission.
pub const NAME_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// The string formats the API server knows (Kubernetes' `apiextensions` validation
/// list); it warns about any other on a string since 1.34.
const KNOWN_STRING_FORMATS: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
    "date-time",
];

/// The CustomResourceDefinition to apply: the one kube derives from the types, with
/// `metadata.name` narrowed to a machine name (at most 63 characters of
/// [`NAME_PATTERN`]; OpenAPI validation of `metadata.name` is the one restriction of
/// metadata a CRD may make), and without the formats the API server warns about
/// (schemars' `uint16` and the like on integers, which Kubernetes 1.34.0 warned about
/// too; `minimum` and `maximum` already say the range).
pub fn crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    finish_crd(MachineObject::crd(), 63)
}

/// `crd` with `metadata.name` narrowed to a DNS label of at most `max_name` characters,
/// and without the formats the API server warns about.
pub(crate) fn finish_crd(
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    max_name: usize,
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    let mut crd = serde_json::to_value(crd).expect("a CRD serializes");
    if let Some(versions) = crd["spec"]["versions"].as_array_mut() {
        for version in versions {
            let root = &mut version["schema"]["openAPIV3Schema"];
            root["properties"]["metadata"] = json!({
                "type": "object",
                "properties": {
                    "name": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": max_name,
                        "pattern": NAME_PATTERN,
                    }
                }
            });
            sanitize(root);
        }
    }
    serde_json::from_value(crd).expect("the CRD reads back")
}

/// Drops formats the API server does not know, in `schema` and every schema under it.
fn sanitize(schema: &mut Value) {
    let Some(fields) = schema.as_object_mut() else {
        return;
    };
    let is_string = fields.get("type").and_then(Value::as_str) == Some("string");
    let known = fields
        .get("format")
        .and_then(Value::as_str)
        .is_some_and(|f| is_string && KNOWN_STRING_FORMATS.contains(&f));
    if !known {
        fields.remove("format");
    }
    if let Some(Value::Object(properties)) = fields.get_mut("properties") {
        properties.values_mut().for_each(sanitize);
    }
    for one in ["items", "additionalProperties", "not"] {
        if let Some(child) = fields.get_mut(one) {
            sanitize(child);
        }
    }
    for many in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(children)) = fields.get_mut(many) {
            children.iter_mut().for_each(sanitize);
        }
    }
}
