//! Benchmark of bootstrap-ssh against Ansible and plain OpenSSH, in the same run, on the
//! same 50 sshd targets (loopback ports, each its own sshd and host key): upload one
//! 64 KiB file and run three commands on every target.
//!
//! ```text
//! WITH_BENCH_PEERS=1 bash scripts/peers/10-openssh.sh   # sshd, ssh, and ansible-core in a venv
//! cargo run --release -p examples --example bench_ssh [-- --hosts 50 --rounds 3]
//! ```
//!
//! Every tool uses the key exchange curve25519-sha256 and verifies host keys. Client CPU
//! is the user + system time of the client side only (this process for bootstrap-ssh,
//! the waited children for ssh and ansible), read from /proc. Server CPU is the sshd
//! side: every sshd listener's own and reaped children's time (the connection
//! processes, the shells and every program they ran), read from /proc once all of
//! them have been reaped.
//!
//! `--no-ansible` leaves Ansible out (it takes minutes at 500 hosts). `--upload-only`
//! does the upload alone on every target (OpenSSH's floor is then `cat > F` alone):
//! what one upload costs the server, apart from the commands.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../bench/ansible.rs"]
mod ansible;

use anyhow::{Context, bail, ensure};
use bootstrap_ssh::{Auth, HostKeyPin, HostKeyPolicy, SshClient, SshConfig, SshTarget};
use machine_core::{ExecRequest, FileUpload, Transport};

const SSHD: &str = "/usr/sbin/sshd";
const COMMANDS: [&str; 3] = ["sha256sum {dest}", "uname -a", "test -s {dest} && echo ok"];

struct Target {
    port: u16,
    host_key: String,
    _child: Killed,
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// User + system CPU of the sshd listeners and their reaped children, in seconds, once
/// no listener has a child left (the last connections may still be closing).
fn server_cpu(targets: &[Target]) -> f64 {
    let pids: std::collections::HashSet<u32> = targets.iter().map(|t| t._child.0.id()).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let busy = std::fs::read_dir("/proc")
            .map(|d| {
                d.flatten().any(|e| {
                    let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
                    let ppid = stat
                        .rsplit_once(") ")
                        .and_then(|(_, r)| r.split(' ').nth(1))
                        .and_then(|p| p.parse::<u32>().ok());
                    ppid.is_some_and(|p| pids.contains(&p))
                })
            })
            .unwrap_or(false);
        if !busy {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let tick = 100.0;
    pids.iter()
        .map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let f: Vec<f64> = stat
                .rsplit_once(')')
                .map_or("", |(_, r)| r)
                .split_whitespace()
                .map(|x| x.parse().unwrap_or(0.0))
                .collect();
            // utime, stime, cutime, cstime: fields 14-17 of stat(5).
            f.get(11..15).map_or(0.0, |v| v.iter().sum::<f64>()) / tick
        })
        .sum()
}

/// User + system CPU of this process (`self_`) or of its waited children, in seconds.
fn cpu(children: bool) -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // Fields 14-17 of stat(5), counted from after the command name (field 3 is index 0).
    let (u, s) = if children {
        (f[13], f[14])
    } else {
        (f[11], f[12])
    };
    (u + s) / 100.0
}

fn start_targets(dir: &Path, n: usize) -> anyhow::Result<Vec<Target>> {
    std::fs::create_dir_all("/run/sshd")?;
    let mut targets = Vec::new();
    for i in 0..n {
        let d = dir.join(format!("t{i}"));
        std::fs::create_dir_all(&d)?;
        let host_key = ansible::keygen(&d.join("host_key"))?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dd = d.display();
        std::fs::write(
            d.join("sshd_config"),
            format!(
                "ListenAddress 127.0.0.1:{port}\nHostKey {dd}/host_key\nPidFile {dd}/pid\nAuthorizedKeysFile {}/authorized_keys\n\
                 UsePAM no\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 PermitRootLogin prohibit-password\nSetEnv SHLVL=1\nMaxStartups 200\nLogLevel ERROR\n",
                dir.display()
            ),
        )?;
        let child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        targets.push(Target {
            port,
            host_key,
            _child: Killed(child),
        });
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    for t in &targets {
        while std::net::TcpStream::connect(("127.0.0.1", t.port)).is_err() {
            ensure!(
                Instant::now() < deadline,
                "sshd on port {} did not start",
                t.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(targets)
}

fn dest(dir: &Path, tool: &str, i: usize) -> String {
    dir.join("out")
        .join(tool)
        .join(format!("{i}.bin"))
        .display()
        .to_string()
}

async fn bench_ours(
    dir: &Path,
    key: &Path,
    targets: &[Target],
    payload: &[u8],
    commands: &'static [&'static str],
) -> anyhow::Result<()> {
    let config = Arc::new(
        SshConfig::new(vec![Auth::key_file(key, None)?])
            .with_host_keys(HostKeyPolicy::Verify { known_hosts: None }),
    );
    let mut tasks = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        let config = config.clone();
        let pins = vec![HostKeyPin::parse("pin", &t.host_key)?];
        let target = SshTarget::new("127.0.0.1", t.port, "root")?;
        let dest = dest(dir, "bootstrap-ssh", i);
        let payload = payload.to_vec();
        tasks.push(tokio::spawn(async move {
            let c = SshClient::connect(&config, &target, &pins).await?;
            c.upload(&FileUpload::new(dest.clone(), payload)).await?;
            for cmd in commands {
                let cmd = cmd.replace("{dest}", &dest);
                c.exec(&ExecRequest::new(cmd.clone())).await?.check(&cmd)?;
            }
            c.close().await;
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

fn bench_openssh(
    dir: &Path,
    key: &Path,
    kh: &Path,
    targets: &[Target],
    payload_path: &Path,
    commands: &[&str],
) -> anyhow::Result<()> {
    let mut children = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        let dest = dest(dir, "openssh", i);
        let script = std::iter::once(format!("cat > {dest}"))
            .chain(commands.iter().map(|c| c.replace("{dest}", &dest)))
            .collect::<Vec<_>>()
            .join(" && ");
        let child = Command::new("ssh")
            .args([
                "-F",
                "/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "KexAlgorithms=curve25519-sha256",
                "-o",
                "StrictHostKeyChecking=yes",
            ])
            .arg("-o")
            .arg(format!("UserKnownHostsFile={}", kh.display()))
            .arg("-i")
            .arg(key)
            .args(["-p", &t.port.to_string(), "root@127.0.0.1", &script])
            .stdin(std::fs::File::open(payload_path)?)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        children.push(child);
    }
    for c in children {
        let out = c.wait_with_output()?;
        ensure!(
            out.status.success(),
            "ssh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn bench_ansible(
    dir: &Path,
    key: &Path,
    kh: &Path,
    targets: &[Target],
    payload_path: &Path,
) -> anyhow::Result<()> {
    let adir = dir.join("ansible");
    let hosts: Vec<String> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            format!(
                "t{i} ansible_host=127.0.0.1 ansible_port={} dest={}",
                t.port,
                dest(dir, "ansible", i)
            )
        })
        .collect();
    ansible::write_setup(&adir, &hosts, key, kh)?;
    let mut tasks = format!(
        "    - copy: {{src: {}, dest: \"{{{{ dest }}}}\"}}\n",
        payload_path.display()
    );
    for c in COMMANDS {
        tasks.push_str(&format!(
            "    - shell: \"{}\"\n",
            c.replace("{dest}", "{{ dest }}")
        ));
    }
    std::fs::write(
        adir.join("play.yml"),
        format!("- hosts: targets\n  gather_facts: false\n  tasks:\n{tasks}"),
    )?;
    let out = Command::new(ansible::playbook_bin())
        .arg("-i")
        .arg(adir.join("inventory"))
        .arg(adir.join("play.yml"))
        .env("ANSIBLE_CONFIG", adir.join("ansible.cfg"))
        .env("ANSIBLE_LOCAL_TEMP", adir.join("tmp"))
        .env("ANSIBLE_HOME", adir.join("home"))
        .stdin(Stdio::null())
        .output()?;
    ensure!(
        out.status.success(),
        "ansible-playbook: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

struct Figure {
    wall: f64,
    cpu: f64,
    server: f64,
}

fn median(mut v: Vec<Figure>) -> Figure {
    v.sort_by(|a, b| a.wall.total_cmp(&b.wall));
    v.swap_remove(v.len() / 2)
}

fn main() -> anyhow::Result<()> {
    let mut hosts = 50;
    let mut rounds = 3;
    let mut with_ansible = true;
    let mut commands: &'static [&'static str] = &COMMANDS;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--hosts" => hosts = args.next().context("--hosts N")?.parse()?,
            "--rounds" => rounds = args.next().context("--rounds N")?.parse()?,
            "--no-ansible" => with_ansible = false,
            "--upload-only" => {
                commands = &[];
                with_ansible = false;
            }
            "--help" | "-h" => {
                println!(
                    "bench_ssh [--hosts N] [--rounds R] [--no-ansible] [--upload-only]\n\
                     N sshd targets on loopback (default 50); on each, upload 64 KiB and run 3 commands,\n\
                     with bootstrap-ssh and with one OpenSSH pipe per target (the floor: `cat > F && ...`),\n\
                     R rounds (default 3, the median by wall reported), Ansible once unless --no-ansible.\n\
                     --upload-only: the upload alone (the floor `cat > F` alone), Ansible left out.\n\
                     Server CPU: every sshd listener's own and reaped children's CPU."
                );
                return Ok(());
            }
            other => bail!("unknown argument {other}"),
        }
    }
    for (tool, pkg) in [
        (SSHD, "openssh-server"),
        ("/usr/bin/ssh", "openssh-client"),
        ("/usr/bin/ssh-keygen", "openssh-client"),
    ] {
        ensure!(
            Path::new(tool).exists(),
            "{tool} is missing: run scripts/peers/10-openssh.sh (or apt-get install -y {pkg})"
        );
    }
    let ansible = ansible::playbook_bin();
    ensure!(
        !with_ansible || ansible.exists(),
        "{} is missing: run WITH_BENCH_PEERS=1 bash scripts/peers/10-openssh.sh (installs ansible-core from PyPI into a venv)",
        ansible.display()
    );
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let key = dir.join("client_key");
    let pubkey = ansible::keygen(&key)?;
    std::fs::write(dir.join("authorized_keys"), format!("{pubkey}\n"))?;
    let targets = start_targets(dir, hosts)?;
    let kh = dir.join("known_hosts");
    std::fs::write(
        &kh,
        targets
            .iter()
            .map(|t| format!("[127.0.0.1]:{} {}\n", t.port, t.host_key))
            .collect::<String>(),
    )?;
    let payload: Vec<u8> = (0..64 * 1024)
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let payload_path = dir.join("payload.bin");
    std::fs::write(&payload_path, &payload)?;
    for tool in ["bootstrap-ssh", "openssh", "ansible"] {
        std::fs::create_dir_all(dir.join("out").join(tool))?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;

    let measure =
        |children: bool, f: &mut dyn FnMut() -> anyhow::Result<()>| -> anyhow::Result<Figure> {
            let s0 = server_cpu(&targets);
            let (c0, t0) = (cpu(children), Instant::now());
            f()?;
            let wall = t0.elapsed().as_secs_f64();
            let cpu = cpu(children) - c0;
            Ok(Figure {
                wall,
                cpu,
                server: server_cpu(&targets) - s0,
            })
        };
    let (mut ours, mut openssh, mut ansible_runs) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        ours.push(measure(false, &mut || {
            rt.block_on(bench_ours(dir, &key, &targets, &payload, commands))
        })?);
        openssh.push(measure(true, &mut || {
            bench_openssh(dir, &key, &kh, &targets, &payload_path, commands)
        })?);
        // Ansible takes tens of seconds a run: once is enough to compare against.
        if round == 0 && with_ansible {
            ansible_runs.push(measure(true, &mut || {
                bench_ansible(dir, &key, &kh, &targets, &payload_path)
            })?);
        }
    }
    let tools: &[&str] = if with_ansible {
        &["bootstrap-ssh", "openssh", "ansible"]
    } else {
        &["bootstrap-ssh", "openssh"]
    };
    for i in 0..hosts {
        for &tool in tools {
            let got =
                std::fs::read(dest(dir, tool, i)).with_context(|| format!("{tool} target {i}"))?;
            ensure!(
                got == payload,
                "{tool} wrote a different file to target {i}"
            );
        }
    }
    let (ours, openssh) = (median(ours), median(openssh));
    let ansible = if with_ansible {
        Some(median(ansible_runs))
    } else {
        None
    };
    let version = |cmd: &Path, arg: &str| {
        Command::new(cmd).arg(arg).output().map_or_else(
            |_| "?".into(),
            |o| {
                let t = if o.stdout.is_empty() {
                    o.stderr
                } else {
                    o.stdout
                };
                String::from_utf8_lossy(&t)
                    .lines()
                    .next()
                    .unwrap_or("?")
                    .to_owned()
            },
        )
    };
    println!(
        "bootstrap-ssh benchmark: {hosts} sshd targets on loopback, upload 64 KiB + {} commands each, kex curve25519-sha256",
        commands.len()
    );
    println!(
        "peers: {} | {} | russh 0.65",
        version(Path::new("/usr/bin/ssh"), "-V"),
        if with_ansible {
            version(&ansible::playbook_bin(), "--version")
        } else {
            "Ansible not run".to_owned()
        }
    );
    println!(
        "{:<30} {:>9} {:>15} {:>15}",
        "tool", "wall (s)", "client CPU (s)", "server CPU (s)"
    );
    let row = |name: String, f: &Figure| {
        println!(
            "{:<30} {:>9.2} {:>15.2} {:>15.2}",
            name, f.wall, f.cpu, f.server
        )
    };
    row(format!("bootstrap-ssh (median of {rounds})"), &ours);
    row(format!("OpenSSH parallel (median of {rounds})"), &openssh);
    if let Some(a) = &ansible {
        row("Ansible forks=50 pipelining".to_owned(), a);
        println!(
            "vs Ansible: wall {:.3}x (target <= 0.5), client CPU {:.3}x",
            ours.wall / a.wall,
            ours.cpu / a.cpu.max(0.01)
        );
    }
    println!(
        "vs OpenSSH (the floor): wall {:.2}x (target <= 1.0), client CPU {:.2}x (target <= 0.2), server CPU {:.2}x (target <= 1.0)",
        ours.wall / openssh.wall,
        ours.cpu / openssh.cpu.max(0.01),
        ours.server / openssh.server.max(0.01)
    );
    Ok(())
}
