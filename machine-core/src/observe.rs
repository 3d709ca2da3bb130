//! Progress events and per-machine timelines.
//!
//! The composer sends a [`ProgressEvent`] on every phase change and layer; a CLI renders
//! them as progress output. A [`Timeline`] says where one machine's time went.

use std::fmt;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use serde::Serialize;
use tokio::sync::broadcast;

use crate::machine::Phase;
use crate::name::MachineName;

/// Something that happened to one machine.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ProgressEvent {
    /// The machine.
    pub machine: MachineName,
    /// Its phase after the event.
    pub phase: Phase,
    /// What happened, in a few words (`created sim:///m-1`, `layer base applied`).
    pub message: String,
    /// When it happened.
    #[serde(with = "humantime_serde")]
    pub at: SystemTime,
}

impl ProgressEvent {
    /// An event that happens now.
    pub fn new(machine: MachineName, phase: Phase, message: impl Into<String>) -> Self {
        ProgressEvent {
            machine,
            phase,
            message: message.into(),
            at: SystemTime::now(),
        }
    }
}

/// Sends progress events to any number of subscribers; sending with none is cheap.
#[derive(Debug, Clone)]
pub struct EventSink {
    tx: broadcast::Sender<ProgressEvent>,
}

impl EventSink {
    /// A sink buffering up to `capacity` events per slow subscriber (older ones are
    /// dropped for that subscriber, which then sees a `Lagged` error).
    pub fn new(capacity: usize) -> Self {
        EventSink {
            tx: broadcast::channel(capacity.max(1)).0,
        }
    }

    /// A new subscriber, which sees events sent from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<ProgressEvent> {
        self.tx.subscribe()
    }

    pub(crate) fn emit(
        &self,
        machine: &MachineName,
        phase: Phase,
        message: impl FnOnce() -> String,
    ) {
        if self.tx.receiver_count() > 0 {
            let _ = self
                .tx
                .send(ProgressEvent::new(machine.clone(), phase, message()));
        }
    }
}

impl Default for EventSink {
    fn default() -> Self {
        EventSink::new(1024)
    }
}

/// Where one machine's provisioning time went, each mark measured from the start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Timeline {
    /// When the provider accepted the create (or the existing machine was adopted).
    pub created: Option<Duration>,
    /// When the provider first reported it running.
    pub running: Option<Duration>,
    /// When a transport first reached it.
    pub reachable: Option<Duration>,
    /// When the completion check first reported the coupled software finished (`None`
    /// without a check).
    pub complete: Option<Duration>,
    /// When every layer was done.
    pub ready: Option<Duration>,
}

impl Timeline {
    /// Time spent in creation (the create call).
    pub fn create_time(&self) -> Option<Duration> {
        self.created
    }

    /// Time from created to running.
    pub fn boot_time(&self) -> Option<Duration> {
        Some(self.running?.saturating_sub(self.created?))
    }

    /// Time from running to ready: waiting for reachability and applying software.
    pub fn bootstrap_time(&self) -> Option<Duration> {
        Some(self.ready?.saturating_sub(self.running?))
    }
}

impl fmt::Display for Timeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |d: Option<Duration>| {
            d.map_or_else(|| "-".to_owned(), |d| format!("{:.2}s", d.as_secs_f64()))
        };
        write!(
            f,
            "create {} | boot {} | reachable at {} | bootstrap {} | total {}",
            show(self.create_time()),
            show(self.boot_time()),
            show(self.reachable),
            show(self.bootstrap_time()),
            show(self.ready)
        )
    }
}

/// Records a timeline as marks are reached, keeping the first time of each. On tokio's
/// clock, so that tests with a paused clock see the same times the deadlines use.
#[derive(Debug, Clone)]
pub(crate) struct TimelineRecorder {
    start: Instant,
    pub(crate) timeline: Timeline,
}

impl TimelineRecorder {
    pub(crate) fn start() -> Self {
        TimelineRecorder {
            start: Instant::now(),
            timeline: Timeline::default(),
        }
    }

    pub(crate) fn mark(&mut self, which: fn(&mut Timeline) -> &mut Option<Duration>) {
        let elapsed = self.start.elapsed();
        which(&mut self.timeline).get_or_insert(elapsed);
    }
}
