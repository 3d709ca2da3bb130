//! Checks what cloud-init's schema cannot: paths, permission strings, owners that exist
//! when the file is written, names, keys. Each error names the field path.

use std::collections::BTreeSet;

use machine_core::{Error, Result};

use crate::model::{
    CloudConfig, Command, MODELED_KEYS, PHONE_HOME_FIELDS, PhoneHomePost, UserEntry,
};

/// Accounts a Debian-family image has before cloud-init runs (base-passwd), which
/// `write_files` may name as owners without `defer`.
pub const SYSTEM_USERS: &[&str] = &[
    "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp", "proxy",
    "www-data", "backup", "list", "irc", "_apt", "nobody",
];

/// Groups a Debian-family image has before cloud-init runs (base-passwd), which
/// `write_files` may name as owner groups without `defer` even when a user of the
/// document joins them.
pub const SYSTEM_GROUPS: &[&str] = &[
    "root", "daemon", "bin", "sys", "adm", "tty", "disk", "lp", "mail", "news", "uucp", "man",
    "proxy", "kmem", "dialout", "fax", "voice", "cdrom", "floppy", "tape", "sudo", "audio", "dip",
    "www-data", "backup", "operator", "list", "irc", "src", "shadow", "utmp", "video", "sasl",
    "plugdev", "staff", "games", "users", "nogroup",
];

/// Validates `config`, treating [`SYSTEM_USERS`] plus `extra_system_users` as
/// accounts that exist before cloud-init runs (and [`SYSTEM_GROUPS`] plus the same
/// names as groups that do).
///
/// `write_files` runs before `users_groups` in cloud-init, so a file owned by a user
/// or a group this document creates (a user's own group, a group in a user's `groups`
/// or in the top-level `groups`) must have `defer: true`. Permissions cloud-init 22.x
/// cannot apply are refused: `0000` (its chmod skips mode 0 and the file stays 0644) and
/// set-id bits (its chown after the chmod clears them; the sticky bit survives).
pub fn validate_with(config: &CloudConfig, extra_system_users: &[String]) -> Result<()> {
    for key in ["merge_how", "merge_type"] {
        if config.extra.contains_key(key) {
            return Err(Error::invalid_spec(
                key,
                format!(
                    "changes how cloud-init merges this layer's part (in a multipart it can drop earlier layers' write_files and runcmd, while a merged document ignores it); layers merge additively: remove {key}"
                ),
            ));
        }
    }
    if let Some(h) = &config.hostname {
        host_label("hostname", h)?;
    }
    if let Some(f) = &config.fqdn {
        check_fqdn("fqdn", f)?;
    }
    if let Some(tz) = &config.timezone
        && (tz.is_empty() || tz.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        return Err(Error::invalid_spec(
            "timezone",
            format!("{tz:?} is not a time zone name such as Etc/UTC"),
        ));
    }
    let mut created = BTreeSet::new();
    // Groups cloud-init creates: each user's own, each user's `groups`, the top-level
    // `groups` (a string "a, b", or a list of names or of {name: [members]} maps).
    let mut created_groups: BTreeSet<&str> = BTreeSet::new();
    for entry in &config.users {
        if let UserEntry::User(u) = entry {
            created_groups.insert(u.name.as_str());
            created_groups.extend(u.groups.iter().map(String::as_str));
        }
    }
    match config.extra.get("groups") {
        Some(serde_json::Value::String(s)) => {
            created_groups.extend(s.split(',').map(str::trim));
        }
        Some(serde_json::Value::Array(items)) => {
            for item in items {
                match item {
                    serde_json::Value::String(s) => {
                        created_groups.insert(s.as_str());
                    }
                    serde_json::Value::Object(m) => {
                        created_groups.extend(m.keys().map(String::as_str));
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
    for (i, entry) in config.users.iter().enumerate() {
        let UserEntry::User(u) = entry else { continue };
        // Field names are formatted only on error (see `named`).
        let field = || format!("users[{i}]");
        named(|| format!("{}.name", field()), |f| account_name(f, &u.name))?;
        if !created.insert(u.name.as_str()) {
            return Err(Error::invalid_spec(
                format!("{}.name", field()),
                format!("user {:?} is listed twice", u.name),
            ));
        }
        for (g, group) in u.groups.iter().enumerate() {
            named(
                || format!("{}.groups[{g}]", field()),
                |f| account_name(f, group),
            )?;
        }
        if let Some(shell) = &u.shell
            && (!shell.starts_with('/') || shell.chars().any(char::is_whitespace))
        {
            return Err(Error::invalid_spec(
                format!("{}.shell", field()),
                format!("{shell:?} is not an absolute path"),
            ));
        }
        if let Some(sudo) = &u.sudo
            && (sudo.trim().is_empty() || sudo.contains(['\n', '\r', '\0']))
        {
            return Err(Error::invalid_spec(
                format!("{}.sudo", field()),
                "must be one sudoers rule such as \"ALL=(ALL) NOPASSWD:ALL\"",
            ));
        }
        for (k, key) in u.ssh_authorized_keys.iter().enumerate() {
            named(
                || format!("{}.ssh_authorized_keys[{k}]", field()),
                |f| public_key(f, key, None),
            )?;
        }
    }
    for (i, f) in config.write_files.iter().enumerate() {
        let field = || format!("write_files[{i}]");
        named(|| format!("{}.path", field()), |n| check_path(n, &f.path))?;
        if let Some(p) = &f.permissions {
            named(
                || format!("{}.permissions", field()),
                |n| check_permissions(n, p),
            )?;
        }
        if let Some(owner) = &f.owner {
            let (user, group) = owner.split_once(':').unwrap_or((owner, ""));
            named(|| format!("{}.owner", field()), |n| account_name(n, user))?;
            if owner.contains(':') {
                named(|| format!("{}.owner", field()), |n| account_name(n, group))?;
                // An account the document creates does not exist when files are written,
                // even if a layer declared it as one "another layer creates".
                let existing = SYSTEM_GROUPS.contains(&group)
                    || (extra_system_users.iter().any(|u| u == group)
                        && !created_groups.contains(group));
                if created_groups.contains(group) && !existing && !f.defer {
                    return Err(Error::invalid_spec(
                        format!("{}.defer", field()),
                        format!(
                            "owner group {group:?} is created by this document after write_files runs; set defer: true"
                        ),
                    ));
                }
            }
            let system = SYSTEM_USERS.contains(&user)
                || (extra_system_users.iter().any(|u| u == user) && !created.contains(user));
            if !system {
                if !created.contains(user) {
                    return Err(Error::invalid_spec(
                        format!("{}.owner", field()),
                        format!(
                            "user {user:?} is neither created in users nor a system account; cloud-init's chown would fail"
                        ),
                    ));
                }
                if !f.defer {
                    return Err(Error::invalid_spec(
                        format!("{}.defer", field()),
                        format!(
                            "owner {user:?} is created by this document after write_files runs; set defer: true"
                        ),
                    ));
                }
            }
        }
    }
    for (name, cmds) in [("bootcmd", &config.bootcmd), ("runcmd", &config.runcmd)] {
        for (i, c) in cmds.iter().enumerate() {
            let empty = match c {
                Command::Shell(s) => s.trim().is_empty(),
                Command::Argv(v) => v.first().is_none_or(|a| a.is_empty()),
            };
            let nul = match c {
                Command::Shell(s) => s.contains('\0'),
                Command::Argv(v) => v.iter().any(|a| a.contains('\0')),
            };
            if empty || nul {
                return Err(Error::invalid_spec(
                    format!("{name}[{i}]"),
                    "is empty or holds a NUL byte",
                ));
            }
        }
    }
    for (i, p) in config.packages.iter().enumerate() {
        if p.is_empty() || p.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Error::invalid_spec(
                format!("packages[{i}]"),
                format!("{p:?} is not a package name"),
            ));
        }
    }
    if let Some(keys) = &config.ssh_keys {
        for (algo, private, public) in [
            ("ed25519", &keys.ed25519_private, &keys.ed25519_public),
            ("ecdsa", &keys.ecdsa_private, &keys.ecdsa_public),
            ("rsa", &keys.rsa_private, &keys.rsa_public),
        ] {
            if private.is_some() != public.is_some() {
                return Err(Error::invalid_spec(
                    format!("ssh_keys.{algo}_public"),
                    format!("{algo}_private and {algo}_public must be given together"),
                ));
            }
            if let Some(private) = private
                && !private
                    .expose()
                    .starts_with("-----BEGIN OPENSSH PRIVATE KEY-----")
                && !private.expose().starts_with("-----BEGIN ")
            {
                return Err(Error::invalid_spec(
                    format!("ssh_keys.{algo}_private"),
                    "is not a PEM private key",
                ));
            }
            if let Some(public) = public {
                let prefix = match algo {
                    "ed25519" => "ssh-ed25519",
                    "ecdsa" => "ecdsa-sha2-",
                    _ => "ssh-rsa",
                };
                public_key(&format!("ssh_keys.{algo}_public"), public, Some(prefix))?;
            }
        }
    }
    if let Some(ca) = &config.ca_certs {
        for (i, pem) in ca.trusted.iter().enumerate() {
            if !pem.contains("-----BEGIN CERTIFICATE-----") {
                return Err(Error::invalid_spec(
                    format!("ca_certs.trusted[{i}]"),
                    "is not a PEM certificate",
                ));
            }
        }
    }
    if let Some(ntp) = &config.ntp {
        for (list, items) in [("servers", &ntp.servers), ("pools", &ntp.pools)] {
            let mut seen = BTreeSet::new();
            for (i, s) in items.iter().enumerate() {
                if !seen.insert(s) {
                    return Err(Error::invalid_spec(
                        format!("ntp.{list}[{i}]"),
                        format!("{s:?} is listed twice"),
                    ));
                }
                check_fqdn(&format!("ntp.{list}[{i}]"), s)?;
            }
        }
    }
    if let Some(ph) = &config.phone_home {
        if !(ph.url.starts_with("http://") || ph.url.starts_with("https://"))
            || ph.url.chars().any(char::is_whitespace)
        {
            return Err(Error::invalid_spec(
                "phone_home.url",
                format!("{:?} is not an http(s) URL", ph.url),
            ));
        }
        if let PhoneHomePost::Fields(fields) = &ph.post {
            for (i, f) in fields.iter().enumerate() {
                if !PHONE_HOME_FIELDS.contains(&f.as_str()) {
                    return Err(Error::invalid_spec(
                        format!("phone_home.post[{i}]"),
                        format!("{f:?} is not one of {}", PHONE_HOME_FIELDS.join(", ")),
                    ));
                }
            }
        }
    }
    for key in config.extra.keys() {
        if MODELED_KEYS.contains(&key.as_str()) {
            return Err(Error::invalid_spec(
                format!("extra.{key}"),
                "is a key the typed model covers; set the typed field instead",
            ));
        }
        if key.is_empty() || key.starts_with('#') {
            return Err(Error::invalid_spec(
                format!("extra.{key}"),
                "is not a cloud-config key",
            ));
        }
    }
    Ok(())
}

/// A host name label (RFC 1123): 1-63 of a-z, A-Z, 0-9 and `-`, not at either end.
pub fn host_label(field: &str, s: &str) -> Result<()> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_spec(
            field,
            format!("{s:?} is not a host name (1-63 of a-z, A-Z, 0-9, '-', not at either end)"),
        ))
    }
}

fn check_fqdn(field: &str, s: &str) -> Result<()> {
    if s.is_empty() || s.len() > 253 {
        return Err(Error::invalid_spec(
            field,
            format!("{s:?} is not a domain name"),
        ));
    }
    for label in s.trim_end_matches('.').split('.') {
        host_label(field, label)
            .map_err(|_| Error::invalid_spec(field, format!("{s:?} is not a domain name")))?;
    }
    Ok(())
}

/// Runs `check` with an empty field name and, only when it fails, again with the
/// real one from `field`: the checks of a valid document (every layer of every machine)
/// then format no field names.
fn named(field: impl FnOnce() -> String, check: impl Fn(&str) -> Result<()>) -> Result<()> {
    match check("") {
        Ok(()) => Ok(()),
        Err(_) => check(&field()),
    }
}

/// An account or group name as `useradd`/`groupadd` accept it by default on Debian
/// (and cloud-init passes it on): a-z or `_` first, then a-z, 0-9, `_`, `-`, `.`; at
/// most 32 characters.
pub fn account_name(field: &str, s: &str) -> Result<()> {
    let mut chars = s.chars();
    let ok = s.len() <= 32
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_spec(
            field,
            format!(
                "{s:?} is not an account name (a-z or '_' first, then a-z, 0-9, '_', '-', '.'; at most 32)"
            ),
        ))
    }
}

fn check_path(field: &str, path: &str) -> Result<()> {
    if path.is_empty() {
        return Err(Error::invalid_spec(
            field,
            "is empty; give an absolute path",
        ));
    }
    if !path.starts_with('/') {
        return Err(Error::invalid_spec(
            field,
            format!("{path:?} is relative; give an absolute path"),
        ));
    }
    if path.ends_with('/') || path.contains('\0') || path.contains('\n') {
        return Err(Error::invalid_spec(
            field,
            format!("{path:?} is not a file path"),
        ));
    }
    Ok(())
}

fn check_permissions(field: &str, p: &str) -> Result<()> {
    let digits = p.strip_prefix("0o").unwrap_or(p);
    let ok = (3..=4).contains(&digits.len()) && digits.chars().all(|c| ('0'..='7').contains(&c));
    let mode = u32::from_str_radix(digits, 8).ok().filter(|_| ok);
    match mode {
        None => Err(Error::invalid_spec(
            field,
            format!("{p:?} is not an octal permission string such as \"0644\""),
        )),
        Some(0) => Err(Error::invalid_spec(
            field,
            "mode 0000 cannot be applied: cloud-init 22.x skips a zero mode and the file stays 0644; give at least one bit (0400)",
        )),
        // The sticky bit survives the chown (seen on the real cloud-init); set-id bits do not.
        Some(m) if m & 0o6000 != 0 => Err(Error::invalid_spec(
            field,
            format!(
                "{p:?} has set-user-id or set-group-id bits, which cloud-init 22.x cannot apply (its chown after the chmod clears them); set them with chmod in runcmd"
            ),
        )),
        Some(_) => Ok(()),
    }
}

/// An OpenSSH public key line, `type base64 [comment]` on one line, whose type starts
/// with `prefix` (any SSH key type when `None`).
pub fn public_key(field: &str, key: &str, prefix: Option<&str>) -> Result<()> {
    let mut parts = key.split_whitespace();
    let algo = parts.next().unwrap_or_default();
    let blob = parts.next().unwrap_or_default();
    let algo_ok = match prefix {
        Some(p) => algo.starts_with(p),
        None => algo.starts_with("ssh-") || algo.starts_with("ecdsa-") || algo.starts_with("sk-"),
    };
    let blob_ok = !blob.is_empty()
        && blob
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '='));
    if algo_ok && blob_ok && !key.contains(['\n', '\r', '\0']) {
        Ok(())
    } else {
        Err(Error::invalid_spec(
            field,
            "is not an OpenSSH public key line (\"ssh-ed25519 AAAA... comment\")",
        ))
    }
}
