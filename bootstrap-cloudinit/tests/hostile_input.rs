//! Inputs a user (or anyone who can reach the phone-home port) can write that once made
//! this crate allocate without bound or panic: each is refused with a clear error.

use std::io::Write;
use std::net::SocketAddr;

use base64::Engine;
use bootstrap_cloudinit::{MAX_DECODED_CONTENT, PhoneHomeListener, parse};
use machine_core::ErrorKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One gzip member of `mib` MiB of zeros (about 1 KiB per MiB compressed: deflate's best ratio).
fn gz_zeros(mib: usize) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..mib {
        enc.write_all(&chunk).unwrap();
    }
    enc.finish().unwrap()
}

fn gz_file(path: &str, gz: &[u8]) -> String {
    format!(
        "  - path: {path}\n    encoding: gz+b64\n    content: {}\n",
        base64::engine::general_purpose::STANDARD.encode(gz)
    )
}

#[test]
fn a_small_document_whose_gzip_content_decodes_past_the_limit_is_refused_naming_the_file() {
    // 50 gzip members of 4 MiB each: 200 MiB in a document of a few hundred KB.
    let member = gz_zeros(4);
    let bomb: Vec<u8> = member.repeat(50);
    let doc = format!(
        "#cloud-config\nwrite_files:\n{}{}",
        gz_file("/etc/small", &gz_zeros(1)),
        gz_file("/etc/bomb", &bomb)
    );
    assert!(doc.len() < 300_000, "{}", doc.len());
    let (e, took) = machine_core::conformance::cpu_time(|| parse(&doc, &[]).unwrap_err());
    assert_eq!(e.kind(), ErrorKind::InvalidSpec);
    assert_eq!(e.field(), Some("write_files[1]"), "{e}");
    assert!(e.to_string().contains("decodes to more than 64 MiB"), "{e}");
    assert!(e.to_string().contains("line 6"), "{e}");
    // Work, not wall time: decoding stops at the limit, far from all 200 MiB.
    assert!(took.as_secs() < 20, "used {took:?} of CPU");
}

#[test]
fn the_decode_limit_holds_for_all_files_of_a_document_together() {
    // Each file alone is under the limit; together they are over it.
    let each = gz_zeros(8);
    let files = MAX_DECODED_CONTENT / (8 << 20) + 1;
    let mut doc = String::from("#cloud-config\nwrite_files:\n");
    for i in 0..files {
        doc.push_str(&gz_file(&format!("/etc/f{i}"), &each));
    }
    let e = parse(&doc, &[]).unwrap_err();
    assert_eq!(
        e.field(),
        Some(format!("write_files[{}]", files - 1).as_str()),
        "{e}"
    );
    assert!(
        e.to_string().contains("all encoded write_files contents"),
        "{e}"
    );
    // One file fewer fits, and every byte is there.
    let fits = doc
        .lines()
        .take(2 + 3 * (files - 1))
        .collect::<Vec<_>>()
        .join("\n");
    let c = parse(&fits, &[]).unwrap();
    assert_eq!(c.write_files.len(), files - 1);
    assert_eq!(c.write_files[0].content.bytes().len(), 8 << 20);
}

async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the listener answers")
        .unwrap_or_default();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn phone_home_refuses_huge_and_malformed_content_lengths_without_panicking() {
    let listener = PhoneHomeListener::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = listener.local_addr();
    let post = |len: &str| {
        format!("POST /phone-home/i-1 HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n")
    };
    for (len, status) in [
        ("18446744073709551615", "413"),
        ("99999999999999999999999999", "413"),
        ("70000", "413"),
        ("-1", "400"),
        ("+5", "400"),
        ("1e3", "400"),
        ("5, 6", "400"),
    ] {
        let answer = exchange(addr, post(len).as_bytes()).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "Content-Length {len}: {answer:?}"
        );
    }
    let answer = exchange(
        addr,
        b"POST /phone-home/i-1 HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\na=b",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer:?}");
    assert!(listener.report("i-1").is_none());
    // The listener still serves a well-formed post.
    let body = "instance_id=i-1&hostname=web-1";
    let answer = exchange(
        addr,
        format!("{}{body}", post(&body.len().to_string())).as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
    assert_eq!(listener.report("i-1").unwrap().fields["hostname"], "web-1");
}
