//! Standard recipes on real machines: one recipe layer applied coupled (by the real
//! cloud-init at first boot) on one fresh machine and decoupled (over real SSH) on
//! another leaves the same machine state, and running the decoupled layer again, even
//! with its state file gone, changes nothing.
//!
//! Accounts are compared by name: cloud-init's `groups` module creates groups before
//! any account, while the decoupled machine already has the image's default user from
//! its first boot, so numeric IDs can be allocated in another order.
//!
//! The machines have no network and no package archive: a coupled fixture layer on
//! both puts a recording `apt-get` first in PATH (`/usr/local/sbin`). It appends each
//! invocation to a log and registers the packages it is asked to install in dpkg's
//! status file, so `dpkg-query` sees them as a real install would leave them.

use std::sync::Arc;

use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, CloudInitStatus, WriteFile};
use machine_core::{
    CancellationToken, Composer, Connector, Machine, MachineName, MachineSpec, Phase,
};
use recipes::{
    Account, AptRepository, Directory, DropIn, File, Group, Hostname, KernelModules, LineInFile,
    Package, PackageFamily, Packages, RecipeLayer, Sysctl, SystemdUnit, Timezone,
};
use tests::{ClientKey, Lab};

/// The recording apt-get: logs its arguments and DEBIAN_FRONTEND, and registers
/// `install`ed packages as installed in /var/lib/dpkg/status.
const APT_GET_STUB: &str = r#"#!/bin/sh
# Test stub: records the invocation; installs nothing.
printf '%s DEBIAN_FRONTEND=%s sources=%s\n' "$*" "${DEBIAN_FRONTEND:-}" "$(ls /etc/apt/sources.list.d | tr '\n' ' ')" >> /var/log/apt-get.calls
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

const UNIT: &str = "[Unit]\nDescription=recipes test app\n\n[Service]\nExecStart=/usr/bin/sleep infinity\n\n[Install]\nWantedBy=multi-user.target\n";

/// Everything the comparison reads back, in one deterministic text.
const READ_BACK: &str = r#"set -e
echo '## files'
for f in /etc/sudoers.d/90-recipes-ops /etc/app/app.conf /etc/systemd/system/app.service \
  /etc/systemd/system/app.service.d/limits.conf /etc/sysctl.d/90-app.conf \
  /etc/modules-load.d/app.conf /etc/hostname /etc/timezone /etc/motd \
  /etc/apt/keyrings/example.asc /etc/apt/sources.list.d/example.list; do
  stat -c '%n %a %U:%G %F' "$f"; cat "$f"; echo '--'
done
echo '## sudoers.d (the rule checked by visudo, no candidate left behind)'
ls -A /etc/sudoers.d
echo '## directories'
stat -c '%n %a %U:%G %F' /srv /srv/app /etc/app /home/ops /home/ops/.ssh
echo '## authorized keys (cloud-init keeps no order)'
stat -c '%n %a %U:%G %F' /home/ops/.ssh/authorized_keys
sort /home/ops/.ssh/authorized_keys
echo '## accounts (by name: numeric IDs follow creation order, see below)'
awk -F: '$3 >= 1000 && $3 < 65534 { print $1, $5, $6, $7 }' /etc/passwd | sort
getent group deploy ops | cut -d: -f1,4
getent shadow ops | cut -d: -f1,2,4-
id -nG ops
echo '## enabled units'
find /etc/systemd/system -type l -printf '%p -> %l\n' | sort
echo '## time zone'
readlink /etc/localtime
echo '## host name'
hostname
echo '## sysctl'
sysctl -n net.ipv4.ip_forward
echo '## package manager invocations'
cat /var/log/apt-get.calls
"#;

fn recipe_layer(admin_key: &str) -> RecipeLayer {
    RecipeLayer::new(
        "recipes",
        vec![
            Hostname::new("web").into(),
            Timezone::new("Europe/Paris").into(),
            Group::new("deploy").into(),
            Account::admin(
                "ops",
                [
                    admin_key.to_owned(),
                    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBm9yXk2nL3sWq0cJ8pHh6YfTzQe1nM5bVrX2aD4uKgE second@laptop".to_owned(),
                ],
            )
            .with_group("deploy")
            .with_gecos("Operations")
            .into(),
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
                .with_mode(0o2750 & 0o777 | 0o1000)
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
    .expect("the recipe layer")
}

fn fixture() -> CloudConfigLayer {
    CloudConfigLayer::new(
        "fixture",
        CloudConfig::new()
            .with_file(WriteFile::new("/usr/local/sbin/apt-get", APT_GET_STUB).permissions("0755")),
    )
    .expect("the fixture layer")
}

async fn read_back(key: &ClientKey, machine: &Machine) -> String {
    key.run(machine, &format!("sh -c {}", shlex_quote(READ_BACK)))
        .await
}

fn shlex_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_recipe_layer_coupled_and_decoupled_leaves_identical_machines_and_a_rerun_changes_nothing()
 {
    let lab = Lab::new();
    let provider = lab.provider("recipes");
    let key = ClientKey::new();
    let layer = recipe_layer(&key.public);

    let coupled = Composer::builder(provider.clone())
        .coupled(Arc::new(fixture()))
        .coupled(Arc::new(layer.coupled().unwrap()))
        .connector(key.connector())
        .completion(Arc::new(CloudInitStatus::new()))
        .build()
        .unwrap();
    let decoupled = Composer::builder(provider.clone())
        .coupled(Arc::new(fixture()))
        .decoupled(Arc::new(layer.decoupled().unwrap()))
        .connector(key.connector())
        .completion(Arc::new(CloudInitStatus::new()))
        .build()
        .unwrap();
    let spec = |name: &str| {
        let mut s = MachineSpec::new(MachineName::new(name).unwrap());
        s.ssh = Some(key.access("root"));
        s
    };
    let (a, b) = (spec("recipes-coupled"), spec("recipes-decoupled"));
    let cancel = CancellationToken::new();
    let (ra, rb) = tokio::join!(
        coupled.provision(&a, &cancel),
        decoupled.provision(&b, &cancel)
    );
    let ma = ra
        .unwrap_or_else(|e| panic!("coupled machine: {e}"))
        .machine;
    let mb = rb
        .unwrap_or_else(|e| panic!("decoupled machine: {e}"))
        .machine;
    assert_eq!((ma.phase, mb.phase), (Phase::Ready, Phase::Ready));

    // The decoupled path picks its package family from the OS the transport detects.
    let transport = key.connector().connect(&mb).await.unwrap();
    let os = bootstrap_ssh::os::detect(transport.as_ref()).await.unwrap();
    assert_eq!(
        PackageFamily::for_os(&os.id, &os.id_like),
        Some(PackageFamily::Apt)
    );

    let state_a = read_back(&key, &ma).await;
    let state_b = read_back(&key, &mb).await;
    assert_eq!(
        state_a, state_b,
        "coupled (left) and decoupled (right) machines differ"
    );
    // Not two equally empty machines: what the recipes asked for is there.
    for expected in [
        "/etc/app/app.conf 640 ops:deploy regular file\nport = 8080\nlog = info\n",
        "/etc/sudoers.d/90-recipes-ops 440 root:root regular file\nops ALL=(ALL) NOPASSWD:ALL\n",
        "/srv/app 1750 ops:deploy directory",
        "/home/ops/.ssh 700 ops:ops directory",
        "/home/ops/.ssh/authorized_keys 600 ops:ops regular file",
        &key.public,
        "/etc/systemd/system/multi-user.target.wants/app.service -> /etc/systemd/system/app.service",
        "/usr/share/zoneinfo/Europe/Paris",
        "## host name\nweb\n",
        "## sysctl\n1\n",
        "\nops deploy\n",
        "ops Operations /home/ops /bin/bash",
        // The repository is in place before apt-get update runs.
        "--quiet update DEBIAN_FRONTEND=noninteractive sources=example.list \n",
        "install nginx=1.22.1-9 curl DEBIAN_FRONTEND=noninteractive sources=example.list \n",
        "deb [signed-by=/etc/apt/keyrings/example.asc] https://apt.example.invalid/debian bookworm main\n",
    ] {
        assert!(
            state_b.contains(expected),
            "missing {expected:?} in:\n{state_b}"
        );
    }
    assert_eq!(
        state_b.matches(" install ").count() + state_b.matches(" update ").count(),
        2,
        "one update and one install:\n{state_b}"
    );

    // A second decoupled run: skipped by the layer's digest file; then, with the digest
    // and the state file gone, every step runs again and its guard must hold.
    let again = decoupled.provision(&b, &cancel).await.unwrap();
    assert_eq!(again.machine.phase, Phase::Ready);
    assert_eq!(
        read_back(&key, &mb).await,
        state_b,
        "the rerun changed the machine"
    );
    let state_file = layer.decoupled().unwrap().state_path();
    let digest_file = machine_core::revision::layer_digest_path(layer.name());
    key.run(&mb, &format!("rm {state_file} {digest_file}"))
        .await;
    let again = decoupled.provision(&b, &cancel).await.unwrap();
    assert_eq!(again.machine.phase, Phase::Ready);
    key.run(&mb, &format!("test -s {state_file}")).await;
    assert_eq!(
        read_back(&key, &mb).await,
        state_b,
        "the rerun without a state file changed the machine"
    );

    for m in [&a.name, &b.name] {
        coupled.deprovision(m, &cancel).await.unwrap();
    }
}
