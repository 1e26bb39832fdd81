//! End to end by hand: the real operator binary (admission webhooks with its own CA, the
//! controllers) and the machine simulator; a person starts a machine with a bare NodeClaim and
//! stops it by deleting the claim.

use homelab_harness::e2e;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_made_by_hand_is_stamped_boots_and_is_released() {
    let bin = e2e::operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler")))
        .expect("operator binary");
    let mut world = e2e::World::start(&bin, false).await.expect("start the world");
    let _logs = world.plane.logs_on_failure();
    let outcome = world.manual_claim().await;
    eprintln!("{}", world.summary());
    outcome.expect("the scenario");
}
