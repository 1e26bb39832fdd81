//! The webhook server itself, with the product's server in the test process behind the real
//! kube-apiserver: requests that are not AdmissionReviews sent straight to it get clear errors
//! and leave it serving, and it follows a rotated certificate without a restart.

use std::time::Duration;

use anyhow::ensure;
use homelab_autoscaler::webhook::configuration;
use homelab_harness::admission::{
    ACT_TIMEOUT, AdmissionLab, claim, https, refused, served_certificate, slot, write_cert_files,
};
use homelab_harness::eventually;
use kube::api::PostParams;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

// Requests that are not AdmissionReviews, sent straight to the server.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_is_not_an_admission_review_gets_a_clear_error() {
    let w = AdmissionLab::start("wh-garbage", &[]).await;
    let plane = w.plane;
    let port = w.hooks.port;
    let json = Some("application/json");
    let validate = configuration::PATH_VALIDATE_CLAIM;

    // Not JSON at all.
    let answer = https(plane, port, "POST", validate, json, "this is not json").await.unwrap();
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(answer.body.contains("JSON"), "{}", answer.body);

    // JSON, but not shaped like a review.
    let answer = https(plane, port, "POST", validate, json, r#"{"hello":"world"}"#).await.unwrap();
    assert_eq!(answer.status, 422, "{}", answer.body);
    assert!(answer.body.contains("missing field `apiVersion`"), "{}", answer.body);

    // Not declared as JSON.
    let answer = https(plane, port, "POST", validate, Some("text/plain"), "{}").await.unwrap();
    assert_eq!(answer.status, 415, "{}", answer.body);
    assert!(answer.body.contains("application/json"), "{}", answer.body);

    // A review that carries no request: answered as a review, refused, saying why.
    let empty = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#;
    let answer = https(plane, port, "POST", validate, json, empty).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);
    let review: Value = serde_json::from_str(&answer.body).expect("an AdmissionReview");
    assert_eq!(review["kind"], "AdmissionReview", "{review}");
    assert_eq!(review["response"]["allowed"], false, "{review}");
    let message = review["response"]["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("malformed AdmissionReview"), "{review}");

    // A review whose object is not a NodeClaim: refused with the schema named, its uid echoed.
    let bad_object = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0c0ffee0-0000-4000-8000-000000000001",
            "kind": { "group": "infra.homecluster.dev", "version": "v2alpha1", "kind": "NodeClaim" },
            "resource": { "group": "infra.homecluster.dev", "version": "v2alpha1", "resource": "nodeclaims" },
            "name": "odd",
            "namespace": w.ns,
            "operation": "CREATE",
            "userInfo": { "username": "admin" },
            "object": {
                "apiVersion": "infra.homecluster.dev/v2alpha1",
                "kind": "NodeClaim",
                "metadata": { "name": "odd", "namespace": w.ns },
                "spec": "not a spec",
            },
        },
    });
    for path in [configuration::PATH_MUTATE_CLAIM, validate] {
        let answer = https(plane, port, "POST", path, json, &bad_object.to_string()).await.unwrap();
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        let review: Value = serde_json::from_str(&answer.body).expect("an AdmissionReview");
        let response = &review["response"];
        assert_eq!(response["uid"], "0c0ffee0-0000-4000-8000-000000000001", "{path}: {review}");
        assert_eq!(response["allowed"], false, "{path}: {review}");
        assert_eq!(response["status"]["code"], 422, "{path}: {review}");
        let message = response["status"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("does not match the v2alpha1 schema"), "{path}: {review}");
    }

    // A well-formed review of a slot still declaring powerState: the webhook's own refusal (the
    // CRD's CEL rule refuses it first through the apiserver, so it is asked directly here).
    let power = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0c0ffee0-0000-4000-8000-000000000002",
            "kind": { "group": "infra.homecluster.dev", "version": "v2alpha1", "kind": "Node" },
            "resource": { "group": "infra.homecluster.dev", "version": "v2alpha1", "resource": "nodes" },
            "name": "machine-9",
            "namespace": w.ns,
            "operation": "CREATE",
            "userInfo": { "username": "admin" },
            "object": serde_json::to_value({
                let mut s = slot("machine-9", Some("pool"));
                s.spec.power_state = Some("on".into());
                s
            }).unwrap(),
        },
    });
    let answer =
        https(plane, port, "POST", configuration::PATH_VALIDATE_SLOT, json, &power.to_string())
            .await
            .unwrap();
    let review: Value = serde_json::from_str(&answer.body).expect("an AdmissionReview");
    let response = &review["response"];
    assert_eq!(response["allowed"], false, "{review}");
    assert_eq!(response["status"]["code"], 422, "{review}");
    assert_eq!(response["status"]["status"], "Failure", "{review}");
    let message = response["status"]["message"].as_str().unwrap_or_default();
    for needle in ["spec.powerState was removed", "Delete spec.powerState", "create a NodeClaim"] {
        assert!(message.contains(needle), "{needle:?} missing: {review}");
    }

    // The wrong method, an unknown path.
    let answer = https(plane, port, "GET", validate, None, "").await.unwrap();
    assert_eq!(answer.status, 405, "{}", answer.body);
    let answer = https(plane, port, "POST", "/nowhere", json, "{}").await.unwrap();
    assert_eq!(answer.status, 404, "{}", answer.body);

    // Plain HTTP on the TLS port: the handshake fails, the server carries on.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    plain.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    let mut sink = Vec::new();
    let _ = plain.read_to_end(&mut sink).await;

    // Nothing panicked: the server still answers, directly and through the apiserver.
    w.hooks.assert_running();
    let answer = https(plane, port, "GET", "/healthz", None, "").await.unwrap();
    assert_eq!((answer.status, answer.body.as_str()), (200, "ok"));
    let claim = w.create_claim("after", "machine-1", "pool").await.expect("admission still works");
    assert_eq!(claim.spec.requested_by.as_deref(), Some("admin"));
    w.finish().await;
}

// Certificate rotation without a restart.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_follows_a_rotated_certificate() {
    let w = AdmissionLab::start("wh-rotate", &[]).await;
    let plane = w.plane;
    let port = w.hooks.port;
    let der = |pem: &str| CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem").to_vec();
    let first = std::fs::read_to_string(w.hooks.cert_dir.path().join("tls.crt")).expect("read");
    assert_eq!(served_certificate(plane, port, "127.0.0.1").await.unwrap(), der(&first));
    w.create_claim("before", "machine-1", "pool").await.expect("admission before the rotation");
    w.set_claim_status("before", json!({ "phase": "completed" })).await;

    // The rotation: the files are replaced by a new certificate and key from the same CA, and
    // the server's watcher (as the operator runs it, on a short interval) picks them up.
    let _watch = tokio::spawn(
        w.hooks.tls.clone().watch(Duration::from_millis(100), w.hooks.shutdown.clone()),
    );
    let second = plane.issue_serving_cert(&["127.0.0.1", "localhost"]).expect("new cert");
    assert_ne!(der(&second.cert_pem), der(&first));
    write_cert_files(w.hooks.cert_dir.path(), &second.cert_pem, &second.key_pem).expect("rotate");
    eventually("the server to present the rotated certificate", ACT_TIMEOUT, || async {
        let served = served_certificate(plane, port, "127.0.0.1").await?;
        ensure!(served == der(&second.cert_pem), "still the old certificate");
        Ok(())
    })
    .await
    .expect("the rotated certificate was never served");

    // The apiserver may keep its connection from before the rotation; calling the server by
    // another name forces a new one, whose handshake sees only the new certificate.
    w.hooks.register(plane, &w.ns, "localhost").await.expect("re-register at localhost");
    let authority = format!("localhost:{port}");
    let claims = w.claims.clone();
    let hooks = &w.hooks;
    eventually("the apiserver to call the server at localhost", ACT_TIMEOUT, || {
        let claims = claims.clone();
        let authority = authority.clone();
        async move {
            let dry_run = PostParams { dry_run: true, ..PostParams::default() };
            let probe = claims.create(&dry_run, &claim("probe", "machine-1", "pool")).await?;
            ensure!(probe.spec.requested_by.is_some(), "not stamped");
            ensure!(hooks.saw_authority(&authority), "not called at {authority} yet");
            Ok(())
        }
    })
    .await
    .expect("the apiserver never called the rotated server");
    let after = w.create_claim("after", "machine-1", "pool").await.expect("admission after");
    assert_eq!(after.spec.requested_by.as_deref(), Some("admin"));
    assert_eq!(after.spec.attempt, Some(1));
    let (code, message) = refused(w.create_claim("again", "machine-1", "pool").await);
    assert_eq!((code, message.contains("live claim \"after\"")), (403, true), "{message}");

    // A broken rotation keeps the good certificate in service.
    std::fs::write(w.hooks.cert_dir.path().join("tls.crt"), "not a certificate").expect("break");
    assert!(w.hooks.tls.reload_if_changed().is_err(), "a broken certificate file was loaded");
    assert_eq!(
        served_certificate(plane, port, "localhost").await.unwrap(),
        der(&second.cert_pem),
        "the server stopped presenting the last good certificate"
    );
    w.set_claim_status("after", json!({ "phase": "completed" })).await;
    w.create_claim("still", "machine-1", "pool").await.expect("admission with the kept cert");
    w.finish().await;
}
