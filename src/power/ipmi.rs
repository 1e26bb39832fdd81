//! IPMI over LAN: an RMCP+ session (cipher suite 3: RAKP-HMAC-SHA1, HMAC-SHA1-96 integrity,
//! AES-CBC-128 confidentiality) from the `ipmi-rs` crate, and the two chassis commands it does
//! not ship, written here: Set Session Privilege Level (§22.18), Get Chassis Status and Chassis
//! Control (§28.2, §28.3).
//! `ipmi-rs` is blocking, so each call runs on tokio's blocking pool with a fresh session, through
//! the relay in `rmcp_ping` (a BMC need not answer the RMCP ping).

use std::sync::atomic::Ordering;
use std::time::Duration;

use ipmi_rs::connection::{IpmiCommand, Message, NetFn, NotEnoughData};
use ipmi_rs::rmcp::{ActivationError, Rmcp, V2_0ActivationError};

use super::resolve::Resolver;
use super::rmcp_ping::{Relay, Seen};
use super::{PowerError, PowerState, Reads, Secrets};
use crate::api::{Ipmi, IpmiOffMethod, PowerAction};

const DEFAULT_PORT: u16 = 623;
const TIMEOUT: Duration = Duration::from_secs(5);

/// A BMC reached over RMCP+.
pub struct Bmc {
    host: String,
    port: u16,
    user: String,
    password: String,
    secret: String,
    off: IpmiOffMethod,
}

impl Bmc {
    pub fn new(settings: &Ipmi, secrets: &Secrets) -> Result<Self, PowerError> {
        if settings.cipher_suite.is_some_and(|c| c != 3) {
            return Err(PowerError::Settings(
                "ipmi.cipherSuite: only cipher suite 3 is supported".into(),
            ));
        }
        Ok(Bmc {
            host: settings.host.clone(),
            port: settings.port.unwrap_or(DEFAULT_PORT),
            user: secrets.text(&settings.credentials.username())?,
            password: secrets.text(&settings.credentials.password())?,
            secret: settings.credentials.secret_name.clone(),
            off: settings.off_method.unwrap_or(IpmiOffMethod::Soft),
        })
    }

    /// Opens a session and sends `command`, on the blocking pool, through the relay that lets
    /// a BMC skip the RMCP pong.
    async fn send<C>(&self, command: C) -> Result<C::Output, PowerError>
    where
        C: IpmiCommand + Send + 'static,
        C::Output: Send + 'static,
        C::Error: std::fmt::Debug,
    {
        let peer = self.peer();
        let addrs = Resolver::new()
            .lookup(&self.host, self.port)
            .await
            .map_err(|e| PowerError::protocol(&peer, e))?;
        let bmc = addrs[0];
        let relay = Relay::start(bmc)
            .await
            .map_err(|e| PowerError::protocol(&peer, format!("opening a UDP socket: {e}")))?;
        let (local, user, password) = (relay.local, self.user.clone(), self.password.clone());
        let (secret, seen, port) = (self.secret.clone(), relay.seen.clone(), self.port);
        let joined = tokio::task::spawn_blocking(move || {
            let mut rmcp = Rmcp::new(local, TIMEOUT)
                .map_err(|e| PowerError::protocol(&peer, format!("opening a UDP socket: {e}")))?;
            rmcp.activate(true, Some(&user), Some(password.as_bytes()))
                .map_err(|e| activation_error(&peer, &secret, port, &seen, e))?;
            let mut ipmi = ipmi_rs::Ipmi::new(rmcp);
            // A new RMCP+ session runs at User privilege whatever it asked for; chassis control
            // needs the level raised, as ipmitool does.
            ipmi.send_recv(SetSessionPrivilegeLevel(ADMINISTRATOR)).map_err(|e| {
                PowerError::protocol(
                    &peer,
                    format!("raising the session to Administrator privilege: {e:?} (is the BMC user an administrator?)"),
                )
            })?;
            ipmi.send_recv(command).map_err(|e| PowerError::protocol(&peer, format!("{e:?}")))
        })
        .await;
        drop(relay);
        joined.map_err(|e| {
            PowerError::protocol(self.peer(), format!("the IPMI call panicked: {e}"))
        })?
    }
}

/// Tells a refused login from a BMC that does not answer.
fn activation_error(
    peer: &str,
    secret: &str,
    port: u16,
    seen: &Seen,
    error: ActivationError,
) -> PowerError {
    use V2_0ActivationError as V2;
    match error {
        ActivationError::V2_0(
            e @ (V2::RakpMessage2Parse(_)
            | V2::RakpMessage2Validate(_)
            | V2::ServerAuthenticationFailed
            | V2::RakpMessage4Parse(_)
            | V2::RakpMessage4Validate(_)
            | V2::RakpMessage4InvalidIntegrityCheckValue),
        ) => PowerError::Unauthorized {
            peer: peer.into(),
            secret: secret.into(),
            detail: format!("RMCP+ session refused: {e:?}"),
        },
        _ if seen.refused.load(Ordering::Relaxed) => PowerError::protocol(
            peer,
            format!(
                "UDP port {port} is closed: is IPMI over LAN enabled on the BMC, on this port?"
            ),
        ),
        _ if !seen.answered.load(Ordering::Relaxed) => PowerError::protocol(
            peer,
            format!(
                "no answer within {TIMEOUT:?}, neither to the RMCP ping nor to Get Channel \
                 Authentication Capabilities: is IPMI over LAN enabled on the BMC, and UDP port \
                 {port} reachable?"
            ),
        ),
        other => PowerError::protocol(peer, format!("opening an RMCP+ session: {other:?}")),
    }
}

/// The Administrator privilege level (IPMI 2.0 §22.18).
const ADMINISTRATOR: u8 = 0x04;

/// Set Session Privilege Level (NetFn App, 0x3B).
struct SetSessionPrivilegeLevel(u8);

impl From<SetSessionPrivilegeLevel> for Message {
    fn from(level: SetSessionPrivilegeLevel) -> Self {
        Message::new_request(NetFn::App, 0x3B, vec![level.0])
    }
}

impl IpmiCommand for SetSessionPrivilegeLevel {
    type Output = ();
    type Error = NotEnoughData;

    fn parse_success_response(_: &[u8]) -> Result<Self::Output, Self::Error> {
        Ok(())
    }
}

/// Get Chassis Status (NetFn Chassis, 0x01): bit 0 of the first byte is "power is on".
struct GetChassisStatus;

impl From<GetChassisStatus> for Message {
    fn from(_: GetChassisStatus) -> Self {
        Message::new_request(NetFn::Chassis, 0x01, Vec::new())
    }
}

impl IpmiCommand for GetChassisStatus {
    type Output = PowerState;
    type Error = NotEnoughData;

    fn parse_success_response(data: &[u8]) -> Result<Self::Output, Self::Error> {
        let first = data.first().ok_or(NotEnoughData)?;
        Ok(if first & 1 == 1 { PowerState::On } else { PowerState::Off })
    }
}

/// Chassis Control (NetFn Chassis, 0x02).
struct ChassisControl(u8);

impl ChassisControl {
    const POWER_DOWN: u8 = 0x00;
    const POWER_UP: u8 = 0x01;
    const SOFT_SHUTDOWN: u8 = 0x05;
}

impl From<ChassisControl> for Message {
    fn from(control: ChassisControl) -> Self {
        Message::new_request(NetFn::Chassis, 0x02, vec![control.0])
    }
}

impl IpmiCommand for ChassisControl {
    type Output = ();
    type Error = NotEnoughData;

    fn parse_success_response(_: &[u8]) -> Result<Self::Output, Self::Error> {
        Ok(())
    }
}

impl Reads for Bmc {
    fn peer(&self) -> String {
        format!("BMC at {}:{}", self.host, self.port)
    }

    async fn power_state(&self) -> Result<PowerState, PowerError> {
        self.send(GetChassisStatus).await
    }

    async fn set_power(&self, action: PowerAction) -> Result<(), PowerError> {
        let code = match (action, self.off) {
            (PowerAction::On, _) => ChassisControl::POWER_UP,
            (PowerAction::Off, IpmiOffMethod::Soft) => ChassisControl::SOFT_SHUTDOWN,
            (PowerAction::Off, IpmiOffMethod::Hard) => ChassisControl::POWER_DOWN,
        };
        self.send(ChassisControl(code)).await
    }
}
