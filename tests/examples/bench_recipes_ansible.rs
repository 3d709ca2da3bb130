//! A 10-recipe layer applied decoupled (recipes -> StepLayer -> bootstrap-ssh) to N real
//! local machines (default 50), against Ansible applying the same state with its own
//! modules to N other fresh machines, in the same run. Both sides start from machines
//! booted from the same root; only the apply is timed. Afterwards every machine is read
//! back with one script and each of our machines must equal its Ansible twin.
//!
//! ```text
//! WITH_BENCH_PEERS=1 bash scripts/peers/10-openssh.sh    # ansible (core + collections) in a venv
//! WITH_BENCH_PEERS=1 bash scripts/peers/40-local-root.sh # the bench root (see below)
//! cargo run --release -p tests --example bench_recipes_ansible [-- --hosts 50]
//! ```
//!
//! The machines are provider-local's (namespaces over an overlay of a Debian 12 root, no
//! systemd as PID 1, no network). Both sides get the same machine: the bench root, a
//! copy of the tests' root with python3-apt, kmod, systemd (the binaries, not PID 1),
//! nginx and curl installed, so that both sides' package step finds the packages
//! installed and stays offline. What differs from a cloud VM, the same for both sides:
//! nothing is (re)started (systemd is not running: ours skips the restart, Ansible's
//! `systemd_service` enables offline with `SYSTEMD_OFFLINE=1`), and this kernel has no
//! loadable modules (no /proc/modules), so the kernel modules are ones built in
//! (`overlay`, `bridge`) and Ansible's `community.general.modprobe`, which must read
//! /proc/modules, cannot run: its equivalent is the modules-load.d file by `copy` and
//! `modprobe` by `command` with `creates: /sys/module/<name>`, the check our step makes.
//!
//! Client CPU is user + system time: this process for ours (its SSH and the steps),
//! the waited children (ansible-playbook, its workers and ssh) for Ansible; Ansible's
//! ControlPersist masters outlive the run and are not counted, as in bench_ssh.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../../bench/ansible.rs"]
mod ansible;

use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, CloudInitStatus, WriteFile};
use bootstrap_ssh::{Auth, HostKeyPolicy, SshConfig, SshConnector};
use machine_core::steps::StepLayer;
use machine_core::{
    CancellationToken, Composer, ComposerSettings, Connector, DecoupledSoftware, ExecRequest,
    Machine, MachineName, MachineSpec, SshAccess,
};
use provider_local::{LocalConfig, LocalProvider};
use recipes::{
    Account, Directory, DropIn, File, Hostname, KernelModules, LineInFile, Package, Packages,
    RecipeLayer, Sysctl, SystemdUnit, Timezone,
};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const ADMIN_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBm9yXk2nL3sWq0cJ8pHh6YfTzQe1nM5bVrX2aD4uKgE ops@laptop";
const UNIT: &str = "[Service]\nExecStart=/usr/bin/app\n[Install]\nWantedBy=multi-user.target\n";
const DROP_IN: &str = "[Service]\nLimitNOFILE=65536\n";
/// Built into this kernel (see /sys/module): nothing to load, on either side.
const MODULES: [&str; 2] = ["overlay", "bridge"];

/// The layer of machine `i`: the one of bench_recipes (host name and file content differ
/// per machine), with kernel modules this kernel has and nginx pinned to the version the
/// bench root holds.
fn layer(i: usize, nginx: &str) -> machine_core::Result<RecipeLayer> {
    RecipeLayer::new(
        "base",
        vec![
            Hostname::new(format!("web-{i}")).into(),
            Timezone::new("Europe/Paris").into(),
            Account::admin("ops", [ADMIN_KEY])
                .with_group("deploy")
                .into(),
            Packages::apt([Package::pinned("nginx", nginx), Package::new("curl")]).into(),
            File::new("/etc/app/app.conf", app_conf(i))
                .with_mode(0o640)
                .with_owner("ops:deploy")
                .into(),
            Directory::new("/srv/app").with_owner("ops").into(),
            LineInFile::new("/etc/motd", format!("machine {i}")).into(),
            SystemdUnit::new("app.service", UNIT)
                .with_drop_in(DropIn::new("limits", DROP_IN))
                .into(),
            Sysctl::new("90-app", [("net.ipv4.ip_forward", "1")]).into(),
            KernelModules::new("app", MODULES).into(),
        ],
    )
}

fn app_conf(i: usize) -> String {
    format!("port = 8080\nid = {i}\n")
}

/// The same state with Ansible's modules; `hn` and `idx` are host variables.
fn playbook(nginx: &str) -> String {
    let mut p = String::from("- hosts: targets\n  gather_facts: false\n  tasks:\n");
    let mut task = |t: &str| {
        for (n, line) in t.lines().enumerate() {
            let lead = if n == 0 { "    - " } else { "      " };
            let _ = writeln!(p, "{lead}{line}");
        }
    };
    // The hostname module's Debian strategy needs hostnamectl with a running systemd, and
    // its file strategy (`use: alpine`) sets the running name from the file before
    // writing it: the file and `hostname`, as ours does.
    task(
        "ansible.builtin.copy: {dest: /etc/hostname, content: \"{{ hn }}\\n\", mode: \"0644\"}\nregister: hostname_file",
    );
    task("ansible.builtin.command: {cmd: \"hostname {{ hn }}\"}\nwhen: hostname_file.changed");
    task("community.general.timezone: {name: Europe/Paris}");
    task("ansible.builtin.group: {name: deploy}");
    task(
        "ansible.builtin.user: {name: ops, groups: [deploy], shell: /bin/bash, create_home: true, password_lock: true}",
    );
    task(&format!(
        "ansible.posix.authorized_key: {{user: ops, key: \"{ADMIN_KEY}\"}}"
    ));
    task(
        "ansible.builtin.copy: {dest: /etc/sudoers.d/90-recipes-ops, content: \"ops ALL=(ALL) NOPASSWD:ALL\\n\", mode: \"0440\"}",
    );
    task(&format!(
        "ansible.builtin.apt: {{name: [\"nginx={nginx}\", curl], state: present}}"
    ));
    task("ansible.builtin.file: {path: /etc/app, state: directory, mode: \"0755\"}");
    task(
        "ansible.builtin.copy: {dest: /etc/app/app.conf, content: \"port = 8080\\nid = {{ idx }}\\n\", owner: ops, group: deploy, mode: \"0640\"}",
    );
    task("ansible.builtin.file: {path: /srv/app, state: directory, owner: ops, mode: \"0755\"}");
    task(
        "ansible.builtin.lineinfile: {path: /etc/motd, line: \"machine {{ idx }}\", create: true}",
    );
    task(&format!(
        "ansible.builtin.copy: {{dest: /etc/systemd/system/app.service, content: {:?}, mode: \"0644\"}}",
        UNIT
    ));
    task(
        "ansible.builtin.file: {path: /etc/systemd/system/app.service.d, state: directory, mode: \"0755\"}",
    );
    task(&format!(
        "ansible.builtin.copy: {{dest: /etc/systemd/system/app.service.d/limits.conf, content: {:?}, mode: \"0644\"}}",
        DROP_IN
    ));
    task(
        "ansible.builtin.systemd_service: {name: app.service, enabled: true, daemon_reload: true}\nenvironment: {SYSTEMD_OFFLINE: \"1\"}",
    );
    task(
        "ansible.posix.sysctl: {name: net.ipv4.ip_forward, value: \"1\", sysctl_file: /etc/sysctl.d/90-app.conf, reload: true}",
    );
    task(&format!(
        "ansible.builtin.copy: {{dest: /etc/modules-load.d/app.conf, content: \"{}\\n\", mode: \"0644\"}}",
        MODULES.join("\\n")
    ));
    task(&format!(
        "ansible.builtin.command: {{cmd: \"modprobe {{{{ item }}}}\", creates: \"/sys/module/{{{{ item }}}}\"}}\nloop: [{}]",
        MODULES.join(", ")
    ));
    p
}

/// What both sides must leave; compared per machine between the two sides, and checked
/// for machine-specific values.
const READ_BACK: &str = r#"set -e
echo "== account"; getent passwd ops | cut -d: -f1,6,7; id -nG ops
stat -c '%n %a %U:%G' /home/ops/.ssh/authorized_keys; cat /home/ops/.ssh/authorized_keys
getent shadow ops | cut -d: -f2 | cut -c1
stat -c '%n %a %U:%G' /etc/sudoers.d/90-recipes-ops; cat /etc/sudoers.d/90-recipes-ops
echo "== packages"; dpkg-query -W -f='${db:Status-Abbrev}${Package} ${Version}\n' nginx curl
echo "== files"; stat -c '%n %a %U:%G %F' /etc/app/app.conf /srv/app; cat /etc/app/app.conf
tail -n 1 /etc/motd
echo "== unit"; readlink /etc/systemd/system/multi-user.target.wants/app.service
cat /etc/systemd/system/app.service /etc/systemd/system/app.service.d/limits.conf
echo "== system"; cat /etc/hostname; hostname; cat /etc/timezone
cmp /etc/localtime /usr/share/zoneinfo/Europe/Paris && echo localtime Europe/Paris
sysctl -n net.ipv4.ip_forward; grep -c '^net.ipv4.ip_forward *= *1$' /etc/sysctl.d/90-app.conf
cat /etc/modules-load.d/app.conf
"#;

/// User + system CPU seconds of this process, or of its waited children.
fn cpu(children: bool) -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let f: Vec<f64> = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // stat(5) fields 14-17 (utime, stime, cutime, cstime); index 0 is field 3. Linux
    // reports them in USER_HZ, 100 on every architecture it runs on.
    let (u, s) = if children { (13, 14) } else { (11, 12) };
    (f.get(u).unwrap_or(&0.0) + f.get(s).unwrap_or(&0.0)) / 100.0
}

/// Boots `n` machines named `<prefix>-<i>` and returns them in order.
async fn boot(composer: &Composer, prefix: &str, n: usize, ssh: &SshAccess) -> Res<Vec<Machine>> {
    let specs: Vec<MachineSpec> = (0..n)
        .map(|i| {
            let mut s = MachineSpec::new(MachineName::new(format!("{prefix}-{i}"))?);
            s.ssh = Some(ssh.clone());
            Ok(s)
        })
        .collect::<Res<_>>()?;
    let concurrency = std::num::NonZeroUsize::new(25).unwrap_or(std::num::NonZeroUsize::MIN);
    let mut machines = Vec::new();
    for r in composer
        .provision_fleet(&specs, concurrency, &CancellationToken::new())
        .await?
    {
        machines.push(
            r.outcome
                .map_err(|e| format!("booting {}: {e}", r.name))?
                .machine,
        );
    }
    Ok(machines)
}

/// Ours: one fresh SSH connection per machine, the machine's layer applied over it.
async fn apply_ours(key: &Path, kh: &Path, machines: &[Machine], nginx: &str) -> Res<usize> {
    let connector = Arc::new(SshConnector::new(
        SshConfig::new(vec![Auth::key_file(key, None)?]).with_host_keys(HostKeyPolicy::Verify {
            known_hosts: Some(kh.to_owned()),
        }),
    ));
    let mut tasks = Vec::new();
    for (i, m) in machines.iter().enumerate() {
        let (connector, m, nginx) = (connector.clone(), m.clone(), nginx.to_owned());
        tasks.push(tokio::spawn(async move {
            let steps: StepLayer = layer(i, &nginx)?.decoupled()?;
            let t = connector.connect(&m).await?;
            steps.apply(&m, t.as_ref()).await?;
            Ok::<usize, machine_core::Error>(steps.steps().len())
        }));
    }
    let mut steps = 0;
    for (i, t) in tasks.into_iter().enumerate() {
        steps = t.await?.map_err(|e| format!("ours, machine {i}: {e}"))?;
    }
    Ok(steps)
}

fn write_ansible(dir: &Path, key: &Path, kh: &Path, machines: &[Machine], nginx: &str) -> Res<()> {
    let mut hosts = Vec::new();
    for (i, m) in machines.iter().enumerate() {
        let host = &m.access.ssh.as_ref().ok_or("a machine without SSH")?.host;
        hosts.push(format!("a{i} ansible_host={host} hn=web-{i} idx={i}"));
    }
    ansible::write_setup(dir, &hosts, key, kh)?;
    std::fs::write(dir.join("play.yml"), playbook(nginx))?;
    Ok(())
}

fn apply_ansible(dir: &Path) -> Res<String> {
    let out = Command::new(ansible::playbook_bin())
        .arg("-i")
        .arg(dir.join("inventory"))
        .arg(dir.join("play.yml"))
        .env("ANSIBLE_CONFIG", dir.join("ansible.cfg"))
        .env("ANSIBLE_LOCAL_TEMP", dir.join("tmp"))
        .env("ANSIBLE_HOME", dir.join("home"))
        .stdin(Stdio::null())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "ansible-playbook failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(stdout)
}

async fn read_back(connector: &SshConnector, m: &Machine) -> Res<String> {
    let t = connector.connect(m).await?;
    let command = format!("sh -c '{}'", READ_BACK.replace('\'', r"'\''"));
    let out = t.exec(&ExecRequest::new(command)).await?;
    if out.status != Some(0) {
        return Err(format!(
            "read-back on {}: {}{}",
            m.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Each of our machines must read back like its Ansible twin, and hold its own values.
async fn verify(
    key: &Path,
    kh: &Path,
    ours: &[Machine],
    theirs: &[Machine],
    nginx: &str,
) -> Res<()> {
    let connector = SshConnector::new(
        SshConfig::new(vec![Auth::key_file(key, None)?]).with_host_keys(HostKeyPolicy::Verify {
            known_hosts: Some(kh.to_owned()),
        }),
    );
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        let (sa, sb) = (
            read_back(&connector, a).await?,
            read_back(&connector, b).await?,
        );
        if sa != sb {
            return Err(format!(
                "machine {i}: ours and Ansible's differ\n--- ours\n{sa}--- Ansible\n{sb}"
            )
            .into());
        }
        for want in [
            "ops:/home/ops:/bin/bash\nops deploy\n".to_owned(),
            format!("/home/ops/.ssh/authorized_keys 600 ops:ops\n{ADMIN_KEY}\n!\n"),
            "/etc/sudoers.d/90-recipes-ops 440 root:root\nops ALL=(ALL) NOPASSWD:ALL\n".into(),
            "== packages\nii curl ".into(),
            format!("\nii nginx {nginx}\n"),
            format!(
                "/etc/app/app.conf 640 ops:deploy regular file\n/srv/app 755 ops:root directory\n{}machine {i}\n",
                app_conf(i)
            ),
            format!("/etc/systemd/system/app.service\n{UNIT}{DROP_IN}"),
            format!(
                "== system\nweb-{i}\nweb-{i}\nEurope/Paris\nlocaltime Europe/Paris\n1\n1\n{}\n",
                MODULES.join("\n")
            ),
        ] {
            if !sa.contains(&want) {
                return Err(format!("machine {i}: missing {want:?} in\n{sa}").into());
            }
        }
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Res<()> {
    let mut hosts = 50;
    let mut ansible_first = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--hosts" => hosts = args.next().ok_or("--hosts N")?.parse()?,
            "--ansible-first" => ansible_first = true,
            other => {
                return Err(
                    format!("unknown argument {other} (--hosts N, --ansible-first)").into(),
                );
            }
        }
    }
    let ansible = ansible::playbook_bin();
    let collections = ansible::cache_dir().join("ansible/lib");
    let has_collections = std::fs::read_dir(&collections)
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|py| py.ok())
        .is_some_and(|py| {
            py.path()
                .join("site-packages/ansible_collections/community/general")
                .is_dir()
        });
    if !ansible.exists() || !has_collections {
        return Err(format!(
            "{} or its collections (community.general, ansible.posix) are missing: run WITH_BENCH_PEERS=1 bash scripts/peers/10-openssh.sh",
            ansible.display()
        )
        .into());
    }
    let root = ansible::cache_dir().join("bookworm-bench");
    if !root.join("usr/bin/systemctl").exists() {
        return Err(format!(
            "{} is missing: run WITH_BENCH_PEERS=1 bash scripts/peers/40-local-root.sh",
            root.display()
        )
        .into());
    }
    let nginx = Command::new("dpkg-query")
        .arg(format!(
            "--admindir={}",
            root.join("var/lib/dpkg").display()
        ))
        .args(["-W", "-f=${Version}", "nginx"])
        .output()?;
    let nginx = String::from_utf8(nginx.stdout)?;
    if nginx.is_empty() {
        return Err(format!("no nginx in {}", root.display()).into());
    }

    // The lab (a bridge and subnet of its own) tears every machine down when dropped,
    // also on error or panic; a lab left by a killed run is swept by the next one.
    let lab = tests::Lab::new();
    let mut config = LocalConfig::new("bench")
        .with_bridge(&lab.bridge)
        .with_subnet(&lab.subnet)
        .with_run_dir(&lab.run_dir);
    config.root = root;
    let provider = Arc::new(LocalProvider::new(config)?);

    let tmp = tempfile::tempdir()?;
    let key = tmp.path().join("id");
    let public = ansible::keygen(&key)?;
    let kh = tmp.path().join("known_hosts");
    std::fs::write(&kh, "")?;
    let ssh = SshAccess {
        user: "root".into(),
        authorized_keys: vec![public],
    };
    let boot_connector = Arc::new(SshConnector::new(
        SshConfig::new(vec![Auth::key_file(&key, None)?]).with_host_keys(HostKeyPolicy::Verify {
            known_hosts: Some(kh.clone()),
        }),
    ));
    let booted = CloudConfigLayer::new(
        "booted",
        CloudConfig::new().with_file(WriteFile::new("/etc/bench-booted", "1\n")),
    )?;
    let composer = Composer::builder(provider.clone())
        .settings(ComposerSettings::default().with_poll_interval(Duration::from_millis(100)))
        .coupled(Arc::new(booted))
        .connector(boot_connector)
        .completion(Arc::new(CloudInitStatus::new()))
        .build()?;

    let t0 = Instant::now();
    let ours = boot(&composer, "ours", hosts, &ssh).await?;
    let theirs = boot(&composer, "ansible", hosts, &ssh).await?;
    let boot_secs = t0.elapsed().as_secs_f64();
    // Ansible's ssh verifies the same host keys our connector pins.
    let mut known = String::new();
    for m in &theirs {
        let host = &m.access.ssh.as_ref().ok_or("a machine without SSH")?.host;
        for k in &m.access.host_keys {
            let _ = writeln!(known, "{host} {k}");
        }
    }
    let akh = tmp.path().join("ansible_known_hosts");
    std::fs::write(&akh, known)?;
    let adir = tmp.path().join("ansible");
    write_ansible(&adir, &key, &akh, &theirs, &nginx)?;

    let load = std::fs::read_to_string("/proc/loadavg")?;
    // One side after the other (the order is a flag), each timed alone.
    let ansible_side = || -> Res<(f64, f64, String)> {
        let (c0, w0) = (cpu(true), Instant::now());
        let recap = apply_ansible(&adir)?;
        Ok((w0.elapsed().as_secs_f64(), cpu(true) - c0, recap))
    };
    let mut ansible_run = None;
    if ansible_first {
        ansible_run = Some(ansible_side()?);
    }
    let (c0, w0) = (cpu(false), Instant::now());
    let steps = apply_ours(&key, &kh, &ours, &nginx).await?;
    let (ours_wall, ours_cpu) = (w0.elapsed().as_secs_f64(), cpu(false) - c0);
    let (ans_wall, ans_cpu, recap) = match ansible_run {
        Some(run) => run,
        None => ansible_side()?,
    };
    let load_after = std::fs::read_to_string("/proc/loadavg")?;

    verify(&key, &kh, &ours, &theirs, &nginx).await?;
    let version = Command::new(&ansible)
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("?")
                .to_owned()
        })
        .unwrap_or_else(|_| "?".into());
    let tasks = recap.matches("\nTASK [").count();
    println!(
        "recipes vs Ansible: a 10-recipe layer ({steps} steps; Ansible: {tasks} tasks) on {hosts} + {hosts} fresh provider-local machines (booted in {boot_secs:.1} s, not timed); {} first; load average before the applies {}, after {}",
        if ansible_first { "Ansible" } else { "ours" },
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        load_after
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("peer: {version}, forks=50, pipelining, gather_facts false");
    println!("{:<34} {:>9} {:>15}", "side", "wall (s)", "client CPU (s)");
    println!(
        "{:<34} {:>9.2} {:>15.2}",
        "recipes -> StepLayer -> bootstrap-ssh", ours_wall, ours_cpu
    );
    println!(
        "{:<34} {:>9.2} {:>15.2}",
        "Ansible (ansible-playbook)", ans_wall, ans_cpu
    );
    println!(
        "ratio ours / Ansible: wall {:.3}x (target <= 0.1), client CPU {:.3}x; every machine verified, ours equal to Ansible's",
        ours_wall / ans_wall,
        ours_cpu / ans_cpu.max(0.01)
    );
    Ok(())
}
