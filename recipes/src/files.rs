//! Files, directories and lines in files.

use std::fmt;

use machine_core::{Error, Result};

use crate::check;
use crate::plan::LineEdit;
use crate::plan::{Plan, PlannedFile};
use crate::shell::{chmod_unless_set, chown_unless_owned, digest, q};

/// A file with its content, mode and owner.
///
/// - Coupled: a `write_files` entry with `defer: true` (written in cloud-init's final
///   stage, after accounts and packages, so the owner exists and a package's default
///   file does not overwrite it); decoupled: an upload, then a `chown` when an owner is
///   given.
/// - Rerun: the file is written again only when its content, mode or owner changed
///   (the step layer's state file tracks each by hash); an edit on the machine is not
///   noticed until then.
/// - Refuses: a relative path or one with `..`; mode 0000 and set-id bits (cloud-init
///   22.x cannot apply them); an owner name `useradd` would refuse.
///
/// Debug shows the content's size and digest, never the content: a file may hold a token.
#[derive(Clone, PartialEq, Eq)]
pub struct File {
    /// Absolute path.
    pub path: String,
    /// The content.
    pub content: Vec<u8>,
    /// Permission bits; 0644 by default.
    pub mode: u32,
    /// `user` or `user:group`; root when `None`.
    pub owner: Option<String>,
}

impl fmt::Debug for File {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("File")
            .field("path", &self.path)
            .field(
                "content",
                &format_args!(
                    "{} bytes, sha256 {}",
                    self.content.len(),
                    digest(&[&self.content])
                ),
            )
            .field("mode", &format_args!("{:04o}", self.mode))
            .field("owner", &self.owner)
            .finish()
    }
}

impl File {
    /// A root-owned file with mode 0644.
    pub fn new(path: impl Into<String>, content: impl Into<Vec<u8>>) -> Self {
        File {
            path: path.into(),
            content: content.into(),
            mode: 0o644,
            owner: None,
        }
    }

    /// A root-owned file with mode 0644 whose content is template `name` of
    /// `templates` rendered with `context` (Jinja, strict: an undefined variable is an
    /// error naming it, the template and the line). Rendered once, here, so every machine
    /// given this recipe gets the same bytes on both paths.
    pub fn from_template(
        path: impl Into<String>,
        templates: &bootstrap_cloudinit::Templates,
        name: &str,
        context: &impl serde::Serialize,
    ) -> Result<Self> {
        let content = templates.render(name, context)?;
        Ok(File::new(path, content))
    }

    /// Sets the mode.
    pub fn with_mode(mut self, mode: u32) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the owner (`user` or `user:group`).
    pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    pub(crate) fn check(&self) -> Result<()> {
        check::path("path", &self.path)?;
        check::file_mode("mode", self.mode)?;
        if let Some(o) = &self.owner {
            check::owner("owner", o)?;
        }
        Ok(())
    }

    pub(crate) fn plan(&self, plan: &mut Plan, field: &str) -> Result<()> {
        plan.add_file(
            PlannedFile {
                path: self.path.clone(),
                content: self.content.clone(),
                mode: self.mode,
                owner: self.owner.clone(),
            },
            &format!("{field}.path"),
        )
    }
}

/// A directory with its mode and owner; parents are created as `mkdir -p` does (0755, root).
///
/// - Both paths run the same commands: `mkdir -p`, `chmod`, `chown` (cloud-init has no
///   module for directories; coupled, the commands are a `runcmd` entry).
/// - Rerun: mode and owner are set only where they differ (chown and chmod change the
///   change time even when they change nothing); content is never touched.
/// - Refuses: a relative path or one with `..`, set-id bits, an owner name `useradd`
///   would refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directory {
    /// Absolute path.
    pub path: String,
    /// Permission bits; 0755 by default.
    pub mode: u32,
    /// `user` or `user:group`; root when `None`.
    pub owner: Option<String>,
}

impl Directory {
    /// A root-owned directory with mode 0755.
    pub fn new(path: impl Into<String>) -> Self {
        Directory {
            path: path.into(),
            mode: 0o755,
            owner: None,
        }
    }

    /// Sets the mode.
    pub fn with_mode(mut self, mode: u32) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the owner.
    pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    pub(crate) fn check(&self) -> Result<()> {
        check::path("path", &self.path)?;
        check::dir_mode("mode", self.mode)?;
        if let Some(o) = &self.owner {
            check::owner("owner", o)?;
        }
        Ok(())
    }

    pub(crate) fn plan(&self, plan: &mut Plan) {
        let p = q(&self.path);
        let mut s = format!("mkdir -p {p}\n");
        if let Some(o) = &self.owner {
            s.push_str(&chown_unless_owned(o, &self.path));
            s.push('\n');
        }
        // chmod after chown: chown may clear bits.
        s.push_str(&chmod_unless_set(self.mode, &self.path));
        s.push('\n');
        plan.commands.push(s);
    }
}

/// One line that must be in a file: appended when missing, or replacing the first line
/// that starts with a prefix (further such lines are removed).
///
/// - Both paths run the same commands (cloud-init has no module for it; coupled, they
///   are a `runcmd` entry, which runs after every `write_files` entry). A missing file is
///   created (mode 0644, root); an existing file keeps its mode and owner.
/// - Rerun: nothing changes when the exact line is there. On a file a [`File`] recipe of
///   the same layer writes, the line is in the content written already (so a rerun
///   rewrites neither).
/// - Refuses: a relative path, a line or prefix with a line break, an empty prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineInFile {
    /// Absolute path.
    pub path: String,
    /// The line, without its newline.
    pub line: String,
    /// Lines starting with this are replaced by [`LineInFile::line`].
    pub replace_prefix: Option<String>,
}

impl LineInFile {
    /// `line` in the file at `path`, appended when missing.
    pub fn new(path: impl Into<String>, line: impl Into<String>) -> Self {
        LineInFile {
            path: path.into(),
            line: line.into(),
            replace_prefix: None,
        }
    }

    /// Replaces the first line starting with `prefix` (such as `PermitRootLogin `).
    pub fn replacing(mut self, prefix: impl Into<String>) -> Self {
        self.replace_prefix = Some(prefix.into());
        self
    }

    pub(crate) fn check(&self) -> Result<()> {
        check::path("path", &self.path)?;
        if self.line.contains(['\n', '\r', '\0']) {
            return Err(Error::invalid_spec("line", "must be one line"));
        }
        if let Some(p) = &self.replace_prefix {
            check::one_line("replace_prefix", p, "a line prefix")?;
        }
        Ok(())
    }

    pub(crate) fn plan(&self, plan: &mut Plan) {
        plan.line_edits.push(LineEdit {
            path: self.path.clone(),
            line: self.line.clone(),
            replace_prefix: self.replace_prefix.clone(),
        });
        let (f, l) = (q(&self.path), q(&self.line));
        let mut s = format!(
            "f={f}\nl={l}\n[ -e \"$f\" ] || : > \"$f\"\nif ! grep -qxF -- \"$l\" \"$f\"; then\n"
        );
        match &self.replace_prefix {
            Some(prefix) => {
                // awk -v would interpret backslashes: values go through the environment.
                // cat > keeps the file's inode, mode and owner.
                s.push_str(&format!(
                    "  P={} L=\"$l\" awk 'index($0, ENVIRON[\"P\"]) == 1 {{ if (!d) {{ print ENVIRON[\"L\"]; d = 1 }} next }} {{ print }} END {{ if (!d) print ENVIRON[\"L\"] }}' \"$f\" > \"$f.recipes-tmp\"\n  cat \"$f.recipes-tmp\" > \"$f\"\n  rm -f \"$f.recipes-tmp\"\n",
                    q(prefix)
                ));
            }
            None => {
                s.push_str(
                    "  if [ -s \"$f\" ] && [ -n \"$(tail -c 1 \"$f\")\" ]; then echo >> \"$f\"; fi\n  printf '%s\\n' \"$l\" >> \"$f\"\n",
                );
            }
        }
        s.push_str("fi\n");
        plan.commands.push(s);
    }
}
