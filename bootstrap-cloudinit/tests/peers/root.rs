//! A Debian 12 root with the real cloud-init, booted through all four stages.
//!
//! scripts/peers/20-cloud-init.sh debootstraps the root once into
//! `${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning/bookworm-cloud-init`; each
//! [`Root`] lays a private overlay over it (inside its own mount namespace, so nothing is
//! left mounted even when the test dies) and its changes land in a temporary upper layer,
//! which outlives the namespaces: tests read the machine's files from there.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;

use async_trait::async_trait;
use machine_core::{Error, ExecOutput, ExecRequest, FileUpload, Result, Transport};

fn lower() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache"));
    let dir = cache.join("machine-provisioning/bookworm-cloud-init");
    assert!(
        dir.join("usr/bin/cloud-init").exists(),
        "{} has no Debian root with cloud-init: run scripts/peers/20-cloud-init.sh",
        dir.display()
    );
    dir
}

/// A network namespace of the test's own, with only loopback (up). Whatever is bound
/// through [`NetNs::enter`] and every command run in a [`Root`] given it share that
/// loopback, and nothing else. It disappears with the last file or socket holding it.
pub struct NetNs {
    fd: OwnedFd,
}

impl NetNs {
    /// Creates the namespace and runs `bind` inside it (on a thread of its own, since a
    /// namespace belongs to a thread); a socket made there stays in it.
    pub fn with<T: Send + 'static>(bind: impl FnOnce() -> T + Send + 'static) -> (Self, T) {
        std::thread::spawn(move || {
            // Only this fresh, short-lived thread changes namespace.
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("unshare(CLONE_NEWNET): {e} (the tests run as root)"));
            let up = std::process::Command::new("ip")
                .args(["link", "set", "lo", "up"])
                .status()
                .expect("ip is missing: apt-get install iproute2");
            assert!(up.success(), "ip link set lo up failed");
            let fd = OwnedFd::from(
                std::fs::File::open("/proc/thread-self/ns/net").expect("own net namespace"),
            );
            (NetNs { fd }, bind())
        })
        .join()
        .expect("namespace thread")
    }

    fn path(&self) -> String {
        format!("/proc/{}/fd/{}", std::process::id(), self.fd.as_raw_fd())
    }
}

/// A Debian root (overlay over the cached one) that commands run in.
pub struct Root {
    tmp: tempfile::TempDir,
    lower: PathBuf,
    net: Option<String>,
}

impl Root {
    /// A root whose NoCloud seed holds `user_data` and the meta-data of `instance`.
    pub fn new(user_data: &[u8], instance: &str) -> Self {
        Root::over(lower(), user_data, instance)
    }

    /// As [`Root::new`] over another Debian root with cloud-init (such as
    /// provider-local's, which has sudo too).
    pub fn over(lower: PathBuf, user_data: &[u8], instance: &str) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        for d in ["upper", "work", "merged"] {
            std::fs::create_dir(tmp.path().join(d)).unwrap();
        }
        let up = tmp.path().join("upper");
        let seed = up.join("var/lib/cloud/seed/nocloud");
        std::fs::create_dir_all(&seed).unwrap();
        std::fs::write(seed.join("user-data"), user_data).unwrap();
        std::fs::write(
            seed.join("meta-data"),
            format!("instance-id: {instance}\nlocal-hostname: {instance}\n"),
        )
        .unwrap();
        let cfg = up.join("etc/cloud/cloud.cfg.d");
        std::fs::create_dir_all(&cfg).unwrap();
        // The image's own settings: minbase has no locales package, so the locale
        // module is off in the image (not in the user data under test).
        std::fs::write(
            cfg.join("90-test.cfg"),
            "datasource_list: [ NoCloud, None ]\nlocale: false\n",
        )
        .unwrap();
        Root {
            tmp,
            lower,
            net: None,
        }
    }

    /// Runs commands in `net` instead of a namespace with no network at all.
    pub fn in_netns(mut self, net: &NetNs) -> Self {
        self.net = Some(net.path());
        self
    }

    /// Where `path` of the machine lands on this host.
    pub fn upper(&self, path: &str) -> PathBuf {
        self.tmp
            .path()
            .join("upper")
            .join(path.trim_start_matches('/'))
    }

    /// Runs `command` with sh inside the root, in fresh namespaces.
    pub fn run(&self, command: &str) -> std::process::Output {
        let t = self.tmp.path();
        let net = if self.net.is_some() { "" } else { "--net" };
        let script = format!(
            "mount -t overlay overlay -o lowerdir=\"$LOWER\",upperdir=\"$T/upper\",workdir=\"$T/work\" \"$T/merged\" && \
            exec unshare --uts {net} --ipc --pid --fork --mount-proc=\"$T/merged/proc\" chroot \"$T/merged\" /bin/sh -c \"$CMD\""
        );
        let mut cmd = match &self.net {
            Some(path) => {
                let mut c = std::process::Command::new("/usr/bin/nsenter");
                c.arg(format!("--net={path}")).arg("/usr/bin/unshare");
                c
            }
            None => std::process::Command::new("/usr/bin/unshare"),
        };
        cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .env("LOWER", &self.lower)
            .env("T", t)
            .env("CMD", command)
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .expect("unshare/nsenter are missing: apt-get install util-linux")
    }

    /// Boots: cloud-init's four stages, then the machine stays up (up to 30 s) while a
    /// completion waiter the user data started is still at work, as a real machine would.
    pub fn boot(&self) {
        let out = self.run(&format!(
            "cloud-init init --local; cloud-init init; cloud-init modules --mode config; cloud-init modules --mode final; \
             i=0; while [ $i -lt 300 ] && grep -qs '{}' /proc/[0-9]*/cmdline; do sleep 0.1; i=$((i+1)); done; true",
            // A bracket keeps grep's own command line from matching.
            machine_core::user_data::WAITER_MARKER.replacen('-', "[-]", 1)
        ));
        assert!(
            out.status.success(),
            "boot failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A file cloud-init wrote, as text; panics naming it when it is missing.
    pub fn read(&self, path: &str) -> String {
        std::fs::read_to_string(self.upper(path))
            .unwrap_or_else(|e| panic!("{path} was not written on the machine: {e}"))
    }

    /// The mode bits of a file on the machine.
    pub fn mode(&self, path: &str) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(self.upper(path))
            .unwrap_or_else(|e| panic!("{path} was not written on the machine: {e}"))
            .permissions()
            .mode()
            & 0o7777
    }

    /// The line of the machine's /etc/passwd (or /etc/group) for `name`, if any.
    pub fn account(&self, file: &str, name: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.upper(file))
            .or_else(|_| std::fs::read_to_string(self.lower.join(file.trim_start_matches('/'))))
            .ok()?;
        text.lines()
            .find(|l| l.split(':').next() == Some(name))
            .map(str::to_owned)
    }
}

#[async_trait]
impl Transport for Root {
    async fn exec(&self, request: &ExecRequest) -> Result<ExecOutput> {
        let out = self.run(&request.command);
        Ok(ExecOutput::new(out.status.code(), out.stdout, out.stderr))
    }
    async fn upload(&self, f: &FileUpload) -> Result<()> {
        Err(Error::permanent(format!("not used: {}", f.path)))
    }
    async fn read_file(&self, path: &str, _max: usize) -> Result<Option<Vec<u8>>> {
        Ok(std::fs::read(self.upper(path)).ok())
    }
}
