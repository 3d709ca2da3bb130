//! The Ansible side's inventory and configuration, alike for every benchmark that
//! compares with Ansible (`examples/bench_ssh.rs`, `tests/examples/bench_recipes_ansible.rs`,
//! `tests/examples/bench_fleet_inplace.rs`): 50 forks, pipelining, one multiplexed
//! connection per host, host keys checked; where the peers are installed, and the keys
//! both sides log in with. Included with `#[path]`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where `scripts/peers` keep what they install for benchmarks (Ansible's venv, the
/// bench root): `$XDG_CACHE_HOME/machine-provisioning`, `~/.cache/...` by default.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        })
        .join("machine-provisioning")
}

/// `ansible-playbook` of the venv `WITH_BENCH_PEERS=1 scripts/peers/10-openssh.sh` makes.
pub fn playbook_bin() -> PathBuf {
    cache_dir().join("ansible/bin/ansible-playbook")
}

/// Makes an ed25519 key pair without passphrase at `path` (and `path.pub`) and returns
/// the public key's line.
pub fn keygen(path: &Path) -> std::io::Result<String> {
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .map_err(|e| {
            std::io::Error::other(format!("ssh-keygen ({e}): run scripts/peers/10-openssh.sh"))
        })?;
    if !status.success() {
        return Err(std::io::Error::other(format!(
            "ssh-keygen for {} failed: {status}",
            path.display()
        )));
    }
    Ok(std::fs::read_to_string(path.with_extension("pub"))?
        .trim()
        .to_owned())
}

/// Writes `inventory` (group `targets` of `hosts`, one inventory line each, reached as
/// root with the private key `key`) and `ansible.cfg` (host keys checked against
/// `known_hosts`, control sockets under `dir/cp`) into `dir`.
pub fn write_setup(
    dir: &Path,
    hosts: &[String],
    key: &Path,
    known_hosts: &Path,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("cp"))?;
    let mut inv = String::from("[targets]\n");
    for h in hosts {
        inv.push_str(h);
        inv.push('\n');
    }
    inv.push_str(&format!(
        "[targets:vars]\nansible_user=root\nansible_python_interpreter=/usr/bin/python3\nansible_ssh_private_key_file={}\n",
        key.display()
    ));
    std::fs::write(dir.join("inventory"), inv)?;
    std::fs::write(
        dir.join("ansible.cfg"),
        format!(
            "[defaults]\nforks = 50\nhost_key_checking = True\ngathering = explicit\nretry_files_enabled = False\nstdout_callback = default\n\
             [ssh_connection]\npipelining = True\ncontrol_path_dir = {cp}\nssh_args = -F /dev/null -o ControlMaster=auto -o ControlPersist=60s -o KexAlgorithms=curve25519-sha256 -o UserKnownHostsFile={kh} -o StrictHostKeyChecking=yes\n",
            cp = dir.join("cp").display(),
            kh = known_hosts.display()
        ),
    )
}
