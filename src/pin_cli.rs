//! `homelab-autoscaler keep-on` and `release`: a person pins a slot's machine on, with an end
//! time or until released, and lets it go again (docs/keeping-machines-on.md). Both talk to the
//! cluster with the user's kubeconfig and act only through NodeClaims: keep-on creates a `Manual`
//! claim or moves the `spec.until` of the slot's live pin, release deletes the live pin. A
//! machine a scaler started is the scaler's: both refuse to touch its claim.

use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp, Zoned};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch};
use serde_json::json;

use crate::api::{
    ClaimCall, ClaimRequest, Node, NodeClaim, NodeClaimSpec, POOL_MEMBERSHIP_LABEL, SlotRef,
};
use crate::field_manager::FieldManager;
use crate::phase;

/// Which slot, and where.
#[derive(Clone, Debug, clap::Args)]
pub struct SlotArgs {
    /// The slot (a `Node` of infra.homecluster.dev) whose machine to keep on or release.
    #[arg(long)]
    pub slot: String,
    /// The namespace of the slot and its claims.
    #[arg(long, env = "HOMELAB_AUTOSCALER_NAMESPACE", default_value = crate::api::DEFAULT_NAMESPACE)]
    pub namespace: String,
}

/// `keep-on`: pin the machine on.
#[derive(Clone, Debug, clap::Args)]
pub struct KeepOnArgs {
    #[command(flatten)]
    pub target: SlotArgs,
    /// Keep it on for this long from now (a Go duration: `90m`, `2h`, `1h30m`).
    #[arg(long = "for", value_name = "DURATION", conflicts_with = "until")]
    pub for_: Option<String>,
    /// Keep it on until then: `HH:MM` (the next such time, today or tomorrow, in the local time
    /// zone or --tz) or an RFC 3339 timestamp. Without --for or --until, the machine stays on
    /// until released.
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// The time zone `--until HH:MM` is read in, an IANA name such as `Europe/Berlin`; by
    /// default this machine's (`TZ`, else `/etc/localtime`).
    #[arg(long, value_name = "ZONE")]
    pub tz: Option<String>,
    /// The pin may boot the machine while its pool's UPS runs on battery, and shedding leaves
    /// it on until the battery is low (the claim's spec.bootOnBattery).
    #[arg(long)]
    pub on_battery: bool,
}

/// A refused or failed keep-on or release.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("--for {given:?} is not a duration (write it as Go does: 90m, 2h, 1h30m): {reason}")]
    BadDuration { given: String, reason: String },
    #[error("--for {given:?} must be longer than zero")]
    NotAhead { given: String },
    #[error(
        "--until {given:?} is neither HH:MM (a time today or tomorrow in the local time zone) nor \
         an RFC 3339 timestamp (2026-03-04T18:00:00+01:00)"
    )]
    BadTime { given: String },
    #[error("--until {given:?} is {until}, which has passed; name a time ahead")]
    Passed { given: String, until: Timestamp },
    #[error("--tz {given:?} is not a time zone ({reason}); name one as Europe/Berlin or UTC")]
    BadZone { given: String, reason: String },
    #[error(
        "--until {given:?} is a time of day, and this machine's time zone cannot be determined \
         ({reason}); name the zone with --tz (--tz Europe/Berlin), or give --until as an RFC 3339 \
         timestamp"
    )]
    NoLocalZone { given: String, reason: String },
    #[error(
        "slot {slot} is held by claim {claim} of its group's schedule, until {until}: keep-on \
         without --for or --until would keep the machine on after the window, with no end. Name \
         the end: --until HH:MM or --for DURATION"
    )]
    ScheduleWithoutEnd { slot: String, claim: String, until: String },
    #[error(
        "slot {slot} is held by claim {claim} of group {group}'s schedule, until {until}: \
         released now, the schedule would claim and boot it again at once. To free this machine \
         during the window, take it out of the window's slots or lower its minMachines \
         (`kubectl edit group.infra.homecluster.dev {group} -n {namespace}`); the window's own \
         pins end at its close"
    )]
    SchedulesPin { slot: String, claim: String, group: String, until: String, namespace: String },
    #[error("connecting to the cluster: {0}")]
    Client(#[source] kube::Error),
    #[error("reading slot {slot} in namespace {namespace}: {source}")]
    Slot { slot: String, namespace: String, source: kube::Error },
    #[error(
        "slot {slot} has no {POOL_MEMBERSHIP_LABEL} label, so it belongs to no group to claim it in"
    )]
    NoGroup { slot: String },
    #[error("{action}: {source}")]
    Kube { action: String, source: kube::Error },
    #[error(
        "slot {slot} is held by claim {claim} ({call}, requested by {by}): the machine is on for \
         its scaler, which releases it when its pods no longer need it. keep-on does not take a \
         scaler's machine over; wait until it is released (`kubectl get nodeclaim {claim} -n \
         {namespace} -w`) and run keep-on again, which then boots it under a pin of yours"
    )]
    ScalersMachine { slot: String, claim: String, call: String, by: String, namespace: String },
    #[error(
        "slot {slot} is held by claim {claim} ({call}, requested by {by}): the machine is on for \
         its scaler, which releases it when its pods no longer need it; there is no pin to \
         release"
    )]
    NotAPin { slot: String, claim: String, call: String, by: String },
    #[error(
        "claim {claim} on slot {slot} is being released already (its machine is drained and \
         powered off); run keep-on again once it has ended"
    )]
    BeingReleased { slot: String, claim: String },
    #[error(
        "slot {slot} is pinned by claim {claim}, which does not say bootOnBattery, and a pin's \
         bootOnBattery cannot change: release it (`homelab-autoscaler release --slot {slot} \
         --namespace {namespace}`), then run keep-on --on-battery again"
    )]
    NotOnBattery { slot: String, claim: String, namespace: String },
    #[error("no live claim holds slot {slot} in namespace {namespace}: nothing to release")]
    NothingHeld { slot: String, namespace: String },
}

/// When a pin should end, from `--for` or `--until`, read at `now`. `None`: until released.
pub fn end_of(
    for_: Option<&str>,
    until: Option<&str>,
    now: &Zoned,
) -> Result<Option<Timestamp>, PinError> {
    if let Some(given) = for_ {
        let duration: kube::core::Duration = given
            .parse()
            .map_err(|e| PinError::BadDuration { given: given.into(), reason: format!("{e}") })?;
        if duration.is_negative() {
            return Err(PinError::NotAhead { given: given.into() });
        }
        let duration = SignedDuration::try_from(std::time::Duration::from(duration))
            .map_err(|e| PinError::BadDuration { given: given.into(), reason: e.to_string() })?;
        if !duration.is_positive() {
            return Err(PinError::NotAhead { given: given.into() });
        }
        let end = now
            .timestamp()
            .checked_add(duration)
            .map_err(|e| PinError::BadDuration { given: given.into(), reason: e.to_string() })?;
        return Ok(Some(end));
    }
    let Some(given) = until else { return Ok(None) };
    let end = match clock_time(given) {
        Some((hour, minute)) => {
            next_at(now, hour, minute).ok_or_else(|| PinError::BadTime { given: given.into() })?
        }
        None => {
            given.parse::<Timestamp>().map_err(|_| PinError::BadTime { given: given.into() })?
        }
    };
    if end <= now.timestamp() {
        return Err(PinError::Passed { given: given.into(), until: end });
    }
    Ok(Some(end))
}

/// The zone `--until` is read in and ends are shown in: `--tz`, else this machine's. A machine
/// whose zone cannot be determined is refused only where it matters, for an `--until HH:MM`;
/// otherwise ends are shown in UTC.
pub fn clock_zone(tz: Option<&str>, until: Option<&str>) -> Result<TimeZone, PinError> {
    zone_or_system(tz, until, || TimeZone::try_system().map_err(|e| e.to_string()))
}

/// [`clock_zone`] with the machine's zone read by `system`.
fn zone_or_system(
    tz: Option<&str>,
    until: Option<&str>,
    system: impl FnOnce() -> Result<TimeZone, String>,
) -> Result<TimeZone, PinError> {
    if let Some(given) = tz {
        return TimeZone::get(given)
            .map_err(|e| PinError::BadZone { given: given.into(), reason: e.to_string() });
    }
    match system() {
        Ok(zone) => Ok(zone),
        Err(reason) => match until.filter(|u| clock_time(u).is_some()) {
            Some(given) => Err(PinError::NoLocalZone { given: given.into(), reason }),
            None => Ok(TimeZone::UTC),
        },
    }
}

/// What keep-on must not do to the slot's live pin `live`: drop the end of a schedule's pin,
/// which would keep its machine on for good once the window closes.
pub fn keep_on_refusal(live: &NodeClaim, end: Option<Timestamp>, slot: &str) -> Option<PinError> {
    (live.spec.request.call == ClaimCall::Schedule && end.is_none()).then(|| {
        PinError::ScheduleWithoutEnd {
            slot: slot.into(),
            claim: name_of(live),
            until: until_of(live),
        }
    })
}

/// What release must not do: delete a schedule's pin during its window, which the schedule
/// would only replace, booting the machine again.
pub fn release_refusal(live: &NodeClaim, target: &SlotArgs) -> Option<PinError> {
    (live.spec.request.call == ClaimCall::Schedule).then(|| PinError::SchedulesPin {
        slot: target.slot.clone(),
        claim: name_of(live),
        group: live.spec.request.group.clone(),
        until: until_of(live),
        namespace: target.namespace.clone(),
    })
}

fn until_of(claim: &NodeClaim) -> String {
    claim.spec.until.as_ref().map_or_else(|| "its window's end".into(), |t| t.0.to_string())
}

/// `HH:MM` as hour and minute.
fn clock_time(given: &str) -> Option<(i8, i8)> {
    let (hour, minute) = given.split_once(':')?;
    if hour.is_empty() || hour.len() > 2 || minute.len() != 2 {
        return None;
    }
    let (hour, minute): (i8, i8) = (hour.parse().ok()?, minute.parse().ok()?);
    ((0..24).contains(&hour) && (0..60).contains(&minute)).then_some((hour, minute))
}

/// The next `hour:minute` after `now` in `now`'s time zone: today, or tomorrow once it passed.
fn next_at(now: &Zoned, hour: i8, minute: i8) -> Option<Timestamp> {
    let today = now.date().at(hour, minute, 0, 0).to_zoned(now.time_zone().clone()).ok()?;
    if today.timestamp() > now.timestamp() {
        return Some(today.timestamp());
    }
    let tomorrow = now.date().tomorrow().ok()?;
    Some(tomorrow.at(hour, minute, 0, 0).to_zoned(now.time_zone().clone()).ok()?.timestamp())
}

/// An end as a person reads it at `now`: local time, whether that is today or tomorrow, the
/// zone it is read in, then UTC.
pub fn describe_end(end: Option<Timestamp>, now: &Zoned) -> String {
    let Some(t) = end else { return "until released".to_owned() };
    let local = t.to_zoned(now.time_zone().clone());
    let zone = now.time_zone().iana_name().unwrap_or("UTC");
    let day = if local.date() == now.date() {
        "today, "
    } else if now.date().tomorrow().is_ok_and(|d| d == local.date()) {
        "tomorrow, "
    } else {
        ""
    };
    format!("until {} ({day}{zone}; {t})", local.strftime("%Y-%m-%d %H:%M %Z"))
}

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> PinError {
    let action = action.into();
    move |source| PinError::Kube { action, source }
}

/// The slot's live claim, read from the API server.
async fn live_claim(
    client: &kube::Client,
    target: &SlotArgs,
) -> Result<Option<NodeClaim>, PinError> {
    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), &target.namespace);
    let selector = format!("spec.slotRef.name={}", target.slot);
    let listed = claims
        .list(&ListParams::default().fields(&selector))
        .await
        .map_err(kube_err(format!("listing the claims of slot {}", target.slot)))?;
    Ok(listed.items.into_iter().find(|c| phase::is_live(Some(phase::of(c)))))
}

fn call_name(call: ClaimCall) -> String {
    serde_json::to_value(call).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

fn name_of(claim: &NodeClaim) -> String {
    claim.metadata.name.clone().unwrap_or_default()
}

/// Who the kubeconfig's user is, as the API server sees it; best effort.
async fn whoami(client: &kube::Client) -> String {
    let review: SelfSubjectReview = SelfSubjectReview::default();
    match Api::<SelfSubjectReview>::all(client.clone())
        .create(&FieldManager::Cli.post(), &review)
        .await
    {
        Ok(answer) => answer
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .unwrap_or_else(|| "an unknown user".to_owned()),
        Err(error) => {
            tracing::debug!(%error, "cannot ask the API server who we are");
            std::env::var("USER").unwrap_or_else(|_| "an unknown user".to_owned())
        }
    }
}

/// Runs `keep-on`; prints one line saying what was done.
pub async fn keep_on(args: KeepOnArgs) -> Result<(), PinError> {
    let tz = clock_zone(args.tz.as_deref(), args.until.as_deref())?;
    let now = Timestamp::now().to_zoned(tz);
    let end = end_of(args.for_.as_deref(), args.until.as_deref(), &now)?;
    let target = &args.target;
    let client = kube::Client::try_default().await.map_err(PinError::Client)?;
    let slot = Api::<Node>::namespaced(client.clone(), &target.namespace)
        .get(&target.slot)
        .await
        .map_err(|source| PinError::Slot {
        slot: target.slot.clone(),
        namespace: target.namespace.clone(),
        source,
    })?;
    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), &target.namespace);
    let until = describe_end(end, &now);
    let live = live_claim(&client, target).await?;
    if let Some(refusal) = live.as_ref().and_then(|l| keep_on_refusal(l, end, &target.slot)) {
        return Err(refusal);
    }
    match live {
        Some(live) if !live.spec.request.call.is_pin() => Err(PinError::ScalersMachine {
            slot: target.slot.clone(),
            claim: name_of(&live),
            call: call_name(live.spec.request.call),
            by: live.spec.requested_by.clone().unwrap_or_default(),
            namespace: target.namespace.clone(),
        }),
        Some(live) if phase::is_marked(&live) => {
            Err(PinError::BeingReleased { slot: target.slot.clone(), claim: name_of(&live) })
        }
        Some(live) if args.on_battery && live.spec.boot_on_battery != Some(true) => {
            Err(PinError::NotOnBattery {
                slot: target.slot.clone(),
                claim: name_of(&live),
                namespace: target.namespace.clone(),
            })
        }
        Some(live) => {
            let name = name_of(&live);
            let patch = json!({ "spec": { "until": end.map(Time) } });
            claims
                .patch(&name, &FieldManager::Cli.patch(), &Patch::Merge(&patch))
                .await
                .map_err(kube_err(format!("setting spec.until of claim {name}")))?;
            println!("claim {name} keeps slot {} on {until} (was already pinned)", target.slot);
            Ok(())
        }
        None => {
            let group = slot
                .group()
                .map(str::to_owned)
                .ok_or_else(|| PinError::NoGroup { slot: target.slot.clone() })?;
            let user = whoami(&client).await;
            let mut claim = NodeClaim::new(
                "",
                NodeClaimSpec {
                    slot_ref: SlotRef { name: target.slot.clone() },
                    request: ClaimRequest {
                        call: ClaimCall::Manual,
                        delta: None,
                        group,
                        nodes: Vec::new(),
                        reason: Some(format!("kept on by {user} with keep-on")),
                    },
                    requested_at: None,
                    requested_by: None,
                    attempt: None,
                    deadline_at: None,
                    max_node_provision_time: None,
                    until: end.map(Time),
                    boot_on_battery: args.on_battery.then_some(true),
                    ttl_seconds_after_finished: None,
                },
            );
            claim.metadata.name = None;
            claim.metadata.generate_name = Some(format!("{}-keep-on-", target.slot));
            claim.metadata.namespace = Some(target.namespace.clone());
            let created = claims
                .create(&FieldManager::Cli.post(), &claim)
                .await
                .map_err(kube_err(format!("creating a Manual claim for slot {}", target.slot)))?;
            println!("claim {} keeps slot {} on {until}", name_of(&created), target.slot);
            Ok(())
        }
    }
}

/// Runs `release`; prints one line saying what was done.
pub async fn release(target: SlotArgs) -> Result<(), PinError> {
    let client = kube::Client::try_default().await.map_err(PinError::Client)?;
    let Some(live) = live_claim(&client, &target).await? else {
        return Err(PinError::NothingHeld { slot: target.slot, namespace: target.namespace });
    };
    let name = name_of(&live);
    if !live.spec.request.call.is_pin() {
        return Err(PinError::NotAPin {
            slot: target.slot,
            claim: name,
            call: call_name(live.spec.request.call),
            by: live.spec.requested_by.clone().unwrap_or_default(),
        });
    }
    if let Some(refusal) = release_refusal(&live, &target) {
        return Err(refusal);
    }
    Api::<NodeClaim>::namespaced(client, &target.namespace)
        .delete(&name, &DeleteParams::default())
        .await
        .map_err(kube_err(format!("deleting claim {name}")))?;
    println!(
        "claim {name} deleted: slot {}'s machine is drained and powered off unless a scaler \
         needs it",
        target.slot
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(local: &str, zone: &str) -> Zoned {
        let tz = TimeZone::get(zone).unwrap();
        local.parse::<jiff::civil::DateTime>().unwrap().to_zoned(tz).unwrap()
    }

    #[test]
    fn the_end_of_a_pin_from_its_flags() {
        let now = at("2026-03-04T10:00:00", "Europe/Berlin"); // 09:00 UTC
        // (--for, --until, expected end in UTC, or None for until released)
        let table: [(Option<&str>, Option<&str>, Option<&str>); 7] = [
            (None, None, None),
            (Some("2h"), None, Some("2026-03-04T11:00:00Z")),
            (Some("1h30m"), None, Some("2026-03-04T10:30:00Z")),
            (None, Some("18:00"), Some("2026-03-04T17:00:00Z")),
            // Passed today: tomorrow.
            (None, Some("09:30"), Some("2026-03-05T08:30:00Z")),
            (None, Some("2026-03-04T12:00:00Z"), Some("2026-03-04T12:00:00Z")),
            (None, Some("2026-03-04T12:00:00+01:00"), Some("2026-03-04T11:00:00Z")),
        ];
        for (for_, until, want) in table {
            let got = end_of(for_, until, &now).unwrap();
            let want = want.map(|w| w.parse::<Timestamp>().unwrap());
            assert_eq!(got, want, "--for {for_:?} --until {until:?}");
        }
    }

    #[test]
    fn the_end_of_a_pin_refused() {
        let now = at("2026-03-04T10:00:00", "Europe/Berlin");
        let table: [(Option<&str>, Option<&str>, &str); 7] = [
            (Some("two hours"), None, "is not a duration"),
            (Some("0s"), None, "longer than zero"),
            (Some("-1h"), None, "longer than zero"),
            (None, Some("25:00"), "neither HH:MM"),
            (None, Some("18.00"), "neither HH:MM"),
            (None, Some("tomorrow"), "neither HH:MM"),
            (None, Some("2026-03-04T08:00:00Z"), "has passed"),
        ];
        for (for_, until, says) in table {
            let err = end_of(for_, until, &now).unwrap_err().to_string();
            assert!(err.contains(says), "--for {for_:?} --until {until:?}: {err}");
        }
    }

    #[test]
    fn an_end_reads_in_local_time_with_its_day_and_zone_and_utc() {
        let now = at("2026-03-04T19:00:00", "Europe/Berlin");
        // `--until 18:00` typed after 18:00 is tomorrow, and the line says so.
        let end = end_of(None, Some("18:00"), &now).unwrap();
        assert_eq!(
            describe_end(end, &now),
            "until 2026-03-05 18:00 CET (tomorrow, Europe/Berlin; 2026-03-05T17:00:00Z)"
        );
        let end = end_of(None, Some("23:00"), &now).unwrap();
        assert_eq!(
            describe_end(end, &now),
            "until 2026-03-04 23:00 CET (today, Europe/Berlin; 2026-03-04T22:00:00Z)"
        );
        let later = "2026-03-09T08:00:00Z".parse().ok();
        assert_eq!(
            describe_end(later, &now),
            "until 2026-03-09 09:00 CET (Europe/Berlin; 2026-03-09T08:00:00Z)"
        );
        assert_eq!(describe_end(None, &now), "until released");
    }

    #[test]
    fn the_zone_is_named_or_found_or_refused_where_it_matters() {
        let berlin = clock_zone(Some("Europe/Berlin"), Some("18:00")).unwrap();
        assert_eq!(berlin.iana_name(), Some("Europe/Berlin"));
        let bad = clock_zone(Some("Mars/Olympus"), None).unwrap_err().to_string();
        assert!(bad.contains("--tz \"Mars/Olympus\" is not a time zone"), "{bad}");
        // A machine whose zone cannot be read: a time of day is refused, not read in UTC.
        let unknown = || Err("TZ names no zone".to_string());
        let refused = zone_or_system(None, Some("18:00"), unknown).unwrap_err().to_string();
        assert!(refused.contains("name the zone with --tz"), "{refused}");
        let stamped = zone_or_system(None, Some("2026-03-04T18:00:00Z"), unknown).unwrap();
        assert_eq!(stamped, TimeZone::UTC, "a timestamp needs no zone");
        let named = zone_or_system(Some("Asia/Tokyo"), Some("18:00"), unknown).unwrap();
        assert_eq!(named.iana_name(), Some("Asia/Tokyo"));
    }

    fn pin(call: ClaimCall, until: Option<&str>) -> NodeClaim {
        let mut claim: NodeClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "NodeClaim",
            "metadata": { "name": "home-desk-1" },
            "spec": { "slotRef": { "name": "desk" }, "request": { "call": "Manual", "group": "home" } },
        }))
        .unwrap();
        claim.spec.request.call = call;
        claim.spec.until = until.map(|u| Time(u.parse().unwrap()));
        claim
    }

    #[test]
    fn a_schedules_pin_keeps_its_end_and_is_not_released_by_hand() {
        let window = pin(ClaimCall::Schedule, Some("2026-03-04T17:00:00Z"));
        let forever = keep_on_refusal(&window, None, "desk").unwrap().to_string();
        assert!(forever.contains("schedule, until 2026-03-04T17:00:00Z"), "{forever}");
        assert!(forever.contains("--until HH:MM or --for DURATION"), "{forever}");
        let later = "2026-03-04T20:00:00Z".parse().ok();
        assert!(keep_on_refusal(&window, later, "desk").is_none(), "an end is fine");
        let manual = pin(ClaimCall::Manual, None);
        assert!(keep_on_refusal(&manual, None, "desk").is_none(), "a person's own pin");
        let target = SlotArgs { slot: "desk".into(), namespace: "homelab".into() };
        let release = release_refusal(&window, &target).unwrap().to_string();
        assert!(release.contains("would claim and boot it again"), "{release}");
        assert!(release.contains("kubectl edit group.infra.homecluster.dev home -n homelab"));
        assert!(release_refusal(&manual, &target).is_none());
    }
}
