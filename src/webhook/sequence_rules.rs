//! The power sequences of a slot (`spec.power.onSequence`, `offSequence`): refused when they
//! cannot work, with the fix in the message. Pure: reads `spec.power`, decides.

use super::verdict::Findings;
use crate::api::{PowerAction, PowerDriverKind, PowerSpec, PowerStep};

const RULE: &str = "power_sequence";

/// What the steps' bounds may add up to: a power Job is cut at the startup Job timeout, 300 s
/// by default (the same room `confirmTimeoutSeconds` leaves).
const JOB_ROOM_SECONDS: u32 = 290;

/// The rules of both directions' sequences.
pub fn check(spec: &PowerSpec, findings: &mut Findings) {
    for action in [PowerAction::On, PowerAction::Off] {
        let steps = spec.sequence(action);
        if steps.is_empty() {
            continue;
        }
        let field = format!("spec.power.{}", action.sequence_field());
        let picked = match action {
            PowerAction::On => spec.on,
            PowerAction::Off => spec.off,
        };
        if let Some(kind) = picked {
            findings.invalid(
                RULE,
                format!(
                    "both spec.power.{} ({}) and {field} say how to power the machine {}: keep \
                     one (a one-step sequence does what {} does)",
                    action.driver_field(),
                    kind.field(),
                    action.as_str(),
                    action.driver_field()
                ),
            );
        }
        for (index, step) in steps.iter().enumerate() {
            if steps[..index].iter().any(|earlier| earlier.driver == step.driver) {
                findings.invalid(
                    RULE,
                    format!(
                        "{field}[{index}] runs {} a second time: name each driver once",
                        step.driver.field()
                    ),
                );
            }
            check_wait(spec, &field, index, step, findings);
        }
        check_order(action, steps, &field, findings);
        let total: u32 = steps
            .iter()
            .map(|s| s.timeout_seconds.unwrap_or(crate::api::DEFAULT_STEP_TIMEOUT_SECONDS))
            .sum();
        if total > JOB_ROOM_SECONDS {
            findings.warn(format!(
                "{field}: the steps may take {total}s together, but the power Job is cut at the \
                 startup Job timeout (--startup-job-timeout, 5m by default): lower their \
                 timeoutSeconds to {JOB_ROOM_SECONDS}s in all, or raise the timeout"
            ));
        }
    }
}

/// A step's wait: a draw threshold needs a meter, and fits in the step's bound.
fn check_wait(
    spec: &PowerSpec,
    field: &str,
    index: usize,
    step: &PowerStep,
    findings: &mut Findings,
) {
    let at = format!("{field}[{index}]");
    let metered = spec.http.as_ref().is_some_and(|h| h.meter.is_some());
    if step.after_draw_below_watts.is_some() && !metered {
        findings.invalid(
            RULE,
            format!(
                "{at}.afterDrawBelowWatts needs a plug that measures its draw: set \
                 spec.power.http.meter (a request and the JSON pointer to the watts; docs/power.md \
                 shows Shelly, Tasmota and Home Assistant), or wait a fixed time with \
                 delaySeconds instead"
            ),
        );
    }
    if step.after_draw_below_watts.is_some() && step.delay_seconds.is_some() {
        findings.invalid(
            RULE,
            format!(
                "{at} sets both afterDrawBelowWatts and delaySeconds: keep afterDrawBelowWatts \
                 for a plug with a meter, delaySeconds for one without"
            ),
        );
    }
    if step.draw_steady_seconds.is_some() && step.after_draw_below_watts.is_none() {
        findings.invalid(
            RULE,
            format!("{at}.drawSteadySeconds is only read with afterDrawBelowWatts: set both"),
        );
    }
    let bound = step.timeout_seconds.unwrap_or(crate::api::DEFAULT_STEP_TIMEOUT_SECONDS);
    let wait = match (step.delay_seconds, step.after_draw_below_watts) {
        (Some(delay), _) => Some(("delaySeconds", delay)),
        (None, Some(_)) => Some((
            "drawSteadySeconds",
            step.draw_steady_seconds.unwrap_or(crate::api::DEFAULT_DRAW_STEADY_SECONDS),
        )),
        (None, None) => None,
    };
    if let Some((name, seconds)) = wait
        && seconds >= bound
    {
        findings.invalid(
            RULE,
            format!(
                "{at} waits {seconds}s ({name}) but may take only {bound}s (timeoutSeconds): \
                 raise timeoutSeconds above the wait, with time to spare for the driver"
            ),
        );
    }
}

/// The order of the steps: the OS is shut down before the relay is cut, and the machine has
/// power before a magic packet is sent.
fn check_order(action: PowerAction, steps: &[PowerStep], field: &str, findings: &mut Findings) {
    let position = |kind: PowerDriverKind| steps.iter().position(|s| s.driver == kind);
    match action {
        PowerAction::Off => {
            let (Some(ssh), Some(http)) =
                (position(PowerDriverKind::Ssh), position(PowerDriverKind::Http))
            else {
                return;
            };
            if http < ssh {
                findings.invalid(
                    RULE,
                    format!(
                        "{field} cuts the plug's relay (http, step {http}) before the OS shuts \
                         down (ssh, step {ssh}): the machine would lose power mid-run and SSH \
                         would find nothing to shut down; put ssh first: \
                         [{{driver: ssh}}, {{driver: http, afterDrawBelowWatts: 10}}]"
                    ),
                );
            } else if steps[http].after_draw_below_watts.is_none()
                && steps[http].delay_seconds.is_none()
            {
                findings.invalid(
                    RULE,
                    format!(
                        "{field}[{http}] (http) cuts the relay as soon as the shutdown command \
                         returns, while the OS is still halting: set afterDrawBelowWatts (the \
                         plug's meter shows the draw fall) or delaySeconds (a fixed wait)"
                    ),
                );
            }
        }
        PowerAction::On => {
            if let (Some(wol), Some(http)) =
                (position(PowerDriverKind::WakeOnLan), position(PowerDriverKind::Http))
                && wol < http
            {
                findings.invalid(
                    RULE,
                    format!(
                        "{field} sends the magic packet (wakeOnLan, step {wol}) before the plug \
                         switches on (http, step {http}): a machine without power cannot wake; \
                         put http first"
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{HttpPower, HttpRequest, PowerMeter, SecretKeyRef, SshShutdown, WakeOnLan};

    fn request(url: &str) -> HttpRequest {
        HttpRequest { method: None, url: url.into(), headers: vec![], body: None, basic_auth: None }
    }

    /// A mini PC on a Shelly plug with an SSH login.
    fn plug_and_ssh(meter: bool) -> PowerSpec {
        PowerSpec {
            http: Some(HttpPower {
                on: Some(request("http://plug/rpc/Switch.Set?id=0&on=true")),
                off: Some(request("http://plug/rpc/Switch.Set?id=0&on=false")),
                meter: meter.then(|| PowerMeter {
                    request: request("http://plug/rpc/Switch.GetStatus?id=0"),
                    watts_pointer: "/apower".into(),
                }),
                insecure_skip_verify: false,
            }),
            ssh: Some(SshShutdown {
                host: "10.0.0.5".into(),
                port: None,
                user: "homelab".into(),
                private_key: SecretKeyRef { name: "ssh".into(), key: "ssh-privatekey".into() },
                known_host_key: "ssh-ed25519 AAAA".into(),
                command: None,
            }),
            ..PowerSpec::default()
        }
    }

    fn step(driver: PowerDriverKind) -> PowerStep {
        PowerStep::of(driver)
    }

    /// The machine's network card, for Wake-on-LAN.
    fn nic() -> WakeOnLan {
        WakeOnLan { mac: "aa:bb:cc:dd:ee:ff".into(), broadcast_address: None, port: None }
    }

    fn after_draw(watts: f64) -> PowerStep {
        PowerStep { after_draw_below_watts: Some(watts), ..step(PowerDriverKind::Http) }
    }

    fn findings(spec: &PowerSpec) -> Vec<String> {
        let mut findings = Findings::default();
        check(spec, &mut findings);
        findings.messages()
    }

    #[test]
    fn table_of_sequence_rules() {
        use PowerDriverKind::{Http, Ssh};
        type Edit = fn(&mut PowerSpec);
        let table: &[(&str, bool, Edit, Option<&str>)] = &[
            (
                "ssh, then the relay once the draw falls",
                true,
                |p| p.off_sequence = vec![step(Ssh), after_draw(10.0)],
                None,
            ),
            (
                "ssh, then the relay after a fixed wait",
                false,
                |p| {
                    p.off_sequence =
                        vec![step(Ssh), PowerStep { delay_seconds: Some(30), ..step(Http) }]
                },
                None,
            ),
            (
                "the relay before the shutdown",
                true,
                |p| p.off_sequence = vec![after_draw(10.0), step(Ssh)],
                Some("cuts the plug's relay (http, step 0) before the OS shuts down"),
            ),
            (
                "the relay right after the shutdown command",
                true,
                |p| p.off_sequence = vec![step(Ssh), step(Http)],
                Some("spec.power.offSequence[1] (http) cuts the relay as soon as"),
            ),
            (
                "a draw threshold without a meter",
                false,
                |p| p.off_sequence = vec![step(Ssh), after_draw(10.0)],
                Some("offSequence[1].afterDrawBelowWatts needs a plug that measures its draw"),
            ),
            (
                "both a sequence and offWith",
                true,
                |p| {
                    p.off = Some(Ssh);
                    p.off_sequence = vec![step(Ssh), after_draw(10.0)];
                },
                Some("both spec.power.offWith (ssh) and spec.power.offSequence"),
            ),
            (
                "a driver twice",
                true,
                |p| p.off_sequence = vec![step(Ssh), step(Ssh), after_draw(5.0)],
                Some("offSequence[1] runs ssh a second time"),
            ),
            (
                "a wait longer than the bound",
                false,
                |p| {
                    p.off_sequence =
                        vec![step(Ssh), PowerStep { delay_seconds: Some(200), ..step(Http) }]
                },
                Some("offSequence[1] waits 200s (delaySeconds) but may take only 120s"),
            ),
            (
                "the plug, then a magic packet once the power supply is up",
                false,
                |p| {
                    p.wake_on_lan = Some(nic());
                    p.on_sequence = vec![
                        step(Http),
                        PowerStep { delay_seconds: Some(5), ..step(PowerDriverKind::WakeOnLan) },
                    ];
                },
                None,
            ),
            (
                "a magic packet before the plug",
                false,
                |p| {
                    p.wake_on_lan = Some(nic());
                    p.on_sequence = vec![step(PowerDriverKind::WakeOnLan), step(Http)];
                },
                Some("a machine without power cannot wake; put http first"),
            ),
        ];
        for (case, meter, edit, want) in table {
            let mut spec = plug_and_ssh(*meter);
            edit(&mut spec);
            let messages = findings(&spec);
            match want {
                None => assert!(messages.is_empty(), "{case}: {messages:?}"),
                Some(needle) => assert!(
                    messages.iter().any(|m| m.contains(needle)),
                    "{case}: {needle:?} not in {messages:?}"
                ),
            }
        }
    }
}
