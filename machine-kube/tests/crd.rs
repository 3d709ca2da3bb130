//! The CRD generated from the types is the committed copy (`crd/machines.yaml`, what
//! operators apply) and a structural OpenAPI v3 schema, as the API server requires:
//! every node typed, no `$ref`, untyped content only under
//! `x-kubernetes-preserve-unknown-fields`.

use kube::CustomResourceExt;
use machine_kube::MachineObject;
use serde_json::Value;

const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/crd/machines.yaml");

#[test]
fn the_crd_is_the_committed_copy() {
    let generated = serde_saphyr::to_string(&MachineObject::crd()).unwrap();
    if std::env::var_os("UPDATE_CRD").is_some() {
        std::fs::write(COMMITTED, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(COMMITTED).unwrap_or_default();
    assert!(
        generated == committed,
        "{COMMITTED} is not the CRD the types generate; if the change is meant, run \
         `UPDATE_CRD=1 cargo test -p machine-kube --test crd` and commit it.\n{generated}"
    );
}

#[test]
fn the_crd_schema_is_structural() {
    let crd = serde_json::to_value(MachineObject::crd()).unwrap();
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["subresources"]["status"], serde_json::json!({}));
    let mut problems = Vec::new();
    check(
        &version["schema"]["openAPIV3Schema"],
        "openAPIV3Schema",
        &mut problems,
    );
    assert!(
        problems.is_empty(),
        "not structural:\n{}",
        problems.join("\n")
    );
}

fn check(node: &Value, at: &str, problems: &mut Vec<String>) {
    let Some(fields) = node.as_object() else {
        problems.push(format!("{at}: not a schema object"));
        return;
    };
    for banned in ["$ref", "definitions", "$defs"] {
        if fields.contains_key(banned) {
            problems.push(format!("{at}: has {banned}"));
        }
    }
    let open = node["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true);
    let int_or_string = node["x-kubernetes-int-or-string"] == Value::Bool(true);
    if !fields.contains_key("type") && !open && !int_or_string {
        problems.push(format!("{at}: no type"));
    }
    if node["type"] == "object"
        && !open
        && !fields.contains_key("properties")
        && !fields.contains_key("additionalProperties")
    {
        problems.push(format!(
            "{at}: an object with no properties that is not open"
        ));
    }
    if let Some(props) = node["properties"].as_object() {
        for (name, child) in props {
            check(child, &format!("{at}.{name}"), problems);
        }
    }
    if let Some(items) = node.get("items") {
        check(items, &format!("{at}[]"), problems);
    }
    if let Some(extra) = node.get("additionalProperties").filter(|v| v.is_object()) {
        check(extra, &format!("{at}.*"), problems);
    }
    for combinator in ["anyOf", "oneOf", "allOf"] {
        if let Some(branches) = node[combinator].as_array() {
            for b in branches {
                // Inside a combinator the structural rules forbid types and defaults.
                if b.get("type").is_some() || b.get("default").is_some() {
                    problems.push(format!("{at}.{combinator}: a branch declares a type"));
                }
            }
        }
    }
}
