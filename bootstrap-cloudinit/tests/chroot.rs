//! The strongest proof: user data built by this crate run by the real cloud-init's
//! modules (all four boot stages) in a Debian 12 root file system, with a NoCloud seed,
//! then read back by `CloudInitStatus` through a transport into that system.
//!
//! The root and how it boots: [`peers::root`].

mod peers;

use bootstrap_cloudinit::{
    Bootstrap, CloudConfig, CloudConfigLayer, CloudInitStatus, HostKey, Output, User, WriteFile,
};
use machine_core::{
    Completion, CompletionCheck, Machine, MachineName, Phase, ProviderId, SizeBasis,
    UserDataDelivery, UserDataFormat,
};
use peers::root::Root;

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHx4bmxvZ2luLWtleS1mb3ItdGVzdHMtb25seQ ops@laptop";

fn delivery() -> UserDataDelivery {
    UserDataDelivery::new(
        16 * 1024,
        SizeBasis::Raw,
        vec![UserDataFormat::CloudConfig, UserDataFormat::Mime],
    )
    .with_gzip(true)
}

fn machine() -> Machine {
    Machine::new(
        MachineName::new("web-1").unwrap(),
        ProviderId::new("sim:///web-1").unwrap(),
        Phase::Provisioned,
    )
}

fn read(root: &Root, path: &str) -> String {
    root.read(path)
}

fn unique(name: &str) -> String {
    format!("{name}-{}-{}", std::process::id(), fastrand_suffix())
}

fn fastrand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        % 1_000_000
}

#[tokio::test]
async fn cloud_init_applies_what_the_layers_say() {
    let key = HostKey::generate_ed25519("web-1").unwrap();
    let base = CloudConfigLayer::new(
        "base",
        CloudConfig {
            ssh_keys: Some(key.ssh_keys()),
            ..CloudConfig::new()
                .with_hostname("web-1")
                .with_user(User::admin("ops", [KEY.to_owned()]))
                .with_file(
                    WriteFile::new("/etc/motd", "yes\n---\n#cloud-config\n").permissions("0640"),
                )
        },
    )
    .unwrap();
    let app = CloudConfigLayer::new(
        "app",
        CloudConfig::new()
            .with_user(User::new("app"))
            .with_file(
                WriteFile::new("/srv/app/env", "A=1\n")
                    .owner("app:app")
                    .deferred(),
            )
            .with_runcmd("echo 'ran: ok' > /var/tmp/runcmd-marker"),
    )
    .unwrap()
    .with_script(
        "hello.sh",
        "#!/bin/sh\necho script > /var/tmp/script-marker\n",
    )
    .unwrap()
    .with_boothook(
        "early.sh",
        "#cloud-boothook\n#!/bin/sh\necho boothook > /var/tmp/boothook-marker\n",
    )
    .unwrap()
    .with_jinja2(
        "jinja.yaml",
        "## template: jinja\n#cloud-config\nwrite_files:\n- path: /var/tmp/jinja-marker\n  content: \"host {{ v1.local_hostname }}\"\n",
    )
    .unwrap();
    let built = Bootstrap::new("web", vec![base, app])
        .unwrap()
        .output(Output::Multipart)
        .build(&delivery())
        .unwrap();
    let instance = unique("iid");
    let root = Root::new(&built.user_data.bytes, &instance);
    root.boot();

    assert_eq!(read(&root, "/etc/motd"), "yes\n---\n#cloud-config\n");
    assert_eq!(read(&root, "/var/tmp/runcmd-marker"), "ran: ok\n");
    assert_eq!(read(&root, "/var/tmp/script-marker"), "script\n");
    assert_eq!(read(&root, "/var/tmp/boothook-marker"), "boothook\n");
    // cloud-init rendered the Jinja part with its instance data, and merged its
    // write_files with the other layers' (the Merge-Type header on the jinja part).
    assert_eq!(
        read(&root, "/var/tmp/jinja-marker"),
        format!("host {instance}")
    );
    assert_eq!(read(&root, "/srv/app/env"), "A=1\n");
    assert!(read(&root, "/home/ops/.ssh/authorized_keys").contains(KEY));
    assert!(read(&root, "/etc/passwd").contains("\napp:"));
    assert_eq!(
        read(&root, "/etc/ssh/ssh_host_ed25519_key.pub").trim(),
        key.public()
    );
    assert_eq!(
        CloudInitStatus::new()
            .check(&machine(), &root)
            .await
            .unwrap(),
        Completion::Done
    );
}

#[tokio::test]
async fn a_failing_command_surfaces_cloud_init_own_error() {
    let layer = CloudConfigLayer::new(
        "app",
        CloudConfig::new().with_runcmd("echo about to fail; exit 3"),
    )
    .unwrap();
    let built = Bootstrap::new("web", vec![layer])
        .unwrap()
        .build(&delivery())
        .unwrap();
    let root = Root::new(&built.user_data.bytes, &unique("iid"));
    root.boot();
    match CloudInitStatus::new()
        .check(&machine(), &root)
        .await
        .unwrap()
    {
        Completion::Failed(msg) => {
            assert!(
                msg.contains("scripts_user") || msg.contains("scripts-user"),
                "{msg}"
            );
            assert!(!msg.contains("locale"), "only the command failed: {msg}");
        }
        other => panic!("expected cloud-init's failure, got {other:?}"),
    }
}

#[tokio::test]
async fn composer_user_data_with_the_capi_sentinel_completes_on_real_cloud_init() {
    use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
    use machine_core::{Composer, MachineSpec, SentinelFile};
    use std::sync::Arc;

    let cloud = SimCloud::new();
    let provider = Arc::new(SimProvider::new(cloud.clone(), SimConfig::default()).unwrap());
    let layer = CloudConfigLayer::new(
        "base",
        CloudConfig::new()
            .with_file(WriteFile::new("/etc/motd", "from the composer\n"))
            .with_runcmd("echo composed > /var/tmp/composed"),
    )
    .unwrap();
    let sentinel = SentinelFile::default();
    let composer = Composer::builder(provider)
        .coupled(Arc::new(layer))
        .connector(Arc::new(SimConnector::new(cloud)))
        .completion(Arc::new(sentinel.clone()))
        .build()
        .unwrap();
    let spec = MachineSpec::new(MachineName::new("web-1").unwrap());
    let user_data = composer.user_data(&spec).unwrap().expect("user data");
    // Exactly the bytes a provider would send (gzip when the composer chose it).
    let root = Root::new(&user_data.bytes, &unique("iid"));
    assert_eq!(
        sentinel.check(&machine(), &root).await.unwrap(),
        Completion::Pending
    );
    root.boot();
    assert_eq!(read(&root, "/etc/motd"), "from the composer\n");
    assert_eq!(read(&root, "/var/tmp/composed"), "composed\n");
    assert_eq!(
        sentinel.check(&machine(), &root).await.unwrap(),
        Completion::Done
    );
    assert_eq!(
        CloudInitStatus::new()
            .check(&machine(), &root)
            .await
            .unwrap(),
        Completion::Done
    );
}
