//! Every package family's decoupled step makes the same package-manager calls as
//! cloud-init 22.4's own distro class does for the coupled `packages` list. The oracle
//! is cloud-init's Python code on this host (its `subp` replaced by a recorder); the
//! decoupled step runs in a real `sh` with stub package managers first in PATH that
//! record their arguments and report nothing installed (no RPM or Alpine root can be
//! fetched here).

use std::io::Write;
use std::process::{Command, Stdio};

use machine_core::steps::Step;
use recipes::{Package, Packages, RecipeLayer};

const INSTALL: &str = "run scripts/peers/20-cloud-init.sh (or: apt-get install -y --no-install-recommends cloud-init)";

/// What cloud-init's `package_update_upgrade_install` module runs for `packages` on
/// `family`'s distro: update the sources (once per instance), then install.
const ORACLE: &str = r#"
import json, sys
from unittest import mock
from cloudinit import subp
from cloudinit.distros import alpine, debian, opensuse, rhel
family, have_dnf, pkgs = json.loads(sys.stdin.read())
calls = []
def fake_subp(args, **kwargs):
    calls.append([str(a) for a in args])
    return ("", "")
def which(name, *a, **k):
    return "/usr/bin/dnf" if (name == "dnf" and have_dnf) else None
cls = {"apt": debian.Distro, "dnf": rhel.Distro, "zypper": opensuse.Distro, "apk": alpine.Distro}[family]
with mock.patch.object(subp, "subp", fake_subp), mock.patch.object(subp, "which", which):
    d = cls(family, {}, None)
    done = set()
    def run(name, fn, args, freq=None):
        if name not in done:
            done.add(name)
            fn(*args)
    d._runner = mock.Mock(run=run)
    if family == "apt":
        d._apt_lock_available = lambda *a, **k: True
    d.update_package_sources()
    d.install_packages(pkgs)
print(json.dumps(calls))
"#;

fn cloud_init_calls(family: &str, have_dnf: bool, packages: &[String]) -> Vec<Vec<String>> {
    assert!(
        std::path::Path::new("/usr/bin/cloud-init").exists(),
        "cloud-init is missing: {INSTALL}"
    );
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", ORACLE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("python3: {e}; {INSTALL}"));
    let input = format!(
        "[{:?}, {have_dnf}, [{}]]",
        family,
        packages
            .iter()
            .map(|p| format!("{p:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "cloud-init's code failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    parse_json_lists(text.trim())
}

/// The `[[..], [..]]` of string lists the oracle prints (no escapes in these values).
fn parse_json_lists(s: &str) -> Vec<Vec<String>> {
    let inner = s
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap();
    inner
        .split("], [")
        .map(|call| {
            call.trim_matches(|c| c == '[' || c == ']')
                .split(", ")
                .map(|a| a.trim_matches('"').to_owned())
                .collect()
        })
        .filter(|c: &Vec<String>| !c.is_empty() && !c[0].is_empty())
        .collect()
}

/// Runs the layer's package step in `sh` with recording stubs for `tools` first in
/// PATH; returns the recorded calls of package managers (queries left out).
fn decoupled_calls(layer: &RecipeLayer, tools: &[&str]) -> Vec<Vec<String>> {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls");
    for tool in tools {
        let stub = format!(
            "#!/bin/sh\n# Records the call; reports nothing installed.\n\
             case \"$0 $1\" in *rpm*|*dpkg-query*|*'apk info') exit 1 ;; esac\n\
             {{ printf '%s' \"$(basename \"$0\")\"; for a in \"$@\"; do printf '\\037%s' \"$a\"; done; echo; }} >> {}\n",
            log.display()
        );
        let path = dir.path().join(tool);
        std::fs::write(&path, stub).unwrap();
        Command::new("chmod")
            .arg("755")
            .arg(&path)
            .status()
            .unwrap();
    }
    let command = layer
        .steps()
        .into_iter()
        .find_map(|s| match s {
            Step::Run { command } if command.contains("install") || command.contains(" add ") => {
                Some(command)
            }
            _ => None,
        })
        .expect("a package step");
    let status = Command::new("/bin/sh")
        .args(["-c", &command])
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", dir.path().display()))
        .status()
        .unwrap();
    assert!(status.success(), "the step failed: {command}");
    std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split('\x1f').map(str::to_owned).collect())
        .collect()
}

fn packages() -> Vec<Package> {
    vec![Package::new("curl"), Package::pinned("nginx", "1.24.0-1")]
}

fn check(packages: Packages, family: &str, have_dnf: bool, tools: &[&str]) {
    let layer = RecipeLayer::new("pkgs", vec![packages.into()]).unwrap();
    let coupled = layer.cloud_config().packages;
    let expected = cloud_init_calls(family, have_dnf, &coupled);
    assert_eq!(
        expected.len(),
        2,
        "cloud-init updates then installs: {expected:?}"
    );
    assert_eq!(decoupled_calls(&layer, tools), expected, "{family}");
}

#[test]
fn apt_calls_match_cloud_inits_debian_distro() {
    // dpkg-query stubbed too: this host's packages must not count as installed.
    check(
        Packages::apt(packages()),
        "apt",
        false,
        &["apt-get", "dpkg-query"],
    );
}

#[test]
fn dnf_calls_match_cloud_inits_rhel_distro() {
    check(Packages::dnf(packages()), "dnf", true, &["dnf", "rpm"]);
}

#[test]
fn yum_is_used_with_t_where_dnf_is_missing_as_cloud_init_does() {
    check(Packages::dnf(packages()), "dnf", false, &["yum", "rpm"]);
}

#[test]
fn zypper_calls_match_cloud_inits_opensuse_distro() {
    check(
        Packages::zypper(packages()),
        "zypper",
        false,
        &["zypper", "rpm"],
    );
}

#[test]
fn apk_calls_match_cloud_inits_alpine_distro() {
    check(Packages::apk(packages()), "apk", false, &["apk"]);
}

#[test]
fn a_layer_holds_one_package_family() {
    let e = RecipeLayer::new(
        "l",
        vec![
            Packages::apt([Package::new("curl")]).into(),
            Packages::dnf([Package::new("jq")]).into(),
        ],
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("layer l.recipes[1].family"));
    let e = RecipeLayer::new("l", vec![Packages::apk([Package::new("Curl")]).into()]).unwrap_err();
    assert_eq!(e.field(), Some("layer l.recipes[0].packages[0].name"));
    let e = RecipeLayer::new(
        "l",
        vec![Packages::dnf([Package::pinned("curl", "8.0;reboot")]).into()],
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("layer l.recipes[0].packages[0].version"));
}

#[test]
fn the_family_follows_os_release_id_then_id_like() {
    use recipes::PackageFamily;
    let like = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        PackageFamily::for_os("debian", &[]),
        Some(PackageFamily::Apt)
    );
    assert_eq!(
        PackageFamily::for_os("linuxmint", &like(&["ubuntu", "debian"])),
        Some(PackageFamily::Apt)
    );
    assert_eq!(
        PackageFamily::for_os("rocky", &like(&["rhel", "centos", "fedora"])),
        Some(PackageFamily::Dnf)
    );
    assert_eq!(
        PackageFamily::for_os("opensuse-leap", &like(&["suse", "opensuse"])),
        Some(PackageFamily::Zypper)
    );
    assert_eq!(
        PackageFamily::for_os("alpine", &[]),
        Some(PackageFamily::Apk)
    );
    assert_eq!(PackageFamily::for_os("arch", &[]), None);
}
