//! The served-once HTTPS store against real TLS clients on loopback: what it serves,
//! once, to whom, and what it refuses (wrong, replayed and foreign tokens, clients that
//! are not the machine, slow and oversized requests), staying up for the right clients.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bootstrap_store::{DocumentState, HttpsStore, HttpsStoreConfig, Network};
use machine_core::bootstrap_data::{BootstrapDataStore, Location};
use machine_core::{ExposeSecret, MachineName};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "support/pinned.rs"]
mod pinned;

fn connector(pin: &[u8]) -> tokio_rustls::TlsConnector {
    pinned::pinned_connector(pin.to_vec(), rustls::crypto::aws_lc_rs::default_provider()).unwrap()
}

/// A TCP connection to `to` from the address `from`.
async fn tcp(from: IpAddr, to: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// Sends `request` over TLS from `from` and returns the status and body; `None` when
/// the server cut the connection without an answer.
async fn send(store: &HttpsStore, from: IpAddr, request: &[u8]) -> Option<(u16, Vec<u8>)> {
    let stream = tcp(from, store.addr()).await.ok()?;
    let mut tls = connector(store.certificate_der())
        .connect(ServerName::try_from("store").unwrap(), stream)
        .await
        .ok()?;
    tls.write_all(request).await.ok()?;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), tls.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    let status: u16 = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| out[i + 4..].to_vec())
        .unwrap_or_default();
    Some((status, body))
}

fn path_of(location: &Location) -> String {
    let Location::Https(h) = location else {
        panic!("not an HTTPS location")
    };
    let url = h.url.expose_secret();
    url[url.find("/v1/").unwrap()..].to_owned()
}

async fn get(store: &HttpsStore, from: &str, path: &str) -> Option<(u16, Vec<u8>)> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: store\r\n\r\n");
    send(store, from.parse().unwrap(), req.as_bytes()).await
}

fn name(n: &str) -> MachineName {
    MachineName::new(n).unwrap()
}

async fn store(config: HttpsStoreConfig) -> HttpsStore {
    HttpsStore::start(config).await.unwrap()
}

fn loopback() -> HttpsStoreConfig {
    HttpsStoreConfig::new("127.0.0.1:0".parse().unwrap())
        .allow(Network::parse("127.0.0.0/8").unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_is_served_once_to_its_machine_and_then_gone() {
    let s = store(loopback()).await;
    let web = name("web-1");
    let location = s.put(&web, b"#cloud-config\n{}\n").await.unwrap();
    let path = path_of(&location);
    assert_eq!(path.len(), "/v1/".len() + 64, "a 256-bit token");
    // Before the composer saw the machine's addresses, the stub is asked to come back.
    assert_eq!(get(&s, "127.0.0.1", &path).await.unwrap().0, 503);
    assert_eq!(s.stats().not_yet_bound, 1, "the early fetch is counted");
    s.expect_clients(&web, &["127.0.0.1".parse().unwrap()])
        .await
        .unwrap();
    let (status, body) = get(&s, "127.0.0.1", &path).await.unwrap();
    assert_eq!(
        (status, body.as_slice()),
        (200, &b"#cloud-config\n{}\n"[..])
    );
    assert_eq!(s.state_of(&web), Some(DocumentState::Served));
    assert_eq!(s.documents_in_memory(), 0, "served means gone from memory");
    // Replayed: 410, nothing served.
    let (status, body) = get(&s, "127.0.0.1", &path).await.unwrap();
    assert_eq!((status, body.len()), (410, 0));
    assert!(s.list().await.unwrap().is_empty());
    assert_eq!(s.stats().served, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_bytes_keep_their_url_and_new_bytes_withdraw_the_old_one() {
    let s = store(loopback().with_bind_to_machines(false)).await;
    let web = name("web-1");
    let a = path_of(&s.put(&web, b"one").await.unwrap());
    assert_eq!(
        a,
        path_of(&s.put(&web, b"one").await.unwrap()),
        "same bytes, same URL"
    );
    let b = path_of(&s.put(&web, b"two").await.unwrap());
    assert_ne!(a, b);
    assert_eq!(get(&s, "127.0.0.1", &a).await.unwrap().0, 410, "replaced");
    assert_eq!(s.list().await.unwrap().len(), 1);
    s.withdraw(&web).await.unwrap();
    s.withdraw(&web).await.unwrap();
    assert_eq!(s.state_of(&web), Some(DocumentState::Withdrawn));
    assert_eq!(get(&s, "127.0.0.1", &b).await.unwrap().0, 410, "withdrawn");
    assert_eq!(s.stats().served, 0);
    assert!(s.list().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_foreign_and_unlisted_clients_get_nothing_and_the_machine_still_does() {
    let s = store(loopback()).await;
    let (a, b) = (name("a"), name("b"));
    let path_a = path_of(&s.put(&a, b"document of a").await.unwrap());
    let path_b = path_of(&s.put(&b, b"document of b").await.unwrap());
    s.expect_clients(&a, &["127.0.0.1".parse().unwrap()])
        .await
        .unwrap();
    s.expect_clients(&b, &["127.0.0.2".parse().unwrap()])
        .await
        .unwrap();
    // A wrong token.
    let wrong = format!("/v1/{}", "0".repeat(64));
    assert_eq!(get(&s, "127.0.0.1", &wrong).await.unwrap().0, 404);
    assert_eq!(get(&s, "127.0.0.1", "/v1/short").await.unwrap().0, 404);
    // Machine a presents b's token: refused, and b's document is not used up.
    let (status, body) = get(&s, "127.0.0.1", &path_b).await.unwrap();
    assert_eq!((status, body.len()), (403, 0));
    // A client outside the allowed networks is cut before TLS.
    let narrow = store(
        HttpsStoreConfig::new("127.0.0.1:0".parse().unwrap())
            .allow(Network::parse("127.0.0.1").unwrap()),
    )
    .await;
    let p = path_of(&narrow.put(&a, b"x").await.unwrap());
    assert!(
        get(&narrow, "127.0.0.3", &p).await.is_none(),
        "no answer at all"
    );
    assert_eq!(narrow.stats().refused_clients, 1);
    assert_eq!(narrow.state_of(&a), Some(DocumentState::Waiting));
    // The right clients still get theirs.
    assert_eq!(
        get(&s, "127.0.0.2", &path_b).await.unwrap(),
        (200, b"document of b".to_vec())
    );
    assert_eq!(
        get(&s, "127.0.0.1", &path_a).await.unwrap(),
        (200, b"document of a".to_vec())
    );
    let st = s.stats();
    assert_eq!((st.served, st.wrong_clients, st.unknown_tokens), (2, 1, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_methods_bodies_and_huge_requests_are_refused_unread() {
    let s = store(loopback().with_bind_to_machines(false)).await;
    let path = path_of(&s.put(&name("web-1"), b"doc").await.unwrap());
    let from: IpAddr = "127.0.0.1".parse().unwrap();
    // A 10 GB body announced: refused at once, none of it read (only the headers go).
    let huge = format!("GET {path} HTTP/1.1\r\nHost: s\r\nContent-Length: 10737418240\r\n\r\n");
    let started = std::time::Instant::now();
    assert_eq!(send(&s, from, huge.as_bytes()).await.unwrap().0, 413);
    assert!(started.elapsed() < Duration::from_secs(10));
    let chunked = format!("GET {path} HTTP/1.1\r\nHost: s\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!(send(&s, from, chunked.as_bytes()).await.unwrap().0, 413);
    let post = format!("POST {path} HTTP/1.1\r\nHost: s\r\nContent-Length: 3\r\n\r\nabc");
    assert_eq!(send(&s, from, post.as_bytes()).await.unwrap().0, 405);
    // 64 KiB of headers: more than the server buffers.
    let fat = format!(
        "GET {path} HTTP/1.1\r\nHost: s\r\nX-Fill: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let answer = send(&s, from, fat.as_bytes()).await;
    assert!(
        answer
            .as_ref()
            .is_none_or(|(status, _)| *status == 431 || *status == 400),
        "{answer:?}"
    );
    assert_eq!(s.stats().served, 0, "nothing served to any of them");
    assert_eq!(get(&s, "127.0.0.1", &path).await.unwrap().0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_and_the_server_keeps_serving() {
    let config = loopback()
        .with_bind_to_machines(false)
        .with_connections(512, 4)
        .with_timeouts(
            Duration::from_secs(1),
            Duration::from_secs(1),
            Duration::from_secs(3),
        );
    let s = store(config).await;
    let path = path_of(&s.put(&name("web-1"), b"doc").await.unwrap());
    // Slow loris from 127.0.0.9: connections that never finish the handshake, and one
    // that finishes it and dribbles its headers.
    let loris: IpAddr = "127.0.0.9".parse().unwrap();
    let mut held = Vec::new();
    for _ in 0..6 {
        held.push(tcp(loris, s.addr()).await.unwrap());
    }
    let stream = tcp(loris, s.addr()).await.unwrap();
    let dribble = tokio::spawn(async move {
        let mut w = stream;
        for b in b"GET / HTTP/1.1\r\nHost: s\r\n".iter() {
            if w.write_all(&[*b]).await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        false
    });
    // The machine is served meanwhile, from its own address.
    assert_eq!(get(&s, "127.0.0.1", &path).await.unwrap().0, 200);
    for mut c in held {
        let mut buf = [0u8; 1];
        let cut = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf)).await;
        assert!(
            matches!(cut, Ok(Ok(0)) | Ok(Err(_))),
            "a silent connection is closed: {cut:?}"
        );
    }
    assert!(dribble.await.unwrap(), "the dribbling client was cut off");
    let st = s.stats();
    assert!(
        st.failed_handshakes >= 1 && st.refused_connections >= 2,
        "{st:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_guessing_tokens_is_throttled_and_others_are_not() {
    let s = store(loopback().with_bind_to_machines(false).with_rates(50, 3)).await;
    let path = path_of(&s.put(&name("web-1"), b"doc").await.unwrap());
    let mut statuses = Vec::new();
    for i in 0..12 {
        let guess = format!("/v1/{:064x}", i);
        statuses.push(get(&s, "127.0.0.5", &guess).await.unwrap().0);
    }
    assert!(
        statuses.contains(&404) && statuses.ends_with(&[429, 429]),
        "{statuses:?}"
    );
    // Throttled for everything now, even a right token.
    assert_eq!(get(&s, "127.0.0.5", &path).await.unwrap().0, 429);
    assert_eq!(get(&s, "127.0.0.1", &path).await.unwrap().0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_not_fetched_in_time_expire() {
    let s = store(
        loopback()
            .with_bind_to_machines(false)
            .with_ttl(Duration::from_secs(2)),
    )
    .await;
    let web = name("web-1");
    let path = path_of(&s.put(&web, b"doc").await.unwrap());
    // Expired within a prune round (half a second) after 2 s; forgotten 2 s later.
    tokio::time::sleep(Duration::from_millis(2700)).await;
    assert_eq!(s.state_of(&web), Some(DocumentState::Expired));
    assert_eq!(s.documents_in_memory(), 0);
    assert_eq!(get(&s, "127.0.0.1", &path).await.unwrap().0, 410);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_allowed_list_is_refused_and_secrets_stay_out_of_debug() {
    let e = HttpsStore::start(HttpsStoreConfig::new("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap_err();
    assert_eq!(e.field(), Some("allowed"));
    let s = store(loopback()).await;
    let location = s.put(&name("web-1"), b"token: hunter2").await.unwrap();
    let token = path_of(&location)["/v1/".len()..].to_owned();
    let shown = format!("{s:?} {s} {location:?}");
    assert!(
        !shown.contains(&token) && !shown.contains("hunter2"),
        "{shown}"
    );
}
