//! A canary BMC password, used against sushy with basic auth through a whole machine
//! life, is in no Debug, Display, error or TRACE log line (in clear or as the base64 of
//! the Authorization header).

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use base64::Engine;
use machine_core::{MachineName, MachineProvisioner, MachineSpec, PowerOp};
use provider_baremetal::redfish::{RedfishPoolConfig, RedfishProvider};
use provider_http::HttpSettings;

use common::sushy::{Options, Sushy};

const CANARY: &str = "CanaryR3dF1shPw";

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Buffer {
    type Writer = Buffer;
    fn make_writer(&'a self) -> Buffer {
        self.clone()
    }
}

/// The canary as is, and the base64 of `admin:<canary>` (basic auth's header value).
fn forms() -> Vec<String> {
    let header = base64::engine::general_purpose::STANDARD.encode(format!("admin:{CANARY}"));
    vec![CANARY.to_owned(), header[..16].to_owned()]
}

fn assert_clean(what: &str, text: &str) {
    for f in forms() {
        assert!(
            !text.contains(&f),
            "{what} shows the password ({f}):\n{text}"
        );
    }
}

#[test]
fn the_bmc_password_is_never_shown() {
    let log = Buffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(log.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sushy = Sushy::start_with(
            1,
            &Options {
                auth: Some(("admin".into(), CANARY.into())),
                tls: false,
            },
        );
        let claims = tempfile::tempdir().unwrap();
        let yaml = common::pool_yaml(&sushy, claims.path(), "team").replace("bmc-pw-0", CANARY);
        let config = RedfishPoolConfig::from_yaml(&yaml).unwrap();
        assert_clean("the pool's Debug", &format!("{config:?}"));
        let p = RedfishProvider::new(config, &HttpSettings::default())
            .await
            .unwrap();
        assert_clean("the provider's Debug", &format!("{p:?} {p}"));
        let m = p
            .create(&MachineSpec::new(MachineName::new("m").unwrap()), None)
            .await
            .unwrap();
        p.power(&m.provider_id, PowerOp::Reboot).await.unwrap();
        assert_clean("the machine", &format!("{m:?}"));
        p.delete(&m.provider_id).await.unwrap();

        // A refused password: the error names neither it nor the header.
        let wrong = common::pool_yaml(&sushy, claims.path(), "team")
            .replace("bmc-pw-0", &format!("{CANARY}x"));
        let p = RedfishProvider::new(
            RedfishPoolConfig::from_yaml(&wrong).unwrap(),
            &HttpSettings::default(),
        )
        .await
        .unwrap();
        let e = p
            .create(&MachineSpec::new(MachineName::new("m").unwrap()), None)
            .await
            .expect_err("wrong password");
        assert_eq!(e.kind(), machine_core::ErrorKind::Unauthorized, "{e}");
        assert_clean("the error", &format!("{e} {e:?}"));
        // A pool YAML whose password has the wrong type: the message quotes no value.
        let e = RedfishPoolConfig::from_yaml(&yaml.replace(
            &format!("password: {CANARY}"),
            &format!("password: [{CANARY}]"),
        ))
        .expect_err("a list as password");
        assert_clean("the YAML error", &format!("{e} {e:?}"));
        // The password written into a URL: refused naming the field, never shown, nor
        // in a malformed URL, nor by a client built in code.
        let host = sushy.endpoint.trim_start_matches("http://");
        for (bmc, media) in [
            (format!("http://admin:{CANARY}@{host}"), None),
            (format!("'http://admin:{CANARY}@[{host}'"), None),
            (
                sushy.endpoint.clone(),
                Some(format!("'http://seed:{CANARY}@127.0.0.1:9'")),
            ),
        ] {
            let mut bad = common::pool_yaml(&sushy, claims.path(), "team")
                .replace(&format!("bmc: {}", sushy.endpoint), &format!("bmc: {bmc}"));
            if let Some(url) = &media {
                bad = format!("mediaServer: {{url: {url}}}\n{bad}");
            }
            let e = RedfishPoolConfig::from_yaml(&bad).expect_err("a URL with a password");
            let field = if media.is_some() {
                "mediaServer.url"
            } else {
                "servers[0].bmc"
            };
            assert_eq!(e.field(), Some(field), "{e}");
            assert_clean("the URL error", &format!("{e} {e:?}"));
        }
        let client = provider_baremetal::redfish::RedfishClient::new(
            provider_http::HttpClient::new(&HttpSettings::default()).unwrap(),
            format!("http://admin:{CANARY}@{host}").parse().unwrap(),
            provider_baremetal::redfish::BmcCredentials::new(
                "admin",
                machine_core::SecretString::from(CANARY.to_owned()),
            ),
        );
        assert_clean("a client's Debug", &format!("{client:?}"));
    });
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("claimed server"),
        "the log was captured:\n{text}"
    );
    assert_clean("the TRACE log", &text);
}
