//! Nothing is left behind by a test process that was killed: the next lab sweeps the
//! machines, bridge and run directory of a lab whose process is gone.

use std::process::Command;

use machine_core::{MachineName, MachineProvisioner, MachineSpec, Phase};
use tests::{LAB_FILE, Lab};

fn link_exists(name: &str) -> bool {
    Command::new("ip")
        .args(["link", "show", name])
        .output()
        .expect("ip is missing: apt-get install iproute2")
        .status
        .success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lab_of_a_killed_test_process_is_swept_by_the_next() {
    let orphan = Lab::new();
    let provider = orphan.provider("killed");
    let spec = MachineSpec::new(MachineName::new("left-1").unwrap());
    let m = provider.create(&spec, None).await.expect("create");
    assert_ne!(m.phase, Phase::Failed, "{m:?}");
    let pid_file = provider.machine_dir(&spec.name).join("state.json");
    assert!(
        pid_file.exists(),
        "no machine record at {}",
        pid_file.display()
    );

    // The process that made it dies without running Drop: a PID that is gone.
    let mut gone = Command::new("true").spawn().expect("true");
    let dead_pid = gone.id();
    gone.wait().expect("true exited");
    let (bridge, run_dir, subnet) = (
        orphan.bridge.clone(),
        orphan.run_dir.clone(),
        orphan.subnet.clone(),
    );
    std::fs::write(run_dir.join(LAB_FILE), format!("{dead_pid} {subnet}\n")).unwrap();
    std::mem::forget(orphan);
    drop(provider);
    assert!(link_exists(&bridge), "the orphan lab's bridge is not up");

    let _next = Lab::new();
    assert!(
        !run_dir.exists(),
        "the killed process's run directory {} is still there",
        run_dir.display()
    );
    assert!(
        !link_exists(&bridge),
        "the killed process's bridge {bridge} is still there"
    );
}
