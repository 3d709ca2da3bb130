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

use super::{UserDataFormat, UserDataPart, runcmd};
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
/// records the failure. Jinja parts are checked through their check views.
///
/// Before each `runcmd` command, a marker records its layer and index in
/// [`super::RUNCMD_LAYER_PATH`]: cloud-init reports only that `runcmd` failed, and the
/// completion check then names the layer and which of its commands failed. The markers
/// are inserted into the layer's text before each item of its `runcmd` list, every other
/// byte unchanged (and checked by reading the result back); where that cannot be done (a
/// Jinja template, an alias, a block scalar or tagged item), one marker before the part
/// names the layer only.
pub fn compose<'a>(
    layers: impl IntoIterator<Item = (&'a str, &'a [UserDataPart])>,
) -> Result<Vec<UserDataPart>> {
    let layers: Vec<_> = layers.into_iter().collect();
    let merged = merge_all(layers.iter().copied())?;
    let mut strict = String::new();
    if merged.doc.contains_key("bootcmd") {
        strict.push_str("bootcmd:\n- set -e\n");
    }
    if merged.doc.contains_key("runcmd") {
        strict.push_str(&format!(
            "runcmd:\n- set -e\n- {}\n",
            runcmd::make_marker_dir()
        ));
    }
    let mut out = Vec::new();
    if !strict.is_empty() {
        out.push(UserDataPart::new(
            UserDataFormat::CloudConfig,
            STRICT_COMMANDS,
            format!("#cloud-config\n{strict}"),
        ));
    }
    for (layer, parts) in layers {
        let count = merged
            .commands
            .iter()
            .find(|(l, _)| l == layer)
            .map_or(0, |(_, n)| *n);
        let mut before = 0;
        for part in parts {
            let doc = match (&part.format, &part.check_view) {
                (UserDataFormat::CloudConfig, _) => parse(layer, part, &part.content)?,
                (UserDataFormat::Jinja2, Some(view)) => parse(layer, part, view)?,
                _ => None,
            };
            let items = match doc.as_ref().and_then(|d| d.get("runcmd")) {
                Some(Value::Array(items)) => items.len(),
                _ => {
                    out.push(part.clone());
                    continue;
                }
            };
            let doc = doc.unwrap_or_default();
            match runcmd::mark_each_command(layer, part, &doc, before, count) {
                Some(marked) => out.push(marked),
                None => {
                    out.push(runcmd::layer_marker(layer, count));
                    out.push(part.clone());
                }
            }
            before += items;
        }
    }
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
            check_merge_header(layer, part)?;
            let text = match part.format {
                UserDataFormat::CloudConfig => &part.content,
                UserDataFormat::Jinja2 => {
                    refuse_merge_keys_in_template(layer, part)?;
                    part.check_view
                        .as_ref()
                        .ok_or_else(|| unchecked_template(layer, part))?
                }
                _ => continue,
            };
            let Some(doc) = parse(layer, part, text)? else {
                continue;
            };
            merged.add(layer, doc)?;
        }
    }
    merged.check_names()?;
    merged.check_owners()?;
    Ok(merged)
}

/// The public host keys a layer's parts carry in `ssh_keys`, which the composer must
/// pin. A private key without its public half is refused: cloud-init would install a key
/// the composer cannot pin, and the first connection would have to trust it blindly.
pub(crate) fn carried_host_keys(layer: &str, parts: &[UserDataPart]) -> Result<Vec<String>> {
    let mut keys = Vec::new();
    for part in parts {
        let text = match part.format {
            UserDataFormat::CloudConfig => &part.content,
            UserDataFormat::Jinja2 => match &part.check_view {
                Some(view) => view,
                None => continue,
            },
            _ => continue,
        };
        let Some(doc) = parse(layer, part, text)? else {
            continue;
        };
        let Some(Value::Object(ssh_keys)) = doc.get("ssh_keys") else {
            continue;
        };
        for key in ssh_keys.keys() {
            let Some(algo) = key.strip_suffix("_private") else {
                continue;
            };
            match ssh_keys.get(&format!("{algo}_public")) {
                Some(Value::String(_)) => {}
                _ => {
                    return Err(Error::invalid_spec(
                        format!("ssh_keys.{algo}_public"),
                        format!(
                            "layer {layer:?} gives a {algo} host key without its public half; the composer pins every host key a machine is given, so give both"
                        ),
                    ));
                }
            }
        }
        for (key, value) in ssh_keys {
            if key.ends_with("_public")
                && let Value::String(public) = value
            {
                keys.push(public.trim().to_owned());
            }
        }
    }
    Ok(keys)
}

/// The keys with which a cloud-config part changes how cloud-init merges it.
const MERGE_KEYS: [&str; 2] = ["merge_how", "merge_type"];

/// A part's own `Merge-Type` header may only repeat the composer's additive one.
fn check_merge_header(layer: &str, part: &UserDataPart) -> Result<()> {
    for (name, value) in &part.headers {
        if name.eq_ignore_ascii_case("Merge-Type") && value.trim() != super::MERGE_TYPE {
            return Err(Error::invalid_spec(
                format!("layer {layer}: part {}", part.filename),
                format!(
                    "its Merge-Type header changes how cloud-init merges it, so that earlier layers' lists or keys could be silently dropped; the composer merges every layer additively ({}): remove the header",
                    super::MERGE_TYPE
                ),
            ));
        }
    }
    Ok(())
}

/// A template's merge keys are refused even when its check view lacks them: the view
/// is a stand-in, the template is what cloud-init renders.
fn refuse_merge_keys_in_template(layer: &str, part: &UserDataPart) -> Result<()> {
    let text = String::from_utf8_lossy(&part.content);
    for key in MERGE_KEYS {
        if text
            .lines()
            .any(|l| l.trim_start_matches(['"', '\'']).starts_with(key))
        {
            return Err(merge_key(layer, key));
        }
    }
    Ok(())
}

fn merge_key(layer: &str, key: &str) -> Error {
    Error::invalid_spec(
        key,
        format!(
            "layer {layer:?} sets {key}, which makes cloud-init merge its part differently (dropping earlier layers' write_files or runcmd, the composer's own too) while a merged document would ignore it; the composer merges every layer additively: remove {key}"
        ),
    )
}

fn unchecked_template(layer: &str, part: &UserDataPart) -> Error {
    Error::invalid_spec(
        format!("layer {layer}: part {}", part.filename),
        "is a Jinja template that cloud-init renders on the machine, so the composer cannot check it against the other layers (keys set differently, users, files, their owners, host keys, merge settings) unless the part carries a check view: a rendering with stand-in values (UserDataPart::with_check_view; CloudConfigLayer::with_jinja2 makes one). An empty view (#cloud-config) says the template sets nothing another layer sets",
    )
}

fn parse(
    layer: &str,
    part: &UserDataPart,
    content: &[u8],
) -> Result<Option<serde_json::Map<String, Value>>> {
    let field = format!("layer {layer}: part {}", part.filename);
    let text = std::str::from_utf8(content)
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
    /// Groups the document creates (top-level `groups`), with the layer.
    groups: BTreeMap<String, String>,
    /// Every `write_files` entry with an owner and no `defer`: the layer, the entry's
    /// field, its path, owner user and group.
    owned_files: Vec<OwnedFile>,
    /// Layers with `runcmd`, in order.
    commands: Vec<(String, usize)>,
}

struct OwnedFile {
    layer: String,
    field: String,
    path: String,
    user: String,
    group: Option<String>,
}

impl Merged {
    fn add(&mut self, layer: &str, doc: serde_json::Map<String, Value>) -> Result<()> {
        if let Some(key) = MERGE_KEYS.into_iter().find(|k| doc.contains_key(*k)) {
            return Err(merge_key(layer, key));
        }
        if let Some(Value::Array(cmds)) = doc.get("runcmd") {
            match self.commands.last_mut() {
                Some((last, n)) if last == layer => *n += cmds.len(),
                _ => self.commands.push((layer.to_owned(), cmds.len())),
            }
        }
        match doc.get("groups") {
            Some(Value::String(s)) => {
                for g in s.split(',').map(str::trim).filter(|g| !g.is_empty()) {
                    self.groups
                        .entry(g.to_owned())
                        .or_insert_with(|| layer.to_owned());
                }
            }
            Some(Value::Array(items)) => {
                for item in items {
                    let names: Vec<&String> = match item {
                        Value::String(g) => vec![g],
                        Value::Object(m) => m.keys().collect(),
                        _ => Vec::new(),
                    };
                    for g in names {
                        self.groups
                            .entry(g.clone())
                            .or_insert_with(|| layer.to_owned());
                    }
                }
            }
            _ => {}
        }
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
                let deferred = matches!(file.get("defer"), Some(Value::Bool(true)));
                if let (Some(Value::String(owner)), false) = (file.get("owner"), deferred) {
                    let (user, group) = match owner.split_once(':') {
                        Some((u, g)) => (u, Some(g.to_owned())),
                        None => (owner.as_str(), None),
                    };
                    self.owned_files.push(OwnedFile {
                        layer: layer.to_owned(),
                        field: format!("write_files[{i}].defer"),
                        path: path.clone(),
                        user: user.to_owned(),
                        group,
                    });
                }
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

    /// A file owned by a user or group that the user data itself creates must be
    /// deferred: cloud-init writes files in its init stage, before `users_groups` runs
    /// in the config stage, so its chown fails ("Unknown user or group"), the file stays
    /// root's and the files after it are never written. Whichever layer creates the
    /// account, the composer sees it.
    fn check_owners(&self) -> Result<()> {
        for f in &self.owned_files {
            // root exists before cloud-init, whatever a layer says of it.
            if f.user == "root" && f.group.as_deref().is_none_or(|g| g == "root") {
                continue;
            }
            let creator = self
                .users
                .get(&f.user)
                .filter(|_| f.user != "root")
                .map(|(layer, _)| (layer, "user", &f.user))
                .or_else(|| {
                    let g = f.group.as_ref()?;
                    let layer = self
                        .users
                        .get(g)
                        .map(|(l, _)| l)
                        .or_else(|| self.groups.get(g))?;
                    Some((layer, "group", g))
                });
            if let Some((creator, what, name)) = creator {
                let by = if *creator == f.layer {
                    "that layer creates".to_owned()
                } else {
                    format!("layer {creator:?} creates")
                };
                return Err(Error::invalid_spec(
                    f.field.clone(),
                    format!(
                        "layer {:?} writes {:?} owned by {what} {name:?}, which {by} in the same user data; cloud-init writes files before it creates accounts, so the chown would fail: set defer: true",
                        f.layer, f.path
                    ),
                ));
            }
        }
        Ok(())
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
        // strict, base, app (its commands marked)
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0].filename, STRICT_COMMANDS);
        assert_eq!(
            parts[0].content,
            b"#cloud-config\nruncmd:\n- set -e\n- mkdir -p /run/machine-core\n"
        );
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

    #[test]
    fn a_file_owned_by_an_account_another_layer_creates_must_be_deferred() {
        let users = (
            "users",
            vec![cc("u", "users: [{name: deploy}]\ngroups: [ops]\n")],
        );
        for owner in ["deploy", "deploy:deploy", "root:ops"] {
            let files = (
                "files",
                vec![cc(
                    "f",
                    &format!("write_files: [{{path: /srv/a, owner: \"{owner}\"}}]\n"),
                )],
            );
            let e = check(&[users.clone(), files]).unwrap_err();
            assert_eq!(e.field(), Some("write_files[0].defer"), "{owner}: {e}");
            let msg = e.to_string();
            assert!(
                msg.contains("\"files\"") && msg.contains("\"users\""),
                "{msg}"
            );
        }
        check(&[
            users.clone(),
            (
                "files",
                vec![cc(
                    "f",
                    "write_files: [{path: /a, owner: deploy, defer: true}, {path: /b, owner: root}, {path: /c, owner: \"www-data:www-data\"}]\n",
                )],
            ),
        ])
        .unwrap();
        // The same layer creating and owning is refused too: cloud-init's order is the same.
        let e = check(&[(
            "one",
            vec![cc(
                "o",
                "users: [{name: app}]\nwrite_files: [{path: /a, owner: app}]\n",
            )],
        )])
        .unwrap_err();
        assert!(e.to_string().contains("that layer creates"), "{e}");
    }

    #[test]
    fn merge_settings_in_a_layer_are_refused_naming_it() {
        for yaml in [
            "merge_how: [{name: list, settings: [replace]}]\n",
            "merge_type: 'list(replace)'\n",
        ] {
            let e = check(&[
                ("base", vec![cc("a", "runcmd: [a]\n")]),
                ("app", vec![cc("b", yaml)]),
            ])
            .unwrap_err();
            assert!(e.to_string().contains("layer \"app\" sets merge_"), "{e}");
        }
        let header = cc("b", "packages: [a]\n")
            .with_header("Merge-Type", "list(replace)+dict(replace)+str()");
        let e = check(&[("app", vec![header])]).unwrap_err();
        assert!(e.to_string().contains("Merge-Type header"), "{e}");
        let ours = cc("b", "packages: [a]\n").with_header("Merge-Type", super::super::MERGE_TYPE);
        check(&[("app", vec![ours])]).unwrap();
        let template = UserDataPart::new(
            UserDataFormat::Jinja2,
            "t",
            "## template: jinja\n#cloud-config\nmerge_how: {{ how }}\n",
        )
        .with_check_view("#cloud-config\n");
        let e = check(&[("tpl", vec![template])]).unwrap_err();
        assert_eq!(e.field(), Some("merge_how"), "{e}");
    }

    #[test]
    fn a_template_is_checked_through_its_view_and_refused_without_one() {
        let template = UserDataPart::new(
            UserDataFormat::Jinja2,
            "host.yaml",
            "## template: jinja\n#cloud-config\nhostname: {{ v1.local_hostname }}\n",
        );
        let e = check(&[("tpl", vec![template.clone()])]).unwrap_err();
        assert!(e.to_string().contains("check view"), "{e}");
        let viewed = template.with_check_view("#cloud-config\nhostname: web-1\n");
        let e = check(&[
            ("base", vec![cc("a", "hostname: db-1\n")]),
            ("tpl", vec![viewed.clone()]),
        ])
        .unwrap_err();
        assert_eq!(e.field(), Some("hostname"), "{e}");
        check(&[
            ("base", vec![cc("a", "hostname: web-1\n")]),
            ("tpl", vec![viewed]),
        ])
        .unwrap();
    }

    #[test]
    fn each_command_is_preceded_by_a_marker_and_templates_by_one_naming_the_layer() {
        let template = UserDataPart::new(
            UserDataFormat::Jinja2,
            "t",
            "## template: jinja\n#cloud-config\nruncmd: [\"echo {{ v1.instance_id }}\"]\n",
        )
        .with_check_view("#cloud-config\nruncmd: [echo i-1]\n");
        let layers = [
            ("base", vec![cc("a", "runcmd: [a, b]\n")]),
            ("quiet", vec![cc("q", "packages: [x]\n")]),
            ("app's", vec![cc("b", "runcmd: [c]\n"), template]),
        ];
        let parts = compose(layers.iter().map(|(n, p)| (*n, p.as_slice()))).unwrap();
        let names: Vec<_> = parts.iter().map(|p| p.filename.as_str()).collect();
        assert_eq!(
            names,
            [
                STRICT_COMMANDS,
                "a",
                "q",
                "b",
                "runcmd-of-app_s.cloud-config.yaml",
                "t"
            ]
        );
        let commands = |i: usize| -> Vec<String> {
            let text = String::from_utf8(parts[i].content.clone()).unwrap();
            let doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
            doc["runcmd"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap().to_owned())
                .collect()
        };
        let mark = |m: &str| {
            format!(
                "printf '%s %s %s\\n' {m} > {}",
                super::super::RUNCMD_LAYER_PATH
            )
        };
        assert_eq!(commands(0), ["set -e", "mkdir -p /run/machine-core"]);
        assert_eq!(
            commands(1),
            [mark("1 2 base"), "a".into(), mark("2 2 base"), "b".into()]
        );
        // The template's commands are the second of the layer: its marker has index 0.
        assert_eq!(commands(3), [mark("1 2 \"app's\""), "c".into()]);
        assert_eq!(commands(4), [mark("0 2 \"app's\"")]);
    }

    #[test]
    fn a_private_host_key_without_its_public_half_is_refused() {
        let parts = [cc("k", "ssh_keys: {ed25519_private: x}\n")];
        let e = carried_host_keys("keys", &parts).unwrap_err();
        assert_eq!(e.field(), Some("ssh_keys.ed25519_public"));
        let parts = [cc(
            "k",
            "ssh_keys: {ed25519_private: x, ed25519_public: ssh-ed25519 AAAA c}\n",
        )];
        assert_eq!(
            carried_host_keys("keys", &parts).unwrap(),
            ["ssh-ed25519 AAAA c"]
        );
    }
}
