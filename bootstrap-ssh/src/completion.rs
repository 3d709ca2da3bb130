//! Whether cloud-init has finished on a machine, asked over the transport with
//! `cloud-init status`, for machines whose base layer came in user data.

use async_trait::async_trait;
use machine_core::{
    Completion, CompletionCheck, ExecRequest, Machine, Result, Transport, UserDataPart,
};

/// A [`CompletionCheck`] that runs `cloud-init status` on the machine. It adds nothing to
/// the user data: cloud-init reports its own state.
#[derive(Debug, Clone, Copy, Default)]
pub struct CloudInitStatus;

impl CloudInitStatus {
    /// Reads the output of `cloud-init status` (`status: done`, `running`, `error`, ...).
    /// `not run` and `running` are pending; `done` and `disabled` are done; `error` and
    /// `degraded` are failures carrying the output.
    pub fn parse(status: Option<i32>, stdout: &str, stderr: &str) -> Completion {
        let state = stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix("status:"))
            .map(str::trim)
            .unwrap_or("");
        match state {
            "done" | "disabled" => Completion::Done,
            "running" | "not run" | "not started" => Completion::Pending,
            "error" | "degraded done" | "degraded" => {
                Completion::Failed(format!("cloud-init: {}", stdout.trim()))
            }
            _ if status == Some(127) => {
                Completion::Failed("cloud-init is not installed on the machine".to_owned())
            }
            _ => Completion::Failed(format!(
                "cloud-init status said {:?} (exit {status:?}): {}",
                stdout.trim(),
                stderr.trim()
            )),
        }
    }
}

#[async_trait]
impl CompletionCheck for CloudInitStatus {
    fn user_data_parts(&self) -> Vec<UserDataPart> {
        Vec::new()
    }

    async fn check(&self, _machine: &Machine, transport: &dyn Transport) -> Result<Completion> {
        let out = transport
            .exec(&ExecRequest::new("cloud-init status"))
            .await?;
        Ok(Self::parse(
            out.status,
            &String::from_utf8_lossy(&out.stdout),
            &String::from_utf8_lossy(&out.stderr),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_completion() {
        assert_eq!(
            CloudInitStatus::parse(Some(0), "status: done\n", ""),
            Completion::Done
        );
        assert_eq!(
            CloudInitStatus::parse(Some(0), "\nstatus: running\n", ""),
            Completion::Pending
        );
        assert_eq!(
            CloudInitStatus::parse(Some(0), "status: not run\n", ""),
            Completion::Pending
        );
        assert!(
            matches!(CloudInitStatus::parse(Some(1), "status: error\n", ""), Completion::Failed(m) if m.contains("error"))
        );
        assert!(
            matches!(CloudInitStatus::parse(Some(127), "", "sh: cloud-init: not found"), Completion::Failed(m) if m.contains("not installed"))
        );
    }
}
