//! Merging cloud-configs the way cloud-init merges the parts of a multipart with
//! [`MERGE_TYPE`]: lists are appended, maps merged key by key. Where cloud-init would
//! silently keep the first of two different scalars, this crate refuses the conflict and
//! names both layers, so the merged document and the multipart always mean the same.

use machine_core::{Error, Result};
use serde_json::Value;

use crate::model::{CloudConfig, Content};
use crate::secret::Secret;

/// The `Merge-Type` header put on every cloud-config part of a multipart:
/// lists appended, maps merged recursively (lists inside them appended too), a scalar
/// kept from the first part that set it. With conflicts refused up front, that is
/// order-independent for scalars and in-order for lists.
pub const MERGE_TYPE: &str = machine_core::user_data::MERGE_TYPE;

/// Merges `configs` (each with the name of the layer it came from) in order.
/// Two layers giving one scalar different values is an invalid-spec error naming the
/// key path and both layers.
pub fn merge<'a>(
    configs: impl IntoIterator<Item = (&'a str, &'a CloudConfig)>,
) -> Result<CloudConfig> {
    let mut acc = serde_json::Map::new();
    let mut owners: Vec<(String, String)> = Vec::new();
    let mut secret_files = Vec::new();
    for (layer, config) in configs {
        secret_files.extend(config.write_files.iter().filter(|f| f.content.is_secret()));
        let value = serde_json::to_value(config)
            .map_err(|e| Error::invalid_spec(layer, format!("cannot merge: {e}")))?;
        let Value::Object(map) = value else {
            continue;
        };
        merge_map(&mut acc, map, "", layer, &mut owners)?;
    }
    let mut merged: CloudConfig = serde_json::from_value(Value::Object(acc)).map_err(|_| {
        // serde_json's message may quote a value: name only where it went wrong.
        Error::invalid_spec("cloud-config", "the merged document does not read back")
    })?;
    // The JSON round trip makes every content plain text: a file that was secret in its
    // layer stays secret (Debug redacted) in the merged document.
    for file in &mut merged.write_files {
        let was_secret = secret_files
            .iter()
            .any(|s| s.path == file.path && s.content == file.content);
        if was_secret && !file.content.is_secret() {
            let text = String::from_utf8_lossy(file.content.bytes()).into_owned();
            file.content = Content::Secret(Secret::new(text));
        }
    }
    Ok(merged)
}

fn merge_map(
    acc: &mut serde_json::Map<String, Value>,
    new: serde_json::Map<String, Value>,
    path: &str,
    layer: &str,
    owners: &mut Vec<(String, String)>,
) -> Result<()> {
    for (k, v) in new {
        let p = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        match acc.get_mut(&k) {
            None => {
                record(owners, &p, layer);
                acc.insert(k, v);
            }
            Some(Value::Array(_)) if v.is_array() => {
                if let (Some(Value::Array(old)), Value::Array(items)) = (acc.get_mut(&k), v) {
                    old.extend(items);
                }
            }
            Some(Value::Object(_)) if v.is_object() => {
                if let (Some(Value::Object(old)), Value::Object(m)) = (acc.get_mut(&k), v) {
                    merge_map(old, m, &p, layer, owners)?;
                }
            }
            Some(old) if *old == v => {}
            Some(old) => {
                // No value is quoted, whatever the key: one policy with the composer's
                // checks (a value may be a password hash, a token, a private key).
                let what = if kind(old) == kind(&v) {
                    "different values".to_owned()
                } else {
                    format!("{} and {}", kind(old), kind(&v))
                };
                return Err(Error::invalid_spec(
                    p.clone(),
                    format!(
                        "layers {:?} and {layer:?} give it {what}; cloud-init would silently keep the first: set it in one layer",
                        owner(owners, &p)
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

fn record(owners: &mut Vec<(String, String)>, path: &str, layer: &str) {
    owners.push((path.to_owned(), layer.to_owned()));
}

fn owner(owners: &[(String, String)], path: &str) -> String {
    owners
        .iter()
        .filter(|(p, _)| path == p || path.starts_with(&format!("{p}.")))
        .map(|(_, l)| l.clone())
        .next()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Ntp, WriteFile};

    #[test]
    fn lists_append_maps_recurse_and_equal_scalars_pass() {
        let a = CloudConfig::new()
            .with_hostname("web")
            .with_package("curl")
            .with_file(WriteFile::new("/etc/a", "a"));
        let b = CloudConfig {
            ntp: Some(Ntp {
                servers: vec!["ntp1.example.org".into()],
                ..Ntp::default()
            }),
            ..CloudConfig::new().with_hostname("web").with_package("jq")
        };
        let c = CloudConfig {
            ntp: Some(Ntp {
                servers: vec!["ntp2.example.org".into()],
                ..Ntp::default()
            }),
            ..CloudConfig::new().with_runcmd("echo hi")
        };
        let m = merge([("base", &a), ("platform", &b), ("app", &c)]).unwrap();
        assert_eq!(m.packages, ["curl", "jq"]);
        assert_eq!(m.hostname.as_deref(), Some("web"));
        assert_eq!(
            m.ntp.unwrap().servers,
            ["ntp1.example.org", "ntp2.example.org"]
        );
        assert_eq!(m.write_files.len(), 1);
        assert_eq!(m.runcmd.len(), 1);
    }

    #[test]
    fn conflicting_scalars_name_the_key_and_both_layers() {
        let a = CloudConfig::new().with_hostname("web");
        let b = CloudConfig::new().with_hostname("db");
        let e = merge([("base", &a), ("app", &b)]).unwrap_err();
        assert_eq!(e.field(), Some("hostname"));
        let msg = e.to_string();
        assert!(msg.contains("\"base\"") && msg.contains("\"app\""), "{msg}");
        assert!(
            !msg.contains("db") && !msg.contains("web"),
            "values are not quoted: {msg}"
        );
        let c = CloudConfig::new().with_runcmd("echo s3cr3t");
        let mut d = CloudConfig::new();
        d.extra.insert("runcmd".into(), serde_json::json!("s3cr3t"));
        let e = merge([("base", &c), ("app", &d)]).unwrap_err();
        assert!(e.to_string().contains("a list and a value"), "{e}");
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
    }
}
