//! A World's pool on real machines ([`crate::machine`]: a real kubelet and containerd in a
//! network namespace each), for `make demo MACHINES=real` and tests/real_machines_autoscaler.rs.
//!
//! The pool is an example's, as a user applies it, with one change: each slot's power is its
//! machine's own (Wake-on-LAN on, an SSH shutdown off) instead of the example's placeholder pod
//! specs. Each slot gets a machine named after its `kubernetesNodeName`, created when the pool
//! is applied. The power Jobs run the operator's image on an always-on machine, `lab`, which the
//! example's Jobs already select; the machines register with Cilium's bootstrap taint, which a
//! stand-in for Cilium's agent removes once the Node is Ready, as the agent does.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::{Node as CoreNode, Taint};
use kube::Client;
use kube::api::Api;
use serde_json::{Value, json};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::ControlPlane;
use crate::machine::{Lan, Machine, MachineSpec};
use crate::real_lab::{always_on, network_agent, pool_machine, secret, wake_and_ssh_power};

/// The bootstrap taint every machine of the pool registers with: the examples' readiness gate.
pub const AGENT_TAINT: &str = "node.cilium.io/agent-not-ready";
/// The label of the lab machine, which the examples' power Jobs select.
const LAB_ROLE: (&str, &str) = ("homelab.demo/role", "lab");
const API_VERSION: &str = "infra.homecluster.dev/v2alpha1";

/// The lan, the lab machine and the pool's machines, by name.
pub struct RealPool {
    // Field order is drop order: the agent stops, then the machines, the lab and the lan go.
    _agent: DropGuard,
    /// Each machine and the private key its sshd lets in, by name.
    machines: BTreeMap<String, (Machine, String)>,
    /// A `spec.power.suspend` every slot gets ([`RealPool::sleep_when_idle`]).
    suspend: Option<Value>,
    _lab: Machine,
    lan: Lan,
}

impl RealPool {
    /// A lan joined to `plane`, the lab machine on it (powered on, the operator's image
    /// imported), and the network agent's stand-in.
    pub async fn start(plane: &ControlPlane, client: &Client) -> Result<Self> {
        let lan = Lan::start(plane.api_address())?;
        let labels = BTreeMap::from([(LAB_ROLE.0.to_owned(), LAB_ROLE.1.to_owned())]);
        let lab = always_on(plane, &lan, "lab", labels).await.context("the lab machine")?;
        let agent = CancellationToken::new();
        network_agent(Api::<CoreNode>::all(client.clone()), AGENT_TAINT, agent.clone());
        Ok(Self {
            _agent: agent.drop_guard(),
            machines: BTreeMap::new(),
            suspend: None,
            _lab: lab,
            lan,
        })
    }

    /// Every slot of a pool applied from now on sleeps when idle: `suspend` becomes its
    /// `spec.power.suspend` (the machines' sshd puts a machine to sleep on a `suspend` command).
    /// `None`: they power off again.
    pub fn sleep_when_idle(&mut self, suspend: Option<Value>) {
        self.suspend = suspend;
    }

    /// The machine named `name`, once a pool has named it.
    pub fn machine(&self, name: &str) -> Option<&Machine> {
        self.machines.get(name).map(|(machine, _)| machine)
    }

    /// Every machine of the pool, by name.
    pub fn machines(&self) -> impl Iterator<Item = &Machine> {
        self.machines.values().map(|(machine, _)| machine)
    }

    /// `objects` (kubectl's JSON of a manifest: objects one after another, or a List) with each
    /// slot's pod specs replaced by its machine's power, creating the machines it names, and a
    /// Secret per slot with the key its SSH shutdown logs in with. Returns a List to apply.
    pub async fn realize(&mut self, plane: &ControlPlane, objects: &str) -> Result<Value> {
        let mut items = Vec::new();
        for object in serde_json::Deserializer::from_str(objects).into_iter::<Value>() {
            let object = object.context("kubectl's JSON")?;
            match object.get("items").and_then(Value::as_array) {
                Some(listed) if object["kind"] == "List" => items.extend(listed.iter().cloned()),
                _ => items.push(object),
            }
        }
        let mut realized = Vec::new();
        for mut item in items {
            if item["apiVersion"] == API_VERSION && item["kind"] == "Node" {
                let secret = self.power_slot(plane, &mut item).await?;
                realized.push(secret);
            }
            realized.push(item);
        }
        Ok(json!({ "apiVersion": "v1", "kind": "List", "items": realized }))
    }

    /// Gives `slot` its machine's power in place of its pod specs; returns the SSH key's Secret.
    async fn power_slot(&mut self, plane: &ControlPlane, slot: &mut Value) -> Result<Value> {
        let name = slot["spec"]["kubernetesNodeName"].as_str().unwrap_or_default().to_owned();
        if name.is_empty() {
            bail!("slot {} has no kubernetesNodeName", slot["metadata"]["name"]);
        }
        let spec = slot["spec"].as_object_mut().context("a slot's spec")?;
        // The example's Jobs run where it says (the lab); the same place runs the power Jobs.
        let selector = spec
            .get("startupPodSpec")
            .and_then(|pod| pod.get("nodeSelector"))
            .cloned()
            .unwrap_or_else(|| json!({ LAB_ROLE.0: LAB_ROLE.1 }));
        spec.remove("startupPodSpec");
        spec.remove("shutdownPodSpec");
        let (machine, key) = self.machine_for(plane, &name).await?;
        let secret_name = format!("{name}-ssh");
        let mut power = wake_and_ssh_power(&machine, &secret_name, selector)?;
        if let Some(suspend) = &self.suspend {
            power["suspend"] = suspend.clone();
        }
        spec.insert("power".into(), power);
        Ok(secret(&secret_name, "ssh-privatekey", &key))
    }

    /// The machine named `name` and the key its sshd lets in: created powered off, with a fresh
    /// key, the first time a pool names it.
    async fn machine_for(&mut self, plane: &ControlPlane, name: &str) -> Result<(Machine, String)> {
        if let Some(known) = self.machines.get(name) {
            return Ok(known.clone());
        }
        let taint =
            Taint { key: AGENT_TAINT.into(), effect: "NoExecute".into(), ..Taint::default() };
        let spec = MachineSpec { taints: vec![taint], ..MachineSpec::named(name) };
        let (machine, key) = pool_machine(plane, &self.lan, spec).await?;
        self.machines.insert(name.to_owned(), (machine.clone(), key.clone()));
        Ok((machine, key))
    }
}
