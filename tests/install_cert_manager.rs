//! The chart's cert-manager mode against the real cert-manager (controller and cainjector as
//! processes) on a control plane of its own: the chart installed with `helm install`, then each
//! live webhook's Service clientConfig pointed at the operator on loopback (as the e2e World
//! does); cert-manager issues the webhook's, the gRPC server's and cluster-autoscaler's client
//! certificates from the chart's CA, and cainjector fills both caBundles. The operator runs with
//! the installed Deployment's arguments (listen addresses on loopback, the Secret mounts where
//! the test writes them the way the kubelet mounts them), as the chart's ServiceAccount, and
//! - admission answers through the injected CA (a slot with `spec.powerState` is refused with our
//!   message);
//! - a renewal is served without a restart while kubectl keeps working;
//! - the real cluster-autoscaler dials the provider with the issued client certificate, and a
//!   client without one is refused;
//! - the chart's cluster-autoscaler Deployment is stamped with that certificate, and
//!   cert-manager's renewal of it restamps the Deployment (a rollout: cluster-autoscaler reads
//!   its certificate only when it starts);
//! - a pool goes 0 -> 1 -> 0 by hand (a `Manual` NodeClaim applied, then deleted, with kubectl),
//!   each state read from `kubectl get slot`'s printed columns.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use homelab_autoscaler::operator::autoscaler_restart::certificate_digest;
use homelab_harness::cert_manager::{CertManager, ISSUE_TIMEOUT};
use homelab_harness::e2e::{Autoscaler, AutoscalerSettings, GrpcEndpoint};
use homelab_harness::install::{
    Operator, apply_repo_file, certificate_stamp, deployment_args, first_certificate, free_port,
    helm_install, issued_secret, mount_secret, on_loopback, point_webhooks_at, pool,
    refused_with_our_message, served_certificate, service_account_kubeconfig,
    slot_with_power_state, without_client_certificate,
};
use homelab_harness::{Components, ControlPlane, eventually};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams};

const NS: &str = "homelab-cm";
const AUTOSCALER: &str = "homelab-autoscaler-cluster-autoscaler";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cert_manager_issues_injects_and_renews_and_cluster_autoscaler_dials_with_its_client_certificate()
 {
    let started = Instant::now();
    let bin = Path::new(env!("CARGO_BIN_EXE_homelab-autoscaler"));
    let plane = ControlPlane::start(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let cert_manager = CertManager::start(&plane).await.expect("cert-manager");
    let client = plane.client().expect("client");
    let out = plane.kubectl(["create", "namespace", NS]).await.expect("kubectl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // The chart as a user installs it, `localhost` on the certificates (the name the apiserver
    // and cluster-autoscaler dial here); then, before anything it admits is created, the live
    // webhooks pointed at the operator's loopback port.
    let (webhook_port, grpc_port) = (free_port().expect("port"), free_port().expect("port"));
    helm_install(
        &plane,
        NS,
        &[
            "tls.mode=certManager",
            "tls.certManager.webhookDnsNames={localhost}",
            "tls.certManager.grpcDnsNames={localhost}",
            "clusterAutoscaler.enabled=true",
        ],
    )
    .await
    .expect("helm install");
    point_webhooks_at(&client, &format!("https://localhost:{webhook_port}"))
        .await
        .expect("point the webhooks at loopback");

    let webhook = issued_secret(&client, NS, "homelab-autoscaler-webhook-tls")
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", cert_manager.log_tails(40)));
    let grpc = issued_secret(&client, NS, "homelab-autoscaler-grpc-tls").await.expect("gRPC cert");
    let grpc_client = issued_secret(&client, NS, "homelab-autoscaler-grpc-client-tls")
        .await
        .expect("client cert");
    let data = |s: &Secret| s.data.clone().unwrap_or_default();
    let ca = data(&webhook)["ca.crt"].0.clone();
    assert_eq!(data(&grpc)["ca.crt"].0, ca, "one chart CA signs everything");
    assert_eq!(data(&grpc_client)["ca.crt"].0, ca, "one chart CA signs everything");
    let issued = started.elapsed();

    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    eventually("cainjector to fill both caBundles", ISSUE_TIMEOUT, || async {
        let m = mutating.get("homelab-autoscaler").await?;
        let v = validating.get("homelab-autoscaler").await?;
        let bundles: Vec<_> = m
            .webhooks
            .iter()
            .flatten()
            .map(|w| w.client_config.ca_bundle.clone())
            .chain(v.webhooks.iter().flatten().map(|w| w.client_config.ca_bundle.clone()))
            .collect();
        // One caBundle per webhook the code configures.
        let webhooks = homelab_autoscaler::webhook::configuration::POLICIES.len();
        anyhow::ensure!(
            bundles.len() == webhooks,
            "expected {webhooks} webhooks, found {}",
            bundles.len()
        );
        anyhow::ensure!(
            bundles.iter().all(|b| b.as_ref().is_some_and(|b| b.0 == ca)),
            "not injected yet"
        );
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", cert_manager.log_tails(40)));

    // The operator, with the Secrets mounted as the kubelet would.
    let mounts = tempfile::tempdir().expect("tempdir");
    let (webhook_dir, grpc_dir, client_dir) =
        (mounts.path().join("webhook"), mounts.path().join("grpc"), mounts.path().join("client"));
    mount_secret(&webhook_dir, &data(&webhook)).expect("mount");
    mount_secret(&grpc_dir, &data(&grpc)).expect("mount");
    mount_secret(&client_dir, &data(&grpc_client)).expect("mount");
    // The installed Deployment's arguments, on loopback, as the chart's ServiceAccount; Secrets
    // re-read every second so the renewal below is quick.
    let installed = deployment_args(&client, NS).await.expect("the Deployment's args");
    let mut args = on_loopback(
        &installed,
        &[
            ("--webhook-addr", format!("127.0.0.1:{webhook_port}")),
            ("--webhook-cert-dir", webhook_dir.display().to_string()),
            ("--grpc-addr", format!("127.0.0.1:{grpc_port}")),
            ("--grpc-cert-dir", grpc_dir.display().to_string()),
        ],
    )
    .expect("the Deployment's args on loopback");
    assert!(
        args.contains(&format!("--cluster-autoscaler-deployment={AUTOSCALER}"))
            && args.contains(&"--grpc-client-secret=homelab-autoscaler-grpc-client-tls".into()),
        "the chart wires cluster-autoscaler's certificate: {args:?}"
    );
    args.push("--tls-reload-interval=1s".into());
    let kubeconfig = mounts.path().join("service-account.kubeconfig");
    service_account_kubeconfig(&plane, NS, "homelab-autoscaler", &kubeconfig)
        .await
        .expect("a kubeconfig of the chart's ServiceAccount");
    let mut operator =
        Operator::start(bin, &kubeconfig, &args, &mounts.path().join("operator.log"))
            .await
            .expect("operator");

    let slot = mounts.path().join("slot.yaml");
    std::fs::write(&slot, slot_with_power_state(NS)).expect("write slot");
    refused_with_our_message(&plane, &slot).await.unwrap_or_else(|e| {
        panic!("admission through the injected CA: {e}\n{}", operator.log_tail(30))
    });

    // A renewal: cert-manager re-issues when its Secret goes; the new Secret is mounted, and the
    // operator serves it without a restart while kubectl runs on.
    let before = data(&webhook)["tls.crt"].0.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let kubectl_loop = {
        let stop = stop.clone();
        let plane = &plane;
        let slot = slot.clone();
        async move {
            let mut outcomes = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                outcomes.push(refused_with_our_message(plane, &slot).await);
            }
            outcomes
        }
    };
    let renewal = async {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
        secrets
            .delete("homelab-autoscaler-webhook-tls", &DeleteParams::default())
            .await
            .expect("delete the webhook Secret");
        let renewed = eventually("cert-manager to re-issue", ISSUE_TIMEOUT, || async {
            let s = secrets.get_opt("homelab-autoscaler-webhook-tls").await?;
            let s = s.ok_or_else(|| anyhow::anyhow!("not yet"))?;
            let crt = data(&s).get("tls.crt").map(|c| c.0.clone()).unwrap_or_default();
            anyhow::ensure!(!crt.is_empty() && crt != before, "not re-issued yet");
            Ok(s)
        })
        .await
        .expect("re-issued");
        let renewed_at = Instant::now();
        mount_secret(&webhook_dir, &data(&renewed)).expect("mount the renewal");
        let new_leaf = first_certificate(&data(&renewed)["tls.crt"].0).expect("leaf");
        eventually(
            "the operator to serve the renewed certificate",
            Duration::from_secs(30),
            || async {
                let served = served_certificate(webhook_port, &ca, "localhost").await?;
                anyhow::ensure!(served == new_leaf, "still the old certificate");
                Ok(())
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", operator.log_tail(30)));
        // A few more admissions on the new certificate.
        tokio::time::timeout(Duration::from_secs(60), async {
            while refused_with_our_message(&plane, &slot).await.is_err() {}
        })
        .await
        .expect("admission on the new certificate");
        stop.store(true, Ordering::Relaxed);
        renewed_at.elapsed()
    };
    let (outcomes, reload_took) = tokio::join!(kubectl_loop, renewal);
    let failures: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert!(!outcomes.is_empty(), "kubectl ran during the renewal");
    assert!(failures.is_empty(), "kubectl failed during the renewal: {failures:#?}");
    assert!(operator.child.try_wait().expect("wait").is_none(), "the operator was not restarted");
    eprintln!(
        "issued in {issued:.1?} from start; renewal served {reload_took:.1?} after the new Secret \
         was mounted; {} kubectl calls during the renewal, all answered by admission",
        outcomes.len()
    );

    // gRPC: cluster-autoscaler dials with the issued client certificate, the provider answers
    // (the pool shows in CA's status); a client without a certificate is refused.
    apply_repo_file(&plane, NS, "examples/pool-cluster-autoscaler.yaml").await.expect("the pool");
    let ca_dir = mounts.path().join("cluster-autoscaler");
    let autoscaler = Autoscaler::start(
        plane.kubeconfig_path(),
        &GrpcEndpoint { port: grpc_port, cert_dir: client_dir.clone() },
        &ca_dir,
        &AutoscalerSettings::default(),
    )
    .await
    .expect("cluster-autoscaler");
    eventually(
        "cluster-autoscaler to list the pool through the provider",
        Duration::from_secs(90),
        || async {
            let status = Autoscaler::status(&client).await?;
            anyhow::ensure!(status.group("workers").is_some(), "workers not in CA's status yet");
            Ok(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}\n{}", autoscaler.log_tail(30), operator.log_tail(30)));

    let refused = without_client_certificate(grpc_port, &ca).await;
    assert!(
        refused.as_ref().is_err_and(|e| !e.starts_with("no answer")),
        "a client without a certificate was not refused: {refused:?}"
    );
    drop(autoscaler);

    // cluster-autoscaler reads its certificate only at start: the chart's Deployment is stamped
    // with the one it mounts, and cert-manager's renewal (forced: the Secret deleted) restamps it.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let stamp = || certificate_stamp(&deployments, AUTOSCALER);
    let first = certificate_digest(&data(&grpc_client)).expect("digest");
    eventually(
        "the Deployment stamped with the client certificate",
        Duration::from_secs(30),
        || async {
            let stamped = stamp().await?;
            anyhow::ensure!(stamped.as_deref() == Some(first.as_str()), "stamped {stamped:?}");
            Ok(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", operator.log_tail(30)));
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    secrets
        .delete("homelab-autoscaler-grpc-client-tls", &DeleteParams::default())
        .await
        .expect("delete the client certificate");
    eventually("cert-manager's renewal stamped into the Deployment", ISSUE_TIMEOUT, || async {
        let stamped = stamp().await?;
        anyhow::ensure!(
            stamped.is_some() && stamped.as_deref() != Some(first.as_str()),
            "stamped {stamped:?}"
        );
        let renewed = secrets.get("homelab-autoscaler-grpc-client-tls").await?;
        anyhow::ensure!(
            stamped == certificate_digest(&data(&renewed)),
            "not the renewed certificate"
        );
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}\n{}", operator.log_tail(30), cert_manager.log_tails(20)));

    // A pool 0 -> 1 -> 0 by hand, read from `kubectl get slot` (cluster-autoscaler is gone, so
    // nothing else claims a machine): the power Jobs run on a kwok lab node, the simulator plays
    // the machine.
    let _simulator = pool::start_machines(&plane, bin, NS, &mounts.path().join("simulator.log"))
        .await
        .expect("the lab's machines");
    let timings = pool::zero_one_zero(&plane, NS, mounts.path())
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", operator.log_tail(40)));
    eprintln!("the pool by hand through `kubectl get slot`: {timings:?}");
    cert_manager.ensure_running().expect("cert-manager kept running");
}
