//! Bad input gets a clear error naming what is wrong, and leaves nothing behind.

mod support;

use machine_core::{ErrorKind, MachineName, MachineProvisioner, MachineSpec};
use provider_local::{LocalConfig, LocalProvider};
use support::Lab;

#[test]
fn a_missing_root_is_refused_naming_it_and_the_script_that_builds_it() {
    let config = LocalConfig::new("t").with_root("/nonexistent/bookworm-local");
    let e = LocalProvider::new(config).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{e}");
    assert_eq!(e.field(), Some("root"));
    let text = e.to_string();
    assert!(text.contains("/nonexistent/bookworm-local"), "{text}");
    assert!(text.contains("40-local-root.sh"), "{text}");
}

#[test]
fn a_root_without_sshd_is_refused_as_incomplete_naming_the_missing_file() {
    let root = tempfile::tempdir().unwrap();
    for f in ["etc/os-release", "bin/sh", "usr/bin/cloud-init"] {
        let p = root.path().join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, "x").unwrap();
    }
    let config = LocalConfig::new("t").with_root(root.path());
    let e = LocalProvider::new(config).unwrap_err();
    assert_eq!(e.field(), Some("root"), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("usr/sbin/sshd") && text.contains("openssh-server"),
        "{text}"
    );
    assert!(text.contains("corrupt or incomplete"), "{text}");
}

#[test]
fn machine_names_that_are_not_dns_labels_are_refused() {
    for bad in ["Web_1", "-web", "a.b", ""] {
        let e = MachineName::new(bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{bad}: {e}");
    }
    let e = MachineSpec::from_yaml("name: Web_1\n").unwrap_err();
    assert!(e.to_string().contains("name"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_subnet_is_full_create_is_a_quota_error_naming_it_and_leaves_no_machine() {
    // A /30 has one address for machines beside the bridge's.
    let lab = Lab::with_prefix(30);
    let p = lab.provider("full");
    let first = p
        .create(&MachineSpec::new(MachineName::new("full-1").unwrap()), None)
        .await
        .unwrap();
    let name = MachineName::new("full-2").unwrap();
    let e = p
        .create(&MachineSpec::new(name.clone()), None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::QuotaExceeded, "{e}");
    assert_eq!(e.field(), Some("subnet"));
    assert!(e.to_string().contains(&lab.subnet), "{e}");
    assert!(
        p.find(&name).await.unwrap().is_none(),
        "a refused machine exists"
    );
    assert!(!p.machine_dir(&name).exists());
    // Deleting the first frees its address for the next.
    p.delete(&first.provider_id).await.unwrap();
    let again = p.create(&MachineSpec::new(name), None).await.unwrap();
    assert_eq!(
        again.addresses,
        first
            .addresses
            .iter()
            .map(|a| {
                let mut a = a.clone();
                if a.kind == machine_core::AddressKind::Hostname {
                    a.address = "full-2".into();
                }
                a
            })
            .collect::<Vec<_>>()
    );
    p.delete(&again.provider_id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_config_is_refused_naming_the_field() {
    let e = LocalConfig::from_yaml("subnet: 192.168.1.0/33\n").unwrap_err();
    assert_eq!(e.field(), Some("subnet"), "{e}");
    let e = LocalConfig::from_yaml("bridge: a-very-long-bridge\n").unwrap_err();
    assert_eq!(e.field(), Some("bridge"), "{e}");
}

/// Set in the copy of this test binary that runs as nobody.
const AS_NOBODY: &str = "PROVIDER_LOCAL_TEST_AS_NOBODY";

#[test]
fn not_running_as_root_is_an_unauthorized_error_that_says_so() {
    if std::env::var_os(AS_NOBODY).is_some() {
        let e = LocalProvider::new(LocalConfig::new("t")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
        assert!(e.to_string().contains("must run as root"), "{e}");
        return;
    }
    // Run this same test again as nobody (uid 65534).
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "not_running_as_root_is_an_unauthorized_error_that_says_so",
            "--test-threads=1",
        ])
        .env(AS_NOBODY, "1")
        .output()
        .expect("setpriv is missing: apt-get install util-linux");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "as nobody: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_died_before_recording_its_machine_is_cleaned_up_by_the_next_create_of_the_name()
 {
    let lab = Lab::with_prefix(30);
    let p = lab.provider("crashed");
    let name = MachineName::new("half-made").unwrap();
    // What a create leaves when its process dies after taking the subnet's only
    // address and writing some files, before writing the machine's record.
    let dir = p.machine_dir(&name);
    std::fs::create_dir_all(dir.join("upper/etc")).unwrap();
    std::fs::write(dir.join("upper/etc/half"), "x").unwrap();
    std::fs::create_dir_all(lab.run_dir.join("leases")).unwrap();
    let only = lab.subnet.replace(".0/30", ".2");
    std::fs::write(lab.run_dir.join("leases").join(&only), "crashed/half-made").unwrap();
    assert!(
        p.find(&name).await.unwrap().is_none(),
        "no record, no machine"
    );
    // The next create of the name (a restarted controller's) clears the remains and
    // gets the address back.
    let m = p
        .create(&MachineSpec::new(name.clone()), None)
        .await
        .unwrap();
    assert_eq!(
        m.address(machine_core::AddressKind::InternalIP),
        Some(only.as_str())
    );
    assert!(
        !dir.join("upper/etc/half").exists(),
        "remains of the dead create"
    );
    p.delete(&m.provider_id).await.unwrap();
    assert!(!dir.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_size_is_refused_naming_the_field_and_no_machine_is_made() {
    let lab = Lab::new();
    let p = lab.provider("sized");
    let name = MachineName::new("sized-1").unwrap();
    let e = p
        .create(&MachineSpec::new(name.clone()).with_size("2x4096"), None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{e}");
    assert_eq!(e.field(), Some("size"), "{e}");
    assert!(e.to_string().contains("2x4096"), "{e}");
    assert!(p.find(&name).await.unwrap().is_none());
    assert!(!p.machine_dir(&name).exists());
}
