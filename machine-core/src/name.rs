//! Machine names: RFC 1123 DNS labels chosen by the caller.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, shown};

/// The longest DNS label RFC 1123 allows.
pub const MAX_LABEL_LEN: usize = 63;

/// A machine's name, chosen by the caller and unique per provider and owner.
///
/// It is an RFC 1123 DNS label (1 to 63 characters of `a-z`, `0-9` and `-`, starting and
/// ending with a letter or digit), so it can become a hostname, a tag value, a vSphere
/// inventory name or part of a file path on any provider without escaping.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(into = "String")]
pub struct MachineName(String);

impl MachineName {
    /// Validates `name`; the error names the `name` field and says what is wrong.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        check_dns_label("name", &name)?;
        Ok(MachineName(name))
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Checks that `value` is an RFC 1123 DNS label; errors name `field`.
pub fn check_dns_label(field: &str, value: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::invalid_spec(
            field,
            format!("{} {why}", shown(value)),
        ))
    };
    if value.is_empty() {
        return bad("is empty; a DNS label (RFC 1123) is required");
    }
    if value.len() > MAX_LABEL_LEN {
        return bad(&format!(
            "is {} characters long; a DNS label has at most {MAX_LABEL_LEN}",
            value.len()
        ));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return bad(&format!(
            "contains {c:?}; only a-z, 0-9 and '-' are allowed in a DNS label"
        ));
    }
    if value.starts_with('-') || value.ends_with('-') {
        return bad("starts or ends with '-'; a DNS label must not");
    }
    Ok(())
}

/// Deserializing validates. The error carries only the message: the reader
/// ([`crate::from_yaml`], [`crate::from_json`]) adds the field path and the line, so
/// the kind and field are not said twice.
impl<'de> Deserialize<'de> for MachineName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        MachineName::new(name).map_err(|e| serde::de::Error::custom(e.message()))
    }
}

impl TryFrom<String> for MachineName {
    type Error = Error;
    fn try_from(value: String) -> Result<Self> {
        MachineName::new(value)
    }
}

impl std::str::FromStr for MachineName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        MachineName::new(s)
    }
}

impl From<MachineName> for String {
    fn from(value: MachineName) -> Self {
        value.0
    }
}

impl AsRef<str> for MachineName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MachineName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for MachineName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn accepts_dns_labels() {
        for ok in ["a", "web-1", "0db", &"x".repeat(63)] {
            assert_eq!(MachineName::new(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn refuses_what_is_not_a_dns_label_and_names_the_field() {
        for (bad, why) in [
            ("", "is empty"),
            ("Web", "contains 'W'"),
            ("web_1", "contains '_'"),
            ("-web", "starts or ends with '-'"),
            ("web-", "starts or ends with '-'"),
            ("a.b", "contains '.'"),
            (&"x".repeat(64), "64 characters long"),
        ] {
            let e = MachineName::new(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidSpec);
            assert_eq!(e.field(), Some("name"));
            assert!(e.message().contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn deserializing_validates() {
        let e = serde_json::from_str::<MachineName>("\"UPPER\"").unwrap_err();
        assert!(e.to_string().contains("only a-z"), "{e}");
        assert!(!e.to_string().contains("invalid spec"), "{e}");
    }

    #[test]
    fn a_long_bad_name_is_shown_cut_with_its_length() {
        let e = MachineName::new("X".repeat(10_000)).unwrap_err();
        let msg = e.to_string();
        assert!(msg.len() < 200, "{msg}");
        assert!(msg.contains("(10000 bytes)"), "{msg}");
    }
}
