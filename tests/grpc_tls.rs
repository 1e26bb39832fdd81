//! The externalgrpc server over loopback with the generated tonic client, without a cluster:
//! mutual TLS as cluster-autoscaler's cloud-config dials it, and the status codes of requests
//! the server refuses before it needs the API server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use homelab_autoscaler::grpc::proto::cloud_provider_client::CloudProviderClient;
use homelab_autoscaler::grpc::{proto, serve_on};
use homelab_autoscaler::provider::{Provider, ProviderConfig};
use homelab_autoscaler::tls::{
    CertFiles, ReloadingServerConfig, SelfSignedBundle, issue_self_signed,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::{Channel, Endpoint, Uri};

/// A provider whose API server does not exist: its caches never sync, which is all these tests
/// need (they exercise the transport and the refusals that come before any read).
fn unreachable_provider() -> Provider {
    let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a url"));
    let client = kube::Client::try_from(config).expect("a client");
    Provider::start(client, ProviderConfig::new("nowhere"))
}

/// Starts the server on a free loopback port; it runs until the token is cancelled.
async fn start(tls: Option<Arc<ReloadingServerConfig>>) -> (SocketAddr, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let shutdown = CancellationToken::new();
    let provider = unreachable_provider();
    tokio::spawn(serve_on(listener, provider, tls, Duration::from_secs(30), shutdown.clone()));
    (address, shutdown)
}

fn certificates(pem: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes()).collect::<Result<_, _>>().expect("certificates")
}

/// A client as grpc-go builds it from the cloud-config: trusts only `ca_pem`, sends the
/// identity when given, checks the server name `localhost`, and asks for h2.
async fn tls_client(
    address: SocketAddr,
    ca_pem: &str,
    identity: Option<&SelfSignedBundle>,
) -> Result<CloudProviderClient<Channel>, Box<dyn std::error::Error + Send + Sync>> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(ca_pem) {
        roots.add(cert)?;
    }
    let builder = ClientConfig::builder().with_root_certificates(roots);
    let mut config = match identity {
        Some(id) => builder.with_client_auth_cert(
            certificates(&id.cert_pem),
            PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes())?,
        )?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let channel = Endpoint::from_shared(format!("http://localhost:{}", address.port()))?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let connector = connector.clone();
            async move {
                let tcp = TcpStream::connect(address).await?;
                let name = ServerName::try_from("localhost").map_err(std::io::Error::other)?;
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await?;
    Ok(CloudProviderClient::new(channel))
}

/// Asks for the GPU label, the one call that needs neither the cluster nor the caches.
async fn gpu_label(
    client: Result<CloudProviderClient<Channel>, Box<dyn std::error::Error + Send + Sync>>,
) -> Result<String, String> {
    let mut client = client.map_err(|e| format!("connect: {e}"))?;
    let answer =
        tokio::time::timeout(Duration::from_secs(10), client.gpu_label(proto::GpuLabelRequest {}))
            .await
            .map_err(|_| "timed out".to_string())?;
    answer.map(|r| r.into_inner().label).map_err(|status| format!("call: {status}"))
}

struct MutualTls {
    _dir: tempfile::TempDir,
    server: SelfSignedBundle,
    address: SocketAddr,
    _shutdown: Stopper,
}

/// Cancels the server when the test ends.
struct Stopper(CancellationToken);

impl Drop for Stopper {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

async fn mutual_tls_server() -> MutualTls {
    homelab_autoscaler::tls::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    // One CA signs the server's certificate and the client's, as in the upstream examples.
    let server = issue_self_signed(&["localhost".into()], &[]).expect("issue");
    server.write_secret_layout(dir.path()).expect("write");
    let tls =
        homelab_autoscaler::grpc::tls::load(CertFiles::in_dir(dir.path(), true)).expect("load");
    let (address, shutdown) = start(Some(tls)).await;
    MutualTls { _dir: dir, server, address, _shutdown: Stopper(shutdown) }
}

#[tokio::test]
async fn mutual_tls_serves_a_client_with_the_right_certificate() {
    let s = mutual_tls_server().await;
    let got = gpu_label(tls_client(s.address, &s.server.ca_pem, Some(&s.server)).await).await;
    assert_eq!(got, Ok("accelerator".to_string()));
}

#[tokio::test]
async fn mutual_tls_refuses_a_client_without_a_certificate() {
    let s = mutual_tls_server().await;
    let got = gpu_label(tls_client(s.address, &s.server.ca_pem, None).await).await;
    assert!(got.is_err(), "a client without a certificate was served: {got:?}");
}

#[tokio::test]
async fn mutual_tls_refuses_a_certificate_from_another_ca() {
    let s = mutual_tls_server().await;
    let stranger = issue_self_signed(&["localhost".into()], &[]).expect("issue");
    let got = gpu_label(tls_client(s.address, &s.server.ca_pem, Some(&stranger)).await).await;
    assert!(got.is_err(), "a certificate of another CA was accepted: {got:?}");
}

#[tokio::test]
async fn mutual_tls_refuses_a_plaintext_client() {
    let s = mutual_tls_server().await;
    let plain = CloudProviderClient::connect(format!("http://{}", s.address)).await;
    let got = gpu_label(plain.map_err(Into::into)).await;
    assert!(got.is_err(), "a plaintext client was served: {got:?}");
}

async fn plaintext_client() -> (CloudProviderClient<Channel>, Stopper) {
    let (address, shutdown) = start(None).await;
    let client = CloudProviderClient::connect(format!("http://{address}")).await.expect("connect");
    (client, Stopper(shutdown))
}

#[tokio::test]
async fn bad_requests_get_the_right_codes_and_reads_wait_for_the_caches() {
    let (mut client, _stop) = plaintext_client().await;

    let zero = client
        .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
            delta: 0,
            id: "pool".into(),
        })
        .await
        .expect_err("delta 0");
    assert_eq!(zero.code(), Code::InvalidArgument, "{zero}");

    let positive = client
        .node_group_decrease_target_size(proto::NodeGroupDecreaseTargetSizeRequest {
            delta: 1,
            id: "pool".into(),
        })
        .await
        .expect_err("a decrease by a positive delta");
    assert_eq!(positive.code(), Code::InvalidArgument, "{positive}");

    let no_window = client
        .pricing_node_price(proto::PricingNodePriceRequest::default())
        .await
        .expect_err("no window");
    assert_eq!(no_window.code(), Code::InvalidArgument, "{no_window}");

    let garbage_pod = client
        .pricing_pod_price(proto::PricingPodPriceRequest {
            pod_bytes: vec![0xff; 8],
            start_timestamp: Some(prost_types::Timestamp { seconds: 0, nanos: 0 }),
            end_timestamp: Some(prost_types::Timestamp { seconds: 3600, nanos: 0 }),
            ..Default::default()
        })
        .await
        .expect_err("garbage pod");
    assert_eq!(garbage_pod.code(), Code::InvalidArgument, "{garbage_pod}");

    let unsynced = client
        .node_group_target_size(proto::NodeGroupTargetSizeRequest { id: "pool".into() })
        .await
        .expect_err("caches not synced");
    assert_eq!(unsynced.code(), Code::Unavailable, "{unsynced}");

    client.refresh(proto::RefreshRequest {}).await.expect("refresh never fails");
    client.cleanup(proto::CleanupRequest {}).await.expect("cleanup never fails");
    let types = client
        .get_available_gpu_types(proto::GetAvailableGpuTypesRequest {})
        .await
        .expect("gpu types")
        .into_inner();
    assert!(types.gpu_types.is_empty());
}
