//! `homelab-autoscaler power on|off --slot X` as a person runs it: the built binary, the real
//! kube-apiserver, and an HTTP "smart plug" on 127.0.0.1 as the slot's power driver. Powering a
//! machine by hand goes against the model (a machine is wanted if and only if a live claim
//! holds its slot), so the command warns on stderr when it does and says what to do instead:
//! a ready-to-run Manual claim for `on`, deleting the claim for `off`. The claim it prints is
//! created with the real kubectl. In a power Job (`--spec`, no API access) nothing is read and
//! nothing is warned.

use homelab_autoscaler::api::{Group, Node, NodeClaim};
use homelab_harness::http::Recorder;
use homelab_harness::{Components, ControlPlane};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

/// The paths a smart plug on 127.0.0.1 was asked for, in order.
fn requests(plug: &Recorder) -> Vec<String> {
    plug.seen().into_iter().map(|s| s.uri).collect()
}

/// The output of one `homelab-autoscaler power ...` run.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

async fn power(plane: &ControlPlane, args: &[&str], extra_env: &[(&str, &str)]) -> Run {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_homelab-autoscaler"));
    command
        .arg("power")
        .args(args)
        .env_clear()
        .env("KUBECONFIG", plane.kubeconfig_path())
        .env("HOME", plane.dir().join("home"));
    for (key, value) in extra_env {
        command.env(key, value);
    }
    let output = command.output().await.expect("run homelab-autoscaler power");
    Run {
        ok: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

async fn kubectl(plane: &ControlPlane, args: &[&str]) -> String {
    let output = plane.kubectl(args).await.expect("run kubectl");
    assert!(
        output.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The heredoc body a warning prints: the lines between `<<'EOF'` and `EOF`.
fn heredoc(stderr: &str) -> String {
    let start = stderr.find("<<'EOF'\n").unwrap_or_else(|| panic!("no manifest in: {stderr}"));
    let body = &stderr[start + "<<'EOF'\n".len()..];
    let end = body.find("\nEOF").unwrap_or_else(|| panic!("unterminated manifest in: {stderr}"));
    body[..end].to_string()
}

fn power_spec(plug: &Recorder) -> Value {
    json!({
        "http": {
            "onRequest": { "url": format!("{}/on", plug.base) },
            "offRequest": { "url": format!("{}/off", plug.base) },
        },
    })
}

/// Group `pool` and its slot `box-1`, powered by `plug`, in `ns`.
async fn create_pool(plane: &ControlPlane, ns: &str, plug: &Recorder) {
    let client = plane.client().expect("client");
    let groups: Api<Group> = Api::namespaced(client.clone(), ns);
    let group = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
        "metadata": { "name": "pool" }, "spec": {},
    }))
    .expect("group");
    groups.create(&PostParams::default(), &group).await.expect("create the group");
    let slots: Api<Node> = Api::namespaced(client, ns);
    let slot = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
        "metadata": { "name": "box-1", "labels": { "group": "pool" } },
        "spec": { "kubernetesNodeName": "box-1", "power": power_spec(plug) },
    }))
    .expect("slot");
    slots.create(&PostParams::default(), &slot).await.expect("create the slot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_by_hand_warns_against_the_claims_and_names_what_to_do() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    plane.install_crds().await.expect("install CRDs");
    let client = plane.client().expect("client");
    let ns = plane.fresh_namespace("power-cli").await.expect("namespace");
    let plug = Recorder::start(200).await.expect("the plug");
    create_pool(plane, &ns, &plug).await;
    let target = ["--slot", "box-1", "--namespace", ns.as_str()];

    // `on` with no claim: it powers on, and warns that the operator will power it off again.
    let on = power(plane, &[&["on"][..], &target[..]].concat(), &[]).await;
    assert!(on.ok, "power on failed: {}", on.stderr);
    assert!(on.stdout.contains("on (http)"), "{}", on.stdout);
    assert_eq!(requests(&plug), ["/on"], "the machine is powered on all the same");
    assert!(on.stderr.contains("no live NodeClaim holds slot box-1"), "{}", on.stderr);
    assert!(on.stderr.contains("powers it off again"), "{}", on.stderr);
    assert!(on.stderr.contains("create a Manual claim"), "{}", on.stderr);
    assert!(
        on.stderr.contains(&format!("homelab-autoscaler keep-on --slot box-1 --namespace {ns}")),
        "the warning points at keep-on: {}",
        on.stderr
    );

    // The printed claim is ready to run: kubectl creates it as printed.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("claim.yaml");
    std::fs::write(&file, heredoc(&on.stderr)).expect("write the printed claim");
    let created =
        kubectl(plane, &["create", "-f", &file.display().to_string(), "-o", "json"]).await;
    let claim: Value = serde_json::from_str(&created).expect("claim json");
    let claim_name = claim["metadata"]["name"].as_str().expect("a generated name").to_string();
    assert_eq!(claim["metadata"]["namespace"], json!(ns), "{claim}");
    assert_eq!(claim["spec"]["slotRef"]["name"], json!("box-1"), "{claim}");
    assert_eq!(claim["spec"]["request"]["call"], json!("Manual"), "{claim}");
    assert_eq!(claim["spec"]["request"]["group"], json!("pool"), "{claim}");

    // With the claim live (no status yet reads as pending), `on` agrees with it: no warning.
    let on = power(plane, &[&["on"][..], &target[..]].concat(), &[]).await;
    assert!(on.ok, "power on failed: {}", on.stderr);
    assert!(!on.stderr.contains("warning"), "{}", on.stderr);

    // `off` under the live claim: it powers off, and says the claim still wants the machine.
    let off = power(plane, &[&["off"][..], &target[..]].concat(), &[]).await;
    assert!(off.ok, "power off failed: {}", off.stderr);
    assert_eq!(requests(&plug), ["/on", "/on", "/off"]);
    assert!(
        off.stderr
            .contains(&format!("live NodeClaim {claim_name} (phase pending) holds slot box-1")),
        "{}",
        off.stderr
    );
    assert!(
        off.stderr.contains(&format!("kubectl delete nodeclaim {claim_name} -n {ns}")),
        "{}",
        off.stderr
    );

    // The claim gone, `off` agrees with the claims: no warning.
    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), &ns);
    claims.delete(&claim_name, &DeleteParams::default()).await.expect("delete the claim");
    homelab_harness::eventually("the claim to be gone", std::time::Duration::from_secs(30), || {
        let claims = claims.clone();
        let name = claim_name.clone();
        async move {
            anyhow::ensure!(claims.get_opt(&name).await?.is_none(), "still there");
            Ok(())
        }
    })
    .await
    .expect("claim deleted");
    let off = power(plane, &[&["off"][..], &target[..]].concat(), &[]).await;
    assert!(off.ok, "power off failed: {}", off.stderr);
    assert!(!off.stderr.contains("warning"), "{}", off.stderr);
    assert_eq!(requests(&plug), ["/on", "/on", "/off", "/off"]);
}

/// A power Job's pod: settings from the environment, no API access. It powers the machine and
/// reads no claim, so it prints no warning and needs no cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_job_reads_no_claims() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let plug = Recorder::start(200).await.expect("the plug");
    let spec = power_spec(&plug).to_string();
    let run = power(
        plane,
        &["on"],
        &[("HOMELAB_POWER_SPEC", spec.as_str()), ("KUBECONFIG", "/nonexistent/kubeconfig")],
    )
    .await;
    assert!(run.ok, "power on failed: {}", run.stderr);
    assert_eq!(requests(&plug), ["/on"]);
    assert!(!run.stderr.contains("warning"), "{}", run.stderr);
}

/// A person whose kubeconfig may read the slot and its Secrets but not list claims: the command
/// still powers the machine, and skips the warning it cannot judge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_cannot_list_claims_still_powers_the_machine() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    plane.install_crds().await.expect("install CRDs");
    let ns = plane.fresh_namespace("power-cli-rbac").await.expect("namespace");
    let plug = Recorder::start(200).await.expect("the plug");
    create_pool(plane, &ns, &plug).await;
    kubectl(
        plane,
        &[
            "create",
            "role",
            "slot-reader",
            "-n",
            &ns,
            "--verb=get",
            "--resource=nodes.infra.homecluster.dev,secrets",
        ],
    )
    .await;
    kubectl(
        plane,
        &["create", "rolebinding", "slot-reader", "-n", &ns, "--role=slot-reader", "--user=bob"],
    )
    .await;
    // The admin's kubeconfig acting as bob, written as JSON (a kubeconfig may be either).
    let mut kubeconfig =
        kube::config::Kubeconfig::read_from(plane.kubeconfig_path()).expect("kubeconfig");
    for user in &mut kubeconfig.auth_infos {
        if let Some(auth) = user.auth_info.as_mut() {
            auth.impersonate = Some("bob".into());
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bob.kubeconfig");
    std::fs::write(&path, serde_json::to_string(&kubeconfig).expect("kubeconfig json"))
        .expect("write kubeconfig");
    let bob = path.display().to_string();

    // bob's rights are what the test says: the slot yes, the claims no.
    let can = |verb: &'static str, resource: &'static str| {
        let (bob, ns) = (bob.clone(), ns.clone());
        async move {
            let output = plane
                .kubectl(["auth", "can-i", verb, resource, "-n", &ns, "--kubeconfig", &bob])
                .await
                .expect("kubectl auth can-i");
            String::from_utf8_lossy(&output.stdout).trim().to_string()
        }
    };
    assert_eq!(can("get", "nodes.infra.homecluster.dev").await, "yes");
    assert_eq!(can("list", "nodeclaims.infra.homecluster.dev").await, "no");

    let run =
        power(plane, &["on", "--slot", "box-1", "--namespace", &ns], &[("KUBECONFIG", &bob)]).await;
    assert!(run.ok, "power on failed: {}", run.stderr);
    assert_eq!(requests(&plug), ["/on"]);
    assert!(!run.stderr.contains("warning"), "{}", run.stderr);
}
