//! The decoupled layer runner: applies machine-core layers (any
//! [`DecoupledSoftware`]) to a fleet of running machines over a [`Connector`], with
//! bounded concurrency, and reports per machine what happened and when.
//!
//! It is not a second engine: each machine's software steps are machine-core's
//! [`Bootstrapper`], the one the composer takes, and the report uses the composer's
//! [`Timeline`] and [`ProgressEvent`]. The runner adds only what the composer's provider
//! loop does for it there: a connection per attempt, waiting while coupled software
//! runs, and reconnecting after a transient error. Resuming is the layers' own business
//! (a [`machine_core::steps::StepLayer`] records each step on the machine), so a machine
//! whose connection drops mid-layer is reconnected and the layer applied again.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use machine_core::{
    BootstrapState, BootstrapStep, Bootstrapper, CompletionCheck, Connector, DecoupledSoftware,
    Error, Machine, MachineName, Phase, ProgressEvent, Result, Timeline, Transport,
};

/// What happened on one machine.
#[derive(Debug)]
pub struct HostReport {
    /// The machine.
    pub machine: MachineName,
    /// `Ok` when every layer is applied.
    pub result: Result<()>,
    /// Where the time went, measured from the start of the machine's run: when it was
    /// first reachable, when coupled software was complete, when it was ready.
    pub timeline: Timeline,
    /// What happened, in order (`connected`, `coupled software complete`,
    /// `layer base applied`, `ready`): the messages the composer's progress events carry.
    pub events: Vec<ProgressEvent>,
    /// How many connections were opened (more than one after a dropped link).
    pub connections: usize,
}

impl fmt::Display for HostReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.result {
            Ok(()) => write!(f, "{}: ok", self.machine)?,
            Err(e) => write!(f, "{}: FAILED: {e}", self.machine)?,
        }
        write!(f, "\n  {}", self.timeline)?;
        for e in &self.events {
            write!(f, "\n  - {}", e.message)?;
        }
        Ok(())
    }
}

/// Applies layers to machines over SSH (or any [`Connector`]).
#[derive(Clone)]
pub struct LayerRunner {
    connector: Arc<dyn Connector>,
    bootstrapper: Bootstrapper,
    /// How often to look, and for how long, while coupled software runs.
    wait: Option<(Duration, Duration)>,
    concurrency: usize,
    attempts: usize,
}

impl LayerRunner {
    /// A runner reaching machines through `connector`; 16 machines at a time, and up to
    /// 3 attempts per machine when a transient error (a dropped connection) interrupts it.
    pub fn new(connector: Arc<dyn Connector>) -> Self {
        LayerRunner {
            connector,
            bootstrapper: Bootstrapper::new(),
            wait: None,
            concurrency: 16,
            attempts: 3,
        }
    }

    /// Adds a layer, applied after the ones added before.
    pub fn layer(mut self, layer: Arc<dyn DecoupledSoftware>) -> Self {
        self.bootstrapper = self.bootstrapper.with_layer(layer);
        self
    }

    /// Before the layers, waits until `check` says coupled software (cloud-init) is done,
    /// looking every `poll`, for at most `deadline`.
    pub fn wait_for(
        mut self,
        check: Arc<dyn CompletionCheck>,
        poll: Duration,
        deadline: Duration,
    ) -> Self {
        self.bootstrapper = self.bootstrapper.with_completion(check);
        self.wait = Some((poll, deadline));
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
        let mut run = Run {
            start: Instant::now(),
            machine: machine.name.clone(),
            timeline: Timeline::default(),
            events: Vec::new(),
            connections: 0,
        };
        let mut result = match self.wait {
            Some((poll, deadline)) => check_wait(poll, deadline),
            None => Ok(()),
        };
        if result.is_ok() {
            for attempt in 1..=self.attempts {
                result = self.attempt(machine, &mut run).await;
                match &result {
                    Err(e) if e.is_retryable() && attempt < self.attempts => {
                        run.event(
                            Phase::Bootstrapping,
                            format!("attempt {attempt} interrupted: {e}"),
                        );
                        tracing::warn!(machine = %machine.name, error = %e, "interrupted; reconnecting");
                    }
                    _ => break,
                }
            }
        }
        if result.is_ok() {
            run.timeline.ready = Some(run.start.elapsed());
            run.event(Phase::Ready, "ready");
        } else {
            run.event(Phase::Failed, "failed");
        }
        HostReport {
            machine: run.machine,
            result,
            timeline: run.timeline,
            events: run.events,
            connections: run.connections,
        }
    }

    async fn attempt(&self, machine: &Machine, run: &mut Run) -> Result<()> {
        let transport = self.connector.connect(machine).await?;
        run.connections += 1;
        run.timeline.reachable.get_or_insert(run.start.elapsed());
        run.event(Phase::Bootstrapping, "connected");
        // Validated in run_one; without a check the bootstrapper never waits.
        let (poll, deadline) = self
            .wait
            .unwrap_or((Duration::from_secs(1), Duration::ZERO));
        let mut m = machine.clone();
        drive(
            &self.bootstrapper,
            &mut m,
            transport.as_ref(),
            poll,
            deadline,
            |step| {
                if *step == BootstrapStep::CompletionDone {
                    run.timeline.complete.get_or_insert(run.start.elapsed());
                }
                run.event(Phase::Bootstrapping, step.to_string());
            },
        )
        .await
    }
}

impl fmt::Debug for LayerRunner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerRunner")
            .field("bootstrapper", &self.bootstrapper)
            .field("wait", &self.wait)
            .field("concurrency", &self.concurrency)
            .field("attempts", &self.attempts)
            .finish()
    }
}

/// One machine's run as it goes.
struct Run {
    start: Instant,
    machine: MachineName,
    timeline: Timeline,
    events: Vec<ProgressEvent>,
    connections: usize,
}

impl Run {
    fn event(&mut self, phase: Phase, message: impl Into<String>) {
        self.events
            .push(ProgressEvent::new(self.machine.clone(), phase, message));
    }
}

/// Takes `bootstrapper`'s steps on `machine` until it is done, looking again every
/// `poll` while coupled software runs, for at most `deadline` of waiting. Every step
/// but the waits and the last is passed to `on_step`.
async fn drive(
    bootstrapper: &Bootstrapper,
    machine: &mut Machine,
    transport: &dyn Transport,
    poll: Duration,
    deadline: Duration,
    mut on_step: impl FnMut(&BootstrapStep),
) -> Result<()> {
    let start = Instant::now();
    let mut state = BootstrapState::default();
    loop {
        match bootstrapper.step(machine, transport, &mut state).await? {
            BootstrapStep::Done => return Ok(()),
            BootstrapStep::Failed(why) => {
                return Err(Error::permanent(format!(
                    "{}: coupled software failed: {why}",
                    machine.name
                )));
            }
            BootstrapStep::Waiting if start.elapsed() + poll > deadline => {
                return Err(Error::timeout(format!(
                    "{}: coupled software not complete within {:.1}s",
                    machine.name,
                    deadline.as_secs_f64()
                )));
            }
            BootstrapStep::Waiting => tokio::time::sleep(poll).await,
            step => on_step(&step),
        }
    }
}

/// Refuses a zero `poll`, or a `poll` or `deadline` over a year, naming it.
fn check_wait(poll: Duration, deadline: Duration) -> Result<()> {
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
    Ok(())
}

/// Polls `check` every `poll` until done, failed, or `deadline`, through the same
/// [`Bootstrapper`] the runner and the composer use. A zero `poll`, or a `poll` or
/// `deadline` over a year, is an invalid-spec error naming it.
pub async fn wait_completion(
    machine: &Machine,
    transport: &dyn Transport,
    check: Arc<dyn CompletionCheck>,
    poll: Duration,
    deadline: Duration,
) -> Result<()> {
    check_wait(poll, deadline)?;
    let waiter = Bootstrapper::new().with_completion(check);
    drive(
        &waiter,
        &mut machine.clone(),
        transport,
        poll,
        deadline,
        |_| {},
    )
    .await
}
