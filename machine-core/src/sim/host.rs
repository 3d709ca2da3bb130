//! The inside of a simulated machine: an in-memory file system and command log, and
//! the transport and connector that reach it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::SimCloud;
use crate::error::{Error, Result};
use crate::machine::Machine;
use crate::transport::{Connector, ExecOutput, ExecRequest, FileUpload, Transport};

/// A file on a simulated machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimFile {
    /// The content.
    pub content: Vec<u8>,
    /// Unix permission bits.
    pub mode: u32,
    /// The owner, when one was given.
    pub owner: Option<String>,
}

/// What happened on a simulated machine: its files and the commands run on it, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimHost {
    /// Files by absolute path.
    pub files: BTreeMap<String, SimFile>,
    /// Commands run through a transport (with `sudo` shown), in order.
    pub commands: Vec<String>,
}

impl SimHost {
    /// The file at `path` as UTF-8 text (lossy), if it exists.
    pub fn file_text(&self, path: &str) -> Option<String> {
        self.files
            .get(path)
            .map(|f| String::from_utf8_lossy(&f.content).into_owned())
    }
}

/// Shared, lockable host state plus the reachability switch tests flip.
#[derive(Debug, Default)]
pub(crate) struct HostCell {
    pub(crate) host: Mutex<SimHost>,
    pub(crate) reachable: AtomicBool,
}

impl HostCell {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(HostCell {
            host: Mutex::new(SimHost::default()),
            reachable: AtomicBool::new(true),
        })
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, SimHost> {
        self.host.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A transport into a simulated machine. Every operation fails with a transient
/// "connection reset" while the machine is made unreachable
/// ([`SimCloud::set_reachable`]), as a cut link would.
pub struct SimTransport {
    cell: Arc<HostCell>,
    cloud: SimCloud,
    latency: Duration,
}

impl SimTransport {
    async fn check_link(&self) -> Result<()> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        if self.cell.reachable.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(Error::transient("connection reset by simulated link cut"))
        }
    }
}

#[async_trait]
impl Transport for SimTransport {
    async fn exec(&self, request: &ExecRequest) -> Result<ExecOutput> {
        self.check_link().await?;
        let shown = if request.sudo {
            format!("sudo {}", request.command)
        } else {
            request.command.clone()
        };
        self.cell.lock().commands.push(shown);
        let mut out = self.cloud.exec_response(&request.command);
        request.mask_output(&mut out);
        // Keep the tail within the bound, as real transports do.
        for stream in [&mut out.stdout, &mut out.stderr] {
            if stream.len() > request.max_output {
                stream.drain(..stream.len() - request.max_output);
                out.truncated = true;
            }
        }
        Ok(out)
    }

    async fn upload(&self, file: &FileUpload) -> Result<()> {
        self.check_link().await?;
        self.cell.lock().files.insert(
            file.path.clone(),
            SimFile {
                content: file.content.clone(),
                mode: file.mode,
                owner: file.owner.clone(),
            },
        );
        Ok(())
    }

    async fn read_file(&self, path: &str, max_bytes: usize) -> Result<Option<Vec<u8>>> {
        self.check_link().await?;
        match self.cell.lock().files.get(path) {
            None => Ok(None),
            Some(f) if f.content.len() > max_bytes => Err(Error::permanent(format!(
                "{path} is {} bytes, over the {max_bytes}-byte bound",
                f.content.len()
            ))),
            Some(f) => Ok(Some(f.content.clone())),
        }
    }
}

/// Opens [`SimTransport`]s to running simulated machines.
#[derive(Debug, Clone)]
pub struct SimConnector {
    cloud: SimCloud,
    latency: Duration,
}

impl SimConnector {
    /// A connector into `cloud` whose transports answer at once.
    pub fn new(cloud: SimCloud) -> Self {
        SimConnector {
            cloud,
            latency: Duration::ZERO,
        }
    }

    /// Makes every transport operation (exec, upload, read) take `latency`, as a real
    /// round trip would; connecting takes it too.
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }
}

#[async_trait]
impl Connector for SimConnector {
    async fn connect(&self, machine: &Machine) -> Result<Arc<dyn Transport>> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        let cell = self.cloud.running_host(&machine.provider_id)?;
        if !cell.reachable.load(Ordering::SeqCst) {
            return Err(Error::transient(format!(
                "connection to {} timed out (simulated link cut)",
                machine.name
            )));
        }
        Ok(Arc::new(SimTransport {
            cell,
            cloud: self.cloud.clone(),
            latency: self.latency,
        }))
    }
}
