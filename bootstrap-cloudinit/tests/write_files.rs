//! `write_files` as the real cloud-init applies it ([`peers::root`]): validation accepts
//! exactly the modes and owners that land on the machine as written, and refuses the
//! others naming the field.

mod peers;

use std::os::unix::fs::MetadataExt;

use bootstrap_cloudinit::{CloudConfig, User, WriteFile, validate_with};
use machine_core::ErrorKind;
use peers::root::Root;

const MODES: &[&str] = &[
    "0000", "0400", "0600", "0644", "0755", "0777", "1755", "2755", "4755", "6750", "0o640",
];

fn mode_path(mode: &str) -> String {
    format!("/var/tmp/mode-{mode}")
}

/// The mode a permission string asks for.
fn asked(mode: &str) -> u32 {
    u32::from_str_radix(mode.trim_start_matches("0o"), 8).unwrap()
}

#[test]
fn a_mode_is_accepted_exactly_when_cloud_init_applies_it() {
    // cloud-init gets every mode, validated or not: the document is written by hand.
    let mut doc = String::from("#cloud-config\nwrite_files:\n");
    for m in MODES {
        doc.push_str(&format!(
            "- path: {}\n  content: x\n  permissions: '{m}'\n",
            mode_path(m)
        ));
    }
    let root = Root::new(doc.as_bytes(), "iid-modes");
    root.boot();
    for m in MODES {
        let landed = root.mode(&mode_path(m));
        let config =
            CloudConfig::new().with_file(WriteFile::new(mode_path(m), "x").permissions(*m));
        match validate_with(&config, &[]) {
            Ok(()) => assert_eq!(
                format!("{landed:o}"),
                format!("{:o}", asked(m)),
                "{m} was accepted but cloud-init wrote {landed:o}"
            ),
            Err(e) => {
                assert_ne!(
                    format!("{landed:o}"),
                    format!("{:o}", asked(m)),
                    "{m} lands as asked but was refused: {e}"
                );
                assert_eq!(e.kind(), ErrorKind::InvalidSpec);
                assert_eq!(e.field(), Some("write_files[0].permissions"), "{e}");
            }
        }
    }
}

/// The group of a file on the machine, by name.
fn group_of(root: &Root, path: &str) -> String {
    let gid = std::fs::metadata(root.upper(path))
        .unwrap()
        .gid()
        .to_string();
    let text = std::fs::read_to_string(root.upper("/etc/group")).unwrap();
    text.lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.get(2) == Some(&gid.as_str()))
        .map_or(gid.clone(), |f| f[0].to_owned())
}

#[test]
fn a_file_owned_by_a_group_the_document_creates_needs_defer() {
    let deploy = User {
        groups: vec!["deploy".into()],
        ..User::new("ci")
    };
    let early = WriteFile::new("/var/tmp/early", "x").owner("root:deploy");
    let deferred = early.clone().deferred();
    let deferred = WriteFile {
        path: "/var/tmp/deferred".into(),
        ..deferred
    };

    // The check: refused without defer, naming the field; accepted with it.
    let refused = CloudConfig::new()
        .with_user(deploy.clone())
        .with_file(early.clone());
    let e = validate_with(&refused, &[]).unwrap_err();
    assert_eq!(e.field(), Some("write_files[0].defer"), "{e}");
    assert!(e.to_string().contains("deploy"), "{e}");
    let accepted = CloudConfig::new()
        .with_user(deploy.clone())
        .with_file(deferred.clone());
    validate_with(&accepted, &[]).unwrap();
    // A group that exists in the image before cloud-init runs needs no defer.
    let sudo = CloudConfig::new()
        .with_user(User {
            groups: vec!["sudo".into()],
            ..User::new("ci")
        })
        .with_file(WriteFile::new("/var/tmp/x", "x").owner("root:sudo"));
    validate_with(&sudo, &[]).unwrap();
    // The top-level `groups` key creates groups too.
    let top = CloudConfig::new()
        .with_extra("groups", serde_json::json!([{"ops": ["root"]}, "audit2"]))
        .with_file(WriteFile::new("/var/tmp/x", "x").owner("root:audit2"));
    assert_eq!(
        validate_with(&top, &[]).unwrap_err().field(),
        Some("write_files[0].defer")
    );

    // Why: on the real cloud-init the early file does not get the group, the deferred
    // one does. (Rendered from both entries without validation, as cloud-init sees it.)
    let both = CloudConfig {
        write_files: vec![deferred, early],
        ..CloudConfig::new().with_user(deploy)
    };
    let text = format!("#cloud-config\n{}", serde_saphyr::to_string(&both).unwrap());
    let root = Root::new(text.as_bytes(), "iid-groups");
    root.boot();
    assert_eq!(group_of(&root, "/var/tmp/deferred"), "deploy");
    assert_ne!(group_of(&root, "/var/tmp/early"), "deploy");
}
