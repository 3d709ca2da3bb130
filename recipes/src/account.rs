//! Accounts and groups: cloud-init's `users` and `groups` modules coupled, the same
//! `groupadd`/`useradd`/`passwd -l` commands cloud-init runs decoupled.

use machine_core::{Error, Result};

use crate::check;
use crate::plan::Plan;
use crate::shell::q;

/// A group, created when missing.
///
/// - Numbers: without [`Group::gid`] the group takes the next free GID where it is
///   made, so its number depends on the order in which groups were made on each
///   machine (cloud-init makes the layer's groups at first boot, before its accounts; a
///   decoupled machine already has the image's default user and its group): the same
///   layer can give it another number coupled and decoupled. Set `gid` wherever the
///   number matters (files shared between machines, NFS, containers).
/// - With a `gid`, both paths run the same `groupadd --gid` before anything else of the
///   layer (a `bootcmd` entry coupled, since cloud-init's `groups` takes no GID); a
///   group that exists with another GID fails the step, saying both numbers.
/// - Rerun: nothing happens when the group exists (its GID is never changed).
/// - Refuses a name `groupadd` would refuse, and GID 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The group name.
    pub name: String,
    /// A fixed GID; the next free one where it is made when `None`.
    pub gid: Option<u32>,
}

impl Group {
    /// A group named `name`, with the next free GID.
    pub fn new(name: impl Into<String>) -> Self {
        Group {
            name: name.into(),
            gid: None,
        }
    }

    /// Sets a fixed GID.
    pub fn with_gid(mut self, gid: u32) -> Self {
        self.gid = Some(gid);
        self
    }

    pub(crate) fn check(&self) -> Result<()> {
        check::account_name("name", &self.name)?;
        check_id("gid", self.gid)
    }

    pub(crate) fn plan(&self, plan: &mut Plan) {
        match self.gid {
            Some(gid) => plan.fixed_groups.push(fixed_group_script(&self.name, gid)),
            None => plan.groups.push(self.name.clone()),
        }
    }
}

/// 0 is root's and `u32::MAX` means "no ID" to the kernel.
fn check_id(field: &str, id: Option<u32>) -> Result<()> {
    match id {
        Some(0) => Err(Error::invalid_spec(
            field,
            "0 is root's; give another number",
        )),
        Some(u32::MAX) => Err(Error::invalid_spec(
            field,
            "4294967295 is not an ID (it means none)",
        )),
        _ => Ok(()),
    }
}

/// Makes group `name` with `gid`, or checks that the one there has it.
fn fixed_group_script(name: &str, gid: u32) -> String {
    let g = q(name);
    format!(
        "if have=$(getent group {g}); then
           n=$(printf '%s' \"$have\" | cut -d: -f3)
           [ \"$n\" = {gid} ] || {{ printf 'group %s exists with GID %s, not %s\\n' {g} \"$n\" {gid} >&2; exit 1; }}
         else
           groupadd --gid {gid} {g}
         fi
"
    )
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
///   are set at creation only, as cloud-init does); a password locked already is left
///   alone (`passwd -l` would rewrite /etc/shadow); missing keys are appended, keys
///   already there are kept, never removed; a sudo rule in place is not written again.
/// - Numbers: without [`Account::uid`] the account takes the next free UID where it is
///   made, and its own group the next free GID, so the numbers depend on the order in
///   which accounts and groups were made on each machine (cloud-init makes the layer's
///   groups, then its accounts, at first boot; a decoupled machine already has the
///   image's default user): coupled and decoupled machines can differ. With a `uid`,
///   both paths make the account with the same `useradd --uid` before anything else of
///   the layer (a `bootcmd` entry coupled: cloud-init's `users` then finds it and locks
///   its password and adds its keys); its own group gets the same number when that GID
///   is free (useradd's choice), and an account that exists with another UID fails the
///   step, saying both numbers. Supplementary groups with a fixed GID are [`Group`]s
///   with `gid`, made before accounts.
/// - cloud-init writes several keys in an arbitrary order (it keeps them in a Python
///   set); the decoupled path writes them in the given order. The set of keys is the same.
/// - Refuses: UID 0, a name or group `useradd` refuses, a relative or spaced shell, a GECOS
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
    /// A fixed UID; the next free one where it is made when `None`.
    pub uid: Option<u32>,
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
            uid: None,
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

    /// Sets a fixed UID (see [`Account`]: numbers otherwise depend on the order of
    /// creation on each machine).
    pub fn with_uid(mut self, uid: u32) -> Self {
        self.uid = Some(uid);
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
        check_id("uid", self.uid)?;
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
        if let Some(uid) = self.uid {
            plan.fixed_accounts.push(account.fixed_script(uid));
        }
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

    /// Makes the account with `uid` (and its missing groups), or checks that the one
    /// there has it: run before anything else of the layer on both paths.
    fn fixed_script(&self, uid: u32) -> String {
        let name = q(&self.name);
        let mut s = self.groups_script();
        s.push_str(&format!(
            "if have=$(getent passwd {name}); then\n\
             \x20 n=$(printf '%s' \"$have\" | cut -d: -f3)\n\
             \x20 [ \"$n\" = {uid} ] || {{ printf 'account %s exists with UID %s, not %s\\n' {name} \"$n\" {uid} >&2; exit 1; }}\n\
             else\n\
             \x20 {}\n\
             fi\n",
            self.useradd()
        ));
        s
    }

    fn groups_script(&self) -> String {
        let mut s = String::new();
        for g in &self.groups {
            let g = q(g);
            s.push_str(&format!("getent group {g} >/dev/null || groupadd {g}\n"));
        }
        s
    }

    /// The `useradd` command cloud-init's `create_user` runs (with `--uid` when fixed).
    fn useradd(&self) -> String {
        let name = q(&self.name);
        let mut add = format!("useradd {name}");
        if let Some(uid) = self.uid {
            add.push_str(&format!(" --uid {uid}"));
        }
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
        add
    }

    /// The decoupled commands: what cloud-init's `create_user` runs, guarded to be
    /// rerunnable.
    pub(crate) fn script(&self) -> String {
        let name = q(&self.name);
        let mut s = self.groups_script();
        s.push_str(&format!(
            "getent passwd {name} >/dev/null || {}\n",
            self.useradd()
        ));
        if self.lock_password {
            // passwd -l rewrites /etc/shadow even when the password is locked already.
            s.push_str(&format!(
                "case \"$(passwd -S {name} 2>/dev/null | cut -d' ' -f2)\" in L|LK) ;; *) passwd -l {name} >/dev/null ;; esac\n"
            ));
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
        "if [ \"$(stat -c %a {f} 2>/dev/null)\" = 440 ] && printf '%s\\n' {line} | cmp -s - {f}; then exit 0; fi\n\
         command -v visudo >/dev/null || {{ printf '%s: visudo not found: the sudo rule cannot be checked (install sudo first)\\n' {field} >&2; exit 1; }}\n\
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
