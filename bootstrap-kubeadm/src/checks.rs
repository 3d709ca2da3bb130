//! Checks of the values a [`crate::KubeadmNode`] takes, each naming the field it refuses.

use machine_core::{Error, Result, shown};

/// `host:port` with a DNS name, IPv4 or bracketed IPv6 host and a port 1-65535.
pub(crate) fn endpoint(field: &str, text: &str) -> Result<()> {
    let bad =
        |why: &str| Error::invalid_spec(field, format!("{} is not host:port ({why})", shown(text)));
    let (host, port) = text.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 && !port.starts_with('0') => {}
        _ => return Err(bad("the port is not 1-65535")),
    }
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return v6
            .parse::<std::net::Ipv6Addr>()
            .map(|_| ())
            .map_err(|_| bad("not an IPv6 address in brackets"));
    }
    if host.parse::<std::net::Ipv4Addr>().is_ok() {
        return Ok(());
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if host.is_empty() || host.len() > 253 || !host.split('.').all(label_ok) {
        return Err(bad("the host is not a DNS name or IP address"));
    }
    Ok(())
}

/// kubeadm's bootstrap token format, `[a-z0-9]{6}.[a-z0-9]{16}`. The message never
/// shows the value.
pub(crate) fn token(field: &str, token: &str) -> Result<()> {
    let part = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    match token.split_once('.') {
        Some((id, secret)) if part(id, 6) && part(secret, 16) => Ok(()),
        _ => Err(Error::invalid_spec(
            field,
            format!(
                "is not a kubeadm bootstrap token ([a-z0-9]{{6}}.[a-z0-9]{{16}}, {} characters given)",
                token.chars().count()
            ),
        )),
    }
}

/// `sha256:` and 64 hex digits, as `kubeadm token create --print-join-command` prints.
pub(crate) fn ca_hash(field: &str, hash: &str) -> Result<()> {
    match hash.strip_prefix("sha256:") {
        Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(()),
        _ => Err(Error::invalid_spec(
            field,
            format!(
                "{} is not a CA public key pin sha256:<64 hex digits>",
                shown(hash)
            ),
        )),
    }
}

/// The control-plane certificate key: 64 hex digits (32 bytes, `kubeadm certs
/// certificate-key`). The message never shows the value.
pub(crate) fn certificate_key(field: &str, key: &str) -> Result<()> {
    if key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(Error::invalid_spec(
            field,
            format!(
                "is not a kubeadm certificate key (64 hex digits, {} characters given)",
                key.chars().count()
            ),
        ))
    }
}

/// A label or taint value: empty, or up to 63 characters of `[A-Za-z0-9._-]` beginning
/// and ending with an alphanumeric.
pub(crate) fn label_value(field: &str, value: &str) -> Result<()> {
    if value.is_empty() || name_part(value) {
        Ok(())
    } else {
        Err(Error::invalid_spec(
            field,
            format!(
                "{} is not a label value (at most 63 of A-Z a-z 0-9 . _ -, alphanumeric at both ends)",
                shown(value)
            ),
        ))
    }
}

/// A label or taint key: `[prefix/]name`, the prefix a DNS subdomain. For labels
/// (`kubelet_sets`), also refuses the `kubernetes.io` and `k8s.io` namespaces the
/// NodeRestriction admission plugin forbids kubelets to set, but for
/// `kubelet.kubernetes.io/` and `node.kubernetes.io/`.
pub(crate) fn qualified_name(field: &str, key: &str, kubelet_sets: bool) -> Result<()> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    });
    if !prefix_ok || !name_part(name) {
        return Err(Error::invalid_spec(
            field,
            format!(
                "{} is not a qualified name ([DNS-subdomain/]name, the name at most 63 of A-Z a-z 0-9 . _ -)",
                shown(key)
            ),
        ));
    }
    if kubelet_sets && let Some(p) = prefix {
        let restricted = ["kubernetes.io", "k8s.io"]
            .iter()
            .any(|ns| p == *ns || p.ends_with(&format!(".{ns}")));
        let allowed = ["kubelet.kubernetes.io", "node.kubernetes.io"]
            .iter()
            .any(|ns| p == *ns || p.ends_with(&format!(".{ns}")));
        if restricted && !allowed {
            return Err(Error::invalid_spec(
                field,
                format!(
                    "{} is in a namespace a kubelet may not label its own node with (NodeRestriction); set it from the cluster instead",
                    shown(key)
                ),
            ));
        }
    }
    Ok(())
}

fn name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

/// A kubelet flag name (`[a-z0-9-]+`, no leading dash) and a value the env file can
/// carry: kubeadm writes the flags into `/var/lib/kubelet/kubeadm-flags.env` as
/// `KUBELET_KUBEADM_ARGS="--name=value ..."`, and the kubelet unit passes them as
/// `$KUBELET_KUBEADM_ARGS`, which systemd splits at whitespace: a value with a space
/// would reach the kubelet as two arguments, and it would not start. No quote,
/// backslash, control character or whitespace.
pub(crate) fn kubelet_arg(field: &str, name: &str, value: &str) -> Result<()> {
    let name_ok = !name.is_empty()
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !name_ok {
        return Err(Error::invalid_spec(
            format!("{field}.name"),
            format!(
                "{} is not a kubelet flag name (a-z 0-9 -, no leading dash)",
                shown(name)
            ),
        ));
    }
    if matches!(name, "provider-id" | "node-labels") {
        return Err(Error::invalid_spec(
            format!("{field}.name"),
            format!("{name} is set by the layer itself (from the machine and the node labels)"),
        ));
    }
    if let Some(space) = value.chars().find(|c| c.is_whitespace()) {
        return Err(Error::invalid_spec(
            format!("{field}.value"),
            format!(
                "the value of kubelet flag {name}, {}, holds whitespace ({space:?}): systemd splits \
                 $KUBELET_KUBEADM_ARGS at whitespace, so the kubelet would get it as two \
                 arguments and not start; give one value (a list flag takes commas)",
                shown(value)
            ),
        ));
    }
    if value
        .chars()
        .any(|c| c.is_control() || c == '"' || c == '\'' || c == '\\')
    {
        return Err(Error::invalid_spec(
            format!("{field}.value"),
            format!(
                "{} holds a quote, backslash or control character",
                shown(value)
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        for ok in [
            "10.0.0.1:6443",
            "api.example.com:443",
            "[fd00::1]:6443",
            "cp:6443",
        ] {
            endpoint("e", ok).unwrap();
        }
        for bad in [
            "10.0.0.1",
            "api:0",
            "api:65536",
            ":6443",
            "a b:6443",
            "[fd00::1:6443",
            "api:06443",
            "-a:1",
        ] {
            assert_eq!(endpoint("e", bad).unwrap_err().field(), Some("e"), "{bad}");
        }
    }

    #[test]
    fn tokens_and_hashes() {
        token("t", "abcdef.0123456789abcdef").unwrap();
        for bad in [
            "abcdef0123456789abcdef",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdef",
            "abcdef.0123456789abcde!",
        ] {
            let e = token("t", bad).unwrap_err();
            assert!(!e.to_string().contains(bad), "the token leaked: {e}");
        }
        ca_hash("h", &format!("sha256:{}", "a".repeat(64))).unwrap();
        for bad in [
            "sha256:abc".to_owned(),
            "a".repeat(64),
            format!("sha1:{}", "a".repeat(64)),
            format!("sha256:{}", "g".repeat(64)),
        ] {
            assert!(ca_hash("h", &bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_keys() {
        for ok in [
            "tier",
            "example.com/tier",
            "node.kubernetes.io/pool",
            "a.b-c/x_y.z",
        ] {
            qualified_name("k", ok, true).unwrap();
        }
        for bad in [
            "",
            "-x",
            "Example.com/x",
            "a/b/c",
            "x/",
            "node-role.kubernetes.io/worker",
            "k8s.io/x",
            &"a".repeat(64),
        ] {
            assert!(qualified_name("k", bad, true).is_err(), "{bad}");
        }
        qualified_name("k", "node-role.kubernetes.io/control-plane", false).unwrap();
    }
}
