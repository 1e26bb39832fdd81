//! cluster-autoscaler's externalgrpc cloud provider, served over tonic. This layer only
//! translates: the wire types to the provider core's calls ([`convert`]), the core's errors to
//! status codes ([`status`]), and serves the result in plaintext or with mutual TLS ([`serve`],
//! [`tls`]). Every decision lives in [`crate::provider`].

pub mod convert;
mod measure;
pub mod serve;
pub mod server;
pub mod status;
pub mod tls;

/// The generated contract (proto/externalgrpc.proto): messages, the server trait and a client.
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod proto {
    tonic::include_proto!("clusterautoscaler.cloudprovider.v1.externalgrpc");
}

pub use serve::{GrpcError, GrpcServerConfig, serve, serve_on};
pub use server::CloudProviderService;
