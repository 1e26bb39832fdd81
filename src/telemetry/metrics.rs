//! The one place that names every metric. Names follow Prometheus conventions: the
//! `homelab_autoscaler_` namespace, base units (`_seconds`), `_total` on counters (the encoder
//! appends it), and labels of bounded cardinality only: groups, phases, reasons, routes, RPCs
//! and controllers, never a claim's or a machine's name.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// One label.
pub type Label = (&'static str, String);
type Counters<const N: usize> = Family<[Label; N], Counter>;
type Gauges<const N: usize> = Family<[Label; N], Gauge>;
type FloatCounters<const N: usize> = Family<[Label; N], Counter<f64, std::sync::atomic::AtomicU64>>;
type FloatGauges<const N: usize> = Family<[Label; N], Gauge<f64, std::sync::atomic::AtomicU64>>;
type Histograms<const N: usize> = Family<[Label; N], Histogram, fn() -> Histogram>;

/// The metric namespace.
pub const PREFIX: &str = "homelab_autoscaler";

/// Every metric family of the operator.
pub struct Metrics {
    pub claims: Gauges<2>,
    pub slots: Gauges<2>,
    pub claim_transitions: Counters<3>,
    pub deadline_failures: Counters<1>,
    pub boots: Counters<2>,
    pub request_to_ready: Histograms<1>,
    pub boot_to_ready: Histograms<1>,
    pub startup_job: Histograms<1>,
    pub readiness_gate: Histograms<1>,
    pub webhook_requests: Counters<2>,
    pub webhook_denials: Counters<3>,
    pub webhook_duration: Histograms<1>,
    pub grpc_requests: Counters<2>,
    pub grpc_duration: Histograms<1>,
    pub reconciles: Counters<2>,
    pub reconcile_duration: Histograms<1>,
    pub leader: Gauge,
    pub caches_synced: Gauge,
    pub scaler_demand: Gauges<1>,
    pub scaler_target: Gauges<1>,
    pub scaler_decisions: Counters<2>,
    pub machine_seconds: FloatGauges<2>,
    pub cost: FloatGauges<2>,
    pub savings: FloatGauges<1>,
    pub energy: FloatGauges<2>,
    pub energy_cost: FloatGauges<2>,
    pub slot_draw: FloatGauges<2>,
    pub power_off_held: FloatCounters<2>,
    pub ups_source: Gauges<2>,
    pub ups_charge: FloatGauges<1>,
    pub ups_runtime: FloatGauges<1>,
    pub ups_pool_watts: FloatGauges<1>,
    pub ups_shed: Counters<1>,
}

/// Request latencies: 0.5 ms to about 4 s.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

/// Boot times: 5 s to about 21 min (a boot budget is 12m10s by default).
fn boot_time() -> Histogram {
    Histogram::new(exponential_buckets(5.0, 1.5, 15))
}

impl Metrics {
    /// Creates every family and registers it in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            claims: Family::default(),
            slots: Family::default(),
            claim_transitions: Family::default(),
            deadline_failures: Family::default(),
            boots: Family::default(),
            request_to_ready: Family::new_with_constructor(boot_time as fn() -> Histogram),
            boot_to_ready: Family::new_with_constructor(boot_time as fn() -> Histogram),
            startup_job: Family::new_with_constructor(boot_time as fn() -> Histogram),
            readiness_gate: Family::new_with_constructor(boot_time as fn() -> Histogram),
            webhook_requests: Family::default(),
            webhook_denials: Family::default(),
            webhook_duration: Family::new_with_constructor(latency as fn() -> Histogram),
            grpc_requests: Family::default(),
            grpc_duration: Family::new_with_constructor(latency as fn() -> Histogram),
            reconciles: Family::default(),
            reconcile_duration: Family::new_with_constructor(latency as fn() -> Histogram),
            leader: Gauge::default(),
            caches_synced: Gauge::default(),
            scaler_demand: Family::default(),
            scaler_target: Family::default(),
            scaler_decisions: Family::default(),
            machine_seconds: Family::default(),
            cost: Family::default(),
            savings: Family::default(),
            energy: Family::default(),
            energy_cost: Family::default(),
            slot_draw: Family::default(),
            power_off_held: Family::default(),
            ups_source: Family::default(),
            ups_charge: Family::default(),
            ups_runtime: Family::default(),
            ups_pool_watts: Family::default(),
            ups_shed: Family::default(),
        };
        let r = registry;
        let m = &metrics;
        r.register(
            "claims",
            "Live claims by group and phase (pending, booting, ready)",
            m.claims.clone(),
        );
        r.register(
            "slots",
            "Slots by group and reported phase (off, pending, booting, ready, draining)",
            m.slots.clone(),
        );
        r.register(
            "claim_transitions",
            "Claim phase moves by from, to and reason",
            m.claim_transitions.clone(),
        );
        r.register(
            "claim_deadline_failures",
            "Claims failed because their boot deadline passed",
            m.deadline_failures.clone(),
        );
        r.register(
            "claim_boots",
            "Boots committed (pending to booting), by group and attempt number",
            m.boots.clone(),
        );
        r.register_with_unit(
            "claim_request_to_ready",
            "Time from a claim's request to its machine being ready",
            Unit::Seconds,
            m.request_to_ready.clone(),
        );
        r.register_with_unit("claim_boot_to_ready", "Time from a committed boot to a ready machine: the startup Job, registration and the readiness gate", Unit::Seconds, m.boot_to_ready.clone());
        r.register_with_unit(
            "startup_job_duration",
            "Time a boot's startup Job ran, from its start to its completion",
            Unit::Seconds,
            m.startup_job.clone(),
        );
        r.register_with_unit(
            "readiness_gate_duration",
            "Time from a booting machine's node appearing to it passing the readiness gate",
            Unit::Seconds,
            m.readiness_gate.clone(),
        );
        r.register(
            "webhook_requests",
            "Admission requests by webhook and verdict",
            m.webhook_requests.clone(),
        );
        r.register(
            "webhook_denials",
            "Admission denials by webhook, reason and the rule broken",
            m.webhook_denials.clone(),
        );
        r.register_with_unit(
            "webhook_request_duration",
            "Time to answer an admission request",
            Unit::Seconds,
            m.webhook_duration.clone(),
        );
        r.register(
            "grpc_requests",
            "externalgrpc calls by RPC and status code",
            m.grpc_requests.clone(),
        );
        r.register_with_unit(
            "grpc_request_duration",
            "Time to answer an externalgrpc call",
            Unit::Seconds,
            m.grpc_duration.clone(),
        );
        r.register(
            "reconciles",
            "Reconcile runs by controller and result (ok, error)",
            m.reconciles.clone(),
        );
        r.register_with_unit(
            "reconcile_duration",
            "Time one reconcile run takes",
            Unit::Seconds,
            m.reconcile_duration.clone(),
        );
        r.register(
            "leader",
            "1 while this replica holds the leader Lease and runs the controllers",
            m.leader.clone(),
        );
        r.register(
            "caches_synced",
            "1 once the provider's caches have synced (the replica is ready)",
            m.caches_synced.clone(),
        );
        r.register(
            "scaler_demand",
            "The built-in scaler's last observed demand (pod work), by group",
            m.scaler_demand.clone(),
        );
        r.register(
            "scaler_target",
            "The built-in scaler's last target machine count, by group",
            m.scaler_target.clone(),
        );
        r.register(
            "scaler_decisions",
            "The built-in scaler's decisions by group and action",
            m.scaler_decisions.clone(),
        );
        r.register_with_unit(
            "group_machine",
            "Machine time of a group since its savings start, by power (on, off)",
            Unit::Seconds,
            m.machine_seconds.clone(),
        );
        r.register("group_cost", "Cost of a group since its savings start, in its pricing's currency: actual, or always_on", m.cost.clone());
        r.register(
            "group_savings",
            "Cost saved against keeping every slot of the group on, since its savings start",
            m.savings.clone(),
        );
        r.register(
            "group_energy_kwh",
            "Energy of a group since its savings start from its slots' watts (read by a plug \
             meter, else declared), in kWh: used, or saved against every slot always on",
            m.energy.clone(),
        );
        r.register(
            "group_energy_cost",
            "The group's energy (used, or saved) priced at its tariff, in the tariff's currency",
            m.energy_cost.clone(),
        );
        r.register(
            "slot_draw_watts",
            "A slot's draw as its plug's meter last read it, in watts",
            m.slot_draw.clone(),
        );
        r.register_with_unit(
            "slot_power_off_held",
            "Time a slot's power-off was held on by its pool's power-off gates",
            Unit::Seconds,
            m.power_off_held.clone(),
        );
        r.register(
            "ups_power_source",
            "1 for the power source a group's UPS last reported (mains, battery, low_battery, \
             unread), 0 for the others",
            m.ups_source.clone(),
        );
        r.register(
            "ups_battery_charge_percent",
            "The battery charge a group's UPS last reported, in percent",
            m.ups_charge.clone(),
        );
        r.register_with_unit(
            "ups_battery_runtime",
            "The runtime on battery a group's UPS last estimated",
            Unit::Seconds,
            m.ups_runtime.clone(),
        );
        r.register(
            "ups_pool_watts",
            "The draw a group's powered machines account for on its UPS (metered, else declared), \
             in watts",
            m.ups_pool_watts.clone(),
        );
        r.register("ups_machines_shed", "Machines a group shed on battery", m.ups_shed.clone());
        metrics
    }
}
