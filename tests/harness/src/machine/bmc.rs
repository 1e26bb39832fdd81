//! A machine's BMC, speaking Redfish over HTTPS. A real BMC (iDRAC, iLO, an OpenBMC board) is a
//! small computer on the motherboard, fed by the power supply's standby rail: it answers while
//! the host is off, and its network port is often shared with the host's card (shared LOM), at
//! an address of its own. It holds a login, and acts on the host's power: `On` presses the power
//! button of a machine that is off, `ForceOff` cuts the host's power, `GracefulShutdown` asks the
//! OS (ACPI) to shut down in order, and the system's `PowerState` reads the power rail.
//!
//! This one does the same, bound to the machine's firmware: a second address on the machine's
//! `eth0`, inside its namespace (so a cut cable cuts it off too, as with a shared port), port
//! 443, a certificate of its own CA, HTTP basic authentication on everything but the service
//! root, and the schema's shapes as sushy-emulator serves them: the service root, the
//! `Systems` collection with one system named after the machine, the system with `PowerState`
//! and its `#ComputerSystem.Reset` action with the reset types it allows. A reset is answered
//! with 204 at once and carried out after, as a BMC does; `PowerState` reads the firmware's
//! state as of its last completed transition (a machine shutting down is still On). Without
//! mains (its plug's relay off) it has no standby power: connections are dropped unanswered.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::{Lan, Machine, PowerState, netns};

/// The port Redfish is served on.
pub const REDFISH_PORT: u16 = 443;

/// The reset types this BMC carries out (`ResetType@Redfish.AllowableValues`).
const RESET_TYPES: &[&str] = &[
    "On",
    "ForceOn",
    "ForceOff",
    "GracefulShutdown",
    "GracefulRestart",
    "ForceRestart",
    "PushPowerButton",
];

/// One `ComputerSystem.Reset` the BMC accepted.
#[derive(Clone, Debug)]
pub struct Reset {
    pub at: Instant,
    pub reset_type: String,
    /// The host's power state when it arrived.
    pub state: PowerState,
}

/// The BMC; dropping it stops it.
pub struct Bmc {
    address: Ipv4Addr,
    ca_pem: String,
    resets: Arc<Mutex<Vec<Reset>>>,
    server: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct Service {
    machine: Machine,
    /// `Basic <base64 user:password>`.
    authorization: String,
    resets: Arc<Mutex<Vec<Reset>>>,
}

impl Bmc {
    /// Gives `machine` a BMC at the lan's next free address, with the login `user`/`password`.
    pub async fn start(machine: &Machine, lan: &Lan, user: &str, password: &str) -> Result<Self> {
        let address = lan.next_address()?;
        netns::ip(&["-n", machine.netns(), "addr", "add", &format!("{address}/24"), "dev", "eth0"])
            .context("giving the BMC its address on the machine's port")?;
        let bundle = homelab_autoscaler::tls::issue_self_signed(&[], &[address.into()])
            .context("issuing the BMC's certificate")?;
        let certs = CertificateDer::pem_slice_iter(bundle.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .context("reading the BMC's certificate")?;
        let key = PrivateKeyDer::from_pem_slice(bundle.key_pem.as_bytes())
            .context("reading the BMC's key")?;
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .context("the BMC's TLS configuration")?;
        let listen = SocketAddr::from((address, REDFISH_PORT));
        let listener = netns::tcp_listener(machine.netns(), listen)
            .context("listening for Redfish in the machine's namespace")?;
        let listener = TlsListener {
            tcp: listener,
            tls: TlsAcceptor::from(Arc::new(config)),
            machine: machine.clone(),
        };
        // k8s-openapi's ByteString serializes as base64, which basic authentication is.
        let credentials = serde_json::to_value(k8s_openapi::ByteString(
            format!("{user}:{password}").into_bytes(),
        ))?;
        let credentials = credentials.as_str().context("base64 of the login")?.to_owned();
        let resets: Arc<Mutex<Vec<Reset>>> = Arc::default();
        let service = Service {
            machine: machine.clone(),
            authorization: format!("Basic {credentials}"),
            resets: resets.clone(),
        };
        let app = axum::Router::new()
            .route("/redfish", get(versions))
            .route("/redfish/v1", get(service_root))
            .route("/redfish/v1/", get(service_root))
            .route("/redfish/v1/Systems", get(systems))
            .route("/redfish/v1/Systems/{id}", get(system))
            .route("/redfish/v1/Systems/{id}/Actions/ComputerSystem.Reset", post(reset))
            .fallback(|| async {
                error(StatusCode::NOT_FOUND, "Base.1.8.ResourceMissingAtURI", "no such resource")
            })
            .with_state(service);
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { address, ca_pem: bundle.ca_pem, resets, server })
    }

    /// `https://<address>`: what a slot's `redfish.endpoint` names.
    pub fn endpoint(&self) -> String {
        format!("https://{}", self.address)
    }

    /// The PEM certificate of the CA that signed the BMC's certificate (`redfish.tls.caBundle`).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Every reset it accepted, in order.
    pub fn resets(&self) -> Vec<Reset> {
        self.resets.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for Bmc {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Accepts TLS connections while the machine has mains; without it, drops them unanswered.
struct TlsListener {
    tcp: TcpListener,
    tls: TlsAcceptor,
    machine: Machine,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            // A failed accept or handshake loses that one connection; the client retries.
            let Ok((stream, peer)) = self.tcp.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            if !self.machine.has_mains() {
                continue;
            }
            let handshake = tokio::time::timeout(Duration::from_secs(5), self.tls.accept(stream));
            if let Ok(Ok(stream)) = handshake.await {
                return (stream, peer);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// A Redfish error body, as the schema's `error` object.
fn error(status: StatusCode, id: &str, message: &str) -> Response {
    let body = json!({ "error": {
        "code": id,
        "message": message,
        "@Message.ExtendedInfo": [{ "MessageId": id, "Message": message }],
    }});
    (status, Json(body)).into_response()
}

impl Service {
    /// `None` when the request carries the login; else the 401 to answer.
    fn refused(&self, headers: &HeaderMap) -> Option<Response> {
        let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        if given == Some(self.authorization.as_str()) {
            return None;
        }
        let mut response = error(
            StatusCode::UNAUTHORIZED,
            "Base.1.8.AccessDenied",
            "Incorrect username or password",
        );
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Basic realm=\"Redfish\""),
        );
        Some(response)
    }

    fn system_path(&self) -> String {
        format!("/redfish/v1/Systems/{}", self.machine.name())
    }
}

async fn versions() -> Json<Value> {
    Json(json!({ "v1": "/redfish/v1/" }))
}

/// The service root needs no login, as the standard has it.
async fn service_root() -> Json<Value> {
    Json(json!({
        "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
        "@odata.id": "/redfish/v1/",
        "Id": "RedfishService",
        "Name": "Redfish Service",
        "RedfishVersion": "1.5.0",
        "Systems": { "@odata.id": "/redfish/v1/Systems" },
    }))
}

async fn systems(State(bmc): State<Service>, headers: HeaderMap) -> Response {
    if let Some(refused) = bmc.refused(&headers) {
        return refused;
    }
    Json(json!({
        "@odata.type": "#ComputerSystemCollection.ComputerSystemCollection",
        "@odata.id": "/redfish/v1/Systems",
        "Name": "Computer System Collection",
        "Members@odata.count": 1,
        "Members": [{ "@odata.id": bmc.system_path() }],
    }))
    .into_response()
}

async fn system(
    State(bmc): State<Service>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = bmc.refused(&headers) {
        return refused;
    }
    if id != bmc.machine.name() {
        return error(StatusCode::NOT_FOUND, "Base.1.8.ResourceMissingAtURI", "no such system");
    }
    // A machine suspended to RAM is On, as Redfish reports S3.
    let state = match bmc.machine.power_state_now() {
        PowerState::On => "On",
        PowerState::Off => "Off",
    };
    let path = bmc.system_path();
    Json(json!({
        "@odata.type": "#ComputerSystem.v1_10_0.ComputerSystem",
        "@odata.id": path,
        "Id": id,
        "Name": id,
        "SystemType": "Physical",
        "PowerState": state,
        "Actions": { "#ComputerSystem.Reset": {
            "target": format!("{path}/Actions/ComputerSystem.Reset"),
            "ResetType@Redfish.AllowableValues": RESET_TYPES,
        }},
    }))
    .into_response()
}

async fn reset(
    State(bmc): State<Service>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Some(refused) = bmc.refused(&headers) {
        return refused;
    }
    if id != bmc.machine.name() {
        return error(StatusCode::NOT_FOUND, "Base.1.8.ResourceMissingAtURI", "no such system");
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let Some(reset_type) = body["ResetType"].as_str().map(str::to_owned) else {
        return error(StatusCode::BAD_REQUEST, "Base.1.8.PropertyMissing", "ResetType is missing");
    };
    if !RESET_TYPES.contains(&reset_type.as_str()) {
        let message = format!("ResetType {reset_type} is not supported");
        return error(StatusCode::BAD_REQUEST, "Base.1.8.ActionParameterNotSupported", &message);
    }
    let machine = bmc.machine.clone();
    let state = machine.power_state_now();
    if let Ok(mut resets) = bmc.resets.lock() {
        resets.push(Reset { at: Instant::now(), reset_type: reset_type.clone(), state });
    }
    // Answered now, carried out after, as a BMC does.
    tokio::spawn(async move {
        let done = match reset_type.as_str() {
            "On" | "ForceOn" => machine.power_on().await,
            "ForceOff" => machine.power_cut().await,
            "GracefulShutdown" => machine.shutdown().await,
            "GracefulRestart" => match machine.shutdown().await {
                Ok(()) => machine.power_on().await,
                Err(e) => Err(e),
            },
            "ForceRestart" => match machine.power_cut().await {
                Ok(()) => machine.power_on().await,
                Err(e) => Err(e),
            },
            _ if state == PowerState::On => machine.shutdown().await,
            _ => machine.power_on().await,
        };
        if let Err(error) = done {
            eprintln!("BMC of machine {}: {reset_type}: {error:#}", machine.name());
        }
    });
    StatusCode::NO_CONTENT.into_response()
}
