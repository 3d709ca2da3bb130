//! A proxy in front of a BMC that answers its first N requests itself (503 with a
//! Redfish error body, or a 200 that is not Redfish JSON), then forwards everything: a
//! BMC that is busy, or behind a broken proxy, then recovers.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// What the proxy answers its first requests with.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// 503 with a Redfish ServiceTemporarilyUnavailable body.
    Busy,
    /// 200 with an HTML page.
    Html,
    /// 200 with JSON cut in the middle.
    Truncated,
}

/// The running proxy; stops when dropped.
pub struct Flaky {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    served: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

const BUSY: &str = r#"{"error": {"code": "Base.1.8.GeneralError", "message": "busy",
 "@Message.ExtendedInfo": [{"MessageId": "Base.1.8.ServiceTemporarilyUnavailable",
 "Message": "The service is temporarily unavailable."}]}}"#;

impl Flaky {
    /// Proxies to `upstream` (`http://127.0.0.1:<port>`), failing the first `failures`.
    pub async fn start(upstream: &str, failures: usize) -> Flaky {
        Flaky::start_with(upstream, failures, Fault::Busy).await
    }

    /// Proxies to `upstream`, answering the first `failures` requests with `fault`.
    pub async fn start_with(upstream: &str, failures: usize, fault: Fault) -> Flaky {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        let upstream = upstream.trim_end_matches('/').to_owned();
        let client = reqwest::Client::new();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (count, upstream, client) = (count.clone(), upstream.clone(), client.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (count, upstream, client) =
                            (count.clone(), upstream.clone(), client.clone());
                        async move {
                            let n = count.fetch_add(1, Ordering::SeqCst);
                            if n < failures {
                                let (status, body) = match fault {
                                    Fault::Busy => (hyper::StatusCode::SERVICE_UNAVAILABLE, BUSY),
                                    Fault::Html => (
                                        hyper::StatusCode::OK,
                                        "<html><body><h1>Gateway login</h1></body></html>",
                                    ),
                                    Fault::Truncated => {
                                        (hyper::StatusCode::OK, r#"{"Id": "1", "PowerSta"#)
                                    }
                                };
                                let mut r = Response::new(Full::new(Bytes::from(body)));
                                *r.status_mut() = status;
                                return Ok::<_, Infallible>(r);
                            }
                            Ok(forward(&client, &upstream, req).await)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Flaky {
            endpoint,
            served,
            task,
        }
    }

    /// Requests seen so far, failed ones included.
    pub fn requests(&self) -> usize {
        self.served.load(Ordering::SeqCst)
    }
}

async fn forward(
    client: &reqwest::Client,
    upstream: &str,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut out = client
        .request(parts.method, format!("{upstream}{path}"))
        .body(body);
    for (k, v) in &parts.headers {
        if k != hyper::header::HOST {
            out = out.header(k, v);
        }
    }
    match out.send().await {
        Ok(resp) => {
            let status = resp.status();
            let headers = resp.headers().clone();
            let bytes = resp.bytes().await.unwrap_or_default();
            let mut r = Response::new(Full::new(bytes));
            *r.status_mut() = status;
            for (k, v) in &headers {
                if k != hyper::header::TRANSFER_ENCODING && k != hyper::header::CONTENT_LENGTH {
                    r.headers_mut().insert(k, v.clone());
                }
            }
            r
        }
        Err(_) => {
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = hyper::StatusCode::BAD_GATEWAY;
            r
        }
    }
}

impl Drop for Flaky {
    fn drop(&mut self) {
        self.task.abort();
    }
}
