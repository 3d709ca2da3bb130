use std::fmt;
use std::num::NonZeroU32;

use async_trait::async_trait;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use crate::capabilities::{Capabilities, PowerOp};
use crate::error::Result;
use crate::machine::{Labels, Machine, ProviderId};
use crate::name::MachineName;
use crate::provisioner::MachineProvisioner;
use crate::spec::MachineSpec;
use crate::user_data::UserData;

/// Limits the calls made to the inner provider to a steady rate, shared by every
/// method: each call waits for a permit before it starts (a burst of up to one second's
/// worth is allowed). [`MachineProvisioner::capabilities`] is not a call and is never
/// delayed.
pub struct RateLimited<P> {
    inner: P,
    per_second: NonZeroU32,
    limiter: DefaultDirectRateLimiter,
}

impl<P> RateLimited<P> {
    /// Wraps `inner`, allowing `per_second` calls each second.
    pub fn new(inner: P, per_second: NonZeroU32) -> Self {
        RateLimited {
            inner,
            per_second,
            limiter: RateLimiter::direct(Quota::per_second(per_second)),
        }
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    async fn permit(&self) {
        self.limiter.until_ready().await;
    }
}

impl<P: fmt::Debug> fmt::Debug for RateLimited<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimited")
            .field("inner", &self.inner)
            .field("per_second", &self.per_second)
            .finish()
    }
}

impl<P: fmt::Display> fmt::Display for RateLimited<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RateLimited({}, {}/s)", self.inner, self.per_second)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: MachineProvisioner> MachineProvisioner for RateLimited<P> {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        self.permit().await;
        self.inner.create(spec, user_data).await
    }

    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        self.permit().await;
        self.inner.get(id).await
    }

    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        self.permit().await;
        self.inner.find(name).await
    }

    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        self.permit().await;
        self.inner.list(selector).await
    }

    async fn delete(&self, id: &ProviderId) -> Result<()> {
        self.permit().await;
        self.inner.delete(id).await
    }

    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
        self.permit().await;
        self.inner.user_data(id).await
    }

    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        self.permit().await;
        self.inner.power(id, op).await
    }

    async fn console_output(&self, id: &ProviderId) -> Result<Option<String>> {
        self.permit().await;
        self.inner.console_output(id).await
    }

    async fn bootstrap_finished(&self, machine: &Machine) -> Result<()> {
        self.permit().await;
        self.inner.bootstrap_finished(machine).await
    }
}
