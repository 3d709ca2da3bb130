//! Completion by cloud-init's own account: `cloud-init status --long --format json` run
//! through a transport, so a failed bootstrap surfaces cloud-init's error text rather
//! than a timeout. (The sentinel-file signal is [`machine_core::SentinelFile`].)

use async_trait::async_trait;
use machine_core::{
    Completion, CompletionCheck, Error, ExecRequest, Machine, Result, Transport, UserDataPart,
};
use serde::Deserialize;

/// The command run on the machine. `--format json` and `--long` exist in every
/// cloud-init since 18.x (checked against Debian's 22.4); `--wait` is not used because
/// a check never blocks.
pub const STATUS_COMMAND: &str = "cloud-init status --long --format json";

/// What `cloud-init status` reports, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloudInitState {
    /// Not started yet.
    NotRun,
    /// Running (the stage, when cloud-init says).
    Running(String),
    /// Finished without errors.
    Done,
    /// Finished, but with recoverable errors (cloud-init 23.4+ "degraded done"); the
    /// warnings as cloud-init wrote them.
    Degraded(Vec<String>),
    /// Finished with errors: cloud-init's own error lines.
    Error(Vec<String>),
    /// cloud-init is disabled on this machine, with the reason.
    Disabled(String),
}

#[derive(Deserialize)]
struct StatusJson {
    status: String,
    #[serde(default)]
    extended_status: Option<String>,
    #[serde(default)]
    detail: String,
    #[serde(default)]
    errors: Vec<String>,
    #[serde(default)]
    recoverable_errors: std::collections::BTreeMap<String, Vec<String>>,
}

/// Parses the output of [`STATUS_COMMAND`] (JSON), or of plain `cloud-init status
/// --long` (tabular) as older images print it.
pub fn parse_status(stdout: &str) -> Result<CloudInitState> {
    let text = stdout.trim();
    if text.starts_with('{') {
        let s: StatusJson = serde_json::from_str(text).map_err(|e| {
            Error::permanent(format!("cloud-init status printed unreadable JSON: {e}"))
        })?;
        let degraded = s
            .extended_status
            .as_deref()
            .is_some_and(|x| x.starts_with("degraded"));
        return Ok(match s.status.as_str() {
            "not run" | "not started" => CloudInitState::NotRun,
            "running" => CloudInitState::Running(s.detail),
            "done" if degraded => CloudInitState::Degraded(
                s.recoverable_errors
                    .into_iter()
                    .flat_map(|(level, msgs)| {
                        msgs.into_iter().map(move |m| format!("{level}: {m}"))
                    })
                    .collect(),
            ),
            "done" => CloudInitState::Done,
            "error" => CloudInitState::Error(if s.errors.is_empty() {
                vec![s.detail]
            } else {
                s.errors
            }),
            "disabled" => CloudInitState::Disabled(s.detail),
            other => {
                return Err(Error::permanent(format!(
                    "cloud-init status reported an unknown status {other:?}"
                )));
            }
        });
    }
    // Tabular: "status: done" then, with --long, "detail:" and its lines.
    let mut status = None;
    let mut detail = Vec::new();
    let mut in_detail = false;
    for line in text.lines() {
        let line = line.trim_start_matches('.');
        if let Some(s) = line.strip_prefix("status:") {
            status = Some(s.trim().to_owned());
        } else if line.starts_with("detail:") {
            in_detail = true;
        } else if in_detail && !line.trim().is_empty() {
            detail.push(line.trim().to_owned());
        }
    }
    match status.as_deref() {
        Some("done") => Ok(CloudInitState::Done),
        Some("running") => Ok(CloudInitState::Running(detail.join("\n"))),
        Some("not run" | "not started") => Ok(CloudInitState::NotRun),
        Some("error") => Ok(CloudInitState::Error(detail)),
        Some("disabled") => Ok(CloudInitState::Disabled(detail.join("\n"))),
        Some("degraded done") => Ok(CloudInitState::Degraded(detail)),
        _ => Err(Error::permanent(format!(
            "cannot read cloud-init status output: {:?}",
            text.chars().take(200).collect::<String>()
        ))),
    }
}

/// A [`CompletionCheck`] that asks cloud-init itself. Adds no user data.
#[derive(Debug, Clone, Default)]
pub struct CloudInitStatus {
    sudo: bool,
    fail_on_degraded: bool,
}

impl CloudInitStatus {
    /// A check run as the connecting user (status is world-readable), treating a
    /// degraded finish as done (with a warning in the log).
    pub fn new() -> Self {
        CloudInitStatus::default()
    }

    /// Runs the command through `sudo -n`.
    pub fn sudo(mut self) -> Self {
        self.sudo = true;
        self
    }

    /// Treats a degraded finish (recoverable errors) as a failure.
    pub fn fail_on_degraded(mut self) -> Self {
        self.fail_on_degraded = true;
        self
    }

    /// Maps a parsed state to a completion.
    pub fn completion(&self, state: CloudInitState) -> Completion {
        match state {
            CloudInitState::NotRun | CloudInitState::Running(_) => Completion::Pending,
            CloudInitState::Done => Completion::Done,
            CloudInitState::Degraded(w) if self.fail_on_degraded => {
                Completion::Failed(format!("cloud-init finished degraded: {}", w.join("; ")))
            }
            CloudInitState::Degraded(w) => {
                tracing::warn!(warnings = %w.join("; "), "cloud-init finished degraded");
                Completion::Done
            }
            CloudInitState::Error(errors) => {
                Completion::Failed(format!("cloud-init failed: {}", errors.join("; ")))
            }
            CloudInitState::Disabled(why) => {
                Completion::Failed(format!("cloud-init is disabled: {why}"))
            }
        }
    }
}

#[async_trait]
impl CompletionCheck for CloudInitStatus {
    fn user_data_parts(&self, _spec: &machine_core::MachineSpec) -> Vec<UserDataPart> {
        Vec::new()
    }

    async fn check(&self, _machine: &Machine, transport: &dyn Transport) -> Result<Completion> {
        let mut req = ExecRequest::new(STATUS_COMMAND);
        req.max_output = 256 * 1024;
        if self.sudo {
            req = req.sudo();
        }
        let out = transport.exec(&req).await?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if out.status == Some(127) {
            return Err(Error::permanent(
                "cloud-init is not installed on the machine (status 127)",
            ));
        }
        // cloud-init exits 1 on error and 2 when degraded, still printing its status.
        match parse_status(&stdout) {
            Ok(CloudInitState::Error(mut errors)) => {
                // cloud-init says only that runcmd failed; the composer's marker says
                // whose commands were running.
                if errors.iter().any(|e| e.contains("runcmd"))
                    && let Ok(Some(mark)) = transport
                        .read_file(machine_core::user_data::RUNCMD_LAYER_PATH, 4096)
                        .await
                    && let Some(line) =
                        machine_core::user_data::runcmd_failure(&String::from_utf8_lossy(&mark))
                {
                    errors.push(line);
                }
                Ok(self.completion(CloudInitState::Error(errors)))
            }
            Ok(state) => Ok(self.completion(state)),
            Err(e) if !out.success() => out
                .check(STATUS_COMMAND)
                .map(|_| Completion::Pending)
                .map_err(|c| c.context(e.message().to_owned())),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_json_degraded_and_tabular_forms_parse() {
        let j = r#"{"status": "done", "extended_status": "degraded done", "detail": "DataSourceNoCloud",
            "errors": [], "recoverable_errors": {"WARNING": ["Failed to set locale"]}}"#;
        assert_eq!(
            parse_status(j).unwrap(),
            CloudInitState::Degraded(vec!["WARNING: Failed to set locale".into()])
        );
        let c = CloudInitStatus::new()
            .fail_on_degraded()
            .completion(parse_status(j).unwrap());
        assert!(matches!(c, Completion::Failed(m) if m.contains("Failed to set locale")));
        assert_eq!(
            parse_status("..\nstatus: error\nboot_status_code: enabled\ndetail:\n('scripts_user', RuntimeError('boom'))\n").unwrap(),
            CloudInitState::Error(vec!["('scripts_user', RuntimeError('boom'))".into()])
        );
        assert_eq!(
            parse_status("status: running\n").unwrap(),
            CloudInitState::Running(String::new())
        );
        assert!(parse_status("garbage").is_err());
    }
}
