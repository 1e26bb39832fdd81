//! HTTP smart plugs and switches: one request per direction (Shelly, Tasmota and Home
//! Assistant are examples in docs/power.md). Any 2xx answer is a success; the device's own state
//! is not read back, since every plug reports it differently. A plug with a meter is read for
//! its live draw: a request and a JSON pointer to the watts, which each plug puts elsewhere.

use std::time::Duration;

use super::resolve::Resolver;
use super::{PowerError, Secrets, with_causes};
use crate::api::{HttpPower, HttpRequest, PowerAction};

const TIMEOUT: Duration = Duration::from_secs(20);

/// Sends the request for `action`.
pub async fn send(
    settings: &HttpPower,
    action: PowerAction,
    secrets: &Secrets,
) -> Result<String, PowerError> {
    let request = match action {
        PowerAction::On => settings.on.as_ref(),
        PowerAction::Off => settings.off.as_ref(),
    }
    .ok_or_else(|| PowerError::Settings(format!("http.{} is not set", action.request_field())))?;
    let response = exchange(settings, request, "POST", secrets).await?;
    Ok(format!(
        "{} {} answered {}",
        method(request, "POST"),
        request.url,
        response.status().as_u16()
    ))
}

/// Reads the plug's live draw in watts from `http.meter`.
pub async fn read_watts(settings: &HttpPower, secrets: &Secrets) -> Result<f64, PowerError> {
    let meter = settings
        .meter
        .as_ref()
        .ok_or_else(|| PowerError::Settings("http.meter is not set".into()))?;
    let url = &meter.request.url;
    let response = exchange(settings, &meter.request, "GET", secrets).await?;
    let body: serde_json::Value = response
        .json()
        .await
        .map_err(|e| PowerError::protocol(url, format!("the meter's answer is not JSON: {e}")))?;
    watts_at(&body, &meter.watts_pointer).map_err(|detail| PowerError::protocol(url, detail))
}

/// The watts at `pointer` in a meter's answer: a number, or a numeric string (Home Assistant
/// reports a sensor's state as a string).
pub fn watts_at(body: &serde_json::Value, pointer: &str) -> Result<f64, String> {
    let check = "check http.meter.wattsPointer against the answer";
    let value = body
        .pointer(pointer)
        .ok_or_else(|| format!("the answer has nothing at {pointer:?} ({check}: {body})"))?;
    let watts = match value {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    watts
        .filter(|w| w.is_finite())
        .ok_or_else(|| format!("{value} at {pointer:?} is not a number of watts ({check}: {body})"))
}

/// Sends one request and checks the answer is a 2xx; a refused login names its Secrets.
async fn exchange(
    settings: &HttpPower,
    request: &HttpRequest,
    default_method: &str,
    secrets: &Secrets,
) -> Result<reqwest::Response, PowerError> {
    let client = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .dns_resolver(std::sync::Arc::new(Resolver::new()))
        .danger_accept_invalid_certs(settings.insecure_skip_verify)
        .build()
        .map_err(|e| PowerError::protocol(&request.url, with_causes(&e)))?;
    let built = build(&client, request, default_method, secrets)?;
    let response =
        built.send().await.map_err(|e| PowerError::protocol(&request.url, with_causes(&e)))?;
    let status = response.status();
    if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
        let secret = credential_secrets(request);
        return Err(PowerError::Unauthorized {
            peer: request.url.clone(),
            secret: if secret.is_empty() { "(none referenced)".into() } else { secret },
            detail: format!("answered {}", status.as_u16()),
        });
    }
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        let body: String = body.chars().take(200).collect();
        return Err(PowerError::protocol(
            &request.url,
            format!("answered {}: {}", status.as_u16(), body.trim()),
        ));
    }
    Ok(response)
}

fn method<'a>(request: &'a HttpRequest, default: &'a str) -> &'a str {
    request.method.as_deref().unwrap_or(default)
}

fn credential_secrets(request: &HttpRequest) -> String {
    request.secret_names().collect::<Vec<_>>().join(", ")
}

fn build(
    client: &reqwest::Client,
    request: &HttpRequest,
    default_method: &str,
    secrets: &Secrets,
) -> Result<reqwest::RequestBuilder, PowerError> {
    let verb = method(request, default_method);
    let verb = reqwest::Method::from_bytes(verb.as_bytes())
        .map_err(|_| PowerError::Settings(format!("{verb:?} is not an HTTP method")))?;
    let mut built = client.request(verb, &request.url);
    for header in &request.headers {
        let value = match (&header.value, &header.value_from) {
            (_, Some(from)) => {
                format!("{}{}", header.value_prefix.as_deref().unwrap_or(""), secrets.text(from)?)
            }
            (Some(value), None) => value.clone(),
            (None, None) => {
                return Err(PowerError::Settings(format!(
                    "header {:?} has neither value nor valueFrom",
                    header.name
                )));
            }
        };
        built = built.header(&header.name, value);
    }
    if let Some(auth) = &request.basic_auth {
        built = built
            .basic_auth(secrets.text(&auth.username())?, Some(secrets.text(&auth.password())?));
    }
    if let Some(body) = &request.body {
        built = built.body(body.clone());
    }
    Ok(built)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_watts_are_read_where_each_plug_puts_them() {
        let shelly = json!({"id": 0, "output": true, "apower": 94.6, "voltage": 231.2});
        let tasmota = json!({"StatusSNS": {"ENERGY": {"Power": 95, "Voltage": 230}}});
        let home_assistant = json!({"entity_id": "sensor.plug_power", "state": "95.3"});
        assert_eq!(watts_at(&shelly, "/apower"), Ok(94.6));
        assert_eq!(watts_at(&tasmota, "/StatusSNS/ENERGY/Power"), Ok(95.0));
        assert_eq!(watts_at(&home_assistant, "/state"), Ok(95.3));
        let missing = watts_at(&shelly, "/power").unwrap_err();
        assert!(missing.contains("nothing at \"/power\"") && missing.contains("wattsPointer"));
        let unavailable = json!({"state": "unavailable"});
        assert!(watts_at(&unavailable, "/state").unwrap_err().contains("not a number of watts"));
    }
}
