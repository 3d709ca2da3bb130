//! The real peers these tests check output with: Debian's cloud-init (its schema
//! validator, its Python and PyYAML, its MIME handling) and Debian's Ignition
//! (`ignition-validate`). A missing peer fails the test with how to install it.
#![allow(dead_code)]

pub mod root;

use std::io::Write;
use std::process::{Command, Stdio};

const INSTALL: &str = "run scripts/peers/20-cloud-init.sh (or: apt-get install -y --no-install-recommends cloud-init ignition)";

/// The Python cloud-init runs on (it has PyYAML and cloud-init's modules).
pub const PYTHON: &str = "/usr/bin/python3";

pub fn need(path: &str) {
    assert!(
        std::path::Path::new(path).exists(),
        "{path} is missing: {INSTALL}"
    );
}

/// Runs `cloud-init schema -c FILE` on `doc` and panics unless it prints
/// `Valid cloud-config`.
pub fn assert_valid_cloud_config(doc: &str) {
    need("/usr/bin/cloud-init");
    let mut file = tempfile::Builder::new()
        .suffix(".yaml")
        .tempfile()
        .expect("temp file");
    file.write_all(doc.as_bytes()).expect("write temp file");
    let out = Command::new("/usr/bin/cloud-init")
        .args(["schema", "-c"])
        .arg(file.path())
        .output()
        .unwrap_or_else(|e| panic!("cannot run cloud-init: {e}; {INSTALL}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("Valid cloud-config"),
        "cloud-init schema refused the document:\n{stdout}{stderr}\n--- document ---\n{doc}"
    );
}

/// Runs a Python script with cloud-init's interpreter, feeding `stdin`; returns stdout.
pub fn python(script: &str, stdin: &[u8]) -> String {
    need(PYTHON);
    need("/usr/bin/cloud-init");
    let mut child = Command::new(PYTHON)
        .arg("-c")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {PYTHON}: {e}; {INSTALL}"));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    let out = child.wait_with_output().expect("python output");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// Parses YAML documents with PyYAML's `safe_load` (what cloud-init uses) and returns
/// them as JSON values. Input: documents joined by NUL bytes.
pub fn pyyaml_load_all(docs: &[String]) -> Vec<serde_json::Value> {
    let script = r#"
import sys, json, yaml
docs = sys.stdin.buffer.read().split(b"\0")
print(json.dumps([yaml.safe_load(d.decode("utf-8")) for d in docs]))
"#;
    let joined = docs.join("\0");
    serde_json::from_str(&python(script, joined.as_bytes())).expect("json from python")
}

/// Runs `ignition-validate` on `config` and panics unless it accepts it with no
/// warning at all (unknown keys are only warnings there).
pub fn assert_valid_ignition(config: &str) {
    need("/usr/bin/ignition-validate");
    let mut file = tempfile::Builder::new()
        .suffix(".ign")
        .tempfile()
        .expect("temp file");
    file.write_all(config.as_bytes()).expect("write temp file");
    let out = Command::new("/usr/bin/ignition-validate")
        .arg(file.path())
        .output()
        .unwrap_or_else(|e| panic!("cannot run ignition-validate: {e}; {INSTALL}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.trim().is_empty(),
        "ignition-validate refused the config:\n{text}\n--- config ---\n{config}"
    );
}
