//! Secret values inside a cloud-config: redacted in Debug, never Display, written out
//! only when the document is rendered.

use std::fmt;

use machine_core::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A secret string in a cloud-config (a private host key, a token in a file).
///
/// Debug shows `Secret([REDACTED])`; there is no Display. Serializing it (which is what
/// rendering user data does) writes the value: user data must carry it to the machine.
/// Reports built by this crate ([`crate::SizeReport`]) never include it.
#[derive(Clone)]
pub struct Secret(SecretString);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(SecretString::from(value.into()))
    }

    /// The value, for rendering. Never log it.
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }
}

impl From<SecretString> for Secret {
    fn from(value: SecretString) -> Self {
        Secret(value)
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.expose() == other.expose()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([REDACTED])")
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.expose())
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Secret::new)
    }
}

/// What Debug shows of text that may hold secrets: its size and a short SHA-256, enough
/// to tell two documents apart, nothing of the content.
pub(crate) fn summary(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(bytes);
    let short: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{} B, sha256 {short}", bytes.len())
}

/// `error` with every occurrence of a secret value in its message and field replaced by
/// `[secret NAME]`: for errors from code that may quote what it read (a template
/// engine's message, a YAML reader's type error). Kind and field are kept.
pub(crate) fn scrub<'a>(
    error: machine_core::Error,
    secrets: impl IntoIterator<Item = (&'a str, &'a Secret)> + Clone,
) -> machine_core::Error {
    let clean = |text: &str| {
        let mut text = text.to_owned();
        for (name, value) in secrets.clone() {
            if !value.expose().is_empty() {
                text = text.replace(value.expose(), &format!("[secret {name}]"));
            }
        }
        text
    };
    let mut out = machine_core::Error::new(error.kind(), clean(error.message()));
    if let Some(field) = error.field() {
        out = out.with_field(clean(field));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_and_serialize_writes() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "Secret([REDACTED])");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"hunter2\"");
    }
}
