use std::fmt;

use async_trait::async_trait;

use crate::capabilities::{Capabilities, PowerOp};
use crate::error::Result;
use crate::machine::{Labels, Machine, ProviderId};
use crate::name::MachineName;
use crate::provisioner::MachineProvisioner;
use crate::retry::RetryPolicy;
use crate::spec::MachineSpec;
use crate::user_data::UserData;

/// Retries every call of the inner provider that fails with a transient or throttled
/// error, as its [`RetryPolicy`] says. Retrying `create` is safe because creation is
/// idempotent by name.
///
/// Put it outermost, and keep provider wire clients to a single attempt per call (or
/// only their own connection-level retries): retries at two levels multiply.
#[derive(Debug)]
pub struct Retrying<P> {
    inner: P,
    policy: RetryPolicy,
}

impl<P> Retrying<P> {
    /// Wraps `inner` with `policy`.
    pub fn new(inner: P, policy: RetryPolicy) -> Self {
        Retrying { inner, policy }
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &P {
        &self.inner
    }
}

impl<P: fmt::Display> fmt::Display for Retrying<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Retrying({})", self.inner)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: MachineProvisioner> MachineProvisioner for Retrying<P> {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        self.policy
            .retry("create", || self.inner.create(spec, user_data))
            .await
    }

    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        self.policy.retry("get", || self.inner.get(id)).await
    }

    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        self.policy.retry("find", || self.inner.find(name)).await
    }

    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        self.policy
            .retry("list", || self.inner.list(selector))
            .await
    }

    async fn delete(&self, id: &ProviderId) -> Result<()> {
        self.policy.retry("delete", || self.inner.delete(id)).await
    }

    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
        self.policy
            .retry("user_data", || self.inner.user_data(id))
            .await
    }

    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        self.policy
            .retry("power", || self.inner.power(id, op))
            .await
    }

    async fn console_output(&self, id: &ProviderId) -> Result<Option<String>> {
        self.policy
            .retry("console_output", || self.inner.console_output(id))
            .await
    }

    async fn bootstrap_finished(&self, machine: &Machine) -> Result<()> {
        self.policy
            .retry("bootstrap_finished", || {
                self.inner.bootstrap_finished(machine)
            })
            .await
    }
}
