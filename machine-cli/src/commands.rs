//! The commands: `plan`, `apply`, `status`, `destroy`, and their exit codes.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use machine_core::fleet::{FleetReconciled, conditions};
use machine_core::{CancellationToken, Result};
use serde::Serialize;

use crate::fleet::{Fleet, Inspection, State, age};
use crate::ui::{Stop, Ui};

/// What a command ended with; its number is the process's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Done: the fleet is as the file says (`plan`: nothing to do).
    Ok = 0,
    /// An error: a bad file, a provider that refused, a state file in use.
    Error = 1,
    /// `plan`: changes are planned (as `terraform plan -detailed-exitcode`).
    Changes = 2,
    /// `apply`/`destroy` stopped short: a rollout or remediation paused (a machine
    /// failed, too many unhealthy) or the timeout passed.
    Stopped = 3,
    /// Ctrl-C: stopped between steps; a rerun carries on.
    Interrupted = 130,
}

/// Text for people, or JSON for programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Tables and sentences.
    Text,
    /// One JSON document on stdout.
    Json,
}

/// `plan`: what an apply would change, machine by machine, and why.
pub async fn plan(fleet: &Fleet, output: Output) -> Result<Exit> {
    let seen = fleet.inspect().await?;
    match output {
        Output::Json => print_json(&PlanDoc::of(fleet, &seen)),
        Output::Text => print!("{}", plan_text(fleet, &seen)),
    }
    Ok(if seen.converged() {
        Exit::Ok
    } else {
        Exit::Changes
    })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PlanDoc<'a> {
    set: &'a str,
    provider: String,
    replicas: u32,
    changes: Vec<&'a crate::fleet::Change>,
    in_progress: Vec<InProgress>,
    summary: Summary,
    observed_revision: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InProgress {
    machine: String,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct Summary {
    create: usize,
    replace: usize,
    update_in_place: usize,
    delete: usize,
    in_progress: usize,
}

impl<'a> PlanDoc<'a> {
    fn of(fleet: &'a Fleet, seen: &'a Inspection) -> Self {
        PlanDoc {
            set: &fleet.reconciler.set().name,
            provider: fleet.place(),
            replicas: fleet.reconciler.set().replicas,
            changes: seen.changes(),
            in_progress: seen
                .in_progress()
                .iter()
                .map(|r| InProgress {
                    machine: r.machine.name.to_string(),
                    state: r.state.word(),
                    detail: r.state.detail(),
                })
                .collect(),
            summary: summary(seen),
            observed_revision: &seen.planned.status.observed_revision,
        }
    }
}

fn summary(seen: &Inspection) -> Summary {
    let mut s = Summary::default();
    for c in seen.changes() {
        match c.action {
            "create" => s.create += 1,
            "replace" => s.replace += 1,
            "delete" => s.delete += 1,
            _ => s.update_in_place += 1,
        }
    }
    s.in_progress = seen.in_progress().len();
    s
}

fn plan_text(fleet: &Fleet, seen: &Inspection) -> String {
    let set = fleet.reconciler.set();
    let mut out = format!(
        "Set {} on {}: {} replicas wanted, {} machines now.\n\n",
        set.name,
        fleet.place(),
        set.replicas,
        seen.current().count()
    );
    if seen.converged() {
        out.push_str(&format!(
            "No changes. The fleet matches the file (revision {}).\n",
            short_revision(&seen.planned.status.observed_revision)
        ));
        return out;
    }
    let mut rows: Vec<[String; 4]> = Vec::new();
    for c in seen.changes() {
        rows.push([
            c.sign().to_owned(),
            c.machine.clone().unwrap_or_default(),
            c.words().to_owned(),
            c.reasons.join("; "),
        ]);
    }
    for r in seen.in_progress() {
        rows.push([
            "...".to_owned(),
            r.machine.name.to_string(),
            "in progress".to_owned(),
            match r.state.detail() {
                Some(d) => format!("{}: {d}", r.state.word()),
                None => r.state.word().to_owned(),
            },
        ]);
    }
    out.push_str(&table(None, &rows));
    let s = summary(seen);
    let _ = write!(
        out,
        "\nPlan: {} to create, {} to replace, {} to update in place, {} to delete",
        s.create, s.replace, s.update_in_place, s.delete
    );
    if s.in_progress > 0 {
        let _ = write!(out, "; {} in progress", s.in_progress);
    }
    out.push_str(".\n");
    out
}

fn short_revision(r: &str) -> &str {
    &r[..r.len().min(12)]
}

/// Columns padded to their widest cell, the last one left ragged.
fn table<const N: usize>(header: Option<[&str; N]>, rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    let all = header
        .iter()
        .map(|h| h.map(str::to_owned))
        .chain(rows.iter().cloned())
        .collect::<Vec<_>>();
    for r in &all {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in &all {
        out.push_str("  ");
        for (i, cell) in r.iter().enumerate() {
            if i + 1 == N {
                out.push_str(cell);
            } else {
                let _ = write!(out, "{cell:<w$}  ", w = widths[i]);
            }
        }
        let trimmed = out.trim_end().len();
        out.truncate(trimmed);
        out.push('\n');
    }
    out
}

fn print_json<T: Serialize>(doc: &T) {
    match serde_json::to_string_pretty(doc) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("error: cannot write JSON: {e}"),
    }
}

/// `status`: the set and each machine.
pub async fn status(fleet: &Fleet, output: Output) -> Result<Exit> {
    let seen = fleet.inspect().await?;
    let set = fleet.reconciler.set();
    let current: Vec<_> = seen.current().collect();
    let counts = Counts {
        desired: set.replicas,
        machines: current.len(),
        ready: current.iter().filter(|r| r.state == State::Ready).count(),
        up_to_date: current
            .iter()
            .filter(|r| r.state == State::Ready && r.change.is_none())
            .count(),
        changes_planned: seen.changes().len(),
        deleting: seen
            .rows
            .iter()
            .filter(|r| r.state == State::Deleting)
            .count(),
    };
    match output {
        Output::Json => {
            let doc = StatusDoc {
                set: &set.name,
                provider: fleet.place(),
                converged: seen.converged(),
                counts,
                observed_revision: &seen.planned.status.observed_revision,
                machines: seen
                    .rows
                    .iter()
                    .map(|r| MachineDoc {
                        name: r.machine.name.to_string(),
                        provider_id: r.machine.provider_id.to_string(),
                        phase: r.machine.phase.to_string(),
                        state: r.state.word(),
                        detail: r.state.detail(),
                        revision: r.machine.revision().map(str::to_owned),
                        addresses: r
                            .machine
                            .addresses
                            .iter()
                            .map(|a| a.address.clone())
                            .collect(),
                        age_seconds: age(&r.machine).map(|d| d.as_secs()),
                        change: r.change.clone(),
                    })
                    .collect(),
            };
            print_json(&doc);
        }
        Output::Text => {
            let mut out = format!(
                "Set {} on {}: {} wanted, {} machines, {} ready, {} up to date{}.\n\n",
                set.name,
                fleet.place(),
                counts.desired,
                counts.machines,
                counts.ready,
                counts.up_to_date,
                if counts.deleting > 0 {
                    format!(", {} being deleted", counts.deleting)
                } else {
                    String::new()
                },
            );
            if seen.rows.is_empty() {
                out.push_str("No machines.\n");
            } else {
                let rows: Vec<[String; 6]> = seen
                    .rows
                    .iter()
                    .map(|r| {
                        [
                            r.machine.name.to_string(),
                            r.state.word().to_owned(),
                            r.machine
                                .addresses
                                .iter()
                                .find(|a| a.kind == machine_core::AddressKind::InternalIP)
                                .map_or_else(|| "-".to_owned(), |a| a.address.clone()),
                            age(&r.machine).map_or_else(
                                || "-".to_owned(),
                                |d| {
                                    humantime::format_duration(Duration::from_secs(d.as_secs()))
                                        .to_string()
                                },
                            ),
                            r.machine.revision().map_or("-", short_revision).to_owned(),
                            match (&r.change, r.state.detail()) {
                                (Some(c), _) => format!("{}: {}", c.words(), c.reasons.join("; ")),
                                (None, Some(d)) => d,
                                (None, None) => String::new(),
                            },
                        ]
                    })
                    .collect();
                out.push_str(&table(
                    Some(["NAME", "STATE", "ADDRESS", "AGE", "REVISION", "PENDING"]),
                    &rows,
                ));
            }
            if !seen.converged() {
                out.push_str("\nNot as the file says: `machines plan` shows what `machines apply` would do.\n");
            }
            print!("{out}");
        }
    }
    Ok(Exit::Ok)
}

#[derive(Serialize, Clone, Copy)]
#[serde(rename_all = "camelCase")]
struct Counts {
    desired: u32,
    machines: usize,
    ready: usize,
    up_to_date: usize,
    changes_planned: usize,
    deleting: usize,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusDoc<'a> {
    set: &'a str,
    provider: String,
    converged: bool,
    counts: Counts,
    observed_revision: &'a str,
    machines: Vec<MachineDoc>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MachineDoc {
    name: String,
    provider_id: String,
    phase: String,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
    revision: Option<String>,
    addresses: Vec<String>,
    age_seconds: Option<u64>,
    change: Option<crate::fleet::Change>,
}

/// How a drive toward the desired state ended.
enum Ending {
    Converged(Box<FleetReconciled>),
    Paused(String),
    TimedOut,
    Interrupted,
}

/// What an `apply` or `destroy` did, for `--output json`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RunDoc<'a> {
    command: &'a str,
    /// `converged`, `paused`, `timedOut`, `interrupted`.
    outcome: &'static str,
    exit_code: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    elapsed_seconds: f64,
    /// The reconciler's decisions, in order, with their reasons.
    decisions: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a machine_core::fleet::FleetStatus>,
}

/// Says how a run ended (a sentence, or a JSON document) and gives its exit code.
fn report(
    ui: &Ui,
    output: Output,
    command: &str,
    started: Instant,
    ending: &Ending,
    decisions: &[String],
    done: String,
) -> Exit {
    let (outcome, exit, reason) = match ending {
        Ending::Converged(_) => ("converged", Exit::Ok, None),
        Ending::Paused(why) => ("paused", Exit::Stopped, Some(why.clone())),
        Ending::TimedOut => (
            "timedOut",
            Exit::Stopped,
            Some("not converged within the timeout".to_owned()),
        ),
        Ending::Interrupted => ("interrupted", Exit::Interrupted, Some("Ctrl-C".to_owned())),
    };
    if output == Output::Json {
        print_json(&RunDoc {
            command,
            outcome,
            exit_code: exit as i32,
            reason,
            elapsed_seconds: started.elapsed().as_secs_f64(),
            decisions,
            status: match ending {
                Ending::Converged(step) => Some(&step.status),
                _ => None,
            },
        });
        return exit;
    }
    match ending {
        Ending::Converged(_) => ui.line(done),
        Ending::Paused(why) => {
            ui.line(format!("\nStopped: {why}"));
            ui.line(format!(
                "Fix the file (or the machine), then run `machines {command}` again."
            ));
        }
        Ending::TimedOut => ui.line(format!(
            "\nStopped: not converged within the timeout; `machines {command}` again carries on."
        )),
        Ending::Interrupted => ui.line(format!(
            "\nStopped between steps (Ctrl-C); everything done so far is kept. Run `machines {command}` again to carry on."
        )),
    }
    exit
}

/// `apply`: steps the fleet reconciler to convergence, saving after every step.
pub async fn apply(
    fleet: &Fleet,
    ui: &Ui,
    stop: &Stop,
    timeout: Duration,
    output: Output,
) -> Result<Exit> {
    let started = Instant::now();
    let seen = fleet.inspect().await?;
    ui.line(plan_text(fleet, &seen).trim_end());
    let mut decisions = Vec::new();
    let replicas = u64::from(fleet.reconciler.set().replicas);
    // Driven even when the plan shows nothing to do: a new process's reconciler steps
    // each machine once (reads only, on a converged fleet) and then knows the status.
    ui.line("");
    let bar = ui.rollout("rollout", replicas);
    let ending = drive(fleet, ui, stop, timeout, true, &mut decisions, |step| {
        bar.set_position(u64::from(step.status.updated).min(replicas));
        bar.set_message(format!(
            "{} ready, {} available, {} up to date",
            step.status.ready, step.status.available, step.status.updated
        ));
    })
    .await?;
    bar.finish_and_clear();
    let done = match &ending {
        Ending::Converged(step) => format!(
            "\nApply complete: {} of {} machines ready and up to date (revision {}) in {:.1} s.",
            step.status.updated,
            replicas,
            short_revision(&step.status.observed_revision),
            started.elapsed().as_secs_f64()
        ),
        _ => String::new(),
    };
    Ok(report(
        ui, output, "apply", started, &ending, &decisions, done,
    ))
}

/// `destroy`: scales the set to zero through the reconciler, then waits until the
/// provider lists none of its machines.
pub async fn destroy(
    fleet: &Fleet,
    ui: &Ui,
    stop: &Stop,
    timeout: Duration,
    output: Output,
) -> Result<Exit> {
    let started = Instant::now();
    let before = fleet.machines().await?;
    let live = before.iter().filter(|m| !m.phase.is_deleting()).count() as u64;
    ui.line(format!(
        "Set {} on {}: deleting {live} machines.",
        fleet.reconciler.set().name,
        fleet.place()
    ));
    let bar = ui.rollout("destroy", live);
    let mut decisions = Vec::new();
    // A paused rollout or remediation does not hold deletions back: not a reason to stop.
    let mut ending = drive(fleet, ui, stop, timeout, false, &mut decisions, |step| {
        bar.set_position(live.saturating_sub(u64::from(step.status.replicas)));
    })
    .await?;
    // Deleted is when the provider no longer lists them, not when deletes were asked.
    let poll = fleet.reconciler.composer().settings().poll_interval;
    while matches!(ending, Ending::Converged(_)) {
        let left = fleet.machines().await?;
        if left.is_empty() {
            break;
        }
        if stop.requested() {
            ending = Ending::Interrupted;
        } else if started.elapsed() > timeout {
            ending = Ending::TimedOut;
        } else {
            bar.set_message(format!("{} still being deleted", left.len()));
            tokio::select! {
                _ = tokio::time::sleep(poll) => {}
                _ = stop.pressed(1) => {}
            }
        }
    }
    bar.finish_and_clear();
    let mut done = String::new();
    if matches!(ending, Ending::Converged(_)) {
        let removed = fleet.forget_if_empty()?;
        done = format!(
            "\nDestroy complete: {live} machines deleted, none left{} in {:.1} s.",
            if removed {
                " (the simulator's state file is removed)"
            } else {
                ""
            },
            started.elapsed().as_secs_f64()
        );
    } else {
        fleet.save()?;
    }
    Ok(report(
        ui, output, "destroy", started, &ending, &decisions, done,
    ))
}

/// Steps the reconciler until the fleet converges, a rollout or remediation pauses
/// (when `pauses` holds), the timeout passes or Ctrl-C is pressed; saves after every step.
async fn drive(
    fleet: &Fleet,
    ui: &Ui,
    stop: &Stop,
    timeout: Duration,
    pauses: bool,
    decisions: &mut Vec<String>,
    mut progress: impl FnMut(&FleetReconciled),
) -> Result<Ending> {
    let started = Instant::now();
    let poll = fleet.reconciler.composer().settings().poll_interval;
    let follow_stop = CancellationToken::new();
    let follower = ui.follow(&fleet.events, follow_stop.clone());
    let _stop_following = follow_stop.clone().drop_guard();
    let result = async {
        loop {
            if stop.requested() {
                return Ok(Ending::Interrupted);
            }
            let step = tokio::select! {
                r = fleet.reconciler.reconcile() => r,
                // A second Ctrl-C stops mid-step: every step is safe to drop.
                _ = stop.pressed(2) => return Ok(Ending::Interrupted),
            };
            let step = match step {
                Ok(s) => s,
                Err(e) if e.is_retryable() && started.elapsed() < timeout => {
                    ui.line(format!("  listing the set failed ({e}); trying again"));
                    tokio::time::sleep(poll).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            fleet.save()?;
            for d in &step.decisions {
                ui.line(format!("  {d}"));
            }
            decisions.extend(step.decisions.iter().cloned());
            ui.flush();
            progress(&step);
            let status = &step.status;
            let is = |kind: &str| status.condition(kind).is_some_and(|c| c.status);
            if pauses && (is(conditions::ROLLOUT_PAUSED) || is(conditions::REMEDIATION_PAUSED)) {
                let why = [conditions::ROLLOUT_PAUSED, conditions::REMEDIATION_PAUSED]
                    .iter()
                    .filter_map(|k| status.condition(k).filter(|c| c.status))
                    .map(|c| format!("{}: {}", c.kind, c.message))
                    .collect::<Vec<_>>()
                    .join("; ");
                return Ok(Ending::Paused(why));
            }
            if !is(conditions::PROGRESSING) && step.changes.is_empty() {
                return Ok(Ending::Converged(Box::new(step)));
            }
            if started.elapsed() > timeout {
                return Ok(Ending::TimedOut);
            }
            let wait = step.action.requeue_after().unwrap_or(poll).min(poll);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.pressed(1) => {}
            }
        }
    }
    .await;
    // Whatever happened, what the cloud holds now outlives this process.
    fleet.save()?;
    follow_stop.cancel();
    let _ = follower.await;
    ui.flush();
    result
}
