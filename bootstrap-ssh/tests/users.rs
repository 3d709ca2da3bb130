//! A login user that is not root: password authentication, and sudo for root-only
//! paths (where machine-core keeps step state). The test creates a run-unique user and
//! sudoers entry and removes both on drop.

mod support;

use std::os::unix::fs::PermissionsExt;

use bootstrap_ssh::{Auth, SshClient, SshConfig, SshTarget};
use machine_core::steps::{Step, StepLayer};
use machine_core::{DecoupledSoftware, ErrorKind, ExecRequest, SecretString};
use support::{Sshd, SshdOptions, TempUser, fast};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_auth_when_asked_and_sudo_for_root_only_state() {
    support::need("sudo", "sudo");
    let user = TempUser::new("pa55 word!");
    let sshd = Sshd::with(SshdOptions {
        extra: "PasswordAuthentication yes",
        ..SshdOptions::default()
    });
    let target = SshTarget::new("127.0.0.1", sshd.port, user.name.clone()).unwrap();
    let config = |password: &str| {
        fast(SshConfig::new(vec![Auth::password(SecretString::from(
            password,
        ))]))
    };

    let e = SshClient::connect(&config("wrong"), &target, &sshd.pins())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    assert!(
        !e.to_string().contains("wrong"),
        "the password is not shown: {e}"
    );
    let c = SshClient::connect(&config("pa55 word!"), &target, &sshd.pins())
        .await
        .unwrap();
    assert_eq!(
        c.run(&ExecRequest::new("id -un")).await.unwrap().stdout,
        format!("{}\n", user.name).into_bytes()
    );

    // State under a root-only directory: refused without sudo, applied with it.
    let root_only = sshd.dir.path().join("root-only");
    std::fs::create_dir(&root_only).unwrap();
    std::fs::set_permissions(sshd.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&root_only, std::fs::Permissions::from_mode(0o700)).unwrap();
    let layer = StepLayer::new("sudo", vec![Step::run("id -u > /dev/null")])
        .unwrap()
        .with_state_dir(root_only.join("state").to_str().unwrap())
        .unwrap();
    let m = sshd.machine("sudo-1");
    let e = layer.apply(&m, &c).await.unwrap_err();
    assert!(e.to_string().contains("ermission denied"), "{e}");
    c.close().await;
    user.allow_sudo();
    let c = SshClient::connect(&config("pa55 word!").with_sudo(true), &target, &sshd.pins())
        .await
        .unwrap();
    layer.apply(&m, &c).await.unwrap();
    assert!(layer.is_applied(&m, &c).await.unwrap());
    let meta = std::fs::metadata(root_only.join("state/sudo.done")).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&meta),
        0,
        "written as root"
    );
}
