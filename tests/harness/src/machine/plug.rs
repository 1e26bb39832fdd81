//! A metering smart plug between the wall and a machine, speaking the Shelly Gen2 RPC over HTTP
//! as a Shelly Plus Plug S does: `Switch.Set` (`?id=0&on=true|false`, by GET or POST, or a
//! JSON-RPC POST to `/rpc`), `Switch.Toggle` and `Switch.GetStatus` with the live draw in
//! `apower`. A real plug's relay is the machine's mains: open, the machine loses its power at
//! once and nothing (its card, its BMC, its button) can turn it on; closed, the power supply is
//! fed again, and the machine boots only if its BIOS is set to power on when AC returns
//! (`MachineSpec::power_on_with_ac`). Its meter reads what the machine draws from the wall.
//!
//! This one does the same, bound to the machine's firmware: the relay sets the firmware's mains
//! (it starts open), and the meter reads the firmware's state: [`ON_WATTS`] while the OS runs
//! (until a shutdown has completed), [`SUSPENDED_WATTS`] while it is suspended to RAM,
//! [`STANDBY_WATTS`] for a halted machine on mains (its power supply's standby rail), 0 with the
//! relay open. It is wired to the lan's switch at an address
//! of its own (on the lan's bridge, in the lan's namespace), port 80, no login, as such plugs
//! ship. The operator runs in the test process, in the root namespace, where the lan's addresses
//! do not exist; in a cluster it reaches the plug over the house's network whatever the machine's
//! own cable does. So the same device also answers on 127.0.0.1 ([`Plug::operator_base`]): the
//! operator's route to the plug, which a cut of the machine's link leaves alone. Every switch of the relay is recorded with the draw and the machine's state at that
//! instant, so a test can tell when the relay was cut relative to the OS halting.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::{Lan, Machine, PowerState, netns};

/// The port the plug serves its RPC on.
pub const PLUG_PORT: u16 = 80;
/// What the machine draws with its OS running: a mini PC at light load.
pub const ON_WATTS: f64 = 32.0;
/// What a halted machine on mains draws: its power supply's standby rail.
pub const STANDBY_WATTS: f64 = 1.4;
/// What a machine suspended to RAM draws: its memory refreshed, its card listening.
pub const SUSPENDED_WATTS: f64 = 2.6;

/// One switch of the relay, and the machine as it was at that instant.
#[derive(Clone, Debug)]
pub struct RelaySwitch {
    pub at: Instant,
    /// The relay's new position (`true`: closed, mains on).
    pub on: bool,
    /// The draw the meter read at that instant, before the switch.
    pub watts: f64,
    /// The machine's power state at that instant, before the switch.
    pub state: PowerState,
}

/// The plug; dropping it stops its RPC (the relay stays as it is).
pub struct Plug {
    address: Ipv4Addr,
    /// Where the operator (in the root namespace) reaches the same device.
    operator_address: SocketAddr,
    switches: Arc<Mutex<Vec<RelaySwitch>>>,
    readings: Arc<Mutex<Vec<(Instant, f64)>>>,
    servers: [tokio::task::JoinHandle<()>; 2],
}

#[derive(Clone)]
struct Device {
    machine: Machine,
    switches: Arc<Mutex<Vec<RelaySwitch>>>,
    /// Every meter reading it answered, when and what.
    readings: Arc<Mutex<Vec<(Instant, f64)>>>,
}

impl Plug {
    /// Puts `machine` behind a plug at the lan's next free address, its relay open: the machine
    /// loses mains now.
    pub async fn start(machine: &Machine, lan: &Lan) -> Result<Self> {
        machine.set_mains(false).await.context("opening the plug's relay")?;
        let (address, lan_netns) = lan.attach_device()?;
        let listen = SocketAddr::from((address, PLUG_PORT));
        let listener = netns::tcp_listener(lan_netns, listen)
            .context("listening for the plug's RPC on the lan")?;
        let switches: Arc<Mutex<Vec<RelaySwitch>>> = Arc::default();
        let readings: Arc<Mutex<Vec<(Instant, f64)>>> = Arc::default();
        let device = Device {
            machine: machine.clone(),
            switches: switches.clone(),
            readings: readings.clone(),
        };
        let app = axum::Router::new()
            .route("/rpc/Switch.Set", get(set).post(set))
            .route("/rpc/Switch.Toggle", get(toggle).post(toggle))
            .route("/rpc/Switch.GetStatus", get(status).post(status))
            .route("/rpc", post(json_rpc))
            .with_state(device);
        let operator_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("listening for the plug's RPC on 127.0.0.1")?;
        let operator_address = operator_listener.local_addr()?;
        let on_lan = app.clone();
        let servers = [
            tokio::spawn(async move {
                let _ = axum::serve(listener, on_lan).await;
            }),
            tokio::spawn(async move {
                let _ = axum::serve(operator_listener, app).await;
            }),
        ];
        Ok(Self { address, operator_address, switches, readings, servers })
    }

    /// `http://127.0.0.1:<port>`: the same plug as the operator reaches it (a meter the operator
    /// reads itself, a switch a person flips from an app). Not reachable from the lan.
    pub fn operator_base(&self) -> String {
        format!("http://{}", self.operator_address)
    }

    /// `http://<address>`: the base of the slot's `http` request URLs.
    pub fn base(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Every switch of the relay so far, in order.
    pub fn switches(&self) -> Vec<RelaySwitch> {
        self.switches.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Every meter reading it answered so far (Switch.GetStatus), in order: when, and the watts.
    pub fn readings(&self) -> Vec<(Instant, f64)> {
        self.readings.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for Plug {
    fn drop(&mut self) {
        for server in &self.servers {
            server.abort();
        }
    }
}

impl Device {
    fn watts(&self) -> f64 {
        match (self.machine.has_mains(), self.machine.power_state_now()) {
            (false, _) => 0.0,
            (true, PowerState::On) if self.machine.suspended() => SUSPENDED_WATTS,
            (true, PowerState::On) => ON_WATTS,
            (true, PowerState::Off) => STANDBY_WATTS,
        }
    }

    /// The Switch.GetStatus answer.
    fn status(&self) -> Value {
        let watts = self.watts();
        if let Ok(mut readings) = self.readings.lock() {
            readings.push((Instant::now(), watts));
        }
        let voltage = 230.0;
        json!({
            "id": 0,
            "source": "http",
            "output": self.machine.has_mains(),
            "apower": watts,
            "voltage": voltage,
            "current": (watts / voltage * 1000.0).round() / 1000.0,
            "temperature": { "tC": 38.2, "tF": 100.8 },
        })
    }

    /// Switches the relay and answers `was_on`. The machine feels it at once (a task of its
    /// own: a cut kills its processes, a closing relay may boot it).
    fn switch(&self, on: bool) -> Value {
        let was_on = self.machine.has_mains();
        if let Ok(mut switches) = self.switches.lock() {
            let state = self.machine.power_state_now();
            switches.push(RelaySwitch { at: Instant::now(), on, watts: self.watts(), state });
        }
        let machine = self.machine.clone();
        tokio::spawn(async move {
            if let Err(error) = machine.set_mains(on).await {
                eprintln!("plug of machine {}: {error:#}", machine.name());
            }
        });
        json!({ "was_on": was_on })
    }
}

/// Shelly's error answer for a bad argument.
fn bad_argument(message: &str) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "code": -103, "message": message }))).into_response()
}

/// The `id` and `on` arguments, from the query or a JSON body's params.
fn argument(query: &serde_json::Map<String, Value>, name: &str) -> Option<String> {
    query.get(name).map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
}

/// The arguments of a call: the query's (`?id=0&on=true`, plain words, as Shelly's are) and a
/// JSON body's.
fn parameters(uri: &Uri, body: &[u8]) -> serde_json::Map<String, Value> {
    let mut all: serde_json::Map<String, Value> = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), Value::String(v.to_owned())))
        .collect();
    if let Ok(Value::Object(params)) = serde_json::from_slice::<Value>(body) {
        all.extend(params);
    }
    all
}

fn only_switch_zero(params: &serde_json::Map<String, Value>) -> Option<Response> {
    match argument(params, "id").as_deref() {
        Some("0") => None,
        Some(other) => Some(bad_argument(&format!("Argument 'id', value {other} not found!"))),
        None => Some(bad_argument("Missing required argument 'id'!")),
    }
}

async fn set(State(plug): State<Device>, uri: Uri, body: axum::body::Bytes) -> Response {
    let params = parameters(&uri, &body);
    if let Some(refused) = only_switch_zero(&params) {
        return refused;
    }
    match argument(&params, "on").as_deref() {
        Some("true") => Json(plug.switch(true)).into_response(),
        Some("false") => Json(plug.switch(false)).into_response(),
        _ => bad_argument("Argument 'on' must be true or false!"),
    }
}

async fn toggle(State(plug): State<Device>, uri: Uri, body: axum::body::Bytes) -> Response {
    let params = parameters(&uri, &body);
    if let Some(refused) = only_switch_zero(&params) {
        return refused;
    }
    Json(plug.switch(!plug.machine.has_mains())).into_response()
}

async fn status(State(plug): State<Device>, uri: Uri, body: axum::body::Bytes) -> Response {
    let params = parameters(&uri, &body);
    if let Some(refused) = only_switch_zero(&params) {
        return refused;
    }
    Json(plug.status()).into_response()
}

/// `POST /rpc` with `{"id":1,"method":"Switch.Set","params":{"id":0,"on":true}}`.
async fn json_rpc(State(plug): State<Device>, Json(call): Json<Value>) -> Response {
    let params = call["params"].as_object().cloned().unwrap_or_default();
    if let Some(refused) = only_switch_zero(&params) {
        return refused;
    }
    let result = match (call["method"].as_str(), params.get("on").and_then(Value::as_bool)) {
        (Some("Switch.Set"), Some(on)) => plug.switch(on),
        (Some("Switch.Toggle"), _) => plug.switch(!plug.machine.has_mains()),
        (Some("Switch.GetStatus"), _) => plug.status(),
        _ => return bad_argument("unknown method or missing argument"),
    };
    Json(json!({ "id": call["id"], "src": "shellyplusplugs", "result": result })).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_reads_its_arguments_from_the_query_or_the_body() {
        let query: Uri = "/rpc/Switch.Set?id=0&on=false".parse().expect("uri");
        let params = parameters(&query, b"");
        assert_eq!(argument(&params, "on").as_deref(), Some("false"));
        assert!(only_switch_zero(&params).is_none());
        let bare: Uri = "/rpc/Switch.Set".parse().expect("uri");
        let params = parameters(&bare, br#"{"id":0,"on":true}"#);
        assert_eq!(argument(&params, "on").as_deref(), Some("true"), "a JSON bool reads as text");
        assert_eq!(argument(&params, "id").as_deref(), Some("0"));
        let other: Uri = "/rpc/Switch.GetStatus?id=1".parse().expect("uri");
        let refused = only_switch_zero(&parameters(&other, b"")).expect("switch 1 is refused");
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
        assert!(only_switch_zero(&parameters(&bare, b"")).is_some(), "no id is refused");
    }
}
