//! A seeded fault run on real machines: demand steps and faults at random moments, from a seed
//! that replays the same schedule, against a World whose pool is real machines; the invariants
//! of a safe power-off are watched for the whole run, not only at its end.
//!
//! The faults are those a homelab meets: a cable pulled and plugged back (a switch reboot, a
//! Wi-Fi drop), a power cut, the operator SIGKILLed and started again, kube-apiserver restarted
//! in place, containerd stopped by hand for a while. Nothing here presses a machine's power
//! button to help the operator: a power-cut machine stays off until the operator wakes it.
//!
//! Watched throughout ([`Invariants`]):
//! - a machine on, its kubelet running, with no Node after it had one in that power-on (a Node
//!   deleted under its kubelet; the kubelet's Lease goes with its Node, docs/decisions.md D28,
//!   so this is also the "no Lease renewed by a kubelet without its Node" check);
//! - two live claims on one slot;
//! - a machine shut down by its OS while a ready claim, not marked for scale-down, wanted it;
//! - [`crate::invariants::Ledger`]'s checks (two claims booting on one slot).
//!
//! Once the faults stop and every cable and service is back, the pool must converge: the
//! workload's pods running on exactly as many machines as they ask for, every other machine
//! off, and [`crate::invariants::settled`] true.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use futures::StreamExt;
use homelab_autoscaler::api::{LABEL_GROUP, NodeClaim};
use homelab_autoscaler::phase;
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod};
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use crate::e2e::{NAMESPACE, World};
use crate::invariants::{self, Bounds, Ledger};
use crate::machine::{Machine, PAUSE_IMAGE, PowerCause, PowerState};
use crate::real_lab::{Stranding, hosts_running};
use crate::seeded::Rng;
use crate::seeded::env_number;

/// How long the converged pool must stay so: longer than the pools' hold (examples/pool.yaml,
/// 15 s) and a drain, so that a machine about to be released would be seen going.
const HELD: Duration = Duration::from_secs(45);

/// The run in `make test`: this seed's four minutes hold every kind of step.
pub const SHORT_RUN_SEED: u64 = 18;
pub const SHORT_RUN_MINUTES: u64 = 4;

/// Once the faults stop: a machine that was cut off or silent for a boot window, its claim
/// failed, a fresh claim's boot and gate, and a released machine's hold, drain and shutdown.
const CONVERGE: Duration = Duration::from_secs(600);

/// The workload the demand steps scale: one pod per machine (anti-affinity), in `default`.
pub const WORKLOAD: &str = "web";

/// One step of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// The workload scaled to this many pods (one per machine).
    Demand(u32),
    /// A machine's cable pulled, plugged back after `for_`.
    CutLink { machine: usize, for_: Duration },
    /// The power of the `on`-th machine that is on (counted round) cut: every process killed
    /// at once; it stays off until woken.
    PowerCut { on: usize },
    /// The operator SIGKILLed and started again in place.
    KillOperator,
    /// kube-apiserver SIGKILLed and started again in place.
    RestartApiserver,
    /// The containerd of the `on`-th machine that is on (counted round) stopped by hand,
    /// started again after `for_`.
    StopContainerd { on: usize, for_: Duration },
}

impl Action {
    /// The fault's kind, for a schedule's coverage.
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Demand(_) => "demand",
            Action::CutLink { .. } => "link cut",
            Action::PowerCut { .. } => "power cut",
            Action::KillOperator => "operator killed",
            Action::RestartApiserver => "kube-apiserver restarted",
            Action::StopContainerd { .. } => "containerd stopped",
        }
    }
}

/// A step: `action`, `after` the previous step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub after: Duration,
    pub action: Action,
}

/// Every step of a run, from its seed alone.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub seed: u64,
    pub steps: Vec<Step>,
}

impl Schedule {
    /// Steps 5–40 s apart for `length`, on a pool of `machines`. The first step asks for at
    /// least one machine, so that the faults find something to hit.
    pub fn new(seed: u64, length: Duration, machines: usize) -> Self {
        let mut rng = Rng::new(seed);
        let top = u32::try_from(machines).unwrap_or(u32::MAX);
        let mut steps = vec![Step {
            after: Duration::ZERO,
            action: Action::Demand(1 + pick(&mut rng, top.saturating_sub(1))),
        }];
        let mut elapsed = Duration::ZERO;
        loop {
            let after = rng.seconds(5, 40);
            elapsed += after;
            if elapsed > length {
                break;
            }
            let machine = pick(&mut rng, top.saturating_sub(1)) as usize;
            let action = match rng.up_to(99) {
                0..30 => Action::Demand(pick(&mut rng, top)),
                30..50 => Action::CutLink { machine, for_: rng.seconds(10, 90) },
                50..60 => Action::PowerCut { on: machine },
                60..75 => Action::KillOperator,
                75..85 => Action::RestartApiserver,
                _ => Action::StopContainerd { on: machine, for_: rng.seconds(10, 60) },
            };
            steps.push(Step { after, action });
        }
        Self { seed, steps }
    }

    /// The kinds of step the schedule holds.
    pub fn kinds(&self) -> BTreeSet<&'static str> {
        self.steps.iter().map(|s| s.action.kind()).collect()
    }

    /// The demand the last demand step leaves.
    pub fn final_demand(&self) -> u32 {
        self.steps
            .iter()
            .filter_map(|s| match s.action {
                Action::Demand(n) => Some(n),
                _ => None,
            })
            .next_back()
            .unwrap_or(0)
    }
}

fn pick(rng: &mut Rng, max: u32) -> u32 {
    u32::try_from(rng.up_to(u64::from(max))).unwrap_or(max)
}

/// An action as the run's log says it, naming the machine.
struct Said<'a>(&'a Action, &'a [Machine]);

impl fmt::Display for Said<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |i: &usize| self.1.get(*i).map_or("?", Machine::name);
        match self.0 {
            Action::Demand(n) => write!(f, "demand {n}"),
            Action::CutLink { machine, for_ } => {
                write!(f, "cable of {} pulled for {} s", name(machine), for_.as_secs())
            }
            Action::PowerCut { on } => write!(f, "power of the machine on #{on} cut"),
            Action::KillOperator => write!(f, "operator SIGKILLed and started again"),
            Action::RestartApiserver => write!(f, "kube-apiserver SIGKILLed and started again"),
            Action::StopContainerd { on, for_ } => {
                write!(f, "containerd of the machine on #{on} stopped for {} s", for_.as_secs())
            }
        }
    }
}

/// The invariants a run keeps, watched while it goes on. Each holds the violations seen.
pub struct Invariants {
    stranded: Vec<(String, Stranding)>,
    /// The namespace's claims as the watch last saw them.
    claims: Arc<Mutex<BTreeMap<String, NodeClaim>>>,
    seen: Arc<Mutex<BTreeMap<&'static str, Vec<String>>>>,
    ledger: Ledger,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

const STRANDED: &str = "a machine on without its Node";
const TWO_LIVE: &str = "two live claims on one slot";
const OFF_WHILE_WANTED: &str = "a machine shut down while a ready claim wanted it";
const LEDGER: &str = "the claim ledger (two claims booting on one slot)";

impl Drop for Invariants {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Invariants {
    /// Starts watching namespace `ns`'s claims and `machines` (each the machine of the slot of
    /// its name).
    pub async fn watch(client: &Client, ns: &str, machines: &[Machine]) -> Result<Self> {
        let nodes: Api<CoreNode> = Api::all(client.clone());
        let stranded = machines
            .iter()
            .map(|m| (m.name().to_owned(), Stranding::watch(m.clone(), nodes.clone())))
            .collect();
        let seen: Arc<Mutex<BTreeMap<&'static str, Vec<String>>>> = Arc::default();
        let claims: Arc<Mutex<BTreeMap<String, NodeClaim>>> = Arc::default();
        let mut tasks = vec![tokio::spawn(watch_claims(
            Api::namespaced(client.clone(), ns),
            claims.clone(),
            seen.clone(),
        ))];
        for machine in machines {
            tasks.push(tokio::spawn(watch_shutdowns(
                machine.clone(),
                claims.clone(),
                seen.clone(),
            )));
        }
        let ledger = Ledger::start(client, ns).await?;
        Ok(Self { stranded, claims, seen, ledger, tasks })
    }

    /// Every live claim as `slot phase`, in slot order.
    pub fn live_claims(&self) -> Vec<String> {
        let held = self.claims.lock().map(|c| c.clone()).unwrap_or_default();
        let mut live: Vec<String> = held
            .values()
            .filter(|c| phase::is_live(Some(phase::of(c))))
            .map(|c| {
                let marked = if phase::is_marked(c) { " (released)" } else { "" };
                format!("{} {:?}{marked}", c.spec.slot_ref.name, phase::of(c)).to_lowercase()
            })
            .collect();
        live.sort();
        live
    }

    /// Every invariant with the violations seen so far (none, when the run is sound).
    pub fn report(&self) -> BTreeMap<&'static str, Vec<String>> {
        let mut report = self.seen.lock().map(|s| s.clone()).unwrap_or_default();
        for name in [STRANDED, TWO_LIVE, OFF_WHILE_WANTED, LEDGER] {
            report.entry(name).or_default();
        }
        for (machine, watch) in &self.stranded {
            let seen = watch.seen();
            if let (Some(first), Some(entry)) = (seen.first(), report.get_mut(STRANDED)) {
                entry.push(format!("{machine}: {} moments, the first {first}", seen.len()));
            }
        }
        if let Some(entry) = report.get_mut(LEDGER) {
            entry.extend(self.ledger.violations());
        }
        report
    }
}

fn record(
    seen: &Mutex<BTreeMap<&'static str, Vec<String>>>,
    invariant: &'static str,
    what: String,
) {
    if let Ok(mut seen) = seen.lock() {
        let entry = seen.entry(invariant).or_default();
        if !entry.contains(&what) {
            entry.push(what);
        }
    }
}

/// Keeps `claims` as the API holds them, and records any moment two of them are live on one
/// slot.
async fn watch_claims(
    api: Api<NodeClaim>,
    claims: Arc<Mutex<BTreeMap<String, NodeClaim>>>,
    seen: Arc<Mutex<BTreeMap<&'static str, Vec<String>>>>,
) {
    let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
    let mut relisted = BTreeMap::new();
    while let Some(event) = events.next().await {
        let Ok(mut held) = claims.lock() else { return };
        match event {
            Ok(watcher::Event::Apply(claim)) => {
                held.insert(claim.name_any(), claim);
            }
            Ok(watcher::Event::Delete(claim)) => {
                held.remove(&claim.name_any());
            }
            Ok(watcher::Event::Init) => relisted.clear(),
            Ok(watcher::Event::InitApply(claim)) => {
                relisted.insert(claim.name_any(), claim);
            }
            Ok(watcher::Event::InitDone) => *held = std::mem::take(&mut relisted),
            Err(_) => continue,
        }
        let mut live: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for claim in held.values().filter(|c| phase::is_live(Some(phase::of(c)))) {
            live.entry(&claim.spec.slot_ref.name)
                .or_default()
                .push(claim.metadata.name.as_deref().unwrap_or_default());
        }
        for (slot, names) in live.into_iter().filter(|(_, names)| names.len() > 1) {
            record(&seen, TWO_LIVE, format!("{}: slot {slot}: {names:?}", jiff::Timestamp::now()));
        }
    }
}

/// Records every orderly shutdown of `machine` (its OS's, the SSH command's) that happened
/// while a ready claim of its slot, not marked for scale-down, wanted it. A power cut is the
/// run's own fault, not the operator's act.
async fn watch_shutdowns(
    machine: Machine,
    claims: Arc<Mutex<BTreeMap<String, NodeClaim>>>,
    seen: Arc<Mutex<BTreeMap<&'static str, Vec<String>>>>,
) {
    let mut judged = 0;
    loop {
        let history = machine.power_history();
        for event in history.iter().skip(judged) {
            if (event.state, event.cause) != (PowerState::Off, PowerCause::Shutdown) {
                continue;
            }
            let Ok(held) = claims.lock() else { return };
            let wanting: Vec<String> = held
                .values()
                .filter(|c| c.spec.slot_ref.name == machine.name())
                .filter(|c| {
                    phase::of(c) == homelab_autoscaler::api::NodeClaimPhase::Ready
                        && !phase::is_marked(c)
                })
                .map(ResourceExt::name_any)
                .collect();
            if !wanting.is_empty() {
                record(
                    &seen,
                    OFF_WHILE_WANTED,
                    format!(
                        "{}: {} off, wanted by {wanting:?}",
                        jiff::Timestamp::now(),
                        machine.name()
                    ),
                );
            }
        }
        judged = history.len();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What a run did and found.
pub struct Outcome {
    pub log: Vec<String>,
    pub invariants: BTreeMap<&'static str, Vec<String>>,
    /// Why the pool did not converge once the faults stopped, if it did not.
    pub converged: Result<(), String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.converged.is_ok() && self.invariants.values().all(Vec::is_empty)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.log {
            writeln!(f, "  {line}")?;
        }
        writeln!(f, "invariants (violations):")?;
        for (invariant, seen) in &self.invariants {
            writeln!(f, "  {invariant}: {}", seen.len())?;
            for what in seen {
                writeln!(f, "    {what}")?;
            }
        }
        match &self.converged {
            Ok(()) => writeln!(f, "converged to the demand once the faults stopped"),
            Err(why) => writeln!(f, "did NOT converge once the faults stopped: {why}"),
        }
    }
}

/// What a step did.
enum Effect {
    Applied,
    /// It hit this machine.
    Hit(String),
    /// It hit nothing, for this reason.
    Skipped(&'static str),
}

/// The faults still in effect, so that the end of the run can undo them: a machine's cable or
/// containerd comes back when the generation that took it is still the latest.
#[derive(Default)]
struct Undo {
    generation: AtomicU64,
    cable_cut: Mutex<BTreeMap<usize, u64>>,
    containerd_stopped: Mutex<BTreeMap<usize, (u64, u32)>>,
}

impl Undo {
    fn next(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Takes the mark of `machine` in `marks` if `generation` (any, when `None`) still holds it.
    fn take<V: Copy>(
        marks: &Mutex<BTreeMap<usize, V>>,
        machine: usize,
        generation: Option<u64>,
        of: impl Fn(V) -> u64,
    ) -> Option<V> {
        let mut marks = marks.lock().ok()?;
        let mark = *marks.get(&machine)?;
        if generation.is_some_and(|g| g != of(mark)) {
            return None;
        }
        marks.remove(&machine)
    }
}

/// A run over `world`, whose pool's machines are `machines`, its workload [`WORKLOAD`]
/// selecting Group `group`.
pub struct FaultRun<'a> {
    world: &'a mut World,
    machines: Vec<Machine>,
    undo: Arc<Undo>,
    started: Instant,
    log: Vec<String>,
}

impl<'a> FaultRun<'a> {
    /// Creates the workload (no pods yet) through kubectl, as a user writes it: one pod per
    /// machine by anti-affinity, on Group `group`'s machines, moved off a silent machine after
    /// 30 s (a user's setting: the default five minutes would outlast the run's steps).
    pub async fn start(world: &'a mut World, machines: Vec<Machine>, group: &str) -> Result<Self> {
        let manifest = format!(
            r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {WORKLOAD}
spec:
  replicas: 0
  selector:
    matchLabels: {{ app: {WORKLOAD} }}
  template:
    metadata:
      labels: {{ app: {WORKLOAD} }}
    spec:
      nodeSelector: {{ "{LABEL_GROUP}": "{group}" }}
      terminationGracePeriodSeconds: 0
      tolerations:
        - {{ key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 30 }}
        - {{ key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 30 }}
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - labelSelector: {{ matchLabels: {{ app: {WORKLOAD} }} }}
              topologyKey: kubernetes.io/hostname
      containers:
        - name: app
          image: {PAUSE_IMAGE}
          imagePullPolicy: Never
          resources: {{ requests: {{ cpu: 100m }} }}
"#
        );
        let output = world.plane.kubectl_apply("default", &manifest).await?;
        ensure!(
            output.status.success(),
            "kubectl apply of the workload: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(Self { world, machines, undo: Arc::default(), started: Instant::now(), log: Vec::new() })
    }

    fn note(&mut self, what: String) {
        let at = self.started.elapsed().as_secs();
        let line = format!("+{}:{:02} {what}", at / 60, at % 60);
        eprintln!("[fault run] {line}");
        self.log.push(line);
    }

    /// Runs `schedule`, undoes what is still in effect, waits for the pool to converge within
    /// `converge`, and reports.
    pub async fn run(mut self, schedule: &Schedule, converge: Duration) -> Result<Outcome> {
        let invariants = Invariants::watch(&self.world.client, NAMESPACE, &self.machines).await?;
        self.note(format!(
            "seed {}: {} steps on {} machines ({})",
            schedule.seed,
            schedule.steps.len(),
            self.machines.len(),
            self.machines.iter().map(Machine::name).collect::<Vec<_>>().join(", ")
        ));
        for step in &schedule.steps {
            tokio::time::sleep(step.after).await;
            let said = Said(&step.action, &self.machines).to_string();
            let did = match self.act(&step.action).await {
                Ok(Effect::Applied) => said,
                Ok(Effect::Hit(machine)) => format!("{said}: {machine}"),
                Ok(Effect::Skipped(why)) => format!("{said}: skipped, {why}"),
                Err(error) => format!("{said}: FAILED to inject: {error:#}"),
            };
            let state = self.state(&invariants).await;
            self.note(format!("{did} [{state}]"));
        }
        self.undo_all().await;
        let demand = schedule.final_demand();
        self.note(format!("faults stopped; every cable and containerd back; demand {demand}"));
        let converged = self.converged(demand, converge).await.map_err(|e| format!("{e:#}"));
        if converged.is_ok() {
            self.note("converged".into());
        }
        let settled =
            invariants::until_settled(&self.world.client, NAMESPACE, Bounds::default(), converge)
                .await;
        let converged = converged.and(settled.map_err(|e| format!("not settled: {e:#}")));
        Ok(Outcome { log: self.log, invariants: invariants.report(), converged })
    }

    /// Carries out `action`; says what it hit, or why it hit nothing (no machine is on).
    async fn act(&mut self, action: &Action) -> Result<Effect> {
        match action {
            Action::Demand(n) => self.world.scale(WORKLOAD, i32::try_from(*n)?).await?,
            Action::CutLink { machine, for_ } => {
                let m = self.machines.get(*machine).cloned().context("no such machine")?;
                m.link().cut()?;
                let generation = self.undo.next();
                if let Ok(mut cut) = self.undo.cable_cut.lock() {
                    cut.insert(*machine, generation);
                }
                let (undo, i, for_) = (self.undo.clone(), *machine, *for_);
                tokio::spawn(async move {
                    tokio::time::sleep(for_).await;
                    if Undo::take(&undo.cable_cut, i, Some(generation), |g| g).is_some() {
                        let _ = m.link().restore();
                    }
                });
            }
            Action::PowerCut { on } => {
                let Some((_, m)) = self.nth_on(*on).await else {
                    return Ok(Effect::Skipped("no machine is on"));
                };
                m.power_cut().await?;
                return Ok(Effect::Hit(m.name().to_owned()));
            }
            Action::KillOperator => self.world.restart_replica(0).await?,
            Action::RestartApiserver => self.world.plane.restart_apiserver().await?,
            Action::StopContainerd { on, for_ } => {
                let Some((i, m)) = self.nth_on(*on).await else {
                    return Ok(Effect::Skipped("no machine is on"));
                };
                if self.undo.containerd_stopped.lock().is_ok_and(|s| s.contains_key(&i)) {
                    return Ok(Effect::Skipped("its containerd is stopped already"));
                }
                m.stop_containerd().await?;
                let generation = self.undo.next();
                if let Ok(mut stopped) = self.undo.containerd_stopped.lock() {
                    stopped.insert(i, (generation, m.boots()));
                }
                let (undo, for_, name) = (self.undo.clone(), *for_, m.name().to_owned());
                tokio::spawn(async move {
                    tokio::time::sleep(for_).await;
                    if let Some((_, boot)) =
                        Undo::take(&undo.containerd_stopped, i, Some(generation), |(g, _)| g)
                    {
                        start_containerd_of_boot(&m, boot).await;
                    }
                });
                return Ok(Effect::Hit(name));
            }
        }
        Ok(Effect::Applied)
    }

    /// The machines that are on and the live claims, for the log.
    async fn state(&self, invariants: &Invariants) -> String {
        let mut on = Vec::new();
        for m in &self.machines {
            if m.power_state_now() == PowerState::On {
                on.push(m.name());
            }
        }
        format!("on: {}; claims: {}", on.join(", "), invariants.live_claims().join(", "))
    }

    /// The `n`-th (counted round) of the machines that are on, with its index.
    async fn nth_on(&self, n: usize) -> Option<(usize, Machine)> {
        let mut on = Vec::new();
        for (i, m) in self.machines.iter().enumerate() {
            if m.power_state().await == PowerState::On {
                on.push((i, m.clone()));
            }
        }
        let count = on.len();
        (count > 0).then(|| on.swap_remove(n % count))
    }

    /// Plugs every cable back in and starts every containerd still stopped.
    async fn undo_all(&mut self) {
        for (i, m) in self.machines.iter().enumerate() {
            if Undo::take(&self.undo.cable_cut, i, None, |g| g).is_some() {
                let _ = m.link().restore();
            }
            if let Some((_, boot)) = Undo::take(&self.undo.containerd_stopped, i, None, |(g, _)| g)
            {
                start_containerd_of_boot(m, boot).await;
            }
        }
    }

    /// The workload runs `demand` pods, each on a Ready machine of its own, and every machine
    /// that serves none is off: reached within `within`, and still so [`HELD`] later.
    async fn converged(&self, demand: u32, within: Duration) -> Result<()> {
        let what = format!("the pool serving {demand} pods, every other machine off");
        crate::eventually(&what, within, || self.serving(demand)).await?;
        crate::stays(&what, HELD, || self.serving(demand)).await
    }

    async fn serving(&self, demand: u32) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.world.client.clone(), "default");
        let nodes: Api<CoreNode> = Api::all(self.world.client.clone());
        let hosts = hosts_running(&pods, WORKLOAD).await?;
        let mut serving = BTreeSet::new();
        for host in &hosts {
            if nodes.get_opt(host).await?.as_ref().is_some_and(crate::is_ready) {
                serving.insert(host.clone());
            }
        }
        let on: BTreeSet<String> = self
            .machines
            .iter()
            .filter(|m| m.power_state_now() == PowerState::On)
            .map(|m| m.name().to_owned())
            .collect();
        ensure!(
            serving.len() == demand as usize && on == serving,
            "pods running on Ready machines {serving:?}, machines on {on:?}, demand {demand}"
        );
        Ok(())
    }
}

/// Starts containerd again on `machine` if it still runs the boot it was stopped in (a machine
/// cut and woken since has a containerd of its own).
async fn start_containerd_of_boot(machine: &Machine, boot: u32) {
    if machine.boots() == boot && machine.power_state().await == PowerState::On {
        let _ = machine.start_containerd().await;
    }
}

/// Applies examples/`pool` to `world` (its slots on real machines), runs the schedule that
/// `HOMELAB_FAULT_SEED` and `HOMELAB_FAULT_MINUTES` ask for (default: the short run) with the
/// workload on Group `group`, prints the outcome, and panics unless every invariant held and the
/// pool converged.
pub async fn run_example_pool(world: &mut World, pool: &str, group: &str) {
    let seed = env_number("HOMELAB_FAULT_SEED", SHORT_RUN_SEED);
    let minutes = env_number("HOMELAB_FAULT_MINUTES", SHORT_RUN_MINUTES);
    let replay = format!("HOMELAB_FAULT_SEED={seed} HOMELAB_FAULT_MINUTES={minutes}");
    world.apply_pool(pool).await.unwrap_or_else(|e| panic!("examples/{pool}: {e:#}"));
    let machines: Vec<Machine> =
        world.real_pool().map(|p| p.machines().cloned().collect()).unwrap_or_default();
    assert!(!machines.is_empty(), "examples/{pool} on real machines has no machine");
    let _machine_logs: Vec<_> = machines.iter().map(Machine::logs_on_failure).collect();
    let schedule = Schedule::new(seed, Duration::from_secs(minutes * 60), machines.len());
    eprintln!("fault run on examples/{pool}: {replay}");
    let run = FaultRun::start(world, machines, group).await.expect("the workload");
    let outcome = run.run(&schedule, CONVERGE).await.expect("the run");
    eprintln!("fault run on examples/{pool}, {replay}:\n{outcome}");
    assert!(
        outcome.passed(),
        "fault run failed (replay: {replay})\n{outcome}\n--- operator ---\n{}",
        world.operator_log_tail(0, 80)
    );
}
