//! The coupled path on the real cloud-init: the layer's cloud-config passes `cloud-init
//! schema`, then goes through cloud-init's four boot stages in the Debian root of
//! bootstrap-cloudinit's tests (their harness, reused), with recording stubs for the
//! package manager, systemctl, sysctl, modprobe and kubeadm (see `stubs`). The recorded
//! kubeadm call and the configuration it was given, parsed back, are exactly what the
//! layer was asked for; cloud-init's own status says the boot succeeded.
//!
//! The RPM family runs in the same Debian root with cloud-init told the distro is
//! `rhel` (`system_info.distro`), so cloud-init's RHEL code drives a stub `dnf`: no RPM
//! root can be fetched here.

#[path = "../../bootstrap-cloudinit/tests/peers/mod.rs"]
mod peers;
mod stubs;

use bootstrap_cloudinit::{Bootstrap, CloudInitStatus, Output};
use bootstrap_kubeadm::config::KubeadmConfig;
use bootstrap_kubeadm::{KUBEADM_CONFIG, KubeadmLayer, KubeadmNode, YUM_REPO};
use machine_core::{
    Completion, CompletionCheck, Machine, MachineName, Phase, ProviderId, SecretString, SizeBasis,
    UserDataDelivery, UserDataFormat,
};
use peers::root::Root;
use recipes::PackageFamily;

const TOKEN: &str = "k8stok.0123456789abcdef";
const CERT_KEY: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
const KEY: &str = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZXhhbXBsZQ==\n-----END PGP PUBLIC KEY BLOCK-----\n";

fn hash() -> String {
    format!("sha256:{}", "5e".repeat(32))
}

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

/// Boots `layer` (after the stubs) for the machine `provider_id`; returns the root and
/// the stub call log.
async fn boot(layer: &KubeadmLayer, provider_id: &str, rpm: bool) -> (Root, String) {
    let pid = ProviderId::new(provider_id).unwrap();
    let coupled = layer.coupled(&pid).unwrap();
    peers::assert_valid_cloud_config(&coupled.render().unwrap());
    let instance = unique("kubeadm");
    boot_as(coupled, &instance, provider_id, rpm).await
}

/// Boots the coupled layer `coupled` (after the stubs) as instance `instance`.
async fn boot_as(
    coupled: bootstrap_cloudinit::CloudConfigLayer,
    instance: &str,
    provider_id: &str,
    rpm: bool,
) -> (Root, String) {
    let pid = ProviderId::new(provider_id).unwrap();
    // The chroot's PATH is /usr/sbin:/usr/bin:/sbin:/bin: stubs in /usr/sbin come first.
    let built = Bootstrap::new("node", vec![stubs::fixture("/usr/sbin"), coupled])
        .unwrap()
        .output(Output::Multipart)
        .build(
            &UserDataDelivery::new(
                64 * 1024,
                SizeBasis::Raw,
                vec![UserDataFormat::CloudConfig, UserDataFormat::Mime],
            )
            .with_gzip(true),
        )
        .unwrap();
    let root = Root::new(&built.user_data.bytes, instance);
    if rpm {
        std::fs::write(
            root.upper("/etc/cloud/cloud.cfg.d/95-rpm-family.cfg"),
            "system_info:\n  distro: rhel\n",
        )
        .unwrap();
    }
    root.boot();
    let machine = Machine::new(MachineName::new("node").unwrap(), pid, Phase::Provisioned);
    let status = CloudInitStatus::new().check(&machine, &root).await.unwrap();
    let calls = std::fs::read_to_string(root.upper(stubs::CALLS)).unwrap_or_default();
    assert_eq!(
        status,
        Completion::Done,
        "cloud-init did not finish cleanly; calls:\n{calls}"
    );
    (root, calls)
}

/// The one kubeadm call and the configuration it read, parsed.
fn kubeadm_call(root: &Root, calls: &str) -> (String, KubeadmConfig) {
    let kubeadm = stubs::calls_of(calls, "kubeadm");
    assert_eq!(kubeadm.len(), 1, "kubeadm ran once:\n{calls}");
    assert_eq!(
        root.mode(KUBEADM_CONFIG),
        0o600,
        "the config holds the token"
    );
    let config = KubeadmConfig::parse(&root.read("/var/log/kubeadm.config.1")).unwrap();
    (kubeadm[0].to_owned(), config)
}

/// `calls` has `first` before `then` (each a line's prefix).
fn ordered(calls: &str, first: &str, then: &str) {
    let at = |p: &str| {
        calls
            .lines()
            .position(|l| l.starts_with(p))
            .unwrap_or_else(|| panic!("no call {p:?} in:\n{calls}"))
    };
    assert!(
        at(first) < at(then),
        "{first:?} must come before {then:?}:\n{calls}"
    );
}

fn apt_checks(calls: &str) {
    let install = "apt-get --option=Dpkg::Options::=--force-confold --option=Dpkg::options::=--force-unsafe-io --assume-yes --quiet install containerd kubelet=1.31.4-1.1 kubeadm=1.31.4-1.1 kubectl=1.31.4-1.1";
    assert!(
        calls.lines().any(|l| l == install),
        "no {install:?} in:\n{calls}"
    );
    ordered(calls, install, "apt-mark hold kubelet kubeadm kubectl");
    ordered(calls, "apt-mark hold", "systemctl enable kubelet");
    ordered(calls, "systemctl enable kubelet", "kubeadm ");
    assert!(
        calls.contains("modprobe overlay")
            || calls.contains("modprobe br_netfilter")
            || calls.contains("sysctl -q -p /etc/sysctl.d/99-kubernetes-cri.conf"),
        "{calls}"
    );
}

#[tokio::test]
async fn init_on_debian_runs_kubeadm_init_with_the_config_asked_for() {
    let layer = KubeadmNode::init("1.31.4", "cp.example.com:6443", SecretString::from(TOKEN))
        .with_apt_key(KEY)
        .with_certificate_key(SecretString::from(CERT_KEY))
        .with_label("pool", "control")
        .layer("kubernetes")
        .unwrap();
    let pid = "redfish://bmc-1/Systems/1";
    let (root, calls) = boot(&layer, pid, false).await;
    let (call, config) = kubeadm_call(&root, &calls);
    assert_eq!(
        call,
        "kubeadm init --config /etc/kubernetes/machine-kubeadm.yaml --upload-certs"
    );
    assert_eq!(
        config,
        layer.config(&ProviderId::new(pid).unwrap()).unwrap()
    );
    let KubeadmConfig::Init(init, cluster) = &config else {
        panic!("{config:?}")
    };
    assert_eq!(init.bootstrap_tokens[0].token.0, TOKEN);
    assert_eq!(cluster.kubernetes_version, "v1.31.4");
    assert_eq!(
        init.node_registration.kubelet_extra_args.pairs()[0],
        ("provider-id".to_owned(), pid.to_owned())
    );
    apt_checks(&calls);
    assert!(
        root.read("/etc/apt/sources.list.d/kubernetes.list")
            == "deb [signed-by=/etc/apt/keyrings/kubernetes.asc] https://pkgs.k8s.io/core:/stable:/v1.31/deb/ /\n"
    );
    assert!(
        root.read("/etc/containerd/config.toml")
            .contains("SystemdCgroup = true")
    );
}

#[tokio::test]
async fn control_plane_join_on_debian_runs_kubeadm_join_with_the_certificate_key() {
    let layer = KubeadmNode::control_plane_join(
        "1.31.4",
        "cp.example.com:6443",
        SecretString::from(TOKEN),
        hash(),
        SecretString::from(CERT_KEY),
    )
    .with_apt_key(KEY)
    .layer("kubernetes")
    .unwrap();
    let pid = "redfish://bmc-2/Systems/1";
    let (root, calls) = boot(&layer, pid, false).await;
    let (call, config) = kubeadm_call(&root, &calls);
    assert_eq!(
        call,
        "kubeadm join --config /etc/kubernetes/machine-kubeadm.yaml"
    );
    assert_eq!(
        config,
        layer.config(&ProviderId::new(pid).unwrap()).unwrap()
    );
    let KubeadmConfig::Join(join) = &config else {
        panic!("{config:?}")
    };
    assert_eq!(
        join.control_plane.as_ref().unwrap().certificate_key.0,
        CERT_KEY
    );
    assert_eq!(join.discovery.bootstrap_token.ca_cert_hashes, [hash()]);
    apt_checks(&calls);
}

#[tokio::test]
async fn worker_on_debian_runs_kubeadm_join_with_labels_taints_and_provider_id() {
    let layer = KubeadmNode::worker(
        "1.31.4",
        "10.0.0.10:6443",
        SecretString::from(TOKEN),
        hash(),
    )
    .with_apt_key(KEY)
    .with_label("pool", "general")
    .with_taint("dedicated", Some("batch"), "NoSchedule")
    .with_kubelet_arg("max-pods", "110")
    .layer("kubernetes")
    .unwrap();
    let pid = "aws:///eu-west-1a/i-0abc";
    let (root, calls) = boot(&layer, pid, false).await;
    let (call, config) = kubeadm_call(&root, &calls);
    assert_eq!(
        call,
        "kubeadm join --config /etc/kubernetes/machine-kubeadm.yaml"
    );
    assert_eq!(
        config,
        layer.config(&ProviderId::new(pid).unwrap()).unwrap()
    );
    assert_eq!(
        config.node_registration().kubelet_extra_args.pairs(),
        [
            ("provider-id".to_owned(), pid.to_owned()),
            ("node-labels".to_owned(), "pool=general".to_owned()),
            ("max-pods".to_owned(), "110".to_owned()),
        ]
    );
    apt_checks(&calls);
}

#[tokio::test]
async fn worker_on_the_rpm_family_installs_with_dnf_from_the_yum_repository() {
    let layer = KubeadmNode::worker(
        "1.30.8",
        "10.0.0.10:6443",
        SecretString::from(TOKEN),
        hash(),
    )
    .with_family(PackageFamily::Dnf)
    .with_rpm_key(KEY)
    .with_label("pool", "rpm")
    .layer("kubernetes")
    .unwrap();
    let pid = "aws:///eu-west-1b/i-0def";
    let (root, calls) = boot(&layer, pid, true).await;
    let (call, config) = kubeadm_call(&root, &calls);
    assert_eq!(
        call,
        "kubeadm join --config /etc/kubernetes/machine-kubeadm.yaml"
    );
    assert_eq!(
        config,
        layer.config(&ProviderId::new(pid).unwrap()).unwrap()
    );
    assert!(matches!(&config, KubeadmConfig::Join(j) if j.api_version == "kubeadm.k8s.io/v1beta3"));
    assert!(stubs::calls_of(&calls, "apt-get").is_empty(), "{calls}");
    let install = stubs::calls_of(&calls, "dnf")
        .into_iter()
        .find(|l| l.contains(" install "))
        .unwrap_or_else(|| panic!("no dnf install in:\n{calls}"))
        .to_owned();
    for p in [
        "containerd",
        "kubelet-1.30.8",
        "kubeadm-1.30.8",
        "kubectl-1.30.8",
    ] {
        assert!(install.split(' ').any(|a| a == p), "{p} not in {install:?}");
    }
    ordered(&calls, &install, "kubeadm ");
    let repo = root.read(YUM_REPO);
    assert!(
        repo.contains("baseurl=https://pkgs.k8s.io/core:/stable:/v1.30/rpm/\n"),
        "{repo}"
    );
    assert!(
        repo.contains("gpgcheck=1\ngpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-kubernetes\n"),
        "{repo}"
    );
    assert_eq!(root.read("/etc/pki/rpm-gpg/RPM-GPG-KEY-kubernetes"), KEY);
}

#[tokio::test]
async fn a_provider_id_known_only_on_the_machine_is_rendered_by_cloud_init_from_instance_data() {
    let layer = KubeadmNode::worker(
        "1.31.4",
        "10.0.0.10:6443",
        SecretString::from(TOKEN),
        hash(),
    )
    .with_apt_key(KEY)
    .layer("kubernetes")
    .unwrap();
    for bad in [
        "sim:///i-1",
        "sim:///{{ v1.instance_id }}\n",
        "{{ v1.instance_id }}",
        "sim:///{% if 1 %}x{% endif %}",
        "sim:///'{{ v1.instance_id }}'",
    ] {
        assert_eq!(
            layer.coupled_from_instance_data(bad).unwrap_err().field(),
            Some("kubeadm.providerIdTemplate"),
            "{bad:?}"
        );
    }
    let coupled = layer
        .coupled_from_instance_data("sim:///{{ v1.instance_id }}")
        .unwrap();
    let instance = unique("kubeadm");
    let pid = format!("sim:///{instance}");
    let (root, calls) = boot_as(coupled, &instance, &pid, false).await;
    let (call, config) = kubeadm_call(&root, &calls);
    assert_eq!(
        call,
        "kubeadm join --config /etc/kubernetes/machine-kubeadm.yaml"
    );
    // cloud-init filled in the machine's own instance ID.
    assert_eq!(
        config,
        layer.config(&ProviderId::new(&pid).unwrap()).unwrap()
    );
    apt_checks(&calls);
}

#[tokio::test]
async fn a_failed_step_stops_before_kubeadm_and_fails_the_boot_as_cloud_init_reports_it() {
    let layer = KubeadmNode::worker(
        "1.31.4",
        "10.0.0.10:6443",
        SecretString::from(TOKEN),
        hash(),
    )
    .with_apt_key(KEY)
    .layer("kubernetes")
    .unwrap();
    let pid = ProviderId::new("sim:///fail-1").unwrap();
    let built = Bootstrap::new(
        "node",
        vec![stubs::fixture("/usr/sbin"), layer.coupled(&pid).unwrap()],
    )
    .unwrap()
    .output(Output::Multipart)
    .build(
        &UserDataDelivery::new(
            64 * 1024,
            SizeBasis::Raw,
            vec![UserDataFormat::CloudConfig, UserDataFormat::Mime],
        )
        .with_gzip(true),
    )
    .unwrap();
    let root = Root::new(&built.user_data.bytes, &unique("kubeadm-fail"));
    // The machine's systemctl fails (its stub is told so before boot).
    std::fs::write(root.upper("/etc/stub-fail-systemctl"), "1\n").unwrap();
    root.boot();
    let machine = Machine::new(MachineName::new("node").unwrap(), pid, Phase::Provisioned);
    let status = CloudInitStatus::new().check(&machine, &root).await.unwrap();
    let calls = std::fs::read_to_string(root.upper(stubs::CALLS)).unwrap();
    assert!(
        calls.contains("systemctl enable kubelet\n"),
        "the failing step ran:\n{calls}"
    );
    assert!(
        stubs::calls_of(&calls, "kubeadm").is_empty(),
        "kubeadm ran after a failed step:\n{calls}"
    );
    assert!(
        matches!(status, Completion::Failed(_)),
        "a failed step must fail the boot: {status:?}"
    );
}
