//! A decoupled layer run again without its state file (lost, or a new controller) runs
//! every step again: on a real Debian root in a chroot, that rerun must change nothing
//! that is already as asked. Every path of the root is compared by inode, size, mode,
//! owner, modification and change time before and after the rerun.

mod machine;

use machine::{Root, apply, root, stub};
use recipes::{
    Account, AptRepository, Directory, DropIn, File, Group, Hostname, KernelModules, LineInFile,
    Package, Packages, RecipeLayer, Sysctl, SystemdUnit, Timezone,
};

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBm9yXk2nL3sWq0cJ8pHh6YfTzQe1nM5bVrX2aD4uKgE ops@laptop";

const UNIT: &str = "[Unit]\nDescription=app\n\n[Service]\nExecStart=/usr/bin/sleep infinity\n\n[Install]\nWantedBy=multi-user.target\n";

/// apt-get without a network: records nothing, registers what it installs in dpkg's
/// status file, so dpkg-query sees it installed as a real install leaves it.
const APT_GET: &str = r#"#!/bin/sh
# Test stub: installs nothing, registers the packages.
inst=
for a in "$@"; do
  case "$a" in
    install) inst=1 ;;
    -*) ;;
    *) if [ -n "$inst" ]; then
         n=${a%%=*}; v=${a#*=}; [ "$v" = "$a" ] && v=1.0-stub
         printf '\nPackage: %s\nStatus: install ok installed\nPriority: optional\nSection: misc\nMaintainer: stub <stub@invalid>\nArchitecture: all\nVersion: %s\nDescription: registered by the test stub\n' "$n" "$v" >> /var/lib/dpkg/status
       fi ;;
  esac
done
"#;

fn layer() -> RecipeLayer {
    RecipeLayer::new(
        "rerun",
        vec![
            Hostname::new("web").into(),
            Timezone::new("Europe/Paris").into(),
            Group::new("deploy").into(),
            Account::admin("ops", [KEY])
                .with_group("deploy")
                .with_gecos("Operations")
                .into(),
            Account::new("svc").into(),
            Packages::apt([Package::pinned("nginx", "1.22.1-9"), Package::new("curl")]).into(),
            AptRepository::new(
                "example",
                "https://apt.example.invalid/debian",
                "bookworm",
                ["main"],
                "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZXhhbXBsZQ==\n-----END PGP PUBLIC KEY BLOCK-----\n",
            )
            .into(),
            File::new("/etc/app/app.conf", "port = 8080\nlog = debug\n")
                .with_mode(0o640)
                .with_owner("ops:deploy")
                .into(),
            Directory::new("/srv/app")
                .with_owner("ops:deploy")
                .with_mode(0o750)
                .into(),
            LineInFile::new("/etc/app/app.conf", "log = info")
                .replacing("log =")
                .into(),
            LineInFile::new("/etc/motd", "managed by recipes").into(),
            SystemdUnit::new("app.service", UNIT)
                .with_drop_in(DropIn::new("limits", "[Service]\nLimitNOFILE=65536\n"))
                .into(),
            Sysctl::new("90-app", [("net.ipv4.ip_forward", "1")]).into(),
            KernelModules::new("app", ["overlay"]).into(),
        ],
    )
    .unwrap()
}

/// Every path of the root's own filesystem but the volatile ones, with what a write
/// changes.
fn snapshot(root: &Root, state_file: &str) -> Vec<String> {
    let out = root.run(&format!(
        "find / -xdev \\( -path /proc -o -path /sys -o -path /dev -o -path /run -o -path /tmp \
         -o -path /var/log -o -path /var/cache -o -path /usr/sbin \\) -prune -o ! -path {state_file} \
         -printf '%p inode=%i size=%s mode=%m owner=%u:%g mtime=%T@ ctime=%C@\\n'"
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

#[tokio::test]
async fn a_decoupled_rerun_without_its_state_file_changes_nothing_already_as_asked() {
    let layer = layer();
    // No /sys in the chroot: modprobe and sysctl record their calls instead.
    let machine = root(
        b"",
        &[
            ("apt-get", APT_GET.to_owned()),
            ("modprobe", stub("modprobe")),
            ("sysctl", stub("sysctl")),
        ],
    );
    apply(&layer, &machine).await.unwrap();
    let state_file = layer.decoupled().unwrap().state_path();
    // The state directory itself changes with its file: leave it out as well.
    let state_dir = state_file.rsplit_once('/').unwrap().0.to_owned();
    let ok = machine.run("grep -qx 'managed by recipes' /etc/motd && id ops && test -d /srv/app");
    assert!(ok.status.success(), "the first run did not apply the layer");
    let gone = machine.run(&format!("rm {state_file}"));
    assert!(gone.status.success());
    // Time stamps have a resolution: a rewrite in the same tick would not show.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    // The first walk over the root after the first run makes overlayfs mark the
    // directories it copied up then (an extended attribute, so a change time): the test
    // harness's doing, not the layer's. Walk once before the snapshot that counts.
    snapshot(&machine, &state_file);
    let before = snapshot(&machine, &state_file);
    apply(&layer, &machine).await.unwrap();
    let after = snapshot(&machine, &state_file);
    let changed: Vec<&String> = after
        .iter()
        .filter(|l| !before.contains(l) && !l.starts_with(&format!("{state_dir} ")))
        .collect();
    assert!(
        changed.is_empty(),
        "the rerun changed {} paths already as asked:\n{}",
        changed.len(),
        changed
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        machine
            .run(&format!("test -s {state_file}"))
            .status
            .success(),
        "the rerun did not record its steps"
    );
}
