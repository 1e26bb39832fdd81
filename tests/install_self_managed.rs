//! The chart's self-managed TLS mode with two replicas, the chart's default, on a control plane
//! of its own: the chart installed with `helm install`, both replicas started at once with the
//! installed Deployment's arguments (on loopback) as the chart's ServiceAccount, racing to create
//! the CA; one Secret holds it, each serves its own certificate signed by it, and the caBundle is
//! that CA. A loopback proxy stands in for the webhook Service in front of both (the live
//! webhooks are patched to it), so the apiserver reaches either; kubectl keeps being answered by
//! admission while the CA rotates (short lifetimes), a pool goes 0 -> 1 -> 0 by hand as
//! `kubectl get slot` prints it, and one replica is killed.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use homelab_harness::install::{
    Operator, ServiceProxy, count_in_logs, deployment_args, first_certificate, free_port,
    helm_install, on_loopback, point_webhooks_at, pool, refused_with_our_message,
    replica_on_loopback, served_certificate, service_account_kubeconfig, slot_with_power_state,
};
use homelab_harness::{Components, ControlPlane, eventually};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

const NS: &str = "homelab-ha";
/// The CA's lifetime: short, so that it rotates during the test, two thirds in (40 s); the third
/// left (20 s) is for both replicas to pick the new CA up, with room for a loaded machine.
const CA_LIFETIME: Duration = Duration::from_secs(60);
/// The serving certificates' lifetime: re-issued two thirds in, the 10 s left are ten reload
/// intervals for the new one to be served before the old one expires under a kubectl call.
const CERT_LIFETIME: Duration = Duration::from_secs(30);
/// How often each replica re-reads its certificate and checks what is due.
const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

fn secret_field(secret: &Secret, key: &str) -> Vec<u8> {
    secret.data.as_ref().and_then(|d| d.get(key)).map(|v| v.0.clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_ca_rotate_it_and_survive_one_of_them_dying() {
    let bin = Path::new(env!("CARGO_BIN_EXE_homelab-autoscaler"));
    let plane = ControlPlane::start(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let client = plane.client().expect("client");
    let out = plane.kubectl(["create", "namespace", NS]).await.expect("kubectl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let ports = [free_port().expect("port"), free_port().expect("port")];
    let grpc_ports = [free_port().expect("port"), free_port().expect("port")];
    let service = ServiceProxy::start(ports.to_vec()).await.expect("proxy");
    helm_install(&plane, NS, &["tls.mode=selfManaged"]).await.expect("helm install");
    point_webhooks_at(&client, &format!("https://localhost:{}", service.port))
        .await
        .expect("point the webhooks at the stand-in Service");
    let installed = deployment_args(&client, NS).await.expect("the Deployment's args");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("service-account.kubeconfig");
    service_account_kubeconfig(&plane, NS, "homelab-autoscaler", &kubeconfig)
        .await
        .expect("a kubeconfig of the chart's ServiceAccount");

    // Both at once, racing to create the CA, each with the Deployment's arguments on loopback
    // (`localhost` the Service's name here). The CA's lifetime is short so that it rotates during
    // the test (see the constants for the values).
    let (mut a, b) = Operator::start_two(bin, &kubeconfig, dir.path(), |i| {
        let mut args = replica_on_loopback(&installed, ports[i], grpc_ports[i])
            .expect("the Deployment's args on loopback");
        args.extend([
            format!("--ca-lifetime={}s", CA_LIFETIME.as_secs()),
            format!("--webhook-cert-lifetime={}s", CERT_LIFETIME.as_secs()),
            format!("--tls-reload-interval={}s", RELOAD_INTERVAL.as_secs()),
        ]);
        args
    })
    .await
    .expect("two replicas");
    let logs = [a.log.clone(), b.log.clone()];
    let created = count_in_logs(&logs, "created the shared CA");
    assert_eq!(created, 1, "exactly one replica created the CA; the other read the winner's");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let ca_secret = secrets.get("homelab-autoscaler-ca").await.expect("the one CA Secret");
    let first_ca = secret_field(&ca_secret, "tls.crt");
    let bundle = secret_field(&ca_secret, "ca.crt");
    let leaves = [
        served_certificate(ports[0], &first_ca, "localhost").await.expect("replica 0 verifies"),
        served_certificate(ports[1], &first_ca, "localhost").await.expect("replica 1 verifies"),
    ];
    assert_ne!(leaves[0], leaves[1], "each replica serves a certificate of its own");
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    eventually("the caBundle to be the shared CA", Duration::from_secs(30), || async {
        let config = validating.get("homelab-autoscaler").await?;
        let ok = config
            .webhooks
            .iter()
            .flatten()
            .all(|w| w.client_config.ca_bundle.as_ref().is_some_and(|b| b.0 == bundle));
        anyhow::ensure!(ok, "not patched yet");
        Ok(())
    })
    .await
    .expect("caBundle");

    // Through the stand-in Service, across the CA's rotation: every call answered by admission.
    let slot = dir.path().join("slot.yaml");
    std::fs::write(&slot, slot_with_power_state(NS)).expect("write");
    let started = Instant::now();
    let calls = AtomicUsize::new(0);
    let rotated =
        eventually("the CA rotated and served by both replicas", CA_LIFETIME * 2, || async {
            // Every call on the way is answered by admission, whichever CA signs the replica's cert.
            let call = calls.fetch_add(1, Ordering::Relaxed);
            refused_with_our_message(&plane, &slot).await.unwrap_or_else(|e| {
                panic!("call {call} failed: {e}\n{}\n{}", a.log_tail(20), b.log_tail(20))
            });
            let now = secrets.get("homelab-autoscaler-ca").await?;
            let ca = secret_field(&now, "tls.crt");
            anyhow::ensure!(ca != first_ca, "the CA has not rotated yet");
            // Rotated, and both replicas serve certificates of the new CA.
            for port in ports {
                served_certificate(port, &ca, "localhost").await.map_err(|e| {
                    anyhow::anyhow!("the replica on port {port} serves the old CA: {e}")
                })?;
            }
            Ok(now)
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", a.log_tail(30)));
    let calls = calls.into_inner();
    let new_bundle = secret_field(&rotated, "ca.crt");
    assert!(
        new_bundle.windows(first_ca.len()).any(|w| w == first_ca.as_slice()),
        "the old CA stays trusted beside the new one until it expires"
    );
    assert_ne!(
        first_certificate(&new_bundle).expect("pem"),
        first_certificate(&first_ca).expect("pem")
    );
    eprintln!(
        "CA rotated after {:.1?}; {calls} kubectl calls through both replicas, all answered",
        started.elapsed()
    );

    // A pool 0 -> 1 -> 0 by hand, read from `kubectl get slot`: the power Jobs run on a kwok
    // lab node, the simulator plays the machine.
    let _simulator = pool::start_machines(&plane, bin, NS, &dir.path().join("simulator.log"))
        .await
        .expect("the lab's machines");
    let timings = pool::zero_one_zero(&plane, NS, dir.path())
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}\n{}", a.log_tail(30), b.log_tail(30)));
    eprintln!("the pool by hand through `kubectl get slot`: {timings:?}");

    // One replica dies; the Service (proxy) routes to the other and nothing changes for kubectl.
    a.child.kill().await.expect("kill replica 0");
    for call in 0..6 {
        refused_with_our_message(&plane, &slot)
            .await
            .unwrap_or_else(|e| panic!("call {call} after the kill: {e}\n{}", b.log_tail(20)));
    }
    drop(service);
}

/// The `secrets` mode: the user's own Secret, mounted; the operator patches its `ca.crt` into the
/// caBundle (no cainjector), and follows the user's rotation to a new CA without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_own_secret_is_served_and_its_ca_patched_and_followed_on_rotation() {
    use homelab_harness::install::mount_secret;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    const OWN_NS: &str = "homelab-own";
    let bin = Path::new(env!("CARGO_BIN_EXE_homelab-autoscaler"));
    let plane = ControlPlane::start(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let client = plane.client().expect("client");
    let out = plane.kubectl(["create", "namespace", OWN_NS]).await.expect("kubectl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (port, grpc_port) = (free_port().expect("port"), free_port().expect("port"));
    helm_install(&plane, OWN_NS, &["tls.mode=secrets", "tls.secrets.webhook=own-tls"])
        .await
        .expect("helm install");
    point_webhooks_at(&client, &format!("https://localhost:{port}"))
        .await
        .expect("point the webhooks at loopback");
    let installed = deployment_args(&client, OWN_NS).await.expect("the Deployment's args");
    assert!(
        installed.contains(&"--webhook-patch-ca-bundle".to_string()),
        "the chart has the operator patch the user's CA in: {installed:?}"
    );

    let as_data = |bundle: &homelab_autoscaler::tls::SelfSignedBundle| {
        BTreeMap::from([
            ("tls.crt".to_string(), ByteString(bundle.cert_pem.clone().into_bytes())),
            ("tls.key".to_string(), ByteString(bundle.key_pem.clone().into_bytes())),
            ("ca.crt".to_string(), ByteString(bundle.ca_pem.clone().into_bytes())),
        ])
    };
    let own = homelab_autoscaler::tls::issue_self_signed(&["localhost".into()], &[]).expect("own");
    let dir = tempfile::tempdir().expect("tempdir");
    let mount = dir.path().join("webhook-tls");
    mount_secret(&mount, &as_data(&own)).expect("mount");
    let mut args = on_loopback(
        &installed,
        &[
            ("--webhook-addr", format!("127.0.0.1:{port}")),
            ("--webhook-cert-dir", mount.display().to_string()),
            ("--grpc-addr", format!("127.0.0.1:{grpc_port}")),
        ],
    )
    .expect("the Deployment's args on loopback");
    args.push(format!("--tls-reload-interval={}s", RELOAD_INTERVAL.as_secs()));
    let kubeconfig = dir.path().join("service-account.kubeconfig");
    service_account_kubeconfig(&plane, OWN_NS, "homelab-autoscaler", &kubeconfig)
        .await
        .expect("a kubeconfig of the chart's ServiceAccount");
    let operator = Operator::start(bin, &kubeconfig, &args, &dir.path().join("operator.log"))
        .await
        .expect("operator");

    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let bundle_is = |ca: String| {
        let validating = validating.clone();
        async move {
            eventually(
                "the caBundle to be the Secret's ca.crt",
                Duration::from_secs(30),
                || async {
                    let config = validating.get("homelab-autoscaler").await?;
                    let ok = config.webhooks.iter().flatten().all(|w| {
                        w.client_config.ca_bundle.as_ref().is_some_and(|b| b.0 == ca.as_bytes())
                    });
                    anyhow::ensure!(ok, "not yet");
                    Ok(())
                },
            )
            .await
        }
    };
    bundle_is(own.ca_pem.clone())
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", operator.log_tail(20)));
    let slot = dir.path().join("slot.yaml");
    std::fs::write(&slot, slot_with_power_state(NS).replace(NS, OWN_NS)).expect("write");
    refused_with_our_message(&plane, &slot).await.expect("admission through the user's CA");

    // The user rotates to a certificate of a new CA: the bundle follows, then the certificate.
    let rotated =
        homelab_autoscaler::tls::issue_self_signed(&["localhost".into()], &[]).expect("new");
    mount_secret(&mount, &as_data(&rotated)).expect("mount the rotation");
    bundle_is(rotated.ca_pem.clone()).await.expect("the new CA patched");
    eventually("the new certificate served", Duration::from_secs(30), || async {
        served_certificate(port, rotated.ca_pem.as_bytes(), "localhost").await.map(|_| ())
    })
    .await
    .expect("served");
    eventually("admission through the new CA", Duration::from_secs(30), || async {
        refused_with_our_message(&plane, &slot).await.map_err(anyhow::Error::msg)
    })
    .await
    .expect("admission after the rotation");
}
