//! The operator on real machines (homelab_harness::machine): network namespaces on a test lan,
//! each running a real containerd and kubelet. The power Jobs run as real pods, from the
//! operator's own image, on the kubelet of an always-on machine (the hub), and reach the pool's
//! machines across the lan by the real protocols: a Wake-on-LAN magic packet to the card, an SSH
//! shutdown to the machine's sshd. Nothing in these tests presses a machine's buttons.
//!
//! Needs root, network namespaces and a cgroup v1 freezer hierarchy (it fails without them).
//! The first run builds the `machines` programs and the operator's image (`make image`).

use anyhow::{Result, ensure};
use homelab_autoscaler::api::{Group, Node, NodeClaim, NodeClaimPhase};
use homelab_harness::claims::{phase, provider_claim_for};
use homelab_harness::machine::{Lan, Machine, MachineSpec, PowerState};
use homelab_harness::real_lab::{
    ACT, HUB_ROLE, Stranding, hub, machine_settings, operator_image, pool_machine, start_operator,
    timeouts,
};
use homelab_harness::slots::{event_reasons, node_reporting};
use homelab_harness::{Components, ControlPlane, eventually, ready_status, test_namespace};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node as CoreNode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// The pool as a user writes it, applied with kubectl: a Group and one slot whose power is the
/// machine's own (Wake-on-LAN on, SSH off), its Jobs on the hub.
async fn apply_pool(plane: &ControlPlane, ns: &str, machine: &Machine, key: &str) -> Result<()> {
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": format!("{}-ssh", machine.name()) },
        "stringData": { "ssh-privatekey": key },
    });
    let manifest = format!(
        r#"{secret}
---
apiVersion: infra.homecluster.dev/v2alpha1
kind: Group
metadata:
  name: lan
spec:
  driver: builtin
  nodeReadinessTaints: []
---
apiVersion: infra.homecluster.dev/v2alpha1
kind: Node
metadata:
  name: {name}
  labels: {{ group: lan }}
spec:
  kubernetesNodeName: {name}
  power:
    wakeOnLan:
      mac: "{mac}"
      broadcastAddress: "{broadcast}"
    ssh:
      host: "{address}"
      user: root
      privateKey: {{ name: {name}-ssh, key: ssh-privatekey }}
      knownHostKey: "{host_key}"
      command: poweroff
    nodeSelector: {{ "{HUB_ROLE}": hub }}
"#,
        name = machine.name(),
        mac = machine.mac(),
        broadcast = Lan::broadcast(),
        address = machine.address(),
        host_key = machine.ssh_host_key()?,
    );
    let output = plane.kubectl_apply(ns, &manifest).await?;
    ensure!(output.status.success(), "kubectl apply: {}", String::from_utf8_lossy(&output.stderr));
    Ok(())
}

/// A machine running with no claim loses its link for longer than `--off-node-grace` and gets
/// it back. Its kubelet never registers again a Node deleted while it runs, so the operator
/// keeps the Node while the machine is silent: the shutdown it sends to confirm the machine off
/// cannot reach it. Once the link is back the kubelet reports on its own Node, and the shutdown
/// that now lands powers the machine off, after which its Node goes. At no moment is the machine
/// on without its Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_cut_off_past_the_grace_keeps_its_node_and_is_never_stranded() {
    homelab_autoscaler::tls::install_crypto_provider();
    let space = test_namespace(Components::CLUSTER, "real-partition").await.expect("namespace");
    let (plane, client, ns) = (space.plane, space.client.clone(), space.ns.clone());
    let lan = Lan::start(plane.api_address()).expect("lan");
    let hub = hub(plane, &lan).await.expect("hub");
    let _hub_logs = hub.logs_on_failure();
    let spec = MachineSpec::named(&format!("{ns}-m1"));
    let (m1, key) = pool_machine(plane, &lan, spec).await.expect("machine");
    let _m1_logs = m1.logs_on_failure();
    let (_, image) = operator_image().await.expect("image");
    let operator = start_operator(&client, &ns, &image, machine_settings()).await;
    apply_pool(plane, &ns, &m1, &key).await.expect("pool");
    let nodes: Api<CoreNode> = Api::all(client.clone());
    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), &ns);
    let slots: Api<Node> = Api::namespaced(client.clone(), &ns);
    let stranded = Stranding::watch(m1.clone(), nodes.clone());
    let slot = m1.name().to_owned();

    // Booted for a claim: the wake Job on the hub sends the magic packet across the lan.
    let groups: Api<Group> = Api::namespaced(client.clone(), &ns);
    let claim = provider_claim_for("boot", &slot, &slots, &groups, timeouts(), "test")
        .await
        .expect("claim");
    claims.create(&PostParams::default(), &claim).await.expect("create claim");
    eventually("the claim ready on the real machine", ACT, || async {
        let claim = claims.get("boot").await?;
        ensure!(phase(&claim) == NodeClaimPhase::Ready, "phase {:?}", claim.status);
        Ok(())
    })
    .await
    .expect("ready");
    assert!(m1.wakes() >= 1, "woken by a magic packet, not by the test");
    let registered = nodes.get(&slot).await.expect("node");

    // The cable is pulled, then the claim released: the shutdown cannot reach the machine.
    m1.link().cut().expect("cut");
    eventually("the cut-off machine's Node Unknown", ACT, || async {
        let node = nodes.get(&slot).await?;
        ensure!(ready_status(&node) == Some("Unknown"), "Ready={:?}", ready_status(&node));
        Ok(())
    })
    .await
    .expect("unknown");
    let mark = json!({ "status": { "scaleDownRequestedAt": Time(jiff::Timestamp::now()), "scaleDownRequestedBy": "test" } });
    claims.patch_status("boot", &PatchParams::default(), &Patch::Merge(&mark)).await.expect("mark");
    claims.delete("boot", &DeleteParams::default()).await.expect("release");

    // Past the grace with nothing wanting it, the operator powers the machine off to confirm it,
    // and that shutdown fails across the cut link: the Node must still be there afterwards.
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    eventually("a shutdown to confirm the silent machine off, failed", ACT * 2, || async {
        stranded.assert_never(&slot);
        let reasons = event_reasons(&client, &ns, &slot).await?;
        ensure!(reasons.iter().any(|r| r == "ConfirmingOff"), "events {reasons:?}");
        let failed = jobs.list(&ListParams::default()).await?.items.into_iter().any(|j| {
            let name = j.metadata.name.clone().unwrap_or_default();
            let conditions = j.status.and_then(|s| s.conditions).unwrap_or_default();
            name.starts_with(&format!("{slot}-"))
                && name.contains("shutdown")
                && conditions.iter().any(|c| c.type_ == "Failed" && c.status == "True")
        });
        ensure!(failed, "no slot shutdown Job has failed yet");
        Ok(())
    })
    .await
    .expect("confirming off");
    let kept = nodes.get_opt(&slot).await.expect("read node");
    assert_eq!(
        kept.and_then(|n| n.metadata.uid),
        registered.metadata.uid.clone(),
        "the silent machine's Node is kept"
    );
    let slot_obj = slots.get(&slot).await.expect("slot");
    let (reporting, message) = node_reporting(&slot_obj).expect("NodeReporting");
    assert!(!reporting && message.contains("kubectl delete node"), "{message}");
    assert!(m1.kubelet_running().await, "the machine ran throughout");

    // The cable is back. Up and unwanted, and reachable again: the SSH shutdown lands (the
    // kubelet may report on its Node first, or not), and then the Node goes. Until then the
    // Node is the one the kubelet registered: never removed and never replaced under it.
    m1.link().restore().expect("restore");
    eventually("the machine off and its Node removed", ACT * 2, || async {
        stranded.assert_never(&slot);
        if let Some(node) = nodes.get_opt(&slot).await? {
            assert_eq!(node.metadata.uid, registered.metadata.uid, "the Node was replaced");
        }
        ensure!(m1.power_state().await == PowerState::Off, "the machine is still on");
        ensure!(nodes.get_opt(&slot).await?.is_none(), "Node {slot} still there");
        let reasons = event_reasons(&client, &ns, &slot).await?;
        ensure!(reasons.iter().any(|r| r == "NodeRemoved"), "events {reasons:?}");
        Ok(())
    })
    .await
    .expect("off");
    stranded.assert_never(&slot);
    operator.cancel();
}
