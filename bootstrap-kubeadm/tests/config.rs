//! The kubeadm configuration as rendered: v1beta4 from 1.31 (extra arguments as a list
//! of name/value), v1beta3 before (a map), each role's documents, read back into the
//! typed structs; and bad input refused naming the field, secrets never shown.

use bootstrap_kubeadm::config::{Arg, ExtraArgs, KubeadmConfig, Taint};
use bootstrap_kubeadm::{KubeadmNode, Role};
use machine_core::{ProviderId, SecretString};

const TOKEN: &str = "abcdef.0123456789abcdef";
const CERT_KEY: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
const KEY: &str = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZXhhbXBsZQ==\n-----END PGP PUBLIC KEY BLOCK-----\n";

fn hash() -> String {
    format!("sha256:{}", "ab".repeat(32))
}

fn pid() -> ProviderId {
    ProviderId::new("aws:///eu-west-1a/i-0123").unwrap()
}

fn worker(version: &str) -> KubeadmNode {
    KubeadmNode::worker(version, "10.0.0.10:6443", SecretString::from(TOKEN), hash())
        .with_apt_key(KEY)
        .with_label("pool", "general")
        .with_label("example.com/tier", "web")
        .with_taint("dedicated", Some("web"), "NoSchedule")
        .with_kubelet_arg("max-pods", "110")
}

#[test]
fn v1beta4_from_1_31_has_extra_args_as_a_list() {
    let layer = worker("1.31.4").layer("k8s").unwrap();
    let text = layer.config(&pid()).unwrap().render().unwrap();
    assert!(
        text.contains("apiVersion: kubeadm.k8s.io/v1beta4"),
        "{text}"
    );
    assert!(text.contains("- name: provider-id\n"), "{text}");
    let back = KubeadmConfig::parse(&text).unwrap();
    let KubeadmConfig::Join(join) = &back else {
        panic!("not a join: {back:?}")
    };
    assert_eq!(join.api_version, "kubeadm.k8s.io/v1beta4");
    assert_eq!(join.kind, "JoinConfiguration");
    assert_eq!(
        join.discovery.bootstrap_token.api_server_endpoint,
        "10.0.0.10:6443"
    );
    assert_eq!(join.discovery.bootstrap_token.token.0, TOKEN);
    assert_eq!(join.discovery.bootstrap_token.ca_cert_hashes, [hash()]);
    assert_eq!(join.control_plane, None);
    assert_eq!(
        join.node_registration.kubelet_extra_args,
        ExtraArgs::List(vec![
            Arg {
                name: "provider-id".into(),
                value: "aws:///eu-west-1a/i-0123".into()
            },
            Arg {
                name: "node-labels".into(),
                value: "example.com/tier=web,pool=general".into()
            },
            Arg {
                name: "max-pods".into(),
                value: "110".into()
            },
        ])
    );
    assert_eq!(
        join.node_registration.taints,
        Some(vec![Taint {
            key: "dedicated".into(),
            value: Some("web".into()),
            effect: "NoSchedule".into()
        }])
    );
    assert_eq!(
        join.node_registration.cri_socket,
        "unix:///var/run/containerd/containerd.sock"
    );
    assert_eq!(
        layer.kubeadm_command(),
        "kubeadm join --config /etc/kubernetes/machine-kubeadm.yaml"
    );
}

#[test]
fn v1beta3_before_1_31_has_extra_args_as_a_map() {
    let text = worker("1.30.8")
        .layer("k8s")
        .unwrap()
        .config(&pid())
        .unwrap()
        .render()
        .unwrap();
    assert!(
        text.contains("apiVersion: kubeadm.k8s.io/v1beta3"),
        "{text}"
    );
    assert!(
        text.contains("provider-id: aws:///eu-west-1a/i-0123"),
        "{text}"
    );
    let back = KubeadmConfig::parse(&text).unwrap();
    let args = &back.node_registration().kubelet_extra_args;
    let ExtraArgs::Map(map) = args else {
        panic!("v1beta3 takes a map: {args:?}")
    };
    assert_eq!(map["provider-id"], "aws:///eu-west-1a/i-0123");
    assert_eq!(map["node-labels"], "example.com/tier=web,pool=general");
    assert_eq!(map["max-pods"], "110");
}

#[test]
fn init_has_both_documents_and_control_plane_join_the_certificate_key() {
    let init = KubeadmNode::init("1.31.4", "cp.example.com:6443", SecretString::from(TOKEN))
        .with_apt_key(KEY)
        .with_certificate_key(SecretString::from(CERT_KEY))
        .layer("k8s")
        .unwrap();
    assert_eq!(init.role(), Role::ControlPlaneInit);
    let KubeadmConfig::Init(i, c) = init.config(&pid()).unwrap() else {
        panic!("not init")
    };
    assert_eq!(i.kind, "InitConfiguration");
    assert_eq!(i.bootstrap_tokens[0].token.0, TOKEN);
    assert_eq!(i.certificate_key.as_ref().unwrap().0, CERT_KEY);
    assert_eq!(
        i.node_registration.taints, None,
        "kubeadm's default control-plane taint stays"
    );
    assert_eq!(
        (c.kind.as_str(), c.kubernetes_version.as_str()),
        ("ClusterConfiguration", "v1.31.4")
    );
    assert_eq!(c.control_plane_endpoint, "cp.example.com:6443");
    assert_eq!(
        init.kubeadm_command(),
        "kubeadm init --config /etc/kubernetes/machine-kubeadm.yaml --upload-certs"
    );
    let text = init.config(&pid()).unwrap().render().unwrap();
    assert_eq!(
        KubeadmConfig::parse(&text).unwrap(),
        init.config(&pid()).unwrap()
    );

    let cp = KubeadmNode::control_plane_join(
        "1.29.12",
        "cp.example.com:6443",
        SecretString::from(TOKEN),
        hash(),
        SecretString::from(CERT_KEY),
    )
    .with_family(recipes::PackageFamily::Dnf)
    .with_rpm_key(KEY)
    .without_taints()
    .layer("k8s")
    .unwrap();
    let KubeadmConfig::Join(j) = cp.config(&pid()).unwrap() else {
        panic!("not join")
    };
    assert_eq!(j.api_version, "kubeadm.k8s.io/v1beta3");
    assert_eq!(j.control_plane.unwrap().certificate_key.0, CERT_KEY);
    assert_eq!(j.node_registration.taints, Some(vec![]));
}

#[test]
fn bad_input_names_the_field_and_never_shows_a_secret() {
    let field = |n: KubeadmNode| n.layer("k8s").unwrap_err().field().unwrap().to_owned();
    let w = |v: &str, e: &str, t: &str, h: &str| {
        KubeadmNode::worker(v, e, SecretString::from(t.to_owned()), h).with_apt_key(KEY)
    };
    let h = hash();
    assert_eq!(field(w("1.31", "a:1", TOKEN, &h)), "kubeadm.version");
    assert_eq!(field(w("latest", "a:1", TOKEN, &h)), "kubeadm.version");
    assert_eq!(field(w("1.31.4", "a", TOKEN, &h)), "kubeadm.endpoint");
    assert_eq!(
        field(w("1.31.4", "https://a:6443", TOKEN, &h)),
        "kubeadm.endpoint"
    );
    assert_eq!(
        field(w("1.31.4", "a:1", "abcdef.0123456789ABCDEF", &h)),
        "kubeadm.token"
    );
    assert_eq!(
        field(w("1.31.4", "a:1", TOKEN, "sha256:abc")),
        "kubeadm.caCertHash"
    );
    assert_eq!(
        field(w("1.31.4", "a:1", TOKEN, &h).with_label("Bad Key", "x")),
        "kubeadm.labels[\"Bad Key\"]"
    );
    assert_eq!(
        field(w("1.31.4", "a:1", TOKEN, &h).with_label("node-role.kubernetes.io/worker", "")),
        "kubeadm.labels[\"node-role.kubernetes.io/worker\"]"
    );
    assert_eq!(
        field(w("1.31.4", "a:1", TOKEN, &h).with_label("ok", "bad value")),
        "kubeadm.labels[\"ok\"]"
    );
    assert_eq!(
        field(w("1.31.4", "a:1", TOKEN, &h).with_taint("a/b/c", None, "NoSchedule")),
        "kubeadm.taints[0].key"
    );
    assert_eq!(
        field(w("1.31.4", "a:1", TOKEN, &h).with_taint("x", None, "Sometimes")),
        "kubeadm.taints[0].effect"
    );
    assert_eq!(
        field(w("1.31.4", "a:1", TOKEN, &h).with_kubelet_arg("provider-id", "x")),
        "kubeadm.kubeletExtraArgs[0].name"
    );
    assert_eq!(
        field(KubeadmNode::worker(
            "1.31.4",
            "a:1",
            SecretString::from(TOKEN),
            h.clone()
        )),
        "kubeadm.aptKey"
    );
    assert_eq!(
        field(
            KubeadmNode::worker("1.31.4", "a:1", SecretString::from(TOKEN), h.clone())
                .with_family(recipes::PackageFamily::Dnf)
        ),
        "kubeadm.rpmKey"
    );
    assert_eq!(
        field(
            KubeadmNode::worker("1.31.4", "a:1", SecretString::from(TOKEN), h.clone())
                .with_family(recipes::PackageFamily::Dnf)
                .with_rpm_key("not a key")
        ),
        "kubeadm.layer k8s.recipes[0].key"
    );
    // A control-plane join without a (valid) certificate key.
    let cp = |key: &str| {
        KubeadmNode::control_plane_join(
            "1.31.4",
            "a:1",
            SecretString::from(TOKEN),
            h.clone(),
            SecretString::from(key.to_owned()),
        )
        .with_apt_key(KEY)
    };
    assert_eq!(field(cp("")), "kubeadm.certificateKey");
    assert_eq!(field(cp("zz")), "kubeadm.certificateKey");

    // The token is not in the error, nor in any Debug.
    let secret = "abcdef.0123456789abcdeZ";
    let e = w("1.31.4", "a:1", secret, &h).layer("k8s").unwrap_err();
    assert!(!e.to_string().contains("0123456789"), "{e}");
    let layer = cp(CERT_KEY).layer("k8s").unwrap();
    let config = layer.config(&pid()).unwrap();
    for shown in [
        format!("{layer:?}"),
        format!("{config:?}"),
        format!("{:?}", layer.coupled(&pid()).unwrap()),
    ] {
        assert!(
            !shown.contains("0123456789abcdef") && !shown.contains(CERT_KEY),
            "{shown}"
        );
    }
}

/// A config that does not parse (a hand-edited file, a broken render) is refused with
/// its line, never its source text: the token sits on one of those lines.
/// kubeadm writes kubelet flags into an env file whose variable systemd splits at
/// whitespace: a value with a space would reach the kubelet as two arguments.
#[test]
fn a_kubelet_flag_value_with_whitespace_is_refused_naming_the_flag() {
    for value in ["10.0.0.5 10.0.0.6", "a\tb", "x\u{a0}y"] {
        let e = worker("1.31.4")
            .with_kubelet_arg("node-ip", value)
            .layer("k8s")
            .unwrap_err();
        // worker() already sets max-pods: node-ip is the second flag.
        assert_eq!(e.field(), Some("kubeadm.kubeletExtraArgs[1].value"), "{e}");
        assert!(e.to_string().contains("node-ip"), "{e}");
        assert!(e.to_string().contains("whitespace"), "{e}");
    }
    // One value, commas between items, is what the kubelet takes.
    worker("1.31.4")
        .with_kubelet_arg("node-ip", "10.0.0.5,fd00::5")
        .layer("k8s")
        .unwrap();
}

#[test]
fn a_config_that_does_not_parse_never_shows_its_token() {
    let text = format!(
        "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\ndiscovery:\n  bootstrapToken:\n    token: {TOKEN}\n    apiServerEndpoint: [unclosed\n"
    );
    let e = KubeadmConfig::parse(&text).unwrap_err();
    let msg = format!("{e} {e:?}");
    assert!(!msg.contains(TOKEN), "the token is shown: {msg}");
    assert!(!msg.contains("0123456789"), "the token is shown: {msg}");
    assert!(msg.contains("line"), "the line is named: {msg}");
}
