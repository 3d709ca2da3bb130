//! machine-core's [`Connector`] over SSH: opens (or reuses) the connection to a machine
//! from its [`machine_core::Access`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use async_trait::async_trait;
use machine_core::{Connector, Error, Machine, Result, Transport};

use crate::client::SshClient;
use crate::config::{SshConfig, SshTarget};
use crate::hostkeys::HostKeyPin;

/// An endpoint and the fingerprints pinned for it.
type CacheKey = (SshTarget, Vec<String>);

/// Opens SSH transports to machines: the endpoint and user come from the machine's
/// `access.ssh`, the pinned host keys from `access.hostKeys`, the rest from the config.
///
/// A live connection to the same endpoint is reused while anyone still holds it, so
/// every step of a machine goes over one connection.
#[derive(Debug)]
pub struct SshConnector {
    config: SshConfig,
    // Keyed by endpoint and pins: a machine with other pins gets its own, verified, connection.
    open: Mutex<HashMap<CacheKey, Weak<SshClient>>>,
}

impl SshConnector {
    /// A connector with `config`.
    pub fn new(config: SshConfig) -> Self {
        SshConnector {
            config,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// The target and pins for `machine`, or an invalid-spec error naming the field.
    pub fn target_of(&self, machine: &Machine) -> Result<(SshTarget, Vec<HostKeyPin>)> {
        let ssh = machine.access.ssh.as_ref().ok_or_else(|| {
            Error::invalid_spec(
                "access.ssh",
                format!("machine {} has no SSH endpoint", machine.name),
            )
        })?;
        let user = self.config.user.as_deref().unwrap_or(&ssh.user);
        let target =
            SshTarget::new(ssh.host.clone(), ssh.port, user).map_err(|e| e.within("access.ssh"))?;
        let pins = HostKeyPin::parse_all("access.hostKeys", &machine.access.host_keys)?;
        Ok((target, pins))
    }

    /// Connects to `machine` and returns the concrete client.
    pub async fn connect_client(&self, machine: &Machine) -> Result<Arc<SshClient>> {
        let (target, pins) = self.target_of(machine)?;
        let key = (target, pins.iter().map(HostKeyPin::fingerprint).collect());
        if let Some(live) = self.cached(&key) {
            return Ok(live);
        }
        let target = &key.0;
        let client = Arc::new(SshClient::connect(&self.config, target, &pins).await?);
        if let Ok(mut open) = self.open.lock() {
            open.retain(|_, w| w.strong_count() > 0);
            open.insert(key, Arc::downgrade(&client));
        }
        Ok(client)
    }

    fn cached(&self, key: &CacheKey) -> Option<Arc<SshClient>> {
        let open = self.open.lock().ok()?;
        open.get(key)?.upgrade().filter(|c| !c.is_closed())
    }
}

#[async_trait]
impl Connector for SshConnector {
    async fn connect(&self, machine: &Machine) -> Result<Arc<dyn Transport>> {
        Ok(self.connect_client(machine).await?)
    }
}
