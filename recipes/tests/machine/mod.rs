//! Recipe layers applied to real Debian roots in chroots: coupled through the real
//! cloud-init's four boot stages (bootstrap-cloudinit's harness, reused by path), and
//! decoupled by the layer's own step runner over a transport into another root. The
//! roots are provider-local's (scripts/peers/40-local-root.sh): Debian 12 with
//! cloud-init and sudo.
#![allow(dead_code)]

#[path = "../../../bootstrap-cloudinit/tests/peers/mod.rs"]
pub mod peers;

use std::path::PathBuf;

use async_trait::async_trait;
use machine_core::{
    DecoupledSoftware, Error, ExecOutput, ExecRequest, FileUpload, Machine, MachineName, Phase,
    ProviderId, Result, Transport,
};
pub use peers::root::Root;
use recipes::RecipeLayer;

/// The log every stub appends to, one call a line.
pub const CALLS: &str = "/var/log/stub.calls";

fn local_root() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache"));
    let dir = cache.join("machine-provisioning/bookworm-local");
    assert!(
        dir.join("usr/bin/cloud-init").exists() && dir.join("usr/sbin/visudo").exists(),
        "{} has no Debian root with cloud-init and sudo: run scripts/peers/20-cloud-init.sh then scripts/peers/40-local-root.sh",
        dir.display()
    );
    dir
}

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

/// A fresh root whose first boot would run `user_data`, with `stubs` (tool name, script)
/// installed in /usr/sbin (first in the chroot's PATH) as the image's own programs.
pub fn root(user_data: &[u8], stubs: &[(&str, String)]) -> Root {
    let root = Root::over(local_root(), user_data, &unique("recipes"));
    for (tool, script) in stubs {
        let path = root.upper(&format!("/usr/sbin/{tool}"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, script).unwrap();
        set_mode(&path, 0o755);
    }
    root
}

fn set_mode(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A recording stand-in for `tool`: appends `tool args` to [`CALLS`] and succeeds;
/// queries (`rpm -q`, `apk info`) answer "not installed" without being recorded.
pub fn stub(tool: &str) -> String {
    format!(
        "#!/bin/sh\n# Test stub for {tool}: records the call, installs nothing.\n\
         case \"{tool} $1\" in 'rpm -q'*|'apk info') exit 1 ;; esac\n\
         printf '%s\\n' \"{tool} $*\" >> {CALLS}\n"
    )
}

/// Boots `root` through cloud-init's four stages as distro `distro` (cloud-init's
/// `system_info.distro`: its package code is that distro's).
pub fn boot(root: &Root, distro: Option<&str>) {
    if let Some(d) = distro {
        std::fs::write(
            root.upper("/etc/cloud/cloud.cfg.d/95-distro.cfg"),
            format!("system_info:\n  distro: {d}\n"),
        )
        .unwrap();
    }
    root.boot();
}

/// cloud-init's result of the boot: `(status line, errors)`.
pub fn cloud_init_result(root: &Root) -> String {
    String::from_utf8_lossy(&root.run("cat /run/cloud-init/result.json").stdout).into_owned()
}

/// A transport into `root`: commands run in it, uploads land in its files.
pub struct Chroot<'a>(pub &'a Root);

#[async_trait]
impl Transport for Chroot<'_> {
    async fn exec(&self, request: &ExecRequest) -> Result<ExecOutput> {
        let out = self.0.run(&request.command);
        Ok(ExecOutput::new(out.status.code(), out.stdout, out.stderr))
    }
    async fn upload(&self, f: &FileUpload) -> Result<()> {
        let path = self.0.upper(&f.path);
        std::fs::create_dir_all(path.parent().unwrap())
            .and_then(|()| std::fs::write(&path, &f.content))
            .map_err(|e| Error::permanent(format!("upload {}: {e}", f.path)))?;
        set_mode(&path, f.mode);
        Ok(())
    }
    async fn read_file(&self, path: &str, _max: usize) -> Result<Option<Vec<u8>>> {
        Ok(std::fs::read(self.0.upper(path)).ok())
    }
}

/// Applies `layer` decoupled to `root`.
pub async fn apply(layer: &RecipeLayer, root: &Root) -> Result<()> {
    let machine = Machine::new(
        MachineName::new("node").unwrap(),
        ProviderId::new("chroot://node").unwrap(),
        Phase::Provisioned,
    );
    layer.decoupled()?.apply(&machine, &Chroot(root)).await
}

/// `path` on the machine as `mode owner:group\ncontent`, or `absent`.
pub fn file_state(root: &Root, path: &str) -> String {
    let out = root.run(&format!(
        "if [ -e {path} ]; then stat -c '%a %U:%G' {path}; cat {path}; else echo absent; fi"
    ));
    String::from_utf8_lossy(&out.stdout).into_owned()
}
