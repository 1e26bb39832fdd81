//! Power-off gates against a real control plane and a real Prometheus: a pool's data machines
//! go off one at a time, and only while the storage says it can lose one. The storage is a real
//! Ceph cluster (tests/harness/src/ceph.rs), its OSDs killed and started with their machines;
//! Longhorn's own CRDs, whose volume status the test writes as longhorn-manager does (Longhorn's
//! manager and engines cannot run here); and, where a test steps the storage's health by hand,
//! an exporter serving `ceph_health_status` as Ceph's manager does. Each test runs the
//! controllers for its own namespace; the power outage's runs a real upsd (Network UPS Tools)
//! as its UPS. tests/real_machines.rs runs Ceph's OSDs on real machines.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use homelab_autoscaler::api::{LABEL_SLOT, NodeClaim, NodeClaimPhase, PowerSource};
use homelab_harness::ceph::{Ceph, longest_inactive};
use homelab_harness::claims::phase;
use homelab_harness::e2e::prometheus::Prometheus;
use homelab_harness::lab::{Lab, With};
use homelab_harness::power_peers::UpsPeer;
use homelab_harness::slots::{self, power_off_hold};
use homelab_harness::{
    Components, ControlPlane, KWOK_NODE_ANNOTATION, eventually, longhorn, stays,
};
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// How long a test waits for the controllers to act.
const ACT: Duration = Duration::from_secs(120);
/// The pools' settle: how long after a data machine's shutdown the gates are not trusted.
const SETTLE: Duration = Duration::from_secs(20);

/// A metrics endpoint on 127.0.0.1 serving `ceph_health_status` as Ceph's manager module
/// exports it; the test sets the value.
struct CephHealth {
    addr: String,
    status: Arc<AtomicU8>,
    _server: tokio::task::JoinHandle<()>,
}

impl CephHealth {
    async fn start() -> anyhow::Result<Self> {
        let status = Arc::new(AtomicU8::new(0));
        let served = status.clone();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let value = served.load(Ordering::SeqCst);
                async move {
                    format!(
                        "# HELP ceph_health_status Cluster health status\n# TYPE ceph_health_status untyped\nceph_health_status {value}\n"
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, status, _server: server })
    }

    fn set(&self, status: u8) {
        self.status.store(status, Ordering::SeqCst);
    }
}

/// Puts `gates` on the lab's pool, with the test's settle.
async fn gate_pool(lab: &Lab, gates: serde_json::Value) {
    let patch = json!({ "spec": { "powerOffGates": gates, "powerOffGateSettle": format!("{}s", SETTLE.as_secs()) } });
    lab.groups()
        .patch("pool", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("gates");
}

/// The prometheus gate on Ceph's health.
fn ceph_gate(prometheus_url: &str) -> serde_json::Value {
    json!([{ "name": "ceph", "prometheus": { "url": prometheus_url, "query": "ceph_health_status == 0" } }])
}

/// Brings each slot's machine up with no claim wanting it: each is to be powered off.
async fn machines_up(lab: &Lab, slots: &[String]) {
    for slot in slots {
        let node: CoreNode = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": slot, "annotations": { KWOK_NODE_ANNOTATION: "fake" } },
        }))
        .expect("node");
        lab.nodes().create(&PostParams::default(), &node).await.expect("machine up");
    }
}

/// The slots whose shutdown Jobs exist, each with the Job's creation and completion times.
async fn shutdowns(
    lab: &Lab,
) -> anyhow::Result<Vec<(String, jiff::Timestamp, Option<jiff::Timestamp>)>> {
    let jobs = lab.lifecycle_jobs("shutdown").await?;
    Ok(jobs
        .iter()
        .map(|j| {
            let slot = j
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_SLOT))
                .cloned()
                .unwrap_or_default();
            let created = j.metadata.creation_timestamp.as_ref().map(|t| t.0).unwrap_or_default();
            let done = j.status.as_ref().and_then(|s| s.completion_time.as_ref()).map(|t| t.0);
            (slot, created, done)
        })
        .collect())
}

async fn prometheus_scraping(source: &CephHealth) -> (Prometheus, tempfile::TempDir) {
    let logs = tempfile::tempdir().expect("logs");
    let prometheus = Prometheus::start(std::slice::from_ref(&source.addr), logs.path())
        .await
        .expect("prometheus");
    eventually("Prometheus to have scraped Ceph's health", ACT, || async {
        prometheus.value("ceph_health_status").await.map(|_| ())
    })
    .await
    .expect("scraped");
    (prometheus, logs)
}

/// Three data machines, demand gone: the first is powered off; its storage then reports
/// degraded, and the others are held on, serving and uncordoned, saying which gate holds them
/// and what it read, for as long as it does; once healthy again the second goes, and the third
/// only after the pool's settle past the second's shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_machines_go_off_one_at_a_time_and_only_while_the_storage_is_healthy() {
    let lab = Lab::start("gates-turn", With::Controllers).await;
    let ceph = CephHealth::start().await.expect("exporter");
    let (prometheus, _logs) = prometheus_scraping(&ceph).await;
    let slots = lab.create_pool(3).await.expect("pool");
    gate_pool(&lab, ceph_gate(&prometheus.url())).await;
    machines_up(&lab, &slots).await;

    let first = eventually("the first data machine's shutdown", ACT, || async {
        let jobs = shutdowns(&lab).await?;
        ensure!(!jobs.is_empty(), "no shutdown Job yet");
        Ok(jobs)
    })
    .await
    .expect("a shutdown");
    assert_eq!(first.len(), 1, "one data machine at a time, not {first:?}");
    let first = first[0].0.clone();
    // Its OSDs are down: Ceph says HEALTH_WARN.
    ceph.set(1);
    let others: Vec<&String> = slots.iter().filter(|s| **s != first).collect();
    for slot in &others {
        let (by, reason, _) = eventually("the others held for their turn", ACT, || async {
            power_off_hold(&lab.slots().get(slot).await?).context("not held")
        })
        .await
        .expect("held");
        ensure_turn_or_gate(&by, &reason, &first);
    }
    until_off(&lab, &first).await;
    for slot in &others {
        let (_, _, message) = eventually("the others held by the gate", ACT, || async {
            let held = power_off_hold(&lab.slots().get(slot).await?).context("not held")?;
            ensure!(held.0 == "ceph" && held.1 == "GateHolds", "held by {held:?}");
            Ok(held)
        })
        .await
        .expect("held by ceph");
        assert!(
            message.contains(
                "gate ceph is closed: the query ceph_health_status == 0 returned no sample"
            ),
            "{message}"
        );
    }
    stays("the others on, serving, while Ceph is degraded", SETTLE, || async {
        let jobs = shutdowns(&lab).await?;
        ensure!(jobs.len() == 1, "shutdowns: {jobs:?}");
        for slot in &others {
            let node = lab.nodes().get(slot).await?;
            ensure!(!node.spec.and_then(|s| s.unschedulable).unwrap_or(false), "{slot} cordoned");
        }
        Ok(())
    })
    .await
    .expect("held on");
    let published = slots::event_count(&lab.client, &lab.ns, others[0], "PowerOffHeld").await;
    assert!(published.expect("events") >= 1, "a PowerOffHeld event");

    // Recovered: the second goes, and the third waits the settle past the second's shutdown.
    ceph.set(0);
    let jobs = eventually("all three powered off", ACT * 2, || async {
        let jobs = shutdowns(&lab).await?;
        ensure!(jobs.len() == 3 && jobs.iter().all(|j| j.2.is_some()), "shutdowns: {jobs:?}");
        Ok(jobs)
    })
    .await
    .expect("all off");
    let mut jobs = jobs;
    jobs.sort_by_key(|j| j.1);
    let (second_done, third_started) = (jobs[1].2.expect("done"), jobs[2].1);
    let gap = third_started.duration_since(second_done);
    assert!(
        gap.as_secs_f64() >= SETTLE.as_secs_f64() - 1.0,
        "the third shutdown started {gap:#} after the second ended, within the settle: {jobs:?}"
    );
    for slot in &slots {
        until_unheld(&lab, slot).await;
    }
}

fn ensure_turn_or_gate(by: &str, reason: &str, first: &str) {
    assert!(
        (reason == "AnotherDataMachineGoingOff" && by == first)
            || (reason == "GateHolds" && by == "ceph"),
        "held by {by} ({reason})"
    );
}

/// Claims `slot` as cluster-autoscaler's IncreaseSize would, under the claim's `name`.
async fn claim_slot(lab: &Lab, name: &str, slot: &str) {
    let claim = homelab_harness::claims::provider_claim_for(
        name,
        slot,
        &lab.slots(),
        &lab.groups(),
        lab.timeouts,
        "test",
    )
    .await
    .expect("claim");
    lab.claims().create(&PostParams::default(), &claim).await.expect("create claim");
}

/// Waits until nothing holds the slot's power-off.
async fn until_unheld(lab: &Lab, slot: &str) {
    eventually("the hold gone from the slot", ACT, || async {
        let held = power_off_hold(&lab.slots().get(slot).await?);
        ensure!(held.is_none(), "still held: {held:?}");
        Ok(())
    })
    .await
    .expect("unheld");
}

/// Waits until the slot's machine is off: its Node is gone.
async fn until_off(lab: &Lab, slot: &str) {
    eventually("the machine off", ACT, || async {
        ensure!(lab.nodes().get_opt(slot).await?.is_none(), "its node is still there");
        Ok(())
    })
    .await
    .expect("off");
}

/// A power outage on a pool with data: two machines hold Ceph's replicas (every gate of the pool
/// concerns them), two hold none (`powerOffGates: []`). The UPS goes on battery below the
/// pool's charge threshold, with nothing to keep: the two without data are shed first, and no
/// data machine is released while either is still on its way off; then one data machine at a
/// time. Its OSDs gone, Ceph degrades, and the second data machine, although shed, stays on
/// under its gate until the storage is healthy again: the battery does not overrule the data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_battery_machines_without_data_go_first_and_a_data_machine_waits_for_its_gate() {
    let lab = Lab::start("gates-ups", With::Controllers).await;
    let ups = UpsPeer::start().await.expect("upsd with dummy-ups");
    let ceph = CephHealth::start().await.expect("exporter");
    let (prometheus, _logs) = prometheus_scraping(&ceph).await;
    let slots = lab.create_pool(4).await.expect("pool");
    let (data, plain) = (&slots[..2], &slots[2..]);
    for slot in plain {
        let patch = json!({ "spec": { "powerOffGates": [] } });
        lab.slots()
            .patch(slot, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("no gate");
    }
    gate_pool(&lab, ceph_gate(&prometheus.url())).await;
    let policy = json!({ "spec": { "ups": {
        "name": ups.address(),
        "pollInterval": "1s",
        "onBattery": { "shedAfter": "10m", "shedBelowCharge": 50, "keep": 0 },
    } } });
    lab.groups().patch("pool", &PatchParams::default(), &Patch::Merge(&policy)).await.expect("ups");
    eventually("the pool reads mains from its UPS", ACT, || async {
        let power = lab.groups().get("pool").await?.status.and_then(|s| s.power);
        ensure!(power.is_some_and(|p| p.source == PowerSource::Mains), "not yet");
        Ok(())
    })
    .await
    .expect("mains");
    for slot in &slots {
        claim_slot(&lab, &format!("for-{slot}"), slot).await;
    }
    eventually("four machines ready", ACT, || async {
        let claims = lab.claims().list(&Default::default()).await?.items;
        let ready = claims.iter().filter(|c| phase(c) == NodeClaimPhase::Ready).count();
        ensure!(ready == 4, "{ready} ready");
        Ok(())
    })
    .await
    .expect("ready");

    let (watch, seen) = watch_shedding(&lab, data.to_vec());
    ups.set(&[("ups.status", "OB DISCHRG"), ("battery.charge", "40"), ("battery.runtime", "700")])
        .await
        .expect("on battery");
    let first = eventually("the first data machine's shutdown", ACT, || async {
        let jobs = shutdowns(&lab).await?;
        let going: Vec<String> =
            jobs.into_iter().map(|j| j.0).filter(|s| data.contains(s)).collect();
        ensure!(!going.is_empty(), "no data machine's shutdown Job yet");
        Ok(going)
    })
    .await
    .expect("a data machine going off");
    assert_eq!(first.len(), 1, "one data machine at a time, not {first:?}");
    let first = first[0].clone();
    // Its OSDs are down: Ceph says HEALTH_WARN.
    ceph.set(1);
    until_off(&lab, &first).await;
    let second = data.iter().find(|s| **s != first).expect("the other data machine");
    eventually("the second data machine shed, and held by the gate", ACT, || async {
        let claim = lab.claims().get(&format!("for-{second}")).await?;
        ensure!(homelab_autoscaler::phase::is_marked(&claim), "not shed yet");
        let held = power_off_hold(&lab.slots().get(second).await?).context("not held")?;
        ensure!(held.0 == "ceph" && held.1 == "GateHolds", "held by {held:?}");
        Ok(())
    })
    .await
    .expect("shed and held");
    stays("the shed data machine on while Ceph is degraded", SETTLE, || async {
        let jobs = shutdowns(&lab).await?;
        ensure!(!jobs.iter().any(|j| j.0 == *second), "shutdowns: {jobs:?}");
        ensure!(lab.nodes().get_opt(second).await?.is_some(), "its machine is off");
        Ok(())
    })
    .await
    .expect("held on");

    ceph.set(0);
    until_off(&lab, second).await;
    watch.abort();
    let seen = seen.lock().expect("the record").clone();
    assert!(seen.violations.is_empty(), "{:#?}", seen.violations);
    let order: Vec<&str> = seen.marked.iter().map(|(slot, _)| slot.as_str()).collect();
    assert_eq!(
        order.iter().take(2).copied().collect::<std::collections::BTreeSet<_>>(),
        plain.iter().map(String::as_str).collect(),
        "the machines without data first: {order:?}"
    );
    assert_eq!(order[2..], [first.as_str(), second.as_str()], "then the data machines: {order:?}");
    for (slot, by) in &seen.marked {
        let rank = if data.contains(slot) { "a data machine, after the others" } else { "no data" };
        assert!(by.contains("charge 40% is below 50%") && by.contains(rank), "{slot}: {by}");
    }
}

/// What [`watch_shedding`] saw: the slots in the order their claims were first seen released,
/// with who released them, and each moment the pool broke the order.
#[derive(Clone, Default)]
struct Shedding {
    marked: Vec<(String, String)>,
    violations: Vec<String>,
}

/// Reads the pool's claims every 200 ms while it sheds: a data machine's claim released while a
/// machine without data is still on, or two data machines released at once, is a violation.
fn watch_shedding(
    lab: &Lab,
    data: Vec<String>,
) -> (tokio::task::JoinHandle<()>, Arc<std::sync::Mutex<Shedding>>) {
    let seen = Arc::new(std::sync::Mutex::new(Shedding::default()));
    let (claims, record) = (lab.claims(), seen.clone());
    let task = tokio::spawn(async move {
        loop {
            if let Ok(list) = claims.list(&Default::default()).await {
                let live: Vec<&NodeClaim> = list
                    .items
                    .iter()
                    .filter(|c| homelab_autoscaler::phase::is_live(Some(phase(c))))
                    .collect();
                let marked: Vec<&NodeClaim> = live
                    .iter()
                    .copied()
                    .filter(|c| homelab_autoscaler::phase::is_marked(c))
                    .collect();
                let is_data = |c: &NodeClaim| data.contains(&c.spec.slot_ref.name);
                let data_going = marked.iter().filter(|c| is_data(c)).count();
                let plain_on = live.iter().filter(|c| !is_data(c)).count();
                let mut record = record.lock().expect("the record");
                if data_going > 0 && plain_on > 0 {
                    record.violations.push(format!(
                        "{}: a data machine released while {plain_on} without data are on",
                        jiff::Timestamp::now()
                    ));
                }
                if data_going > 1 {
                    record.violations.push(format!(
                        "{}: {data_going} data machines released at once",
                        jiff::Timestamp::now()
                    ));
                }
                for claim in marked {
                    let slot = &claim.spec.slot_ref.name;
                    if !record.marked.iter().any(|(s, _)| s == slot) {
                        let by =
                            claim.status.as_ref().and_then(|s| s.scale_down_requested_by.clone());
                        record.marked.push((slot.clone(), by.unwrap_or_default()));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    (task, seen)
}

/// A gate that cannot be read holds: Prometheus is not there. The slot says why, and naming no
/// gate on the slot lets the machine go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_gate_holds_the_machine_on_until_the_slot_names_no_gate() {
    let lab = Lab::start("gates-unread", With::Controllers).await;
    let slots = lab.create_pool(1).await.expect("pool");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let url = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    gate_pool(&lab, ceph_gate(&url)).await;
    machines_up(&lab, &slots).await;
    let slot = &slots[0];
    let (by, reason, message) = eventually("held by the unreadable gate", ACT, || async {
        power_off_hold(&lab.slots().get(slot).await?).context("not held")
    })
    .await
    .expect("held");
    assert_eq!((by.as_str(), reason.as_str()), ("ceph", "GateHolds"));
    assert!(
        message
            .contains(&format!("gate ceph could not be read: Prometheus at {url} did not answer")),
        "{message}"
    );
    stays("the machine on while the gate is unread", Duration::from_secs(15), || async {
        ensure!(shutdowns(&lab).await?.is_empty(), "a shutdown Job was made");
        Ok(())
    })
    .await
    .expect("held on");
    let patch = json!({ "spec": { "powerOffGates": [] } });
    lab.slots().patch(slot, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("no gate");
    until_off(&lab, slot).await;
    until_unheld(&lab, slot).await;
}

/// A CEL gate over Longhorn's volumes, on Longhorn's own CRDs (installed from its published
/// module as its chart installs them): the machine stays on while a volume is degraded and goes
/// once every volume reads healthy, its status written as longhorn-manager writes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cel_gate_over_volumes_holds_until_every_volume_is_healthy() {
    let lab = Lab::start("gates-cel", With::Controllers).await;
    let plane = ControlPlane::shared(Components::CLUSTER).await.expect("control plane");
    longhorn::install_crds(plane).await.expect("Longhorn's CRDs");
    let volumes: Api<kube::api::DynamicObject> = Api::namespaced_with(
        lab.client.clone(),
        &lab.ns,
        &kube::api::ApiResource {
            group: "longhorn.io".into(),
            version: "v1beta2".into(),
            api_version: "longhorn.io/v1beta2".into(),
            kind: "Volume".into(),
            plural: "volumes".into(),
        },
    );
    eventually("the Volume kind served", ACT, || async {
        let volume: kube::api::DynamicObject = serde_json::from_value(json!({
            "apiVersion": "longhorn.io/v1beta2", "kind": "Volume",
            "metadata": { "name": "pvc-db" }, "spec": { "numberOfReplicas": 3 },
        }))?;
        Ok(volumes.create(&PostParams::default(), &volume).await?)
    })
    .await
    .expect("volume");
    let robustness =
        |value: &str| json!({ "status": { "state": "attached", "robustness": value } });
    volumes
        .patch_status("pvc-db", &PatchParams::default(), &Patch::Merge(&robustness("degraded")))
        .await
        .expect("degraded");
    let slots = lab.create_pool(1).await.expect("pool");
    let expression = "objects.all(v, v.status.robustness == 'healthy')";
    gate_pool(
        &lab,
        json!([{ "name": "longhorn", "kubernetes": {
            "apiVersion": "longhorn.io/v1beta2", "kind": "Volume", "namespace": lab.ns, "expression": expression,
        } }]),
    )
    .await;
    machines_up(&lab, &slots).await;
    let slot = &slots[0];
    let (by, _, message) = eventually("held by the volumes", ACT, || async {
        power_off_hold(&lab.slots().get(slot).await?).context("not held")
    })
    .await
    .expect("held");
    assert_eq!(by, "longhorn");
    assert!(
        message.contains(&format!("gate longhorn is closed: {expression} is false of 1 Volume")),
        "{message}"
    );
    volumes
        .patch_status("pvc-db", &PatchParams::default(), &Patch::Merge(&robustness("healthy")))
        .await
        .expect("healthy");
    until_off(&lab, slot).await;
}

/// The pool's maintenance steps around a power-off: a step before that fails holds the machine
/// on (no cordon, no shutdown) and says so; deleted and run again where it can succeed, the
/// machine goes off after it; booted again, the step after runs once the machine is Ready, and
/// the record of the step before is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_steps_run_before_a_power_off_and_after_the_machine_is_back() {
    let lab = Lab::start("gates-steps", With::Controllers).await;
    let slots = lab.create_pool(1).await.expect("pool");
    let slot = &slots[0];
    let step = |on: &str, what: &str| {
        json!({
            "image": "registry.invalid/ceph-tools:1",
            "command": ["ceph", "osd", what, "noout"],
            "nodeSelector": { "homelab.test/lab": on },
            "activeDeadlineSeconds": 5,
            "backoffLimit": 0,
        })
    };
    let steps = |before_on: &str| {
        json!({ "spec": { "maintenance": {
            "beforePowerOff": step(before_on, "set-group"),
            "afterReady": step(&lab.ns, "unset-group"),
        } } })
    };
    // The step before can run nowhere: its Job runs into its deadline and fails.
    let patch = steps("nowhere");
    lab.groups()
        .patch("pool", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("steps");
    machines_up(&lab, &slots).await;
    let (by, reason, message) = eventually("held by the failed step", ACT, || async {
        let held = power_off_hold(&lab.slots().get(slot).await?).context("not held")?;
        ensure!(held.2.contains("failed"), "not failed yet: {held:?}");
        Ok(held)
    })
    .await
    .expect("held");
    assert_eq!(reason, "MaintenanceStep");
    let failed = by.strip_prefix("step ").expect("the step's Job").to_owned();
    assert!(message.contains("delete the Job to run the step again"), "{message}");
    stays("on and uncordoned while the step has failed", Duration::from_secs(10), || async {
        ensure!(shutdowns(&lab).await?.is_empty(), "a shutdown Job was made");
        let node = lab.nodes().get(slot).await?;
        ensure!(!node.spec.and_then(|s| s.unschedulable).unwrap_or(false), "cordoned");
        Ok(())
    })
    .await
    .expect("held on");

    // Fixed, and run again by deleting the failed Job, as the slot says.
    let patch = steps(&lab.ns);
    lab.groups()
        .patch("pool", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("steps");
    lab.jobs().delete(&failed, &kube::api::DeleteParams::background()).await.expect("delete");
    until_off(&lab, slot).await;
    let before = lab.lifecycle_jobs("before-power-off").await.expect("jobs");
    assert_eq!(before.len(), 1, "the succeeded step before is kept: {before:?}");
    assert!(lab.lifecycle_jobs("after-ready").await.expect("jobs").is_empty(), "not yet");

    // Booted again: the step after runs once it is Ready, then the record goes.
    claim_slot(&lab, "back", slot).await;
    eventually("the step after run, and the record gone", ACT, || async {
        let after = lab.lifecycle_jobs("after-ready").await?;
        let done =
            after.iter().any(|j| j.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0) > 0);
        ensure!(done, "the step after has not succeeded: {}", after.len());
        let before = lab.lifecycle_jobs("before-power-off").await?;
        ensure!(before.is_empty(), "the step before is still kept");
        Ok(())
    })
    .await
    .expect("after");
    let env = |job: &k8s_openapi::api::batch::v1::Job| {
        job.spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .map(|p| p.containers[0].env.clone().unwrap_or_default())
            .unwrap_or_default()
    };
    let after = lab.lifecycle_jobs("after-ready").await.expect("jobs");
    let slot_env =
        env(&after[0]).into_iter().find(|e| e.name == "HOMELAB_SLOT").and_then(|e| e.value);
    assert_eq!(slot_env.as_deref(), Some(slot.as_str()), "the step names its slot");
}

/// When each OSD was last started again, by its machine's index.
type RestartTimes = Arc<std::sync::Mutex<Vec<Option<jiff::Timestamp>>>>;

/// Keeps each OSD with its machine: OSD `i` lives on `slots[i]`. A machine whose shutdown Job
/// succeeded after its Node appeared is off, and its OSD is killed, as a machine losing power
/// takes its OSD down; a machine whose Node is back is on again, and its OSD starts. Returns
/// the task and when each OSD was last started again.
fn osds_follow_their_machines(
    lab: &Lab,
    slots: &[String],
    ceph: Arc<Ceph>,
) -> (tokio::task::JoinHandle<()>, RestartTimes) {
    let restarted = Arc::new(std::sync::Mutex::new(vec![None; slots.len()]));
    let (nodes, jobs, slots, record) = (lab.nodes(), lab.jobs(), slots.to_vec(), restarted.clone());
    let task = tokio::spawn(async move {
        let mut running = vec![true; slots.len()];
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let Ok(all_jobs) = jobs.list(&Default::default()).await else { continue };
            for (i, slot) in slots.iter().enumerate() {
                let Ok(node) = nodes.get_opt(slot).await else { continue };
                let born = node.as_ref().and_then(|n| n.metadata.creation_timestamp.clone());
                let shut_since_born = all_jobs.items.iter().any(|j| {
                    let labels = j.metadata.labels.clone().unwrap_or_default();
                    let done = j.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0) > 0;
                    labels.get(LABEL_SLOT) == Some(slot)
                        && labels.get("infra.homecluster.dev/lifecycle").map(String::as_str)
                            == Some("shutdown")
                        && done
                        && born.as_ref().is_some_and(|b| {
                            j.metadata.creation_timestamp.as_ref().is_some_and(|c| c.0 >= b.0)
                        })
                });
                let on = node.is_some() && !shut_since_born;
                if running[i] && !on {
                    ceph.stop_osd(i).expect("stop the OSD");
                    running[i] = false;
                } else if !running[i] && on {
                    ceph.start_osd(i).expect("start the OSD");
                    running[i] = true;
                    record.lock().unwrap()[i] = Some(jiff::Timestamp::now());
                }
            }
        }
    });
    (task, restarted)
}

/// A real Ceph cluster, one OSD on each of three machines, the pool replicated three ways
/// (`min_size` 2), gated on Ceph's health as its manager exports it. Demand gone: the first
/// machine goes off and its OSD with it; Ceph reports the OSD down and the data degraded, and
/// the other two are held on, the slots quoting Ceph's own health checks, for as long as that
/// lasts (with three replicas on three OSDs the data cannot be rebuilt elsewhere: the pool's
/// floor is two machines). The first machine comes back: Ceph is healthy again, and a second
/// machine goes, not before. No placement group stays inactive at any time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_ceph_cluster_loses_one_osd_machine_at_a_time() {
    let ceph = Arc::new(Ceph::start(3).await.expect("a Ceph cluster"));
    let logs = tempfile::tempdir().expect("logs");
    let prometheus = Prometheus::start(std::slice::from_ref(&ceph.metrics_addr), logs.path())
        .await
        .expect("prometheus");
    eventually("Prometheus to have scraped a healthy Ceph", ACT, || async {
        ensure!(!prometheus.query("ceph_health_status == 0").await?.is_empty(), "not yet");
        Ok(())
    })
    .await
    .expect("scraped");
    let lab = Lab::start("gates-ceph", With::Controllers).await;
    let slots = lab.create_pool(3).await.expect("pool");
    let gate = json!([{ "name": "ceph", "prometheus": {
        "url": prometheus.url(), "query": "ceph_health_status == 0", "explain": "ceph_health_detail == 1",
    } }]);
    gate_pool(&lab, gate).await;
    let (coupling, restarted) = osds_follow_their_machines(&lab, &slots, ceph.clone());
    // Every two seconds: how many placement groups are not active.
    let samples = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sampler = {
        let (ceph, samples) = (ceph.clone(), samples.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(status) = ceph.status().await {
                    samples.lock().unwrap().push((jiff::Timestamp::now(), status));
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        })
    };
    machines_up(&lab, &slots).await;

    let first = eventually("the first OSD machine's shutdown", ACT, || async {
        let jobs = shutdowns(&lab).await?;
        ensure!(!jobs.is_empty(), "no shutdown Job yet");
        Ok(jobs)
    })
    .await
    .expect("a shutdown");
    assert_eq!(first.len(), 1, "one OSD machine at a time, not {first:?}");
    let first = first[0].0.clone();
    let index = slots.iter().position(|s| *s == first).expect("a slot of the pool");
    let others: Vec<&String> = slots.iter().filter(|s| **s != first).collect();
    for slot in &others {
        let (_, _, message) = eventually("held by Ceph's health", ACT, || async {
            let held = power_off_hold(&lab.slots().get(slot).await?).context("not held")?;
            ensure!(held.0 == "ceph" && held.2.contains("OSD_DOWN"), "held by {held:?}");
            Ok(held)
        })
        .await
        .expect("held by ceph");
        assert!(
            message.contains("the query ceph_health_status == 0 returned no sample"),
            "{message}"
        );
    }
    stays("the other two on while Ceph is degraded", SETTLE + Duration::from_secs(10), || async {
        let jobs = shutdowns(&lab).await?;
        ensure!(jobs.len() == 1, "shutdowns: {jobs:?}");
        Ok(())
    })
    .await
    .expect("held on");
    let status = ceph.status().await.expect("status");
    assert_eq!(status.health, "HEALTH_WARN", "{status:?}");
    assert_eq!(status.active, status.pgs, "every placement group active with one OSD down");

    // The first machine comes back (a claim for it): Ceph heals, and one more may go.
    claim_slot(&lab, "back", &first).await;
    let jobs =
        eventually("a second OSD machine off once Ceph is healthy again", ACT * 2, || async {
            let jobs = shutdowns(&lab).await?;
            ensure!(jobs.len() == 2 && jobs.iter().all(|j| j.2.is_some()), "shutdowns: {jobs:?}");
            Ok(jobs)
        })
        .await
        .expect("a second off");
    let back = restarted.lock().unwrap()[index].expect("the first machine's OSD started again");
    let second = jobs.iter().find(|j| j.0 != first).expect("the second");
    assert!(
        second.1 >= back,
        "the second shutdown {second:?} began before the first OSD was back at {back}"
    );
    let third = slots.iter().find(|s| **s != first && **s != second.0).expect("the third");
    eventually("the third held again", ACT, || async {
        let held = power_off_hold(&lab.slots().get(third).await?).context("not held")?;
        ensure!(held.2.contains("OSD_DOWN"), "held by {held:?}");
        Ok(())
    })
    .await
    .expect("the third held");

    coupling.abort();
    sampler.abort();
    // Peering after an OSD dies takes a few seconds; no placement group stays inactive longer.
    let samples = samples.lock().unwrap().clone();
    if let Some((lasted, at, status)) = longest_inactive(&samples) {
        assert!(
            lasted.as_secs() < 15,
            "placement groups inactive for {lasted:#} at {at}: {status:?}"
        );
    }
    assert!(samples.len() > 20, "{} samples", samples.len());
}
