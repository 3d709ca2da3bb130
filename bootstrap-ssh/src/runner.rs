//! The decoupled layer runner: applies machine-core layers (any
//! [`SoftwareProvisioner`]) to a fleet of running machines over a [`Connector`], with
//! bounded concurrency, and reports per machine what happened and when.
//!
//! It is not a second step engine: resuming is the layers' own business (a
//! [`machine_core::steps::StepLayer`] records each step on the machine), so a machine
//! whose connection drops mid-layer is reconnected and the layer applied again.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use machine_core::{
    Completion, CompletionCheck, Connector, Error, Machine, MachineName, Mode, Result,
    SoftwareProvisioner, Transport,
};

/// One moment of a machine's run, measured from the start of its run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// What happened (`connected`, `cloud-init done`, `layer base applied`).
    pub what: String,
    /// When, from the start of the machine's run.
    pub at: Duration,
}

/// What happened on one machine.
#[derive(Debug)]
pub struct HostReport {
    /// The machine.
    pub machine: MachineName,
    /// `Ok` when every layer is applied.
    pub result: Result<()>,
    /// Where the time went, in order.
    pub timeline: Vec<Mark>,
    /// How many connections were opened (more than one after a dropped link).
    pub connections: usize,
}

impl fmt::Display for HostReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.result {
            Ok(()) => write!(f, "{}: ok", self.machine)?,
            Err(e) => write!(f, "{}: FAILED: {e}", self.machine)?,
        }
        for m in &self.timeline {
            write!(f, "\n  {:>8.3}s  {}", m.at.as_secs_f64(), m.what)?;
        }
        Ok(())
    }
}

/// Applies layers to machines over SSH (or any [`Connector`]).
#[derive(Clone)]
pub struct LayerRunner {
    connector: Arc<dyn Connector>,
    layers: Vec<Arc<dyn SoftwareProvisioner>>,
    completion: Option<(Arc<dyn CompletionCheck>, Duration, Duration)>,
    concurrency: usize,
    attempts: usize,
}

impl LayerRunner {
    /// A runner reaching machines through `connector`; 16 machines at a time, and up to
    /// 3 attempts per machine when a transient error (a dropped connection) interrupts it.
    pub fn new(connector: Arc<dyn Connector>) -> Self {
        LayerRunner {
            connector,
            layers: Vec::new(),
            completion: None,
            concurrency: 16,
            attempts: 3,
        }
    }

    /// Adds a layer, applied after the ones added before. It must support decoupled mode.
    pub fn layer(mut self, layer: Arc<dyn SoftwareProvisioner>) -> Result<Self> {
        if !layer.supports(Mode::Decoupled) {
            return Err(Error::invalid_spec(
                format!("layers[{}]", self.layers.len()),
                format!(
                    "layer {:?} cannot be applied over a transport",
                    layer.name()
                ),
            ));
        }
        self.layers.push(layer);
        Ok(self)
    }

    /// Before the layers, waits until `check` says coupled software (cloud-init) is done,
    /// looking every `poll`, for at most `deadline`.
    pub fn wait_for(
        mut self,
        check: Arc<dyn CompletionCheck>,
        poll: Duration,
        deadline: Duration,
    ) -> Self {
        self.completion = Some((check, poll, deadline));
        self
    }

    /// Works on at most `n` machines at a time (at least 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Tries a machine at most `n` times (at least 1) when transient errors stop it.
    pub fn attempts(mut self, n: usize) -> Self {
        self.attempts = n.max(1);
        self
    }

    /// Runs every machine; the reports are in the order of `machines`.
    pub async fn run(&self, machines: &[Machine]) -> Vec<HostReport> {
        futures_util::stream::iter(machines.iter().map(|m| self.run_one(m)))
            .buffered(self.concurrency)
            .collect()
            .await
    }

    /// Runs one machine: connect, wait for completion if asked, apply each layer not
    /// already applied. A transient error reconnects and starts over (done layers and
    /// steps are skipped by the layers themselves).
    pub async fn run_one(&self, machine: &Machine) -> HostReport {
        let start = Instant::now();
        let mut timeline = Vec::new();
        let mut connections = 0;
        let mut result = Ok(());
        for attempt in 1..=self.attempts {
            result = self
                .attempt(machine, start, &mut timeline, &mut connections)
                .await;
            match &result {
                Err(e) if e.is_retryable() && attempt < self.attempts => {
                    mark(
                        &mut timeline,
                        start,
                        format!("attempt {attempt} interrupted: {e}"),
                    );
                    tracing::warn!(machine = %machine.name, error = %e, "interrupted; reconnecting");
                }
                _ => break,
            }
        }
        let done = if result.is_ok() { "ready" } else { "failed" };
        mark(&mut timeline, start, done.to_owned());
        HostReport {
            machine: machine.name.clone(),
            result,
            timeline,
            connections,
        }
    }

    async fn attempt(
        &self,
        machine: &Machine,
        start: Instant,
        timeline: &mut Vec<Mark>,
        connections: &mut usize,
    ) -> Result<()> {
        let transport = self.connector.connect(machine).await?;
        *connections += 1;
        mark(timeline, start, "connected".to_owned());
        if let Some((check, poll, deadline)) = &self.completion {
            wait_completion(
                machine,
                transport.as_ref(),
                check.as_ref(),
                *poll,
                *deadline,
            )
            .await?;
            mark(timeline, start, "coupled software complete".to_owned());
        }
        for layer in &self.layers {
            if layer.is_applied(machine, transport.as_ref()).await? {
                mark(
                    timeline,
                    start,
                    format!("layer {} already applied", layer.name()),
                );
                continue;
            }
            layer
                .apply(machine, transport.as_ref())
                .await
                .map_err(|e| e.context(format_args!("layer {}", layer.name())))?;
            mark(timeline, start, format!("layer {} applied", layer.name()));
        }
        Ok(())
    }
}

impl fmt::Debug for LayerRunner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.layers.iter().map(|l| l.name()).collect();
        f.debug_struct("LayerRunner")
            .field("layers", &names)
            .field("completion", &self.completion.is_some())
            .field("concurrency", &self.concurrency)
            .field("attempts", &self.attempts)
            .finish()
    }
}

fn mark(timeline: &mut Vec<Mark>, start: Instant, what: String) {
    timeline.push(Mark {
        what,
        at: start.elapsed(),
    });
}

/// Polls `check` every `poll` until done, failed, or `deadline`. A zero `poll`, or a
/// `poll` or `deadline` over a year, is an invalid-spec error naming it.
pub async fn wait_completion(
    machine: &Machine,
    transport: &dyn Transport,
    check: &dyn CompletionCheck,
    poll: Duration,
    deadline: Duration,
) -> Result<()> {
    // Bounded so that no clock arithmetic can overflow, and so that a typo is an error,
    // not a wait of centuries.
    const LIMIT: Duration = Duration::from_secs(366 * 24 * 3600);
    if poll.is_zero() || poll > LIMIT {
        return Err(Error::invalid_spec(
            "poll",
            format!(
                "{:.3}s is not a poll interval (more than 0, at most a year)",
                poll.as_secs_f64()
            ),
        ));
    }
    if deadline > LIMIT {
        return Err(Error::invalid_spec(
            "deadline",
            format!(
                "{:.0}s is more than a year; give a deadline of at most {}s",
                deadline.as_secs_f64(),
                LIMIT.as_secs()
            ),
        ));
    }
    let start = Instant::now();
    loop {
        match check.check(machine, transport).await? {
            Completion::Done => return Ok(()),
            Completion::Failed(why) => {
                return Err(Error::permanent(format!(
                    "{}: coupled software failed: {why}",
                    machine.name
                )));
            }
            Completion::Pending if start.elapsed() + poll > deadline => {
                return Err(Error::timeout(format!(
                    "{}: coupled software not complete within {:.1}s",
                    machine.name,
                    deadline.as_secs_f64()
                )));
            }
            Completion::Pending => tokio::time::sleep(poll).await,
        }
    }
}
