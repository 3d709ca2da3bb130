//! URLs as settings: credentials belong in their own (secret) fields, never in a URL's
//! user information, which every log line, Debug print and error would show.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, shown};

/// A URL setting (an endpoint, a BMC address) whose Debug and Display never show user
/// information: `https://user:password@host/` shows as `https://***@host/`.
/// [`UrlSetting::check`] refuses user information outright.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UrlSetting(String);

impl UrlSetting {
    /// Wraps `url` as given; nothing is checked yet.
    pub fn new(url: impl Into<String>) -> Self {
        UrlSetting(url.into())
    }

    /// The URL as given. Do not log it: log the setting itself, which redacts.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Refuses a URL carrying user information (`user:password@`), naming `field` and
    /// showing the URL redacted: credentials have their own settings.
    pub fn check(&self, field: &str) -> Result<()> {
        if userinfo_end(&self.0).is_some() {
            return Err(Error::invalid_spec(
                field,
                format!(
                    "{} carries user information (user:password@); give credentials in their own settings, not in the URL",
                    shown(&redact_url(&self.0))
                ),
            ));
        }
        Ok(())
    }
}

impl From<String> for UrlSetting {
    fn from(url: String) -> Self {
        UrlSetting(url)
    }
}

impl From<&str> for UrlSetting {
    fn from(url: &str) -> Self {
        UrlSetting(url.to_owned())
    }
}

impl fmt::Debug for UrlSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", redact_url(&self.0))
    }
}

impl fmt::Display for UrlSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

/// Where the user information of `url` ends (the index of its `@`), if it has any: the
/// authority runs from after `scheme://` (or the start, for a URL without a scheme) to
/// the first `/`, `?` or `#`, and user information is what precedes its last `@`.
fn userinfo_end(url: &str) -> Option<usize> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let authority_len = url[start..]
        .find(['/', '?', '#'])
        .unwrap_or(url.len() - start);
    url[start..start + authority_len]
        .rfind('@')
        .map(|at| start + at)
}

/// `url` with any user information replaced by `***`, for messages and logs; the rest
/// as given, even when it is not a well-formed URL.
pub fn redact_url(url: &str) -> String {
    match userinfo_end(url) {
        None => url.to_owned(),
        Some(at) => {
            let start = url.find("://").map_or(0, |i| i + 3);
            format!("{}***{}", &url[..start], &url[at..])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_information_is_redacted_everywhere_and_refused() {
        let cases = [
            (
                "https://admin:s3cr3t@vc.example.org/sdk",
                "https://***@vc.example.org/sdk",
            ),
            ("https://admin:s3cr3t@vc:443", "https://***@vc:443"),
            ("https://a@b:c@host/x?y=z@w", "https://***@host/x?y=z@w"),
            ("admin:s3cr3t@10.0.0.1", "***@10.0.0.1"),
            ("http://[::1]:8000/redfish", "http://[::1]:8000/redfish"),
            (
                "https://host/path@not-userinfo",
                "https://host/path@not-userinfo",
            ),
            ("not a url at all: pw@", "***@"),
        ];
        for (url, redacted) in cases {
            let setting = UrlSetting::new(url);
            assert_eq!(redact_url(url), redacted, "{url}");
            assert_eq!(setting.to_string(), redacted);
            assert_eq!(format!("{setting:?}"), format!("{redacted:?}"));
            let carries = url.contains("s3cr3t") || url.contains("a@b") || url.contains("pw@");
            match setting.check("endpointUrl") {
                Ok(()) => assert!(!carries, "{url} was accepted"),
                Err(e) => {
                    assert!(carries, "{url}: {e}");
                    assert_eq!(e.field(), Some("endpointUrl"));
                    assert!(!e.to_string().contains("s3cr3t"), "{e}");
                }
            }
        }
    }
}
