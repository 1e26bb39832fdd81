//! No secret reaches a log: a full end-to-end run (the operator binary with its webhook
//! certificate from files, the simulator, a claim by hand that boots and is released) with a
//! Secret in the operator's namespace, then every log of the run is searched
//! for the Secret's value (raw and base64), the private keys the processes hold (the webhook's
//! and the admin kubeconfig's), and anything shaped like a token or a key.

use homelab_harness::ControlPlane;
use homelab_harness::e2e::{self, NAMESPACE, WebhookTls, World};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;

/// The lines of base64 inside a PEM: what a leaked key would show.
fn pem_body_lines(pem: &str) -> Vec<String> {
    pem.lines().filter(|l| !l.starts_with("-----") && l.len() >= 32).map(str::to_string).collect()
}

fn base64(bytes: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | (*b as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(TABLE[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The admin's private key, found where kubectl reads it from the plane's kubeconfig.
async fn admin_key_pem(plane: &ControlPlane) -> String {
    let out = plane
        .kubectl(["config", "view", "-o", "jsonpath={.users[0].user.client-key}"])
        .await
        .expect("kubectl config view");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let path = String::from_utf8_lossy(&out.stdout).into_owned();
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("admin key {path}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_run_logs_no_secret_value_key_or_token() {
    homelab_autoscaler::tls::install_crypto_provider();
    let bin = e2e::operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler"))).expect("bin");
    let mut world = World::start_with_shared_certificate(&bin).await.expect("start the world");
    let _logs = world.plane.logs_on_failure();

    // A Secret as a homelab keeps its BMC or wake-on-LAN credentials in.
    let value = format!("s3cr3t-{}-{}", std::process::id(), jiff::Timestamp::now().as_nanosecond());
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "power-credentials" },
        "stringData": { "password": value },
    }))
    .expect("secret");
    Api::<Secret>::namespaced(world.client.clone(), NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the secret");

    let outcome = world.manual_claim().await;
    eprintln!("{}", world.summary());
    outcome.expect("the scenario");

    let mut needles: Vec<(String, &str)> = vec![
        (value.clone(), "the Secret's value"),
        (base64(value.as_bytes()), "the Secret's value in base64"),
        ("PRIVATE KEY".into(), "a PEM private key"),
        ("Bearer ".into(), "a bearer token"),
        ("eyJhbGciOi".into(), "a JWT"),
    ];
    let WebhookTls::Files { dir, .. } = world.webhook_tls() else {
        panic!("the World serves a shared certificate from files");
    };
    let webhook_key = std::fs::read_to_string(dir.join("tls.key")).expect("the webhook's key");
    for line in pem_body_lines(&webhook_key) {
        needles.push((line, "the webhook's private key"));
    }
    for line in pem_body_lines(&admin_key_pem(&world.plane).await) {
        needles.push((line, "the admin kubeconfig's private key"));
    }

    let mut searched = 0usize;
    for entry in std::fs::read_dir(world.logs_dir()).expect("log dir") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("log") {
            continue;
        }
        let log = std::fs::read_to_string(&path).expect("log");
        searched += log.len();
        for (needle, what) in &needles {
            assert!(!log.contains(needle.as_str()), "{} holds {what}", path.display());
        }
    }
    assert!(searched > 1000, "the run logged almost nothing ({searched} bytes): a broken search");
    eprintln!("searched {searched} bytes of logs for {} needles", needles.len());
}
