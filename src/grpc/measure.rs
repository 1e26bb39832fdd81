//! A tower layer that records every externalgrpc call's RPC, status code and latency.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use tonic::codegen::http;

use crate::telemetry;

/// The service's path prefix; any other path is counted as `unknown`, so a stray client cannot
/// mint label values.
const SERVICE: &str = "/clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider/";

/// The RPC a request path names.
pub fn rpc_of(path: &str) -> &str {
    path.strip_prefix(SERVICE)
        .filter(|rpc| !rpc.is_empty() && !rpc.contains('/'))
        .unwrap_or("unknown")
}

/// The status code a response carries in its headers (tonic answers an error with a
/// trailers-only response, so it sits there); none means the call succeeded.
pub fn code_of(headers: &http::HeaderMap) -> String {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map_or_else(|| "OK".to_string(), |c| format!("{:?}", tonic::Code::from_i32(c)))
}

/// Wraps a service so each call is measured.
#[derive(Clone)]
pub struct Measured<S>(pub S);

type Boxed<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for Measured<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Boxed<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let rpc = rpc_of(request.uri().path()).to_string();
        let started = Instant::now();
        let call = self.0.call(request);
        Box::pin(async move {
            let response = call.await;
            let code = match &response {
                Ok(response) => code_of(response.headers()),
                Err(_) => "Unknown".to_string(),
            };
            telemetry::grpc_answered(&rpc, &code, started.elapsed());
            response
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_names_are_bounded() {
        let table = [
            (
                "/clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider/NodeGroups",
                "NodeGroups",
            ),
            ("/clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider/", "unknown"),
            ("/some.other.Service/Call", "unknown"),
            ("/clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider/a/b", "unknown"),
        ];
        for (path, want) in table {
            assert_eq!(rpc_of(path), want, "{path}");
        }
    }

    #[test]
    fn codes_are_named() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(code_of(&headers), "OK");
        headers.insert("grpc-status", http::HeaderValue::from_static("12"));
        assert_eq!(code_of(&headers), "Unimplemented");
    }
}
