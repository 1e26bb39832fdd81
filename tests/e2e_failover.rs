//! Two operator replicas share a Lease: the first moves claims, the second stands by; when
//! the leader dies without letting go, the standby takes the Lease once it expires, and the
//! claims keep moving. Both replicas serve the webhooks from one certificate (the cert-manager
//! Secret layout), as they would in a cluster.

use std::time::Duration;

use anyhow::ensure;
use homelab_harness::e2e::{self, NAMESPACE, WebhookTls, World};
use homelab_harness::eventually;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

async fn holder(world: &World) -> anyhow::Result<String> {
    let leases: Api<Lease> = Api::namespaced(world.client.clone(), NAMESPACE);
    let lease = leases.get("homelab-autoscaler").await?;
    Ok(lease.spec.and_then(|s| s.holder_identity).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_the_lease_when_the_leader_dies_and_claims_keep_moving() {
    homelab_autoscaler::tls::install_crypto_provider();
    let bin = e2e::operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler"))).expect("binary");
    let certs = tempfile::tempdir().expect("tempdir");
    let bundle =
        homelab_autoscaler::tls::issue_self_signed(&["localhost".into()], &[]).expect("certs");
    bundle.write_secret_layout(certs.path()).expect("write certs");
    let tls = WebhookTls::Files { dir: certs.path().to_path_buf(), ca_pem: bundle.ca_pem.clone() };
    let mut world = World::start_with(&bin, false, tls).await.expect("start the world");
    let _logs = world.plane.logs_on_failure();

    let first = world.replicas[0].identity();
    eventually("the first replica to hold the Lease", Duration::from_secs(60), || async {
        let holder = holder(&world).await?;
        ensure!(holder == first, "held by {holder:?}");
        Ok(())
    })
    .await
    .expect("first leader");
    world.start_replica().await.expect("second replica");
    let second = world.replicas[1].identity();
    assert_eq!(
        holder(&world).await.expect("lease"),
        first,
        "the standby does not take a held Lease"
    );

    // The leader dies without releasing the Lease; the Service would now route to the standby.
    world.replicas[0].child.kill().await.expect("kill the leader");
    let port = world.replicas[1].webhook_port;
    world.point_webhooks_at(port, &bundle.ca_pem).await.expect("route webhooks to the standby");
    eventually("the standby to take the Lease", Duration::from_secs(90), || async {
        let holder = holder(&world).await?;
        ensure!(holder == second, "held by {holder:?}");
        Ok(())
    })
    .await
    .expect("failover");

    // The new leader moves claims: a claim by hand is stamped, boots, and is released.
    let outcome = world.manual_claim().await;
    eprintln!("{}", world.summary());
    outcome.expect("claims move after the failover");
}
