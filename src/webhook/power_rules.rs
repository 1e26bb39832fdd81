//! How a slot powers its machine: for each direction exactly one of a `spec.power` driver and a
//! lifecycle pod spec, and driver settings that can work. Pure: reads the slot, decides.

use super::verdict::Findings;
use crate::api::{DriverChoice, Node, PowerAction, PowerDriverKind, PowerSpec};
use crate::power;

/// The rules of `spec.power` against the pod specs.
pub fn check(slot: &Node, findings: &mut Findings) {
    for (action, pod_field, pod_set) in [
        (PowerAction::On, "spec.startupPodSpec", slot.spec.startup_pod_spec.is_some()),
        (PowerAction::Off, "spec.shutdownPodSpec", slot.spec.shutdown_pod_spec.is_some()),
    ] {
        let choice = slot.spec.power.as_ref().map(|p| p.driver_for(action));
        let able = |kinds: &[PowerDriverKind]| -> String {
            kinds.iter().map(|k| format!("spec.power.{}", k.field())).collect::<Vec<_>>().join(", ")
        };
        match (pod_set, choice) {
            (true, Some(DriverChoice::Chosen(kind))) => findings.invalid(
                "one_power_source_per_direction",
                format!(
                    "both {pod_field} and spec.power.{} power the machine {}: keep one of them \
                 (remove {pod_field} to use the typed driver)",
                    kind.field(),
                    action.as_str()
                ),
            ),
            (true, Some(DriverChoice::Ambiguous(kinds))) => findings.invalid(
                "one_power_source_per_direction",
                format!(
                    "both {pod_field} and {} could power the machine {}: keep one of them",
                    able(&kinds),
                    action.as_str()
                ),
            ),
            (true, _) => {}
            (false, None | Some(DriverChoice::None)) => findings.invalid(
                "one_power_source_per_direction",
                format!(
                    "nothing powers the machine {}: set {} or {pod_field}",
                    action.as_str(),
                    match action {
                        PowerAction::On =>
                            "spec.power.wakeOnLan, .redfish, .ipmi or .http.onRequest",
                        PowerAction::Off => "spec.power.ssh, .redfish, .ipmi or .http.offRequest",
                    }
                ),
            ),
            (false, Some(DriverChoice::Chosen(_))) => {}
            (false, Some(_)) => {
                if let Some(spec) = &slot.spec.power
                    && let Err(error) = power::driver_for(spec, action)
                {
                    findings.invalid("one_power_source_per_direction", error.to_string());
                }
            }
        }
    }
    if let Some(spec) = &slot.spec.power {
        check_settings(spec, findings);
        check_suspend(spec, slot.spec.startup_pod_spec.is_some(), findings);
        super::sequence_rules::check(spec, findings);
    }
}

/// A machine may sleep only where the operator can put it to sleep and wake it: the suspend
/// command runs over the `ssh` driver's login, and a sleeping machine wakes on a Wake-on-LAN
/// packet (a BMC's power-on does nothing to a machine in S3, and a plug's relay is already on).
fn check_suspend(spec: &PowerSpec, startup_pod: bool, findings: &mut Findings) {
    if spec.suspend.is_none() {
        return;
    }
    if spec.ssh.is_none() {
        findings.invalid(
            "suspend_needs_ssh_and_wake_on_lan",
            "spec.power.suspend runs its command over SSH: set spec.power.ssh (host, user,              privateKey, knownHostKey) for the machine"
                .to_string(),
        );
    }
    let wakes_by_packet = !startup_pod
        && spec.drivers_of(PowerAction::On).last() == Some(&PowerDriverKind::WakeOnLan);
    if !wakes_by_packet {
        findings.invalid(
            "suspend_needs_ssh_and_wake_on_lan",
            "a machine suspended to RAM wakes on a Wake-on-LAN packet: power it on with              spec.power.wakeOnLan (onWith: wakeOnLan, or an onSequence that ends with it), or              remove spec.power.suspend to power it off instead"
                .to_string(),
        );
    }
}

/// What the schema cannot say about a driver's fields.
fn check_settings(spec: &PowerSpec, findings: &mut Findings) {
    // A slot powered by its pod specs may still declare its watts for the energy report.
    if spec.configured().is_empty() && spec.watts.is_none() {
        findings.invalid(
            "power_driver_settings",
            "spec.power configures no driver: set wakeOnLan, redfish, ipmi, http or ssh"
                .to_string(),
        );
    }
    if let Some(wol) = &spec.wake_on_lan {
        if let Err(error) = power::wol::parse_mac(&wol.mac) {
            findings.invalid("power_driver_settings", format!("spec.power.wakeOnLan.mac: {error}"));
        }
        if let Some(address) = &wol.broadcast_address
            && address.parse::<std::net::Ipv4Addr>().is_err()
        {
            findings.invalid(
                "power_driver_settings",
                format!(
                "spec.power.wakeOnLan.broadcastAddress: {address:?} is not an IPv4 address such \
                 as 192.168.1.255 (the LAN's broadcast address)"
            ));
        }
    }
    if let Some(ssh) = &spec.ssh
        && let Err(error) = power::ssh::parse_host_key(&ssh.known_host_key)
    {
        findings.invalid("power_driver_settings", error.to_string());
    }
    if let Some(http) = &spec.http {
        // A plug that only measures (the machine powered otherwise) is a meter alone.
        if http.on.is_none() && http.off.is_none() && http.meter.is_none() {
            findings.invalid(
                "power_driver_settings",
                "spec.power.http: set onRequest, offRequest, meter, or several of them",
            );
        }
        let meter = http.meter.as_ref().map(|m| &m.request);
        for (direction, request) in [
            ("onRequest", http.on.as_ref()),
            ("offRequest", http.off.as_ref()),
            ("meter.request", meter),
        ] {
            for (i, header) in request.iter().flat_map(|r| r.headers.iter()).enumerate() {
                if header.value.is_some() == header.value_from.is_some() {
                    findings.invalid(
                        "power_driver_settings",
                        format!(
                        "spec.power.http.{direction}.headers[{i}] ({}): set exactly one of value \
                         and valueFrom",
                        header.name
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CredentialsRef, Ipmi, SecretKeyRef, SshShutdown, WakeOnLan};
    use crate::fixtures::{pod_spec, slot};

    const HOST_KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl";

    fn wol() -> WakeOnLan {
        WakeOnLan { mac: "aa:bb:cc:dd:ee:ff".into(), broadcast_address: None, port: None }
    }
    fn ssh() -> SshShutdown {
        SshShutdown {
            host: "10.0.0.5".into(),
            port: None,
            user: "homelab".into(),
            private_key: SecretKeyRef { name: "ssh".into(), key: "ssh-privatekey".into() },
            known_host_key: HOST_KEY.into(),
            command: None,
        }
    }
    fn ipmi() -> Ipmi {
        Ipmi {
            host: "10.0.0.6".into(),
            port: None,
            credentials: CredentialsRef { secret_name: "bmc".into() },
            cipher_suite: None,
            privilege_level: None,
            off_method: None,
        }
    }

    /// A plug that only measures: a Shelly's meter, no relay requests.
    fn meter_only() -> crate::api::HttpPower {
        crate::api::HttpPower {
            on: None,
            off: None,
            meter: Some(crate::api::PowerMeter {
                request: crate::api::HttpRequest {
                    method: None,
                    url: "http://plug/rpc/Switch.GetStatus?id=0".into(),
                    headers: vec![],
                    body: None,
                    basic_auth: None,
                },
                watts_pointer: "/apower".into(),
            }),
            insecure_skip_verify: false,
        }
    }

    fn suspend() -> crate::api::Suspend {
        crate::api::Suspend {
            command: None,
            quiet_seconds: None,
            watts: Some(2.0),
            power_off_after_minutes: Some(240),
        }
    }

    fn findings_of(edit: impl FnOnce(&mut Node)) -> Vec<String> {
        let mut s = slot("m1", "pool");
        s.spec.startup_pod_spec = None;
        s.spec.shutdown_pod_spec = None;
        edit(&mut s);
        let mut findings = Findings::default();
        check(&s, &mut findings);
        findings.messages()
    }

    #[test]
    fn table_of_power_rules() {
        type Edit = fn(&mut Node);
        let table: &[(&str, Edit, Option<&str>)] = &[
            (
                "wake by WoL, shut down by SSH",
                |s| {
                    s.spec.power = Some(PowerSpec {
                        wake_on_lan: Some(wol()),
                        ssh: Some(ssh()),
                        ..Default::default()
                    })
                },
                None,
            ),
            (
                "a BMC does both",
                |s| s.spec.power = Some(PowerSpec { ipmi: Some(ipmi()), ..Default::default() }),
                None,
            ),
            (
                "WoL with a shutdown pod",
                |s| {
                    s.spec.power =
                        Some(PowerSpec { wake_on_lan: Some(wol()), ..Default::default() });
                    s.spec.shutdown_pod_spec = Some(pod_spec());
                },
                None,
            ),
            (
                "pod specs, and a plug that only measures",
                |s| {
                    s.spec.power =
                        Some(PowerSpec { http: Some(meter_only()), ..Default::default() });
                    s.spec.startup_pod_spec = Some(pod_spec());
                    s.spec.shutdown_pod_spec = Some(pod_spec());
                },
                None,
            ),
            (
                "a plug that neither switches nor measures",
                |s| {
                    let mut http = meter_only();
                    http.meter = None;
                    s.spec.power = Some(PowerSpec { http: Some(http), ..Default::default() });
                    s.spec.startup_pod_spec = Some(pod_spec());
                    s.spec.shutdown_pod_spec = Some(pod_spec());
                },
                Some("spec.power.http: set onRequest, offRequest, meter, or several of them"),
            ),
            ("neither", |_| {}, Some("nothing powers the machine on: set spec.power.wakeOnLan")),
            (
                "suspend, woken by WoL, put to sleep over SSH",
                |s| {
                    s.spec.power = Some(PowerSpec {
                        wake_on_lan: Some(wol()),
                        ssh: Some(ssh()),
                        suspend: Some(suspend()),
                        ..Default::default()
                    })
                },
                None,
            ),
            (
                "suspend without SSH to run its command",
                |s| {
                    s.spec.power = Some(PowerSpec {
                        wake_on_lan: Some(wol()),
                        ipmi: Some(ipmi()),
                        on: Some(PowerDriverKind::WakeOnLan),
                        suspend: Some(suspend()),
                        ..Default::default()
                    })
                },
                Some("spec.power.suspend runs its command over SSH: set spec.power.ssh"),
            ),
            (
                "suspend of a machine a BMC powers on: no wake from sleep",
                |s| {
                    s.spec.power = Some(PowerSpec {
                        ipmi: Some(ipmi()),
                        ssh: Some(ssh()),
                        off: Some(PowerDriverKind::Ssh),
                        suspend: Some(suspend()),
                        ..Default::default()
                    })
                },
                Some("a machine suspended to RAM wakes on a Wake-on-LAN packet"),
            ),
            (
                "suspend of a machine a startup pod powers on",
                |s| {
                    s.spec.power = Some(PowerSpec {
                        ssh: Some(ssh()),
                        suspend: Some(suspend()),
                        ..Default::default()
                    });
                    s.spec.startup_pod_spec = Some(pod_spec());
                },
                Some("a machine suspended to RAM wakes on a Wake-on-LAN packet"),
            ),
            (
                "WoL alone cannot power off",
                |s| {
                    s.spec.power =
                        Some(PowerSpec { wake_on_lan: Some(wol()), ..Default::default() })
                },
                Some("nothing powers the machine off: set spec.power.ssh"),
            ),
            (
                "both for startup",
                |s| {
                    s.spec.power = Some(PowerSpec {
                        wake_on_lan: Some(wol()),
                        ssh: Some(ssh()),
                        ..Default::default()
                    });
                    s.spec.startup_pod_spec = Some(pod_spec());
                },
                Some("both spec.startupPodSpec and spec.power.wakeOnLan power the machine on"),
            ),
            (
                "a BMC and SSH without a choice",
                |s| {
                    s.spec.power = Some(PowerSpec {
                        ipmi: Some(ipmi()),
                        ssh: Some(ssh()),
                        ..Default::default()
                    })
                },
                Some("ipmi, ssh drivers could power the machine off: set spec.power.offWith"),
            ),
            (
                "a BMC and SSH, SSH chosen",
                |s| {
                    s.spec.power = Some(PowerSpec {
                        ipmi: Some(ipmi()),
                        ssh: Some(ssh()),
                        off: Some(PowerDriverKind::Ssh),
                        ..Default::default()
                    })
                },
                None,
            ),
            (
                "on names a driver that cannot",
                |s| {
                    s.spec.power = Some(PowerSpec {
                        ipmi: Some(ipmi()),
                        on: Some(PowerDriverKind::Ssh),
                        ..Default::default()
                    })
                },
                Some(
                    "spec.power.onWith is ssh, but ssh is not configured or cannot power a machine on",
                ),
            ),
            (
                "a bad host key",
                |s| {
                    let mut bad = ssh();
                    bad.known_host_key = "not a key".into();
                    s.spec.power = Some(PowerSpec {
                        wake_on_lan: Some(wol()),
                        ssh: Some(bad),
                        ..Default::default()
                    })
                },
                Some("ssh.knownHostKey \"not a key\" is not a host key"),
            ),
            (
                "pod specs power the machine; spec.power only declares its watts",
                |s| {
                    s.spec.power = Some(PowerSpec {
                        watts: Some(crate::api::PowerWatts { when_on: 95.0, when_off: None }),
                        ..Default::default()
                    });
                    s.spec.startup_pod_spec = Some(pod_spec());
                    s.spec.shutdown_pod_spec = Some(pod_spec());
                },
                None,
            ),
            (
                "a plug step without a plug",
                |s| {
                    s.spec.power = Some(PowerSpec {
                        wake_on_lan: Some(wol()),
                        ssh: Some(ssh()),
                        off_sequence: vec![
                            crate::api::PowerStep::of(PowerDriverKind::Ssh),
                            crate::api::PowerStep {
                                delay_seconds: Some(30),
                                ..crate::api::PowerStep::of(PowerDriverKind::Http)
                            },
                        ],
                        ..Default::default()
                    })
                },
                Some(
                    "spec.power.offSequence names http, which is not configured or cannot power \
                     a machine off: configure spec.power.http with an offRequest",
                ),
            ),
            (
                "a bad broadcast address",
                |s| {
                    let mut bad = wol();
                    bad.broadcast_address = Some("lan".into());
                    s.spec.power = Some(PowerSpec {
                        wake_on_lan: Some(bad),
                        ssh: Some(ssh()),
                        ..Default::default()
                    })
                },
                Some("broadcastAddress: \"lan\" is not an IPv4 address"),
            ),
        ];
        for (name, edit, want) in table {
            let messages = findings_of(edit);
            match want {
                None => assert!(messages.is_empty(), "{name}: {messages:?}"),
                Some(needle) => assert!(
                    messages.iter().any(|m| m.contains(needle)),
                    "{name}: {needle:?} not in {messages:?}"
                ),
            }
        }
    }
}
