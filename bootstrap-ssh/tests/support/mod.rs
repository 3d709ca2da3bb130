//! Real OpenSSH peers for the tests: sshd processes on free loopback ports or inside
//! network namespaces the test creates, each with its own host key and authorized key,
//! stopped by PID and removed on drop even when the test fails.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use bootstrap_ssh::{Auth, HostKeyPin, HostKeyPolicy, SshConfig, SshTarget};
use machine_core::{Access, Machine, MachineName, Phase, ProviderId, RetryPolicy, SshEndpoint};

pub const SSHD: &str = "/usr/sbin/sshd";

pub fn need(tool: &str, package: &str) {
    let found = if tool.starts_with('/') {
        Path::new(tool).exists()
    } else {
        Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    assert!(
        found,
        "{tool} is missing: run scripts/peers/10-openssh.sh (or apt-get install -y {package})"
    );
}

pub fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn run_env(cmd: &str, args: &[&str], env: &[(&str, &str)]) {
    let out = Command::new(cmd)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A run-unique short tag for names of namespaces, links and files.
pub fn unique() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{:x}{}",
        std::process::id() % 0xfffff,
        N.fetch_add(1, Ordering::SeqCst)
    )
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A key pair made with ssh-keygen.
pub fn keygen(dir: &Path, name: &str, kind: &str, passphrase: &str) -> PathBuf {
    need("ssh-keygen", "openssh-client");
    let path = dir.join(name);
    let mut args = vec!["-q", "-t", kind, "-N", passphrase, "-C", name, "-f"];
    let p = path.to_str().unwrap().to_owned();
    args.push(&p);
    if kind == "rsa" {
        args.extend(["-b", "2048"]);
    }
    run("ssh-keygen", &args);
    path
}

/// One sshd process the test owns.
pub struct Sshd {
    pub dir: tempfile::TempDir,
    pub host: String,
    pub port: u16,
    pub host_key_pub: String,
    /// The public lines of `more_host_keys`, in order.
    pub more_host_key_pubs: Vec<String>,
    pub client_key: PathBuf,
    child: Child,
    log: PathBuf,
}

pub struct SshdOptions<'a> {
    pub netns: Option<&'a str>,
    pub listen: Option<(String, u16)>,
    pub extra: &'a str,
    pub authorized: Vec<PathBuf>,
    pub wait: bool,
    /// Start sshd only after this long (keys and port are chosen at once).
    pub delay: Option<Duration>,
    /// Mount a private tmpfs here for this sshd and its sessions, so hosts sharing the
    /// filesystem each have their own copy of this directory.
    pub private_dir: Option<PathBuf>,
    /// Mount options of that tmpfs (`size=64k,noexec`).
    pub private_dir_options: &'a str,
    /// More host keys of these types (`ecdsa`, `rsa`), offered after the ed25519 one.
    pub more_host_keys: Vec<&'a str>,
    /// Sign the ed25519 host key with this CA private key for these principals
    /// (`ssh-keygen -h -n`), and serve the certificate.
    pub host_cert: Option<(PathBuf, String)>,
}

impl Default for SshdOptions<'_> {
    fn default() -> Self {
        SshdOptions {
            netns: None,
            listen: None,
            extra: "",
            authorized: Vec::new(),
            wait: true,
            delay: None,
            private_dir: None,
            private_dir_options: "",
            more_host_keys: Vec::new(),
            host_cert: None,
        }
    }
}

impl Sshd {
    /// An sshd on a free port of 127.0.0.1, trusting a fresh ed25519 client key.
    pub fn start() -> Sshd {
        Sshd::with(SshdOptions::default())
    }

    /// An sshd with `opts`. A probed port can be taken by another process before sshd
    /// binds it: when sshd's log says so, it is started again on another port.
    pub fn with(opts: SshdOptions) -> Sshd {
        for _ in 0..5 {
            let mut sshd = Sshd::spawn(&opts);
            if !opts.wait {
                return sshd;
            }
            match sshd.ready(opts.netns) {
                Ok(()) => return sshd,
                Err(log)
                    if opts.listen.is_none()
                        && (log.contains("Address already in use")
                            || log.contains("Cannot bind any address")) =>
                {
                    continue;
                }
                Err(log) => panic!("sshd did not start: {log}"),
            }
        }
        panic!("sshd found no free port in 5 tries");
    }

    fn spawn(opts: &SshdOptions) -> Sshd {
        need(SSHD, "openssh-server");
        std::fs::create_dir_all("/run/sshd").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let host_key = keygen(dir.path(), "host_key", "ed25519", "");
        let host_key_pub = std::fs::read_to_string(host_key.with_extension("pub"))
            .unwrap()
            .trim()
            .to_owned();
        let mut host_keys = format!("HostKey {}\n", host_key.display());
        let mut more_host_key_pubs = Vec::new();
        for kind in &opts.more_host_keys {
            let k = keygen(dir.path(), &format!("host_key_{kind}"), kind, "");
            host_keys.push_str(&format!("HostKey {}\n", k.display()));
            let public = std::fs::read_to_string(k.with_extension("pub")).unwrap();
            more_host_key_pubs.push(public.trim().to_owned());
        }
        if let Some((ca, principals)) = &opts.host_cert {
            run(
                "ssh-keygen",
                &[
                    "-q",
                    "-s",
                    ca.to_str().unwrap(),
                    "-I",
                    "test-host",
                    "-h",
                    "-n",
                    principals,
                    host_key.with_extension("pub").to_str().unwrap(),
                ],
            );
            let cert = dir.path().join("host_key-cert.pub");
            host_keys.push_str(&format!("HostCertificate {}\n", cert.display()));
        }
        let client_key = keygen(dir.path(), "client_key", "ed25519", "");
        let mut authorized = std::fs::read_to_string(client_key.with_extension("pub")).unwrap();
        for extra in &opts.authorized {
            authorized.push_str(&std::fs::read_to_string(extra).unwrap());
        }
        std::fs::write(dir.path().join("authorized_keys"), authorized).unwrap();
        let (host, port) = opts
            .listen
            .clone()
            .unwrap_or_else(|| ("127.0.0.1".to_owned(), free_port()));
        let d = dir.path().display();
        let listen = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        // sshd keeps the first value of a keyword: the test's own lines go first.
        let config = format!(
            "{}\nListenAddress {listen}\n{host_keys}PidFile {d}/sshd.pid\nAuthorizedKeysFile {d}/authorized_keys\n\
             UsePAM no\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             PermitRootLogin prohibit-password\nSetEnv SHLVL=1\nClientAliveInterval 2\nClientAliveCountMax 3\n\
             MaxStartups 200\nMaxSessions 100\nLogLevel ERROR\nSubsystem sftp internal-sftp\n",
            opts.extra
        );
        std::fs::write(dir.path().join("sshd_config"), config).unwrap();
        let log = dir.path().join("sshd.log");
        let cfg = dir.path().join("sshd_config");
        let mut argv: Vec<String> = Vec::new();
        if let Some(ns) = opts.netns {
            argv.extend(["ip", "netns", "exec", ns].map(String::from));
        }
        let mut script = String::new();
        if let Some(d) = opts.delay {
            script.push_str(&format!("sleep {}; ", d.as_secs_f64()));
        }
        if let Some(p) = &opts.private_dir {
            std::fs::create_dir_all(p).unwrap();
            argv.extend(["unshare", "-m", "--propagation", "private"].map(String::from));
            let options = if opts.private_dir_options.is_empty() {
                String::new()
            } else {
                format!("-o {} ", opts.private_dir_options)
            };
            script.push_str(&format!("mount -t tmpfs {options}bssh {} && ", p.display()));
        }
        if !script.is_empty() {
            script.push_str("exec \"$@\"");
            argv.extend(["sh".to_owned(), "-c".to_owned(), script, "sh".to_owned()]);
        }
        // Every wrapper execs the next, so the child's PID ends up being sshd's.
        argv.extend([SSHD, "-D", "-e", "-f"].map(String::from));
        argv.push(cfg.display().to_string());
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        cmd.stderr(std::fs::File::create(&log).unwrap());
        let child = cmd.spawn().expect("start sshd");
        Sshd {
            dir,
            host,
            port,
            host_key_pub,
            more_host_key_pubs,
            client_key,
            child,
            log,
        }
    }

    /// Waits until sshd listens; its log if it exited or did not listen within 60 s
    /// (it takes milliseconds: generous for a slow, busy machine).
    fn ready(&mut self, netns: Option<&str>) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ok = match netns {
                // Inside a namespace it may listen on the namespace's own loopback.
                Some(ns) => Command::new("ip")
                    .args([
                        "netns",
                        "exec",
                        ns,
                        "ss",
                        "-Hltn",
                        &format!("sport = :{}", self.port),
                    ])
                    .output()
                    .is_ok_and(|o| !o.stdout.is_empty()),
                None => std::net::TcpStream::connect_timeout(
                    &format!("{}:{}", self.host, self.port).parse().unwrap(),
                    Duration::from_millis(200),
                )
                .is_ok(),
            };
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline || self.child.try_wait().ok().flatten().is_some() {
                return Err(self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn target(&self) -> SshTarget {
        SshTarget::new(self.host.clone(), self.port, "root").unwrap()
    }

    pub fn pins(&self) -> Vec<HostKeyPin> {
        vec![HostKeyPin::parse("pin", &self.host_key_pub).unwrap()]
    }

    pub fn auth(&self) -> Auth {
        Auth::key_file(&self.client_key, None).unwrap()
    }

    /// A config with this server's client key, a quick keepalive and retry.
    pub fn config(&self) -> SshConfig {
        fast(SshConfig::new(vec![self.auth()]))
    }

    pub fn machine(&self, name: &str) -> Machine {
        let mut m = Machine::new(
            MachineName::new(name).unwrap(),
            ProviderId::new(format!("static:///{name}")).unwrap(),
            Phase::Provisioned,
        );
        m.access = Access::ssh(SshEndpoint::new(self.host.clone(), self.port, "root"));
        m.access.host_keys = vec![self.host_key_pub.clone()];
        m
    }
}

pub fn fast(config: SshConfig) -> SshConfig {
    config
        .with_host_keys(HostKeyPolicy::Verify {
            known_hosts: Some(PathBuf::from("/nonexistent/known_hosts")),
        })
        .with_connect_timeout(Duration::from_secs(5))
        .with_retry(
            RetryPolicy::default()
                .with_max_retries(usize::MAX)
                .with_initial_delay(Duration::from_millis(100))
                .with_max_delay(Duration::from_millis(500))
                .with_factor(2.0)
                .with_jitter(true)
                .with_max_elapsed(None),
            Duration::from_secs(20),
        )
        .with_keepalive(Duration::from_secs(1), 2)
}

impl Drop for Sshd {
    fn drop(&mut self) {
        // By PID: the child is sshd itself (`ip netns exec` execs it).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A bridge in the root namespace and `n` namespaces, each with a veth into it and an
/// address of a private /24 that exists only on this machine. Removed on drop.
pub struct Netns {
    pub names: Vec<String>,
    pub addrs: Vec<String>,
    pub bridge: String,
    pub gateway: String,
    tag: String,
}

static SUBNETS: OnceLock<Mutex<()>> = OnceLock::new();

impl Netns {
    pub fn new(n: usize) -> Netns {
        need("ip", "iproute2");
        let _guard = SUBNETS
            .get_or_init(|| Mutex::new(()))
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let tag = unique();
        let taken = String::from_utf8(
            Command::new("ip")
                .args(["-4", "-o", "addr"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let third = (1..250u32)
            .map(|i| (std::process::id() + i * 7) % 250 + 1)
            .find(|x| !taken.contains(&format!("10.213.{x}.")))
            .expect("a free 10.213.x.0/24");
        let bridge = format!("bsb{tag}");
        let gateway = format!("10.213.{third}.1");
        let mut me = Netns {
            names: Vec::new(),
            addrs: Vec::new(),
            bridge: bridge.clone(),
            gateway: gateway.clone(),
            tag: tag.clone(),
        };
        // A name holding our PID can only be left over from a dead run that had it: clear it.
        let quiet = |args: &[&str]| {
            let _ = Command::new("ip").args(args).stderr(Stdio::null()).status();
        };
        quiet(&["link", "del", &bridge]);
        for i in 0..n {
            quiet(&["netns", "del", &format!("bssh-{tag}-{i}")]);
            quiet(&["link", "del", &format!("bsv{tag}x{i}")]);
        }
        run("ip", &["link", "add", &bridge, "type", "bridge"]);
        run(
            "ip",
            &["addr", "add", &format!("{gateway}/24"), "dev", &bridge],
        );
        run("ip", &["link", "set", &bridge, "up"]);
        for i in 0..n {
            let ns = format!("bssh-{tag}-{i}");
            let host_side = format!("bsv{tag}x{i}");
            let addr = format!("10.213.{third}.{}", i + 2);
            run("ip", &["netns", "add", &ns]);
            me.names.push(ns.clone());
            run(
                "ip",
                &[
                    "link", "add", &host_side, "type", "veth", "peer", "name", "eth0", "netns", &ns,
                ],
            );
            run("ip", &["link", "set", &host_side, "master", &bridge, "up"]);
            run(
                "ip",
                &[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{addr}/24"),
                    "dev",
                    "eth0",
                ],
            );
            run("ip", &["-n", &ns, "link", "set", "eth0", "up"]);
            run("ip", &["-n", &ns, "link", "set", "lo", "up"]);
            me.addrs.push(addr);
        }
        me
    }

    pub fn link(&self, i: usize, up: bool) {
        run(
            "ip",
            &[
                "-n",
                &self.names[i],
                "link",
                "set",
                "eth0",
                if up { "up" } else { "down" },
            ],
        );
    }

    /// An sshd inside namespace `i`, on its address.
    pub fn sshd(&self, i: usize) -> Sshd {
        self.sshd_with(i, SshdOptions::default())
    }

    /// An sshd inside namespace `i` with `opts` (listening on the namespace's address
    /// unless `opts.listen` says otherwise).
    pub fn sshd_with<'a>(&'a self, i: usize, mut opts: SshdOptions<'a>) -> Sshd {
        opts.netns = Some(&self.names[i]);
        if opts.listen.is_none() {
            opts.listen = Some((self.addrs[i].clone(), 22));
        }
        Sshd::with(opts)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in &self.names {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        for i in 0..self.names.len() {
            let _ = Command::new("ip")
                .args(["link", "del", &format!("bsv{}x{i}", self.tag)])
                .stderr(Stdio::null())
                .status();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
    }
}

/// A run-unique local user (and maybe a sudoers entry), removed on drop.
pub struct TempUser {
    pub name: String,
    sudoers: PathBuf,
}

impl TempUser {
    pub fn new(password: &str) -> TempUser {
        need("useradd", "passwd");
        let name = format!("bssh{}", unique());
        let user = TempUser {
            sudoers: PathBuf::from(format!("/etc/sudoers.d/{name}")),
            name,
        };
        run(
            "useradd",
            &["-M", "-d", "/tmp", "-s", "/bin/sh", &user.name],
        );
        let mut chpasswd = Command::new("chpasswd")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        writeln!(chpasswd.stdin.take().unwrap(), "{}:{password}", user.name).unwrap();
        assert!(chpasswd.wait().unwrap().success());
        user
    }

    /// Runs `script` with `sh -c` as this user; panics with its stderr if it fails.
    pub fn sh(&self, script: &str) {
        run("runuser", &["-u", &self.name, "--", "sh", "-c", script]);
    }

    /// Starts `script` as this user in the background; killed by PID on drop of the child.
    /// Runs `script` as this user in a process group of its own, killed whole on drop:
    /// killing `runuser` alone left its shell running (and spinning) after the test.
    pub fn spawn(&self, script: &str) -> Group {
        use std::os::unix::process::CommandExt;
        let child = Command::new("runuser")
            .args(["-u", &self.name, "--", "sh", "-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        Group(child)
    }

    pub fn allow_sudo(&self) {
        std::fs::write(
            &self.sudoers,
            format!("{} ALL=(ALL) NOPASSWD: ALL\n", self.name),
        )
        .unwrap();
        std::fs::set_permissions(
            &self.sudoers,
            std::os::unix::fs::PermissionsExt::from_mode(0o440),
        )
        .unwrap();
    }
}

impl Drop for TempUser {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.sudoers);
        // Its sessions end a moment after their connections close: retry a while.
        for _ in 0..50 {
            let done = Command::new("userdel")
                .arg(&self.name)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success() || s.code() == Some(6));
            if done {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("could not remove test user {}", self.name);
    }
}

/// The PIDs of live (not zombie) processes whose command line holds `marker`.
pub fn processes_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(") ")
            .is_some_and(|(_, r)| r.starts_with('Z'));
        if !zombie
            && String::from_utf8_lossy(&cmdline)
                .replace('\0', " ")
                .contains(marker)
        {
            found.push(pid);
        }
    }
    found
}

/// A TCP forwarder on a free loopback port in front of `port`, counting the
/// connections made through it: a test that a failure is not retried counts attempts
/// instead of timing them. Its threads end with the test process.
pub struct Counter {
    pub port: u16,
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Counter {
    pub fn start(port: u16) -> Counter {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let n = count.clone();
        let me = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                n.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                    continue;
                };
                let pipe = |mut from: std::net::TcpStream, mut to: std::net::TcpStream| {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                };
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        Counter { port: me, count }
    }

    /// Connections made so far.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

/// A process group led by a child the test started: killed whole on drop.
pub struct Group(pub Child);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0.id())])
            .status();
        let _ = self.0.wait();
    }
}
