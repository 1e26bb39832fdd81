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
