//! Redfish: the ComputerSystem's `PowerState`, and its `ComputerSystem.Reset` action. HTTP basic
//! authentication on every request (no session to leak when the pod ends).

use std::time::Duration;

use serde_json::{Value, json};

use super::resolve::Resolver;
use super::{PowerError, PowerState, Reads, Secrets, with_causes};
use crate::api::{PowerAction, Redfish};

const TIMEOUT: Duration = Duration::from_secs(20);
const DEFAULT_ON: &str = "On";
const DEFAULT_OFF: &str = "GracefulShutdown";

/// A BMC's ComputerSystem, found and logged in.
pub struct Bmc {
    client: reqwest::Client,
    base: String,
    host: String,
    user: String,
    password: String,
    secret: String,
    /// The system's path, such as `/redfish/v1/Systems/1`.
    system: String,
    /// Where the Reset action is posted.
    reset_target: String,
    on_reset_type: String,
    off_reset_type: String,
}

impl Bmc {
    /// Logs in and finds the system: the one named, or the BMC's only one.
    pub async fn connect(settings: &Redfish, secrets: &Secrets) -> Result<Self, PowerError> {
        let base = settings.endpoint.trim_end_matches('/').to_string();
        let host = reqwest::Url::parse(&base)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .ok_or_else(|| {
                PowerError::Settings(format!("redfish.endpoint {base:?} is not a URL"))
            })?;
        let mut builder = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .dns_resolver(std::sync::Arc::new(Resolver::new()));
        if let Some(tls) = &settings.tls {
            if let Some(ca) = &tls.ca_bundle {
                let pem = secrets.bytes(ca)?;
                let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                    PowerError::ReadSecret {
                        secret: ca.name.clone(),
                        detail: format!("key {:?} is not a PEM CA bundle: {e}", ca.key),
                    }
                })?;
                for cert in certs {
                    builder = builder.add_root_certificate(cert);
                }
            }
            builder = builder.danger_accept_invalid_certs(tls.insecure_skip_verify);
        }
        let client =
            builder.build().map_err(|e| PowerError::protocol(format!("BMC at {host}"), e))?;
        let mut bmc = Bmc {
            client,
            base,
            host,
            user: secrets.text(&settings.credentials.username())?,
            password: secrets.text(&settings.credentials.password())?,
            secret: settings.credentials.secret_name.clone(),
            system: String::new(),
            reset_target: String::new(),
            on_reset_type: settings.on_reset_type.clone().unwrap_or_else(|| DEFAULT_ON.into()),
            off_reset_type: settings.off_reset_type.clone().unwrap_or_else(|| DEFAULT_OFF.into()),
        };
        let system_path = match &settings.system_id {
            Some(id) => format!("/redfish/v1/Systems/{id}"),
            None => bmc.only_system().await?,
        };
        let system = bmc.get(&system_path).await?;
        bmc.system = system["@odata.id"].as_str().unwrap_or(&system_path).to_string();
        bmc.reset_target = system["Actions"]["#ComputerSystem.Reset"]["target"]
            .as_str()
            .map_or_else(|| format!("{}/Actions/ComputerSystem.Reset", bmc.system), str::to_owned);
        Ok(bmc)
    }

    async fn only_system(&self) -> Result<String, PowerError> {
        let systems = self.get("/redfish/v1/Systems").await?;
        let members: Vec<&str> = systems["Members"]
            .as_array()
            .map(|m| m.iter().filter_map(|s| s["@odata.id"].as_str()).collect())
            .unwrap_or_default();
        match members.as_slice() {
            [one] => Ok((*one).to_string()),
            [] => {
                Err(PowerError::protocol(self.peer(), "lists no system under /redfish/v1/Systems"))
            }
            many => Err(PowerError::Settings(format!(
                "the BMC at {} has {} systems ({}): set redfish.systemId",
                self.host,
                many.len(),
                many.join(", ")
            ))),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn check(&self, response: reqwest::Response) -> Result<reqwest::Response, PowerError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let message = body["error"]["@Message.ExtendedInfo"][0]["Message"]
            .as_str()
            .or_else(|| body["error"]["message"].as_str())
            .or_else(|| body["error"].as_str())
            .unwrap_or("")
            .to_string();
        let detail = format!("answered {}{}", status.as_u16(), prefixed(&message));
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(PowerError::Unauthorized {
                peer: self.peer(),
                secret: self.secret.clone(),
                detail,
            });
        }
        Err(PowerError::protocol(self.peer(), detail))
    }

    async fn get(&self, path: &str) -> Result<Value, PowerError> {
        let response = self
            .client
            .get(self.url(path))
            .basic_auth(&self.user, Some(&self.password))
            .send()
            .await
            .map_err(|e| PowerError::protocol(self.peer(), with_causes(&e)))?;
        self.check(response)
            .await?
            .json()
            .await
            .map_err(|e| PowerError::protocol(self.peer(), format!("GET {path}: {e}")))
    }
}

fn prefixed(message: &str) -> String {
    if message.is_empty() { String::new() } else { format!(": {message}") }
}

impl Reads for Bmc {
    fn peer(&self) -> String {
        format!("BMC at {}", self.host)
    }

    async fn power_state(&self) -> Result<PowerState, PowerError> {
        let system = self.get(&self.system).await?;
        match system["PowerState"].as_str() {
            Some("On") | Some("PoweringOff") => Ok(PowerState::On),
            Some("Off") | Some("PoweringOn") => Ok(PowerState::Off),
            other => Err(PowerError::protocol(
                self.peer(),
                format!("{} reports PowerState {other:?}", self.system),
            )),
        }
    }

    async fn set_power(&self, action: PowerAction) -> Result<(), PowerError> {
        let reset_type = match action {
            PowerAction::On => &self.on_reset_type,
            PowerAction::Off => &self.off_reset_type,
        };
        let response = self
            .client
            .post(self.url(&self.reset_target))
            .basic_auth(&self.user, Some(&self.password))
            .json(&json!({ "ResetType": reset_type }))
            .send()
            .await
            .map_err(|e| PowerError::protocol(self.peer(), with_causes(&e)))?;
        self.check(response).await.map_err(|error| match error {
            PowerError::Protocol { peer, detail } => {
                PowerError::Protocol { peer, detail: format!("ResetType {reset_type}: {detail}") }
            }
            other => other,
        })?;
        Ok(())
    }
}
