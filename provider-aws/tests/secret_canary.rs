//! One canary, every secret-bearing field, every output: a unique string is put in a
//! password hash, a host private key, a secret file, secret template variables, the AWS
//! secret key and so the user data; then Debug, Display, every reachable error and the
//! whole TRACE log (the AWS SDK's included, against moto) are searched for it, in clear
//! and base64-encoded.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use base64::Engine;
use bootstrap_cloudinit::{
    Bootstrap, CloudConfig, CloudConfigLayer, Content, Output, Secret, SecretVars, SshHostKeys,
    Templates, User, WriteFile, merge, parse,
};
use common::Moto;
use machine_core::{MachineProvisioner, SecretString};
use serde_json::json;

const CANARY: &str = "CanaryQ7vWz3Kp9";
const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHx4bmxvZ2luLWtleS1mb3ItdGVzdHMtb25seQ ops@laptop";

/// Every form the canary can take in an output: as is, and base64 at each alignment
/// (the user data travels base64-encoded, and form-encoded on the wire).
fn forms() -> Vec<String> {
    let mut out = vec![CANARY.to_owned()];
    for k in 0..3 {
        let mut bytes = vec![b'x'; k];
        bytes.extend_from_slice(CANARY.as_bytes());
        let enc = base64::engine::general_purpose::STANDARD_NO_PAD.encode(&bytes);
        let start = if k == 0 { 0 } else { 4 };
        let end = 4 * (bytes.len() / 3);
        let fragment = &enc[start..end];
        out.push(fragment.to_owned());
        out.push(fragment.replace('+', "%2B").replace('/', "%2F"));
    }
    out
}

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
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

fn secret(what: &str) -> Secret {
    Secret::new(format!("{CANARY}-{what}"))
}

fn private_key(what: &str) -> Secret {
    Secret::new(format!(
        "-----BEGIN OPENSSH PRIVATE KEY-----\n{CANARY}{what}\n-----END OPENSSH PRIVATE KEY-----\n"
    ))
}

/// Debug (both forms) of `value`.
fn debug(out: &mut Vec<(String, String)>, what: &str, value: &impl std::fmt::Debug) {
    out.push((format!("{what} Debug"), format!("{value:?}")));
    out.push((format!("{what} Debug#"), format!("{value:#?}")));
}

/// Display and Debug of an error, which must be one.
fn error<T>(out: &mut Vec<(String, String)>, what: &str, result: machine_core::Result<T>) {
    match result {
        Ok(_) => panic!("{what}: expected an error"),
        Err(e) => {
            out.push((format!("{what} error"), e.to_string()));
            debug(out, &format!("{what} error"), &e);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_debug_display_errors_or_trace_logs() {
    let logs = Buffer::default();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(logs.clone())
            .finish(),
    )
    .expect("the only subscriber of this test binary");
    let mut seen: Vec<(String, String)> = Vec::new();

    // A typed layer with a password hash, a host private key and a secret file.
    let base = CloudConfig {
        ssh_keys: Some(SshHostKeys {
            ed25519_private: Some(private_key("hostkey")),
            ed25519_public: Some(KEY.to_owned()),
            ..SshHostKeys::default()
        }),
        ..CloudConfig::new()
            .with_user(User {
                hashed_passwd: Some(secret("hash")),
                ..User::admin("ops", [KEY.to_owned()])
            })
            .with_file(
                WriteFile::new("/etc/token", Content::Secret(secret("file"))).permissions("0600"),
            )
    };
    debug(&mut seen, "CloudConfig", &base);
    let base = CloudConfigLayer::new("base", base).unwrap();
    debug(&mut seen, "CloudConfigLayer", &base);

    // A template layer with secret variables.
    let template = "#cloud-config\nusers:\n  - name: app\n    hashed_passwd: {{ app_hash }}\nwrite_files:\n  - path: /etc/db.conf\n    content: |\n      user={{ user }}\n      password={{ db_password }}\n";
    let vars = SecretVars::new()
        .with("app_hash", secret("tmplhash"))
        .with("db_password", secret("tmplvar"));
    debug(&mut seen, "SecretVars", &vars);
    let app = CloudConfigLayer::from_template_with_secrets(
        "app",
        template,
        &json!({"user": "app"}),
        &vars,
        &[],
    )
    .unwrap();
    debug(&mut seen, "template CloudConfigLayer", &app);
    debug(&mut seen, "template CloudConfig", app.config());
    let mut templates = Templates::new();
    templates.add("t.yaml", template).unwrap();
    debug(&mut seen, "Templates", &templates);
    let rendered = templates
        .render_with_secrets("t.yaml", &json!({"user": "app"}), &vars)
        .unwrap();
    debug(&mut seen, "render_with_secrets", &rendered);

    // Merged: the secret file stays secret.
    let merged = merge([("base", base.config()), ("app", app.config())]).unwrap();
    debug(&mut seen, "merged CloudConfig", &merged);
    assert!(
        merged.write_files.iter().all(|f| f.content.is_secret()),
        "merge kept every secret file secret"
    );
    let bootstrap = Bootstrap::new("web", vec![base.clone(), app.clone()]).unwrap();
    debug(&mut seen, "Bootstrap", &bootstrap);
    let multipart = bootstrap.clone().output(Output::Multipart);
    debug(&mut seen, "Bootstrap multipart", &multipart);

    // Errors next to or about secrets.
    for (what, doc) in [
        (
            "parse: error on the line after a hash",
            format!(
                "#cloud-config\nusers:\n  - name: ops\n    hashed_passwd: {CANARY}\n    lock_passwd: maybe\n"
            ),
        ),
        (
            "parse: hash of the wrong form",
            format!("#cloud-config\nusers:\n  - name: ops\n    hashed_passwd: [{CANARY}]\n"),
        ),
        (
            "parse: unknown key beside a private key",
            format!("#cloud-config\nssh_keys:\n  ed25519_private: {CANARY}\n  bogus: 1\n"),
        ),
        (
            "parse: file content of the wrong form",
            format!(
                "#cloud-config\nwrite_files:\n  - path: /etc/x\n    content: {{a: {CANARY}}}\n"
            ),
        ),
        (
            "parse: content not base64",
            format!(
                "#cloud-config\nwrite_files:\n  - path: /etc/x\n    encoding: b64\n    content: \"{CANARY}!!\"\n"
            ),
        ),
        ("parse: no header", format!("{CANARY}\nhostname: x\n")),
        (
            "parse: syntax error after a secret",
            format!(
                "#cloud-config\nwrite_files:\n  - path: /etc/x\n    content: {CANARY}\n  - [unclosed\n"
            ),
        ),
    ] {
        error(&mut seen, what, parse(&doc, &[]));
    }
    let other_key = CloudConfig {
        ssh_keys: Some(SshHostKeys {
            ed25519_private: Some(private_key("otherkey")),
            ed25519_public: Some(KEY.to_owned()),
            ..SshHostKeys::default()
        }),
        ..CloudConfig::new()
    };
    error(
        &mut seen,
        "merge: two private keys",
        merge([("base", base.config()), ("other", &other_key)]),
    );
    error(
        &mut seen,
        "layer: private key without public key",
        CloudConfigLayer::new(
            "bad",
            CloudConfig {
                ssh_keys: Some(SshHostKeys {
                    ed25519_private: Some(private_key("lonely")),
                    ..SshHostKeys::default()
                }),
                ..CloudConfig::new()
            },
        ),
    );
    let mut t = Templates::new();
    t.add(
        "leak.yaml",
        "#cloud-config\nruncmd:\n  - echo {{ db_password }}\n",
    )
    .unwrap();
    t.add(
        "int.yaml",
        "#cloud-config\nhostname: h{{ db_password | int }}\n",
    )
    .unwrap();
    t.add(
        "type.yaml",
        "#cloud-config\nssh_pwauth: {{ db_password }}\n",
    )
    .unwrap();
    t.add(
        "undef.yaml",
        "#cloud-config\nhostname: {{ db_password }}{{ nope }}\n",
    )
    .unwrap();
    t.add(
        "anchor.yaml",
        "#cloud-config\nhostname: &{{ db_password }} x\n",
    )
    .unwrap();
    for name in [
        "leak.yaml",
        "int.yaml",
        "type.yaml",
        "undef.yaml",
        "anchor.yaml",
    ] {
        error(
            &mut seen,
            &format!("template {name}"),
            t.render_cloud_config_with_secrets(name, &json!({}), &vars, &[]),
        );
        error(
            &mut seen,
            &format!("template {name} as text"),
            t.render_with_secrets(name, &json!({}), &vars)
                .and_then(|_| Err::<(), _>(machine_core::Error::permanent("rendered"))),
        );
    }
    error(
        &mut seen,
        "template: a variable both plain and secret",
        t.render_with_secrets("leak.yaml", &json!({"db_password": "x"}), &vars),
    );

    // AWS: the secret key and the user data, through moto at TRACE.
    let moto = Moto::start();
    let owner = common::owner("canary");
    let config = common::config(&moto.endpoint, &owner)
        .static_credentials(
            "AKIDCANARYTEST",
            SecretString::from(format!("{CANARY}-aws")),
        )
        .build()
        .unwrap();
    debug(&mut seen, "AwsConfig", &config);
    let provider = provider_aws::AwsProvider::new(config).await.unwrap();
    debug(&mut seen, "AwsProvider", &provider);
    let delivery = provider
        .capabilities()
        .user_data
        .clone()
        .expect("EC2 takes user data");
    let built = bootstrap.build(&delivery).unwrap();
    debug(&mut seen, "Built", &built);
    seen.push(("SizeReport Display".into(), built.report.to_string()));
    // The canary really is in the user data sent (in clear or in its base64), so
    // finding nothing below means something.
    let ud_text = String::from_utf8_lossy(&built.user_data.decoded().unwrap()).into_owned();
    assert!(ud_text.contains(CANARY), "the canary is in the user data");
    let machine = provider
        .create(&common::spec("canary-1"), Some(&built.user_data))
        .await
        .unwrap();
    debug(&mut seen, "Machine", &machine);
    let back = provider
        .user_data(&machine.provider_id)
        .await
        .unwrap()
        .expect("user data reads back");
    debug(&mut seen, "UserData read back", &back);
    assert_eq!(back.bytes, built.user_data.bytes, "moto kept the user data");
    error(
        &mut seen,
        "create with user data over the limit",
        provider
            .create(
                &common::spec("canary-2"),
                Some(&machine_core::UserData {
                    bytes: format!("#cloud-config\n# {CANARY}\n")
                        .repeat(2000)
                        .into_bytes(),
                    ..built.user_data.clone()
                }),
            )
            .await,
    );
    provider.delete(&machine.provider_id).await.unwrap();

    let log = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(
        log.contains("transmitting request") && log.contains("RunInstances"),
        "the SDK logged its requests at TRACE"
    );
    seen.push(("TRACE log".into(), log));
    for (what, text) in &seen {
        for form in forms() {
            if let Some(at) = text.find(&form) {
                let from = text[..at]
                    .char_indices()
                    .rev()
                    .nth(200)
                    .map_or(0, |(i, _)| i);
                panic!(
                    "{what} shows the canary ({form}):\n...{}",
                    &text[from..(at + form.len()).min(text.len())]
                );
            }
        }
    }
}
