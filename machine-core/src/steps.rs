//! A built-in software layer of ordered steps (write a file, run a command) that works in
//! both modes: rendered as a shell script in user data when coupled, run over a
//! [`Transport`] when decoupled.
//!
//! Each step has a content hash. Every step done is recorded on the machine in a state
//! file (one hash a line), in both modes, so a rerun after a crash or a dropped connection
//! skips what is done and resumes at the first undone step.

use std::collections::HashSet;

use async_trait::async_trait;
use base64::Engine;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::machine::Machine;
use crate::name::check_dns_label;
use crate::software::{CoupledSoftware, DecoupledSoftware, Software};
use crate::spec::MachineSpec;
use crate::transport::{ExecRequest, FileUpload, Transport};
use crate::user_data::{UserDataFormat, UserDataPart, hex};

/// Where step state is kept on machines unless [`StepLayer::with_state_dir`] says otherwise.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/machine-core/layers";

/// One step of a [`StepLayer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Write a file (parent directories are created), replacing what is there; decoupled,
    /// a file that already holds this content with this mode is left as it is.
    WriteFile {
        /// Absolute path.
        path: String,
        /// The content.
        content: Vec<u8>,
        /// Unix permission bits.
        mode: u32,
    },
    /// Run a shell command; a non-zero exit fails the layer.
    Run {
        /// The command line, run by `sh -c`. Must not hold secrets.
        command: String,
    },
}

impl Step {
    /// A file with mode 0644.
    pub fn write_file(path: impl Into<String>, content: impl Into<Vec<u8>>) -> Self {
        Step::WriteFile {
            path: path.into(),
            content: content.into(),
            mode: 0o644,
        }
    }

    /// A file with `mode`.
    pub fn write_file_mode(
        path: impl Into<String>,
        content: impl Into<Vec<u8>>,
        mode: u32,
    ) -> Self {
        Step::WriteFile {
            path: path.into(),
            content: content.into(),
            mode,
        }
    }

    /// A command.
    pub fn run(command: impl Into<String>) -> Self {
        Step::Run {
            command: command.into(),
        }
    }

    fn describe(&self) -> String {
        match self {
            Step::WriteFile { path, .. } => format!("write {path}"),
            Step::Run { command } => format!("run {command}"),
        }
    }
}

/// An ordered list of steps, applicable coupled or decoupled.
#[derive(Debug, Clone)]
pub struct StepLayer {
    name: String,
    steps: Vec<Step>,
    hashes: Vec<String>,
    state_dir: String,
}

impl StepLayer {
    /// A layer named `name` (a DNS label: it names the state file) with `steps`.
    /// Refuses relative or empty paths, modes above 0o7777 and empty commands, naming
    /// the step.
    pub fn new(name: impl Into<String>, steps: Vec<Step>) -> Result<Self> {
        let name = name.into();
        check_dns_label("layer.name", &name)?;
        for (i, step) in steps.iter().enumerate() {
            // The field is named only on error: a layer of many steps is checked for
            // every machine, and formatting each name up front was a cost of its own.
            let within = |e: Error| e.within(&format!("layer.steps[{i}]"));
            match step {
                Step::WriteFile { path, mode, .. } => {
                    check_path("path", path).map_err(within)?;
                    if *mode > 0o7777 {
                        return Err(within(Error::invalid_spec(
                            "mode",
                            format!("{mode:#o} is not a permission mode (at most 0o7777)"),
                        )));
                    }
                }
                Step::Run { command } => {
                    if command.trim().is_empty() || command.contains('\0') {
                        return Err(within(Error::invalid_spec(
                            "command",
                            "is empty or holds a NUL byte",
                        )));
                    }
                }
            }
        }
        let hashes = steps
            .iter()
            .enumerate()
            .map(|(i, s)| step_hash(i, s))
            .collect();
        Ok(StepLayer {
            name,
            steps,
            hashes,
            state_dir: DEFAULT_STATE_DIR.to_owned(),
        })
    }

    /// Keeps the state file under `dir` (absolute) instead of [`DEFAULT_STATE_DIR`].
    pub fn with_state_dir(mut self, dir: impl Into<String>) -> Result<Self> {
        let dir = dir.into();
        check_path("layer.stateDir", &dir)?;
        self.state_dir = dir;
        Ok(self)
    }

    /// The steps.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The path of the state file on the machine.
    pub fn state_path(&self) -> String {
        format!(
            "{}/{}.done",
            self.state_dir.trim_end_matches('/'),
            self.name
        )
    }

    /// The shell script that applies the layer, as used in coupled mode.
    pub fn render_script(&self) -> String {
        let state = quote(&self.state_path());
        let mut s = format!(
            "#!/bin/sh\n# machine-core step layer {:?}: {} steps\nset -eu\nstate={state}\nmkdir -p \"$(dirname \"$state\")\"\ntouch \"$state\"\n",
            self.name,
            self.steps.len()
        );
        for (i, (step, hash)) in self.steps.iter().zip(&self.hashes).enumerate() {
            s.push_str(&format!(
                "# step {}: {}\nif ! grep -qx {hash} \"$state\"; then\n",
                i + 1,
                step.describe().lines().next().unwrap_or_default()
            ));
            match step {
                Step::WriteFile {
                    path,
                    content,
                    mode,
                } => {
                    let p = quote(path);
                    let tmp = quote(&format!("{path}.machine-core-tmp"));
                    let b64 = base64::engine::general_purpose::STANDARD.encode(content);
                    s.push_str(&format!(
                        "  mkdir -p \"$(dirname {p})\"\n  printf '%s' '{b64}' | base64 -d > {tmp}\n  chmod {mode:o} {tmp}\n  mv -f {tmp} {p}\n"
                    ));
                }
                Step::Run { command } => {
                    s.push_str(&format!("  sh -c {}\n", quote(command)));
                }
            }
            s.push_str(&format!("  echo {hash} >> \"$state\"\nfi\n"));
        }
        s
    }

    async fn done_hashes(&self, transport: &dyn Transport) -> Result<HashSet<String>> {
        let state = transport.read_file(&self.state_path(), 1 << 20).await?;
        Ok(state
            .map(|bytes| {
                String::from_utf8_lossy(&bytes)
                    .lines()
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default())
    }
}

impl Software for StepLayer {
    fn name(&self) -> &str {
        &self.name
    }
}

/// Coupled, the steps run as one shell script at first boot.
impl CoupledSoftware for StepLayer {
    fn user_data_parts(&self, _spec: &MachineSpec) -> Result<Vec<UserDataPart>> {
        Ok(vec![UserDataPart::new(
            UserDataFormat::ShellScript,
            format!("{}.sh", self.name),
            self.render_script(),
        )])
    }
}

/// Decoupled, each step runs over the transport and is recorded on the machine, so a
/// rerun skips the steps already done.
#[async_trait]
impl DecoupledSoftware for StepLayer {
    async fn is_applied(&self, _machine: &Machine, transport: &dyn Transport) -> Result<bool> {
        let done = self.done_hashes(transport).await?;
        Ok(self.hashes.iter().all(|h| done.contains(h)))
    }

    /// The digest of its steps, in order.
    fn digest(&self, _machine: &Machine) -> Option<String> {
        Some(crate::revision::digest(self.hashes.join("\n").as_bytes()))
    }

    async fn apply(&self, machine: &Machine, transport: &dyn Transport) -> Result<()> {
        let done = self.done_hashes(transport).await?;
        let mut record: Vec<String> = self
            .hashes
            .iter()
            .filter(|h| done.contains(*h))
            .cloned()
            .collect();
        for (i, (step, hash)) in self.steps.iter().zip(&self.hashes).enumerate() {
            if done.contains(hash) {
                tracing::debug!(machine = %machine.name, layer = %self.name, step = i + 1, "step already done");
                continue;
            }
            tracing::debug!(machine = %machine.name, layer = %self.name, step = i + 1, what = %step.describe(), "step");
            match step {
                Step::WriteFile {
                    path,
                    content,
                    mode,
                } => {
                    if holds(transport, path, content, *mode).await? {
                        tracing::debug!(machine = %machine.name, layer = %self.name, step = i + 1, "file already as asked");
                    } else {
                        transport
                            .upload(&FileUpload::new(path.clone(), content.clone()).mode(*mode))
                            .await?;
                    }
                }
                Step::Run { command } => {
                    // A step not yet recorded done is run again by a controller that
                    // crashed: the key lets it adopt the run still going instead.
                    let request =
                        ExecRequest::new(command.clone()).step(format!("{}/{}", self.name, hash));
                    transport
                        .exec(&request)
                        .await?
                        .check(command)
                        .map_err(|e| {
                            e.context(format_args!("layer {} step {}", self.name, i + 1))
                        })?;
                }
            }
            record.push(hash.clone());
            let mut state = record.join("\n");
            state.push('\n');
            transport
                .upload(&FileUpload::new(self.state_path(), state).mode(0o644))
                .await?;
        }
        Ok(())
    }
}

/// Whether the file at `path` already holds `content` with `mode`: a rerun (after its
/// state file was lost) then leaves it alone instead of rewriting it, so its time stamps
/// and inode stay. The content is read first (nothing more for a file that is missing or
/// differs, as on a first run); only a file holding it is asked its mode, with `stat`.
/// Anything the probe cannot tell (a larger file, no `stat`) means no.
async fn holds(transport: &dyn Transport, path: &str, content: &[u8], mode: u32) -> Result<bool> {
    match transport.read_file(path, content.len()).await {
        Ok(Some(present)) if present == content => {}
        Ok(_) => return Ok(false),
        // Larger than the content (or unreadable): not as asked; the upload says more.
        Err(e) if e.kind() == crate::ErrorKind::Permanent => return Ok(false),
        Err(e) => return Err(e),
    }
    let probe = transport
        .exec(&ExecRequest::new(format!(
            "stat -c %a -- {} 2>/dev/null",
            quote(path)
        )))
        .await?;
    Ok(probe.status == Some(0)
        && String::from_utf8_lossy(&probe.stdout).trim() == format!("{mode:o}"))
}

fn check_path(field: &str, path: &str) -> Result<()> {
    if !path.starts_with('/') || path.contains('\0') || path.ends_with('/') {
        return Err(Error::invalid_spec(
            field,
            format!("{path:?} is not an absolute file path"),
        ));
    }
    Ok(())
}

fn quote(s: &str) -> String {
    // Paths and commands were checked for NUL, the only thing try_quote refuses.
    shlex::try_quote(s).map_or_else(|_| "''".into(), |q| q.into_owned())
}

fn step_hash(index: usize, step: &Step) -> String {
    let mut h = Sha256::new();
    h.update(index.to_le_bytes());
    match step {
        Step::WriteFile {
            path,
            content,
            mode,
        } => {
            h.update(b"write\0");
            h.update(path.as_bytes());
            h.update(b"\0");
            h.update(mode.to_le_bytes());
            h.update(content);
        }
        Step::Run { command } => {
            h.update(b"run\0");
            h.update(command.as_bytes());
        }
    }
    hex(&h.finalize()[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_steps_name_the_field() {
        let e = StepLayer::new("base", vec![Step::write_file("etc/motd", "x")]).unwrap_err();
        assert_eq!(e.field(), Some("layer.steps[0].path"));
        let e = StepLayer::new(
            "base",
            vec![Step::run("true"), Step::write_file_mode("/a", "x", 0o17777)],
        )
        .unwrap_err();
        assert_eq!(e.field(), Some("layer.steps[1].mode"));
        let e = StepLayer::new("base", vec![Step::run("  ")]).unwrap_err();
        assert_eq!(e.field(), Some("layer.steps[0].command"));
        let e = StepLayer::new("Base Layer", vec![]).unwrap_err();
        assert_eq!(e.field(), Some("layer.name"));
    }

    #[test]
    fn script_quotes_everything_and_records_each_step() {
        let layer = StepLayer::new(
            "base",
            vec![
                Step::write_file("/etc/it's here", "a'b\n$(rm -rf /)\n"),
                Step::run("echo 'hi' > /tmp/x"),
            ],
        )
        .unwrap();
        let script = layer.render_script();
        assert!(script.starts_with("#!/bin/sh\n"));
        assert!(
            !script.contains("$(rm -rf /)"),
            "content must be encoded: {script}"
        );
        assert_eq!(script.matches(">> \"$state\"").count(), 2);
        assert!(
            script.contains("state=/var/lib/machine-core/layers/base.done"),
            "{script}"
        );
    }

    /// Files by path with their mode; `stat -c %a` answered from them.
    #[derive(Default)]
    struct Files(
        std::sync::Mutex<std::collections::HashMap<String, (Vec<u8>, u32)>>,
        std::sync::atomic::AtomicUsize,
    );

    #[async_trait]
    impl Transport for Files {
        async fn exec(&self, request: &ExecRequest) -> Result<crate::ExecOutput> {
            let path = request
                .command
                .split("-- ")
                .nth(1)
                .unwrap_or("")
                .split(' ')
                .next()
                .unwrap_or("");
            let path = path.trim_matches('\'');
            match self.0.lock().unwrap().get(path) {
                Some((_, m)) if request.command.starts_with("stat ") => Ok(crate::ExecOutput::new(
                    Some(0),
                    format!("{m:o}\n").into_bytes(),
                    Vec::new(),
                )),
                _ => Ok(crate::ExecOutput::new(Some(1), Vec::new(), Vec::new())),
            }
        }
        async fn upload(&self, f: &FileUpload) -> Result<()> {
            if !f.path.ends_with(".done") {
                self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            self.0
                .lock()
                .unwrap()
                .insert(f.path.clone(), (f.content.clone(), f.mode));
            Ok(())
        }
        async fn read_file(&self, path: &str, max: usize) -> Result<Option<Vec<u8>>> {
            match self.0.lock().unwrap().get(path) {
                Some((c, _)) if c.len() > max => Err(Error::permanent("too large")),
                other => Ok(other.map(|(c, _)| c.clone())),
            }
        }
    }

    #[tokio::test]
    async fn a_rerun_without_the_state_file_leaves_a_file_already_as_asked() {
        let layer = StepLayer::new(
            "l",
            vec![
                Step::write_file_mode("/etc/a", "a\n", 0o640),
                Step::write_file("/etc/b", "b\n"),
            ],
        )
        .unwrap();
        let machine = Machine::new(
            crate::MachineName::new("m").unwrap(),
            crate::ProviderId::new("sim:///m").unwrap(),
            crate::Phase::Provisioned,
        );
        let files = Files::default();
        layer.apply(&machine, &files).await.unwrap();
        assert_eq!(files.1.load(std::sync::atomic::Ordering::SeqCst), 2);
        // The state file lost; /etc/b changed by hand, /etc/a's mode too.
        files.0.lock().unwrap().remove(&layer.state_path());
        files
            .0
            .lock()
            .unwrap()
            .insert("/etc/b".into(), (b"changed\n".to_vec(), 0o644));
        layer.apply(&machine, &files).await.unwrap();
        assert_eq!(
            files.1.load(std::sync::atomic::Ordering::SeqCst),
            3,
            "only the file not as asked is written again"
        );
        files.0.lock().unwrap().remove(&layer.state_path());
        files.0.lock().unwrap().get_mut("/etc/a").unwrap().1 = 0o600;
        layer.apply(&machine, &files).await.unwrap();
        assert_eq!(files.1.load(std::sync::atomic::Ordering::SeqCst), 4);
        assert_eq!(files.0.lock().unwrap()["/etc/a"], (b"a\n".to_vec(), 0o640));
    }

    #[test]
    fn hashes_change_with_content() {
        let a = StepLayer::new("l", vec![Step::run("a")]).unwrap();
        let b = StepLayer::new("l", vec![Step::run("b")]).unwrap();
        assert_ne!(a.hashes, b.hashes);
    }
}
