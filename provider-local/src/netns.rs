//! The namespace engine: a machine is a network namespace with a veth on the
//! provider's bridge, and a process tree in its own mount, PID, UTS and IPC namespaces
//! chrooted into an overlay over the cached Debian root.
//!
//! Why not systemd as PID 1, systemd-nspawn or podman: on this kind of host PID 1 is not
//! systemd, nspawn cannot reach a system bus and crun cannot raise RLIMIT_NOFILE (see
//! the project's test-peer notes). unshare, nsenter and chroot work everywhere root
//! does, and real cloud-init runs its four stages in order under them.
//!
//! Nothing is mounted in the host's mount namespace: the overlay, /proc, /sys and /dev
//! of a machine live in its private mount namespace and vanish with its last process.
//! `unshare --kill-child` ties the machine's PID 1 to the boot process, so killing that
//! one process by PID ends the whole machine.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use machine_core::{Error, ErrorKind, Result};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::engine::{Engine, Network};
use crate::errors;
use crate::state::{MachineRecord, ProcessRef};

/// What a usable root must hold, and why.
const ROOT_NEEDS: [(&str, &str); 6] = [
    ("etc/os-release", "an operating system"),
    ("bin/sh", "a shell"),
    ("usr/bin/cloud-init", "cloud-init"),
    ("usr/sbin/sshd", "openssh-server"),
    ("usr/bin/sudo", "sudo"),
    ("usr/bin/python3", "python3"),
];

/// The boot log in the machine's directory: the boot process's output (cloud-init's
/// stages and sshd's log).
pub const BOOT_LOG: &str = "boot.log";

/// Run by `sh` as PID 1 of the machine's namespaces: mount its world, then become the
/// machine. cloud-init's stages run in boot order whatever each one returns (as a
/// booting system does); then sshd, with host keys the machine made (by cloud-init, or
/// by ssh-keygen when the user data turned that off), listens on the machine's address.
/// sh stays PID 1 rather than exec'ing sshd: sshd rewrites its environment for its
/// process title, and cloud-init parses PID 1's environment (`cloud-init status`
/// crashed on sshd's).
const BOOT_SCRIPT: &str = r#"set -e
R="$MACHINE_DIR/root"
mount -t overlay overlay -o "lowerdir=$LOWER,upperdir=$MACHINE_DIR/upper,workdir=$MACHINE_DIR/work" "$R"
mount -t proc proc "$R/proc"
mount -t sysfs sysfs "$R/sys"
mount --rbind /dev "$R/dev"
hostname "$MACHINE_NAME"
mkdir -p "$R/run/sshd"
exec chroot "$R" /bin/sh -c '
cloud-init init --local; cloud-init init; cloud-init modules --mode config; cloud-init modules --mode final
ls /etc/ssh/ssh_host_*_key >/dev/null 2>&1 || ssh-keygen -A
/usr/sbin/sshd -D -e -o "ListenAddress=$MACHINE_IP" -o "AuthorizedKeysFile=.ssh/authorized_keys /etc/ssh/provider-keys/%u" &
wait $!'
"#;

/// How long halting waits for a machine's processes to be gone.
const HALT_TIMEOUT: Duration = Duration::from_secs(10);

/// The namespace engine over the Debian root at `root`.
#[derive(Debug, Clone)]
pub struct NamespaceEngine {
    root: PathBuf,
}

impl NamespaceEngine {
    /// An engine whose machines boot from `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        NamespaceEngine { root: root.into() }
    }

    /// Checks `root` is a Debian root with what machines need; the error names the
    /// root, what is missing, and the script that builds it.
    pub fn check_root(&self) -> Result<()> {
        let root = &self.root;
        if !root.is_dir() {
            return Err(Error::invalid_spec(
                "root",
                format!(
                    "machine root {} does not exist; build it with scripts/peers/20-cloud-init.sh and scripts/peers/40-local-root.sh",
                    root.display()
                ),
            ));
        }
        for (path, what) in ROOT_NEEDS {
            let p = root.join(path);
            let usable = fs::metadata(&p).is_ok_and(|m| m.len() > 0);
            if !usable {
                return Err(Error::invalid_spec(
                    "root",
                    format!(
                        "machine root {} is corrupt or incomplete: {} ({what}) is missing or empty; rebuild it with scripts/peers/40-local-root.sh",
                        root.display(),
                        p.display()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Runs `ip` with `args`; `tolerate` lists stderr fragments that mean "already so".
fn ip(args: &[&str], tolerate: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| errors::spawn("ip", e))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    if tolerate.iter().any(|t| stderr.contains(t)) {
        return Ok(());
    }
    Err(errors::command(&format!("ip {}", args.join(" ")), &out))
}

/// The start time of `pid` (field 22 of its stat), unless it is gone or a zombie.
fn start_ticks(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // rest starts at field 3 (state); field 22 is index 19.
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

fn alive(p: &ProcessRef) -> bool {
    start_ticks(p.pid) == Some(p.start_ticks)
}

/// Every process whose network namespace is the one at `ns_path`.
fn processes_in_netns(ns_path: &Path) -> Vec<i32> {
    let Ok(meta) = fs::metadata(ns_path) else {
        return Vec::new();
    };
    let want = format!("net:[{}]", meta.ino());
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read_link(format!("/proc/{pid}/ns/net")).is_ok_and(|l| l.to_string_lossy() == want)
        })
        .collect()
}

/// What `ip link del` says of a link that is gone already: not there when it looked
/// up the name ("Cannot find device"), or gone between that lookup and its delete ("No
/// such device", as when the kernel removes a veth pair after its namespace).
const LINK_GONE: [&str; 2] = ["Cannot find device", "No such device"];

impl Engine for NamespaceEngine {
    fn preflight(&self) -> Result<()> {
        let uid = nix::unistd::geteuid();
        if !uid.is_root() {
            return Err(Error::new(
                ErrorKind::Unauthorized,
                format!(
                    "provider-local makes namespaces, bridges and mounts and must run as root (running as uid {uid})"
                ),
            ));
        }
        for tool in ["ip", "nsenter", "unshare"] {
            Command::new(tool)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map_err(|e| errors::spawn(tool, e))?;
        }
        self.check_root()
    }

    fn ensure_network(&self, n: &Network) -> Result<()> {
        let br = n.bridge.as_str();
        ip(&["link", "add", br, "type", "bridge"], &["File exists"])?;
        ip(
            &[
                "addr",
                "replace",
                &format!("{}/{}", n.gateway, n.prefix),
                "dev",
                br,
            ],
            &[],
        )?;
        ip(&["link", "set", br, "up"], &[])
    }

    fn remove_network(&self, n: &Network) -> Result<()> {
        ip(&["link", "del", &n.bridge], &LINK_GONE)
    }

    fn write_file(&self, dir: &Path, path: &str, bytes: &[u8], mode: u32) -> Result<()> {
        let target = dir.join("upper").join(path.trim_start_matches('/'));
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(|e| errors::io("creating", parent, e))?;
        }
        crate::state::write_atomic(&target, bytes, mode)
    }

    fn read_file(&self, dir: &Path, path: &str) -> Result<Option<Vec<u8>>> {
        let rel = path.trim_start_matches('/');
        // A file the machine deleted is an overlay whiteout (a 0/0 character device)
        // in its upper layer: gone, whatever the root holds.
        let upper = dir.join("upper").join(rel);
        if let Ok(meta) = fs::symlink_metadata(&upper) {
            use std::os::unix::fs::FileTypeExt;
            if meta.file_type().is_char_device() && meta.rdev() == 0 {
                return Ok(None);
            }
        }
        // The machine's changes first; what it never changed is the root's.
        for base in [dir.join("upper"), self.root.clone()] {
            let p = base.join(rel);
            match fs::read(&p) {
                Ok(b) => return Ok(Some(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(errors::io("reading", &p, e)),
            }
        }
        Ok(None)
    }

    fn boot(&self, dir: &Path, r: &MachineRecord) -> Result<ProcessRef> {
        let ns = r.netns();
        let veth = r.host_veth();
        let ns_path = format!("/run/netns/{ns}");
        if !Path::new(&ns_path).exists() {
            ip(&["netns", "add", &ns], &["File exists"])?;
        }
        if !Path::new("/sys/class/net").join(&veth).exists() {
            ip(
                &[
                    "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
                ],
                &[],
            )?;
        }
        ip(&["link", "set", &veth, "master", &r.bridge, "up"], &[])?;
        let cidr = format!("{}/{}", r.address, r.prefix);
        ip(&["-n", &ns, "addr", "replace", &cidr, "dev", "eth0"], &[])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"], &[])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"], &[])?;
        let gw = r.gateway.to_string();
        ip(&["-n", &ns, "route", "replace", "default", "via", &gw], &[])?;

        // A fresh /run for every boot, as a tmpfs would give (cloud-init's status
        // of the last boot must not look like this one's).
        let run = dir.join("upper/run");
        if run.exists() {
            fs::remove_dir_all(&run).map_err(|e| errors::io("clearing", &run, e))?;
        }
        for d in ["upper", "work", "root"] {
            let p = dir.join(d);
            fs::create_dir_all(&p).map_err(|e| errors::io("creating", &p, e))?;
        }
        let log_path = dir.join(BOOT_LOG);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| errors::io("opening", &log_path, e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| errors::io("opening", &log_path, e))?;
        let mut child = Command::new("nsenter")
            .arg(format!("--net={ns_path}"))
            .args([
                "unshare",
                "--mount",
                "--uts",
                "--ipc",
                "--pid",
                "--fork",
                "--kill-child",
                "--propagation",
                "private",
                "/bin/sh",
                "-c",
                BOOT_SCRIPT,
            ])
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("LANG", "C.UTF-8")
            // The systemd convention for "this is a container", which cloud-init reads.
            .env("container", "provider-local")
            .env("MACHINE_DIR", dir)
            .env("LOWER", &self.root)
            .env("MACHINE_NAME", r.name.as_str())
            .env("MACHINE_IP", r.address.to_string())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            // Its own process group: a signal to the caller's group (Ctrl-C) leaves
            // machines running, to be adopted or deleted later.
            .process_group(0)
            .spawn()
            .map_err(|e| errors::spawn("nsenter", e))?;
        let pid = i32::try_from(child.id())
            .map_err(|_| Error::permanent("the boot process has an impossible PID"))?;
        let start = start_ticks(pid);
        // Reap it when it ends, so it never lingers as a zombie of this process.
        std::thread::spawn(move || child.wait());
        let start_ticks = start.ok_or_else(|| {
            Error::permanent(format!(
                "the boot process of {} ended at once; see {}",
                r.name,
                log_path.display()
            ))
        })?;
        Ok(ProcessRef { pid, start_ticks })
    }

    fn is_running(&self, r: &MachineRecord) -> bool {
        r.boot.as_ref().is_some_and(alive)
    }

    fn halt(&self, r: &MachineRecord) -> Result<()> {
        let ns_path = PathBuf::from(format!("/run/netns/{}", r.netns()));
        let deadline = Instant::now() + HALT_TIMEOUT;
        loop {
            // The boot process (its death takes the machine's PID 1 and so every
            // process of the machine), and anything else in the machine's network
            // namespace, such as a command someone ran there with nsenter.
            let mut pids = processes_in_netns(&ns_path);
            if let Some(boot) = r.boot.filter(alive) {
                pids.push(boot.pid);
            }
            if pids.is_empty() {
                return Ok(());
            }
            for pid in &pids {
                // Gone already is fine; anything else shows up as still alive below.
                let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
            }
            if Instant::now() > deadline {
                return Err(Error::transient(format!(
                    "processes {pids:?} of machine {} survived SIGKILL for {HALT_TIMEOUT:?}",
                    r.name
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn remove(&self, r: &MachineRecord) -> Result<()> {
        self.halt(r)?;
        // Deleting the namespace deletes its end of the veth pair and so both ends.
        ip(&["netns", "del", &r.netns()], &["No such file"])?;
        // The kernel removes the pair asynchronously after the namespace.
        ip(&["link", "del", &r.host_veth()], &LINK_GONE)
    }
}
