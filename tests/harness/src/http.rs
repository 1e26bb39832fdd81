//! The tests' one HTTP client, reqwest: plain HTTP to an admin port, Prometheus or
//! cluster-autoscaler's metrics, and HTTPS to a server whose certificate a test's own CA signed.
//! The answer is kept whole (status and body) because the tests assert on refusals too.

use std::time::Duration;

use anyhow::{Context, Result};

/// A status code and the body, as text.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

/// How long one request may take before it counts as a failed attempt (the waits retry).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A client for plain HTTP on loopback (no proxy, whatever the environment says).
pub fn plain_client() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .context("building the HTTP client")
}

/// A client for HTTPS that trusts only `ca_pem` (the certificate of a test's own CA).
pub fn tls_client(ca_pem: &str) -> Result<reqwest::Client> {
    let ca = reqwest::Certificate::from_pem(ca_pem.as_bytes()).context("reading the CA")?;
    reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .build()
        .context("building the HTTPS client")
}

/// Sends `request` and reads its answer to the end, whatever the status.
pub async fn send(request: reqwest::RequestBuilder) -> Result<Answer> {
    let response = request.send().await.context("sending the request")?;
    let status = response.status().as_u16();
    let body = response.text().await.context("reading the body")?;
    Ok(Answer { status, body })
}

/// `GET http://<addr><path>`: the status and body.
pub async fn get(addr: &str, path: &str) -> Result<Answer> {
    send(plain_client()?.get(format!("http://{addr}{path}")))
        .await
        .with_context(|| format!("GET http://{addr}{path}"))
}

/// One request a [`Recorder`] received.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    /// The path and query.
    pub uri: String,
    pub headers: axum::http::HeaderMap,
    pub body: String,
}

/// An HTTP endpoint on 127.0.0.1 that answers every request with one status and records it: a
/// smart plug, a switch or a webhook receiver as the power drivers meet them. Stops when
/// dropped.
pub struct Recorder {
    pub port: u16,
    /// `http://127.0.0.1:<port>`
    pub base: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<Seen>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Recorder {
    pub async fn start(status: u16) -> Result<Self> {
        let seen: std::sync::Arc<std::sync::Mutex<Vec<Seen>>> = Default::default();
        let record = seen.clone();
        let status = axum::http::StatusCode::from_u16(status).context("an HTTP status")?;
        let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
            let record = record.clone();
            async move {
                let (parts, body) = request.into_parts();
                let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
                record.lock().unwrap_or_else(|p| p.into_inner()).push(Seen {
                    method: parts.method.to_string(),
                    uri: parts.uri.to_string(),
                    headers: parts.headers,
                    body: String::from_utf8_lossy(&bytes).into_owned(),
                });
                status
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("binding")?;
        let port = listener.local_addr()?.port();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { port, base: format!("http://127.0.0.1:{port}"), seen, server })
    }

    /// Every request so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The value of header `name` of every request so far (empty where it was absent).
    pub fn header_values(&self, name: &str) -> Vec<String> {
        self.seen()
            .iter()
            .map(|s| s.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().into())
            .collect()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A Shelly Gen2 plug's meter on 127.0.0.1: `GET /rpc/Switch.GetStatus?id=0` answers
/// `{"id":0,"output":true,"apower":<watts>}` with the draw a test sets, and counts the reads.
/// Stops when dropped.
pub struct ShellyMeter {
    /// `http://127.0.0.1:<port>`
    pub base: String,
    watts: std::sync::Arc<std::sync::Mutex<f64>>,
    reads: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    server: tokio::task::JoinHandle<()>,
}

impl ShellyMeter {
    /// The path and query a meter request names.
    pub const STATUS: &str = "/rpc/Switch.GetStatus?id=0";

    pub async fn start(watts: f64) -> Result<Self> {
        let draw = std::sync::Arc::new(std::sync::Mutex::new(watts));
        let reads: std::sync::Arc<std::sync::atomic::AtomicUsize> = Default::default();
        let (answer, count) = (draw.clone(), reads.clone());
        let app = axum::Router::new().route(
            "/rpc/Switch.GetStatus",
            axum::routing::get(move || {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let apower = *answer.lock().unwrap_or_else(|p| p.into_inner());
                let body = serde_json::json!({ "id": 0, "output": true, "apower": apower });
                async move { ([("content-type", "application/json")], body.to_string()) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("binding")?;
        let base = format!("http://{}", listener.local_addr()?);
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { base, watts: draw, reads, server })
    }

    /// The draw the next reads answer.
    pub fn set(&self, watts: f64) {
        *self.watts.lock().unwrap_or_else(|p| p.into_inner()) = watts;
    }

    /// How many times the meter was read.
    pub fn reads(&self) -> usize {
        self.reads.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for ShellyMeter {
    fn drop(&mut self) {
        self.server.abort();
    }
}
