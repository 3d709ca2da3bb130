//! A [`CloudConfig`] to a `#cloud-config` document and back.
//!
//! serde-saphyr writes the YAML (serde_yaml is archived): it quotes every string a YAML
//! 1.1 reader such as cloud-init's PyYAML would take for something else (`"0644"`,
//! `"yes"`, `"on"`, `"null"`, `"1e3"`, `"#cloud-config"`, `"---"`, tags, anchors) and
//! writes multi-line strings as block literals, so no value can change the document's
//! structure. The tests prove it by parsing the output back with PyYAML.

use machine_core::{Error, Result};

use crate::model::CloudConfig;
use crate::validate::validate_with;

/// The first line of every cloud-config document.
pub const HEADER: &str = "#cloud-config\n";

/// Validates `config` and renders it as a `#cloud-config` document.
pub fn render(config: &CloudConfig) -> Result<String> {
    validate_with(config, &[])?;
    render_unchecked(config)
}

/// Renders without validating (the caller has already validated).
pub(crate) fn render_unchecked(config: &CloudConfig) -> Result<String> {
    let mut out = String::with_capacity(4096);
    out.push_str(HEADER);
    // Written straight after the header: no second buffer grown and copied over.
    // An empty document is written `{}`: cloud-init requires a mapping.
    serde_saphyr::to_fmt_writer(&mut out, config)
        .map_err(|e| Error::invalid_spec("cloud-config", format!("cannot render YAML: {e}")))?;
    Ok(out)
}

/// Reads a `#cloud-config` document into the typed model, refusing any top-level key the
/// model does not cover unless it is in `allowed_extra` (those land in
/// [`CloudConfig::extra`]). Errors name the field path, line and column and never quote
/// the document (a line next to a mistake may hold a password hash or a private key);
/// a value of the wrong form in a secret field is not shown either. Encoded
/// `write_files` contents are decoded within [`crate::MAX_DECODED_CONTENT`] for the
/// whole document. The document is then validated like a rendered one.
pub fn parse(yaml: &str, allowed_extra: &[&str]) -> Result<CloudConfig> {
    let first = yaml.lines().next().unwrap_or_default();
    if first.trim_end() != HEADER.trim_end() {
        // The line itself is not quoted: a wrong document may begin with anything.
        return Err(Error::invalid_spec(
            "cloud-config",
            "line 1: a cloud-config must begin with \"#cloud-config\"",
        ));
    }
    let config: CloudConfig = if yaml[first.len()..].trim().is_empty() {
        CloudConfig::default()
    } else {
        crate::model::with_decode_budget(|| {
            machine_core::from_yaml_redacting(yaml, is_secret_field)
        })?
    };
    for key in config.extra.keys() {
        if !allowed_extra.contains(&key.as_str()) {
            let line = yaml
                .lines()
                .position(|l| {
                    l.strip_prefix(key.as_str())
                        .is_some_and(|rest| rest.trim_start().starts_with(':'))
                })
                .map(|n| format!("line {}: ", n + 1))
                .unwrap_or_default();
            return Err(Error::invalid_spec(
                key.clone(),
                format!(
                    "{line}unknown top-level key {key:?}; the model covers {}; pass it as an allowed extra key to keep it",
                    crate::model::MODELED_KEYS.join(", ")
                ),
            ));
        }
    }
    validate_with(&config, &[])?;
    Ok(config)
}

/// Field paths whose values are secret: password hashes, private host keys and file
/// contents (which may be a token or a key; the model cannot tell which are).
pub(crate) fn is_secret_field(path: &str) -> bool {
    path.ends_with("hashed_passwd")
        || path.ends_with("_private")
        || (path.starts_with("write_files") && path.ends_with(".content"))
}
