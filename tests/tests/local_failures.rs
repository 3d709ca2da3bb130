//! A failing step in any layer makes the machine Failed with that step's message,
//! whatever the completion check; it is never declared Ready.

use std::sync::Arc;

use bootstrap_cloudinit::CloudInitStatus;
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    CancellationToken, CompletionCheck, Composer, MachineName, MachineProvisioner, MachineSpec,
    Phase, SentinelFile,
};
use tests::{ClientKey, Lab};

/// Provisions one machine with `composer` and returns what the composer said and the
/// machine's phase at the provider afterwards.
async fn provision_failing(
    lab: &Lab,
    owner: &str,
    coupled: bool,
    completion: Arc<dyn CompletionCheck>,
) -> (String, Phase) {
    let provider = lab.provider(owner);
    let key = ClientKey::new();
    let ok = StepLayer::new("aaa-ok", vec![Step::write_file("/etc/ok.conf", "ok\n")]).unwrap();
    let broken = StepLayer::new(
        "broken",
        vec![Step::run("echo step-broke-here >&2; exit 9")],
    )
    .unwrap();
    let b = Composer::builder(provider.clone())
        .connector(key.connector())
        .completion(completion);
    let b = if coupled {
        b.coupled(Arc::new(ok)).coupled(Arc::new(broken))
    } else {
        b.coupled(Arc::new(ok)).decoupled(Arc::new(broken))
    };
    let composer = b.build().unwrap();
    let mut spec = MachineSpec::new(MachineName::new(format!("{owner}-1")).unwrap());
    spec.ssh = Some(key.access("root"));
    let said = match composer.provision(&spec, &CancellationToken::new()).await {
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
    let phase = provider
        .find(&spec.name)
        .await
        .unwrap()
        .expect("machine")
        .phase;
    composer
        .deprovision(&spec.name, &CancellationToken::new())
        .await
        .unwrap();
    (said, phase)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_coupled_step_with_the_sentinel_check_is_never_ready() {
    let lab = Lab::new();
    let (said, phase) =
        provision_failing(&lab, "sentinel", true, Arc::new(SentinelFile::default())).await;
    assert_eq!(phase, Phase::Failed, "{said}");
    // cloud-init's own account names the failed layer's script (behind its index prefix).
    assert!(
        said.contains("Runparts: 1 failures (") && said.contains("broken.sh)"),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_coupled_step_with_the_cloud_init_status_check_is_never_ready() {
    let lab = Lab::new();
    let (said, phase) =
        provision_failing(&lab, "status", true, Arc::new(CloudInitStatus::new())).await;
    assert_eq!(phase, Phase::Failed, "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_decoupled_step_fails_with_the_steps_own_message() {
    let lab = Lab::new();
    let (said, _) =
        provision_failing(&lab, "decoupled", false, Arc::new(CloudInitStatus::new())).await;
    assert!(
        said.contains("step-broke-here") || said.contains("exit"),
        "{said}"
    );
}
