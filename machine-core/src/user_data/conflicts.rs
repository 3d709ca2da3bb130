//! What cloud-init would resolve silently when it merges the cloud-config parts of
//! several layers with [`super::MERGE_TYPE`], refused before any machine exists.
//!
//! With that merge, lists are appended and maps merged, but where two parts give the
//! same key different scalar values cloud-init keeps the first and reports success: the
//! second layer's value is simply lost. The checks here see the same documents cloud-init
//! will and refuse such a key, naming it and both layers. Messages quote no value but
//! host names (a value may be a password hash or a private key).

use std::collections::BTreeMap;

use serde_json::Value;

use super::{UserDataFormat, UserDataPart};
use crate::error::{Error, Result};

/// Checks the cloud-config parts of `layers` (each a layer name and its parts, in the
/// order they will be assembled) for what cloud-init would merge silently:
///
/// - one key (at any depth) given different scalar values, or a list in one layer and a
///   map or scalar in another;
/// - `ssh_keys` in two layers: cloud-init installs one set of host keys while the
///   composer would pin every layer's;
/// - `hostname` from one layer and an `fqdn` whose first label differs from another;
/// - `users` entries of one name from two layers that differ (cloud-init keeps one);
/// - `write_files` entries of one path from two layers, the later not `append: true`
///   (the later file replaces the earlier).
///
/// The error is an invalid-spec error whose field is the key path and whose message
/// names both layers. A cloud-config part that is not a YAML mapping is refused too,
/// naming its layer and file. Jinja parts are not looked into: they are templates until
/// cloud-init renders them on the machine.
pub fn check_conflicts<'a>(
    layers: impl IntoIterator<Item = (&'a str, &'a [UserDataPart])>,
) -> Result<()> {
    merge_all(layers).map(drop)
}

/// The parts of `layers` (each a layer name and its parts, in order) as the composer
/// sends them: checked by [`check_conflicts`], then flattened in order. When any
/// cloud-config part has `runcmd` (or `bootcmd`), a first part makes that list begin
/// with `set -e`: cloud-init runs all layers' commands as one `sh` script whose status is
/// its last command's, so without it a failed command followed by any other would be
/// reported as success. With it, the first failed command stops the list and cloud-init
/// records the failure. (Jinja parts are not looked into.)
pub fn compose<'a>(
    layers: impl IntoIterator<Item = (&'a str, &'a [UserDataPart])>,
) -> Result<Vec<UserDataPart>> {
    let layers: Vec<_> = layers.into_iter().collect();
    let merged = merge_all(layers.iter().copied())?;
    let mut strict = String::new();
    for key in ["bootcmd", "runcmd"] {
        if merged.doc.contains_key(key) {
            strict.push_str(&format!("{key}:\n- set -e\n"));
        }
    }
    let mut out = Vec::new();
    if !strict.is_empty() {
        out.push(UserDataPart::new(
            UserDataFormat::CloudConfig,
            STRICT_COMMANDS,
            format!("#cloud-config\n{strict}"),
        ));
    }
    out.extend(
        layers
            .into_iter()
            .flat_map(|(_, parts)| parts.iter().cloned()),
    );
    Ok(out)
}

/// The file name of the part [`compose`] puts first when commands are present.
pub const STRICT_COMMANDS: &str = "strict-commands.cloud-config.yaml";

fn merge_all<'a>(
    layers: impl IntoIterator<Item = (&'a str, &'a [UserDataPart])>,
) -> Result<Merged> {
    let mut merged = Merged::default();
    for (layer, parts) in layers {
        for part in parts {
            if part.format != UserDataFormat::CloudConfig {
                continue;
            }
            let Some(doc) = parse(layer, part)? else {
                continue;
            };
            merged.add(layer, doc)?;
        }
    }
    merged.check_names()?;
    Ok(merged)
}

fn parse(layer: &str, part: &UserDataPart) -> Result<Option<serde_json::Map<String, Value>>> {
    let field = format!("layer {layer}: part {}", part.filename);
    let text = std::str::from_utf8(&part.content)
        .map_err(|_| Error::invalid_spec(field.clone(), "a cloud-config must be UTF-8 text"))?;
    // Values are never quoted: every field counts as secret.
    let value: Value = crate::spec::from_yaml_redacting(text, |_| true)
        .map_err(|e| Error::invalid_spec(field.clone(), e.to_string()))?;
    match value {
        Value::Null => Ok(None),
        Value::Object(map) => Ok(Some(map)),
        _ => Err(Error::invalid_spec(
            field,
            "a cloud-config must be a YAML mapping of keys",
        )),
    }
}

/// The merge so far, with the layer that set each path.
#[derive(Default)]
struct Merged {
    doc: serde_json::Map<String, Value>,
    owners: BTreeMap<String, String>,
    /// Each user name and file path with the layer and entry that brought it.
    users: BTreeMap<String, (String, Value)>,
    files: BTreeMap<String, String>,
}

impl Merged {
    fn add(&mut self, layer: &str, doc: serde_json::Map<String, Value>) -> Result<()> {
        if doc.contains_key("ssh_keys")
            && let Some(first) = self.owners.get("ssh_keys")
            && first != layer
        {
            return Err(Error::invalid_spec(
                "ssh_keys",
                format!(
                    "layers {first:?} and {layer:?} both carry SSH host keys; cloud-init installs one set while every layer's keys would be pinned: give a machine's host keys in one layer"
                ),
            ));
        }
        if let Some(Value::Array(users)) = doc.get("users") {
            for (i, user) in users.iter().enumerate() {
                let name = match user {
                    Value::String(s) => s.clone(),
                    Value::Object(m) => match m.get("name") {
                        Some(Value::String(s)) => s.clone(),
                        _ => continue,
                    },
                    _ => continue,
                };
                match self.users.get(&name) {
                    Some((first, entry)) if first != layer && entry != user => {
                        return Err(Error::invalid_spec(
                            format!("users[{i}]"),
                            format!(
                                "layers {first:?} and {layer:?} both define user {name:?}, differently; cloud-init would keep one: define it in one layer"
                            ),
                        ));
                    }
                    Some(_) => {}
                    None => {
                        self.users.insert(name, (layer.to_owned(), user.clone()));
                    }
                }
            }
        }
        if let Some(Value::Array(files)) = doc.get("write_files") {
            for (i, file) in files.iter().enumerate() {
                let Some(Value::String(path)) = file.get("path") else {
                    continue;
                };
                let append = matches!(file.get("append"), Some(Value::Bool(true)));
                match self.files.get(path) {
                    Some(first) if first != layer && !append => {
                        return Err(Error::invalid_spec(
                            format!("write_files[{i}].path"),
                            format!(
                                "layers {first:?} and {layer:?} both write {path:?}; the later would silently replace the earlier: write it in one layer, or set append: true"
                            ),
                        ));
                    }
                    Some(_) => {}
                    None => {
                        self.files.insert(path.clone(), layer.to_owned());
                    }
                }
            }
        }
        merge_map(&mut self.doc, doc, "", layer, &mut self.owners)
    }

    /// A host name from one layer and an FQDN from another must agree.
    fn check_names(&self) -> Result<()> {
        let (Some(Value::String(host)), Some(Value::String(fqdn))) =
            (self.doc.get("hostname"), self.doc.get("fqdn"))
        else {
            return Ok(());
        };
        let owner = |key: &str| self.owners.get(key).map_or("", String::as_str);
        let (h_layer, f_layer) = (owner("hostname"), owner("fqdn"));
        if h_layer != f_layer && fqdn.split('.').next() != Some(host.as_str()) {
            return Err(Error::invalid_spec(
                "fqdn",
                format!(
                    "layer {h_layer:?} sets hostname {host:?} and layer {f_layer:?} sets fqdn {fqdn:?}, which names another host: set both in one layer"
                ),
            ));
        }
        Ok(())
    }
}

fn merge_map(
    acc: &mut serde_json::Map<String, Value>,
    new: serde_json::Map<String, Value>,
    path: &str,
    layer: &str,
    owners: &mut BTreeMap<String, String>,
) -> Result<()> {
    for (key, value) in new {
        let p = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        let Some(old) = acc.get_mut(&key) else {
            owners.insert(p, layer.to_owned());
            acc.insert(key, value);
            continue;
        };
        let first = owners.get(&p).cloned().unwrap_or_default();
        match (old, value) {
            (Value::Array(old), Value::Array(items)) => old.extend(items),
            (Value::Object(old), Value::Object(m)) => merge_map(old, m, &p, layer, owners)?,
            (old, value) if *old == value => {}
            (old, value) => {
                let what = if kind(old) == kind(&value) {
                    "different values".to_owned()
                } else {
                    format!("{} and {}", kind(old), kind(&value))
                };
                return Err(Error::invalid_spec(
                    p,
                    format!(
                        "layers {first:?} and {layer:?} give it {what}; cloud-init would silently keep {first:?}'s: set it in one layer"
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
        _ => "a value",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cc(name: &str, yaml: &str) -> UserDataPart {
        UserDataPart::new(
            UserDataFormat::CloudConfig,
            name,
            format!("#cloud-config\n{yaml}"),
        )
    }

    fn check(layers: &[(&str, Vec<UserDataPart>)]) -> Result<()> {
        check_conflicts(layers.iter().map(|(n, p)| (*n, p.as_slice())))
    }

    #[test]
    fn lists_and_maps_merge_equal_scalars_pass() {
        check(&[
            (
                "base",
                vec![cc(
                    "a",
                    "hostname: web\npackages: [curl]\nntp: {servers: [a]}\n",
                )],
            ),
            (
                "app",
                vec![cc(
                    "b",
                    "hostname: web\npackages: [jq]\nntp: {servers: [b]}\n",
                )],
            ),
        ])
        .unwrap();
    }

    #[test]
    fn a_scalar_set_differently_names_the_key_and_both_layers() {
        let e = check(&[
            ("base", vec![cc("a", "hostname: web\n")]),
            ("app", vec![cc("b", "hostname: db\n")]),
        ])
        .unwrap_err();
        assert_eq!(e.field(), Some("hostname"));
        let msg = e.to_string();
        assert!(msg.contains("\"base\"") && msg.contains("\"app\""), "{msg}");
        assert!(!msg.contains("db"), "values are not quoted: {msg}");
        let e = check(&[
            ("base", vec![cc("a", "apt: {proxy: http://a}\n")]),
            ("app", vec![cc("b", "apt: {proxy: http://b}\n")]),
        ])
        .unwrap_err();
        assert_eq!(e.field(), Some("apt.proxy"));
        let e = check(&[
            ("base", vec![cc("a", "runcmd: [a]\n")]),
            ("app", vec![cc("b", "runcmd: b\n")]),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("a list and a value"), "{e}");
    }

    #[test]
    fn host_keys_from_two_layers_are_refused() {
        let e = check(&[
            ("base", vec![cc("a", "ssh_keys: {ed25519_public: x}\n")]),
            ("keys", vec![cc("b", "ssh_keys: {ecdsa_public: y}\n")]),
        ])
        .unwrap_err();
        assert_eq!(e.field(), Some("ssh_keys"));
        assert!(e.to_string().contains("\"keys\""), "{e}");
    }

    #[test]
    fn hostname_and_fqdn_from_two_layers_must_agree() {
        check(&[
            ("base", vec![cc("a", "hostname: web\n")]),
            ("dns", vec![cc("b", "fqdn: web.example.org\n")]),
        ])
        .unwrap();
        let e = check(&[
            ("base", vec![cc("a", "hostname: web\n")]),
            ("dns", vec![cc("b", "fqdn: db.example.org\n")]),
        ])
        .unwrap_err();
        assert_eq!(e.field(), Some("fqdn"));
    }

    #[test]
    fn one_user_or_file_from_two_layers_is_refused_unless_equal_or_appended() {
        check(&[
            (
                "base",
                vec![cc(
                    "a",
                    "users: [{name: ops}]\nwrite_files: [{path: /a, content: x}]\n",
                )],
            ),
            (
                "app",
                vec![cc(
                    "b",
                    "users: [{name: ops}]\nwrite_files: [{path: /a, content: y, append: true}]\n",
                )],
            ),
        ])
        .unwrap();
        let e = check(&[
            ("base", vec![cc("a", "users: [{name: ops}]\n")]),
            (
                "app",
                vec![cc("b", "users: [{name: ops, shell: /bin/zsh}]\n")],
            ),
        ])
        .unwrap_err();
        assert_eq!(e.field(), Some("users[0]"));
        let e = check(&[
            (
                "base",
                vec![cc("a", "write_files: [{path: /a, content: x}]\n")],
            ),
            (
                "app",
                vec![cc(
                    "b",
                    "write_files: [{path: /b}, {path: /a, content: y}]\n",
                )],
            ),
        ])
        .unwrap_err();
        assert_eq!(e.field(), Some("write_files[1].path"));
    }

    #[test]
    fn commands_begin_with_set_e_only_when_there_are_commands() {
        let layers = [
            ("base", vec![cc("a", "packages: [curl]\n")]),
            ("app", vec![cc("b", "runcmd: [false, true]\n")]),
        ];
        let parts = compose(layers.iter().map(|(n, p)| (*n, p.as_slice()))).unwrap();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0].filename, STRICT_COMMANDS);
        assert_eq!(parts[0].content, b"#cloud-config\nruncmd:\n- set -e\n");
        let layers = [("base", vec![cc("a", "packages: [curl]\n")])];
        let parts = compose(layers.iter().map(|(n, p)| (*n, p.as_slice()))).unwrap();
        assert_eq!(parts.len(), 1);
    }

    #[test]
    fn a_part_that_is_not_a_mapping_names_layer_and_file_without_quoting() {
        let e = check(&[("base", vec![cc("a.yaml", "- s3cr3t\n")])]).unwrap_err();
        assert_eq!(e.field(), Some("layer base: part a.yaml"));
        let e = check(&[("base", vec![cc("a.yaml", "key: [s3cr3t\n")])]).unwrap_err();
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
    }
}
