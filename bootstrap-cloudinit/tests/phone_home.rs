//! phone_home received from cloud-init's own module (`cc_phone_home.handle`), which
//! posts with cloud-init's URL helper exactly as on a booting machine. Such a post
//! carries no verdict, so it does not complete the machine; the verdict posts of the
//! completion waiter are proven on a booted root in tests/composed.rs.

mod peers;

use std::sync::Arc;

use bootstrap_cloudinit::{PhoneHomeCheck, PhoneHomeListener, render};
use machine_core::{
    Completion, CompletionCheck, ExecOutput, ExecRequest, FileUpload, Machine, MachineName, Phase,
    ProviderId, Result, Transport,
};

struct Unused;

#[async_trait::async_trait]
impl Transport for Unused {
    async fn exec(&self, _r: &ExecRequest) -> Result<ExecOutput> {
        panic!("phone_home needs no transport")
    }
    async fn upload(&self, _f: &FileUpload) -> Result<()> {
        panic!("phone_home needs no transport")
    }
    async fn read_file(&self, _p: &str, _m: usize) -> Result<Option<Vec<u8>>> {
        panic!("phone_home needs no transport")
    }
}

const CLOUD_INIT_POSTS: &str = r#"
import sys, json, logging, types
from cloudinit.config import cc_phone_home
cfg = json.loads(sys.stdin.read())
cloud = types.SimpleNamespace(
    get_instance_id=lambda: "i-0abc123",
    get_hostname=lambda fqdn=False: types.SimpleNamespace(hostname="web-1.example.org" if fqdn else "web-1"),
    paths=types.SimpleNamespace(),
)
cc_phone_home.util.fetch_ssl_details = lambda paths=None: {}
cc_phone_home.handle("phone_home", cfg, cloud, logging.getLogger(), [])
print("posted")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_init_own_phone_home_post_is_recorded_but_is_no_verdict() {
    let listener = Arc::new(
        PhoneHomeListener::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap(),
    );
    let check = PhoneHomeCheck::new(listener.clone(), "127.0.0.1");
    let parts = check.user_data_parts(&machine_core::MachineSpec::new(
        machine_core::MachineName::new("web-1").unwrap(),
    ));
    assert_eq!(parts.len(), 1);
    assert_eq!(
        parts[0].format,
        machine_core::UserDataFormat::ShellScript,
        "the completion waiter, not a phone_home entry"
    );
    let typed = bootstrap_cloudinit::CloudConfig {
        phone_home: Some(check.phone_home()),
        ..Default::default()
    };
    let doc = render(&typed).unwrap();
    assert!(doc.contains("/phone-home/$INSTANCE_ID"));
    peers::assert_valid_cloud_config(&doc);

    let machine = Machine::new(
        MachineName::new("web-1").unwrap(),
        ProviderId::new("aws:///us-east-1a/i-0abc123").unwrap(),
        Phase::Provisioned,
    );
    assert_eq!(
        check.check(&machine, &Unused).await.unwrap(),
        Completion::Pending
    );

    // cloud-init's module reads the same document (as PyYAML gives it) and posts.
    let cfg = peers::pyyaml_load_all(&[doc]).remove(0);
    let cfg_text = cfg.to_string();
    let out =
        tokio::task::spawn_blocking(move || peers::python(CLOUD_INIT_POSTS, cfg_text.as_bytes()))
            .await
            .unwrap();
    assert_eq!(out.trim(), "posted");

    let report = listener.report("i-0abc123").expect("cloud-init posted");
    assert_eq!(report.fields["instance_id"], "i-0abc123");
    assert_eq!(report.fields["hostname"], "web-1");
    assert_eq!(report.fields["fqdn"], "web-1.example.org");
    assert!(report.fields.contains_key("pub_key_ed25519"));
    assert_eq!(
        check.check(&machine, &Unused).await.unwrap(),
        Completion::Pending,
        "cloud-init's module posts even after a failed part: its post is no verdict"
    );
}

#[tokio::test]
async fn bad_requests_are_refused_and_not_recorded() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = PhoneHomeListener::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    for (req, status) in [
        ("GET /phone-home/x HTTP/1.1\r\nHost: a\r\n\r\n", "405"),
        (
            "POST /elsewhere HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            "404",
        ),
        ("NOT HTTP\r\n\r\n", "400"),
    ] {
        let mut s = tokio::net::TcpStream::connect(listener.local_addr())
            .await
            .unwrap();
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(
            out.starts_with(&format!("HTTP/1.1 {status}")),
            "{req:?} -> {out}"
        );
    }
    assert!(listener.report("x").is_none());
}
