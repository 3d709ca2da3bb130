//! A machine's phase from what it is doing: whether its processes live, and what
//! cloud-init says in `/run/cloud-init/result.json` (written when its last stage ends).

use std::path::Path;

use machine_core::{Failure, Phase, Result};
use serde::Deserialize;

use crate::engine::Engine;
use crate::netns::BOOT_LOG;
use crate::state::MachineRecord;

/// Where cloud-init reports the end of a boot.
pub(crate) const RESULT_FILE: &str = "/run/cloud-init/result.json";
/// cloud-init's output log: the machine's console.
pub(crate) const OUTPUT_LOG: &str = "/var/log/cloud-init-output.log";

#[derive(Deserialize)]
struct ResultFile {
    v1: ResultV1,
}

#[derive(Deserialize)]
struct ResultV1 {
    #[serde(default)]
    errors: Vec<serde_json::Value>,
}

/// The phase of the machine, and why it failed when it did.
pub(crate) fn observe(
    engine: &dyn Engine,
    dir: &Path,
    r: &MachineRecord,
) -> Result<(Phase, Option<Failure>)> {
    if r.deleting {
        return Ok((Phase::Deleting, None));
    }
    // A stopped machine exists but does not run.
    if !r.powered {
        return Ok((Phase::Stopped, None));
    }
    // Not booted yet (or its boot was never recorded): whatever cloud-init result the
    // machine's files hold is an earlier boot's. The boot clears it before it starts.
    if r.boot.is_none() {
        return Ok((Phase::Provisioning, None));
    }
    if let Some(bytes) = engine.read_file(dir, RESULT_FILE)? {
        let errors = match serde_json::from_slice::<ResultFile>(&bytes) {
            Ok(result) => result.v1.errors,
            // Half-written: cloud-init is finishing; look again later.
            Err(_) => return Ok((Phase::Provisioning, None)),
        };
        if errors.is_empty() {
            let rejected = log_lines(engine, dir, &REJECTIONS)?;
            if rejected.is_empty() {
                return Ok((Phase::Provisioned, None));
            }
            return Ok((
                Phase::Failed,
                Some(Failure::new(
                    "BootFailed",
                    format!("cloud-init rejected the user data: {}", rejected.join("; ")),
                )),
            ));
        }
        let errors: Vec<String> = errors
            .iter()
            .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_owned))
            .collect();
        let mut message = format!("cloud-init reported: {}", errors.join("; "));
        let warnings = log_lines(engine, dir, &["WARNING", "ERROR", "Traceback"])?;
        if !warnings.is_empty() {
            message.push_str(&format!(" ({})", warnings.join("; ")));
        }
        return Ok((Phase::Failed, Some(Failure::new("BootFailed", message))));
    }
    if engine.is_running(r) {
        return Ok((Phase::Provisioning, None));
    }
    let log = std::fs::read_to_string(dir.join(BOOT_LOG)).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(5).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Ok((
        Phase::Failed,
        Some(Failure::new(
            "BootFailed",
            format!(
                "the machine stopped before cloud-init finished: {}",
                tail.join(" | ")
            ),
        )),
    ))
}

/// What cloud-init 22.4 logs when it cannot use user data, yet reports done without
/// errors: the machine did not get its configuration, so it has failed. (Its schema
/// warning is not one: the image's own `locale: false`, which cloud-init honours, sets
/// it off.)
const REJECTIONS: [&str; 2] = [
    "Failed loading yaml blob",
    "Failed at merging in cloud config part",
];

/// cloud-init's own words: the lines of its output log holding any of `needles`,
/// at most five.
fn log_lines(engine: &dyn Engine, dir: &Path, needles: &[&str]) -> Result<Vec<String>> {
    let Some(bytes) = engine.read_file(dir, OUTPUT_LOG)? else {
        return Ok(Vec::new());
    };
    let text = String::from_utf8_lossy(&bytes);
    Ok(text
        .lines()
        .filter(|l| needles.iter().any(|n| l.contains(n)))
        // The schema notice the image's own `locale: false` causes says nothing
        // about this machine's failure.
        .filter(|l| !l.contains("Invalid cloud-config provided"))
        .take(5)
        .map(|l| l.trim().to_owned())
        .collect())
}
