//! The decoupled path over real SSH, against provider-local machines (the `tests`
//! crate's lab: a Debian root booted with its own sshd on a bridge of the test's own).
//! Recording stubs (see `stubs`) stand in for the package manager, systemctl, sysctl,
//! modprobe and kubeadm.
//!
//! The link is cut right after `kubeadm join` has joined and before its step is
//! recorded: the run fails; the rerun once the link is back skips every recorded step
//! and finds the node joined ([`bootstrap_kubeadm::KUBELET_CONF`]), so kubeadm is called
//! once in all, as are the package manager's install; a rerun with the layer's state
//! file gone calls kubeadm no more, nor does a new layer value with another version,
//! which installs the packages at the new pins.

mod stubs;

use std::sync::Arc;
use std::time::Duration;

use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, CloudInitStatus, WriteFile};
use bootstrap_kubeadm::config::KubeadmConfig;
use bootstrap_kubeadm::{KUBEADM_CONFIG, KubeadmNode};
use machine_core::{
    CancellationToken, Composer, ComposerSettings, MachineName, MachineSpec, Phase, SecretString,
};
use tests::{ClientKey, Lab};

const TOKEN: &str = "k8stok.0123456789abcdef";
const KEY: &str = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZXhhbXBsZQ==\n-----END PGP PUBLIC KEY BLOCK-----\n";

fn ip(args: &[&str]) {
    let ok = std::process::Command::new("ip")
        .args(args)
        .status()
        .expect("ip is missing: apt-get install iproute2");
    assert!(ok.success(), "ip {args:?}");
}

/// Holds the stub kubeadm for 8 s after it joined, so the link can be cut then.
fn hold_kubeadm() -> CloudConfigLayer {
    CloudConfigLayer::new(
        "hold",
        CloudConfig::new().with_file(WriteFile::new("/etc/kubeadm-stub-sleep", "8\n")),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_cut_after_join_and_reruns_never_run_kubeadm_join_twice() {
    let lab = Lab::new();
    let provider = lab.provider("kubeadm");
    let key = ClientKey::new();
    let layer = Arc::new(
        KubeadmNode::worker(
            "1.31.4",
            "10.0.0.10:6443",
            SecretString::from(TOKEN),
            format!("sha256:{}", "5e".repeat(32)),
        )
        .with_apt_key(KEY)
        .with_label("pool", "general")
        .layer("kubernetes")
        .unwrap(),
    );
    let mut settings = ComposerSettings::default().with_poll_interval(Duration::from_millis(200));
    settings.deadlines.bootstrap = Duration::from_secs(25);
    let composer = |settings: ComposerSettings| {
        Composer::builder(provider.clone())
            .settings(settings)
            // sshd's PATH for root has /usr/local/sbin first.
            .coupled(Arc::new(stubs::fixture("/usr/local/sbin")))
            .coupled(Arc::new(hold_kubeadm()))
            .decoupled(layer.clone())
            .connector(key.connector())
            .completion(Arc::new(CloudInitStatus::new()))
            .build()
            .unwrap()
    };
    let name = MachineName::new("kubeadm-1").unwrap();
    let mut spec = MachineSpec::new(name.clone());
    spec.ssh = Some(key.access("root"));
    let dir = provider.machine_dir(&name);
    let upper = |p: &str| dir.join("upper").join(p.trim_start_matches('/'));

    let run = {
        let (composer, spec) = (Arc::new(composer(settings.clone())), spec.clone());
        tokio::spawn(async move { composer.provision(&spec, &CancellationToken::new()).await })
    };
    // Cut the link once kubeadm has joined (the stub wrote the kubelet's credentials)
    // and is still running, so its step is not recorded.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    while !upper("/etc/kubernetes/kubelet.conf").exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "kubeadm never ran; calls: {:?}",
            std::fs::read_to_string(upper(stubs::CALLS))
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("state.json")).unwrap()).unwrap();
    let veth = format!("{}h{}", lab.bridge, state["slot"]);
    ip(&["link", "set", &veth, "down"]);
    let first = run.await.unwrap();
    assert!(
        first.is_err(),
        "a run whose link was cut succeeded: {first:?}"
    );
    ip(&["link", "set", &veth, "up"]);

    let calls = || std::fs::read_to_string(upper(stubs::CALLS)).unwrap();
    let count = |text: &str, prefix: &str| text.lines().filter(|l| l.starts_with(prefix)).count();
    let installs = "apt-get --option=Dpkg::Options::=--force-confold --option=Dpkg::options::=--force-unsafe-io --assume-yes --quiet install ";
    let before = calls();
    assert_eq!(count(&before, "kubeadm "), 1, "{before}");

    let composer = composer(settings);
    let done = composer
        .provision(&spec, &CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("the rerun failed: {e}"));
    assert_eq!(done.machine.phase, Phase::Ready);
    let after = calls();
    assert_eq!(count(&after, "kubeadm "), 1, "kubeadm ran again:\n{after}");
    assert_eq!(
        count(&after, installs),
        1,
        "a recorded step ran again:\n{after}"
    );
    assert!(
        after.contains(&format!(
            "{installs}containerd kubelet=1.31.4-1.1 kubeadm=1.31.4-1.1 kubectl=1.31.4-1.1\n"
        )),
        "{after}"
    );
    assert!(after.contains("kubeadm join --config /etc/kubernetes/machine-kubeadm.yaml\n"));

    // What kubeadm was given: the machine's own provider ID, from the Machine.
    let config =
        KubeadmConfig::parse(&std::fs::read_to_string(upper("/var/log/kubeadm.config.1")).unwrap())
            .unwrap();
    assert_eq!(config, layer.config(&done.machine.provider_id).unwrap());
    assert_eq!(
        config.node_registration().kubelet_extra_args.pairs()[0],
        (
            "provider-id".to_owned(),
            done.machine.provider_id.to_string()
        )
    );
    let mode = key
        .run(&done.machine, &format!("stat -c %a {KUBEADM_CONFIG}"))
        .await;
    assert_eq!(mode.trim(), "600");

    // A rerun with the state file gone runs every step again but kubeadm, which is
    // guarded by the kubelet's credentials.
    let state_file = layer.state_path().unwrap();
    key.run(&done.machine, &format!("rm {state_file}")).await;
    let again = composer
        .provision(&spec, &CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("the rerun without state failed: {e}"));
    assert_eq!(again.machine.phase, Phase::Ready);
    let last = calls();
    assert_eq!(count(&last, "kubeadm "), 1, "kubeadm ran again:\n{last}");
    assert_eq!(
        count(&last, installs),
        2,
        "the packages step ran again (nothing is installed for real):\n{last}"
    );

    // Upgrading is a new layer value: the packages at the new pins (released from
    // their hold first), kubeadm not again.
    let upgraded = Arc::new(
        KubeadmNode::worker(
            "1.32.0",
            "10.0.0.10:6443",
            SecretString::from(TOKEN),
            format!("sha256:{}", "5e".repeat(32)),
        )
        .with_apt_key(KEY)
        .with_label("pool", "general")
        .layer("kubernetes")
        .unwrap(),
    );
    let upgrade = Composer::builder(provider.clone())
        .coupled(Arc::new(stubs::fixture("/usr/local/sbin")))
        .coupled(Arc::new(hold_kubeadm()))
        .decoupled(upgraded.clone())
        .connector(key.connector())
        .completion(Arc::new(CloudInitStatus::new()))
        .build()
        .unwrap();
    let up = upgrade
        .provision(&spec, &CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("the upgrade failed: {e}"));
    assert_eq!(up.machine.phase, Phase::Ready);
    let upgraded_calls = calls();
    let new_part = &upgraded_calls[last.len()..];
    let unhold = new_part
        .find("apt-mark unhold kubelet kubeadm kubectl\n")
        .unwrap_or_else(|| panic!("no unhold in:\n{new_part}"));
    let install = new_part
        .find(&format!(
            "{installs}containerd kubelet=1.32.0-1.1 kubeadm=1.32.0-1.1 kubectl=1.32.0-1.1\n"
        ))
        .unwrap_or_else(|| panic!("no install of 1.32.0 in:\n{new_part}"));
    let hold = new_part
        .find("apt-mark hold kubelet kubeadm kubectl\n")
        .unwrap_or_else(|| panic!("no hold in:\n{new_part}"));
    assert!(unhold < install && install < hold, "{new_part}");
    assert_eq!(
        count(&upgraded_calls, "kubeadm "),
        1,
        "kubeadm ran again:\n{upgraded_calls}"
    );

    composer
        .deprovision(&name, &CancellationToken::new())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rpm_family_over_ssh_writes_the_yum_repository_and_installs_with_dnf() {
    let lab = Lab::new();
    let provider = lab.provider("kubeadm-rpm");
    let key = ClientKey::new();
    let layer = Arc::new(
        KubeadmNode::control_plane_join(
            "1.30.8",
            "cp.example.com:6443",
            SecretString::from(TOKEN),
            format!("sha256:{}", "5e".repeat(32)),
            SecretString::from("0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"),
        )
        .with_family(recipes::PackageFamily::Dnf)
        .with_rpm_key(KEY)
        .layer("kubernetes")
        .unwrap(),
    );
    let composer = Composer::builder(provider.clone())
        .coupled(Arc::new(stubs::fixture("/usr/local/sbin")))
        .decoupled(layer.clone())
        .connector(key.connector())
        .completion(Arc::new(CloudInitStatus::new()))
        .build()
        .unwrap();
    let name = MachineName::new("kubeadm-rpm").unwrap();
    let mut spec = MachineSpec::new(name.clone());
    spec.ssh = Some(key.access("root"));
    let done = composer
        .provision(&spec, &CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("provision: {e}"));
    assert_eq!(done.machine.phase, Phase::Ready);
    let out = key
        .run(
            &done.machine,
            &format!(
                "cat {}; echo ==; cat {}",
                bootstrap_kubeadm::YUM_REPO,
                stubs::CALLS
            ),
        )
        .await;
    let (repo, calls) = out.split_once("==\n").unwrap();
    assert!(
        repo.contains("baseurl=https://pkgs.k8s.io/core:/stable:/v1.30/rpm/\n"),
        "{repo}"
    );
    assert!(stubs::calls_of(calls, "apt-get").is_empty(), "{calls}");
    assert!(stubs::calls_of(calls, "apt-mark").is_empty(), "{calls}");
    assert!(
        calls.contains("dnf -y install containerd kubelet-1.30.8 kubeadm-1.30.8 kubectl-1.30.8\n"),
        "{calls}"
    );
    assert_eq!(
        stubs::calls_of(calls, "kubeadm"),
        ["kubeadm join --config /etc/kubernetes/machine-kubeadm.yaml"]
    );
    let config = KubeadmConfig::parse(
        &key.run(&done.machine, "cat /var/log/kubeadm.config.1")
            .await,
    )
    .unwrap();
    assert_eq!(config, layer.config(&done.machine.provider_id).unwrap());
    composer
        .deprovision(&name, &CancellationToken::new())
        .await
        .unwrap();
}

/// Makes the stub kubeadm take `seconds` before it joins: a join in progress that long.
fn slow_join(seconds: u32) -> CloudConfigLayer {
    CloudConfigLayer::new(
        "slow-join",
        CloudConfig::new().with_file(WriteFile::new(
            "/etc/kubeadm-stub-pre",
            format!("{seconds}\n"),
        )),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuts_in_the_middle_of_a_join_give_exactly_one_join() {
    let lab = Lab::new();
    let provider = lab.provider("kubeadm-cut");
    let key = ClientKey::new();
    let layer = Arc::new(
        KubeadmNode::worker(
            "1.31.4",
            "10.0.0.10:6443",
            SecretString::from(TOKEN),
            format!("sha256:{}", "5e".repeat(32)),
        )
        .with_apt_key(KEY)
        .layer("kubernetes")
        .unwrap(),
    );
    // A cut is noticed within about 3 s, so the composer's own retries reconnect
    // while the join still runs (or once it has finished, for a long cut).
    let connector = key.connector_with(|c| c.with_keepalive(Duration::from_secs(1), 2));
    let mut settings = ComposerSettings::default().with_poll_interval(Duration::from_millis(200));
    settings.deadlines.bootstrap = Duration::from_secs(120);
    let composer = Arc::new(
        Composer::builder(provider.clone())
            .settings(settings)
            .coupled(Arc::new(stubs::fixture("/usr/local/sbin")))
            .coupled(Arc::new(slow_join(10)))
            .decoupled(layer.clone())
            .connector(connector)
            .completion(Arc::new(CloudInitStatus::new()))
            .build()
            .unwrap(),
    );
    let name = MachineName::new("kubeadm-cut").unwrap();
    let mut spec = MachineSpec::new(name.clone());
    spec.ssh = Some(key.access("root"));
    let dir = provider.machine_dir(&name);
    let upper = |p: &str| dir.join("upper").join(p.trim_start_matches('/'));
    let read = |p: &str| std::fs::read_to_string(upper(p)).unwrap_or_default();
    let count = |text: &str, prefix: &str| text.lines().filter(|l| l.starts_with(prefix)).count();

    // (seconds into the 10 s join, seconds the link stays down): early, with the join
    // still running at the reconnect (the rerun waits for it); long enough that the
    // join ends while the link is down (the rerun takes over its outcome); late.
    let mut machine = None;
    for (round, (into, down)) in [(0.2, 5.0), (4.0, 12.0), (8.0, 5.0)]
        .into_iter()
        .enumerate()
    {
        if let Some(m) = &machine {
            // Unjoin the node: the guard's credentials, the layer's record, the logs.
            key.run(
                m,
                &format!(
                    "rm -f /etc/kubernetes/kubelet.conf {} /var/log/kubeadm.joined && : > {}",
                    layer.state_path().unwrap(),
                    stubs::CALLS
                ),
            )
            .await;
        }
        let run = {
            let (composer, spec) = (composer.clone(), spec.clone());
            tokio::spawn(async move { composer.provision(&spec, &CancellationToken::new()).await })
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
        while count(&read(stubs::CALLS), "kubeadm ") == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "round {round}: kubeadm never ran; calls: {}",
                read(stubs::CALLS)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_secs_f64(into)).await;
        assert!(
            read("/var/log/kubeadm.joined").is_empty(),
            "round {round}: cut too late"
        );
        let state: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("state.json")).unwrap()).unwrap();
        let veth = format!("{}h{}", lab.bridge, state["slot"]);
        ip(&["link", "set", &veth, "down"]);
        tokio::time::sleep(Duration::from_secs_f64(down)).await;
        ip(&["link", "set", &veth, "up"]);
        let done = run
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("round {round}: the provision failed: {e}"));
        assert_eq!(done.machine.phase, Phase::Ready);
        let calls = read(stubs::CALLS);
        assert_eq!(
            count(&calls, "kubeadm "),
            1,
            "round {round} (cut {into} s into the join, down {down} s): kubeadm ran again:\n{calls}"
        );
        assert_eq!(read("/var/log/kubeadm.joined"), "joined\n", "round {round}");
        machine = Some(done.machine);
    }
    composer
        .deprovision(&name, &CancellationToken::new())
        .await
        .unwrap();
}
