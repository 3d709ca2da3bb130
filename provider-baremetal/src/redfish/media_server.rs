//! The HTTP server BMCs download seed images from: one unguessable URL per machine,
//! served from memory, removed when the machine no longer needs it.
//!
//! BMCs fetch virtual media themselves (InsertMedia gives them a URL), so the provider
//! must serve the seed where the BMC can reach it: loopback for an emulator on the same
//! host, a configured address on the management network for real servers.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use machine_core::{Error, Result};

/// One published image.
struct Image {
    /// Whose image it is (the machine's provider ID), to remove by.
    owner: String,
    bytes: Bytes,
    downloads: AtomicUsize,
}

type Images = Arc<Mutex<HashMap<String, Arc<Image>>>>;

/// A running media server; stops when dropped.
pub struct MediaServer {
    addr: SocketAddr,
    base_url: String,
    images: Images,
    task: tokio::task::JoinHandle<()>,
}

impl fmt::Debug for MediaServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URLs are capabilities: not shown.
        f.debug_struct("MediaServer")
            .field("addr", &self.addr)
            .field("images", &self.images.lock().map(|m| m.len()).unwrap_or(0))
            .finish()
    }
}

impl MediaServer {
    /// Listens on `bind` (`127.0.0.1:0` for a free loopback port). URLs start with
    /// `advertise` (`http://10.0.0.2:8080`) when given, else with the bound address.
    /// Needs a tokio runtime.
    pub async fn start(bind: SocketAddr, advertise: Option<&str>) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind(bind).await.map_err(|e| {
            Error::invalid_spec(
                "mediaServer.listen",
                format!("cannot listen on {bind}: {e}"),
            )
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::transient(format!("media server address: {e}")))?;
        let base_url = advertise
            .map(|a| a.trim_end_matches('/').to_owned())
            .unwrap_or_else(|| format!("http://{addr}"));
        let images: Images = Arc::default();
        let served = images.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let images = served.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let images = images.clone();
                        async move { Ok::<_, Infallible>(serve(&images, &req)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(MediaServer {
            addr,
            base_url,
            images,
            task,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Publishes `bytes` for `owner` under a new unguessable URL (128 random bits) and
    /// returns the URL. An owner's earlier images stay until removed.
    pub fn publish(&self, owner: &str, bytes: Vec<u8>) -> Result<String> {
        let mut token = [0u8; 16];
        getrandom::fill(&mut token)
            .map_err(|e| Error::transient(format!("no randomness for a media URL: {e}")))?;
        let token: String = token.iter().map(|b| format!("{b:02x}")).collect();
        let image = Arc::new(Image {
            owner: owner.to_owned(),
            bytes: Bytes::from(bytes),
            downloads: AtomicUsize::new(0),
        });
        self.lock().insert(token.clone(), image);
        Ok(format!("{}/seed/{token}/seed.iso", self.base_url))
    }

    /// Removes every image of `owner`; their URLs answer 404 from now on. Returns how
    /// many were removed.
    pub fn remove(&self, owner: &str) -> usize {
        let mut images = self.lock();
        let before = images.len();
        images.retain(|_, i| i.owner != owner);
        before - images.len()
    }

    /// How many complete GETs the image at `url` answered (0 for an unknown URL).
    pub fn downloads(&self, url: &str) -> usize {
        token_of(url)
            .and_then(|t| {
                self.lock()
                    .get(t)
                    .map(|i| i.downloads.load(Ordering::SeqCst))
            })
            .unwrap_or(0)
    }

    /// Whether `owner` has an image published.
    pub fn serves(&self, owner: &str) -> bool {
        self.lock().values().any(|i| i.owner == owner)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Image>>> {
        // A panic while holding the lock cannot leave the map half-changed.
        self.images.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for MediaServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The token of a URL this server made: `.../seed/<token>/seed.iso`.
fn token_of(path: &str) -> Option<&str> {
    let rest = &path[path.find("/seed/")? + "/seed/".len()..];
    let (token, file) = rest.split_once('/')?;
    (file == "seed.iso").then_some(token)
}

fn serve(images: &Images, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: Bytes| {
        let mut r = Response::new(Full::new(body));
        *r.status_mut() = status;
        r
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, Bytes::new());
    }
    let image = token_of(req.uri().path()).and_then(|t| {
        images
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(t)
            .cloned()
    });
    let Some(image) = image else {
        return reply(StatusCode::NOT_FOUND, Bytes::new());
    };
    let mut r = if req.method() == Method::HEAD {
        let mut r = reply(StatusCode::OK, Bytes::new());
        r.headers_mut().insert(
            hyper::header::CONTENT_LENGTH,
            hyper::header::HeaderValue::from(image.bytes.len()),
        );
        r
    } else {
        image.downloads.fetch_add(1, Ordering::SeqCst);
        reply(StatusCode::OK, image.bytes.clone())
    };
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/x-iso9660-image"),
    );
    r
}
