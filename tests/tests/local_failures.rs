//! A failing step in any layer makes the machine Failed with that step's message,
//! whatever the completion check; it is never declared Ready.

use std::sync::Arc;

use bootstrap_cloudinit::{CloudInitStatus, PhoneHomeCheck, PhoneHomeListener};
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    CancellationToken, Completion, CompletionCheck, Composer, MachineName, MachineProvisioner,
    MachineSpec, Phase, SentinelFile,
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
    provision_failing_then(lab, owner, coupled, completion, async {}).await
}

/// As [`provision_failing`], awaiting `before_delete` before the machine is deleted.
async fn provision_failing_then(
    lab: &Lab,
    owner: &str,
    coupled: bool,
    completion: Arc<dyn CompletionCheck>,
    before_delete: impl std::future::Future<Output = ()>,
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
    before_delete.await;
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
async fn a_failing_coupled_step_with_the_phone_home_check_is_never_ready() {
    let lab = Lab::new();
    // Every address of the host, so the machine reaches it at the bridge's gateway.
    let listener = Arc::new(
        PhoneHomeListener::bind("0.0.0.0:0".parse().unwrap())
            .await
            .expect("phone-home listener"),
    );
    let check = PhoneHomeCheck::new(listener.clone(), lab.gateway().to_string());
    // The provider may see cloud-init's failure before the post arrives; the post must
    // still come, with the failure, before the machine goes.
    let posted = async {
        for _ in 0..300 {
            if listener.report_by_hostname("phone-1").is_some() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    let (said, phase) = provision_failing_then(&lab, "phone", true, Arc::new(check), posted).await;
    assert_eq!(phase, Phase::Failed, "{said}");
    assert!(said.contains("broken.sh"), "{said}");
    let report = listener
        .report_by_hostname("phone-1")
        .unwrap_or_else(|| panic!("the machine never phoned home; the composer said: {said}"));
    match report.verdict() {
        Some(Completion::Failed(why)) => assert!(why.contains("broken.sh"), "{why}"),
        other => panic!("the post's verdict is {other:?}, not Failed: {report:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_decoupled_step_fails_with_the_steps_own_message() {
    let lab = Lab::new();
    let (said, _) =
        provision_failing(&lab, "decoupled", false, Arc::new(CloudInitStatus::new())).await;
    assert!(said.contains("step-broke-here"), "{said}");
}

/// Which of the marker files `names` exist in /etc on `machine`, read over SSH.
async fn markers_present(
    key: &ClientKey,
    machine: &machine_core::Machine,
    names: &[&str],
) -> Vec<String> {
    let listing = key
        .run(machine, "cd /etc && ls -1 -- *.marker 2>/dev/null || true")
        .await;
    names
        .iter()
        .filter(|n| listing.lines().any(|l| l == format!("{n}.marker")))
        .map(|n| n.to_string())
        .collect()
}

fn marker(name: &str) -> Step {
    Step::write_file(format!("/etc/{name}.marker"), format!("{name}\n"))
}

/// How a layer joins the composer.
enum Role {
    Coupled,
    Decoupled,
}

/// A layer of three steps whose middle one fails.
fn broken() -> Vec<Step> {
    vec![
        marker("broken-before"),
        Step::run("echo step-broke-here >&2; exit 9"),
        marker("broken-after"),
    ]
}

/// Provisions one machine with `layers` (one of them failing), asserts it ends Failed,
/// and returns what the composer said and which of `markers` are on the machine.
async fn fail_and_read_markers(
    owner: &str,
    layers: Vec<(Role, &str, Vec<Step>)>,
    markers: &[&str],
) -> (String, Vec<String>) {
    let lab = Lab::new();
    let provider = lab.provider(owner);
    let key = ClientKey::new();
    let mut builder = Composer::builder(provider.clone())
        .connector(key.connector())
        .completion(Arc::new(CloudInitStatus::new()));
    for (role, name, steps) in layers {
        let layer = Arc::new(StepLayer::new(name, steps).unwrap());
        builder = match role {
            Role::Coupled => builder.coupled(layer),
            Role::Decoupled => builder.decoupled(layer),
        };
    }
    let composer = builder.build().unwrap();
    let mut spec = MachineSpec::new(MachineName::new(format!("{owner}-1")).unwrap());
    spec.ssh = Some(key.access("root"));

    let said = match composer.provision(&spec, &CancellationToken::new()).await {
        Ok(done) => {
            assert_eq!(done.machine.phase, Phase::Failed, "{:?}", done.machine);
            format!("{:?}", done.machine.failure)
        }
        Err(e) => e.to_string(),
    };
    let machine = provider
        .find(&spec.name)
        .await
        .unwrap()
        .expect("the machine stays for inspection");
    let present = markers_present(&key, &machine, markers).await;
    composer
        .deprovision(&spec.name, &CancellationToken::new())
        .await
        .unwrap();
    (said, present)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_decoupled_step_stops_its_layer_and_the_later_ones_and_keeps_what_ran_before() {
    let (said, present) = fail_and_read_markers(
        "mixedfail",
        vec![
            (Role::Coupled, "base", vec![marker("coupled-base")]),
            (Role::Decoupled, "first", vec![marker("decoupled-first")]),
            (Role::Decoupled, "broken", broken()),
            (Role::Decoupled, "later", vec![marker("decoupled-later")]),
        ],
        &[
            "coupled-base",
            "decoupled-first",
            "broken-before",
            "broken-after",
            "decoupled-later",
        ],
    )
    .await;
    assert!(
        said.contains("broken") && said.contains("step-broke-here"),
        "names the layer and the step's stderr: {said}"
    );
    // What is on the machine is exactly what ran before the failure.
    assert_eq!(
        present,
        ["coupled-base", "decoupled-first", "broken-before"],
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_coupled_step_stops_its_own_layer_but_cloud_init_still_runs_the_other_layers() {
    let (said, present) = fail_and_read_markers(
        "coupledfail",
        vec![
            (Role::Coupled, "base", vec![marker("coupled-base")]),
            (Role::Coupled, "broken", broken()),
            (Role::Coupled, "later", vec![marker("coupled-later")]),
            (Role::Decoupled, "never", vec![marker("decoupled-never")]),
        ],
        &[
            "coupled-base",
            "broken-before",
            "broken-after",
            "coupled-later",
            "decoupled-never",
        ],
    )
    .await;
    assert!(said.contains("broken"), "names the failed layer: {said}");
    // cloud-init runs every part's script and reports the failed ones; a failed coupled
    // layer stops at its failing step, the other coupled layers still run, and no
    // decoupled layer starts on a machine whose bootstrap failed.
    assert_eq!(
        present,
        ["coupled-base", "broken-before", "coupled-later"],
        "{said}"
    );
}
