//! JSON schemas of the types whose serde form cannot derive one (feature `schemars`).

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

use crate::machine::ProviderId;
use crate::name::MachineName;

/// An object whose fields are checked elsewhere (a provider reads its own settings):
/// typed as an object and kept as given, in the form a Kubernetes structural schema
/// accepts (`x-kubernetes-preserve-unknown-fields`).
pub(crate) fn open_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

impl JsonSchema for MachineName {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "MachineName".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "An RFC 1123 DNS label: 1 to 63 of a-z, 0-9 and '-', starting and ending with a letter or digit.",
            "minLength": 1,
            "maxLength": crate::name::MAX_LABEL_LEN,
            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
        })
    }
}

impl JsonSchema for ProviderId {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "ProviderId".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "The provider's ID of the machine as a URI (aws:///zone/i-..., vsphere://uuid, ...).",
            "minLength": 1
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::{Machine, MachineName, MachineSpec};
    use schemars::schema_for;

    #[test]
    fn the_name_pattern_accepts_exactly_what_machine_name_accepts() {
        let schema = schema_for!(MachineSpec);
        let name = &schema.as_value()["properties"]["name"];
        let pattern = regex_lite::Regex::new(name["pattern"].as_str().unwrap()).unwrap();
        let max = name["maxLength"].as_u64().unwrap() as usize;
        let long = "a".repeat(64);
        for sample in [
            "web-1", "a", "0a", "a--b", "-web", "web-", "Web", "w_b", "w.b", "", &long,
        ] {
            let by_schema = pattern.is_match(sample) && sample.len() <= max;
            assert_eq!(by_schema, MachineName::new(sample).is_ok(), "{sample:?}");
        }
    }

    #[test]
    fn provider_settings_are_an_open_object_and_the_status_is_typed() {
        let spec = schema_for!(MachineSpec);
        let provider = &spec.as_value()["properties"]["provider"];
        assert_eq!(provider["type"], "object");
        assert_eq!(provider["x-kubernetes-preserve-unknown-fields"], true);
        let machine = schema_for!(Machine);
        let props = &machine.as_value()["properties"];
        for field in [
            "name",
            "providerID",
            "phase",
            "addresses",
            "access",
            "labels",
            "conditions",
            "failure",
            "node",
        ] {
            assert!(
                props.get(field).is_some(),
                "Machine's schema lacks {field}: {props}"
            );
        }
    }
}
