//! A composed machine on a real local machine: a cloud-config layer coupled (in user
//! data, applied by real cloud-init) and a step layer decoupled (over real SSH, pinned
//! to the host keys the machine made), with cloud-init's own status as the completion
//! check. Everything each layer asked for is read back from the machine.

mod support;

use std::sync::Arc;

use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, CloudInitStatus, User, WriteFile};
use bootstrap_ssh::SshConnector;
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    CancellationToken, Composer, MachineName, MachineProvisioner, MachineSpec, Phase,
};
use support::{ClientKey, Lab, ssh};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coupled_cloud_config_layer_and_a_decoupled_step_layer_both_land_before_ready() {
    let lab = Lab::new();
    let provider = lab.provider("composed");
    let key = ClientKey::new();
    let base = CloudConfigLayer::new(
        "base",
        CloudConfig::new()
            .with_user(User::new("alice"))
            .with_file(WriteFile::new("/etc/team-a.conf", "owner=team-a\n"))
            .with_runcmd("touch /var/lib/team-a-ran"),
    )
    .unwrap();
    let app = StepLayer::new(
        "app",
        vec![
            Step::write_file("/etc/app.conf", "port=8080\n"),
            // The decoupled layer runs after the coupled one: alice exists by then.
            Step::run("id -un alice > /var/lib/app-saw-alice"),
        ],
    )
    .unwrap();
    let composer = Composer::builder(provider.clone())
        .coupled(Arc::new(base))
        .decoupled(Arc::new(app))
        .connector(Arc::new(SshConnector::new(key.ssh_config())))
        .completion(Arc::new(CloudInitStatus::new()))
        .build()
        .unwrap();
    let mut spec = MachineSpec::new(MachineName::new("composed-1").unwrap());
    spec.ssh = Some(key.access("root"));
    let done = composer
        .provision(&spec, &CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("provision failed: {e}"));
    assert_eq!(
        done.machine.phase,
        Phase::Ready,
        "{:?}",
        done.machine.failure
    );
    assert!(!done.machine.access.host_keys.is_empty());

    let m = &done.machine;
    let out = ssh(
        &key,
        m,
        "cat /etc/team-a.conf /etc/app.conf /var/lib/app-saw-alice; ls /var/lib/team-a-ran; getent passwd alice | cut -d: -f1; cloud-init status",
    )
    .await;
    assert_eq!(
        out, "owner=team-a\nport=8080\nalice\n/var/lib/team-a-ran\nalice\nstatus: done\n",
        "what the machine holds"
    );
    composer
        .deprovision(&spec.name, &CancellationToken::new())
        .await
        .unwrap();
    assert!(!provider.machine_dir(&spec.name).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coupled_layer_whose_command_fails_makes_the_machine_failed_never_ready() {
    let lab = Lab::new();
    let provider = lab.provider("composed-fail");
    let key = ClientKey::new();
    let broken = CloudConfigLayer::new(
        "broken",
        CloudConfig::new()
            .with_file(WriteFile::new("/etc/before.conf", "x\n"))
            .with_runcmd("echo layer-broke >&2; exit 7"),
    )
    .unwrap();
    let composer = Composer::builder(provider.clone())
        .coupled(Arc::new(broken))
        .connector(Arc::new(SshConnector::new(key.ssh_config())))
        .completion(Arc::new(CloudInitStatus::new()))
        .build()
        .unwrap();
    let mut spec = MachineSpec::new(MachineName::new("broken-1").unwrap());
    spec.ssh = Some(key.access("root"));
    let result = composer.provision(&spec, &CancellationToken::new()).await;
    let m = provider.find(&spec.name).await.unwrap().expect("machine");
    assert_eq!(m.phase, Phase::Failed, "{result:?}");
    let message = match result {
        Ok(done) => {
            assert_ne!(
                done.machine.phase,
                Phase::Ready,
                "a failed layer was declared Ready"
            );
            format!("{:?}", done.machine.failure)
        }
        Err(e) => e.to_string(),
    };
    assert!(
        message.contains("Runparts")
            || message.contains("scripts_user")
            || message.contains("scripts-user"),
        "{message}"
    );
    composer
        .deprovision(&spec.name, &CancellationToken::new())
        .await
        .unwrap();
}
