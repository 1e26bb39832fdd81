//! The pure model with criterion: the phase table, the slot's derived report, the boot budget,
//! and the built-in scaler's Demand/Target/Decide, including the classification of 1000 pods
//! into one pool's observation (the only step whose cost grows with the cluster).
//!
//! `cargo bench --bench model` measures; under `cargo test --all-targets` criterion runs each
//! benchmark once, which proves they still build and run. Results: docs/performance.md.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use homelab_autoscaler::api::{Group, Node as Slot, NodeClaim, NodeClaimPhase};
use homelab_autoscaler::claim::Timeouts;
use homelab_autoscaler::phase::{
    MachineObservation as Seen, SlotReportInput, Writer, check_move, derive_report,
};
use homelab_autoscaler::provider::GroupSnapshot;
use homelab_autoscaler::scaler::classify::{ClusterView, observe_group};
use homelab_autoscaler::scaler::{Machine, PoolView, Settings, State, decide, demand, target};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod};
use serde_json::json;

const PHASES: [NodeClaimPhase; 5] = [
    NodeClaimPhase::Pending,
    NodeClaimPhase::Booting,
    NodeClaimPhase::Ready,
    NodeClaimPhase::Completed,
    NodeClaimPhase::Failed,
];
const WRITERS: [Writer; 4] =
    [Writer::Lifecycle, Writer::ReadinessGate, Writer::ClaimController, Writer::ScaleDown];

/// Every (from, to, writer) the table can be asked about: 6 × 5 × 4 = 120 judgements.
fn phase_table(c: &mut Criterion) {
    let froms: Vec<Option<NodeClaimPhase>> =
        std::iter::once(None).chain(PHASES.iter().copied().map(Some)).collect();
    c.bench_function("phase table: all 120 moves judged", |b| {
        b.iter(|| {
            let mut legal = 0u32;
            for from in &froms {
                for to in PHASES {
                    for writer in WRITERS {
                        legal += u32::from(check_move(black_box(*from), to, writer).is_ok());
                    }
                }
            }
            legal
        })
    });
}

/// Every report input: 7 claim states (none, absent phase, each phase) × marked × 8
/// observations = 112 derivations.
fn report(c: &mut Criterion) {
    let mut inputs = Vec::new();
    let claims = std::iter::once(None)
        .chain(std::iter::once(None).chain(PHASES.iter().copied().map(Some)).map(Some));
    for live_claim in claims {
        for marked in [false, true] {
            for bits in 0u8..8 {
                let observed = Seen {
                    powered_on: bits & 1 != 0,
                    usable: bits & 2 != 0,
                    shutdown_job_in_flight: bits & 4 != 0,
                };
                inputs.push(SlotReportInput { live_claim, marked, observed });
            }
        }
    }
    let count = inputs.len();
    c.bench_function(&format!("report: {count} inputs derived"), |b| {
        b.iter(|| inputs.iter().map(|i| derive_report(black_box(*i)) as u8 as u32).sum::<u32>())
    });
}

fn budget(c: &mut Criterion) {
    let timeouts = Timeouts::default();
    let requested: Timestamp = "2026-03-04T09:00:00Z".parse().unwrap_or(Timestamp::UNIX_EPOCH);
    c.bench_function("budget: sum and deadline", |b| {
        b.iter(|| {
            let t = black_box(timeouts);
            (t.budget(), t.deadline_at(black_box(requested), Some(Duration::from_secs(1200))))
        })
    });
}

/// A pool of `slots` slots, `machines` of them held by a ready claim, in the shape the provider's
/// caches hold.
fn snapshot(slots: usize, machines: usize) -> GroupSnapshot {
    let group: Group = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
        "metadata": { "name": "pool", "namespace": "ns" },
        "spec": { "driver": "builtin", "builtin": { "podsPerNode": 10 } },
    }))
    .expect("group");
    let slot_objects: Vec<Arc<Slot>> = (0..slots)
        .map(|i| {
            let slot: Slot = serde_json::from_value(json!({
                "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
                "metadata": { "name": format!("slot-{i}"), "namespace": "ns",
                              "labels": { "group": "pool" } },
                "spec": { "kubernetesNodeName": format!("slot-{i}"),
                          "startupPodSpec": { "image": "busybox" },
                          "shutdownPodSpec": { "image": "busybox" },
                          "nodeCapacity": { "cpu": "4", "memory": "8Gi" },
                          "nodeLabels": { "homelab/pool": "pool" } },
            }))
            .expect("slot");
            Arc::new(slot)
        })
        .collect();
    let claims: Vec<Arc<NodeClaim>> = (0..machines)
        .map(|i| {
            let claim: NodeClaim = serde_json::from_value(json!({
                "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "NodeClaim",
                "metadata": { "name": format!("claim-{i}"), "namespace": "ns",
                              "creationTimestamp": "2026-03-04T09:00:00Z" },
                "spec": { "slotRef": { "name": format!("slot-{i}") },
                          "request": { "call": "IncreaseSize", "group": "pool" } },
                "status": { "phase": "ready" },
            }))
            .expect("claim");
            Arc::new(claim)
        })
        .collect();
    let registered = (0..machines).map(|i| format!("slot-{i}")).collect();
    GroupSnapshot::build(Arc::new(group), &slot_objects, &claims, &registered)
}

/// 1000 pods: 400 bound to the pool's machines, 500 pending that only the pool admits, 100
/// bound elsewhere; 20 nodes outside the pool that the pending pods do not fit.
fn cluster(pods: usize) -> ClusterView {
    let nodes = (0..20)
        .map(|i| {
            serde_json::from_value::<CoreNode>(json!({
                "metadata": { "name": format!("other-{i}"), "labels": { "homelab/pool": "other" } },
                "status": { "conditions": [{ "type": "Ready", "status": "True" }] },
            }))
            .expect("node")
        })
        .collect();
    let pods = (0..pods)
        .map(|i| {
            let (node, scheduled) = match i % 10 {
                0..=3 => (Some(format!("slot-{}", i % 40)), json!([])),
                4..=8 => (
                    None,
                    json!([{ "type": "PodScheduled", "status": "False", "reason": "Unschedulable" }]),
                ),
                _ => (Some(format!("other-{}", i % 20)), json!([])),
            };
            serde_json::from_value::<Pod>(json!({
                "metadata": { "name": format!("pod-{i}"), "namespace": "work" },
                "spec": { "containers": [{ "name": "c", "image": "busybox" }],
                          "nodeSelector": { "homelab/pool": "pool" },
                          "nodeName": node },
                "status": { "phase": "Pending", "conditions": scheduled },
            }))
            .expect("pod")
        })
        .collect();
    ClusterView { pods, nodes, ..ClusterView::default() }
}

/// Demand/Target/Decide for 1000 pods on a pool of 100 slots with 40 machines, and the
/// classification that turns the cluster's listings into that observation.
fn scaler(c: &mut Criterion) {
    let snapshot = snapshot(100, 40);
    let view = cluster(1000);
    let observation = observe_group(&view, &snapshot, &Default::default());
    assert_eq!(observation.machines.len(), 40, "the fixture's machines");
    assert_eq!(observation.pending_pods, 500, "the fixture's pending pods");
    let settings = Settings::of(&snapshot.group.spec, 100);
    let now: Timestamp = "2026-03-04T10:00:00Z".parse().unwrap_or(Timestamp::UNIX_EPOCH);
    let state = State {
        machine_idle_since: observation
            .machines
            .iter()
            .map(|m: &Machine| (m.slot.clone(), now))
            .collect::<BTreeMap<_, _>>(),
        ..State::default()
    };

    let mut group = c.benchmark_group("scaler at 1000 pods");
    group.bench_function("classify: 1000 pods into one pool's observation", |b| {
        b.iter(|| observe_group(black_box(&view), black_box(&snapshot), &Default::default()))
    });
    group.bench_function("demand + target", |b| {
        b.iter(|| target(demand(black_box(&observation)), &settings.limits))
    });
    group.bench_function("decide", |b| {
        b.iter(|| decide(black_box(&observation), &settings, &state, now))
    });
    group.bench_function("classify + decide (one pass of one pool)", |b| {
        b.iter(|| {
            let o: PoolView =
                observe_group(black_box(&view), black_box(&snapshot), &Default::default());
            decide(&o, &settings, &state, now)
        })
    });
    group.finish();
}

criterion_group! {
    name = model;
    // Short by default (the machine is shared); `cargo bench --bench model -- --measurement-time 10`
    // for a longer run.
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = phase_table, report, budget, scaler
}
criterion_main!(model);
