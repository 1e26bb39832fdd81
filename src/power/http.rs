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

/// [`read_watts`] within `bound`: a meter that does not answer in time is a protocol error.
pub async fn read_watts_within(
    settings: &HttpPower,
    secrets: &Secrets,
    bound: Duration,
) -> Result<f64, PowerError> {
    let url = settings.meter.as_ref().map_or("", |m| m.request.url.as_str());
    tokio::time::timeout(bound, read_watts(settings, secrets))
        .await
        .map_err(|_| PowerError::protocol(url, format!("no answer within {bound:?}")))?
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

/// The most one machine on one plug can draw: a 16 A plug at 230 V switches about 3.7 kW. A
/// reading above it (or below zero) is a meter's glitch or a wrong pointer, and taken as a draw
/// it would become the slot's on-draw and the energy report's baseline.
pub const MAX_PLAUSIBLE_WATTS: f64 = 5000.0;

/// The watts at `pointer` in a meter's answer: a number, or a numeric string (Home Assistant
/// reports a sensor's state as a string), in the unit the answer names in
/// `attributes.unit_of_measurement` (Home Assistant's; watts when it names none).
pub fn watts_at(body: &serde_json::Value, pointer: &str) -> Result<f64, String> {
    let check = "check http.meter.wattsPointer against the answer";
    let value = body
        .pointer(pointer)
        .ok_or_else(|| format!("the answer has nothing at {pointer:?} ({check}: {body})"))?;
    let number = match value {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    let number = number.filter(|w| w.is_finite()).ok_or_else(|| {
        format!("{value} at {pointer:?} is not a number of watts ({check}: {body})")
    })?;
    let watts = number * watts_per_unit(body)?;
    if !(0.0..=MAX_PLAUSIBLE_WATTS).contains(&watts) {
        return Err(format!(
            "{watts} W at {pointer:?} is not a draw one machine can have (0 to \
             {MAX_PLAUSIBLE_WATTS} W), so it is refused; {check} and its unit: {body}"
        ));
    }
    Ok(watts)
}

/// Watts per unit of the answer's number: 1 for W (or no unit named), 1000 for kW.
fn watts_per_unit(body: &serde_json::Value) -> Result<f64, String> {
    let unit = body.pointer("/attributes/unit_of_measurement").and_then(|u| u.as_str());
    match unit.map(str::trim) {
        None | Some("W") => Ok(1.0),
        Some("kW") => Ok(1000.0),
        Some(other) => Err(format!(
            "the meter reports in {other:?}, not in W or kW: point http.meter at the plug's \
             power sensor (an energy sensor counts kWh, not the live draw)"
        )),
    }
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
        // Shelly PM Mini (PM1.GetStatus) and a Tasmota with several relays.
        let pm_mini = json!({"id": 0, "voltage": 229.1, "current": 0.41, "apower": 93.2});
        assert_eq!(watts_at(&pm_mini, "/apower"), Ok(93.2));
        let tasmota_multi = json!({"StatusSNS": {"ENERGY": {"Power": [95, 0]}}});
        assert_eq!(watts_at(&tasmota_multi, "/StatusSNS/ENERGY/Power/0"), Ok(95.0));
    }

    #[test]
    fn a_home_assistant_sensor_is_read_in_its_unit() {
        let sensor = |state: &str, unit: &str| json!({"state": state, "attributes": {"unit_of_measurement": unit}});
        assert_eq!(watts_at(&sensor("95.3", "W"), "/state"), Ok(95.3));
        assert_eq!(watts_at(&sensor("0.0953", "kW"), "/state"), Ok(95.3));
        let energy = watts_at(&sensor("12.4", "kWh"), "/state").unwrap_err();
        assert!(energy.contains("\"kWh\"") && energy.contains("power sensor"), "{energy}");
        let amps = watts_at(&sensor("0.4", "A"), "/state").unwrap_err();
        assert!(amps.contains("\"A\""), "{amps}");
    }

    #[test]
    fn a_reading_no_machine_can_draw_is_refused() {
        for (answer, pointer) in [
            (json!({"apower": 1e9}), "/apower"),
            (json!({"apower": -12.0}), "/apower"),
            (json!({"state": "6", "attributes": {"unit_of_measurement": "kW"}}), "/state"),
        ] {
            let refused = watts_at(&answer, pointer).unwrap_err();
            assert!(refused.contains("not a draw one machine can have"), "{refused}");
            assert!(refused.contains("refused"), "{refused}");
        }
        assert_eq!(watts_at(&json!({"apower": 0.0}), "/apower"), Ok(0.0), "off is zero");
        assert_eq!(watts_at(&json!({"apower": 3680}), "/apower"), Ok(3680.0));
    }
}
