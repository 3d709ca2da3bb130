//! The `Machine` custom resource: a machine-core [`MachineSpec`] plus the provider and
//! layers it is composed from, by the names the controller registered; its status is
//! the machine as the last reconcile saw it.

use kube::CustomResource;
use machine_core::{Error, Machine, MachineName, MachineSpec, Result};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the resource.
pub const GROUP: &str = "machine-provisioning.dev";

/// The finalizer the controller puts on every object, so that deleting the object
/// deletes the machine first.
pub const FINALIZER: &str = "machine-provisioning.dev/deprovision";

/// The desired state of one machine.
///
/// `machine` is machine-core's [`MachineSpec`] document without its name (the object's
/// name is the machine's name). Its CRD schema is generated from `MachineSpec`, so the API
/// server checks it at `kubectl apply` (an unknown field is refused under kubectl's default
/// strict field validation, and pruned, with a warning, for clients that skip it); only
/// its `provider` settings are an open object, since each provider reads its own. The
/// controller still reads it with machine-core's reader, whose errors name the field, and
/// reports them in the status.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "machine-provisioning.dev",
    version = "v1alpha1",
    kind = "Machine",
    root = "MachineObject",
    namespaced,
    status = "MachineObjectStatus",
    shortname = "mach",
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
    pub machine: serde_json::Value,
}

/// What the controller last saw.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineObjectStatus {
    /// The object generation this status answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The machine as the last reconcile returned it: phase, conditions, addresses,
    /// providerID, node, failure. The controller passes it back to the next reconcile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
    /// Why the spec cannot be used, naming the field; the controller waits for a change
    /// of the object instead of retrying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_error: Option<String>,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
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
        let mut doc = self.machine.clone();
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
        MachineName::new(name).map_err(|e| e.within("metadata.name"))?;
        fields.insert("name".into(), name.into());
        let json = serde_json::to_string(&doc)
            .map_err(|e| Error::invalid_spec("spec.machine", e.to_string()))?;
        MachineSpec::from_json(&json).map_err(|e| e.within("spec.machine"))
    }
}
