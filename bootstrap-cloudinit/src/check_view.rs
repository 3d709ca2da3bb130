//! Check views of Jinja parts: what a template renders to with stand-in instance data,
//! so that the composer can check it against the other layers before cloud-init renders
//! the real thing on the machine.

use machine_core::{Error, Result};
use minijinja::{Environment, UndefinedBehavior};

/// The header line cloud-init strips before rendering a Jinja part.
const JINJA_HEADER: &str = "## template: jinja";

/// Renders `template` (a `## template: jinja` part) with stand-ins for cloud-init's
/// instance data: `v1.local_hostname` (and its aliases) is `machine`, the machine's
/// name, as it is on every provider of this project; what only the machine knows
/// (instance id, region, addresses) is a placeholder; anything else is undefined and
/// renders empty. A template that renders to a cloud-config gives that document;
/// anything else (a script) gives an empty cloud-config, since it sets no key.
pub(crate) fn render_view(template: &str, machine: &str) -> Result<Vec<u8>> {
    let body = template
        .strip_prefix(JINJA_HEADER)
        .map_or(template, |rest| {
            rest.split_once('\n').map_or("", |(_, b)| b)
        });
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Chainable);
    // The view keeps the template's final newline, as the other parts do.
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .keep_trailing_newline(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    // The same work bound as user templates: a stand-in render must not run for ever.
    env.set_fuel(Some(crate::template::TEMPLATE_FUEL));
    let v1 = serde_json::json!({
        "local_hostname": machine,
        "instance_id": "i-check-view",
        "cloud_name": "check-view",
        "cloud_id": "check-view",
        "platform": "check-view",
        "region": "check-view",
        "availability_zone": "check-view",
        "distro": "debian",
        "machine": "x86_64",
        "public_ssh_keys": [],
    });
    let mut ctx = serde_json::Map::new();
    if let serde_json::Value::Object(aliases) = &v1 {
        // cloud-init also offers every v1 key at the top level.
        ctx.extend(aliases.clone());
    }
    ctx.insert("v1".into(), v1);
    ctx.insert("ds".into(), serde_json::json!({}));
    let rendered = env
        .render_str(body, minijinja::Value::from(minijinja::value::Serde(serde_json::Value::Object(ctx))))
        .map_err(|e| {
            Error::invalid_spec(
                "template",
                format!(
                    "cannot be rendered with stand-in instance data for the composer's checks: {}; use with_jinja2_unchecked for a template that sets nothing another layer sets",
                    e.kind()
                ),
            )
        })?;
    if rendered.trim_start().starts_with("#cloud-config") {
        Ok(rendered.into_bytes())
    } else {
        Ok(b"#cloud-config\n".to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_name_template_renders_the_machines_name() {
        let view = render_view(
            "## template: jinja\n#cloud-config\nhostname: {{ v1.local_hostname }}\nfqdn: {{ local_hostname }}.{{ ds.meta_data.domain }}\n",
            "web-1",
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(view).unwrap(),
            "#cloud-config\nhostname: web-1\nfqdn: web-1.\n"
        );
    }

    #[test]
    fn a_script_template_sets_no_key_and_a_broken_one_is_refused() {
        let view =
            render_view("## template: jinja\n#!/bin/sh\necho {{ v1.region }}\n", "a").unwrap();
        assert_eq!(view, b"#cloud-config\n");
        let e = render_view("## template: jinja\n{% if %}\n", "a").unwrap_err();
        assert!(e.to_string().contains("stand-in instance data"), "{e}");
    }
}
