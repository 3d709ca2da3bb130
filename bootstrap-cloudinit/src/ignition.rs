//! Ignition v3 (spec 3.3.0) for Fedora CoreOS and Flatcar from the same [`CloudConfig`],
//! where the features map: users and their keys, files, host name, time zone, host
//! keys, and commands, which become oneshot systemd units. What has no Ignition
//! equivalent (packages, NTP, CA certificates, phone_home, ...) is an invalid-spec error
//! naming the key, never silently dropped.

use base64::Engine;
use machine_core::{Error, Result, UserData, UserDataFormat};
use serde_json::{Value, json};

use crate::model::{CloudConfig, Command, UserEntry};
use crate::validate::validate_with;

/// The Ignition spec version written.
pub const IGNITION_VERSION: &str = "3.3.0";

/// Where command scripts go on the machine.
const SCRIPT_DIR: &str = "/etc/bootstrap";

/// Converts `config` to an Ignition config (JSON text).
pub fn to_ignition(config: &CloudConfig) -> Result<String> {
    validate_with(config, &[])?;
    refuse_unmapped(config)?;
    let mut users = Vec::new();
    let mut files = Vec::new();
    let mut links = Vec::new();
    let mut units = Vec::new();
    for (i, entry) in config.users.iter().enumerate() {
        let u = match entry {
            UserEntry::Default => {
                return Err(Error::invalid_spec(
                    format!("users[{i}]"),
                    "the image's default user does not map to Ignition; name the user",
                ));
            }
            UserEntry::User(u) => u,
        };
        if u.lock_passwd == Some(false) && u.hashed_passwd.is_none() {
            return Err(Error::invalid_spec(
                format!("users[{i}].lock_passwd"),
                "an unlocked password without hashed_passwd does not map to Ignition",
            ));
        }
        let mut user = json!({"name": u.name});
        if !u.ssh_authorized_keys.is_empty() {
            user["sshAuthorizedKeys"] = json!(u.ssh_authorized_keys);
        }
        if !u.groups.is_empty() {
            user["groups"] = json!(u.groups);
        }
        if let Some(s) = &u.shell {
            user["shell"] = json!(s);
        }
        if let Some(g) = &u.gecos {
            user["gecos"] = json!(g);
        }
        if let Some(s) = u.system {
            user["system"] = json!(s);
        }
        if let Some(h) = &u.hashed_passwd {
            user["passwordHash"] = json!(h.expose());
        }
        users.push(user);
        if let Some(rule) = &u.sudo {
            files.push(file(
                &format!("/etc/sudoers.d/{}", u.name),
                format!("{} {rule}\n", u.name).as_bytes(),
                0o440,
                None,
            ));
        }
    }
    if let Some(h) = &config.hostname {
        files.push(file(
            "/etc/hostname",
            format!("{h}\n").as_bytes(),
            0o644,
            None,
        ));
    }
    if let Some(tz) = &config.timezone {
        links.push(json!({
            "path": "/etc/localtime",
            "target": format!("../usr/share/zoneinfo/{tz}"),
            "overwrite": true,
        }));
    }
    if let Some(keys) = &config.ssh_keys {
        for (algo, private, public) in [
            ("ed25519", &keys.ed25519_private, &keys.ed25519_public),
            ("ecdsa", &keys.ecdsa_private, &keys.ecdsa_public),
            ("rsa", &keys.rsa_private, &keys.rsa_public),
        ] {
            if let (Some(private), Some(public)) = (private, public) {
                let path = format!("/etc/ssh/ssh_host_{algo}_key");
                files.push(file(&path, private.expose().as_bytes(), 0o600, None));
                files.push(file(
                    &format!("{path}.pub"),
                    format!("{public}\n").as_bytes(),
                    0o644,
                    None,
                ));
            }
        }
    }
    for f in &config.write_files {
        let mode = match &f.permissions {
            Some(p) => u32::from_str_radix(p.trim_start_matches("0o"), 8).unwrap_or(0o644),
            None => 0o644,
        };
        let mut entry = file(&f.path, f.content.bytes(), mode, f.owner.as_deref());
        if f.append {
            let source = entry["contents"].clone();
            entry.as_object_mut().map(|o| o.remove("contents"));
            entry.as_object_mut().map(|o| o.remove("overwrite"));
            entry["append"] = json!([source]);
        }
        files.push(entry);
    }
    for (key, commands, every_boot) in [
        ("bootcmd", &config.bootcmd, true),
        ("runcmd", &config.runcmd, false),
    ] {
        if commands.is_empty() {
            continue;
        }
        let script_path = format!("{SCRIPT_DIR}/{key}.sh");
        let mut script = String::from("#!/bin/sh\nset -eu\n");
        for c in commands {
            match c {
                Command::Shell(s) => script.push_str(s),
                Command::Argv(argv) => {
                    let quoted: Vec<String> = argv
                        .iter()
                        .map(|a| {
                            shlex::try_quote(a).map_or_else(|_| "''".into(), |q| q.into_owned())
                        })
                        .collect();
                    script.push_str(&quoted.join(" "));
                }
            }
            script.push('\n');
        }
        files.push(file(&script_path, script.as_bytes(), 0o700, None));
        let done = format!("/var/lib/bootstrap/{key}.done");
        let unit = if every_boot {
            format!(
                "[Unit]\nDescription=bootstrap {key}: commands run early on every boot\nDefaultDependencies=no\nAfter=local-fs.target\nBefore=sysinit.target\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/sh {script_path}\n\n[Install]\nWantedBy=sysinit.target\n"
            )
        } else {
            format!(
                "[Unit]\nDescription=bootstrap {key}: commands run once, late in the first boot\nWants=network-online.target\nAfter=network-online.target\nConditionPathExists=!{done}\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/sh {script_path}\nExecStartPost=/bin/mkdir -p /var/lib/bootstrap\nExecStartPost=/bin/touch {done}\n\n[Install]\nWantedBy=multi-user.target\n"
            )
        };
        units.push(
            json!({"name": format!("bootstrap-{key}.service"), "enabled": true, "contents": unit}),
        );
    }
    let mut doc = json!({"ignition": {"version": IGNITION_VERSION}});
    if !users.is_empty() {
        doc["passwd"] = json!({"users": users});
    }
    if !files.is_empty() || !links.is_empty() {
        let mut storage = json!({});
        if !files.is_empty() {
            storage["files"] = json!(files);
        }
        if !links.is_empty() {
            storage["links"] = json!(links);
        }
        doc["storage"] = storage;
    }
    if !units.is_empty() {
        doc["systemd"] = json!({"units": units});
    }
    serde_json::to_string_pretty(&doc)
        .map_err(|e| Error::permanent(format!("cannot write Ignition JSON: {e}")))
}

/// [`to_ignition`] as user data.
pub fn ignition_user_data(config: &CloudConfig) -> Result<UserData> {
    Ok(UserData::new(
        UserDataFormat::Ignition,
        to_ignition(config)?,
    ))
}

fn file(path: &str, content: &[u8], mode: u32, owner: Option<&str>) -> Value {
    let source = format!(
        "data:;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(content)
    );
    let mut f = json!({
        "path": path,
        "mode": mode,
        "overwrite": true,
        "contents": {"source": source},
    });
    if let Some(owner) = owner {
        let (user, group) = owner.split_once(':').unwrap_or((owner, ""));
        f["user"] = json!({"name": user});
        if !group.is_empty() {
            f["group"] = json!({"name": group});
        }
    }
    f
}

fn refuse_unmapped(c: &CloudConfig) -> Result<()> {
    let unmapped: [(&str, bool, &str); 12] = [
        (
            "packages",
            !c.packages.is_empty(),
            "CoreOS images install no packages at boot; layer them with rpm-ostree or use a container",
        ),
        (
            "package_update",
            c.package_update.is_some(),
            "there is no package manager run at boot",
        ),
        (
            "package_upgrade",
            c.package_upgrade.is_some(),
            "CoreOS updates itself (Zincati, update_engine)",
        ),
        (
            "ntp",
            c.ntp.is_some(),
            "write the chrony or timesyncd configuration as a file instead",
        ),
        (
            "ca_certs",
            c.ca_certs.is_some(),
            "write the certificate under the distro's anchors directory as a file instead",
        ),
        (
            "phone_home",
            c.phone_home.is_some(),
            "Ignition has no completion callback; use a runcmd command",
        ),
        (
            "final_message",
            c.final_message.is_some(),
            "Ignition has no final message",
        ),
        ("fqdn", c.fqdn.is_some(), "set hostname instead"),
        (
            "prefer_fqdn_over_hostname",
            c.prefer_fqdn_over_hostname.is_some(),
            "set hostname instead",
        ),
        (
            "manage_etc_hosts",
            c.manage_etc_hosts.is_some(),
            "write /etc/hosts as a file instead",
        ),
        (
            "ssh_pwauth",
            c.ssh_pwauth.is_some(),
            "write an sshd_config.d drop-in as a file instead",
        ),
        (
            "disable_root",
            c.disable_root.is_some(),
            "write an sshd_config.d drop-in as a file instead",
        ),
    ];
    for (key, set, why) in unmapped {
        if set {
            return Err(Error::invalid_spec(
                key,
                format!("does not map to Ignition: {why}"),
            ));
        }
    }
    if let Some(key) = c.extra.keys().next() {
        return Err(Error::invalid_spec(
            format!("extra.{key}"),
            "escape-hatch keys are cloud-init's own and do not map to Ignition",
        ));
    }
    Ok(())
}
