//! The CRDs (`machine_kube::crd()` for `Machine`, `machine_kube::machine_set_crd()` for
//! `MachineSet`) are the committed copies (`crd/machines.yaml`, `crd/machinesets.yaml`,
//! what operators apply), structural OpenAPI v3 schemas as the API server requires
//! (every node typed, no `$ref`, untyped content only under
//! `x-kubernetes-preserve-unknown-fields` or `x-kubernetes-int-or-string`), camelCase
//! throughout, without formats the API server warns about, narrowing names to machine
//! names (set names: short enough for their machines' names); the set's has the scale
//! subresource and a Deployment's printer columns; `kubernetes-validate` (PyPI),
//! which checks them against the OpenAPI of real Kubernetes versions, accepts them; and
//! the set's schema, run by a JSON Schema validator, takes the README's example and
//! refuses what the API server refuses by it.

use std::path::PathBuf;
use std::process::Command;

use machine_core::MachineName;
use serde_json::Value;

const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/crd/machines.yaml");
const COMMITTED_SETS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/crd/machinesets.yaml");

type Crd =
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// Each CRD with its committed file.
fn crds() -> [(&'static str, Crd); 2] {
    [
        (COMMITTED, machine_kube::crd()),
        (COMMITTED_SETS, machine_kube::machine_set_crd()),
    ]
}

#[test]
fn the_crds_are_the_committed_copies() {
    for (file, crd) in crds() {
        let generated = serde_saphyr::to_string(&crd).unwrap();
        if std::env::var_os("UPDATE_CRD").is_some() {
            std::fs::write(file, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(file).unwrap_or_default();
        assert!(
            generated == committed,
            "{file} is not the CRD the types generate; if the change is meant, run \
             `UPDATE_CRD=1 cargo test -p machine-kube --test crd` and commit it.\n{generated}"
        );
    }
}

#[test]
fn the_crd_schemas_are_structural() {
    for (file, crd) in crds() {
        let crd = serde_json::to_value(crd).unwrap();
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
            "{file} not structural:\n{}",
            problems.join("\n")
        );
    }
}

/// `kubectl scale machineset/web --replicas=N` and autoscalers go through the scale
/// subresource: `spec.replicas`, `status.replicas` and the selector's string form; and
/// `kubectl get machinesets` shows a Deployment's columns.
#[test]
fn the_set_crd_has_the_scale_subresource_and_a_deployments_columns() {
    let crd = serde_json::to_value(machine_kube::machine_set_crd()).unwrap();
    let version = &crd["spec"]["versions"][0];
    assert_eq!(
        version["subresources"]["scale"],
        serde_json::json!({
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        })
    );
    let schema = &version["schema"]["openAPIV3Schema"]["properties"];
    // Each path names an integer (a string for the selector) of the schema.
    assert_eq!(schema["spec"]["properties"]["replicas"]["type"], "integer");
    assert_eq!(schema["spec"]["properties"]["replicas"]["minimum"], 0.0);
    assert_eq!(
        schema["status"]["properties"]["replicas"]["type"],
        "integer"
    );
    assert_eq!(schema["status"]["properties"]["selector"]["type"], "string");
    let columns: Vec<(String, String)> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["jsonPath"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for (name, path) in [
        ("Desired", ".spec.replicas"),
        ("Ready", ".status.readyReplicas"),
        ("Updated", ".status.updatedReplicas"),
        ("Available", ".status.availableReplicas"),
        ("Age", ".metadata.creationTimestamp"),
    ] {
        assert!(
            columns.contains(&(name.to_owned(), path.to_owned())),
            "no column {name} ({path}): {columns:?}"
        );
        // The path names a field of the schema.
        let mut node = &version["schema"]["openAPIV3Schema"];
        for part in path.trim_start_matches('.').split('.') {
            node = &node["properties"][part];
        }
        assert!(
            !node.is_null() || path.starts_with(".metadata"),
            "{path} is not in the schema"
        );
    }
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

/// Every schema node under `node`, with its path.
fn walk<'a>(node: &'a Value, at: String, out: &mut Vec<(String, &'a Value)>) {
    out.push((at.clone(), node));
    if let Some(props) = node["properties"].as_object() {
        for (name, child) in props {
            walk(child, format!("{at}.{name}"), out);
        }
    }
    if let Some(items) = node.get("items") {
        walk(items, format!("{at}[]"), out);
    }
    if let Some(extra) = node.get("additionalProperties").filter(|v| v.is_object()) {
        walk(extra, format!("{at}.*"), out);
    }
}

fn schema_of(crd: Crd) -> Value {
    let crd = serde_json::to_value(crd).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn schema() -> Value {
    schema_of(machine_kube::crd())
}

#[test]
fn every_field_is_camel_case() {
    let mut nodes = Vec::new();
    let schemas: Vec<Value> = crds().into_iter().map(|(_, c)| schema_of(c)).collect();
    for schema in &schemas {
        walk(schema, "openAPIV3Schema".into(), &mut nodes);
    }
    let bad: Vec<String> = nodes
        .iter()
        .filter_map(|(at, _)| {
            let field = at.rsplit('.').next()?.trim_end_matches("[]");
            let camel = field == "*"
                || (field.starts_with(|c: char| c.is_ascii_lowercase())
                    && field.chars().all(|c| c.is_ascii_alphanumeric()));
            (!camel).then(|| at.clone())
        })
        .collect();
    assert!(bad.is_empty(), "fields not in camelCase: {bad:?}");
}

/// Kubernetes 1.34 warns about formats it does not know (`uint16` from a `u16`; 1.34.0
/// about every format on integers); only string formats of its list are kept.
#[test]
fn no_format_the_api_server_warns_about() {
    let schema = schema();
    let mut nodes = Vec::new();
    let schemas: Vec<Value> = crds().into_iter().map(|(_, c)| schema_of(c)).collect();
    for schema in &schemas {
        walk(schema, "openAPIV3Schema".into(), &mut nodes);
    }
    for (at, node) in nodes {
        if let Some(format) = node.get("format") {
            assert_eq!(
                node["type"], "string",
                "{at}: format {format} on a non-string"
            );
            assert!(
                ["date-time", "byte", "uri", "hostname", "ipv4", "ipv6"]
                    .contains(&format.as_str().unwrap()),
                "{at}: format {format}"
            );
        }
    }
    let port = &schema["properties"]["status"]["properties"]["machine"]["properties"]["access"]["properties"]
        ["ssh"]["properties"]["port"];
    assert_eq!(port["type"], "integer", "{port}");
    assert_eq!(port["maximum"], 65535.0, "{port}");
}

/// A set's machines are named `<set>-<slot>-<generation>`: the CRD admits the names a
/// set can have, no longer than the fleet's naming leaves room for.
#[test]
fn the_set_crd_admits_exactly_the_names_a_set_can_have() {
    let rule =
        schema_of(machine_kube::machine_set_crd())["properties"]["metadata"]["properties"]["name"]
            .clone();
    let max = rule["maxLength"].as_u64().unwrap() as usize;
    assert_eq!(max, machine_core::fleet::MAX_SET_NAME_LEN);
    let pattern = regex_lite::Regex::new(rule["pattern"].as_str().unwrap()).unwrap();
    for name in [
        "web".to_owned(),
        "web.1".to_owned(),
        "a".repeat(49),
        "a".repeat(50),
        "Web".to_owned(),
    ] {
        let admitted = name.len() <= max && pattern.is_match(&name);
        let set = machine_core::fleet::MachineSet::new(
            name.as_str(),
            1,
            machine_core::MachineSpec::new(MachineName::new("x").unwrap()),
        );
        assert_eq!(
            admitted,
            set.validate().is_ok(),
            "{name:?}: admitted {admitted}"
        );
    }
}

#[test]
fn the_crd_admits_exactly_the_names_a_machine_can_have() {
    let rule = schema()["properties"]["metadata"]["properties"]["name"].clone();
    let max = rule["maxLength"].as_u64().unwrap() as usize;
    let pattern = regex_lite::Regex::new(rule["pattern"].as_str().unwrap()).unwrap();
    for name in [
        "web-1".to_owned(),
        "web.1".to_owned(),
        "Web-1".to_owned(),
        "-web".to_owned(),
        "web-".to_owned(),
        "a".repeat(63),
        "a".repeat(64),
        "web_1".to_owned(),
        "1".to_owned(),
    ] {
        let admitted = name.len() <= max && pattern.is_match(&name);
        assert_eq!(
            admitted,
            MachineName::new(name.as_str()).is_ok(),
            "{name:?}: admitted {admitted}"
        );
    }
}

/// Where scripts/peers/70-kubernetes-validate.sh installs the tool.
fn kubernetes_validate() -> PathBuf {
    if let Some(path) = std::env::var_os("KUBERNETES_VALIDATE") {
        return path.into();
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
        });
    let path = cache.join("machine-provisioning/kubernetes-validate/bin/kubernetes-validate");
    assert!(
        path.exists(),
        "kubernetes-validate is not installed at {}: run scripts/peers/70-kubernetes-validate.sh \
         (it installs the PyPI package kubernetes-validate into a virtualenv there), or set \
         KUBERNETES_VALIDATE to its path",
        path.display()
    );
    path
}

fn validate(file: &std::path::Path, version: &str) -> (bool, String) {
    let out = Command::new(kubernetes_validate())
        .args(["--strict", "-k", version])
        .arg(file)
        .output()
        .expect("kubernetes-validate runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[test]
fn kubernetes_validate_accepts_the_crd_for_every_supported_version() {
    // The oldest Kubernetes still supported when this was written, the one whose
    // warnings the issue names, and the newest the tool knows.
    for version in ["1.33.0", "1.34.0", "1.37.0"] {
        for file in [COMMITTED, COMMITTED_SETS] {
            let (ok, said) = validate(std::path::Path::new(file), version);
            assert!(ok, "kubernetes-validate {version} refused {file}:\n{said}");
            assert!(said.contains("passed"), "{said}");
        }
    }
    // And it refuses a CRD that is wrong, so its yes means something.
    let broken = serde_saphyr::to_string(&machine_kube::crd())
        .unwrap()
        .replace("scope: Namespaced", "scope: Galactic")
        .replace("  served: true", "  served: sometimes");
    let dir = std::env::temp_dir().join(format!("machine-kube-crd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("broken.yaml");
    std::fs::write(&file, broken).unwrap();
    let (ok, said) = validate(&file, "1.34.0");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!ok, "kubernetes-validate accepted a broken CRD:\n{said}");
}

/// The README's `MachineSet` passes the committed CRD's schema, and what the API server
/// refuses at admission by that schema (a negative `replicas`, a name too long for the
/// fleet's machine names, an unknown delete policy) is refused, by the JSON Schema
/// validator of `kubernetes-validate`'s own environment (PyPI `jsonschema`).
#[test]
fn the_set_crd_schema_takes_the_readme_example_and_refuses_bad_sets() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let start = readme
        .find("```yaml\napiVersion: machine-provisioning.dev/v1alpha1\nkind: MachineSet")
        .expect("the README shows a MachineSet");
    let example = &readme[start + "```yaml\n".len()..];
    let example = &example[..example.find("```").unwrap()];
    let python = kubernetes_validate().with_file_name("python");
    let script = r#"
import sys, json, yaml, jsonschema
crd = yaml.safe_load(open(sys.argv[1]))
schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
for doc in json.load(sys.stdin):
    errors = list(jsonschema.Draft4Validator(schema).iter_errors(doc))
    print(json.dumps(["/".join(str(p) for p in e.absolute_path) for e in errors]))
"#;
    let good: Value = serde_saphyr::from_str(example).unwrap();
    let mut negative = good.clone();
    negative["spec"]["replicas"] = (-1).into();
    let mut long = good.clone();
    long["metadata"]["name"] = "a".repeat(50).into();
    let mut policy = good.clone();
    policy["spec"]["deletePolicy"] = "Largest".into();
    let docs = serde_json::to_string(&vec![good, negative, long, policy]).unwrap();
    let mut child = Command::new(&python)
        .args(["-c", script, COMMITTED_SETS])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubernetes-validate's python runs");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(docs.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<Vec<String>> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        answers,
        vec![
            vec![],
            vec!["spec/replicas".to_owned()],
            vec!["metadata/name".to_owned()],
            vec!["spec/deletePolicy".to_owned()],
        ]
    );
}
