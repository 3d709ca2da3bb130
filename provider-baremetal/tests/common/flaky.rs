//! A proxy in front of a BMC that forwards every request, except those a rule answers
//! itself: a BMC that is busy, refuses, throttles, accepts a reset it never applies,
//! hangs, or sits behind a broken proxy. Rules are switched on and off while it runs; it
//! logs what it saw.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
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

/// How a rule answers a request it matches.
#[derive(Debug, Clone)]
pub enum Answer {
    /// One of the canned faults.
    Fault(Fault),
    /// This status, these headers and this body.
    Status(u16, Vec<(&'static str, String)>, String),
    /// 204, as a BMC accepting a reset, without forwarding it: the BMC never hears of it.
    Swallow,
    /// No answer at all (the connection stays open until the client gives up or dies).
    Hold,
}

/// Answers the requests it matches (method and a part of the path), `times` times or
/// for as long as it is in place.
#[derive(Debug, Clone)]
pub struct Rule {
    /// The method to match; any when `None`.
    pub method: Option<Method>,
    /// A part of the path to match; any when empty.
    pub path: String,
    /// The answer.
    pub answer: Answer,
    /// How many requests it answers; every one when `None`.
    pub times: Option<usize>,
}

impl Rule {
    /// A rule answering every request with `answer`.
    pub fn all(answer: Answer) -> Rule {
        Rule {
            method: None,
            path: String::new(),
            answer,
            times: None,
        }
    }

    /// A rule answering `method` requests whose path contains `path`.
    pub fn on(method: Method, path: &str, answer: Answer) -> Rule {
        Rule {
            method: Some(method),
            path: path.to_owned(),
            answer,
            times: None,
        }
    }

    /// Answers only the first `n` matching requests.
    pub fn times(mut self, n: usize) -> Rule {
        self.times = Some(n);
        self
    }

    fn matches(&self, method: &Method, path: &str) -> bool {
        self.times != Some(0)
            && self.method.as_ref().is_none_or(|m| m == method)
            && path.contains(&self.path)
    }
}

#[derive(Default)]
struct State {
    served: AtomicUsize,
    answered: AtomicU64,
    rules: Mutex<Vec<Rule>>,
    seen: Mutex<Vec<(Method, String, bool)>>,
}

/// The running proxy; stops when dropped.
pub struct Flaky {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

/// A Redfish error body with `message_id` and `message`.
pub fn redfish_error(message_id: &str, message: &str) -> String {
    format!(
        r#"{{"error": {{"code": "Base.1.8.GeneralError", "message": "{message}",
 "@Message.ExtendedInfo": [{{"MessageId": "Base.1.8.{message_id}", "Message": "{message}"}}]}}}}"#
    )
}

impl Flaky {
    /// Proxies to `upstream` (`http://127.0.0.1:<port>`), failing the first `failures`.
    pub async fn start(upstream: &str, failures: usize) -> Flaky {
        Flaky::start_with(upstream, failures, Fault::Busy).await
    }

    /// Proxies to `upstream`, answering the first `failures` requests with `fault`.
    pub async fn start_with(upstream: &str, failures: usize, fault: Fault) -> Flaky {
        let flaky = Flaky::forwarding(upstream).await;
        flaky.push(Rule::all(Answer::Fault(fault)).times(failures));
        flaky
    }

    /// Proxies to `upstream`, forwarding everything until a rule is pushed.
    pub async fn forwarding(upstream: &str) -> Flaky {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(State::default());
        let shared = state.clone();
        let upstream = upstream.trim_end_matches('/').to_owned();
        let client = reqwest::Client::new();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (state, upstream, client) = (shared.clone(), upstream.clone(), client.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (state, upstream, client) =
                            (state.clone(), upstream.clone(), client.clone());
                        async move { Ok::<_, Infallible>(serve(&state, &client, &upstream, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Flaky {
            endpoint,
            state,
            task,
        }
    }

    /// Puts `rule` in place, after those already there (the first matching one answers).
    pub fn push(&self, rule: Rule) {
        self.state.rules.lock().unwrap().push(rule);
    }

    /// Takes every rule away and zeroes [`Flaky::answered`].
    pub fn clear(&self) {
        self.state.rules.lock().unwrap().clear();
        self.state.answered.store(0, Ordering::SeqCst);
    }

    /// Requests seen so far, answered by a rule or not.
    pub fn requests(&self) -> usize {
        self.state.served.load(Ordering::SeqCst)
    }

    /// Requests answered by a rule since the last [`Flaky::clear`].
    pub fn answered(&self) -> u64 {
        self.state.answered.load(Ordering::SeqCst)
    }

    /// How many `method` requests whose path contains `path` were seen; with
    /// `forwarded`, only those that reached the BMC.
    pub fn seen(&self, method: &Method, path: &str, forwarded: bool) -> usize {
        self.state
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, p, f)| m == method && p.contains(path) && (*f || !forwarded))
            .count()
    }

    /// Every request seen so far, as `METHOD path`.
    pub fn log(&self) -> Vec<String> {
        self.state
            .seen
            .lock()
            .unwrap()
            .iter()
            .map(|(m, p, _)| format!("{m} {p}"))
            .collect()
    }
}

async fn serve(
    state: &State,
    client: &reqwest::Client,
    upstream: &str,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    state.served.fetch_add(1, Ordering::SeqCst);
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let answer = {
        let mut rules = state.rules.lock().unwrap();
        rules
            .iter_mut()
            .find(|r| r.matches(&method, &path))
            .map(|r| {
                if let Some(n) = &mut r.times {
                    *n -= 1;
                }
                r.answer.clone()
            })
    };
    state
        .seen
        .lock()
        .unwrap()
        .push((method, path, answer.is_none()));
    let Some(answer) = answer else {
        return forward(client, upstream, req).await;
    };
    state.answered.fetch_add(1, Ordering::SeqCst);
    let reply = |status: u16, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        r
    };
    match answer {
        Answer::Fault(Fault::Busy) => reply(
            503,
            redfish_error(
                "ServiceTemporarilyUnavailable",
                "The service is temporarily unavailable.",
            ),
        ),
        Answer::Fault(Fault::Html) => reply(
            200,
            "<html><body><h1>Gateway login</h1></body></html>".into(),
        ),
        Answer::Fault(Fault::Truncated) => reply(200, r#"{"Id": "1", "PowerSta"#.into()),
        Answer::Status(status, headers, body) => {
            let mut r = reply(status, body);
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            for (k, v) in headers {
                r.headers_mut().insert(k, v.parse().unwrap());
            }
            r
        }
        Answer::Swallow => reply(204, String::new()),
        Answer::Hold => std::future::pending().await,
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
            *r.status_mut() = StatusCode::BAD_GATEWAY;
            r
        }
    }
}

impl Drop for Flaky {
    fn drop(&mut self) {
        self.task.abort();
    }
}
