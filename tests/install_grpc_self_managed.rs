//! The chart's self-managed mode for the gRPC provider, installed with `helm install`, with two
//! replicas (the chart's default) running with the installed Deployment's arguments (on
//! loopback) as the chart's ServiceAccount (a TokenRequest token, never admin) on a control plane
//! of their own, and the real cluster-autoscaler:
//! - both replicas serve gRPC certificates of their own, signed by the one shared CA;
//! - exactly one of them issues cluster-autoscaler's client certificate into one Secret;
//! - cluster-autoscaler dials through a stand-in Service with that certificate and lists the
//!   pool; a client without a certificate is refused; one replica dying changes nothing;
//! - the client certificate re-issued (here: its Secret deleted) is stamped into the chart's
//!   cluster-autoscaler Deployment, which restarts it on the new certificate.

use std::path::Path;
use std::time::Duration;

use homelab_autoscaler::operator::autoscaler_restart::certificate_digest;
use homelab_harness::e2e::{Autoscaler, AutoscalerSettings, GrpcEndpoint};
use homelab_harness::install::{
    Operator, ServiceProxy, apply_repo_file, certificate_stamp, count_in_logs, deployment_args,
    free_port, helm_install, mount_secret, point_webhooks_at, replica_on_loopback,
    served_certificate, service_account_kubeconfig, without_client_certificate,
};
use homelab_harness::{Components, ControlPlane, eventually};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams};

const NS: &str = "homelab-grpc";
const CLIENT_SECRET: &str = "homelab-autoscaler-grpc-client";
const AUTOSCALER: &str = "homelab-autoscaler-cluster-autoscaler";

type Data = std::collections::BTreeMap<String, ByteString>;

fn data(secret: &Secret) -> Data {
    secret.data.clone().unwrap_or_default()
}

/// The digest stamped into the cluster-autoscaler Deployment's pod template, once it is `want`.
async fn stamped(deployments: &Api<Deployment>, want: &str) -> anyhow::Result<()> {
    eventually("the Deployment stamped with the certificate", Duration::from_secs(30), || async {
        let stamp = certificate_stamp(deployments, AUTOSCALER).await?;
        anyhow::ensure!(stamp.as_deref() == Some(want), "stamped {stamp:?}, want {want}");
        Ok(())
    })
    .await
}

/// cluster-autoscaler lists the pool through the provider (its status ConfigMap shows it; the
/// map is deleted first, so what is read was written by this run).
async fn lists_the_pool(client: &kube::Client, autoscaler: &Autoscaler, replica: &Operator) {
    eventually(
        "cluster-autoscaler to list the pool through the provider",
        Duration::from_secs(90),
        || async {
            let status = Autoscaler::status(client).await?;
            anyhow::ensure!(status.group("workers").is_some(), "workers not in CA's status yet");
            Ok(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}\n{}", autoscaler.log_tail(30), replica.log_tail(30)));
}

async fn forget_status(client: &kube::Client) {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let _ = maps.delete("cluster-autoscaler-status", &DeleteParams::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_serve_grpc_from_the_shared_ca_and_keep_cluster_autoscaler_on_a_current_client_certificate()
 {
    let bin = Path::new(env!("CARGO_BIN_EXE_homelab-autoscaler"));
    let plane = ControlPlane::start(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let client = plane.client().expect("client");
    let out = plane.kubectl(["create", "namespace", NS]).await.expect("kubectl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let webhook_ports = [free_port().expect("port"), free_port().expect("port")];
    let grpc_ports = [free_port().expect("port"), free_port().expect("port")];
    let webhooks = ServiceProxy::start(webhook_ports.to_vec()).await.expect("proxy");
    let grpc = ServiceProxy::start(grpc_ports.to_vec()).await.expect("proxy");
    helm_install(&plane, NS, &["tls.mode=selfManaged", "clusterAutoscaler.enabled=true"])
        .await
        .expect("helm install");
    point_webhooks_at(&client, &format!("https://localhost:{}", webhooks.port))
        .await
        .expect("point the webhooks at the stand-in Service");
    let installed = deployment_args(&client, NS).await.expect("the Deployment's args");

    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("service-account.kubeconfig");
    service_account_kubeconfig(&plane, NS, "homelab-autoscaler", &kubeconfig)
        .await
        .expect("a kubeconfig of the chart's ServiceAccount");
    // The Deployment's arguments, on loopback (`localhost` the Services' name here).
    let (mut a, b) = Operator::start_two(bin, &kubeconfig, dir.path(), |i| {
        let mut args = replica_on_loopback(&installed, webhook_ports[i], grpc_ports[i])
            .expect("the Deployment's args on loopback");
        assert!(
            args.contains(&"--grpc-self-managed-tls".to_string())
                && args.contains(&format!("--grpc-client-secret={CLIENT_SECRET}"))
                && args.contains(&format!("--cluster-autoscaler-deployment={AUTOSCALER}")),
            "the chart's self-managed gRPC wiring: {args:?}"
        );
        args.push("--tls-reload-interval=1s".into());
        args
    })
    .await
    .expect("two replicas");
    let logs = [a.log.clone(), b.log.clone()];
    let issued = count_in_logs(&logs, "issued the cluster-autoscaler client certificate");
    assert_eq!(issued, 1, "exactly one replica issued the client certificate");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let ca = data(&secrets.get("homelab-autoscaler-ca").await.expect("the shared CA"));
    let ca_cert = ca["tls.crt"].0.clone();
    let client_cert = data(&secrets.get(CLIENT_SECRET).await.expect("the client certificate"));
    assert_eq!(client_cert["ca.crt"], ca["ca.crt"], "cluster-autoscaler trusts the CA bundle");
    let leaves = [
        served_certificate(grpc_ports[0], &ca_cert, "localhost").await.expect("replica 0 verifies"),
        served_certificate(grpc_ports[1], &ca_cert, "localhost").await.expect("replica 1 verifies"),
    ];
    assert_ne!(leaves[0], leaves[1], "each replica serves a certificate of its own");

    // The Deployment is stamped with the certificate its pods mount: a change restarts them.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let first = certificate_digest(&client_cert).expect("digest");
    stamped(&deployments, &first).await.expect("stamped");

    // The real cluster-autoscaler, through the stand-in Service, with the issued certificate.
    apply_repo_file(&plane, NS, "examples/pool-cluster-autoscaler.yaml").await.expect("the pool");
    let mount = dir.path().join("grpc-client");
    mount_secret(&mount, &client_cert).expect("mount");
    let mut autoscaler = Autoscaler::start(
        plane.kubeconfig_path(),
        &GrpcEndpoint { port: grpc.port, cert_dir: mount.clone() },
        &dir.path().join("cluster-autoscaler"),
        &AutoscalerSettings::default(),
    )
    .await
    .expect("cluster-autoscaler");
    lists_the_pool(&client, &autoscaler, &a).await;
    for port in grpc_ports {
        let refused = without_client_certificate(port, &ca["ca.crt"].0).await;
        assert!(
            refused.as_ref().is_err_and(|e| !e.starts_with("no answer")),
            "a client without a certificate was not refused on {port}: {refused:?}"
        );
    }

    // One replica dies; cluster-autoscaler, restarted, reaches the other through the Service.
    a.child.kill().await.expect("kill replica 0");
    forget_status(&client).await;
    autoscaler.restart().await.expect("restart cluster-autoscaler");
    lists_the_pool(&client, &autoscaler, &b).await;

    // The client certificate re-issued (its Secret lost): the survivor issues a new one and
    // stamps the Deployment, whose restarted pod mounts it and is served.
    secrets.delete(CLIENT_SECRET, &DeleteParams::default()).await.expect("delete");
    let renewed = eventually("a new client certificate", Duration::from_secs(30), || async {
        let renewed = data(&secrets.get(CLIENT_SECRET).await?);
        anyhow::ensure!(renewed["tls.crt"] != client_cert["tls.crt"], "not re-issued yet");
        Ok(renewed)
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", b.log_tail(30)));
    let second = certificate_digest(&renewed).expect("digest");
    assert_ne!(second, first);
    stamped(&deployments, &second).await.unwrap_or_else(|e| panic!("{e:#}\n{}", b.log_tail(30)));
    mount_secret(&mount, &renewed).expect("mount the renewed certificate");
    forget_status(&client).await;
    autoscaler.restart().await.expect("restart cluster-autoscaler");
    lists_the_pool(&client, &autoscaler, &b).await;
    drop((webhooks, grpc));
}
