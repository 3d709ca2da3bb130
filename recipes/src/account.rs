//! Accounts and groups: cloud-init's `users` and `groups` modules coupled, the same
//! `groupadd`/`useradd`/`passwd -l` commands cloud-init runs decoupled.

use machine_core::{Error, Result};

use crate::check;
use crate::plan::Plan;
use crate::shell::q;

/// A group, created when missing.
///
/// Rerun: nothing happens when the group exists (its GID is never changed).
/// Refuses a name `groupadd` would refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The group name.
    pub name: String,
}

impl Group {
    /// A group named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Group { name: name.into() }
    }

    pub(crate) fn check(&self) -> Result<()> {
        check::account_name("name", &self.name)
    }

    pub(crate) fn plan(&self, plan: &mut Plan) {
        plan.groups.push(self.name.clone());
    }
}

/// The sudo rule of an administrator: every command as anyone, without a password.
pub const SUDO_ALL_NOPASSWD: &str = "ALL=(ALL) NOPASSWD:ALL";

/// A login account with its supplementary groups, SSH keys, sudo rule, shell and a
/// locked password.
///
/// - Coupled: an entry of cloud-init's `users` (which creates missing supplementary
///   groups, runs `useradd ... -m`, `passwd -l` and writes `~/.ssh/authorized_keys`);
///   decoupled: the same commands over the transport.
/// - The sudo rule goes to `/etc/sudoers.d/90-recipes-<name>` (mode 0440, root) on both
///   paths, not through cloud-init's `sudo` key: cloud-init stamps its version and the
///   date into its sudoers file, which would make two machines' files differ, and never
///   checks the rule. A rule sudo cannot parse would make sudo refuse to run for
///   everyone, so one command (a `runcmd` entry coupled, a step decoupled, after the
///   layer's packages, so a `sudo` package of the layer is there) writes the rule next to
///   its place under a name with a dot (which sudo's `@includedir` skips), has
///   `visudo -cf` check it there and only then moves it into place. A rule visudo
///   refuses fails that command with an error naming the field and visudo's message;
///   the rule in place before, if any, stays as it was. A machine without `visudo`
///   fails the same command saying so.
/// - Rerun: an existing account is left as it is (no `usermod`: shell, groups and GECOS
///   are set at creation only, as cloud-init does); the password is locked again (a
///   no-op); missing keys are appended, keys already there are kept, never removed.
/// - cloud-init writes several keys in an arbitrary order (it keeps them in a Python
///   set); the decoupled path writes them in the given order. The set of keys is the same.
/// - Refuses: a name or group `useradd` refuses, a relative or spaced shell, a GECOS
///   with `:` or a line break, a sudo rule on several lines, a key line with options;
///   on the machine, a sudo rule `visudo` refuses (see above).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// The login name.
    pub name: String,
    /// The full name (GECOS), if any.
    pub gecos: Option<String>,
    /// Supplementary groups, created when missing.
    pub groups: Vec<String>,
    /// The login shell; useradd's default when `None`.
    pub shell: Option<String>,
    /// A sudoers rule such as [`SUDO_ALL_NOPASSWD`].
    pub sudo: Option<String>,
    /// Lock the password (`passwd -l`); true unless turned off, as in cloud-init.
    pub lock_password: bool,
    /// A system account (`useradd --system -M`: no home directory).
    pub system: bool,
    /// OpenSSH public keys allowed to log in.
    pub ssh_authorized_keys: Vec<String>,
}

impl Account {
    /// An account named `name` with a locked password and nothing else.
    pub fn new(name: impl Into<String>) -> Self {
        Account {
            name: name.into(),
            gecos: None,
            groups: Vec::new(),
            shell: None,
            sudo: None,
            lock_password: true,
            system: false,
            ssh_authorized_keys: Vec::new(),
        }
    }

    /// An administrator: bash, passwordless sudo, password locked, these keys.
    pub fn admin(
        name: impl Into<String>,
        keys: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Account {
            shell: Some("/bin/bash".into()),
            sudo: Some(SUDO_ALL_NOPASSWD.into()),
            ssh_authorized_keys: keys.into_iter().map(Into::into).collect(),
            ..Account::new(name)
        }
    }

    /// Adds a supplementary group.
    pub fn with_group(mut self, group: impl Into<String>) -> Self {
        self.groups.push(group.into());
        self
    }

    /// Sets the login shell.
    pub fn with_shell(mut self, shell: impl Into<String>) -> Self {
        self.shell = Some(shell.into());
        self
    }

    /// Sets the GECOS field.
    pub fn with_gecos(mut self, gecos: impl Into<String>) -> Self {
        self.gecos = Some(gecos.into());
        self
    }

    /// Sets the sudo rule.
    pub fn with_sudo(mut self, rule: impl Into<String>) -> Self {
        self.sudo = Some(rule.into());
        self
    }

    /// Adds an SSH public key.
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.ssh_authorized_keys.push(key.into());
        self
    }

    /// Where the sudo rule is written.
    pub fn sudoers_path(&self) -> String {
        // sudo skips files in sudoers.d whose name holds a dot.
        format!("/etc/sudoers.d/90-recipes-{}", self.name.replace('.', "_"))
    }

    pub(crate) fn check(&self) -> Result<()> {
        check::account_name("name", &self.name)?;
        for (i, g) in self.groups.iter().enumerate() {
            check::account_name(&format!("groups[{i}]"), g)?;
        }
        if let Some(gecos) = &self.gecos
            && gecos.contains([':', '\n', '\r', '\0'])
        {
            return Err(Error::invalid_spec(
                "gecos",
                "must be one line without ':' (useradd refuses it)",
            ));
        }
        if let Some(shell) = &self.shell {
            check::path("shell", shell)?;
            if shell.chars().any(char::is_whitespace) {
                return Err(Error::invalid_spec(
                    "shell",
                    format!("{shell:?} holds a space"),
                ));
            }
        }
        if let Some(sudo) = &self.sudo {
            check::one_line(
                "sudo",
                sudo,
                "one sudoers rule such as \"ALL=(ALL) NOPASSWD:ALL\"",
            )?;
        }
        for (i, k) in self.ssh_authorized_keys.iter().enumerate() {
            check::public_key(&format!("ssh_authorized_keys[{i}]"), k)?;
        }
        Ok(())
    }

    pub(crate) fn plan(&self, plan: &mut Plan, field: &str) -> Result<()> {
        if plan.accounts.iter().any(|a| a.name == self.name) {
            return Err(Error::invalid_spec(
                format!("{field}.name"),
                format!("account {:?} is defined twice", self.name),
            ));
        }
        let mut account = self.clone();
        // cloud-init parses and rewrites each key line with single spaces.
        account.ssh_authorized_keys = self
            .ssh_authorized_keys
            .iter()
            .map(|k| k.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        plan.accounts.push(account);
        if let Some(rule) = &self.sudo {
            let field = format!("{field}.sudo");
            let path = self.sudoers_path();
            plan.claim_path(&path, &field)?;
            let shown = format!("layer {}.{field}", plan.layer);
            plan.commands.push(sudo_rule_script(
                &path,
                &format!("{} {rule}", self.name),
                &shown,
            ));
        }
        Ok(())
    }

    /// The entry of cloud-init's `users`.
    pub(crate) fn cloud_user(&self) -> bootstrap_cloudinit::User {
        let mut u = bootstrap_cloudinit::User::new(self.name.clone());
        u.gecos = self.gecos.clone();
        u.groups = self.groups.clone();
        u.shell = self.shell.clone();
        u.lock_passwd = Some(self.lock_password);
        u.system = self.system.then_some(true);
        u.ssh_authorized_keys = self.ssh_authorized_keys.clone();
        u
    }

    /// The decoupled commands: what cloud-init's `create_user` runs, guarded to be
    /// rerunnable.
    pub(crate) fn script(&self) -> String {
        let name = q(&self.name);
        let mut s = String::new();
        for g in &self.groups {
            let g = q(g);
            s.push_str(&format!("getent group {g} >/dev/null || groupadd {g}\n"));
        }
        let mut add = format!("useradd {name}");
        if let Some(gecos) = &self.gecos {
            add.push_str(&format!(" --comment {}", q(gecos)));
        }
        if !self.groups.is_empty() {
            add.push_str(&format!(" --groups {}", q(&self.groups.join(","))));
        }
        if let Some(shell) = &self.shell {
            add.push_str(&format!(" --shell {}", q(shell)));
        }
        add.push_str(if self.system { " --system -M" } else { " -m" });
        s.push_str(&format!("getent passwd {name} >/dev/null || {add}\n"));
        if self.lock_password {
            s.push_str(&format!("passwd -l {name} >/dev/null\n"));
        }
        if !self.ssh_authorized_keys.is_empty() {
            // As cloud-init's setup_user_keys: ~/.ssh 0700 and the file 0600, both the
            // user's, created when missing; keys appended when absent.
            s.push_str(&format!(
                "d=\"$(getent passwd {name} | cut -d: -f6)/.ssh\"\n\
                 if [ ! -d \"$d\" ]; then mkdir -p \"$d\"; chmod 700 \"$d\"; chown {name}: \"$d\"; fi\n\
                 f=\"$d/authorized_keys\"\n\
                 if [ ! -e \"$f\" ]; then : > \"$f\"; chmod 600 \"$f\"; chown {name}: \"$f\"; fi\n"
            ));
            for k in &self.ssh_authorized_keys {
                let k = q(k);
                s.push_str(&format!(
                    "grep -qxF -- {k} \"$f\" || printf '%s\\n' {k} >> \"$f\"\n"
                ));
            }
        }
        s
    }
}

/// The command installing the sudoers `line` at `path` once `visudo` accepts it; a
/// refusal fails naming `field`, leaving `path` as it was.
fn sudo_rule_script(path: &str, line: &str, field: &str) -> String {
    let (f, field) = (q(path), q(field));
    // sudo's @includedir skips file names holding a dot: the candidate is inert.
    let t = q(&format!("{path}.recipes-new"));
    format!(
        "command -v visudo >/dev/null || {{ printf '%s: visudo not found: the sudo rule cannot be checked (install sudo first)\\n' {field} >&2; exit 1; }}\n\
         mkdir -p /etc/sudoers.d\n\
         printf '%s\\n' {line} > {t}\n\
         chmod 0440 {t}\n\
         if ! out=$(visudo -cf {t} 2>&1); then\n\
         \x20 rm -f {t}\n\
         \x20 printf '%s: visudo refuses the sudo rule (%s left as it was): %s\\n' {field} {f} \"$out\" >&2\n\
         \x20 exit 1\n\
         fi\n\
         mv -f {t} {f}\n",
        line = q(line),
    )
}
