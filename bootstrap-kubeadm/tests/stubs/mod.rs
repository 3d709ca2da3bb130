//! Recording stand-ins for the programs a Kubernetes node layer calls and this host
//! cannot run for real (no network, no package archive, no cluster): each appends
//! `name args` to [`CALLS`]; `kubeadm` also keeps a copy of the `--config` file it was
//! given and leaves the kubelet's credentials as a real init or join would (and a line
//! in `/var/log/kubeadm.joined`), after `/etc/kubeadm-stub-pre` seconds if set. A stub
//! fails when the file `/etc/stub-fail-<tool>` exists.
#![allow(dead_code)]

use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, WriteFile};

/// The log every stub appends to, one call a line.
pub const CALLS: &str = "/var/log/stub.calls";

/// The programs replaced: package managers, service and kernel tools, kubeadm.
pub const TOOLS: [&str; 9] = [
    "apt-get",
    "apt-mark",
    "dnf",
    "rpm",
    "systemctl",
    "sysctl",
    "modprobe",
    "kubelet",
    "kubeadm",
];

fn stub(tool: &str) -> String {
    let mut s = format!(
        "#!/bin/sh\n# Test stub for {tool}: records the call, installs and starts nothing.\nprintf '%s\\n' \"{tool} $*\" >> {CALLS}\n\
         # A test makes a tool fail by leaving /etc/stub-fail-<tool>.\n\
         if [ -f /etc/stub-fail-{tool} ]; then echo '{tool} stub: asked to fail' >&2; exit 1; fi\n"
    );
    match tool {
        // Nothing is installed: the decoupled path's `rpm -q` checks see no package.
        "rpm" => s.push_str("case \"$1\" in -q*) exit 1 ;; esac\n"),
        "kubeadm" => s.push_str(
            "echo '[preflight] Running pre-flight checks'\n# A test may make the join itself take a while, to cut the link in the middle of it.\nsleep \"$(cat /etc/kubeadm-stub-pre 2>/dev/null || echo 0)\"\n# It prints as it goes, as kubeadm does: a broken output kills it.\necho '[kubelet-start] Writing kubelet configuration'\nn=$(grep -c '^kubeadm ' /var/log/stub.calls)\nprev=\nfor a in \"$@\"; do [ \"$prev\" = --config ] && cp \"$a\" /var/log/kubeadm.config.$n; prev=$a; done\nmkdir -p /etc/kubernetes && echo stub > /etc/kubernetes/kubelet.conf\necho joined >> /var/log/kubeadm.joined\n# A test may hold kubeadm after it joined, to cut the link before the step is recorded.\nsleep \"$(cat /etc/kubeadm-stub-sleep 2>/dev/null || echo 0)\"\n",
        ),
        _ => {}
    }
    s
}

/// A coupled layer putting the stubs in `dir`, which must come before the real
/// programs in the PATH the layer's commands run with.
pub fn fixture(dir: &str) -> CloudConfigLayer {
    let mut c = CloudConfig::new();
    for tool in TOOLS {
        c = c.with_file(WriteFile::new(format!("{dir}/{tool}"), stub(tool)).permissions("0755"));
    }
    CloudConfigLayer::new("fixture", c).expect("the stub layer")
}

/// The recorded calls of `text` (the log), those of `tool` only.
pub fn calls_of<'a>(text: &'a str, tool: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| l.split(' ').next() == Some(tool))
        .collect()
}
