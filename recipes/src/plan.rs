//! The plan of a layer: what its recipes ask for, gathered by kind in the order
//! cloud-init applies the kinds, and rendered from there to either path.
//!
//! Order on both paths (cloud-init's stages): early commands (init-stage `bootcmd`,
//! once per instance: repository lines and key imports); repository files (init-stage
//! `write_files`); host name and time zone; groups, then
//! accounts; packages (one `apt-get update` and one `install`); files (cloud-init's
//! deferred `write_files`, in the final stage after packages); then every command
//! (`runcmd`, the last thing cloud-init runs), in recipe order.

use bootstrap_cloudinit::{CloudConfig, Command, Content, UserEntry, WriteFile};
use machine_core::steps::Step;
use machine_core::{Error, Result};

use crate::account::Account;
use crate::packages::{Package, PackageFamily, install_script};
use crate::shell::{chown_unless_owned, digest, push_quoted, q};
use crate::system::{Hostname, Timezone};

/// A file some recipe writes.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct PlannedFile {
    pub path: String,
    pub content: Vec<u8>,
    pub mode: u32,
    pub owner: Option<String>,
}

/// A line a `LineInFile` recipe puts in a file.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct LineEdit {
    pub path: String,
    pub line: String,
    pub replace_prefix: Option<String>,
}

impl LineEdit {
    /// `content` with the line in it, as the recipe's command leaves it: unchanged when
    /// the exact line is there; with a prefix, the first line starting with it replaced
    /// and later ones dropped (or the line appended), every line then ending in a
    /// newline (awk's output); without, the line appended after a newline if the last
    /// line has none.
    pub fn apply(&self, content: &[u8]) -> Vec<u8> {
        let line = self.line.as_bytes();
        let body = content.strip_suffix(b"\n").unwrap_or(content);
        let lines: Vec<&[u8]> = if content.is_empty() {
            Vec::new()
        } else {
            body.split(|b| *b == b'\n').collect()
        };
        if lines.contains(&line) {
            return content.to_vec();
        }
        let mut out = Vec::with_capacity(content.len() + line.len() + 1);
        match &self.replace_prefix {
            Some(prefix) => {
                let mut done = false;
                for l in lines {
                    if l.starts_with(prefix.as_bytes()) {
                        if !done {
                            out.extend_from_slice(line);
                            out.push(b'\n');
                            done = true;
                        }
                        continue;
                    }
                    out.extend_from_slice(l);
                    out.push(b'\n');
                }
                if !done {
                    out.extend_from_slice(line);
                    out.push(b'\n');
                }
            }
            None => {
                out.extend_from_slice(content);
                if !content.is_empty() && !content.ends_with(b"\n") {
                    out.push(b'\n');
                }
                out.extend_from_slice(line);
                out.push(b'\n');
            }
        }
        out
    }
}

/// Everything a layer's recipes ask for, by kind.
#[derive(Clone, Default)]
pub(crate) struct Plan {
    /// The layer's name: messages printed on the machine name fields with it.
    pub layer: String,
    pub hostname: Option<String>,
    pub timezone: Option<String>,
    pub groups: Vec<String>,
    pub accounts: Vec<Account>,
    pub packages: Vec<Package>,
    /// The family of every package of the layer.
    pub package_family: Option<PackageFamily>,
    pub files: Vec<PlannedFile>,
    /// Root-owned files needed before packages are installed (repositories and their
    /// keys): cloud-init's init-stage `write_files` coupled, the first steps decoupled.
    pub early_files: Vec<PlannedFile>,
    /// Snippets run before packages are installed and before the early files are
    /// written (so they must not read those): coupled, `bootcmd` entries run once per
    /// instance through `cloud-init-per`; decoupled, the first steps. Each is `sh -ec`
    /// wrapped already.
    pub early_commands: Vec<String>,
    /// Paths a command of the layer writes (a zypper key): no file may claim them too.
    pub claimed_paths: Vec<String>,
    /// The apk repository URLs of the layer, each added once.
    pub apk_urls: Vec<String>,
    /// Shell snippets, run with `sh -e` on both paths; [`Plan::seal`] wraps them.
    pub commands: Vec<String>,
    /// The lines `LineInFile` recipes put in files, in recipe order.
    pub line_edits: Vec<LineEdit>,
    /// Groups with a fixed GID, made (or checked) before anything else.
    pub fixed_groups: Vec<String>,
    /// Accounts with a fixed UID, made (or checked) right after those groups.
    pub fixed_accounts: Vec<String>,
}

impl Plan {
    /// Adds a file; a second file at the same path is refused, naming `field`.
    pub fn add_file(&mut self, file: PlannedFile, field: &str) -> Result<()> {
        self.check_new_path(&file.path, field)?;
        self.files.push(file);
        Ok(())
    }

    /// Adds a file written before packages are installed.
    pub fn add_early_file(&mut self, file: PlannedFile, field: &str) -> Result<()> {
        self.check_new_path(&file.path, field)?;
        self.early_files.push(file);
        Ok(())
    }

    /// Claims `path` for a command that writes it.
    pub fn claim_path(&mut self, path: &str, field: &str) -> Result<()> {
        self.check_new_path(path, field)?;
        self.claimed_paths.push(path.to_owned());
        Ok(())
    }

    fn check_new_path(&self, path: &str, field: &str) -> Result<()> {
        if self
            .files
            .iter()
            .chain(&self.early_files)
            .any(|f| f.path == path)
            || self.claimed_paths.iter().any(|p| p == path)
        {
            return Err(Error::invalid_spec(
                field,
                format!("{path} is written by two recipes of the layer"),
            ));
        }
        Ok(())
    }

    /// Adds a snippet run before packages (see [`Plan::early_commands`]).
    pub fn add_early_command(&mut self, snippet: &str) {
        self.early_commands.push(run(snippet));
    }

    /// Sets a single-valued setting once per layer.
    pub fn set_once(slot: &mut Option<String>, value: &str, field: &str, what: &str) -> Result<()> {
        if slot.is_some() {
            return Err(Error::invalid_spec(
                field,
                format!("a layer has one {what}; another recipe already sets it"),
            ));
        }
        *slot = Some(value.to_owned());
        Ok(())
    }

    /// Wraps every command as its `sh -ec` line once, when the recipes are all planned:
    /// both paths use the same lines.
    ///
    /// A file of the layer that `LineInFile` recipes edit is written with their lines in
    /// it already, as their commands (which run after every file) would leave it: the
    /// machine ends the same, and a rerun finds the file as asked instead of writing the
    /// first content and editing it again.
    pub fn seal(&mut self) {
        for c in &mut self.commands {
            *c = run(c);
        }
        // Fixed numbers first: nothing of the layer may take them before, and accounts
        // after the groups they name.
        let fixed: Vec<String> = self
            .fixed_groups
            .iter()
            .chain(&self.fixed_accounts)
            .map(|s| run(s))
            .collect();
        if !fixed.is_empty() {
            self.early_commands.splice(0..0, fixed);
        }
        for f in &mut self.files {
            for edit in self.line_edits.iter().filter(|e| e.path == f.path) {
                f.content = edit.apply(&f.content);
            }
        }
    }

    /// The cloud-config of the coupled path.
    pub fn cloud_config(&self) -> CloudConfig {
        let mut c = CloudConfig::new();
        c.hostname = self.hostname.clone();
        c.timezone = self.timezone.clone();
        if !self.groups.is_empty() {
            c.extra.insert(
                "groups".into(),
                serde_json::Value::Array(
                    self.groups
                        .iter()
                        .map(|g| serde_json::Value::String(g.clone()))
                        .collect(),
                ),
            );
        }
        if !self.accounts.is_empty() {
            // A `users` list without `default` stops cloud-init from creating the image's
            // default user, which a decoupled machine has: keep it on both paths.
            c.users = std::iter::once(UserEntry::Default)
                .chain(
                    self.accounts
                        .iter()
                        .map(|a| UserEntry::User(a.cloud_user())),
                )
                .collect();
        }
        // bootcmd runs on every boot: cloud-init-per makes each entry run once per
        // instance, as the decoupled step runs once; its marker is named after the
        // command, so a changed command is a new entry.
        c.bootcmd = self
            .early_commands
            .iter()
            .map(|s| {
                Command::Shell(format!(
                    "cloud-init-per instance recipes-{} {s} || exit 1",
                    digest(&[s.as_bytes()])
                ))
            })
            .collect();
        let family = self.package_family.unwrap_or(PackageFamily::Apt);
        c.packages = self.packages.iter().map(|p| family.spec(p)).collect();
        c.write_files = self
            .early_files
            .iter()
            .map(|f| {
                WriteFile::new(f.path.clone(), Content::Bytes(f.content.clone()))
                    .permissions(format!("{:04o}", f.mode))
            })
            .collect();
        c.write_files.extend(self.files.iter().map(|f| {
            let w = WriteFile::new(f.path.clone(), Content::Bytes(f.content.clone()))
                .permissions(format!("{:04o}", f.mode))
                .deferred();
            match &f.owner {
                Some(o) => w.owner(o.clone()),
                None => w,
            }
        }));
        // runcmd lines share one script without `set -e`: each snippet runs in its own
        // `sh -e` and a failure stops the script, as a failed step stops the layer.
        c.runcmd = self
            .commands
            .iter()
            .map(|s| {
                let mut line = String::with_capacity(s.len() + 10);
                line.push_str(s);
                line.push_str(" || exit 1");
                Command::Shell(line)
            })
            .collect();
        c
    }

    /// The steps of the decoupled path.
    pub fn steps(&self) -> Vec<Step> {
        let mut steps = Vec::with_capacity(
            4 + self.groups.len()
                + self.accounts.len()
                + 2 * self.files.len()
                + self.commands.len(),
        );
        for c in &self.early_commands {
            steps.push(Step::run(c.clone()));
        }
        for f in &self.early_files {
            steps.push(Step::write_file_mode(
                f.path.clone(),
                f.content.clone(),
                f.mode,
            ));
        }
        if let Some(h) = &self.hostname {
            steps.push(Step::run(run(&Hostname::script(h))));
        }
        if let Some(z) = &self.timezone {
            steps.push(Step::run(run(&Timezone::script(z))));
        }
        for g in &self.groups {
            let g = q(g);
            steps.push(Step::run(format!(
                "getent group {g} >/dev/null || groupadd {g}"
            )));
        }
        for a in &self.accounts {
            steps.push(Step::run(run(&a.script())));
        }
        if let Some(family) = self.package_family {
            steps.push(Step::run(run(&install_script(family, &self.packages))));
        }
        for f in &self.files {
            steps.push(Step::write_file_mode(
                f.path.clone(),
                f.content.clone(),
                f.mode,
            ));
            if let Some(owner) = &f.owner {
                // An upload replaces the file (root-owned): the digest of everything
                // about the file makes this step rerun whenever the upload does; a
                // file already as asked is neither uploaded nor chowned again.
                let mode = f.mode.to_le_bytes();
                steps.push(Step::run(format!(
                    "{} # file {}",
                    chown_unless_owned(owner, &f.path),
                    digest(&[&f.content, &mode, owner.as_bytes()])
                )));
            }
        }
        for c in &self.commands {
            steps.push(Step::run(c.clone()));
        }
        steps
    }
}

/// `snippet` as one command line run by `sh -e`.
fn run(snippet: &str) -> String {
    let mut line = String::with_capacity(snippet.len() + 16);
    line.push_str("sh -ec ");
    push_quoted(&mut line, snippet);
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::LineInFile;

    /// The fold in Rust leaves what the recipe's own command leaves, run by `sh`.
    #[test]
    fn a_line_folded_into_a_file_is_what_the_command_leaves() {
        let dir = std::env::temp_dir().join(format!("recipes-fold-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f").to_str().unwrap().to_owned();
        let contents: [&[u8]; 6] = [
            b"",
            b"a\n",
            b"a",
            b"log = debug\nx\nlog = trace\n",
            b"x\nlog = info\n",
            b"\n\nlog =\n",
        ];
        for content in contents {
            for recipe in [
                LineInFile::new(&path, "log = info"),
                LineInFile::new(&path, "log = info").replacing("log ="),
            ] {
                let mut plan = Plan::default();
                recipe.plan(&mut plan);
                std::fs::write(&path, content).unwrap();
                let out = std::process::Command::new("/bin/sh")
                    .args(["-ec", &plan.commands[0]])
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{out:?}");
                let by_shell = std::fs::read(&path).unwrap();
                assert_eq!(
                    String::from_utf8_lossy(&plan.line_edits[0].apply(content)),
                    String::from_utf8_lossy(&by_shell),
                    "{content:?} {:?}",
                    recipe.replace_prefix
                );
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
