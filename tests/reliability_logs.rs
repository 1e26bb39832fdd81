//! No secret reaches a log: a full end-to-end run (the operator binary with its webhook
//! certificate from files, the simulator, a claim by hand that boots and is released), and a
//! smart plug's credentials Secret that the power driver really reads: `homelab-autoscaler power`
//! at trace level, once as a person runs it (the Secret read through the API) and once as a
//! power Job's pod runs it (the Secret mounted as files), each time sending the credentials to a
//! plug on 127.0.0.1 that records them. Then every log of the run is searched for the Secret's
//! values (raw, base64 and as the Authorization header), the private keys the processes hold (the
//! webhook's and the admin kubeconfig's), and anything shaped like a token or a key.

use homelab_harness::ControlPlane;
use homelab_harness::e2e::{self, NAMESPACE, WebhookTls, World};
use homelab_harness::http::Recorder;

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

/// `spec.power` of a slot switched by `plug`, with basic auth and an API token from `secret`.
fn plug_power(plug: &Recorder, secret: &str) -> serde_json::Value {
    let request = |path: &str| {
        serde_json::json!({
            "url": format!("{}/{path}", plug.base),
            "basicAuth": { "secretName": secret },
            "headers": [{
                "name": "X-Api-Token",
                "valueFrom": { "name": secret, "key": "token" },
                "valuePrefix": "Bearer ",
            }],
        })
    };
    serde_json::json!({ "http": { "onRequest": request("on"), "offRequest": request("off") } })
}

/// Runs `homelab-autoscaler --log-level=trace power ARGS`, its output appended to `log`.
async fn power_at_trace(world: &World, args: &[&str], env: &[(&str, &str)], log: &std::path::Path) {
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log file");
    let err = out.try_clone().expect("log file");
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_homelab-autoscaler"));
    command
        .arg("--log-level=trace")
        .arg("power")
        .args(args)
        .env_clear()
        .env("KUBECONFIG", world.plane.kubeconfig_path())
        .stdout(out)
        .stderr(err);
    for (key, value) in env {
        command.env(key, value);
    }
    let status = command.status().await.expect("run homelab-autoscaler power");
    let written = std::fs::read_to_string(log).unwrap_or_default();
    assert!(status.success(), "power {args:?} failed:\n{written}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_run_logs_no_secret_value_key_or_token() {
    homelab_autoscaler::tls::install_crypto_provider();
    let bin = e2e::operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler"))).expect("bin");
    let mut world = World::start_with_shared_certificate(&bin).await.expect("start the world");
    let _logs = world.plane.logs_on_failure();

    let outcome = world.manual_claim().await;
    eprintln!("{}", world.summary());
    outcome.expect("the scenario");

    // A smart plug's login and API token, unique to this run, in a Secret of the operator's
    // namespace, and a slot whose power driver reads them.
    let unique = format!("{}-{}", std::process::id(), jiff::Timestamp::now().as_nanosecond());
    let (user, password, token) =
        (format!("plug-admin-{unique}"), format!("s3cr3t-{unique}"), format!("t0ken-{unique}"));
    let plug = Recorder::start(200).await.expect("the plug");
    let power = plug_power(&plug, "plug-credentials");
    let manifest = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: plug-credentials\nstringData:\n  \
         username: {user}\n  password: {password}\n  token: {token}\n---\n\
         apiVersion: infra.homecluster.dev/v2alpha1\nkind: Node\nmetadata:\n  name: plug-1\n  \
         labels: {{ group: workers }}\nspec:\n  kubernetesNodeName: plug-1\n  power: {power}\n"
    );
    let applied = world.plane.kubectl_apply(NAMESPACE, &manifest).await.expect("kubectl apply");
    assert!(applied.status.success(), "{}", String::from_utf8_lossy(&applied.stderr));

    // As a person runs it: the slot and its Secret read with the admin's kubeconfig.
    let cli_log = world.logs_dir().join("power-cli.log");
    power_at_trace(&world, &["on", "--slot", "plug-1", "--namespace", NAMESPACE], &[], &cli_log)
        .await;
    // As a power Job's pod runs it: the settings in the environment, the Secret mounted.
    let mounted = tempfile::tempdir().expect("secrets dir");
    let secret_dir = mounted.path().join("plug-credentials");
    std::fs::create_dir_all(&secret_dir).expect("secret dir");
    for (key, value) in [("username", &user), ("password", &password), ("token", &token)] {
        std::fs::write(secret_dir.join(key), value).expect("mounted key");
    }
    let spec = power.to_string();
    let dir = mounted.path().to_string_lossy().into_owned();
    let job_env =
        [("HOMELAB_POWER_SPEC", spec.as_str()), ("HOMELAB_POWER_SECRETS_DIR", dir.as_str())];
    power_at_trace(&world, &["off"], &job_env, &world.logs_dir().join("power-job.log")).await;

    // The driver really read the Secret: the plug got the credentials, both times.
    let basic = format!("Basic {}", base64(format!("{user}:{password}").as_bytes()));
    let bearer = format!("Bearer {token}");
    let seen: Vec<(String, String)> = plug
        .header_values("authorization")
        .into_iter()
        .zip(plug.header_values("x-api-token"))
        .collect();
    assert_eq!(
        seen,
        vec![(basic.clone(), bearer.clone()), (basic.clone(), bearer.clone())],
        "the plug got the Secret's credentials from `power on --slot` and from the Job's `power off`"
    );

    let mut needles: Vec<(String, &str)> = vec![
        (password.clone(), "the plug's password"),
        (base64(password.as_bytes()), "the plug's password in base64"),
        (token.clone(), "the plug's API token"),
        (base64(token.as_bytes()), "the plug's API token in base64"),
        (basic.trim_start_matches("Basic ").to_string(), "the plug's Authorization header"),
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
    let mut files = Vec::new();
    for entry in std::fs::read_dir(world.logs_dir()).expect("log dir") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("log") {
            continue;
        }
        let log = std::fs::read_to_string(&path).expect("log");
        searched += log.len();
        files.push(path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
        for (needle, what) in &needles {
            assert!(!log.contains(needle.as_str()), "{} holds {what}", path.display());
        }
    }
    assert!(searched > 1000, "the run logged almost nothing ({searched} bytes): a broken search");
    for driver_log in ["power-cli.log", "power-job.log"] {
        assert!(files.iter().any(|f| f == driver_log), "{driver_log} was not searched: {files:?}");
    }
    eprintln!("searched {searched} bytes of logs for {} needles", needles.len());
}
