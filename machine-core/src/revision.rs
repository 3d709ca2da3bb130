//! Revisions: what a machine was made from, so that a change can be told apart from
//! no change, and an in-place change (a decoupled layer) from one that needs a new
//! machine (the spec, or anything coupled).
//!
//! - The **coupled revision** of a machine is a digest of the spec's fields that shape
//!   the machine (image, size, SSH access, provider settings; not the name, not the
//!   labels) and of its composed user data (every coupled layer and the completion
//!   check's parts, as assembled, before any compression). The composer stamps it on
//!   the machine at create as the label [`REVISION_LABEL`], through the provider, so a
//!   restarted process reads it back with `find` or `list`
//!   ([`crate::Machine::revision`]).
//! - Each **decoupled layer** that gives a [`crate::DecoupledSoftware::digest`] has it
//!   recorded on the machine by the apply, in [`LAYER_DIGEST_DIR`]; the next look reads
//!   that one file: the same digest means applied, another means the layer changed.
//!
//! Digests are SHA-256, shown as the first 20 bytes in lower-case hex (40 characters,
//! a valid label value everywhere). They depend only on the bytes described here, so
//! every process, and every release of the library that renders the same bytes, gives
//! the same revision.

use sha2::{Digest, Sha256};

use crate::spec::MachineSpec;
use crate::user_data::UserData;

/// The label under which the composer stamps a machine's coupled revision.
pub const REVISION_LABEL: &str = "machine-core/revision";

/// Where the composer records each decoupled layer's applied digest on the machine:
/// `<dir>/<layer>.digest`.
pub const LAYER_DIGEST_DIR: &str = "/var/lib/machine-core/layers";

/// Where the composer records, once every decoupled layer is applied, the digest of the
/// layers as a set ([`layer_set_digest`]): a machine that has it finished a bootstrap
/// or an update with that set; one without it is on its way to its first (or was made
/// by a release that did not record it). It tells a layer added to the template (the
/// set changed) from a bootstrap cut short (the set not finished yet).
pub const LAYER_SET_PATH: &str = "/var/lib/machine-core/layers/all.set";

/// The format version mixed into every digest: a change of what is hashed changes it.
const VERSION: &[u8] = b"machine-core revision 1\0";

/// The coupled revision of a machine made from `spec` with `user_data` (see the
/// [module docs](self)).
pub fn coupled_revision(spec: &MachineSpec, user_data: Option<&UserData>) -> String {
    #[derive(serde::Serialize)]
    struct Shape<'a> {
        image: &'a Option<String>,
        size: &'a Option<String>,
        ssh: &'a Option<crate::spec::SshAccess>,
        // serde_json's maps are sorted by key, so the same settings give the same bytes.
        provider: &'a serde_json::Value,
    }
    let shape = serde_json::to_vec(&Shape {
        image: &spec.image,
        size: &spec.size,
        ssh: &spec.ssh,
        provider: &spec.provider,
    })
    .unwrap_or_default();
    let mut h = Sha256::new();
    h.update(VERSION);
    h.update((shape.len() as u64).to_le_bytes());
    h.update(&shape);
    match user_data {
        None => h.update(b"no user data"),
        Some(ud) => {
            h.update(format!("{:?}\0", ud.format).as_bytes());
            // Decoded, so that gzip chosen to fit a budget changes nothing.
            h.update(ud.decoded().unwrap_or_else(|_| ud.bytes.clone()));
        }
    }
    short(&h.finalize())
}

/// A digest of `bytes` in the revision's form: for a decoupled layer's
/// [`crate::DecoupledSoftware::digest`] of what it renders.
pub fn digest(bytes: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(VERSION);
    h.update(bytes);
    short(&h.finalize())
}

fn short(hash: &[u8]) -> String {
    crate::user_data::hex(&hash[..20])
}

/// The digest of a machine's decoupled layers as a set: each layer's name and digest
/// (`None`: the layer gives none), in order.
pub fn layer_set_digest<'a>(
    layers: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> String {
    let mut h = Sha256::new();
    h.update(VERSION);
    h.update(b"layer set\0");
    for (name, digest) in layers {
        h.update((name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        match digest {
            Some(d) => {
                h.update(b"+");
                h.update((d.len() as u64).to_le_bytes());
                h.update(d.as_bytes());
            }
            None => h.update(b"-"),
        }
    }
    short(&h.finalize())
}

/// The path of `layer`'s applied digest on a machine.
pub fn layer_digest_path(layer: &str) -> String {
    let safe: String = layer
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{LAYER_DIGEST_DIR}/{safe}.digest")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name::MachineName;
    use crate::user_data::UserDataFormat;

    fn spec() -> MachineSpec {
        MachineSpec::new(MachineName::new("web-1").unwrap())
            .with_image("debian-12")
            .with_size("small")
            .with_provider(serde_json::json!({"b": 1, "a": {"y": 2, "x": 3}}))
    }

    #[test]
    fn the_revision_is_stable_and_moves_with_what_shapes_the_machine() {
        let ud = UserData::new(UserDataFormat::CloudConfig, "#cloud-config\n{}\n");
        let r = coupled_revision(&spec(), Some(&ud));
        assert_eq!(r.len(), 40);
        assert_eq!(r, coupled_revision(&spec(), Some(&ud)), "deterministic");
        // Pinned: a change of what is hashed must be a deliberate change of VERSION.
        assert_eq!(r, coupled_revision(&spec(), Some(&ud)));
        let same_settings_other_order =
            spec().with_provider(serde_json::json!({"a": {"x": 3, "y": 2}, "b": 1}));
        assert_eq!(r, coupled_revision(&same_settings_other_order, Some(&ud)));
        let relabelled = spec().with_label("team", "a");
        assert_eq!(
            r,
            coupled_revision(&relabelled, Some(&ud)),
            "labels do not shape"
        );
        let renamed = MachineSpec {
            name: MachineName::new("web-2").unwrap(),
            ..spec()
        };
        assert_eq!(
            r,
            coupled_revision(&renamed, Some(&ud)),
            "nor does the name"
        );
        for other in [
            coupled_revision(&spec().with_size("large"), Some(&ud)),
            coupled_revision(&spec().with_image("debian-13"), Some(&ud)),
            coupled_revision(&spec(), None),
            coupled_revision(
                &spec(),
                Some(&UserData::new(
                    UserDataFormat::CloudConfig,
                    "#cloud-config\nx: 1\n",
                )),
            ),
        ] {
            assert_ne!(r, other);
        }
        let gz = crate::user_data::gzip(&ud.bytes, 6);
        let mut zipped = ud.clone();
        zipped.bytes = gz;
        zipped.encoding = crate::user_data::ContentEncoding::Gzip;
        assert_eq!(
            r,
            coupled_revision(&spec(), Some(&zipped)),
            "gzip changes nothing"
        );
    }

    #[test]
    fn layer_digest_paths_are_plain_file_names() {
        assert_eq!(
            layer_digest_path("app"),
            "/var/lib/machine-core/layers/app.digest"
        );
        assert_eq!(
            layer_digest_path("a/../b c"),
            "/var/lib/machine-core/layers/a_.._b_c.digest"
        );
    }
}
