//! The password never shows: not in Debug of config or provider, not in errors, not in
//! any log line at TRACE level (ours, reqwest's, hyper's, rustls') through a whole
//! create and delete.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use machine_core::{MachineProvisioner, SecretString};
use provider_vsphere::{VsphereConfig, VsphereProvider};

use common::Vcsim;

const CANARY: &str = "canary-pw-7f3e91";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_password_appears_nowhere() {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .finish(),
    )
    .expect("one subscriber per test binary");

    let vcsim = Vcsim::start();
    let config = common::config(&vcsim, &common::owner("secret"))
        .password(SecretString::from(CANARY))
        .build()
        .expect("config");
    assert!(!format!("{config:?}").contains(CANARY));
    let p = VsphereProvider::new(config).expect("provider");
    assert!(!format!("{p:?}").contains(CANARY));
    let m = p
        .create(&common::spec_named("sec-1"), None)
        .await
        .expect("create");
    p.delete(&m.provider_id).await.expect("delete");
    p.logout().await.expect("logout");
    // An error path too: a config that fails at build.
    let e = VsphereConfig::from_yaml(&format!("password: {{x: {CANARY}}}\n")).unwrap_err();
    assert!(!e.to_string().contains(CANARY), "{e}");

    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(text.contains("logged in"), "the log capture saw nothing");
    assert!(!text.contains(CANARY), "the password was logged");
}
