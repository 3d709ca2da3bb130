//! User data by reference for Ignition (issue 27, item 3): the real `ignition` binary
//! (Debian's 2.14, stages `fetch` and `files` on the `file` platform, into a root of
//! the test's own) runs the stub machine-core makes, fetches the document from the
//! served-once HTTPS store (trusting its certificate alone), verifies its SHA-512 and
//! writes its files; a tampered document is refused and nothing of it is written.

mod peers;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bootstrap_cloudinit::{CloudConfig, WriteFile, to_ignition};
use bootstrap_store::{DocumentState, HttpsStore, HttpsStoreConfig, Network};
use machine_core::MachineName;
use machine_core::bootstrap_data::{BootstrapDataStore, ignition_stub};

const IGNITION: &str = "/usr/lib/dracut/modules.d/30ignition/ignition";
const CANARY: &str = "canary-ignition-secret-7c1e";

async fn store() -> HttpsStore {
    HttpsStore::start(
        HttpsStoreConfig::new("127.0.0.1:0".parse().unwrap())
            .allow(Network::parse("127.0.0.1").unwrap()),
    )
    .await
    .unwrap()
}

fn document() -> Vec<u8> {
    document_with_role("worker")
}

fn document_with_role(role: &str) -> Vec<u8> {
    let config = CloudConfig::new()
        .with_file(
            WriteFile::new("/etc/node/join-token", format!("{CANARY}\n")).permissions("0600"),
        )
        .with_file(WriteFile::new("/etc/node/role", format!("{role}\n")).permissions("0644"));
    to_ignition(&config).unwrap().into_bytes()
}

/// Runs one Ignition stage with `stub` as the platform's config; its log and success.
fn stage(dir: &Path, stub: &Path, stage: &str) -> (bool, String) {
    let out = Command::new(IGNITION)
        .args(["-platform", "file", "-stage", stage, "-log-to-stdout"])
        .arg("-root")
        .arg(dir.join("root"))
        .arg("-config-cache")
        .arg(dir.join("ignition.json"))
        .arg("-state-file")
        .arg(dir.join("state"))
        .arg("-neednet")
        .arg(dir.join("neednet"))
        .args(["-fetch-timeout", "20s"])
        .env("IGNITION_CONFIG_FILE", stub)
        .env("PATH", path_with_setfiles(dir))
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {IGNITION}: {e}; run scripts/peers/20-cloud-init.sh")
        });
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), log)
}

/// `PATH` with a `setfiles` that relabels nothing first: Debian's Ignition relabels
/// what it wrote with SELinux's `setfiles` whatever the root's SELinux mode, and this
/// host has no SELinux (labels are no part of what these tests check).
fn path_with_setfiles(dir: &Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let setfiles = bin.join("setfiles");
    std::fs::write(&setfiles, "#!/bin/sh\ncat >/dev/null\n").unwrap();
    std::fs::set_permissions(&setfiles, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".to_owned())
    )
}

fn setup(stub: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    // The files stage reads the root's SELinux mode to decide whether to relabel.
    std::fs::create_dir_all(dir.path().join("root/etc/selinux")).unwrap();
    std::fs::write(
        dir.path().join("root/etc/selinux/config"),
        "SELINUX=disabled\nSELINUXTYPE=targeted\n",
    )
    .unwrap();
    let stub_path = dir.path().join("stub.ign");
    std::fs::write(&stub_path, stub).unwrap();
    (dir, stub_path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignition_applies_the_verified_document_and_the_store_serves_it_once() {
    peers::need(IGNITION);
    let store = store().await;
    let name = MachineName::new("core-1").unwrap();
    let doc = document();
    let location = store.put(&name, &doc).await.unwrap();
    store
        .expect_clients(&name, &["127.0.0.1".parse().unwrap()])
        .await
        .unwrap();
    let stub = ignition_stub(&location, &doc, Duration::from_secs(10)).unwrap();
    let stub_text = String::from_utf8(stub.bytes.clone()).unwrap();
    peers::assert_valid_ignition(&stub_text);
    assert!(!stub_text.contains(CANARY));
    let (dir, stub_path) = setup(&stub_text);

    let fetch = tokio::task::spawn_blocking({
        let (d, s) = (dir.path().to_owned(), stub_path.clone());
        move || stage(&d, &s, "fetch")
    })
    .await
    .unwrap();
    assert!(fetch.0, "fetch stage failed:\n{}", fetch.1);
    let files = tokio::task::spawn_blocking({
        let (d, s) = (dir.path().to_owned(), stub_path.clone());
        move || stage(&d, &s, "files")
    })
    .await
    .unwrap();
    assert!(files.0, "files stage failed:\n{}", files.1);

    let root = dir.path().join("root");
    let token = root.join("etc/node/join-token");
    assert_eq!(
        std::fs::read_to_string(&token).unwrap(),
        format!("{CANARY}\n")
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&token).unwrap().permissions().mode() & 0o7777,
        0o600
    );
    assert_eq!(
        std::fs::read_to_string(root.join("etc/node/role")).unwrap(),
        "worker\n"
    );
    // Served once: the store says so, and a second Ignition with the same stub gets 410.
    assert_eq!(store.state_of(&name), Some(DocumentState::Served));
    let (again_dir, again_stub) = setup(&stub_text);
    let again = tokio::task::spawn_blocking({
        let d = again_dir.path().to_owned();
        move || stage(&d, &again_stub, "fetch")
    })
    .await
    .unwrap();
    assert!(!again.0, "a replayed stub fetched again:\n{}", again.1);
    assert!(
        again.1.contains("GET result: Gone"),
        "not refused with 410 Gone:\n{}",
        again.1
    );
    assert!(!again_dir.path().join("root/etc/node/join-token").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignition_refuses_a_tampered_document() {
    peers::need(IGNITION);
    let store = store().await;
    let name = MachineName::new("core-2").unwrap();
    let doc = document();
    // The stub verifies `doc`; the store serves other bytes (a tampered document).
    let tampered = document_with_role("master");
    assert_ne!(tampered, doc);
    let location = store.put(&name, &tampered).await.unwrap();
    store
        .expect_clients(&name, &["127.0.0.1".parse().unwrap()])
        .await
        .unwrap();
    let stub = ignition_stub(&location, &doc, Duration::from_secs(10)).unwrap();
    let (dir, stub_path) = setup(std::str::from_utf8(&stub.bytes).unwrap());
    let fetch = tokio::task::spawn_blocking({
        let d = dir.path().to_owned();
        move || stage(&d, &stub_path, "fetch")
    })
    .await
    .unwrap();
    assert!(!fetch.0, "a tampered document was accepted:\n{}", fetch.1);
    assert!(
        fetch.1.contains("hash verification failed"),
        "the refusal does not name the hash:\n{}",
        fetch.1
    );
    // Nothing of it is kept for the files stage, nor written.
    let master = "bWFzdGVyCg=="; // base64 of "master\n"
    let cached = std::fs::read_to_string(dir.path().join("ignition.json")).unwrap_or_default();
    assert!(!cached.contains(master), "{cached}");
    assert!(!dir.path().join("root/etc/node").exists());
}
