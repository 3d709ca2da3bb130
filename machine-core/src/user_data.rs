//! User data: the bytes handed to a machine at creation, the parts they are made of, and
//! how parts become one payload that fits a provider's budget.
//!
//! Several parts are joined into a MIME multipart document the way
//! `cloud-init devel make-mime` does. The output is deterministic: the boundary is derived
//! from the content and no date or message id is written, so the same parts always give
//! the same bytes (and the same hash, on every replica of a controller).
//!
//! Two cloud-init behaviours shape a multipart, and [`assemble`] handles both for every
//! part whatever layer made it:
//! - cloud-init merges the cloud-config parts with `dict(replace)` unless a part says
//!   otherwise, so a later part's `users`, `write_files` or `runcmd` would silently
//!   replace an earlier one's. Each cloud-config (and Jinja) part without a `Merge-Type`
//!   header gets [`MERGE_TYPE`], which appends lists and merges maps;
//!   [`check_conflicts`] refuses what that merge would still resolve silently.
//! - cloud-init's `scripts-user` runs the script parts sorted by file name, so each
//!   part's file name gets a zero-padded index prefix: scripts run in the order the parts
//!   were given, and two parts can no longer overwrite each other by sharing a name.

mod admit;
mod conflicts;
mod runcmd;
mod waiter;

pub use admit::{USER_DATA_FIELD, admit};
pub(crate) use conflicts::carried_host_keys;
pub use conflicts::{STRICT_COMMANDS, check_conflicts, compose};
pub use runcmd::{RUNCMD_LAYER_PATH, runcmd_failure};
pub use waiter::{CompletionWaiter, VERDICT_RESULT_PATH, WAITER_MARKER};

use std::fmt;
use std::io::Write;

use mail_builder::headers::content_type::ContentType;
use mail_builder::headers::raw::Raw;
use mail_builder::mime::{BodyPart, MimePart};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::capabilities::UserDataDelivery;
use crate::error::{Error, Result};

/// The format of user data or of one part of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UserDataFormat {
    /// A `#cloud-config` YAML document (`text/cloud-config`).
    CloudConfig,
    /// A script with a `#!` line (`text/x-shellscript`).
    ShellScript,
    /// A cloud-init boothook, run early on every boot (`text/cloud-boothook`).
    CloudBoothook,
    /// A Jinja template cloud-init renders with instance data (`text/jinja2`).
    Jinja2,
    /// A MIME multipart document of several parts (`multipart/mixed`).
    Mime,
    /// An Ignition v3 JSON config (Fedora CoreOS, Flatcar).
    Ignition,
    /// A `<powershell>` block for Windows images.
    PowerShell,
    /// Bytes the image interprets by itself.
    Raw,
}

impl UserDataFormat {
    /// The formats cloud-init itself runs, what a provider whose images boot with
    /// cloud-init declares.
    pub const CLOUD_INIT: [UserDataFormat; 5] = [
        UserDataFormat::CloudConfig,
        UserDataFormat::ShellScript,
        UserDataFormat::CloudBoothook,
        UserDataFormat::Jinja2,
        UserDataFormat::Mime,
    ];

    /// Every format.
    pub const ALL: [UserDataFormat; 8] = [
        UserDataFormat::CloudConfig,
        UserDataFormat::ShellScript,
        UserDataFormat::CloudBoothook,
        UserDataFormat::Jinja2,
        UserDataFormat::Mime,
        UserDataFormat::Ignition,
        UserDataFormat::PowerShell,
        UserDataFormat::Raw,
    ];

    /// The MIME content type cloud-init gives this format inside a multipart, if it has one.
    pub fn mime_type(self) -> Option<&'static str> {
        Some(match self {
            UserDataFormat::CloudConfig => "text/cloud-config",
            UserDataFormat::ShellScript => "text/x-shellscript",
            UserDataFormat::CloudBoothook => "text/cloud-boothook",
            UserDataFormat::Jinja2 => "text/jinja2",
            UserDataFormat::Mime => "multipart/mixed",
            UserDataFormat::Ignition | UserDataFormat::PowerShell | UserDataFormat::Raw => {
                return None;
            }
        })
    }
}

/// How user-data bytes are compressed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContentEncoding {
    /// Not compressed.
    #[default]
    Identity,
    /// gzip-compressed; cloud-init unpacks it.
    Gzip,
}

/// The user data of one machine, ready to hand to a provider.
///
/// Its bytes may hold secrets (tokens, keys), so Debug shows only format, encoding,
/// size and a short hash.
#[derive(Clone, PartialEq, Eq)]
pub struct UserData {
    /// The format of the (uncompressed) content.
    pub format: UserDataFormat,
    /// The compression applied to [`UserData::bytes`].
    pub encoding: ContentEncoding,
    /// The bytes, compressed as `encoding` says; providers apply any transfer
    /// encoding (base64) themselves.
    pub bytes: Vec<u8>,
}

impl UserData {
    /// Uncompressed user data.
    pub fn new(format: UserDataFormat, bytes: impl Into<Vec<u8>>) -> Self {
        UserData {
            format,
            encoding: ContentEncoding::Identity,
            bytes: bytes.into(),
        }
    }

    /// The bytes after undoing the content encoding.
    pub fn decoded(&self) -> Result<Vec<u8>> {
        match self.encoding {
            ContentEncoding::Identity => Ok(self.bytes.clone()),
            ContentEncoding::Gzip => {
                let mut out = Vec::new();
                std::io::Read::read_to_end(
                    &mut flate2::read::GzDecoder::new(&self.bytes[..]),
                    &mut out,
                )
                .map_err(|e| Error::permanent("user data is not valid gzip").with_source(e))?;
                Ok(out)
            }
        }
    }

    /// A short hex hash of the bytes, safe to log.
    pub fn short_hash(&self) -> String {
        short_hash(&self.bytes)
    }
}

impl fmt::Debug for UserData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserData")
            .field("format", &self.format)
            .field("encoding", &self.encoding)
            .field("len", &self.bytes.len())
            .field("sha256", &self.short_hash())
            .finish()
    }
}

/// One part of user data, contributed by one software layer.
///
/// `#[non_exhaustive]`: build it with [`UserDataPart::new`] and the `with_*` methods.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UserDataPart {
    /// The part's format.
    pub format: UserDataFormat,
    /// A file name for the part (cloud-init uses it for scripts it writes to disk).
    pub filename: String,
    /// The content, uncompressed.
    pub content: Vec<u8>,
    /// Extra MIME headers, such as cloud-init's `Merge-Type`.
    pub headers: Vec<(String, String)>,
    /// For a template part (Jinja), the cloud-config it renders to with stand-in values,
    /// which the composer's checks read in its place (see [`compose`]); never sent.
    pub check_view: Option<Vec<u8>>,
}

impl UserDataPart {
    /// A part with no extra headers.
    pub fn new(
        format: UserDataFormat,
        filename: impl Into<String>,
        content: impl Into<Vec<u8>>,
    ) -> Self {
        UserDataPart {
            format,
            filename: filename.into(),
            content: content.into(),
            headers: Vec::new(),
            check_view: None,
        }
    }

    /// Sets the check view of a template part: the cloud-config it renders to with
    /// stand-in values (the machine's name as its host name, placeholders for what only
    /// the machine knows). The composer checks it against the other layers in place of
    /// the template; an empty document (`#cloud-config`) says the template sets nothing
    /// another layer sets. Without one, the composer refuses a Jinja part.
    pub fn with_check_view(mut self, view: impl Into<Vec<u8>>) -> Self {
        self.check_view = Some(view.into());
        self
    }

    /// Adds a MIME header to the part. [`assemble`] refuses (with [`UserDataPart::check_headers`])
    /// a name that is not an RFC 5322 field name and a value with a line break.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Checks that the part's extra headers and file name cannot add a header of their
    /// own: names are RFC 5322 field names (1 to 76 printable ASCII characters, no
    /// colon), are not a header the multipart writes itself (`Content-Type`,
    /// `Content-Disposition`, `Content-Transfer-Encoding`, `MIME-Version`), and values
    /// and the file name hold no control character (a CR or LF would start a new header).
    /// Errors name `filename` or `headers[i]`.
    pub fn check_headers(&self) -> Result<()> {
        if let Some(c) = self.filename.chars().find(|c| c.is_control()) {
            return Err(Error::invalid_spec(
                "filename",
                format!(
                    "{} contains the control character {c:?}",
                    crate::error::shown(&self.filename)
                ),
            ));
        }
        for (i, (name, value)) in self.headers.iter().enumerate() {
            let field = format!("headers[{i}]");
            let name_ok = !name.is_empty()
                && name.len() <= MAX_HEADER_NAME_LEN
                && name.bytes().all(|b| (33..=126).contains(&b) && b != b':');
            if !name_ok {
                return Err(Error::invalid_spec(
                    field,
                    format!(
                        "header name {} is not an RFC 5322 field name (1-{MAX_HEADER_NAME_LEN} printable ASCII characters, no ':')",
                        crate::error::shown(name)
                    ),
                ));
            }
            if RESERVED_HEADERS
                .iter()
                .any(|reserved| reserved.eq_ignore_ascii_case(name))
            {
                return Err(Error::invalid_spec(
                    field,
                    format!("header {name} is written by the multipart itself"),
                ));
            }
            if let Some(c) = value.chars().find(|c| c.is_control() && *c != '\t') {
                return Err(Error::invalid_spec(
                    field,
                    format!("the value of header {name} contains the control character {c:?}"),
                ));
            }
        }
        Ok(())
    }
}

/// The longest header name [`UserDataPart::check_headers`] accepts: a name and its colon
/// fit a 78-character line (RFC 5322 section 2.1.1).
pub const MAX_HEADER_NAME_LEN: usize = 76;

/// Headers the multipart writes for each part; a part cannot set them again.
const RESERVED_HEADERS: [&str; 4] = [
    "Content-Type",
    "Content-Disposition",
    "Content-Transfer-Encoding",
    "MIME-Version",
];

impl fmt::Debug for UserDataPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserDataPart")
            .field("format", &self.format)
            .field("filename", &self.filename)
            .field("len", &self.content.len())
            .field("sha256", &short_hash(&self.content))
            .finish()
    }
}

/// The `Merge-Type` header [`assemble`] puts on every cloud-config and Jinja part of a
/// multipart that has none: lists appended, maps merged recursively (lists inside them
/// appended too), a scalar kept from the first part that set it (cloud-init 22.4's
/// `m_dict`, `m_list`, `m_str`). cloud-init takes a part's mergers from its own header,
/// so it must be on every part after the first; it is on all of them.
pub const MERGE_TYPE: &str = "list(append)+dict(no_replace,recurse_list)+str()";

/// Joins parts into one user data: a single plain part is passed through as it is,
/// unless it is a script or boothook; several (or one with extra headers, or a lone
/// script) become a MIME multipart like `cloud-init devel make-mime` builds, with
/// [`MERGE_TYPE`] on each cloud-config and Jinja part that has no `Merge-Type` of its
/// own, and each file name prefixed with the part's zero-padded
/// index (`00-base.sh`, `01-app.sh`, ...) so that cloud-init runs scripts in the given
/// order. A part whose format has no MIME type (Ignition, PowerShell, raw) cannot share
/// user data with others: that is an invalid-spec error naming the part.
///
/// Why a lone script goes as a multipart of one: cloud-init names a script that is the
/// whole user data `part-001`, so when it fails, its report (and the composer's
/// verdict) could not say which layer's script it was; in a multipart it keeps its
/// file name.
pub fn assemble(parts: &[UserDataPart]) -> Result<Option<UserData>> {
    for (i, part) in parts.iter().enumerate() {
        part.check_headers()
            .map_err(|e| e.within(&format!("userData.parts[{i}]")))?;
    }
    match parts {
        [] => Ok(None),
        [one]
            if one.headers.is_empty()
                && !matches!(
                    one.format,
                    UserDataFormat::ShellScript | UserDataFormat::CloudBoothook
                ) =>
        {
            Ok(Some(UserData::new(one.format, one.content.clone())))
        }
        many => Ok(Some(UserData::new(UserDataFormat::Mime, multipart(many)?))),
    }
}

fn multipart(parts: &[UserDataPart]) -> Result<Vec<u8>> {
    let mut mime_parts = Vec::with_capacity(parts.len());
    let mut hasher = Sha256::new();
    // Wide enough for the last index, and at least two digits.
    let width = (parts.len().saturating_sub(1)).to_string().len().max(2);
    for (i, part) in parts.iter().enumerate() {
        let Some(mime_type) = part.format.mime_type() else {
            return Err(Error::invalid_spec(
                format!("userData.parts[{i}]"),
                format!(
                    "part {:?} is {:?}, which cannot be combined with other parts in a MIME multipart",
                    part.filename, part.format
                ),
            ));
        };
        hasher.update(&part.content);
        let body: BodyPart<'_> = match std::str::from_utf8(&part.content) {
            Ok(text) => BodyPart::Text(text.into()),
            Err(_) => BodyPart::Binary(part.content.as_slice().into()),
        };
        let mut mime = MimePart::new(
            ContentType::new(mime_type).attribute("charset", "utf-8"),
            body,
        )
        .attachment(format!("{i:0width$}-{}", part.filename));
        for (name, value) in &part.headers {
            mime = mime.header(name.as_str(), Raw::new(value.as_str()));
        }
        let merges = matches!(
            part.format,
            UserDataFormat::CloudConfig | UserDataFormat::Jinja2
        );
        if merges
            && !part
                .headers
                .iter()
                .any(|(name, _)| name.eq_ignore_ascii_case("Merge-Type"))
        {
            mime = mime.header("Merge-Type", Raw::new(MERGE_TYPE));
        }
        mime_parts.push(mime);
    }
    // A boundary derived from the content keeps the output deterministic; a content hash
    // cannot occur in the content it hashes except by a collision.
    let boundary = format!("==boundary-{}", hex(&hasher.finalize()[..12]));
    let root = MimePart::new(
        ContentType::new("multipart/mixed").attribute("boundary", boundary),
        BodyPart::Multipart(mime_parts),
    )
    .header("MIME-Version", Raw::new("1.0"));
    let mut out = Vec::new();
    root.write_part(&mut out);
    Ok(out)
}

/// Makes `user_data` fit `delivery`: checks the format is accepted, gzips it when it is
/// over the limit and gzip is accepted, and otherwise refuses it with an invalid-spec
/// error on `userData` that names the sizes and the largest parts. Nothing is sent
/// anywhere: this runs before any API call.
///
/// A lone script that [`assemble`] wrapped in a multipart of one goes as the bare script
/// where the provider does not take MIME but takes the script's own format: it then
/// runs as cloud-init's `part-001` (its verdict cannot name the layer), which is better
/// than a provider declaring only shell scripts taking no coupled layer at all.
pub fn fit(
    user_data: UserData,
    parts: &[UserDataPart],
    delivery: &UserDataDelivery,
) -> Result<UserData> {
    let user_data = match parts {
        [lone]
            if user_data.format == UserDataFormat::Mime
                && !delivery.formats.contains(&UserDataFormat::Mime)
                && delivery.formats.contains(&lone.format)
                && lone.headers.is_empty() =>
        {
            UserData::new(lone.format, lone.content.clone())
        }
        _ => user_data,
    };
    if !delivery.formats.contains(&user_data.format) {
        return Err(Error::invalid_spec(
            USER_DATA_FIELD,
            format!(
                "format {:?} is not accepted by this provider (accepted: {:?})",
                user_data.format, delivery.formats
            ),
        ));
    }
    let limit = delivery.max_bytes;
    let counted = delivery.size_basis.counted(user_data.bytes.len());
    if counted <= limit {
        return Ok(user_data);
    }
    let mut gzipped_len = None;
    if delivery.gzip && user_data.encoding == ContentEncoding::Identity {
        // A fast level first (within about 1.5 % of the best size at a third of the
        // cost); the best level only when the fast one does not fit.
        for level in [GZIP_FAST_LEVEL, GZIP_BEST_LEVEL] {
            let gz = gzip(&user_data.bytes, level);
            let gz_counted = delivery.size_basis.counted(gz.len());
            if gz_counted <= limit {
                return Ok(UserData {
                    format: user_data.format,
                    encoding: ContentEncoding::Gzip,
                    bytes: gz,
                });
            }
            gzipped_len = Some(gz_counted);
        }
    }
    let mut largest: Vec<_> = parts
        .iter()
        .map(|p| (p.content.len(), p.filename.as_str()))
        .collect();
    largest.sort_unstable_by(|a, b| b.cmp(a));
    let largest: Vec<String> = largest
        .iter()
        .take(3)
        .map(|(len, name)| format!("{name} ({len} B)"))
        .collect();
    Err(Error::invalid_spec(
        USER_DATA_FIELD,
        format!(
            "{counted} bytes{} exceed the provider's limit of {limit} bytes ({:?} basis); largest parts: {}",
            gzipped_len
                .map(|g| format!(" ({g} after gzip)"))
                .unwrap_or_default(),
            delivery.size_basis,
            largest.join(", ")
        ),
    ))
}

/// The gzip level [`fit`] tries first: on a 29 KiB three-layer cloud-config it came
/// within 1.5 % of `gzip -9`'s size at about a third of the time (measured for
/// bootstrap-cloudinit's benchmark).
pub const GZIP_FAST_LEVEL: u32 = 2;

/// The best gzip level, as `gzip -9`; [`fit`] falls back to it when the fast level
/// does not fit.
pub const GZIP_BEST_LEVEL: u32 = 9;

/// gzip-compresses `bytes` at `level` (0 to 9); cloud-init recognizes gzip user data
/// by its magic bytes.
pub fn gzip(bytes: &[u8], level: u32) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 3),
        flate2::Compression::new(level.min(9)),
    );
    // Writing into a Vec cannot fail.
    enc.write_all(bytes).expect("write to Vec");
    enc.finish().expect("write to Vec")
}

pub(crate) fn short_hash(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes)[..6])
}

/// `bytes` in lower-case hex. Step hashes go through here for every step of every layer:
/// one `format!` a byte made it a tenth of the time of planning a recipe layer.
pub(crate) fn hex(bytes: &[u8]) -> String {
    ::hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use crate::capabilities::SizeBasis;

    fn delivery(max_bytes: usize, gzip: bool) -> UserDataDelivery {
        UserDataDelivery {
            max_bytes,
            size_basis: SizeBasis::Raw,
            gzip,
            formats: vec![
                UserDataFormat::CloudConfig,
                UserDataFormat::ShellScript,
                UserDataFormat::Mime,
            ],
        }
    }

    #[test]
    fn one_plain_part_passes_through() {
        let part = UserDataPart::new(
            UserDataFormat::CloudConfig,
            "a.yaml",
            "#cloud-config\nhostname: a\n",
        );
        let ud = assemble(&[part]).unwrap().unwrap();
        assert_eq!(ud.format, UserDataFormat::CloudConfig);
        assert_eq!(ud.bytes, b"#cloud-config\nhostname: a\n");
    }

    #[test]
    fn one_script_keeps_its_name_in_a_multipart() {
        for format in [UserDataFormat::ShellScript, UserDataFormat::CloudBoothook] {
            let part = UserDataPart::new(format, "app.sh", "#!/bin/sh\necho hi\n");
            let ud = assemble(&[part]).unwrap().unwrap();
            assert_eq!(ud.format, UserDataFormat::Mime, "{format:?}");
            let text = String::from_utf8(ud.bytes).unwrap();
            assert!(text.contains("filename=\"00-app.sh\""), "{text}");
            assert!(text.contains("echo hi"), "{text}");
        }
    }

    #[test]
    fn a_lone_script_goes_bare_to_a_provider_that_takes_no_mime() {
        let part = UserDataPart::new(
            UserDataFormat::ShellScript,
            "app.sh",
            "#!/bin/sh\necho hi\n",
        );
        let assembled = assemble(std::slice::from_ref(&part)).unwrap().unwrap();
        let scripts_only = UserDataDelivery {
            formats: vec![UserDataFormat::ShellScript],
            ..delivery(1024, false)
        };
        let ud = fit(
            assembled.clone(),
            std::slice::from_ref(&part),
            &scripts_only,
        )
        .unwrap();
        assert_eq!(ud.format, UserDataFormat::ShellScript);
        assert_eq!(ud.bytes, part.content);
        // Where MIME is taken, the multipart of one stays (its file name names the layer).
        let ud = fit(assembled, &[part], &delivery(1024, false)).unwrap();
        assert_eq!(ud.format, UserDataFormat::Mime);
    }

    #[test]
    fn several_parts_become_a_deterministic_multipart() {
        let parts = [
            UserDataPart::new(
                UserDataFormat::CloudConfig,
                "base.yaml",
                "#cloud-config\nhostname: a\n",
            )
            .with_header("Merge-Type", "list(append)+dict(recurse_array)+str()"),
            UserDataPart::new(
                UserDataFormat::ShellScript,
                "app.sh",
                "#!/bin/sh\necho app\n",
            ),
        ];
        let a = assemble(&parts).unwrap().unwrap();
        let b = assemble(&parts).unwrap().unwrap();
        assert_eq!(a, b, "same parts, same bytes");
        assert_eq!(a.format, UserDataFormat::Mime);
        let text = String::from_utf8(a.bytes).unwrap();
        assert!(text.contains("Content-Type: multipart/mixed"), "{text}");
        assert!(text.contains("Content-Type: text/cloud-config"), "{text}");
        assert!(text.contains("Content-Type: text/x-shellscript"), "{text}");
        assert!(
            text.contains("Merge-Type: list(append)+dict(recurse_array)+str()"),
            "{text}"
        );
        assert!(text.contains("filename=\"01-app.sh\""), "{text}");
        assert!(
            !text.contains("Message-ID") && !text.contains("Date:"),
            "{text}"
        );
    }

    #[test]
    fn every_cloud_config_part_merges_additively_and_names_sort_in_order() {
        let parts: Vec<_> = (0..11)
            .map(|i| {
                let p = UserDataPart::new(
                    UserDataFormat::CloudConfig,
                    format!("z{}.yaml", 10 - i),
                    format!("#cloud-config\nruncmd: [echo {i}]\n"),
                );
                if i == 3 {
                    p.with_header("merge-type", "list()+dict()+str()")
                } else {
                    p
                }
            })
            .collect();
        let text = String::from_utf8(assemble(&parts).unwrap().unwrap().bytes).unwrap();
        assert_eq!(
            text.matches(&format!("Merge-Type: {MERGE_TYPE}")).count(),
            10,
            "{text}"
        );
        assert!(text.contains("merge-type: list()+dict()+str()"), "{text}");
        assert!(text.contains("filename=\"00-z10.yaml\""), "{text}");
        assert!(text.contains("filename=\"10-z0.yaml\""), "{text}");
    }

    #[test]
    fn headers_that_could_inject_a_header_are_refused() {
        let part = || UserDataPart::new(UserDataFormat::CloudConfig, "a.yaml", "#cloud-config\n");
        for (bad, field, why) in [
            (
                part().with_header("X-A: 1\r\nX-Injected", "v"),
                "userData.parts[0].headers[0]",
                "RFC 5322",
            ),
            (
                part().with_header("Merge Type", "v"),
                "userData.parts[0].headers[0]",
                "RFC 5322",
            ),
            (
                part().with_header("", "v"),
                "userData.parts[0].headers[0]",
                "RFC 5322",
            ),
            (
                part().with_header("Merge-Type:", "v"),
                "userData.parts[0].headers[0]",
                "RFC 5322",
            ),
            (
                part().with_header("Mérge", "v"),
                "userData.parts[0].headers[0]",
                "RFC 5322",
            ),
            (
                part().with_header("X".repeat(77), "v"),
                "userData.parts[0].headers[0]",
                "RFC 5322",
            ),
            (
                part().with_header("Merge-Type", "dict()\r\nContent-Type: text/x-shellscript"),
                "userData.parts[0].headers[0]",
                "control character",
            ),
            (
                part().with_header("Merge-Type", "a\nb"),
                "userData.parts[0].headers[0]",
                "control character",
            ),
            (
                part().with_header("content-type", "text/plain"),
                "userData.parts[0].headers[0]",
                "written by the multipart",
            ),
            (
                UserDataPart::new(
                    UserDataFormat::ShellScript,
                    "a.sh\r\nX-Evil: 1",
                    "#!/bin/sh\n",
                ),
                "userData.parts[0].filename",
                "control character",
            ),
        ] {
            let e = assemble(&[part(), bad.clone()]).unwrap_err();
            let field = field.replace("parts[0]", "parts[1]");
            assert_eq!(e.kind(), ErrorKind::InvalidSpec);
            assert_eq!(e.field(), Some(field.as_str()), "{e}");
            assert!(e.message().contains(why), "{e}");
            let e = assemble(&[bad.with_header("Merge-Type", "x")]).unwrap_err();
            assert!(e.field().unwrap().starts_with("userData.parts[0]"), "{e}");
        }
        let ok = part().with_header("Merge-Type", "list(append)+dict(recurse_array)+str()");
        ok.check_headers().unwrap();
        assert!(assemble(&[ok, part()]).is_ok());
    }

    #[test]
    fn formats_without_mime_type_cannot_be_combined() {
        let parts = [
            UserDataPart::new(UserDataFormat::CloudConfig, "a.yaml", "#cloud-config\n"),
            UserDataPart::new(UserDataFormat::Ignition, "b.ign", "{}"),
        ];
        let e = assemble(&parts).unwrap_err();
        assert_eq!(e.field(), Some("userData.parts[1]"));
    }

    #[test]
    fn over_the_limit_is_gzipped_when_accepted() {
        let big = format!(
            "#cloud-config\nruncmd:\n{}",
            "  - echo hello world\n".repeat(2000)
        );
        let ud = UserData::new(UserDataFormat::CloudConfig, big.clone());
        let fitted = fit(ud, &[], &delivery(16 * 1024, true)).unwrap();
        assert_eq!(fitted.encoding, ContentEncoding::Gzip);
        assert!(fitted.bytes.len() <= 16 * 1024);
        assert_eq!(fitted.decoded().unwrap(), big.as_bytes());
    }

    #[test]
    fn still_over_the_limit_names_sizes_and_largest_parts() {
        let noise: String = (0..40_000).map(|_| fastrand::alphanumeric()).collect();
        let parts = [UserDataPart::new(
            UserDataFormat::ShellScript,
            "noise.sh",
            noise.clone(),
        )];
        let ud = assemble(&parts).unwrap().unwrap();
        let size = ud.bytes.len();
        let e = fit(ud, &parts, &delivery(16 * 1024, true)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
        assert_eq!(e.field(), Some("userData"));
        let msg = e.to_string();
        assert!(msg.contains(&format!("{size} bytes")), "{msg}");
        assert!(msg.contains("after gzip"), "{msg}");
        assert!(msg.contains("16384"), "{msg}");
        assert!(msg.contains("noise.sh (40000 B)"), "{msg}");
    }

    #[test]
    fn refused_format_is_named() {
        let ud = UserData::new(UserDataFormat::PowerShell, "<powershell></powershell>");
        let e = fit(ud, &[], &delivery(100, false)).unwrap_err();
        assert!(e.to_string().contains("PowerShell"), "{e}");
    }

    #[test]
    fn base64_basis_counts_the_encoded_size() {
        assert_eq!(SizeBasis::Base64.counted(3), 4);
        assert_eq!(SizeBasis::Base64.counted(4), 8);
        assert_eq!(SizeBasis::Raw.counted(4), 4);
    }

    #[test]
    fn debug_never_shows_content() {
        let ud = UserData::new(UserDataFormat::CloudConfig, "token: hunter2");
        let part = UserDataPart::new(UserDataFormat::CloudConfig, "a", "token: hunter2");
        assert!(!format!("{ud:?}{part:?}").contains("hunter2"));
    }
}
