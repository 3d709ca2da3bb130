//! The checks every recipe runs at construction of its layer: names, paths and modes that
//! the machine's tools (useradd, apt-get, systemd, sysctl) or cloud-init would refuse or
//! misread. Each error is an invalid-spec error naming the field.

pub(crate) use bootstrap_cloudinit::checks::{account_name, host_label};
use machine_core::{Error, Result};

/// `Ok` when `ok`, else an invalid-spec error on `field` saying `why`.
fn require(ok: bool, field: &str, why: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_spec(field, why()))
    }
}

/// `user` or `user:group`.
pub(crate) fn owner(field: &str, s: &str) -> Result<()> {
    let (user, group) = s.split_once(':').unwrap_or((s, ""));
    account_name(field, user)?;
    if s.contains(':') {
        account_name(field, group)?;
    }
    Ok(())
}

/// An absolute path without `..` components, NUL or line breaks, not ending in `/`.
pub(crate) fn path(field: &str, p: &str) -> Result<()> {
    let ok = p.starts_with('/')
        && p.len() > 1
        && !p.ends_with('/')
        && !p.contains(['\0', '\n', '\r'])
        && !p.split('/').any(|c| c == "..");
    require(ok, field, || {
        format!("{p:?} is not an absolute path (no '..', NUL or line breaks, no trailing '/')")
    })
}

/// A file mode both paths apply identically: at most 0o777 plus the sticky bit, never
/// 0000 (cloud-init 22.x skips a zero mode and leaves 0644) and never set-id bits
/// (cloud-init's chown after its chmod clears them).
pub(crate) fn file_mode(field: &str, mode: u32) -> Result<()> {
    if mode == 0 {
        return Err(Error::invalid_spec(
            field,
            "mode 0000 cannot be applied by cloud-init 22.x (it skips a zero mode and the file stays 0644); give at least 0400",
        ));
    }
    if mode & 0o6000 != 0 {
        return Err(Error::invalid_spec(
            field,
            format!(
                "{mode:#o} has set-user-id or set-group-id bits, which cloud-init 22.x cannot apply (its chown after the chmod clears them)"
            ),
        ));
    }
    if mode > 0o1777 {
        return Err(Error::invalid_spec(
            field,
            format!("{mode:#o} is not a permission mode (at most 0o1777)"),
        ));
    }
    Ok(())
}

/// A directory mode: like [`file_mode`] but 0000 is allowed (a `chmod` command applies it
/// on both paths); set-id bits are still refused, the chown after chmod would clear them.
pub(crate) fn dir_mode(field: &str, mode: u32) -> Result<()> {
    if mode & 0o6000 != 0 || mode > 0o1777 {
        return Err(Error::invalid_spec(
            field,
            format!("{mode:#o} is not a directory mode (at most 0o1777, no set-id bits)"),
        ));
    }
    Ok(())
}

/// A Debian package name (policy 5.6.7): lower-case letters, digits, `+`, `-`, `.`,
/// at least two characters, a letter or digit first; optionally `:arch`.
pub(crate) fn deb_package(field: &str, s: &str) -> Result<()> {
    let (name, arch) = s.split_once(':').unwrap_or((s, "x"));
    let name_ok = name.len() >= 2
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '+' | '-' | '.'));
    let arch_ok = !arch.is_empty()
        && arch
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if name_ok && arch_ok {
        Ok(())
    } else {
        Err(Error::invalid_spec(
            field,
            format!(
                "{s:?} is not a Debian package name (a-z, 0-9, '+', '-', '.'; a letter or digit first; optionally ':arch'); shell characters are never passed on"
            ),
        ))
    }
}

/// A Debian version (policy 5.6.12): `[epoch:]upstream[-revision]` of letters, digits and
/// `.+~:-`, a digit first.
pub(crate) fn deb_version(field: &str, s: &str) -> Result<()> {
    let ok = s.chars().next().is_some_and(|c| c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '~' | ':' | '-'));
    require(ok, field, || {
        format!("{s:?} is not a Debian version (a digit first, then letters, digits, '.+~:-')")
    })
}

/// An RPM package name: letters, digits and `._+-`, a letter or digit first.
pub(crate) fn rpm_package(field: &str, s: &str) -> Result<()> {
    let ok = s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-'));
    require(ok, field, || {
        format!(
            "{s:?} is not an RPM package name (letters, digits, '._+-'; a letter or digit first)"
        )
    })
}

/// An RPM version: `[epoch:]version[-release]` of letters, digits and `._+~^:-`.
pub(crate) fn rpm_version(field: &str, s: &str) -> Result<()> {
    let ok = s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '~' | '^' | ':' | '-')
        });
    require(ok, field, || {
        format!("{s:?} is not an RPM version (letters, digits, '._+~^:-')")
    })
}

/// An Alpine package name: lower-case letters, digits and `._+-`, a letter or digit first.
pub(crate) fn apk_package(field: &str, s: &str) -> Result<()> {
    let ok = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.chars().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '+' | '-')
        });
    require(ok, field, || {
        format!("{s:?} is not an Alpine package name (a-z, 0-9, '._+-'; a letter or digit first)")
    })
}

/// An Alpine version such as `1.36.1-r2`: a digit first, then letters, digits, `._-`.
pub(crate) fn apk_version(field: &str, s: &str) -> Result<()> {
    let ok = s.chars().next().is_some_and(|c| c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    require(ok, field, || {
        format!("{s:?} is not an Alpine version such as 1.36.1-r2")
    })
}

/// Unit types systemd knows.
const UNIT_SUFFIXES: &[&str] = &[
    "service",
    "socket",
    "target",
    "timer",
    "path",
    "mount",
    "automount",
    "swap",
    "slice",
    "scope",
    "device",
];

/// A systemd unit name: a prefix of ASCII letters, digits and `:-_.\`, an optional
/// `@instance` (also empty, for templates), a known type suffix; at most 255 bytes.
pub(crate) fn unit_name(field: &str, s: &str) -> Result<()> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, ':' | '-' | '_' | '.' | '\\');
    let ok = s.len() <= 255
        && s.rsplit_once('.').is_some_and(|(stem, suffix)| {
            let (prefix, instance) = stem.split_once('@').unwrap_or((stem, ""));
            UNIT_SUFFIXES.contains(&suffix)
                && !prefix.is_empty()
                && prefix.chars().all(allowed)
                && instance.chars().all(allowed)
        });
    require(ok, field, || {
        format!(
            "{s:?} is not a systemd unit name (letters, digits, ':-_.\\', an optional @instance, then .service, .socket, .timer, ...)"
        )
    })
}

/// A plain file name of letters, digits and `-_.` (a drop-in, a configuration file's
/// stem), not starting with a dot.
pub(crate) fn plain_name(field: &str, s: &str) -> Result<()> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    require(ok, field, || {
        format!("{s:?} is not a plain file name (letters, digits, '-', '_', '.'; not a dot first)")
    })
}

/// A sysctl key: dot-separated components of letters, digits, `_` and `-`; never `/`
/// (the other separator sysctl accepts, which would reach outside /proc/sys with `..`).
pub(crate) fn sysctl_key(field: &str, s: &str) -> Result<()> {
    let ok = !s.is_empty()
        && s.split('.').all(|c| {
            !c.is_empty()
                && c.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
        });
    require(ok, field, || {
        format!(
            "{s:?} is not a sysctl key (dot-separated letters, digits, '_', '-'; no '/', no empty or '..' components)"
        )
    })
}

/// A repository URL: http(s), no spaces, quotes or shell characters; with `variables`,
/// `$` is allowed too (dnf and zypper expand `$releasever` and `$basearch` in files).
pub(crate) fn repository_url(field: &str, s: &str, variables: bool) -> Result<()> {
    let ok = (s.starts_with("http://") || s.starts_with("https://"))
        && s.len() > "https://".len()
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric() || "-._~/:%+@".contains(c) || (variables && c == '$')
        });
    require(ok, field, || {
        format!("{s:?} is not an http(s) URL without spaces or quotes")
    })
}

/// An ASCII-armored OpenPGP public key block.
pub(crate) fn pgp_public_key(field: &str, s: &str) -> Result<()> {
    let s = s.trim();
    require(
        s.starts_with("-----BEGIN PGP PUBLIC KEY BLOCK-----")
            && s.ends_with("-----END PGP PUBLIC KEY BLOCK-----"),
        field,
        || "is not an ASCII-armored OpenPGP public key block".to_owned(),
    )
}

/// A value on one line, not empty.
pub(crate) fn one_line(field: &str, s: &str, what: &str) -> Result<()> {
    if s.trim().is_empty() || s.contains(['\n', '\r', '\0']) {
        return Err(Error::invalid_spec(
            field,
            format!("must be {what} on one line"),
        ));
    }
    Ok(())
}

/// A kernel module name: letters, digits, `_` and `-`.
pub(crate) fn module_name(field: &str, s: &str) -> Result<()> {
    if !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
    {
        Ok(())
    } else {
        Err(Error::invalid_spec(
            field,
            format!("{s:?} is not a kernel module name (letters, digits, '_', '-')"),
        ))
    }
}

/// A zoneinfo name such as `Europe/Paris` or `Etc/UTC`.
pub(crate) fn timezone(field: &str, s: &str) -> Result<()> {
    let ok = !s.is_empty()
        && !s.starts_with('/')
        && s.split('/').all(|c| {
            !c.is_empty()
                && c != ".."
                && c != "."
                && c.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '-'))
        });
    require(ok, field, || {
        format!("{s:?} is not a time zone name such as Etc/UTC")
    })
}

/// An OpenSSH public key line of any key type.
pub(crate) fn public_key(field: &str, key: &str) -> Result<()> {
    bootstrap_cloudinit::checks::public_key(field, key, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_names_follow_systemd() {
        for ok in [
            "nginx.service",
            "getty@tty1.service",
            "getty@.service",
            "a-b_c:d.timer",
        ] {
            unit_name("u", ok).unwrap();
        }
        for bad in [
            "nginx",
            "nginx.conf",
            "../x.service",
            "a b.service",
            "@x.service",
            "x;y.service",
            ".service",
        ] {
            assert!(unit_name("u", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn package_names_refuse_shell_characters() {
        for ok in ["nginx", "libc6:amd64", "g++", "python3.11"] {
            deb_package("p", ok).unwrap();
        }
        for bad in [
            "curl;rm -rf /",
            "$(id)",
            "a",
            "Nginx",
            "x y",
            "-x",
            "nginx:",
            "curl`id`",
        ] {
            assert!(deb_package("p", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sysctl_keys_refuse_slashes_and_dot_dot() {
        sysctl_key("k", "net.ipv4.ip_forward").unwrap();
        sysctl_key("k", "net.ipv4.conf.eth-0.rp_filter").unwrap();
        for bad in [
            "net/ipv4/ip_forward",
            "net..ipv4",
            "../../etc/passwd",
            "",
            "a.b.",
            "a b",
        ] {
            assert!(sysctl_key("k", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn modes_cloud_init_cannot_apply_are_refused() {
        file_mode("m", 0o640).unwrap();
        file_mode("m", 0o1777).unwrap();
        for bad in [0, 0o4755, 0o2755, 0o10644] {
            assert!(file_mode("m", bad).is_err(), "{bad:o}");
        }
    }
}
