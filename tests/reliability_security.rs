//! Security checks of the two servers over loopback, without a cluster: TLS 1.2 and 1.3 only
//! (a TLS 1.0 or 1.1 ClientHello gets a fatal alert, never a ServerHello), the webhook's request size
//! limit (an oversized body is answered 413, not dropped), and the gRPC request size limit
//! (refused before decoding; the server lives on). The mutual-TLS refusals (no certificate, a
//! certificate from another CA, plaintext) are in tests/grpc_tls.rs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use homelab_autoscaler::grpc::proto::cloud_provider_client::CloudProviderClient;
use homelab_autoscaler::grpc::server::MAX_REQUEST_BYTES;
use homelab_autoscaler::grpc::{proto, serve_on};
use homelab_autoscaler::provider::{Provider, ProviderConfig};
use homelab_autoscaler::tls::{CertFiles, ReloadingServerConfig, issue_self_signed};
use homelab_autoscaler::webhook::body_limit::MAX_REVIEW_BYTES;
use homelab_autoscaler::webhook::{self, SystemClock, WebhookState};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A client whose API server does not exist: nothing here reaches it.
fn nowhere() -> kube::Client {
    let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a url"));
    kube::Client::try_from(config).expect("a client")
}

struct Server {
    address: SocketAddr,
    ca_pem: String,
    stop: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn webhook_server() -> Server {
    homelab_autoscaler::tls::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = issue_self_signed(&["localhost".into()], &[]).expect("issue");
    bundle.write_secret_layout(dir.path()).expect("write");
    let tls = ReloadingServerConfig::load(
        CertFiles::in_dir(dir.path(), false),
        &[b"h2".as_slice(), b"http/1.1".as_slice()],
    )
    .expect("load");
    let state = Arc::new(WebhookState {
        caches: homelab_autoscaler::cache::Stores::start(&nowhere(), "homelab-autoscaler-system"),
        client: nowhere(),
        namespace: "homelab-autoscaler-system".into(),
        operator_usernames: vec![],
        clock: Box::new(SystemClock),
        timeouts: Default::default(),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let stop = CancellationToken::new();
    tokio::spawn(webhook::server::serve_https(listener, tls, webhook::router(state), stop.clone()));
    Server { address, ca_pem: bundle.ca_pem, stop, _dir: dir }
}

async fn grpc_server() -> Server {
    homelab_autoscaler::tls::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = issue_self_signed(&["localhost".into()], &[]).expect("issue");
    bundle.write_secret_layout(dir.path()).expect("write");
    let tls =
        homelab_autoscaler::grpc::tls::load(CertFiles::in_dir(dir.path(), true)).expect("load");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let stop = CancellationToken::new();
    let provider = Provider::start(nowhere(), ProviderConfig::new("nowhere"));
    tokio::spawn(serve_on(listener, provider, Some(tls), Duration::from_secs(30), stop.clone()));
    Server { address, ca_pem: bundle.ca_pem, stop, _dir: dir }
}

/// A ClientHello offering at most `version` (0x0301 = TLS 1.0, 0x0302 = TLS 1.1) and CBC
/// suites those versions know, with no extensions: what an old client sends.
fn legacy_client_hello(version: u16) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&version.to_be_bytes());
    body.extend_from_slice(&[7u8; 32]); // random
    body.push(0); // no session id
    let suites: [u16; 3] = [0xc013, 0x002f, 0x0035];
    body.extend_from_slice(&((suites.len() * 2) as u16).to_be_bytes());
    for suite in suites {
        body.extend_from_slice(&suite.to_be_bytes());
    }
    body.extend_from_slice(&[1, 0]); // compression: null only
    let mut handshake = vec![1]; // ClientHello
    handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend_from_slice(&body);
    let mut record = vec![0x16]; // handshake record
    record.extend_from_slice(&0x0301u16.to_be_bytes());
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

/// What the server answers a legacy ClientHello with: the first record's bytes.
async fn answer_to_legacy_hello(address: SocketAddr, version: u16) -> Vec<u8> {
    let mut tcp = TcpStream::connect(address).await.expect("connect");
    tcp.write_all(&legacy_client_hello(version)).await.expect("write");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the server neither answered nor closed");
    answer
}

/// The server refuses at once: its first record is a fatal alert (rustls sends
/// handshake_failure, 40; protocol_version, 70, would do as well), never a ServerHello.
fn assert_refused_at_hello(answer: &[u8], what: &str) {
    assert!(answer.len() >= 7, "{what}: answer too short: {answer:02x?}");
    assert_eq!(answer[0], 0x15, "{what}: not an alert record: {answer:02x?}");
    assert_eq!(answer[5], 2, "{what}: not a fatal alert: {answer:02x?}");
    assert!([40, 70].contains(&answer[6]), "{what}: unexpected alert: {answer:02x?}");
}

/// A rustls client limited to one TLS version; returns the negotiated version.
async fn handshake_with(
    address: SocketAddr,
    ca_pem: &str,
    version: &'static rustls::SupportedProtocolVersion,
    alpn: &[u8],
) -> Result<rustls::ProtocolVersion, std::io::Error> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("pem")).expect("root");
    }
    let mut config = rustls::ClientConfig::builder_with_protocol_versions(&[version])
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(address).await?;
    let name = ServerName::try_from("localhost").expect("name");
    let stream = connector.connect(name, tcp).await?;
    Ok(stream.get_ref().1.protocol_version().expect("negotiated"))
}

#[tokio::test]
async fn both_servers_refuse_tls_older_than_1_2_and_speak_1_2_and_1_3() {
    let hooks = webhook_server().await;
    let grpc = grpc_server().await;
    for (name, server) in [("webhook", &hooks), ("gRPC", &grpc)] {
        for (version, label) in [(0x0301, "TLS 1.0"), (0x0302, "TLS 1.1")] {
            let answer = answer_to_legacy_hello(server.address, version).await;
            assert_refused_at_hello(&answer, &format!("{name} offered {label}"));
        }
    }
    for (version, expected) in [
        (&rustls::version::TLS12, rustls::ProtocolVersion::TLSv1_2),
        (&rustls::version::TLS13, rustls::ProtocolVersion::TLSv1_3),
    ] {
        let got = handshake_with(hooks.address, &hooks.ca_pem, version, b"http/1.1").await;
        assert_eq!(got.expect("webhook handshake"), expected);
    }
    // The gRPC server wants a client certificate, so a client without one cannot finish a
    // handshake; the refusal of old versions above is what matters there (the mutual-TLS
    // refusals are in grpc_tls.rs).
}

/// One HTTP/1.1 POST over TLS with a body of `size` bytes; the status and body of the answer.
async fn post(server: &Server, size: usize) -> std::io::Result<(u16, String)> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(server.ca_pem.as_bytes()) {
        roots.add(cert.expect("pem")).expect("root");
    }
    let mut config =
        rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(server.address).await?;
    let mut stream =
        connector.connect(ServerName::try_from("localhost").expect("name"), tcp).await?;
    let head = format!(
        "POST /validate/nodeclaims HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {size}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    let chunk = vec![b' '; 64 * 1024];
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len());
        stream.write_all(&chunk[..n]).await?;
        left -= n;
    }
    stream.flush().await?;
    let mut raw = Vec::new();
    match stream.read_to_end(&mut raw).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(e),
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Ok((status, text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_admission_request_is_answered_413_and_the_server_lives_on() {
    let server = webhook_server().await;
    // 8 MiB: refused with 413 and a reason, not a dropped connection.
    let (status, text) = post(&server, 8 * 1024 * 1024).await.expect("an answer, not a reset");
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("larger than"), "{text}");
    // Just past the limit, too.
    let (status, _) = post(&server, MAX_REVIEW_BYTES + 1).await.expect("answer");
    assert_eq!(status, 413);
    // A body of 3 MiB (a large review from the apiserver can be that big) passes the limit and
    // is judged as what it is: whitespace is not JSON (400), not "too large".
    let (status, text) = post(&server, 3 * 1024 * 1024).await.expect("answer");
    assert_eq!(status, 400, "{text}");
    // Still serving.
    let (status, text) = post(&server, 2).await.expect("answer");
    assert_eq!(status, 400, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_grpc_request_is_refused_before_decoding_and_the_server_lives_on() {
    let (address, stop) = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let stop = CancellationToken::new();
        let provider = Provider::start(nowhere(), ProviderConfig::new("nowhere"));
        tokio::spawn(serve_on(listener, provider, None, Duration::from_secs(30), stop.clone()));
        (address, stop)
    };
    let mut client =
        CloudProviderClient::connect(format!("http://{address}")).await.expect("connect");
    let big = proto::NodeGroupForNodeRequest {
        node: Some(proto::ExternalGrpcNode {
            name: "x".repeat(MAX_REQUEST_BYTES + 1),
            ..Default::default()
        }),
    };
    let refused = client.node_group_for_node(big).await.expect_err("refused");
    assert!(
        matches!(refused.code(), tonic::Code::OutOfRange | tonic::Code::ResourceExhausted),
        "{refused:?}"
    );
    let label = client.gpu_label(proto::GpuLabelRequest {}).await.expect("still serving");
    assert_eq!(label.into_inner().label, "accelerator");
    stop.cancel();
}
