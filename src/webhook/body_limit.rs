//! The size limit of an admission request. kube-apiserver caps a request at 3 MiB and an
//! object in etcd at 1.5 MiB, so a real AdmissionReview (object and oldObject, with the
//! envelope) stays well under [`MAX_REVIEW_BYTES`]; anything larger is not from the apiserver.
//!
//! A server that answers 413 without reading the body and closes resets the connection while
//! the client is still writing, and the client sees a dropped connection instead of the answer.
//! So an oversized body is read and thrown away, up to [`MAX_DRAINED_BYTES`] and within
//! [`DRAIN_TIMEOUT`], before the 413 goes out; past those bounds the connection is dropped.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;

/// The largest admission request served.
pub const MAX_REVIEW_BYTES: usize = 4 * 1024 * 1024;
/// How much of an oversized body is drained so the client reads the 413.
pub const MAX_DRAINED_BYTES: usize = 64 * 1024 * 1024;
/// How long draining an oversized body may take (a slow client holds no task for long).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

fn too_large(seen: usize) -> Response {
    tracing::warn!(bytes = seen, limit = MAX_REVIEW_BYTES, "admission request body too large");
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        [(header::CONNECTION, "close")],
        format!(
            "the request body is larger than {MAX_REVIEW_BYTES} bytes, the most an admission \
             request from kube-apiserver can carry"
        ),
    )
        .into_response()
}

/// Middleware: passes on a body of at most [`MAX_REVIEW_BYTES`], answers 413 to a larger one.
pub async fn limit_body(request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|length| length > MAX_DRAINED_BYTES) {
        // Too large to drain: answer at once; the client may see the connection close instead.
        return too_large(declared.unwrap_or_default());
    }
    let (parts, body) = request.into_parts();
    let mut chunks = body.into_data_stream();
    let mut kept = Vec::new();
    let mut seen = 0usize;
    let read = async {
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|error| error.to_string())?;
            seen = seen.saturating_add(chunk.len());
            if seen > MAX_DRAINED_BYTES {
                break;
            }
            if seen <= MAX_REVIEW_BYTES {
                kept.extend_from_slice(&chunk);
            }
        }
        Ok::<(), String>(())
    };
    let outcome = tokio::time::timeout(DRAIN_TIMEOUT, read).await;
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::debug!(%error, "reading an admission request body failed");
            return (StatusCode::BAD_REQUEST, format!("reading the request body: {error}"))
                .into_response();
        }
        Err(_) if seen <= MAX_REVIEW_BYTES => {
            return (StatusCode::REQUEST_TIMEOUT, "the request body did not arrive in time")
                .into_response();
        }
        Err(_) => return too_large(seen),
    }
    if seen > MAX_REVIEW_BYTES {
        return too_large(seen);
    }
    next.run(Request::from_parts(parts, Body::from(Bytes::from(kept)))).await
}
