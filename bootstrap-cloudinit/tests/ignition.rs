//! Ignition output, checked by Debian's `ignition-validate` (Ignition 2.14).

mod peers;

use base64::Engine;
use bootstrap_cloudinit::{CloudConfig, Command, HostKey, Ntp, User, WriteFile, to_ignition};

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHx4bmxvZ2luLWtleS1mb3ItdGVzdHMtb25seQ ops@laptop";

#[test]
fn mapped_features_make_a_config_ignition_validate_accepts_cleanly() {
    let key = HostKey::generate_ed25519("core-1").unwrap();
    let config = CloudConfig {
        timezone: Some("Europe/Berlin".into()),
        ssh_keys: Some(key.ssh_keys()),
        bootcmd: vec![Command::Shell("echo early".into())],
        runcmd: vec![
            Command::Shell("systemctl start app".into()),
            Command::Argv(vec!["touch".into(), "/run/a b".into()]),
        ],
        ..CloudConfig::new()
            .with_hostname("core-1")
            .with_user(User {
                groups: vec!["wheel".into()],
                ..User::admin("core", [KEY.to_owned()])
            })
            .with_file(
                WriteFile::new("/etc/app.conf", "a: 1\n")
                    .permissions("0640")
                    .owner("root:root"),
            )
            .with_file(WriteFile::new("/etc/bin", vec![0u8, 255, 1]))
            .with_file(WriteFile::new("/etc/profile.d/x.sh", "export X=1\n").appended())
    };
    let ign = to_ignition(&config).unwrap();
    peers::assert_valid_ignition(&ign);
    let v: serde_json::Value = serde_json::from_str(&ign).unwrap();
    assert_eq!(v["ignition"]["version"], "3.3.0");
    assert_eq!(v["passwd"]["users"][0]["sshAuthorizedKeys"][0], KEY);
    let files = v["storage"]["files"].as_array().unwrap();
    let conf = files.iter().find(|f| f["path"] == "/etc/app.conf").unwrap();
    assert_eq!(conf["mode"], 0o640);
    let data = conf["contents"]["source"]
        .as_str()
        .unwrap()
        .strip_prefix("data:;base64,")
        .unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap(),
        b"a: 1\n"
    );
    assert!(files.iter().any(|f| f["path"] == "/etc/sudoers.d/core"));
    assert!(
        files
            .iter()
            .any(|f| f["path"] == "/etc/ssh/ssh_host_ed25519_key.pub")
    );
    let units = v["systemd"]["units"].as_array().unwrap();
    assert_eq!(units.len(), 2);
    assert!(
        units[1]["contents"]
            .as_str()
            .unwrap()
            .contains("Type=oneshot")
    );
}

#[test]
fn what_does_not_map_is_refused_naming_the_key() {
    let e = to_ignition(&CloudConfig::new().with_package("curl")).unwrap_err();
    assert_eq!(e.field(), Some("packages"));
    assert!(e.to_string().contains("does not map to Ignition"), "{e}");
    let e = to_ignition(&CloudConfig {
        ntp: Some(Ntp::default()),
        ..CloudConfig::new()
    })
    .unwrap_err();
    assert_eq!(e.field(), Some("ntp"));
    let e = to_ignition(&CloudConfig::new().with_extra("snap", serde_json::json!({}))).unwrap_err();
    assert_eq!(e.field(), Some("extra.snap"));
    // An empty config is still a valid Ignition config.
    peers::assert_valid_ignition(&to_ignition(&CloudConfig::new()).unwrap());
}
