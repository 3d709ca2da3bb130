use std::fmt;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;

use crate::capabilities::{Capabilities, PowerOp};
use crate::error::{Error, Result};
use crate::machine::{Labels, Machine, ProviderId};
use crate::name::MachineName;
use crate::provisioner::MachineProvisioner;
use crate::spec::MachineSpec;
use crate::user_data::UserData;

/// Which faults [`FaultInjecting`] adds, and how often. Rates are probabilities per
/// call, from 0.0 (never) to 1.0 (always), drawn independently for each call.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FaultConfig {
    /// Delay before every call, plus up to [`FaultConfig::latency_jitter`] more.
    pub latency: Duration,
    /// Random extra delay, uniform between zero and this.
    pub latency_jitter: Duration,
    /// Share of calls that fail with a transient error before reaching the provider.
    pub error_rate: f64,
    /// Share of calls that fail with a throttled error (with
    /// [`FaultConfig::retry_after`]) before reaching the provider.
    pub throttle_rate: f64,
    /// The retry-after hint of injected throttling errors.
    pub retry_after: Option<Duration>,
    /// Share of calls that reach the provider and succeed there, but whose answer is
    /// lost: the caller sees a transient error. This is how a create can succeed
    /// without the caller knowing, the case idempotency by name exists for.
    pub lost_response_rate: f64,
    /// Every `create` waits for ever without reaching the provider: what a controller
    /// killed in the middle of a create leaves, for the caller's steps before it (a
    /// document stored, a claim taken) to be tested against.
    pub hang_creates: bool,
    /// Seed for the random draws, for repeatable runs; `None` seeds from the OS.
    pub seed: Option<u64>,
}

impl Default for FaultConfig {
    /// No faults at all.
    fn default() -> Self {
        FaultConfig {
            latency: Duration::ZERO,
            latency_jitter: Duration::ZERO,
            error_rate: 0.0,
            throttle_rate: 0.0,
            retry_after: None,
            lost_response_rate: 0.0,
            hang_creates: false,
            seed: None,
        }
    }
}

/// `#[non_exhaustive]`: start from [`FaultConfig::default`] and adjust with these.
impl FaultConfig {
    /// Sets the delay before every call.
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Sets the random extra delay.
    pub fn with_latency_jitter(mut self, latency_jitter: Duration) -> Self {
        self.latency_jitter = latency_jitter;
        self
    }

    /// Sets the share of calls failing with a transient error.
    pub fn with_error_rate(mut self, error_rate: f64) -> Self {
        self.error_rate = error_rate;
        self
    }

    /// Sets the share of calls failing throttled.
    pub fn with_throttle_rate(mut self, throttle_rate: f64) -> Self {
        self.throttle_rate = throttle_rate;
        self
    }

    /// Sets the retry-after hint of injected throttling.
    pub fn with_retry_after(mut self, retry_after: Option<Duration>) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// Sets the share of calls whose answer is lost.
    pub fn with_lost_response_rate(mut self, lost_response_rate: f64) -> Self {
        self.lost_response_rate = lost_response_rate;
        self
    }

    /// Sets whether every `create` waits for ever.
    pub fn with_hang_creates(mut self, hang_creates: bool) -> Self {
        self.hang_creates = hang_creates;
        self
    }

    /// Sets the seed for the random draws.
    pub fn with_seed(mut self, seed: Option<u64>) -> Self {
        self.seed = seed;
        self
    }
}

/// Injects latency and failures in front of any provider, for tests and chaos runs.
/// [`MachineProvisioner::capabilities`] is never faulted.
pub struct FaultInjecting<P> {
    inner: P,
    config: FaultConfig,
    rng: Mutex<fastrand::Rng>,
}

impl<P> FaultInjecting<P> {
    /// Wraps `inner`. Rates outside 0.0..=1.0 are refused, naming the field.
    pub fn new(inner: P, config: FaultConfig) -> Result<Self> {
        for (field, rate) in [
            ("errorRate", config.error_rate),
            ("throttleRate", config.throttle_rate),
            ("lostResponseRate", config.lost_response_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(Error::invalid_spec(
                    field,
                    format!("{rate} is not a probability between 0.0 and 1.0"),
                ));
            }
        }
        let rng = config
            .seed
            .map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed);
        Ok(FaultInjecting {
            inner,
            config,
            rng: Mutex::new(rng),
        })
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    async fn call<T, Fut: Future<Output = Result<T>>>(
        &self,
        what: &str,
        op: impl FnOnce() -> Fut,
    ) -> Result<T> {
        let (jitter, fail, throttle, lose) = {
            let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            let jitter = if self.config.latency_jitter.is_zero() {
                Duration::ZERO
            } else {
                self.config.latency_jitter.mul_f64(rng.f64())
            };
            (
                jitter,
                rng.f64() < self.config.error_rate,
                rng.f64() < self.config.throttle_rate,
                rng.f64() < self.config.lost_response_rate,
            )
        };
        let delay = self.config.latency + jitter;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if fail {
            return Err(Error::transient(format!("injected fault in {what}")));
        }
        if throttle {
            return Err(Error::throttled(
                format!("injected throttling in {what}"),
                self.config.retry_after,
            ));
        }
        let out = op().await;
        if lose && out.is_ok() {
            return Err(Error::transient(format!(
                "injected lost response in {what}"
            )));
        }
        out
    }
}

impl<P: fmt::Debug> fmt::Debug for FaultInjecting<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultInjecting")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

impl<P: fmt::Display> fmt::Display for FaultInjecting<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultInjecting({})", self.inner)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: MachineProvisioner> MachineProvisioner for FaultInjecting<P> {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        if self.config.hang_creates {
            return std::future::pending().await;
        }
        self.call("create", || self.inner.create(spec, user_data))
            .await
    }

    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        self.call("get", || self.inner.get(id)).await
    }

    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        self.call("find", || self.inner.find(name)).await
    }

    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        self.call("list", || self.inner.list(selector)).await
    }

    async fn delete(&self, id: &ProviderId) -> Result<()> {
        self.call("delete", || self.inner.delete(id)).await
    }

    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
        self.call("user_data", || self.inner.user_data(id)).await
    }

    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        self.call("power", || self.inner.power(id, op)).await
    }

    async fn console_output(&self, id: &ProviderId) -> Result<Option<String>> {
        self.call("console_output", || self.inner.console_output(id))
            .await
    }

    async fn bootstrap_finished(&self, machine: &Machine) -> Result<()> {
        self.call("bootstrap_finished", || {
            self.inner.bootstrap_finished(machine)
        })
        .await
    }
}
