//! A login user that is not root: password authentication, and sudo for root-only
//! paths (where machine-core keeps step state). The test creates a run-unique user and
//! sudoers entry and removes both on drop.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

use bootstrap_ssh::{Auth, SshClient, SshConfig, SshTarget};
use machine_core::steps::{Step, StepLayer};
use machine_core::{ErrorKind, ExecRequest, SecretString, SoftwareProvisioner};
use support::{Sshd, SshdOptions, fast, run};

struct TempUser {
    name: String,
    sudoers: PathBuf,
}

impl TempUser {
    fn new(password: &str) -> TempUser {
        support::need("useradd", "passwd");
        let name = format!("bssh{}", support::unique());
        let user = TempUser {
            sudoers: PathBuf::from(format!("/etc/sudoers.d/{name}")),
            name,
        };
        run(
            "useradd",
            &["-M", "-d", "/tmp", "-s", "/bin/sh", &user.name],
        );
        let mut chpasswd = Command::new("chpasswd")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        writeln!(chpasswd.stdin.take().unwrap(), "{}:{password}", user.name).unwrap();
        assert!(chpasswd.wait().unwrap().success());
        user
    }

    fn allow_sudo(&self) {
        std::fs::write(
            &self.sudoers,
            format!("{} ALL=(ALL) NOPASSWD: ALL\n", self.name),
        )
        .unwrap();
        std::fs::set_permissions(&self.sudoers, std::fs::Permissions::from_mode(0o440)).unwrap();
    }
}

impl Drop for TempUser {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.sudoers);
        // Its sessions end a moment after their connections close: retry a while.
        for _ in 0..50 {
            let done = Command::new("userdel")
                .arg(&self.name)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success() || s.code() == Some(6));
            if done {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("could not remove test user {}", self.name);
    }
}

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
