//! The Ansible side's inventory and configuration, alike for every benchmark that
//! compares with Ansible (`examples/bench_ssh.rs`, `tests/examples/bench_recipes_ansible.rs`):
//! 50 forks, pipelining, one multiplexed connection per host, host keys checked.
//! Included with `#[path]`.

use std::path::Path;

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
