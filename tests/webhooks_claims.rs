//! A claim's admission as a user meets it, through the real kube-apiserver and kubectl with the
//! product's webhook server in the test process (`homelab_harness::admission`): what a new claim
//! is stamped with, one live claim per slot, a slot of the claim's own pool, the attempt bound
//! and its reset, a deadline only the operator clears, a pin's end.

use homelab_autoscaler::api::{ANNOTATION_ATTEMPTS_RESET_AT, LABEL_GROUP, LABEL_SLOT, NodeClaim};
use homelab_harness::admission::{
    AdmissionLab, claim, client_as, group, now_seconds, refused, slot, time_of,
};
use homelab_harness::{Components, ControlPlane};
use jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

// What a new claim is stamped with.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_claim_is_stamped_by_admission() {
    let w = AdmissionLab::start("wh-stamp", &[]).await;
    let post = PostParams::default();
    // Pools whose maxNodeProvisionTime is below and above the 12m10s boot budget.
    w.groups
        .create(&post, &group("short", json!({ "maxNodeProvisionTime": "5m" })))
        .await
        .expect("group short");
    w.groups
        .create(&post, &group("slow", json!({ "maxNodeProvisionTime": "20m" })))
        .await
        .expect("group slow");
    w.slots.create(&post, &slot("machine-2", Some("short"))).await.expect("slot machine-2");
    w.slots.create(&post, &slot("machine-3", Some("slow"))).await.expect("slot machine-3");

    let before = now_seconds();
    let cases = [
        ("claim-pool", "machine-1", "pool", None, SignedDuration::from_secs(12 * 60 + 10)),
        ("claim-short", "machine-2", "short", Some("5m"), SignedDuration::from_secs(12 * 60 + 10)),
        ("claim-slow", "machine-3", "slow", Some("20m"), SignedDuration::from_mins(20)),
    ];
    for (name, slot_name, group_name, mnpt, window) in cases {
        let created = w.create_claim(name, slot_name, group_name).await.expect("create claim");
        // What is stored, not only what create answered.
        let stored = w.claims.get(name).await.expect("get claim");
        assert_eq!(stored.spec, created.spec);
        let spec = &stored.spec;
        assert_eq!(spec.requested_by.as_deref(), Some("admin"), "{name}: requestedBy");
        assert_eq!(spec.attempt, Some(1), "{name}: attempt");
        assert_eq!(spec.ttl_seconds_after_finished, Some(3600), "{name}: TTL");
        let requested_at = time_of(&spec.requested_at);
        let after = Timestamp::now();
        assert!(
            requested_at >= before && requested_at <= after,
            "{name}: requestedAt {requested_at} is not the time of the request ({before}..{after})"
        );
        assert_eq!(
            time_of(&spec.deadline_at).duration_since(requested_at),
            window,
            "{name}: deadlineAt = requestedAt + max(12m10s, maxNodeProvisionTime)"
        );
        assert_eq!(
            spec.max_node_provision_time,
            mnpt.map(|m| m.parse::<kube::core::Duration>().expect("duration")),
            "{name}: maxNodeProvisionTime copied from the group"
        );
        let labels = stored.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get(LABEL_GROUP).map(String::as_str), Some(group_name), "{name}");
        assert_eq!(labels.get(LABEL_SLOT).map(String::as_str), Some(slot_name), "{name}");
    }

    // What the client says it is stays: its own requestedBy and TTL.
    w.set_claim_status("claim-pool", json!({ "phase": "completed" })).await;
    let mut own = claim("claim-own", "machine-1", "pool");
    own.spec.requested_by = Some("cluster-autoscaler".into());
    own.spec.ttl_seconds_after_finished = Some(60);
    let own = w.claims.create(&post, &own).await.expect("claim with its own requestedBy");
    assert_eq!(own.spec.requested_by.as_deref(), Some("cluster-autoscaler"));
    assert_eq!(own.spec.ttl_seconds_after_finished, Some(60));
    assert_eq!(own.spec.attempt, Some(1));

    // A claim created by kubectl with only a generateName is stamped just the same.
    w.set_claim_status("claim-own", json!({ "phase": "completed" })).await;
    let file = w.manifest(
        "claim.yaml",
        r#"apiVersion: infra.homecluster.dev/v2alpha1
kind: NodeClaim
metadata:
  generateName: machine-1-
spec:
  slotRef: { name: machine-1 }
  request: { call: Manual, group: pool }
"#,
    );
    let (ok, stdout, stderr) = w.kubectl(&["create", "-f", &file, "-n", &w.ns, "-o", "json"]).await;
    assert!(ok, "kubectl create failed: {stderr}");
    let created: NodeClaim = serde_json::from_str(&stdout).expect("kubectl -o json");
    assert!(created.metadata.name.as_deref().is_some_and(|n| n.starts_with("machine-1-")));
    assert_eq!(created.spec.requested_by.as_deref(), Some("admin"));
    assert_eq!(created.spec.attempt, Some(1));
    assert!(created.spec.deadline_at.is_some() && created.spec.requested_at.is_some());

    // A person's own attempt number is replaced by admission's, and kubectl says so.
    let name = created.metadata.name.clone().expect("name");
    w.set_claim_status(&name, json!({ "phase": "completed" })).await;
    let file = w.manifest(
        "numbered.yaml",
        r#"apiVersion: infra.homecluster.dev/v2alpha1
kind: NodeClaim
metadata:
  name: numbered
spec:
  slotRef: { name: machine-1 }
  request: { call: Manual, group: pool }
  attempt: 7
"#,
    );
    let (ok, stdout, stderr) = w.kubectl(&["create", "-f", &file, "-n", &w.ns, "-o", "json"]).await;
    assert!(ok, "kubectl create failed: {stderr}");
    let numbered: NodeClaim = serde_json::from_str(&stdout).expect("kubectl -o json");
    assert_eq!(numbered.spec.attempt, Some(1), "admission's number, not the sent one");
    assert!(
        stderr.contains("Warning: spec.attempt: this claim is attempt 1")
            && stderr.contains("not 7"),
        "kubectl shows the warning: {stderr}"
    );
    w.finish().await;
}

// One live claim per slot.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_takes_one_live_claim_at_a_time() {
    let w = AdmissionLab::start("wh-live", &[]).await;
    w.create_claim("first", "machine-1", "pool").await.expect("the first claim");

    // No status yet: the live claim reads as pending.
    let (code, message) = refused(w.create_claim("second", "machine-1", "pool").await);
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("slot \"machine-1\" already has live claim \"first\" (phase pending)"),
        "{message}"
    );
    assert!(message.contains("delete it to cancel it"), "{message}");

    w.set_claim_status("first", json!({ "phase": "booting", "bootCommittedAt": now_seconds() }))
        .await;
    let (code, message) = refused(w.create_claim("second", "machine-1", "pool").await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("live claim \"first\" (phase booting)"), "{message}");
    assert!(
        message.contains("delete it to release the machine: its boot runs to the end"),
        "{message}"
    );

    w.set_claim_status("first", json!({ "phase": "ready", "readyAt": now_seconds() })).await;
    let (code, message) = refused(w.create_claim("second", "machine-1", "pool").await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("live claim \"first\" (phase ready)"), "{message}");
    assert!(
        message.contains("delete it to release the machine: it is cordoned, drained"),
        "{message}"
    );
    assert!(!message.contains("to cancel it"), "a ready claim is not cancelled: {message}");

    w.set_claim_status("first", json!({ "phase": "completed", "finishedAt": now_seconds() })).await;
    let second = w.create_claim("second", "machine-1", "pool").await.expect("allowed once ended");
    assert_eq!(second.spec.attempt, Some(1), "the first claim succeeded");
    // And the new claim holds the slot in turn.
    let (code, message) = refused(w.create_claim("third", "machine-1", "pool").await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("live claim \"second\""), "{message}");
    // Each refusal is counted under the rule it broke (the server runs in this process).
    let (_, metrics) = homelab_autoscaler::telemetry::render(None);
    assert!(
        metrics.lines().any(|l| l.starts_with("homelab_autoscaler_webhook_denials_total{")
            && l.contains(r#"reason="Forbidden""#)
            && l.contains(r#"rule="one_live_claim_per_slot""#)),
        "no denial counted for one_live_claim_per_slot:\n{metrics}"
    );
    w.finish().await;
}

// A claim for a slot that does not exist, or for another pool.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_names_an_existing_slot_of_its_group() {
    let w = AdmissionLab::start("wh-slotref", &[]).await;

    let (code, message) = refused(w.create_claim("lost", "ghost", "pool").await);
    assert_eq!(code, 422, "{message}");
    assert!(message.contains(&format!("there is no slot \"ghost\" in namespace \"{}\"", w.ns)));
    assert!(
        message.contains(&format!("kubectl get nodes.infra.homecluster.dev -n {}", w.ns)),
        "{message}"
    );

    w.groups.create(&PostParams::default(), &group("other", json!({}))).await.expect("group");
    let (code, message) = refused(w.create_claim("astray", "machine-1", "other").await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("slot \"machine-1\" belongs to group \"pool\", not \"other\""),
        "{message}"
    );

    let (code, message) = refused(w.create_claim("nowhere", "machine-1", "nowhere").await);
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("there is no group \"nowhere\""), "{message}");

    // Nothing refused was stored; the right claim still goes through.
    let names: Vec<String> = w
        .claims
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert!(names.is_empty(), "refused claims were stored: {names:?}");
    w.create_claim("right", "machine-1", "pool").await.expect("a claim for the slot's own group");
    w.finish().await;
}

// The attempt bound, and the one-command reset.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_failed_boots_exhaust_a_slot_until_reset() {
    let w = AdmissionLab::start("wh-attempts", &[]).await;

    // Names sort in creation order: creation timestamps have one-second resolution and the
    // newest claim (by creation, then name) carries the streak.
    for attempt in 1..=3 {
        let name = format!("attempt-{attempt}");
        let created = w.create_claim(&name, "machine-1", "pool").await.expect("create claim");
        assert_eq!(created.spec.attempt, Some(attempt), "{name}");
        let now = now_seconds();
        w.set_claim_status(
            &name,
            json!({
                "phase": "failed",
                "reason": "StartupJobFailed",
                "bootCommittedAt": now,
                "finishedAt": now,
            }),
        )
        .await;
    }

    let (code, message) = refused(w.create_claim("attempt-4", "machine-1", "pool").await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("slot \"machine-1\" failed 3 boots in a row"), "{message}");
    assert!(
        message.contains(&format!(
            "kubectl annotate node.infra.homecluster.dev machine-1 -n {} \
             infra.homecluster.dev/attempts-reset-at=",
            w.ns
        )),
        "{message}"
    );

    // The reset, exactly as the message and the docs give it (with the time filled in).
    let reset = format!("{ANNOTATION_ATTEMPTS_RESET_AT}={}", now_seconds());
    let (ok, _, stderr) = w
        .kubectl(&[
            "annotate",
            "node.infra.homecluster.dev",
            "machine-1",
            "-n",
            &w.ns,
            &reset,
            "--overwrite",
        ])
        .await;
    assert!(ok, "kubectl annotate failed: {stderr}");

    let fresh = w.create_claim("attempt-5", "machine-1", "pool").await.expect("after the reset");
    assert_eq!(fresh.spec.attempt, Some(1), "the reset ends the streak");

    // A malformed reset is refused by the slot webhook rather than silently ignored.
    let (ok, _, stderr) = w
        .kubectl(&[
            "annotate",
            "node.infra.homecluster.dev",
            "machine-1",
            "-n",
            &w.ns,
            &format!("{ANNOTATION_ATTEMPTS_RESET_AT}=yesterday"),
            "--overwrite",
        ])
        .await;
    assert!(!ok, "a malformed reset annotation was accepted");
    assert!(stderr.contains("is not an RFC 3339 time"), "{stderr}");

    // The other documented reset (docs/api.md): a paused scale-down's shutdown count, through
    // the status subresource, which admission leaves to the controllers.
    w.set_claim_status(
        "attempt-5",
        json!({ "shutdownAttempts": 3, "lastShutdownAttemptAt": now_seconds() }),
    )
    .await;
    let (ok, _, stderr) = w
        .kubectl(&[
            "patch",
            "nodeclaim",
            "attempt-5",
            "-n",
            &w.ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"shutdownAttempts":0,"lastShutdownAttemptAt":null}}"#,
        ])
        .await;
    assert!(ok, "kubectl patch --subresource=status failed: {stderr}");
    let status = w.claims.get("attempt-5").await.expect("get").status.unwrap_or_default();
    assert_eq!(status.shutdown_attempts, Some(0));
    assert_eq!(status.last_shutdown_attempt_at, None);
    w.finish().await;
}

/// The DEADLINE printer column is of type date, which kubectl prints as an age; a deadline in
/// the future has none, so every live claim shows `<invalid>`. Fails until the column shows the
/// time (src/api/nodeclaim.rs, then `make manifests`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_shows_a_live_claims_stamped_deadline() {
    let w = AdmissionLab::start("wh-deadline-column", &[]).await;
    let created = w.create_claim("shown", "machine-1", "pool").await.expect("claim");
    assert!(created.spec.deadline_at.is_some());
    let (ok, stdout, stderr) = w.kubectl(&["get", "nodeclaims", "shown", "-n", &w.ns]).await;
    assert!(ok, "kubectl get failed: {stderr}");
    assert!(stdout.contains("DEADLINE"), "{stdout}");
    assert!(!stdout.contains("<invalid>"), "the deadline is unreadable:\n{stdout}");
    w.finish().await;
}

// The deadline: cleared only by the operator, never moved.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_operator_clears_a_deadline_and_nobody_moves_it() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    // The operator runs as "admin" here; "alice" is a person.
    let w = AdmissionLab::new(plane, "wh-deadline", &["admin"]).await;
    let alice: Api<NodeClaim> = Api::namespaced(client_as(plane, "alice").await, &w.ns);

    // alice's own claim is stamped with her name.
    let mine = alice.create(&PostParams::default(), &claim("mine", "machine-1", "pool")).await;
    let mine = mine.expect("alice creates a claim");
    assert_eq!(mine.spec.requested_by.as_deref(), Some("alice"));
    let deadline = time_of(&mine.spec.deadline_at);

    let clear = Patch::Merge(json!({ "spec": { "deadlineAt": null } }));
    let (code, message) = refused(alice.patch("mine", &PatchParams::default(), &clear).await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("spec.deadlineAt is cleared only by the operator"), "{message}");
    assert!(message.contains("to cancel the claim, delete it"), "{message}");

    let later = deadline.checked_add(SignedDuration::from_hours(1)).expect("time");
    let moved = Patch::Merge(json!({ "spec": { "deadlineAt": later } }));
    for (who, api) in [("alice", &alice), ("the operator", &w.claims)] {
        let (code, message) = refused(api.patch("mine", &PatchParams::default(), &moved).await);
        assert_eq!(code, 403, "{who}: {message}");
        assert!(message.contains("spec.deadlineAt is set once, at admission"), "{who}: {message}");
    }
    assert_eq!(time_of(&w.claims.get("mine").await.expect("get").spec.deadline_at), deadline);

    let cleared = w
        .claims
        .patch("mine", &PatchParams::default(), &clear)
        .await
        .expect("the operator clears the deadline");
    assert_eq!(cleared.spec.deadline_at, None);
    assert_eq!(w.claims.get("mine").await.expect("get").spec.deadline_at, None);

    // Once cleared it cannot be set again, by anyone.
    let (code, message) = refused(w.claims.patch("mine", &PatchParams::default(), &moved).await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("set once, at admission"), "{message}");
    w.finish().await;
}

/// A pin's end as a person meets it: a `spec.until` that is not ahead is refused on create
/// (through kubectl) and on update, with what to do; a live pin's end moves either way; an
/// IncreaseSize claim cannot carry one (the CRD's CEL rule).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pins_end_must_lie_ahead_and_only_a_pin_has_one() {
    let w = AdmissionLab::start("wh-until", &[]).await;
    let past = now_seconds().checked_sub(SignedDuration::from_mins(5)).expect("time");
    let manifest = |name: &str, call: &str, until: Timestamp| {
        let delta = if call == "IncreaseSize" { ", delta: 1" } else { "" };
        format!(
            "apiVersion: infra.homecluster.dev/v2alpha1\nkind: NodeClaim\nmetadata:\n  name: \
             {name}\n  namespace: {}\nspec:\n  slotRef: {{ name: machine-1 }}\n  request: {{ \
             call: {call}, group: pool{delta} }}\n  until: \"{until}\"\n",
            w.ns
        )
    };
    let file = w.manifest("past.yaml", &manifest("past", "Manual", past));
    let (ok, _, stderr) = w.kubectl(&["create", "-f", &file]).await;
    assert!(!ok, "a pin that ended already is refused");
    assert!(stderr.contains("spec.until") && stderr.contains("is not after now"), "{stderr}");
    assert!(stderr.contains("homelab-autoscaler keep-on --slot machine-1"), "{stderr}");

    let ahead = now_seconds().checked_add(SignedDuration::from_hours(1)).expect("time");
    let file = w.manifest("scaled.yaml", &manifest("scaled", "IncreaseSize", ahead));
    let (ok, _, stderr) = w.kubectl(&["create", "-f", &file]).await;
    assert!(!ok, "an IncreaseSize claim has no end of its own");
    assert!(stderr.contains("only a Manual or Schedule claim has one"), "{stderr}");

    let file = w.manifest("pin.yaml", &manifest("pin", "Manual", ahead));
    let (ok, _, stderr) = w.kubectl(&["create", "-f", &file]).await;
    assert!(ok, "a pin ending in an hour is admitted: {stderr}");
    let (ok, stdout, stderr) =
        w.kubectl(&["get", "nodeclaim", "pin", "-n", &w.ns, "-o", "wide"]).await;
    assert!(ok && stdout.contains("UNTIL"), "kubectl get -o wide shows the end: {stdout}{stderr}");

    let set = |t: Option<Timestamp>| Patch::Merge(json!({ "spec": { "until": t } }));
    let params = PatchParams::default();
    let (code, message) = refused(w.claims.patch("pin", &params, &set(Some(past))).await);
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("is not after now"), "{message}");
    for until in [ahead.checked_add(SignedDuration::from_hours(2)).ok(), Some(ahead), None] {
        let moved =
            w.claims.patch("pin", &params, &set(until)).await.expect("a live pin's end moves");
        assert_eq!(moved.spec.until.map(|t| t.0), until);
    }

    // An ended pin keeps its end.
    w.set_claim_status("pin", json!({ "phase": "completed", "reason": "DeletedByHand" })).await;
    let (code, message) = refused(w.claims.patch("pin", &params, &set(Some(ahead))).await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("has ended"), "{message}");
    w.finish().await;
}
