//! What the operator tells about itself: Prometheus metrics (one registry per process, every
//! family named in [`metrics`]), and the one-line calls the webhooks, the gRPC server, the
//! controllers, the claim phase writer and the built-in scaler make to record what happened.
//! The pure model never calls in here; the callers pass plain values.

mod exposition;
mod metrics;

use std::future::Future;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;

pub use exposition::{OPENMETRICS, TEXT, render, to_text_format};
pub use metrics::{Metrics, PREFIX};

struct Telemetry {
    registry: Registry,
    metrics: Metrics,
}

static TELEMETRY: LazyLock<Telemetry> = LazyLock::new(|| {
    let mut registry = Registry::with_prefix(PREFIX);
    let metrics = Metrics::register(&mut registry);
    Telemetry { registry, metrics }
});

fn m() -> &'static Metrics {
    &TELEMETRY.metrics
}

fn registry() -> &'static Registry {
    &TELEMETRY.registry
}

fn label(key: &'static str, value: impl Into<String>) -> (&'static str, String) {
    (key, value.into())
}

/// A claim moved from one phase to another (the chokepoint, once per written move).
pub fn claim_moved(group: &str, from: &str, to: &str, reason: Option<&str>) {
    let reason = reason.unwrap_or("none");
    m().claim_transitions
        .get_or_create(&[label("from", from), label("to", to), label("reason", reason)])
        .inc();
    if to == "Failed" && reason == "DeadlineExceeded" {
        m().deadline_failures.get_or_create(&[label("group", group)]).inc();
    }
}

/// A boot was committed (pending → booting) for the claim's `attempt`-th try.
pub fn boot_committed(group: &str, attempt: i64) {
    m().boots.get_or_create(&[label("group", group), label("attempt", attempt.to_string())]).inc();
}

/// A claim became ready, `since_request` after it was asked for and `since_boot` after its
/// boot was committed.
pub fn claim_ready(group: &str, since_request: Option<Duration>, since_boot: Option<Duration>) {
    let group = [label("group", group)];
    if let Some(took) = since_request {
        m().request_to_ready.get_or_create(&group).observe(took.as_secs_f64());
    }
    if let Some(took) = since_boot {
        m().boot_to_ready.get_or_create(&group).observe(took.as_secs_f64());
    }
}

/// A boot passed its readiness gate: its startup Job ran `job` (when its start is known) and
/// its node took `gate` from appearing to passing the gate.
pub fn boot_stages(group: &str, job: Option<Duration>, gate: Duration) {
    let g = [label("group", group)];
    if let Some(job) = job {
        m().startup_job.get_or_create(&g).observe(job.as_secs_f64());
    }
    m().readiness_gate.get_or_create(&g).observe(gate.as_secs_f64());
}

/// An admission request was answered; `denied` is the denial's reason and the rules the
/// object broke (one count per rule), if it was denied.
pub fn webhook_answered(webhook: &'static str, took: Duration, denied: Option<(&str, &[&str])>) {
    let allowed = if denied.is_some() { "false" } else { "true" };
    m().webhook_requests
        .get_or_create(&[label("webhook", webhook), label("allowed", allowed)])
        .inc();
    if let Some((reason, rules)) = denied {
        for rule in rules {
            m().webhook_denials
                .get_or_create(&[
                    label("webhook", webhook),
                    label("reason", reason),
                    label("rule", *rule),
                ])
                .inc();
        }
    }
    m().webhook_duration.get_or_create(&[label("webhook", webhook)]).observe(took.as_secs_f64());
}

/// An externalgrpc call was answered with `code` (a gRPC status code name, `OK` on success).
pub fn grpc_answered(rpc: &str, code: &str, took: Duration) {
    m().grpc_requests.get_or_create(&[label("rpc", rpc), label("code", code)]).inc();
    m().grpc_duration.get_or_create(&[label("rpc", rpc)]).observe(took.as_secs_f64());
}

/// Runs one reconcile of `controller` and records its result and duration.
pub async fn reconcile<T, E>(
    controller: &'static str,
    run: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let started = Instant::now();
    let result = run.await;
    let outcome = if result.is_ok() { "ok" } else { "error" };
    m().reconciles
        .get_or_create(&[label("controller", controller), label("result", outcome)])
        .inc();
    m().reconcile_duration
        .get_or_create(&[label("controller", controller)])
        .observe(started.elapsed().as_secs_f64());
    result
}

/// Whether this replica leads (holds the Lease and runs the controllers). A replica that stops
/// leading drops the gauges only the leader keeps (claims, slots, savings, the scaler's), so a
/// dashboard summing over replicas does not count a former leader's last values.
pub fn set_leader(leading: bool) {
    m().leader.set(i64::from(leading));
    if !leading {
        m().claims.clear();
        m().slots.clear();
        m().machine_seconds.clear();
        m().cost.clear();
        m().savings.clear();
        m().energy.clear();
        m().energy_cost.clear();
        m().slot_draw.clear();
        m().scaler_demand.clear();
        m().scaler_target.clear();
    }
}

/// `slot`'s plug meter read `watts`.
pub fn slot_draw_read(group: &str, slot: &str, watts: f64) {
    m().slot_draw.get_or_create(&[label("group", group), label("slot", slot)]).set(watts);
}

/// `slot`'s power-off was held by its pool's gates for `seconds` more (zero: it is counted, so
/// every slot has the series).
pub fn slot_power_off_held(group: &str, slot: &str, seconds: f64) {
    m().power_off_held.get_or_create(&[label("group", group), label("slot", slot)]).inc_by(seconds);
}

/// Whether the caches this replica serves from have synced.
pub fn set_caches_synced(synced: bool) {
    m().caches_synced.set(i64::from(synced));
}

/// The built-in scaler decided for `group`.
pub fn scaler_decided(group: &str, demand: i64, target: i64, action: &str) {
    let g = [label("group", group)];
    m().scaler_demand.get_or_create(&g).set(demand);
    m().scaler_target.get_or_create(&g).set(target);
    m().scaler_decisions.get_or_create(&[label("group", group), label("action", action)]).inc();
}

/// The sources `ups_power_source` names.
const UPS_SOURCES: [(crate::api::PowerSource, &str); 4] = [
    (crate::api::PowerSource::Mains, "mains"),
    (crate::api::PowerSource::Battery, "battery"),
    (crate::api::PowerSource::LowBattery, "low_battery"),
    (crate::api::PowerSource::Unread, "unread"),
];

/// What `group`'s UPS last said.
pub fn ups_read(group: &str, power: &crate::api::GroupPowerStatus) {
    for (source, name) in UPS_SOURCES {
        m().ups_source
            .get_or_create(&[label("group", group), label("source", name)])
            .set(i64::from(power.source == source));
    }
    let g = [label("group", group)];
    // From 0, so a pool that never shed has the series.
    m().ups_shed.get_or_create(&g).inc_by(0);
    if let Some(charge) = power.charge_percent {
        m().ups_charge.get_or_create(&g).set(charge);
    }
    if let Some(runtime) = power.runtime_seconds {
        m().ups_runtime.get_or_create(&g).set(runtime as f64);
    }
    if let Some(watts) = power.pool_watts {
        m().ups_pool_watts.get_or_create(&g).set(watts);
    }
}

/// `group` no longer names a UPS: its series go.
pub fn ups_forgotten(group: &str) {
    for (_, name) in UPS_SOURCES {
        m().ups_source.remove(&[label("group", group), label("source", name)]);
    }
    let g = [label("group", group)];
    m().ups_charge.remove(&g);
    m().ups_runtime.remove(&g);
    m().ups_pool_watts.remove(&g);
    m().ups_shed.remove(&g);
}

/// `group` shed a machine on battery.
pub fn ups_shed(group: &str) {
    m().ups_shed.get_or_create(&[label("group", group)]).inc();
}

/// What the group controller counted for `group`: live claims and slots by phase.
pub fn group_observed<'a>(
    group: &str,
    claims: impl IntoIterator<Item = (&'a str, i64)>,
    slots: impl IntoIterator<Item = (&'a str, i64)>,
) {
    // The group's claim series exist from its first sight, at zero: a histogram or counter
    // that first appears already counting shows no increase to rate() (its first scrape is its
    // baseline), so a burst of boots would be lost to the dashboard.
    let g = [label("group", group)];
    drop(m().request_to_ready.get_or_create(&g));
    drop(m().boot_to_ready.get_or_create(&g));
    drop(m().startup_job.get_or_create(&g));
    drop(m().readiness_gate.get_or_create(&g));
    drop(m().deadline_failures.get_or_create(&g));
    for (phase, n) in claims {
        m().claims.get_or_create(&[label("group", group), label("phase", phase)]).set(n);
    }
    for (phase, n) in slots {
        m().slots.get_or_create(&[label("group", group), label("phase", phase)]).set(n);
    }
}

/// A group's savings report, as published in its status.
pub struct SavingsSample {
    pub seconds_on: f64,
    pub seconds_off: f64,
    pub cost: f64,
    pub always_on_cost: f64,
    pub saved: f64,
    pub energy_used_kwh: f64,
    pub energy_saved_kwh: f64,
    pub energy_cost: f64,
    pub energy_saved_cost: f64,
}

/// The savings report of `group`.
pub fn savings_reported(group: &str, report: &SavingsSample) {
    let on = [label("group", group), label("power", "on")];
    let off = [label("group", group), label("power", "off")];
    m().machine_seconds.get_or_create(&on).set(report.seconds_on);
    m().machine_seconds.get_or_create(&off).set(report.seconds_off);
    m().cost.get_or_create(&[label("group", group), label("basis", "actual")]).set(report.cost);
    m().cost
        .get_or_create(&[label("group", group), label("basis", "always_on")])
        .set(report.always_on_cost);
    m().savings.get_or_create(&[label("group", group)]).set(report.saved);
    let used = [label("group", group), label("basis", "used")];
    let saved = [label("group", group), label("basis", "saved")];
    m().energy.get_or_create(&used).set(report.energy_used_kwh);
    m().energy.get_or_create(&saved).set(report.energy_saved_kwh);
    m().energy_cost.get_or_create(&used).set(report.energy_cost);
    m().energy_cost.get_or_create(&saved).set(report.energy_saved_cost);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_that_stops_leading_drops_the_leaders_gauges() {
        group_observed("ex-leader", [("ready", 2)], [("ready", 2)]);
        assert!(
            render(None)
                .1
                .contains("homelab_autoscaler_claims{group=\"ex-leader\",phase=\"ready\"} 2")
        );
        set_leader(false);
        let (_, text) = render(None);
        assert!(!text.contains("group=\"ex-leader\",phase="), "{text}");
        assert!(text.contains("homelab_autoscaler_leader 0"), "{text}");
    }

    #[test]
    fn recorded_values_show_in_the_exposition() {
        claim_moved("test-group", "Booting", "Failed", Some("DeadlineExceeded"));
        grpc_answered("NodeGroups", "OK", Duration::from_millis(3));
        let (_, text) = render(None);
        assert!(
            text.contains(
                "homelab_autoscaler_claim_transitions_total{from=\"Booting\",to=\"Failed\",reason=\"DeadlineExceeded\"}"
            ),
            "{text}"
        );
        assert!(
            text.contains("homelab_autoscaler_claim_deadline_failures_total{group=\"test-group\"}")
        );
        assert!(text.contains("homelab_autoscaler_grpc_request_duration_seconds_bucket{le="));
    }
}
