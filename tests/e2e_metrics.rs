//! Operability end to end: a real Prometheus scrapes the operator binary every second while the
//! real cluster-autoscaler scales a pool up and down; promtool lints the exposition; the
//! counters and histograms moved as the scenario says; every query of the Grafana dashboard in
//! the chart returns data; the metric table of docs/operations.md is exactly what `/metrics`
//! exposes. And `/ready` says no until the caches have synced.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use homelab_autoscaler::api::{Group, GroupStatus, Node};
use homelab_harness::e2e::prometheus::{Prometheus, promtool_check_metrics};
use homelab_harness::e2e::{self, AutoscalerSettings, NAMESPACE, World, http_answer};
use homelab_harness::http::ShellyMeter;
use homelab_harness::power_peers::UpsPeer;
use homelab_harness::{Components, ControlPlane, eventually, stays};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// How long Prometheus may take to show what the operator already counts (1 s scrapes).
const SCRAPED: Duration = Duration::from_secs(30);

fn bin() -> std::path::PathBuf {
    e2e::operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler"))).expect("operator binary")
}

/// Waits until `expr` sums to `want` in Prometheus.
async fn expect_value(prometheus: &Prometheus, expr: &str, want: impl Fn(f64) -> bool, what: &str) {
    eventually(&format!("{expr}: {what}"), SCRAPED, || async {
        let value = prometheus.value(expr).await?;
        ensure!(want(value), "{expr} = {value}, want {what}");
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

/// The metric names of docs/operations.md's metric table (its rows start with the name).
fn documented_metrics() -> BTreeSet<String> {
    let path = homelab_harness::repo_path("docs/operations.md");
    let text = std::fs::read_to_string(&path).expect("docs/operations.md");
    let names: BTreeSet<String> = text
        .lines()
        .filter_map(|line| line.strip_prefix("| `homelab_autoscaler_"))
        .filter_map(|rest| rest.split_once('`'))
        .map(|(name, _)| format!("homelab_autoscaler_{name}"))
        .collect();
    assert!(names.len() >= 20, "the metric table lost its rows: {names:?}");
    names
}

/// The `homelab_autoscaler_` families of a Prometheus text exposition with at least one sample,
/// named as their `# TYPE` line names them (counters with `_total`, as the docs write them); a
/// histogram's samples add `_bucket`, `_sum` and `_count`.
fn scraped_families(exposition: &str) -> BTreeSet<String> {
    let declared: BTreeSet<&str> = exposition
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split(' ').next())
        .collect();
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && l.starts_with("homelab_autoscaler_"))
        .map(|line| {
            let sample = line.split(['{', ' ']).next().unwrap_or_default();
            ["", "_bucket", "_sum", "_count", "_created"]
                .iter()
                .filter_map(|suffix| sample.strip_suffix(suffix))
                .find(|name| declared.contains(name))
                .unwrap_or(sample)
                .to_string()
        })
        .collect()
}

/// Two savings steps (a minute each) and room for the group controller's turn.
const ENERGY_STEP: Duration = Duration::from_secs(150);

/// `kubectl get hgroup NAME -o wide` as a person reads it: each header with the text under it
/// (a column runs from its header to the next header).
async fn hgroup_columns(plane: &ControlPlane, group: &str) -> Vec<(String, String)> {
    let out = plane.kubectl(["get", "hgroup", group, "-n", NAMESPACE, "-o", "wide"]).await;
    let out = out.expect("kubectl get hgroup");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = table.lines();
    let (header, row) = (lines.next().unwrap_or_default(), lines.next().unwrap_or_default());
    let starts: Vec<usize> = header
        .char_indices()
        .filter(|(i, c)| !c.is_whitespace() && (*i == 0 || header[..*i].ends_with(' ')))
        .map(|(i, _)| i)
        .collect();
    starts
        .iter()
        .enumerate()
        .map(|(n, &at)| {
            let end = starts.get(n + 1).copied().unwrap_or(header.len().max(row.len()));
            let cell = |line: &str| {
                line.get(at..end.min(line.len())).unwrap_or_default().trim().to_string()
            };
            (cell(header), cell(row))
        })
        .collect()
}

/// Every `expr` of the dashboard's panels, with Grafana's variables as Grafana would fill them
/// for a range that covers the scenario: all groups, a 15-minute rate window, a 1-hour range.
fn dashboard_queries() -> Vec<(String, String)> {
    let path =
        homelab_harness::repo_path("charts/homelab-autoscaler/dashboards/homelab-autoscaler.json");
    let text = std::fs::read_to_string(&path).expect("the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("an expr").to_string();
            let filled = expr
                .replace("$__rate_interval", "15m")
                .replace("$__range", "1h")
                .replace("$group", ".*");
            queries.push((format!("{} / {}", panel["title"], target["refId"]), filled));
        }
    }
    assert!(queries.len() >= 10, "the dashboard lost its panels: {queries:?}");
    queries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_sees_a_cluster_autoscaler_scale_up_and_down_and_every_dashboard_query_has_data()
{
    let mut world = World::start_for_autoscaler(&bin(), false).await.expect("world");
    let _logs = world.plane.logs_on_failure();
    let prometheus = Prometheus::start(&[world.admin_addr(0).unwrap()], world.logs_dir())
        .await
        .expect("Prometheus");

    // A builtin pool without slots: accepted with a warning, said in its conditions, and decided
    // for by the built-in scaler (its metrics). Its UPS, a real upsd on mains, gives the UPS
    // panels their series.
    let ups = UpsPeer::start().await.expect("upsd with dummy-ups");
    let groups: Api<Group> = Api::namespaced(world.client.clone(), NAMESPACE);
    let idle: Group = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
        "metadata": { "name": "idle" },
        "spec": { "driver": "builtin", "ups": { "name": ups.address(), "pollInterval": "2s" } },
    }))
    .unwrap();
    groups.create(&PostParams::default(), &idle).await.expect("create group idle");
    eventually("group idle to say it has no slots", SCRAPED, || async {
        let status: GroupStatus = groups.get("idle").await?.status.unwrap_or_default();
        let condition = status.conditions.iter().find(|c| c.type_ == "HasSlots");
        ensure!(
            condition.is_some_and(|c| c.status == "False" && c.reason == "NoSlots"),
            "conditions: {:?}",
            status.conditions
        );
        Ok(())
    })
    .await
    .expect("the HasSlots condition");

    // A group admission refuses, so the denial counter has a series to compare with the docs.
    let refused: Group = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
        "metadata": { "name": "refused" },
        "spec": { "driver": "builtin", "minSize": 2, "builtin": { "maxNodes": 1 } },
    }))
    .unwrap();
    let denied = groups.create(&PostParams::default(), &refused).await;
    assert!(
        matches!(&denied, Err(kube::Error::Api(e)) if e.message.contains("spec.builtin.maxNodes")),
        "minSize above maxNodes: {denied:?}"
    );

    let ca = world.autoscaler(&AutoscalerSettings::default()).await.expect("cluster-autoscaler");
    if let Err(error) = world.autoscaler_scale_up_and_down(&ca, 3).await {
        panic!(
            "{error:#}\n--- cluster-autoscaler ---\n{}\n--- operator ---\n{}",
            ca.log_tail(60),
            world.operator_log_tail(0, 60)
        );
    }
    drop(ca);

    // The workers (applied by the scenario) now declare their draw and the pool its tariff: the
    // energy report counts from its next step, the pool off at 4 W a machine.
    let watts = json!({ "spec": { "power": { "watts": { "whenOn": 95.0, "whenOff": 4.0 } } } });
    let slots: Api<Node> = Api::namespaced(world.client.clone(), NAMESPACE);
    let workers = slots.list(&ListParams::default().labels("group=workers")).await.expect("slots");
    assert!(!workers.items.is_empty(), "the workers pool has slots");
    let mut metered = Vec::new();
    for slot in workers.items {
        let name = slot.metadata.name.unwrap_or_default();
        slots.patch(&name, &PatchParams::default(), &Patch::Merge(&watts)).await.expect("watts");
        metered.push(name);
    }
    // The first worker's plug also measures it: the operator reads the meter itself.
    let meter = ShellyMeter::start(21.0).await.expect("meter");
    let plug = json!({ "spec": { "power": { "http": { "meter": {
        "request": { "url": format!("{}{}", meter.base, ShellyMeter::STATUS) },
        "wattsPointer": "/apower",
    } } } } });
    slots.patch(&metered[0], &PatchParams::default(), &Patch::Merge(&plug)).await.expect("meter");
    eventually("the meter read into the slot", SCRAPED, || async {
        let draw = slots.get(&metered[0]).await?.status.and_then(|s| s.draw);
        ensure!(draw.as_ref().is_some_and(|d| d.watts == 21.0), "draw {draw:?}");
        Ok(())
    })
    .await
    .expect("the meter read");
    let tariff = json!({ "spec": { "energy": { "pricePerKWh": 0.32, "currency": "EUR" } } });
    groups.patch("workers", &PatchParams::default(), &Patch::Merge(&tariff)).await.expect("tariff");

    // The exposition passes upstream's linter.
    let exposition = world.admin_get(0, "/metrics").await.expect("GET /metrics");
    promtool_check_metrics(&exposition).await.unwrap_or_else(|e| panic!("{e:#}\n{exposition}"));

    // Every metric the docs list is in the scrape (a family is exposed once it has a series,
    // so the scenario produces one of each), and every family scraped is in the docs.
    let (documented, scraped) = (documented_metrics(), scraped_families(&exposition));
    let unscraped: Vec<_> = documented.difference(&scraped).collect();
    let undocumented: Vec<_> = scraped.difference(&documented).collect();
    assert!(
        unscraped.is_empty() && undocumented.is_empty(),
        "docs/operations.md's metric table against /metrics:\n  documented, not exposed: \
         {unscraped:?}\n  exposed, not documented: {undocumented:?}\n{exposition}"
    );

    // The counters and histograms moved as the scenario says: three machines came up on the
    // first attempt and were scaled down, on cluster-autoscaler's calls.
    let p = &prometheus;
    let exactly = |n: f64| move |v: f64| v == n;
    let at_least = |n: f64| move |v: f64| v >= n;
    expect_value(
        p,
        r#"sum(homelab_autoscaler_claim_transitions_total{to="Ready"})"#,
        exactly(3.0),
        "3 claims ready",
    )
    .await;
    expect_value(
        p,
        r#"sum(homelab_autoscaler_claim_transitions_total{from="Ready",to="Completed"})"#,
        exactly(3.0),
        "3 claims released",
    )
    .await;
    expect_value(
        p,
        r#"sum(homelab_autoscaler_claim_boots_total{group="workers",attempt="1"})"#,
        exactly(3.0),
        "3 first-attempt boots",
    )
    .await;
    expect_value(
        p,
        r#"sum(homelab_autoscaler_claim_request_to_ready_seconds_count{group="workers"})"#,
        exactly(3.0),
        "3 request-to-ready observations",
    )
    .await;
    expect_value(
        p,
        r#"sum(homelab_autoscaler_claim_request_to_ready_seconds_sum{group="workers"})"#,
        |v| v > 0.0,
        "a positive total",
    )
    .await;
    for rpc in
        ["NodeGroupIncreaseSize", "NodeGroupDeleteNodes", "Refresh", "NodeGroups", "NodeGroupNodes"]
    {
        let expr =
            format!(r#"sum(homelab_autoscaler_grpc_requests_total{{rpc="{rpc}",code="OK"}})"#);
        expect_value(p, &expr, at_least(1.0), "at least one call").await;
    }
    expect_value(p, r#"sum(homelab_autoscaler_grpc_request_duration_seconds_count{rpc="NodeGroupIncreaseSize"})"#, at_least(1.0), "timed calls").await;
    expect_value(p, r#"sum(homelab_autoscaler_webhook_requests_total{webhook="mutate-nodeclaim",allowed="true"})"#, at_least(3.0), "the claims admitted").await;
    for controller in ["claim", "slot", "group"] {
        let expr = format!(
            r#"sum(homelab_autoscaler_reconciles_total{{controller="{controller}",result="ok"}})"#
        );
        expect_value(p, &expr, at_least(1.0), "reconciles").await;
    }
    expect_value(
        p,
        r#"sum(homelab_autoscaler_claims{group="workers"})"#,
        exactly(0.0),
        "no live claim left",
    )
    .await;
    expect_value(
        p,
        r#"homelab_autoscaler_slots{group="workers",phase="off"}"#,
        exactly(3.0),
        "3 slots off",
    )
    .await;
    expect_value(
        p,
        r#"homelab_autoscaler_slots{group="idle",phase="off"}"#,
        exactly(0.0),
        "no slot",
    )
    .await;
    expect_value(p, "homelab_autoscaler_leader", exactly(1.0), "the one replica leads").await;
    let draw = format!(r#"homelab_autoscaler_slot_draw_watts{{slot="{}"}}"#, metered[0]);
    expect_value(p, &draw, exactly(21.0), "the plug's reading").await;
    expect_value(p, "homelab_autoscaler_caches_synced", exactly(1.0), "synced").await;
    expect_value(
        p,
        r#"homelab_autoscaler_scaler_target{group="idle"}"#,
        exactly(0.0),
        "no machine for an empty pool",
    )
    .await;

    // The savings report counted the machine time the scale-up spent, in the status and metrics.
    let savings = groups.get("workers").await.expect("workers").status.and_then(|s| s.savings);
    let savings = savings.expect("workers has a savings report");
    assert!(savings.machine_hours_on > 0.0 && savings.cost > 0.0, "{savings:?}");
    assert!(savings.always_on_cost >= savings.cost && savings.saved >= 0.0, "{savings:?}");
    // A step is charged at least once a minute: the next counts the watts declared above.
    eventually("the energy report to count the declared watts", ENERGY_STEP, || async {
        let savings = groups.get("workers").await?.status.and_then(|s| s.savings);
        let savings = savings.context("no savings report")?;
        ensure!(
            savings.energy_used_kwh > 0.0
                && savings.energy_cost > 0.0
                && savings.energy_saved_kwh >= 0.0
                && metered.iter().all(|m| !savings.slots_without_watts.contains(m)),
            "{savings:?} (watts declared on {metered:?})"
        );
        Ok(())
    })
    .await
    .expect("the energy report");
    // `kubectl get hgroup -o wide` prints the energy as a person reads it.
    let columns = hgroup_columns(&world.plane, "workers").await;
    let number = |name: &str| -> f64 {
        let value = columns.iter().find(|(c, _)| c == name).map(|(_, v)| v.as_str());
        value.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name}: {columns:?}"))
    };
    assert!(number("KWH-USED") > 0.0, "{columns:?}");
    assert!(number("KWH-SAVED") >= 0.0 && number("ENERGY-SAVED") >= 0.0, "{columns:?}");
    assert!(columns.contains(&("CURRENCY".into(), "EUR".into())), "{columns:?}");
    expect_value(
        p,
        r#"homelab_autoscaler_group_energy_kwh{group="workers",basis="used"}"#,
        |v| v > 0.0,
        "energy used",
    )
    .await;
    expect_value(
        p,
        r#"homelab_autoscaler_group_machine_seconds{group="workers",power="on"}"#,
        |v| v > 0.0,
        "machine time on",
    )
    .await;

    // Every query of the dashboard returns data.
    for (panel, expr) in dashboard_queries() {
        eventually(&format!("dashboard panel {panel}: {expr}"), SCRAPED, || async {
            let samples = p.query(&expr).await?;
            ensure!(samples.iter().any(|s| s.value.is_finite()), "no finite value: {samples:?}");
            Ok(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n--- Prometheus ---\n{}", p.log_tail(20)));
    }
}

/// `/ready` answers 503 while the provider's caches cannot sync (here: the CRDs are not
/// installed yet), `/live` and `/metrics` answer all along, and `/ready` turns 200 once the CRDs
/// arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_waits_for_the_caches() {
    let plane = ControlPlane::start(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let dir = tempfile::tempdir().unwrap();
    homelab_autoscaler::tls::issue_self_signed(
        &["localhost".into()],
        &["127.0.0.1".parse().unwrap()],
    )
    .unwrap()
    .write_secret_layout(dir.path())
    .unwrap();
    let port = |()| homelab_harness::ports::free_port().unwrap();
    let (admin, webhook) = (port(()), port(()));
    let admin = format!("127.0.0.1:{admin}");
    let log = dir.path().join("operator.log");
    let _operator = tokio::process::Command::new(bin())
        .args([
            "run",
            "--namespace=default",
            &format!("--admin-addr={admin}"),
            &format!("--webhook-addr=127.0.0.1:{webhook}"),
            &format!("--webhook-cert-dir={}", dir.path().display()),
            "--log-format=json",
            "--log-level=info",
        ])
        .env("KUBECONFIG", plane.kubeconfig_path())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("start the operator");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    eventually("/live to answer", Duration::from_secs(60), || async {
        let (code, _) = http_answer(&admin, "/live").await?;
        ensure!(code == 200, "/live: {code}");
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", log_text()));
    // Not ready, and it stays so: a cache syncs in well under a second when it can.
    stays("/ready to answer 503 before the CRDs exist", Duration::from_secs(3), || async {
        let (code, body) = http_answer(&admin, "/ready").await?;
        ensure!(code == 503, "/ready: {code} {body}");
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", log_text()));
    let (code, metrics) = http_answer(&admin, "/metrics").await.unwrap();
    assert_eq!(code, 200);
    assert!(metrics.contains("homelab_autoscaler_caches_synced 0"), "{metrics}");

    plane.install_crds().await.expect("install the CRDs");
    eventually("/ready once the caches sync", Duration::from_secs(120), || async {
        let (code, body) = http_answer(&admin, "/ready").await?;
        ensure!(code == 200, "/ready: {code} {body}");
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", log_text()));
    let (_, metrics) = http_answer(&admin, "/metrics").await.unwrap();
    assert!(metrics.contains("homelab_autoscaler_caches_synced 1"), "{metrics}");
    // --log-format=json: every line the operator wrote is a JSON object.
    let text = log_text();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "the operator logged nothing");
    for line in lines {
        serde_json::from_str::<serde_json::Value>(line).with_context(|| line.to_string()).unwrap();
    }
}

/// The chart ships the dashboard as a ConfigMap the Grafana sidecar finds by its label, holding
/// exactly the JSON the Prometheus test above ran; disabled (the default), it renders nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_ships_the_dashboard_for_the_grafana_sidecar() {
    let helm = homelab_harness::binaries::binaries(homelab_harness::binaries::Profile::E2e)
        .await
        .expect("helm")
        .path("helm");
    let chart = homelab_harness::repo_path("charts/homelab-autoscaler");
    let home = tempfile::tempdir().unwrap();
    let render = |extra: &[&str]| {
        let mut args =
            vec!["template", "hla", chart.to_str().unwrap(), "--set", "tls.mode=selfManaged"];
        args.extend_from_slice(extra);
        let out = std::process::Command::new(&helm)
            .args(&args)
            .env("HOME", home.path())
            .output()
            .expect("run helm");
        assert!(out.status.success(), "helm {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(!render(&[]).contains("grafana_dashboard"), "the dashboard is off by default");
    let rendered = render(&[
        "--set",
        "dashboard.enabled=true",
        "--set",
        "dashboard.annotations.grafana_folder=homelab",
        "--show-only",
        "templates/dashboard.yaml",
    ]);
    let objects = homelab_harness::install::documents(&rendered).await.expect("kubectl reads it");
    let map: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(objects[0].clone()).expect("a ConfigMap");
    let labels = map.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("grafana_dashboard").map(String::as_str), Some("1"), "{rendered}");
    let annotations = map.metadata.annotations.unwrap_or_default();
    assert_eq!(annotations.get("grafana_folder").map(String::as_str), Some("homelab"));
    let shipped = map.data.unwrap_or_default().remove("homelab-autoscaler.json").expect("the JSON");
    let file = std::fs::read_to_string(chart.join("dashboards/homelab-autoscaler.json")).unwrap();
    let parse = |text: &str| serde_json::from_str::<serde_json::Value>(text).expect("JSON");
    assert_eq!(parse(&shipped), parse(&file));
}
