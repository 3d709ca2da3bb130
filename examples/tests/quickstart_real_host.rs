//! The quickstart's decoupled machine pointed at a real host: the built quickstart
//! binary runs with an inventory naming a real sshd on a loopback port, claims it,
//! applies its layer over SSH, shows the file it wrote and releases the host.

mod common;

#[path = "../../bootstrap-ssh/tests/support/mod.rs"]
mod support;

use std::process::Command;

use support::{Sshd, SshdOptions};

#[test]
fn the_decoupled_machine_runs_on_a_real_host_given_by_an_inventory() {
    let claims = std::env::temp_dir().join(format!("qs-claims-{}", support::unique()));
    let sshd = Sshd::with(SshdOptions {
        private_dir: Some(claims.clone()),
        ..SshdOptions::default()
    });
    let inventory = sshd.dir.path().join("inventory.yaml");
    std::fs::write(
        &inventory,
        format!(
            "owner: quickstart-test\nclaimDir: {}\nhosts:\n  - name: box-1\n    address: {}\n    port: {}\n    hostKeys: [\"{}\"]\n",
            claims.display(),
            sshd.host,
            sshd.port,
            sshd.host_key_pub
        ),
    )
    .unwrap();
    let out = Command::new(common::quickstart())
        .args(["--hosts", inventory.to_str().unwrap()])
        .args(["--key", sshd.client_key.to_str().unwrap()])
        // Only the inventory's pinned key is trusted: no known_hosts file to fall back on.
        .args(["--known-hosts", "/nonexistent/known_hosts"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "quickstart failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("decoupled on static-hosts(owner=quickstart-test, 1 hosts)"),
        "{stdout}"
    );
    // The ID names the host and the claim (`static:///box-1/<claim id>`).
    let line = stdout
        .lines()
        .find(|l| l.starts_with("decoupled-1 (decoupled, static:///box-1/"))
        .unwrap_or_else(|| panic!("no line for decoupled-1 on box-1: {stdout}"));
    assert!(
        line.ends_with(&format!(", root@{}:{})", sshd.host, sshd.port)),
        "{line}"
    );
    assert!(
        stdout.contains("hello.txt: Provisioned by machine-core's quickstart."),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("decoupled-1: host static:///box-1/") && l.ends_with(" released")),
        "{stdout}"
    );
    // The simulated machines are still made and torn down beside it.
    assert!(stdout.contains("coupled-1: deleted"), "{stdout}");
}

#[test]
fn a_bad_inventory_is_refused_with_its_field() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = dir.path().join("inventory.yaml");
    std::fs::write(
        &inventory,
        "hosts:\n  - name: box-1\n    address: h\n    port: 0\n",
    )
    .unwrap();
    let out = Command::new(common::quickstart())
        .args(["--hosts", inventory.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("hosts[0].port"), "{stderr}");
    assert!(stderr.contains("inventory.yaml"), "{stderr}");
}
