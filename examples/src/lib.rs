//! Shared pieces of the example programs: live progress lines, timeline tables and the
//! SSH flags.

mod ssh_flags;

pub use ssh_flags::{SSH_USAGE, SshFlags};

use std::time::SystemTime;

use machine_core::{EventSink, Provisioned};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;

/// Prints every progress event of `sink` as one line, with the time since `start`,
/// until the sink is dropped or `stop` is cancelled. Returns the printing task.
pub fn print_progress(
    sink: &EventSink,
    start: SystemTime,
    stop: machine_core::CancellationToken,
) -> JoinHandle<()> {
    let mut rx = sink.subscribe();
    tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                biased;
                e = rx.recv() => e,
                _ = stop.cancelled() => {
                    // Drain what was sent before the stop.
                    while let Ok(e) = rx.try_recv() {
                        print_event(start, &e);
                    }
                    return;
                }
            };
            match event {
                Ok(e) => print_event(start, &e),
                Err(RecvError::Lagged(n)) => println!("  ... {n} events skipped (output too slow)"),
                Err(RecvError::Closed) => return,
            }
        }
    })
}

fn print_event(start: SystemTime, e: &machine_core::ProgressEvent) {
    let at = e.at.duration_since(start).unwrap_or_default();
    println!(
        "[{:>6.2}s] {:<14} {:<13} {}",
        at.as_secs_f64(),
        e.machine.as_str(),
        e.phase.to_string(),
        e.message
    );
}

/// Renders a table of where each provisioned machine's time went, each row labelled
/// (with its mode, say).
pub fn timeline_table(done: &[(String, Provisioned)]) -> String {
    let secs = |d: Option<std::time::Duration>| {
        d.map_or_else(|| "-".to_owned(), |d| format!("{:.2}s", d.as_secs_f64()))
    };
    let mut out = format!(
        "{:<14} {:<10} {:>8} {:>8} {:>10} {:>10} {:>8}\n",
        "machine", "mode", "create", "boot", "reachable", "bootstrap", "total"
    );
    for (label, p) in done {
        let t = &p.timeline;
        out.push_str(&format!(
            "{:<14} {:<10} {:>8} {:>8} {:>10} {:>10} {:>8}\n",
            p.machine.name.as_str(),
            label,
            secs(t.create_time()),
            secs(t.boot_time()),
            secs(t.reachable),
            secs(t.bootstrap_time()),
            secs(t.ready)
        ));
    }
    out
}
