//! HTTP smart plugs and switches: one request per direction (Shelly, Tasmota and Home
//! Assistant are examples in docs/power.md). Any 2xx answer is a success; the device's own state
//! is not read back, since every plug reports it differently.

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
    .ok_or_else(|| PowerError::Settings(format!("http.{} is not set", action.as_str())))?;
    let client = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .dns_resolver(std::sync::Arc::new(Resolver::new()))
        .danger_accept_invalid_certs(settings.insecure_skip_verify)
        .build()
        .map_err(|e| PowerError::protocol(&request.url, with_causes(&e)))?;
    let built = build(&client, request, secrets)?;
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
    Ok(format!("{} {} answered {}", method(request), request.url, status.as_u16()))
}

fn method(request: &HttpRequest) -> &str {
    request.method.as_deref().unwrap_or("POST")
}

fn credential_secrets(request: &HttpRequest) -> String {
    let mut names: Vec<&str> = request.basic_auth.iter().map(|a| a.secret_name.as_str()).collect();
    names.extend(
        request.headers.iter().filter_map(|h| h.value_from.as_ref()).map(|r| r.name.as_str()),
    );
    names.join(", ")
}

fn build(
    client: &reqwest::Client,
    request: &HttpRequest,
    secrets: &Secrets,
) -> Result<reqwest::RequestBuilder, PowerError> {
    let verb = reqwest::Method::from_bytes(method(request).as_bytes()).map_err(|_| {
        PowerError::Settings(format!("{:?} is not an HTTP method", method(request)))
    })?;
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
