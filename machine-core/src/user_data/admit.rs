//! The one admission check every provider runs on the user data `create` is given, and
//! the one format sniffer that recognises user data from its bytes.
//!
//! Providers used to keep their own copies of this check and they disagreed (one
//! accepted a format its capabilities excluded, one spelled the field differently). A
//! provider calls [`admit`] with its declared [`UserDataDelivery`] before any API call.

use std::io::Read;

use crate::capabilities::UserDataDelivery;
use crate::error::{Error, Result};
use crate::user_data::{ContentEncoding, UserData, UserDataFormat};

/// The field path every user-data error names, in the camelCase of the documents.
pub const USER_DATA_FIELD: &str = "userData";

/// How many leading bytes [`UserDataFormat::sniff`] reads: every marker it looks for
/// (`#cloud-config`, a MIME header, `<powershell>`) sits in the first lines.
const SNIFF_BYTES: usize = 512;

/// Checks `user_data` against what a provider declared it can deliver: that it takes
/// user data at all, the format is one it accepts, gzip only where gzip is accepted, the
/// size within its limit as its [`SizeBasis`](crate::SizeBasis) counts, and that the
/// bytes are what the format says (cloud-init silently ignores a "cloud-config" without
/// its `#cloud-config` line). Every refusal is an invalid-spec error on
/// [`USER_DATA_FIELD`]. `None` user data is always admitted.
pub fn admit(user_data: Option<&UserData>, delivery: Option<&UserDataDelivery>) -> Result<()> {
    let Some(ud) = user_data else {
        return Ok(());
    };
    let Some(delivery) = delivery else {
        return Err(refuse(
            "this provider takes no user data; apply software with decoupled layers",
        ));
    };
    if !delivery.formats.contains(&ud.format) {
        return Err(refuse(format!(
            "format {:?} is not accepted by this provider (accepted: {:?})",
            ud.format, delivery.formats
        )));
    }
    if ud.encoding == ContentEncoding::Gzip && !delivery.gzip {
        return Err(refuse(
            "gzip-compressed user data is not accepted by this provider",
        ));
    }
    let counted = delivery.size_basis.counted(ud.bytes.len());
    if counted > delivery.max_bytes {
        return Err(refuse(format!(
            "{counted} bytes{} exceed the provider's limit of {} bytes ({:?} basis)",
            if ud.encoding == ContentEncoding::Gzip {
                " of gzip"
            } else {
                ""
            },
            delivery.max_bytes,
            delivery.size_basis
        )));
    }
    check_content(ud)
}

/// Refuses user data whose leading bytes contradict its declared format.
fn check_content(ud: &UserData) -> Result<()> {
    let head = head(ud)?;
    let expected = match ud.format {
        // Formats with no marker of their own: anything goes.
        UserDataFormat::Raw | UserDataFormat::PowerShell | UserDataFormat::Ignition => {
            return Ok(());
        }
        format => format,
    };
    let found = UserDataFormat::sniff_plain(&head);
    if found == expected {
        return Ok(());
    }
    Err(refuse(format!(
        "declared {expected:?} but the content {}; cloud-init would not run it as {expected:?}",
        match marker(expected) {
            Some(m) => format!("does not start with {m:?}"),
            None => "is not a MIME multipart document".to_owned(),
        }
    )))
}

/// The first line a format's content starts with, where it has one.
fn marker(format: UserDataFormat) -> Option<&'static str> {
    Some(match format {
        UserDataFormat::CloudConfig => "#cloud-config",
        UserDataFormat::CloudBoothook => "#cloud-boothook",
        UserDataFormat::Jinja2 => "## template: jinja",
        UserDataFormat::ShellScript => "#!",
        _ => return None,
    })
}

/// The first [`SNIFF_BYTES`] of the content, decompressed.
fn head(ud: &UserData) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(SNIFF_BYTES);
    let read = match ud.encoding {
        ContentEncoding::Identity => {
            out.extend_from_slice(&ud.bytes[..ud.bytes.len().min(SNIFF_BYTES)]);
            Ok(0)
        }
        ContentEncoding::Gzip => flate2::read::GzDecoder::new(&ud.bytes[..])
            .take(SNIFF_BYTES as u64)
            .read_to_end(&mut out),
    };
    read.map_err(|e| refuse(format!("declared gzip but is not valid gzip: {e}")))?;
    Ok(out)
}

fn refuse(reason: impl Into<String>) -> Error {
    Error::invalid_spec(USER_DATA_FIELD, reason)
}

impl UserDataFormat {
    /// The format of uncompressed user-data bytes, from their first lines as cloud-init
    /// recognises them (`#cloud-config`, `#!`, a `Content-Type: multipart` header…);
    /// [`UserDataFormat::Raw`] when nothing matches. Providers that read user data back
    /// (EC2 keeps neither format nor compression) use [`UserData::sniff`].
    pub fn sniff_plain(bytes: &[u8]) -> UserDataFormat {
        let head = String::from_utf8_lossy(&bytes[..bytes.len().min(SNIFF_BYTES)]);
        let lower = head.to_ascii_lowercase();
        let trimmed = lower.trim_start();
        if head.starts_with("#cloud-config") {
            UserDataFormat::CloudConfig
        } else if head.starts_with("#cloud-boothook") {
            UserDataFormat::CloudBoothook
        } else if head.starts_with("## template: jinja") {
            UserDataFormat::Jinja2
        } else if head.starts_with("#!") {
            UserDataFormat::ShellScript
        } else if lower.contains("content-type: multipart/") {
            UserDataFormat::Mime
        } else if trimmed.starts_with("<powershell>") || trimmed.starts_with("<script>") {
            UserDataFormat::PowerShell
        } else if trimmed.starts_with('{') && head.contains("\"ignition\"") {
            UserDataFormat::Ignition
        } else {
            UserDataFormat::Raw
        }
    }
}

impl UserData {
    /// User data read back from bytes alone, with compression and format recognised
    /// from them (gzip's magic number, then [`UserDataFormat::sniff_plain`]).
    pub fn sniff(bytes: Vec<u8>) -> UserData {
        let encoding = if bytes.starts_with(&[0x1f, 0x8b]) {
            ContentEncoding::Gzip
        } else {
            ContentEncoding::Identity
        };
        let mut ud = UserData {
            format: UserDataFormat::Raw,
            encoding,
            bytes,
        };
        ud.format = UserDataFormat::sniff_plain(&head(&ud).unwrap_or_default());
        ud
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SizeBasis;

    fn delivery(formats: &[UserDataFormat]) -> UserDataDelivery {
        UserDataDelivery {
            max_bytes: 64,
            size_basis: SizeBasis::Raw,
            gzip: false,
            formats: formats.to_vec(),
        }
    }

    fn refused(ud: &UserData, d: Option<&UserDataDelivery>) -> String {
        let e = admit(Some(ud), d).expect_err("admitted");
        assert_eq!(e.field(), Some(USER_DATA_FIELD), "{e}");
        e.to_string()
    }

    #[test]
    fn admits_what_the_delivery_declares() {
        let d = delivery(&[UserDataFormat::CloudConfig]);
        admit(None, None).unwrap();
        admit(
            Some(&UserData::new(
                UserDataFormat::CloudConfig,
                "#cloud-config\n{}\n",
            )),
            Some(&d),
        )
        .unwrap();
    }

    #[test]
    fn refuses_each_broken_promise_on_the_user_data_field() {
        let cc = UserData::new(UserDataFormat::CloudConfig, "#cloud-config\n{}\n");
        let d = delivery(&[UserDataFormat::CloudConfig]);
        assert!(refused(&cc, None).contains("takes no user data"));
        let ign = UserData::new(UserDataFormat::Ignition, "{\"ignition\":{}}");
        assert!(refused(&ign, Some(&d)).contains("Ignition"));
        let big = UserData::new(
            UserDataFormat::CloudConfig,
            format!("#cloud-config\n{}", "#".repeat(80)),
        );
        assert!(refused(&big, Some(&d)).contains("exceed the provider's limit of 64"));
        let gz = UserData {
            encoding: ContentEncoding::Gzip,
            ..cc.clone()
        };
        assert!(refused(&gz, Some(&d)).contains("gzip"));
        let unmarked = UserData::new(UserDataFormat::CloudConfig, "users: []\n");
        let msg = refused(&unmarked, Some(&d));
        assert!(
            msg.contains("does not start with \"#cloud-config\""),
            "{msg}"
        );
    }

    #[test]
    fn sniffs_every_marked_format_and_gzip() {
        for (text, format) in [
            ("#cloud-config\n{}\n", UserDataFormat::CloudConfig),
            ("#!/bin/sh\necho\n", UserDataFormat::ShellScript),
            (
                "#cloud-boothook\n#!/bin/sh\n",
                UserDataFormat::CloudBoothook,
            ),
            (
                "## template: jinja\n#cloud-config\n",
                UserDataFormat::Jinja2,
            ),
            (
                "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=x\n",
                UserDataFormat::Mime,
            ),
            (
                "<powershell>\nWrite-Host hi\n</powershell>",
                UserDataFormat::PowerShell,
            ),
            (
                "{\"ignition\": {\"version\": \"3.4.0\"}}",
                UserDataFormat::Ignition,
            ),
            ("plain bytes", UserDataFormat::Raw),
        ] {
            assert_eq!(
                UserData::sniff(text.as_bytes().to_vec()).format,
                format,
                "{text}"
            );
        }
        let gz = crate::user_data::gzip(b"#cloud-config\n{}\n", 6);
        let ud = UserData::sniff(gz);
        assert_eq!(ud.encoding, ContentEncoding::Gzip);
        assert_eq!(ud.format, UserDataFormat::CloudConfig);
    }
}
