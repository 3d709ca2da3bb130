//! A moto server per test (or per benchmark side), on a port moto chose itself.
//! Shared by the tests (through `common`) and by the `bench_aws` example.
// Each user takes a different part.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// A moto server on a loopback port it chose itself, killed (by PID) when dropped.
///
/// moto binds port 0 and reports the port it got, so no other process can take the
/// port between a probe and moto's bind (a probed port can also be taken as the
/// ephemeral source port of one of the many connections the tests make).
pub struct Moto {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The last lines moto logged (one per request), shown when a test fails.
    log: Arc<Mutex<VecDeque<String>>>,
}

/// How many of moto's log lines a failing test shows.
const LOG_TAIL: usize = 40;

/// The virtualenv scripts/peers/30-moto.sh installs moto and boto3 into.
pub fn venv() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache"));
    cache.join("machine-provisioning/moto")
}

fn moto_server_path() -> PathBuf {
    match std::env::var_os("MOTO_SERVER") {
        Some(p) => PathBuf::from(p),
        None => venv().join("bin/moto_server"),
    }
}

impl Moto {
    /// moto's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts moto with its defaults.
    pub fn start() -> Moto {
        Moto::start_with(&[])
    }

    /// A moto with its defaults shared by the tests of one binary that run meanwhile:
    /// the one a running test holds, else a new one. It is killed when the last test
    /// holding it drops it, so none outlives the tests. For tests that keep to their
    /// own owner and names (every instance they look at carries them): starting moto
    /// and its first EC2 answer cost about 2 s of CPU, more than most such tests.
    pub fn shared() -> Arc<Moto> {
        static SHARED: Mutex<std::sync::Weak<Moto>> = Mutex::new(std::sync::Weak::new());
        let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(moto) = shared.upgrade() {
            return moto;
        }
        let moto = Arc::new(Moto::start());
        *shared = Arc::downgrade(&moto);
        moto
    }

    /// Starts moto with extra environment (`MOTO_ENABLE_AMI_VALIDATION=true`).
    ///
    /// # Panics
    /// When moto is not installed (saying how to install it), exits, or does not say
    /// where it listens within 60 s.
    pub fn start_with(env: &[(&str, &str)]) -> Moto {
        let bin = moto_server_path();
        assert!(
            bin.exists(),
            "moto_server not found at {}: run scripts/test or scripts/peers/30-moto.sh \
             (or set MOTO_SERVER to its path)",
            bin.display()
        );
        let mut cmd = Command::new(&bin);
        cmd.args(["-H", "127.0.0.1", "-p", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let stderr = child.stderr.take().expect("piped stderr");

        // Werkzeug logs ` * Running on http://127.0.0.1:<port>` once bound, then a line
        // per request: read on until the port shows, then keep draining (a full pipe
        // would stall moto) and keep the tail for a failing test.
        let log = Arc::new(Mutex::new(VecDeque::with_capacity(LOG_TAIL)));
        let (port_tx, port_rx) = mpsc::channel();
        let tail = log.clone();
        std::thread::spawn(move || {
            let mut port_tx = Some(port_tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(tx) = &port_tx
                    && let Some(port) = line
                        .split_once("Running on http://127.0.0.1:")
                        .and_then(|(_, p)| p.trim().parse::<u16>().ok())
                {
                    let _ = tx.send(port);
                    port_tx = None;
                }
                let mut tail = tail.lock().unwrap();
                if tail.len() == LOG_TAIL {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
        let port = match port_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(port) => port,
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().ok();
                let said: Vec<String> = log.lock().unwrap().iter().cloned().collect();
                panic!(
                    "moto_server did not say where it listens within 60 s (exit: {status:?}):\n{}",
                    said.join("\n")
                );
            }
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        Moto {
            child,
            endpoint: format!("http://{addr}"),
            addr,
            log,
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let tail = self.log.lock().unwrap();
            eprintln!("moto at {} logged, last {} lines:", self.addr, tail.len());
            for line in tail.iter() {
                eprintln!("  {line}");
            }
        }
    }
}
