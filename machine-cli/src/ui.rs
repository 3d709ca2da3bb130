//! Progress bars (indicatif, on stderr, only on a terminal) and lines (stdout), and
//! Ctrl-C.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use machine_core::{CancellationToken, EventSink, Phase};
use tokio::sync::watch;

/// Lines for people on stdout, with progress bars on stderr kept out of their way.
#[derive(Clone)]
pub struct Ui {
    multi: MultiProgress,
    /// Lines at all (`--output json` keeps stdout for the document).
    lines: bool,
    /// Lines about machines, held until the step that changed them has said so.
    held: Arc<Mutex<Vec<String>>>,
}

impl Ui {
    /// Bars on stderr when it is a terminal and `bars` holds; lines when `lines` holds.
    pub fn new(bars: bool, lines: bool) -> Self {
        let target = if bars {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        Ui {
            multi: MultiProgress::with_draw_target(target),
            lines,
            held: Arc::default(),
        }
    }

    /// Prints a line on stdout above the bars.
    pub fn line(&self, text: impl AsRef<str>) {
        if self.lines {
            self.multi.suspend(|| println!("{}", text.as_ref()));
        }
    }

    /// Prints the lines held back by [`Ui::follow`].
    pub fn flush(&self) {
        let held = std::mem::take(&mut *self.held.lock().unwrap_or_else(|p| p.into_inner()));
        for line in held {
            self.line(line);
        }
    }

    /// The bar of a rollout: `len` machines.
    pub fn rollout(&self, what: &str, len: u64) -> ProgressBar {
        let bar = self.multi.add(ProgressBar::new(len.max(1)));
        bar.set_style(
            ProgressStyle::with_template("{prefix:.bold} [{bar:30.cyan/blue}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_prefix(what.to_owned());
        bar
    }

    /// Shows a bar per machine while it changes, from the composer's events, until
    /// `stop` is cancelled; a line when one that changed ends (ready, failed), held for
    /// [`Ui::flush`].
    pub fn follow(
        &self,
        events: &EventSink,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let mut rx = events.subscribe();
        let ui = self.clone();
        tokio::spawn(async move {
            let style = ProgressStyle::with_template("  {spinner} {prefix:<20} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner());
            let mut bars: HashMap<String, ProgressBar> = HashMap::new();
            // Machines that were made or had a layer applied: their Ready is news; a
            // first look at a machine that already was Ready ("phase ..." only) is not.
            let mut changed: HashSet<String> = HashSet::new();
            loop {
                let event = tokio::select! {
                    _ = stop.cancelled() => break,
                    e = rx.recv() => e,
                };
                let e = match event {
                    Ok(e) => e,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => break,
                };
                let name = e.machine.to_string();
                // A deletion is told by the reconciler's decision: its bar ends there.
                let ended = matches!(
                    e.phase,
                    Phase::Ready | Phase::Deleting | Phase::Deleted | Phase::Failed
                );
                if ended {
                    if let Some(bar) = bars.remove(&name) {
                        bar.finish_and_clear();
                        ui.multi.remove(&bar);
                    }
                    let word = match e.phase {
                        Phase::Ready if changed.remove(&name) => "ready".to_owned(),
                        Phase::Failed => format!("failed: {}", e.message),
                        _ => continue,
                    };
                    // Printed after the step's decisions (`flush`), which come at its end.
                    ui.held
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(format!("  {name}: {word}"));
                    continue;
                }
                let bar = bars.entry(name.clone()).or_insert_with(|| {
                    let bar = ui.multi.add(ProgressBar::new_spinner());
                    bar.set_style(style.clone());
                    bar.set_prefix(name.clone());
                    bar.enable_steady_tick(Duration::from_millis(120));
                    bar
                });
                let phase = e.phase.to_string().to_lowercase();
                if !e.message.starts_with("phase ") {
                    changed.insert(name.clone());
                }
                if e.message.to_lowercase() == format!("phase {phase}") {
                    bar.set_message(phase);
                } else {
                    bar.set_message(format!("{phase}: {}", e.message));
                }
            }
            for bar in bars.into_values() {
                bar.finish_and_clear();
            }
        })
    }
}

/// Ctrl-C: the first press asks to stop between steps, the second to stop now.
#[derive(Clone)]
pub struct Stop {
    presses: watch::Receiver<usize>,
}

impl Stop {
    /// Catches SIGINT from now on; `ui` says what a press does.
    pub fn install(ui: Ui) -> Stop {
        let (tx, rx) = watch::channel(0usize);
        tokio::spawn(async move {
            let mut n = 0;
            while tokio::signal::ctrl_c().await.is_ok() {
                n += 1;
                if n == 1 {
                    ui.line("Interrupted: stopping after this step (Ctrl-C again to stop now).");
                }
                if tx.send(n).is_err() {
                    break;
                }
            }
        });
        Stop { presses: rx }
    }

    /// Whether Ctrl-C was pressed.
    pub fn requested(&self) -> bool {
        *self.presses.borrow() > 0
    }

    /// Returns once Ctrl-C was pressed `n` times.
    pub async fn pressed(&self, n: usize) {
        let mut rx = self.presses.clone();
        if rx.wait_for(|p| *p >= n).await.is_err() {
            // The handler ended: Ctrl-C cannot come any more.
            std::future::pending::<()>().await;
        }
    }
}
