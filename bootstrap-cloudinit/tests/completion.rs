//! `CloudInitStatus` against the real `cloud-init status` command: each check runs
//! Debian's cloud-init in a private mount namespace whose /run holds the state files
//! cloud-init writes during boot (status.json, result.json), through a transport that
//! executes commands on this host.

mod peers;

use std::path::PathBuf;

use async_trait::async_trait;
use bootstrap_cloudinit::{CloudInitStatus, HostKey};
use machine_core::{
    Completion, CompletionCheck, Error, ExecOutput, ExecRequest, FileUpload, Machine, MachineName,
    Phase, ProviderId, Result, Transport,
};

/// Runs commands locally with /run replaced by a tmpfs holding `state`'s files.
struct LocalNamespace {
    state: tempfile::TempDir,
}

impl LocalNamespace {
    fn new(status: &str, result: Option<&str>) -> Self {
        let state = tempfile::tempdir().unwrap();
        std::fs::write(state.path().join("status.json"), status).unwrap();
        if let Some(r) = result {
            std::fs::write(state.path().join("result.json"), r).unwrap();
        }
        LocalNamespace { state }
    }

    fn dir(&self) -> PathBuf {
        self.state.path().to_owned()
    }
}

#[async_trait]
impl Transport for LocalNamespace {
    async fn exec(&self, request: &ExecRequest) -> Result<ExecOutput> {
        assert!(
            std::path::Path::new("/usr/bin/unshare").exists(),
            "unshare is missing: apt-get install util-linux"
        );
        let wrapper = "mount -t tmpfs run /run && mkdir /run/cloud-init && cp \"$STATE\"/* /run/cloud-init/ && exec sh -c \"$CMD\"";
        let out = tokio::process::Command::new("/usr/bin/unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", wrapper])
            .env("STATE", self.dir())
            .env("CMD", &request.command)
            .output()
            .await
            .map_err(|e| Error::transient(format!("cannot run unshare: {e}")))?;
        Ok(ExecOutput::new(out.status.code(), out.stdout, out.stderr))
    }

    async fn upload(&self, file: &FileUpload) -> Result<()> {
        Err(Error::permanent(format!("not used: upload {}", file.path)))
    }

    async fn read_file(&self, path: &str, _max: usize) -> Result<Option<Vec<u8>>> {
        Err(Error::permanent(format!("not used: read {path}")))
    }
}

fn machine() -> Machine {
    Machine::new(
        MachineName::new("web-1").unwrap(),
        ProviderId::new("sim:///m-1").unwrap(),
        Phase::Provisioned,
    )
}

fn stage(errors: &[&str], finished: bool) -> String {
    serde_json::json!({
        "errors": errors,
        "start": 1_700_000_000.5,
        "finished": if finished { serde_json::json!(1_700_000_010.5) } else { serde_json::Value::Null },
    })
    .to_string()
}

/// status.json as cloud-init 22.4 writes it (`cloudinit/cmd/main.py: status_wrapper`).
fn status_json(final_errors: &[&str], final_finished: bool, stage_now: Option<&str>) -> String {
    format!(
        r#"{{"v1": {{"datasource": "DataSourceNoCloud [seed=/var/lib/cloud/seed/nocloud][dsmode=net]",
        "init-local": {}, "init": {}, "modules-config": {}, "modules-final": {}, "stage": {}}}}}"#,
        stage(&[], true),
        stage(&[], true),
        stage(&[], true),
        stage(final_errors, final_finished),
        stage_now.map_or("null".to_owned(), |s| format!("{s:?}")),
    )
}

const RESULT: &str = r#"{"v1": {"datasource": "DataSourceNoCloud", "errors": []}}"#;

async fn check(status: String, result: Option<&str>) -> Completion {
    assert!(
        std::path::Path::new("/usr/bin/cloud-init").exists(),
        "cloud-init is missing: run scripts/peers/20-cloud-init.sh"
    );
    let t = LocalNamespace::new(&status, result);
    CloudInitStatus::new().check(&machine(), &t).await.unwrap()
}

#[tokio::test]
async fn done_running_and_failed_come_from_cloud_init_itself() {
    assert_eq!(
        check(status_json(&[], true, None), Some(RESULT)).await,
        Completion::Done
    );
    assert_eq!(
        check(status_json(&[], false, Some("modules-final")), None).await,
        Completion::Pending
    );
    let err =
        "('scripts_user', RuntimeError('Runparts: 1 failures (part-001) in 1 attempted commands'))";
    match check(status_json(&[err], true, None), Some(RESULT)).await {
        Completion::Failed(msg) => {
            assert!(msg.contains("scripts_user"), "{msg}");
            assert!(msg.contains("Runparts: 1 failures"), "{msg}");
        }
        other => panic!("expected a failure with cloud-init's text, got {other:?}"),
    }
}

#[tokio::test]
async fn a_machine_without_cloud_init_is_a_permanent_error() {
    struct NoCloudInit;
    #[async_trait]
    impl Transport for NoCloudInit {
        async fn exec(&self, request: &ExecRequest) -> Result<ExecOutput> {
            let out = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(
                    request
                        .command
                        .replace("cloud-init", "cloud-init-absent-here"),
                )
                .output()
                .await
                .unwrap();
            Ok(ExecOutput::new(out.status.code(), out.stdout, out.stderr))
        }
        async fn upload(&self, _f: &FileUpload) -> Result<()> {
            Ok(())
        }
        async fn read_file(&self, _p: &str, _m: usize) -> Result<Option<Vec<u8>>> {
            Ok(None)
        }
    }
    let e = CloudInitStatus::new()
        .check(&machine(), &NoCloudInit)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not installed"), "{e}");
}

#[test]
fn host_key_is_what_ssh_keygen_reads() {
    let key = HostKey::generate_ed25519("web-1").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let private = dir.path().join("ssh_host_ed25519_key");
    let config = bootstrap_cloudinit::CloudConfig {
        ssh_keys: Some(key.ssh_keys()),
        ..Default::default()
    };
    let doc = bootstrap_cloudinit::render(&config).unwrap();
    peers::assert_valid_cloud_config(&doc);
    // Take the private key as cloud-init would (PyYAML) and derive its public half.
    let read = peers::pyyaml_load_all(&[doc]);
    let pem = read[0]["ssh_keys"]["ed25519_private"].as_str().unwrap();
    std::fs::write(&private, pem).unwrap();
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let out = std::process::Command::new("ssh-keygen")
        .args(["-y", "-f"])
        .arg(&private)
        .output()
        .expect("ssh-keygen is missing: apt-get install openssh-client");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let derived = String::from_utf8(out.stdout).unwrap();
    let mut ours = key.public().split_whitespace();
    let mut theirs = derived.split_whitespace();
    assert_eq!(ours.next(), theirs.next());
    assert_eq!(ours.next(), theirs.next(), "public halves differ");
}
