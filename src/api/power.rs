//! `spec.power` of a slot: typed power drivers, the alternative to writing a startup and a
//! shutdown pod spec. The operator turns a driver into the same startup and shutdown Jobs; their
//! pod runs `homelab-autoscaler power on|off` with these settings and the referenced Secrets.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Toleration;
use serde::{Deserialize, Serialize};

/// How a machine is powered on and off. Configure the drivers the machine has; `onWith` and
/// `offWith` pick among them when more than one could do the job (say, a BMC that can do both,
/// and SSH for a clean shutdown). No field is named `on` or `off`: YAML readers in the 1.1
/// style, kubectl's and Helm's among them, take an unquoted `on:` or `off:` for a boolean.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, kube::KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PowerSpec {
    /// The driver that powers the machine on. Unset: the one configured driver that can
    /// (wakeOnLan, redfish, ipmi, http).
    #[serde(default, rename = "onWith", skip_serializing_if = "Option::is_none")]
    pub on: Option<PowerDriverKind>,
    /// The driver that powers the machine off. Unset: the one configured driver that can
    /// (ssh, redfish, ipmi, http with an `offRequest`).
    #[serde(default, rename = "offWith", skip_serializing_if = "Option::is_none")]
    pub off: Option<PowerDriverKind>,
    /// Wake-on-LAN: a magic packet to the machine's MAC (power on only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_on_lan: Option<WakeOnLan>,
    /// A BMC speaking Redfish (iDRAC, iLO, OpenBMC, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redfish: Option<Redfish>,
    /// A BMC speaking IPMI over LAN (RMCP+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipmi: Option<Ipmi>,
    /// A smart plug or home-automation switch driven by HTTP requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpPower>,
    /// A clean shutdown over SSH (power off only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<SshShutdown>,
    /// How long `power on`/`power off` waits for the machine to report the new state, where the
    /// protocol can read it (Redfish, IPMI). Defaults to 120.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 290))]
    pub confirm_timeout_seconds: Option<u32>,
    /// Steps that power the machine on, in order, instead of one `onWith` driver (say `http` to
    /// switch the plug on, then `wakeOnLan` for a machine that does not boot when AC returns).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Atomic)]
    pub on_sequence: Vec<PowerStep>,
    /// Steps that power the machine off, in order, instead of one `offWith` driver: `ssh` to
    /// shut the OS down, then `http` to cut the plug's relay once the draw has fallen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Atomic)]
    pub off_sequence: Vec<PowerStep>,
    /// What the machine draws from the wall, for the pool's energy report and, with the pool's
    /// tariff, the hourly rate cluster-autoscaler's price expander sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watts: Option<PowerWatts>,
    /// Suspend the machine to RAM instead of powering it off when no claim wants it: the
    /// `ssh` driver's login runs the suspend command, and the wake path is the on path (a
    /// Wake-on-LAN packet). The machine keeps its Kubernetes node while it sleeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<Suspend>,
    /// Where the power Jobs may run (a node on the machines' LAN).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub node_selector: std::collections::BTreeMap<String, String>,
    /// Tolerations of the power Jobs' pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
}

/// The machine's draw in watts. Named `whenOn`/`whenOff`, not `on`/`off`, for the YAML readers
/// that take an unquoted `on:` for a boolean.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PowerWatts {
    /// The draw of the machine running.
    #[schemars(range(min = 0.0, max = 100000.0))]
    pub when_on: f64,
    /// The standby draw of the machine off (its power supply and BMC). Defaults to 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 100000.0))]
    pub when_off: Option<f64>,
}

/// One step of a power sequence: a driver, run once the step's wait is over, within its bound.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PowerStep {
    /// The driver the step runs.
    pub driver: PowerDriverKind,
    /// Run the step only once the plug's meter (`http.meter`) reads below this many watts, and
    /// has for `drawSteadySeconds`: the OS has halted and the relay can be cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 100000.0))]
    pub after_draw_below_watts: Option<f64>,
    /// How long the draw must stay below `afterDrawBelowWatts`. Defaults to 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 600))]
    pub draw_steady_seconds: Option<u32>,
    /// Wait this long before the step: time for the OS to halt when the plug measures nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 600))]
    pub delay_seconds: Option<u32>,
    /// The step's bound, its wait included. Defaults to 120.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 600))]
    pub timeout_seconds: Option<u32>,
}

impl PowerStep {
    /// A step that runs `driver` at once, within the default bound.
    pub fn of(driver: PowerDriverKind) -> Self {
        PowerStep {
            driver,
            after_draw_below_watts: None,
            draw_steady_seconds: None,
            delay_seconds: None,
            timeout_seconds: None,
        }
    }
}

/// The default bound of a sequence step.
pub const DEFAULT_STEP_TIMEOUT_SECONDS: u32 = 120;
/// The default time a draw must stay under a step's threshold.
pub const DEFAULT_DRAW_STEADY_SECONDS: u32 = 10;

/// A power driver's name.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum PowerDriverKind {
    WakeOnLan,
    Redfish,
    Ipmi,
    Http,
    Ssh,
}

impl PowerDriverKind {
    pub fn field(self) -> &'static str {
        match self {
            PowerDriverKind::WakeOnLan => "wakeOnLan",
            PowerDriverKind::Redfish => "redfish",
            PowerDriverKind::Ipmi => "ipmi",
            PowerDriverKind::Http => "http",
            PowerDriverKind::Ssh => "ssh",
        }
    }
}

/// A power direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PowerAction {
    On,
    Off,
}

impl PowerAction {
    pub fn as_str(self) -> &'static str {
        match self {
            PowerAction::On => "on",
            PowerAction::Off => "off",
        }
    }

    /// The field of `spec.power` that picks this direction's driver.
    pub fn driver_field(self) -> &'static str {
        match self {
            PowerAction::On => "onWith",
            PowerAction::Off => "offWith",
        }
    }

    /// The field of `spec.power` with this direction's sequence.
    pub fn sequence_field(self) -> &'static str {
        match self {
            PowerAction::On => "onSequence",
            PowerAction::Off => "offSequence",
        }
    }

    /// The field of `spec.power.http` with this direction's request.
    pub fn request_field(self) -> &'static str {
        match self {
            PowerAction::On => "onRequest",
            PowerAction::Off => "offRequest",
        }
    }
}

/// A key of a Secret in the slot's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key in the Secret.
    #[schemars(length(min = 1))]
    pub key: String,
}

/// A Secret holding a login in the `kubernetes.io/basic-auth` layout: keys `username` and
/// `password`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
}

impl CredentialsRef {
    pub fn username(&self) -> SecretKeyRef {
        SecretKeyRef { name: self.secret_name.clone(), key: "username".into() }
    }
    pub fn password(&self) -> SecretKeyRef {
        SecretKeyRef { name: self.secret_name.clone(), key: "password".into() }
    }
}

/// Wake-on-LAN settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WakeOnLan {
    /// The MAC address of the network card that wakes the machine, as `aa:bb:cc:dd:ee:ff`.
    #[schemars(regex(pattern = r"^([0-9A-Fa-f]{2}[:-]){5}[0-9A-Fa-f]{2}$"))]
    pub mac: String,
    /// Where the magic packet goes: the LAN's broadcast address. Defaults to 255.255.255.255.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broadcast_address: Option<String>,
    /// The UDP port. Defaults to 9.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u16>,
}

/// Redfish settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Redfish {
    /// The BMC's base URL, such as `https://10.0.0.5`.
    #[schemars(regex(pattern = r"^https?://[^/\s]+(/.*)?$"))]
    pub endpoint: String,
    /// The system's id under /redfish/v1/Systems. Unset: the BMC's only system.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_id: Option<String>,
    /// The BMC login (Secret with `username` and `password`).
    pub credentials: CredentialsRef,
    /// How the BMC's certificate is checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<RedfishTls>,
    /// The ResetType that powers on. Defaults to `On`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_reset_type: Option<String>,
    /// The ResetType that powers off. Defaults to `GracefulShutdown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_reset_type: Option<String>,
}

/// TLS verification of a BMC. Default: verify against the public roots.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedfishTls {
    /// A PEM CA bundle that signed the BMC's certificate (a BMC's self-signed certificate works
    /// too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<SecretKeyRef>,
    /// Accept any certificate. Only for a BMC on a trusted network whose certificate cannot be
    /// pinned.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure_skip_verify: bool,
}

/// IPMI-over-LAN settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ipmi {
    /// The BMC's address (IP or DNS name).
    #[schemars(length(min = 1))]
    pub host: String,
    /// The UDP port. Defaults to 623.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u16>,
    /// The BMC login (Secret with `username` and `password`).
    pub credentials: CredentialsRef,
    /// The RMCP+ cipher suite. Only 3 (RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128), the one
    /// every IPMI 2.0 BMC must offer, is supported. Defaults to 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 3, max = 3))]
    pub cipher_suite: Option<u8>,
    /// The session's privilege level. Chassis control needs Administrator or Operator; the
    /// client asks for Administrator. Defaults to Administrator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privilege_level: Option<IpmiPrivilege>,
    /// How `off` powers down: `soft` (an ACPI shutdown through the OS) or `hard`. Defaults
    /// to `soft`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_method: Option<IpmiOffMethod>,
}

/// An IPMI session privilege level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum IpmiPrivilege {
    Administrator,
}

/// How IPMI powers a machine down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum IpmiOffMethod {
    Soft,
    Hard,
}

/// A smart plug or switch driven by HTTP.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpPower {
    /// The request that switches the machine on.
    #[serde(default, rename = "onRequest", skip_serializing_if = "Option::is_none")]
    pub on: Option<HttpRequest>,
    /// The request that switches the machine off (a hard cut: prefer an SSH shutdown first).
    #[serde(default, rename = "offRequest", skip_serializing_if = "Option::is_none")]
    pub off: Option<HttpRequest>,
    /// The request that reads the plug's live draw, for a sequence step that waits for the draw
    /// to fall (`afterDrawBelowWatts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meter: Option<PowerMeter>,
    /// Accept any TLS certificate of the device.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure_skip_verify: bool,
}

/// A plug's power meter: a request and where the watts are in its JSON answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PowerMeter {
    /// The request that reads the meter. Its method defaults to GET.
    pub request: HttpRequest,
    /// A JSON pointer (RFC 6901) to the watts in the answer, a number or a numeric string:
    /// `/apower` for a Shelly Gen2 `Switch.GetStatus`, `/StatusSNS/ENERGY/Power` for Tasmota's
    /// `Status 8`, `/state` for a Home Assistant sensor.
    #[schemars(regex(pattern = r"^(/[^/]*)*$"))]
    pub watts_pointer: String,
}

/// One HTTP request. Any 2xx answer is a success.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpRequest {
    /// The method. Defaults to POST.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(GET|POST|PUT|PATCH|DELETE)$"))]
    pub method: Option<String>,
    /// The URL.
    #[schemars(regex(pattern = r"^https?://\S+$"))]
    pub url: String,
    /// Request headers; a value may come from a Secret (an API token).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HttpHeader>,
    /// The body, sent as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// HTTP basic authentication (Secret with `username` and `password`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<CredentialsRef>,
}

impl HttpRequest {
    /// The Secrets the request reads: its basic auth and its headers' values.
    pub fn secret_names(&self) -> impl Iterator<Item = String> + '_ {
        let auth = self.basic_auth.iter().map(|a| a.secret_name.clone());
        auth.chain(
            self.headers.iter().filter_map(|h| h.value_from.as_ref()).map(|r| r.name.clone()),
        )
    }
}

/// An HTTP header: a literal value or one read from a Secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeader {
    #[schemars(length(min = 1))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The value from a Secret key, with `valuePrefix` in front (say `Bearer `).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<SecretKeyRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_prefix: Option<String>,
}

/// A shutdown over SSH.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SshShutdown {
    /// The machine's address.
    #[schemars(length(min = 1))]
    pub host: String,
    /// The port. Defaults to 22.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u16>,
    /// The user to log in as.
    #[schemars(length(min = 1))]
    pub user: String,
    /// The private key (OpenSSH format), from a Secret (`kubernetes.io/ssh-auth` keeps it under
    /// `ssh-privatekey`).
    pub private_key: SecretKeyRef,
    /// The machine's host key as `ssh-keyscan` prints it without the host part, such as
    /// `ssh-ed25519 AAAAC3...`. Any other key is refused.
    #[schemars(length(min = 1))]
    pub known_host_key: String,
    /// The command. Defaults to `sudo systemctl poweroff`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

/// The default SSH shutdown command.
pub const DEFAULT_SSH_COMMAND: &str = "sudo systemctl poweroff";

/// Suspend-to-RAM (ACPI S3) as the way a machine goes idle: it wakes in seconds on the same
/// Wake-on-LAN packet, with its kubelet, containers and cached images as they were.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Suspend {
    /// The command the `ssh` driver's login runs. Defaults to `sudo systemctl suspend`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub command: Option<String>,
    /// How long the machine must stop answering on its SSH port after the command for the
    /// suspend to count as done. Defaults to 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 120))]
    pub quiet_seconds: Option<u32>,
    /// What the machine draws suspended, for the pool's energy report. Defaults to
    /// `watts.whenOff`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 100000.0))]
    pub watts: Option<f64>,
    /// How long the machine may stay suspended; after that it is woken and powered off by the
    /// off path. Unset: it sleeps until a claim wakes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 43200))]
    pub power_off_after_minutes: Option<u32>,
}

/// The default suspend command.
pub const DEFAULT_SUSPEND_COMMAND: &str = "sudo systemctl suspend";
/// How long a machine must stay silent after the suspend command, unless the slot says.
pub const DEFAULT_SUSPEND_QUIET_SECONDS: u32 = 10;

/// Why a power spec cannot pick a driver for a direction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriverChoice {
    Chosen(PowerDriverKind),
    /// No configured driver can.
    None,
    /// `onWith`/`offWith` names a driver that is not configured or cannot go that way.
    Unusable(PowerDriverKind),
    /// Several could; `onWith`/`offWith` must pick.
    Ambiguous(Vec<PowerDriverKind>),
}

impl PowerSpec {
    /// The drivers configured, in a fixed order.
    pub fn configured(&self) -> Vec<PowerDriverKind> {
        let mut kinds = Vec::new();
        if self.wake_on_lan.is_some() {
            kinds.push(PowerDriverKind::WakeOnLan);
        }
        if self.redfish.is_some() {
            kinds.push(PowerDriverKind::Redfish);
        }
        if self.ipmi.is_some() {
            kinds.push(PowerDriverKind::Ipmi);
        }
        if self.http.is_some() {
            kinds.push(PowerDriverKind::Http);
        }
        if self.ssh.is_some() {
            kinds.push(PowerDriverKind::Ssh);
        }
        kinds
    }

    /// Whether the configured driver `kind` can power the machine `action`.
    pub fn can(&self, kind: PowerDriverKind, action: PowerAction) -> bool {
        match (kind, action) {
            (PowerDriverKind::WakeOnLan, PowerAction::On) => self.wake_on_lan.is_some(),
            (PowerDriverKind::WakeOnLan, PowerAction::Off) => false,
            (PowerDriverKind::Ssh, PowerAction::Off) => self.ssh.is_some(),
            (PowerDriverKind::Ssh, PowerAction::On) => false,
            (PowerDriverKind::Redfish, _) => self.redfish.is_some(),
            (PowerDriverKind::Ipmi, _) => self.ipmi.is_some(),
            (PowerDriverKind::Http, PowerAction::On) => {
                self.http.as_ref().is_some_and(|h| h.on.is_some())
            }
            (PowerDriverKind::Http, PowerAction::Off) => {
                self.http.as_ref().is_some_and(|h| h.off.is_some())
            }
        }
    }

    /// The steps of `action`'s sequence (empty without one).
    pub fn sequence(&self, action: PowerAction) -> &[PowerStep] {
        match action {
            PowerAction::On => &self.on_sequence,
            PowerAction::Off => &self.off_sequence,
        }
    }

    /// The driver that powers the machine `action`; with a sequence, its first step's (or the
    /// first step's driver that cannot go that way).
    pub fn driver_for(&self, action: PowerAction) -> DriverChoice {
        if let Some(first) = self.sequence(action).first() {
            let unusable = self.sequence(action).iter().find(|s| !self.can(s.driver, action));
            return match unusable {
                Some(step) => DriverChoice::Unusable(step.driver),
                None => DriverChoice::Chosen(first.driver),
            };
        }
        let explicit = match action {
            PowerAction::On => self.on,
            PowerAction::Off => self.off,
        };
        if let Some(kind) = explicit {
            return if self.can(kind, action) {
                DriverChoice::Chosen(kind)
            } else {
                DriverChoice::Unusable(kind)
            };
        }
        let able: Vec<_> = self.configured().into_iter().filter(|k| self.can(*k, action)).collect();
        match able.as_slice() {
            [] => DriverChoice::None,
            [one] => DriverChoice::Chosen(*one),
            _ => DriverChoice::Ambiguous(able),
        }
    }

    /// The drivers that power the machine `action`, in order: the sequence's steps, else the one
    /// driver chosen (none when no driver can).
    pub fn drivers_of(&self, action: PowerAction) -> Vec<PowerDriverKind> {
        if !self.sequence(action).is_empty() {
            return self.sequence(action).iter().map(|s| s.driver).collect();
        }
        match self.driver_for(action) {
            DriverChoice::Chosen(kind) => vec![kind],
            _ => Vec::new(),
        }
    }

    /// The driver that reads the power state: the BMC if there is one.
    pub fn status_driver(&self) -> Option<PowerDriverKind> {
        if self.redfish.is_some() {
            Some(PowerDriverKind::Redfish)
        } else if self.ipmi.is_some() {
            Some(PowerDriverKind::Ipmi)
        } else {
            None
        }
    }

    /// The Secrets the driver `kind` reads, by name.
    pub fn secrets_of(&self, kind: PowerDriverKind) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        match kind {
            PowerDriverKind::WakeOnLan => {}
            PowerDriverKind::Redfish => {
                if let Some(r) = &self.redfish {
                    names.insert(r.credentials.secret_name.clone());
                    if let Some(ca) = r.tls.as_ref().and_then(|t| t.ca_bundle.as_ref()) {
                        names.insert(ca.name.clone());
                    }
                }
            }
            PowerDriverKind::Ipmi => {
                if let Some(i) = &self.ipmi {
                    names.insert(i.credentials.secret_name.clone());
                }
            }
            PowerDriverKind::Http => {
                let requests = self.http.iter().flat_map(|h| {
                    h.on.iter().chain(h.off.iter()).chain(h.meter.iter().map(|m| &m.request))
                });
                names.extend(requests.flat_map(HttpRequest::secret_names));
            }
            PowerDriverKind::Ssh => {
                if let Some(s) = &self.ssh {
                    names.insert(s.private_key.name.clone());
                }
            }
        }
        names
    }
}
