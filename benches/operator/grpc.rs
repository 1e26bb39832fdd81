//! cluster-autoscaler's side of the externalgrpc provider: a tonic client over mutual TLS on a
//! real TCP connection, as CA's cloud-config dials it, and the provider calls it makes every
//! loop, timed one after another on one connection (as CA makes them).
//!
//! Sequential small unary calls on one connection are what exposes Nagle's algorithm on the
//! server's socket: the client's kernel delays its ACK (40 ms on Linux), and a server that
//! holds its second small write of a response until that ACK answers the call ~40 ms late. The fix is
//! `TCP_NODELAY` on every accepted socket (src/grpc/tls.rs); a p50 of tens of milliseconds for
//! TemplateNodeInfo here means it came back.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use homelab_autoscaler::grpc::proto;
use homelab_autoscaler::grpc::proto::cloud_provider_client::CloudProviderClient;
use homelab_autoscaler::tls::SelfSignedBundle;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::stats::Samples;

pub type Client = CloudProviderClient<Channel>;

fn certificates(pem: &str) -> Result<Vec<CertificateDer<'static>>> {
    Ok(CertificateDer::pem_slice_iter(pem.as_bytes()).collect::<Result<_, _>>()?)
}

/// Dials `port` on 127.0.0.1 with mutual TLS: trusts `bundle`'s CA, presents `bundle`'s
/// certificate, checks the server name `localhost`, asks for h2. Its socket is set up as
/// grpc-go's (TCP_NODELAY, as Go sets on every connection; the kernel's delayed ACKs on), so
/// only the server's socket options decide whether a small response waits on an ACK.
pub async fn connect(port: u16, bundle: &SelfSignedBundle) -> Result<Client> {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let mut roots = RootCertStore::empty();
    for cert in certificates(&bundle.ca_pem)? {
        roots.add(cert)?;
    }
    let mut config = ClientConfig::builder().with_root_certificates(roots).with_client_auth_cert(
        certificates(&bundle.cert_pem)?,
        PrivateKeyDer::from_pem_slice(bundle.key_pem.as_bytes())?,
    )?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let channel = Endpoint::from_shared(format!("http://localhost:{port}"))?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let connector = connector.clone();
            async move {
                let tcp = TcpStream::connect(address).await?;
                tcp.set_nodelay(true)?;
                let name = ServerName::try_from("localhost").map_err(std::io::Error::other)?;
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await?;
    Ok(CloudProviderClient::new(channel))
}

/// The calls cluster-autoscaler makes on every loop, plus GetOptions.
#[derive(Clone, Copy, Debug)]
pub enum Call {
    NodeGroups,
    TargetSize,
    NodeGroupNodes,
    TemplateNodeInfo,
    GetOptions,
}

impl Call {
    pub const READS: [Call; 5] = [
        Call::NodeGroups,
        Call::TargetSize,
        Call::NodeGroupNodes,
        Call::TemplateNodeInfo,
        Call::GetOptions,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Call::NodeGroups => "NodeGroups",
            Call::TargetSize => "NodeGroupTargetSize",
            Call::NodeGroupNodes => "NodeGroupNodes",
            Call::TemplateNodeInfo => "NodeGroupTemplateNodeInfo",
            Call::GetOptions => "NodeGroupGetOptions",
        }
    }

    /// One call for `group`. GetOptions answers `Unimplemented` for a Group without
    /// overrides (docs/decisions.md, D7): that is an answer, timed like the others.
    async fn once(self, client: &mut Client, group: &str) -> Result<()> {
        let id = group.to_string();
        match self {
            Call::NodeGroups => {
                client.node_groups(proto::NodeGroupsRequest {}).await?;
            }
            Call::TargetSize => {
                client.node_group_target_size(proto::NodeGroupTargetSizeRequest { id }).await?;
            }
            Call::NodeGroupNodes => {
                client.node_group_nodes(proto::NodeGroupNodesRequest { id }).await?;
            }
            Call::TemplateNodeInfo => {
                client
                    .node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest { id })
                    .await?;
            }
            Call::GetOptions => {
                let request = proto::NodeGroupAutoscalingOptionsRequest { id, defaults: None };
                match client.node_group_get_options(request).await {
                    Ok(_) => {}
                    Err(status) if status.code() == tonic::Code::Unimplemented => {}
                    Err(status) => return Err(status.into()),
                }
            }
        }
        Ok(())
    }
}

/// `count` sequential calls of `call` for `group` on one connection.
pub async fn time_calls(client: &mut Client, call: Call, group: &str, count: usize) -> Samples {
    let mut samples = Samples::default();
    for _ in 0..count {
        let started = Instant::now();
        match call.once(client, group).await {
            Ok(()) => samples.push(started.elapsed()),
            Err(_) => samples.errors += 1,
        }
    }
    samples
}

/// `count` IncreaseSize(group, +1) calls, one after another: each creates a claim and waits
/// until the provider's cache has it (so the next call sees it).
pub async fn time_increases(client: &mut Client, group: &str, count: usize) -> Samples {
    let mut samples = Samples::default();
    for _ in 0..count {
        let request = proto::NodeGroupIncreaseSizeRequest { delta: 1, id: group.to_string() };
        let started = Instant::now();
        match client.node_group_increase_size(request).await {
            Ok(_) => samples.push(started.elapsed()),
            Err(_) => samples.errors += 1,
        }
    }
    samples
}

/// Warms the connection (TLS, h2 windows, the server's first allocations).
pub async fn warm(client: &mut Client, group: &str) {
    for call in Call::READS {
        let _ = time_calls(client, call, group, 5).await;
    }
}
