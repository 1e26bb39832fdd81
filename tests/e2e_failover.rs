//! Two operator replicas share a Lease: the first moves claims, the second stands by; when
//! the leader dies without letting go, the standby takes the Lease once it expires, and the
//! claims keep moving. Both replicas serve the webhooks from one certificate (the cert-manager
//! Secret layout), as they would in a cluster.

use std::time::Duration;

use anyhow::ensure;
use homelab_harness::e2e::{self, World};
use homelab_harness::eventually;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_the_lease_when_the_leader_dies_and_claims_keep_moving() {
    homelab_autoscaler::tls::install_crypto_provider();
    let bin = e2e::operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler"))).expect("binary");
    let mut world = World::start_with_shared_certificate(&bin).await.expect("start the world");
    let _logs = world.plane.logs_on_failure();

    let first = world.replicas[0].identity();
    eventually("the first replica to hold the Lease", Duration::from_secs(60), || async {
        let holder = world.lease_holder().await?;
        ensure!(holder == first, "held by {holder:?}");
        Ok(())
    })
    .await
    .expect("first leader");
    world.start_replica().await.expect("second replica");
    let second = world.replicas[1].identity();
    assert_eq!(
        world.lease_holder().await.expect("lease"),
        first,
        "the standby does not take a held Lease"
    );

    // The leader dies without releasing the Lease; the Service would now route to the standby.
    world.replicas[0].child.kill().await.expect("kill the leader");
    world.route_webhooks_to(1).await.expect("route webhooks to the standby");
    eventually("the standby to take the Lease", Duration::from_secs(90), || async {
        let holder = world.lease_holder().await?;
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
