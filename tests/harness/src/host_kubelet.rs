//! A node whose pods run as processes on the test host: for a Job whose effect the test must
//! see in a real peer on this host (a maintenance step that sets a flag in the test's Ceph
//! cluster). kwok's pods run nothing; this kubelet runs each pod's one container as a kubelet
//! would: its command and args with `$(VAR)` references expanded from its environment, that
//! environment (plus the host's `PATH`), to its exit, reported as the pod's phase and the
//! container's exit code.
//!
//! What a real kubelet does that this one does not, and refuses rather than pretends: images
//! (the command runs from the host's own programs), volumes, `valueFrom` environment, more than
//! one container. Such a pod fails with the reason in its status. The Node carries no kwok
//! annotation, so kwok leaves it and its pods alone; this kubelet keeps it Ready with a
//! heartbeat, as kube-controller-manager expects of a live one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use anyhow::{Context as _, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::process::Command;
use tokio::task::JoinHandle;

/// How often the Node's Ready condition is renewed; well inside kube-controller-manager's 20 s
/// grace.
const BEAT: Duration = Duration::from_secs(2);

/// A running host kubelet; its Node is deleted by [`HostKubelet::remove`], and its loop ends
/// when it is dropped.
pub struct HostKubelet {
    name: String,
    nodes: Api<Node>,
    task: JoinHandle<()>,
}

impl HostKubelet {
    /// Registers Node `name` with `labels`, Ready, and starts running the pods bound to it;
    /// `env` is added to every container's environment (what the host's programs need, such
    /// as a config file's path).
    pub async fn start(
        client: Client,
        name: &str,
        labels: BTreeMap<String, String>,
        env: Vec<(String, String)>,
    ) -> Result<HostKubelet> {
        let nodes: Api<Node> = Api::all(client.clone());
        let mut all_labels = BTreeMap::from([("kubernetes.io/hostname".into(), name.to_owned())]);
        all_labels.extend(labels);
        let node: Node = serde_json::from_value(json!({
            "metadata": { "name": name, "labels": all_labels },
        }))?;
        nodes
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("registering the host kubelet's Node {name}"))?;
        heartbeat(&nodes, name, true).await?;
        let (node_name, node_api) = (name.to_owned(), nodes.clone());
        let task = tokio::spawn(async move {
            // The pods bound to the node, as a kubelet watches them.
            let bound = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
            let mut pods =
                watcher(Api::<Pod>::all(client.clone()), bound).default_backoff().boxed();
            let mut beat = tokio::time::interval(BEAT);
            let mut started = BTreeSet::new();
            loop {
                tokio::select! {
                    _ = beat.tick() => {
                        if let Err(error) = heartbeat(&node_api, &node_name, false).await {
                            eprintln!("host kubelet {node_name}: heartbeat: {error:#}");
                        }
                    }
                    event = pods.next() => match event {
                        Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => {
                            sync_pod(&client, pod, &env, &mut started).await;
                        }
                        Some(Ok(_)) => {}
                        Some(Err(error)) => eprintln!("host kubelet {node_name}: pods: {error:#}"),
                        None => return,
                    },
                }
            }
        });
        Ok(HostKubelet { name: name.to_owned(), nodes, task })
    }

    /// Stops the kubelet and deletes its Node.
    pub async fn remove(self) -> Result<()> {
        self.task.abort();
        self.nodes
            .delete(&self.name, &DeleteParams::default())
            .await
            .with_context(|| format!("deleting Node {}", self.name))?;
        Ok(())
    }
}

impl Drop for HostKubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Posts the Node's status as a live kubelet does: Ready, room for pods. Only the first post
/// (`registering`) sets when it turned Ready; the later ones move the heartbeat alone.
async fn heartbeat(nodes: &Api<Node>, name: &str, registering: bool) -> Result<()> {
    let now = jiff::Timestamp::now().to_string();
    let capacity = json!({ "cpu": "8", "memory": "16Gi", "pods": "110" });
    let mut ready = json!({
        "type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "the host kubelet of the test harness runs pods as host processes",
        "lastHeartbeatTime": now,
    });
    if registering {
        ready["lastTransitionTime"] = json!(now);
    }
    // Kubernetes names architectures as Go does.
    let architecture = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let status = json!({ "status": {
        "conditions": [ready],
        "capacity": capacity, "allocatable": capacity,
        "nodeInfo": {
            "architecture": architecture, "operatingSystem": "linux",
            "kubeletVersion": "host", "kubeProxyVersion": "", "containerRuntimeVersion": "host",
            "kernelVersion": "", "osImage": "", "machineID": "", "systemUUID": "", "bootID": "",
        },
    } });
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&status))
        .await
        .with_context(|| format!("posting Node {name}'s status"))?;
    Ok(())
}

/// Starts a pod bound to the node that has not started yet, in a task of its own that reports
/// its end; lets go of a deleted one.
async fn sync_pod(
    client: &Client,
    pod: Pod,
    env: &[(String, String)],
    started: &mut BTreeSet<String>,
) {
    let (Some(ns), Some(uid)) = (pod.namespace(), pod.uid()) else { return };
    let name = pod.name_any();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    if pod.metadata.deletion_timestamp.is_some() {
        // The kubelet confirms the deletion; a step still running is left to end on its own
        // (these are short commands), as no container runtime can stop it.
        api.delete(&name, &DeleteParams::default().grace_period(0)).await.ok();
        return;
    }
    if !started.insert(uid) {
        return;
    }
    let env = env.to_vec();
    tokio::spawn(async move {
        if let Err(error) = run_pod(&api, &pod, &env).await {
            eprintln!("host kubelet: pod {name}: {error:#}");
        }
    });
}

/// Runs the pod's container to its end and reports it: Running, then Succeeded or Failed.
async fn run_pod(api: &Api<Pod>, pod: &Pod, extra_env: &[(String, String)]) -> Result<()> {
    let name = pod.name_any();
    let Some(container) = runnable(pod) else {
        let why = "the host kubelet runs one container without volumes or valueFrom environment";
        return report(api, &name, pod, Err((127, why.to_owned()))).await;
    };
    let mut env: HashMap<String, String> = extra_env.iter().cloned().collect();
    for var in container.env.iter().flatten() {
        env.insert(var.name.clone(), var.value.clone().unwrap_or_default());
    }
    let mut argv: Vec<String> = container.command.iter().flatten().cloned().collect();
    argv.extend(container.args.iter().flatten().cloned());
    let argv: Vec<String> = argv.iter().map(|a| expand(a, &env)).collect();
    let Some((program, args)) = argv.split_first() else {
        return report(api, &name, pod, Err((127, "no command".into()))).await;
    };
    let started = jiff::Timestamp::now().to_string();
    let running = json!({ "status": { "phase": "Running", "startTime": started } });
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&running)).await?;
    let output = Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(&env)
        .kill_on_drop(true)
        .output()
        .await;
    let result = match output {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err((
            out.status.code().unwrap_or(137),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )),
        Err(error) => Err((127, format!("{program}: {error}"))),
    };
    report(api, &name, pod, result).await
}

/// The pod's one container, if this kubelet can run it.
fn runnable(pod: &Pod) -> Option<&Container> {
    let spec = pod.spec.as_ref()?;
    let service_account_volume_only = spec
        .volumes
        .iter()
        .flatten()
        .all(|v| v.projected.is_some() && v.name.starts_with("kube-api-access"));
    let [container] = spec.containers.as_slice() else { return None };
    let plain_env = container.env.iter().flatten().all(|e| e.value_from.is_none());
    (service_account_volume_only && plain_env).then_some(container)
}

/// Reports the container's end: Succeeded with exit code 0, or Failed with its code and words.
async fn report(
    api: &Api<Pod>,
    name: &str,
    pod: &Pod,
    result: Result<(), (i32, String)>,
) -> Result<()> {
    let container = pod.spec.as_ref().and_then(|s| s.containers.first());
    let (phase, code, message) = match &result {
        Ok(()) => ("Succeeded", 0, String::new()),
        Err((code, message)) => ("Failed", *code, message.clone()),
    };
    let now = jiff::Timestamp::now().to_string();
    let status = json!({ "status": {
        "phase": phase,
        "message": message,
        "containerStatuses": [{
            "name": container.map(|c| c.name.clone()).unwrap_or_default(),
            "image": container.and_then(|c| c.image.clone()).unwrap_or_default(),
            "imageID": "", "ready": false, "restartCount": 0,
            "state": { "terminated": {
                "exitCode": code, "message": message, "startedAt": now, "finishedAt": now,
                "reason": if code == 0 { "Completed" } else { "Error" },
            } },
        }],
    } });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("reporting pod {name} {phase}"))?;
    Ok(())
}

/// Expands `$(NAME)` from `env` as a kubelet does: an unknown name stays as written, and
/// `$$` is a literal `$`.
fn expand(text: &str, env: &HashMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some((name, tail)) =
            after.strip_prefix('(').and_then(|inner| inner.split_once(')'))
            && let Some(value) = env.get(name)
        {
            out.push_str(value);
            rest = tail;
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_references_as_a_kubelet_does() {
        let env = HashMap::from([("SLOT".to_owned(), "m0".to_owned())]);
        for (written, run) in [
            ("$(SLOT)", "m0"),
            ("host=$(SLOT).lan", "host=m0.lan"),
            ("$(OTHER)", "$(OTHER)"),
            ("$$(SLOT)", "$(SLOT)"),
            ("cost $5", "cost $5"),
            ("$", "$"),
        ] {
            assert_eq!(expand(written, &env), run, "{written}");
        }
    }
}
