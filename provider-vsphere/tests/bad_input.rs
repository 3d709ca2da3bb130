//! Bad input is refused before any call, naming the field; a server answering garbage
//! or hanging up mid-answer gives an error with a kind, never a panic.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use machine_core::{
    ErrorKind, MachineName, MachineProvisioner, MachineSpec, SecretString, UserData, UserDataFormat,
};
use provider_vsphere::{USER_DATA_LIMIT, VsphereConfig, VsphereProvider};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A loopback HTTP server that counts connections and answers each with `answer`.
async fn server(answer: &'static [u8]) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/sdk", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let _ = stream.read(&mut buf).await;
                let _ = stream.write_all(answer).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (url, count)
}

fn provider(url: &str) -> VsphereProvider {
    VsphereProvider::new(
        VsphereConfig::builder()
            .url(url)
            .insecure(true)
            .username("u")
            .password(SecretString::from("p"))
            .datacenter("DC0")
            .build()
            .unwrap(),
    )
    .unwrap()
}

fn spec() -> MachineSpec {
    MachineSpec::new(MachineName::new("m-1").unwrap())
        .with_image("DC0/vm/t")
        .with_provider(serde_json::json!({"resourcePool": "DC0/host/h/Resources"}))
}

#[tokio::test]
async fn bad_specs_are_refused_by_field_before_any_call() {
    let (url, count) =
        server(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n").await;
    let p = provider(&url);
    let big = UserData::new(
        UserDataFormat::CloudConfig,
        (0..USER_DATA_LIMIT)
            .map(|_| fastrand::alphanumeric())
            .collect::<String>(),
    );
    let cases: Vec<(MachineSpec, Option<UserData>, &str)> = vec![
        (spec().with_image(""), None, "image"),
        (spec().with_size("0x1024"), None, "size"),
        (spec().with_size("2x1023"), None, "size"),
        (spec().with_size("large"), None, "size"),
        (
            spec().with_provider(serde_json::json!({"resourcePool": "p", "numCPUs": 0})),
            None,
            "provider.numCPUs",
        ),
        (
            spec().with_provider(serde_json::json!({"resourcePool": "p", "memoryMiB": 6})),
            None,
            "provider.memoryMiB",
        ),
        (
            spec().with_provider(serde_json::json!({"resourcePool": "p", "folder": ""})),
            None,
            "provider.folder",
        ),
        (
            spec().with_provider(serde_json::json!({"resourcePool": "p", "colour": "red"})),
            None,
            "provider.colour",
        ),
        (
            spec().with_provider(serde_json::json!({})),
            None,
            "provider.resourcePool",
        ),
        (spec(), Some(big), "userData"),
    ];
    for (spec, ud, field) in cases {
        let e = p.create(&spec, ud.as_ref()).await.expect_err(field);
        assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{field}: {e}");
        assert_eq!(e.field(), Some(field), "{e}");
    }
    assert_eq!(
        count.load(Ordering::SeqCst),
        0,
        "a call was made for a bad spec"
    );
}

#[tokio::test]
async fn garbage_and_cut_answers_are_errors_with_a_kind() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n<a><b></a"[..],
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnope",
        b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n<?xml version=\"1.0\"?><soapenv:Env",
        b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n<x:y>unbound</x:y>  ",
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
        b"",
    ] {
        let (url, _) = server(answer).await;
        let e = provider(&url)
            .find(&MachineName::new("m-1").unwrap())
            .await
            .expect_err("garbage accepted");
        assert!(
            e.is_retryable(),
            "{:?}: {e}",
            String::from_utf8_lossy(answer)
        );
    }
}
