//! User templates for snippets and whole cloud-configs, in Jinja (minijinja).
//!
//! Jinja because cloud-init's own templates are Jinja, so users bring what they have.
//! Undefined variables are errors naming the variable and the line. In templates whose
//! name ends in `.yaml`, `.yml` or `.json`, no value can change the document's
//! structure, wherever the `{{ value }}` stands: the whole of a scalar, part of one
//! (`curl-{{ v }}`, `"a {{ v }}"`), inside a block scalar, a key or a comment. Every
//! scalar holding a value is written as one JSON string (JSON is YAML) with characters
//! YAML readers refuse escaped; a value that is a whole plain scalar and not a string
//! is written as JSON, keeping its type. A value in an anchor, tag or alias position is
//! refused, and the output is parsed again and must have the template's own structure
//! (see `yaml_fill`). `| safe` and `tojson` write their text as it is: an opt-out.
//! Filters: `shell_quote` (POSIX shell quoting), `b64encode`, `b64decode`, `tojson`.

use base64::Engine;
use machine_core::{Error, Result};
use minijinja::value::Value;
use minijinja::{AutoEscape, Environment, ErrorKind as JinjaKind, UndefinedBehavior};
use serde::Serialize;

use crate::layer::CloudConfigLayer;
use std::collections::BTreeMap;

use crate::model::{CloudConfig, Content, UserEntry};
use crate::render::parse;
use crate::secret::{Secret, scrub};
use crate::yaml_fill::{self, yaml_safe_json};

/// A set of named templates.
///
/// ```
/// use bootstrap_cloudinit::Templates;
/// let mut t = Templates::new();
/// t.add("motd.yaml", "#cloud-config\nfinal_message: {{ greeting }}\n")?;
/// let out = t.render("motd.yaml", &serde_json::json!({"greeting": "yes: no\n---"}))?;
/// assert_eq!(out, "#cloud-config\nfinal_message: \"yes: no\\n---\"\n");
/// # Ok::<(), machine_core::Error>(())
/// ```
pub struct Templates {
    env: Environment<'static>,
}

impl std::fmt::Debug for Templates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.env.templates().map(|(n, _)| n).collect();
        f.debug_struct("Templates").field("names", &names).finish()
    }
}

impl Default for Templates {
    fn default() -> Self {
        Self::new()
    }
}

/// The work one render may do, in minijinja's fuel (about one unit per instruction):
/// generous for any real document (rendering a thousand users costs tens of thousands)
/// and a bound for loops that would run for ever (`range(10000)` inside `range(10000)`).
pub const TEMPLATE_FUEL: u64 = 5_000_000;

impl Templates {
    /// An empty set with strict undefined behaviour, the helpers above and a bound on
    /// the work of each render ([`TEMPLATE_FUEL`]).
    pub fn new() -> Self {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_fuel(Some(TEMPLATE_FUEL));
        // Keep the final newline of a document, as cloud-init's own renderer does.
        if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
            .keep_trailing_newline(true)
            .build()
        {
            env.set_syntax(syntax);
        }
        env.set_auto_escape_callback(|name| {
            if is_yaml(name) {
                AutoEscape::Json
            } else {
                AutoEscape::None
            }
        });
        env.set_formatter(|out, state, value| {
            if matches!(state.auto_escape(), AutoEscape::Json) && !value.is_safe() {
                let json = serde_json::to_value(value).map_err(|e| {
                    minijinja::Error::new(JinjaKind::BadSerialization, e.to_string())
                })?;
                // In a YAML render the value goes in later, by yaml_fill; here only
                // its placeholder.
                let text = match yaml_fill::record(json) {
                    Some(token) => token,
                    None => yaml_safe_json(&serde_json::to_string(value).map_err(|e| {
                        minijinja::Error::new(JinjaKind::BadSerialization, e.to_string())
                    })?),
                };
                out.write_str(&text)
                    .map_err(|e| minijinja::Error::new(JinjaKind::WriteFailure, e.to_string()))
            } else {
                minijinja::escape_formatter(out, state, value)
            }
        });
        env.add_filter(
            "shell_quote",
            |s: String| -> std::result::Result<String, minijinja::Error> {
                shlex::try_quote(&s).map(|q| q.into_owned()).map_err(|_| {
                    minijinja::Error::new(
                        JinjaKind::InvalidOperation,
                        "cannot shell-quote a NUL byte",
                    )
                })
            },
        );
        env.add_filter("b64encode", |s: String| {
            base64::engine::general_purpose::STANDARD.encode(s.as_bytes())
        });
        env.add_filter(
            "b64decode",
            |s: String| -> std::result::Result<String, minijinja::Error> {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(s.trim())
                    .map_err(|e| {
                        minijinja::Error::new(JinjaKind::InvalidOperation, e.to_string())
                    })?;
                String::from_utf8(bytes)
                    .map_err(|e| minijinja::Error::new(JinjaKind::InvalidOperation, e.to_string()))
            },
        );
        env.add_filter(
            "tojson",
            |v: Value| -> std::result::Result<Value, minijinja::Error> {
                let json = serde_json::to_string(&v).map_err(|e| {
                    minijinja::Error::new(JinjaKind::BadSerialization, e.to_string())
                })?;
                Ok(Value::from_safe_string(yaml_safe_json(&json)))
            },
        );
        Templates { env }
    }

    /// Adds a template; a syntax error names the template, line and column.
    pub fn add(&mut self, name: impl Into<String>, source: impl Into<String>) -> Result<()> {
        let (name, source) = (name.into(), source.into());
        let src = source.clone();
        self.env
            .add_template_owned(name.clone(), source)
            .map_err(|e| template_error(&name, &src, &e, &[]))
    }

    /// Renders template `name` with `context`. An undefined variable is an error naming
    /// it, the template and the line.
    pub fn render(&self, name: &str, context: &impl Serialize) -> Result<String> {
        let tmpl = self
            .env
            .get_template(name)
            .map_err(|e| Error::invalid_spec(format!("template {name}"), e.to_string()))?;
        let ctx = Value::from(minijinja::value::Serde(context));
        let (rendered, slots) = yaml_fill::recording(|| tmpl.render(&ctx));
        let text = rendered.map_err(|e| {
            let missing: Vec<String> = {
                let mut v: Vec<String> = tmpl
                    .undeclared_variables(true)
                    .into_iter()
                    .filter(|var| !is_defined(&ctx, var))
                    .collect();
                v.sort();
                v
            };
            template_error(name, tmpl.source(), &e, &missing)
        })?;
        if !is_yaml(name) {
            return Ok(text);
        }
        yaml_fill::fill(&text, &slots).map_err(|m| {
            Error::invalid_spec(format!("template {name}"), format!("rendered output {m}"))
        })
    }

    /// Renders template `name` with `context` and the secret variables `secrets`; the
    /// output holds their values, so it comes back as a [`Secret`]. Errors never show
    /// them (see [`SecretVars`]).
    pub fn render_with_secrets(
        &self,
        name: &str,
        context: &impl Serialize,
        secrets: &SecretVars,
    ) -> Result<Secret> {
        let ctx = secrets.context(context)?;
        self.render(name, &ctx)
            .map(Secret::new)
            .map_err(|e| scrub(e, secrets.iter()))
    }

    /// [`Templates::render_cloud_config`] with secret variables, which may only land in
    /// secret fields (see [`SecretVars`]).
    pub fn render_cloud_config_with_secrets(
        &self,
        name: &str,
        context: &impl Serialize,
        secrets: &SecretVars,
        allowed_extra: &[&str],
    ) -> Result<CloudConfig> {
        let ctx = secrets.context(context)?;
        let mut config = self
            .render_cloud_config(name, &ctx, allowed_extra)
            .map_err(|e| scrub(e, secrets.iter()))?;
        secrets.confine(name, &mut config)?;
        Ok(config)
    }

    /// Renders template `name` as a cloud-config and reads it into the typed model,
    /// refusing top-level keys the model does not cover unless in `allowed_extra`.
    pub fn render_cloud_config(
        &self,
        name: &str,
        context: &impl Serialize,
        allowed_extra: &[&str],
    ) -> Result<CloudConfig> {
        let text = self.render(name, context)?;
        // A template written for cloud-init's own Jinja support starts with this line;
        // rendered here, it is a plain cloud-config.
        let text = text.strip_prefix("## template: jinja\n").unwrap_or(&text);
        parse(text, allowed_extra).map_err(|e| e.context(format_args!("template {name}")))
    }
}

/// Template variables whose values are secret (a password hash, a token, a private
/// key), given beside the ordinary context.
///
/// Their values reach the rendered document and nothing else: errors show
/// `[secret NAME]` in their place, Debug shows only the names, and this crate logs
/// neither. In a cloud-config they may only land in secret fields
/// (`users[].hashed_passwd`, `ssh_keys.*_private`, `write_files[].content`, which then
/// becomes [`crate::Content::Secret`]); anywhere else the render is refused, naming the
/// variable and the field, because the typed model would show them.
///
/// ```
/// use bootstrap_cloudinit::{Secret, SecretVars, Templates};
/// let mut t = Templates::new();
/// t.add("u.yaml", "#cloud-config\nusers:\n  - name: ops\n    hashed_passwd: {{ hash }}\n")?;
/// let secrets = SecretVars::new().with("hash", Secret::new("$6$salt$h"));
/// let c = t.render_cloud_config_with_secrets("u.yaml", &serde_json::json!({}), &secrets, &[])?;
/// assert!(!format!("{c:?}").contains("$6$salt$h"));
/// # Ok::<(), machine_core::Error>(())
/// ```
#[derive(Clone, Default)]
pub struct SecretVars {
    vars: BTreeMap<String, Secret>,
}

impl std::fmt::Debug for SecretVars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretVars")
            .field("names", &self.vars.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl SecretVars {
    /// No secret variables.
    pub fn new() -> Self {
        SecretVars::default()
    }

    /// Adds variable `name` with a secret `value`.
    pub fn with(mut self, name: impl Into<String>, value: impl Into<Secret>) -> Self {
        self.vars.insert(name.into(), value.into());
        self
    }

    /// The variables' names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.vars.keys().map(String::as_str)
    }

    fn iter(&self) -> impl Iterator<Item = (&str, &Secret)> + Clone {
        self.vars.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// `context` as a map with the secret variables added; a name in both is refused.
    fn context(&self, context: &impl Serialize) -> Result<serde_json::Value> {
        let mut value = serde_json::to_value(context).map_err(|e| {
            scrub(
                Error::invalid_spec("template context", e.to_string()),
                self.iter(),
            )
        })?;
        if self.vars.is_empty() {
            return Ok(value);
        }
        if value.is_null() {
            value = serde_json::Value::Object(Default::default());
        }
        let Some(map) = value.as_object_mut() else {
            return Err(Error::invalid_spec(
                "template context",
                "must be a map to add secret variables to",
            ));
        };
        for (name, secret) in &self.vars {
            if map.contains_key(name) {
                return Err(Error::invalid_spec(
                    format!("template context.{name}"),
                    "is given both as a value and as a secret variable",
                ));
            }
            map.insert(name.clone(), secret.expose().into());
        }
        Ok(value)
    }

    /// Marks as secret every file content holding a secret value, then refuses the
    /// config if a secret value is left anywhere but a secret field.
    fn confine(&self, template: &str, config: &mut CloudConfig) -> Result<()> {
        let holds_secret = |text: &str| {
            self.iter()
                .find(|(_, v)| !v.expose().is_empty() && text.contains(v.expose()))
                .map(|(n, _)| n.to_owned())
        };
        for file in &mut config.write_files {
            let text = String::from_utf8_lossy(file.content.bytes()).into_owned();
            if !file.content.is_secret() && holds_secret(&text).is_some() {
                file.content = Content::Secret(Secret::new(text));
            }
        }
        let mut public = config.clone();
        for entry in &mut public.users {
            if let UserEntry::User(u) = entry {
                u.hashed_passwd = None;
            }
        }
        if let Some(keys) = &mut public.ssh_keys {
            keys.ed25519_private = None;
            keys.ecdsa_private = None;
            keys.rsa_private = None;
        }
        public.write_files.retain(|f| !f.content.is_secret());
        let value = serde_json::to_value(&public).unwrap_or_default();
        if let Some((path, name)) = find_in(&value, String::new(), &holds_secret) {
            return Err(Error::invalid_spec(
                format!("template {template}"),
                format!(
                    "secret variable {name} lands in {path}, which is not a secret field; secret values may only fill users[].hashed_passwd, ssh_keys.*_private and write_files[].content"
                ),
            ));
        }
        Ok(())
    }
}

/// The path of the first string or key in `value` for which `hit` names a variable.
fn find_in(
    value: &serde_json::Value,
    path: String,
    hit: &dyn Fn(&str) -> Option<String>,
) -> Option<(String, String)> {
    match value {
        serde_json::Value::String(s) => hit(s).map(|n| (path, n)),
        serde_json::Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, v)| find_in(v, format!("{path}[{i}]"), hit)),
        serde_json::Value::Object(map) => map.iter().find_map(|(k, v)| {
            let p = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            hit(k)
                .map(|n| (p.clone(), n))
                .or_else(|| find_in(v, p, hit))
        }),
        _ => None,
    }
}

impl CloudConfigLayer {
    /// A layer whose cloud-config comes from a Jinja template (`source`, treated as
    /// YAML: values are escaped) rendered with `context`, then validated like a typed one.
    pub fn from_template(
        name: impl Into<String>,
        source: &str,
        context: &impl Serialize,
        allowed_extra: &[&str],
    ) -> Result<Self> {
        let name = name.into();
        let mut t = Templates::new();
        let tname = format!("{name}.yaml");
        t.add(tname.clone(), source)?;
        let config = t.render_cloud_config(&tname, context, allowed_extra)?;
        CloudConfigLayer::new(name, config)
    }

    /// [`CloudConfigLayer::from_template`] with secret variables (see [`SecretVars`]).
    pub fn from_template_with_secrets(
        name: impl Into<String>,
        source: &str,
        context: &impl Serialize,
        secrets: &SecretVars,
        allowed_extra: &[&str],
    ) -> Result<Self> {
        let name = name.into();
        let mut t = Templates::new();
        let tname = format!("{name}.yaml");
        t.add(tname.clone(), source)?;
        let config = t.render_cloud_config_with_secrets(&tname, context, secrets, allowed_extra)?;
        CloudConfigLayer::new(name, config).map_err(|e| scrub(e, secrets.iter()))
    }
}

/// Templates whose output is YAML (JSON is YAML): their values are placed by
/// [`yaml_fill`].
fn is_yaml(name: &str) -> bool {
    name.ends_with(".yaml") || name.ends_with(".yml") || name.ends_with(".json")
}

fn is_defined(ctx: &Value, path: &str) -> bool {
    let mut v = ctx.clone();
    for part in path.split('.') {
        match v.get_attr(part) {
            Ok(next) if !next.is_undefined() => v = next,
            _ => return false,
        }
    }
    true
}

fn template_error(name: &str, source: &str, e: &minijinja::Error, missing: &[String]) -> Error {
    let mut msg = String::new();
    if let Some(line) = e.line() {
        msg.push_str(&format!("line {line}"));
        if let Some(range) = e.range() {
            let start = range.start.min(source.len());
            let line_start = source[..start].rfind('\n').map_or(0, |i| i + 1);
            let col = source[line_start..start].chars().count() + 1;
            msg.push_str(&format!(", column {col}"));
        }
        msg.push_str(": ");
    }
    if e.kind() == JinjaKind::UndefinedError && !missing.is_empty() {
        msg.push_str(&format!("undefined variable {}", missing.join(", ")));
    } else if e.kind() == JinjaKind::OutOfFuel {
        msg.push_str(&format!(
            "the render did more than its bound of work ({TEMPLATE_FUEL} steps): a loop too large?"
        ));
    } else {
        msg.push_str(&e.kind().to_string());
        if let Some(d) = e.detail() {
            msg.push_str(": ");
            msg.push_str(d);
        }
    }
    Error::invalid_spec(format!("template {name}"), msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nested_loops_stop_at_the_work_bound() {
        let mut t = Templates::new();
        t.add(
            "loops.yaml",
            "#cloud-config\nruncmd:\n{% for a in range(10000) %}{% for b in range(10000) %}  - x\n{% endfor %}{% endfor %}",
        )
        .unwrap();
        let e = t.render("loops.yaml", &json!({})).unwrap_err();
        assert_eq!(e.field(), Some("template loops.yaml"), "{e}");
        assert!(e.to_string().contains("bound of work"), "{e}");
    }

    #[test]
    fn syntax_errors_name_line_and_column() {
        let mut t = Templates::new();
        let e = t
            .add(
                "a.yaml",
                "#cloud-config\nhostname: {{ name }}\nruncmd:\n  - {% if x %}\n",
            )
            .unwrap_err();
        assert_eq!(e.field(), Some("template a.yaml"));
        let msg = e.to_string();
        assert!(msg.contains("line 4"), "{msg}");
        assert!(msg.contains("column"), "{msg}");
        let e = t.add("b.yaml", "x: {{ a b }}\n").unwrap_err();
        assert!(e.to_string().contains("line 1, column"), "{e}");
    }

    #[test]
    fn undefined_variables_are_named_with_their_line() {
        let mut t = Templates::new();
        t.add(
            "a.yaml",
            "#cloud-config\nhostname: {{ host }}\nfqdn: {{ net.domain }}\n",
        )
        .unwrap();
        let e = t.render("a.yaml", &json!({"net": {}})).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("undefined variable host"), "{msg}");
        assert!(msg.contains("line 2"), "{msg}");
        let e = t
            .render("a.yaml", &json!({"host": "h", "net": {}}))
            .unwrap_err();
        assert!(e.to_string().contains("net.domain"), "{e}");
        assert!(e.to_string().contains("line 3"), "{e}");
    }

    #[test]
    fn helpers_quote_and_encode() {
        let mut t = Templates::new();
        t.add("s.sh", "echo {{ v | shell_quote }} {{ v | b64encode }} {{ v | b64encode | b64decode | shell_quote }}")
            .unwrap();
        let out = t.render("s.sh", &json!({"v": "it's $(x)"})).unwrap();
        // The real shell reads the quoted value back unchanged.
        let sh = std::process::Command::new("sh")
            .arg("-c")
            .arg(&out)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8(sh.stdout).unwrap(),
            "it's $(x) aXQncyAkKHgp it's $(x)\n",
            "{out}"
        );
    }

    #[test]
    fn yaml_values_are_escaped_and_refused_keys_are_named() {
        let mut t = Templates::new();
        t.add(
            "c.yaml",
            "#cloud-config\nfinal_message: {{ m }}\nruncmd:\n{% for c in cmds %}  - {{ c }}\n{% endfor %}",
        )
        .unwrap();
        let ctx =
            json!({"m": "a\nhostname: evil\n#cloud-config\u{85}", "cmds": ["echo 'x': y", "- z"]});
        let c = t.render_cloud_config("c.yaml", &ctx, &[]).unwrap();
        assert_eq!(
            c.final_message.as_deref(),
            Some("a\nhostname: evil\n#cloud-config\u{85}")
        );
        assert_eq!(c.hostname, None);
        assert_eq!(c.runcmd.len(), 2);
        // A template written for cloud-init's Jinja support works here too.
        t.add(
            "ci.yaml",
            "## template: jinja\n#cloud-config\nhostname: {{ h }}\n",
        )
        .unwrap();
        let c = t
            .render_cloud_config("ci.yaml", &json!({"h": "web-1"}), &[])
            .unwrap();
        assert_eq!(c.hostname.as_deref(), Some("web-1"));
        t.add("d.yaml", "#cloud-config\nsnap: {{ s }}\n").unwrap();
        let e = t
            .render_cloud_config("d.yaml", &json!({"s": 1}), &[])
            .unwrap_err();
        assert!(e.to_string().contains("snap"), "{e}");
    }
}
