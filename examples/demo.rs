//! `make demo`: a local pool of simulated machines scaling up and down, narrated.
//!
//! It builds (once) and starts a real control plane from upstream Go modules, runs the operator
//! binary and the machine simulator against it, and plays a pool of three machines twice:
//! first driven by the real cluster-autoscaler (built from its source) through the operator's
//! externalgrpc provider, then by the operator's built-in demand scaler. Each part starts a
//! workload that needs the pool, prints every call cluster-autoscaler makes and every claim as
//! it changes, scales the workload away, and ends with a summary of each step and its duration.
//!
//! `DRIVER=cluster-autoscaler` or `DRIVER=builtin` plays one part only. `KEEP=1` leaves the last
//! part's cluster running (until Ctrl-C) and prints the `KUBECONFIG` line for it.
//! `MACHINES=real` (root only) plays the same pools on real machines: network namespaces each
//! running a real kubelet and containerd, woken by Wake-on-LAN and shut down over SSH by the
//! operator's power Jobs; and a third part (`DRIVER=sleep` alone): a machine that sleeps
//! instead of powering off, its cold boot and its resume timed side by side. Everything the
//! demo started stops when it exits.

use anyhow::{Context as _, Result, bail};
use homelab_harness::e2e::{AutoscalerSettings, Machines, World, operator_binary};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Driver {
    ClusterAutoscaler,
    Builtin,
    /// A machine that sleeps and wakes (real machines only).
    Sleep,
}

fn drivers(machines: Machines) -> Result<Vec<Driver>> {
    let real = machines == Machines::Real;
    match std::env::var("DRIVER").unwrap_or_default().as_str() {
        "" | "both" if real => Ok(vec![Driver::ClusterAutoscaler, Driver::Builtin, Driver::Sleep]),
        "" | "both" => Ok(vec![Driver::ClusterAutoscaler, Driver::Builtin]),
        "cluster-autoscaler" | "ca" => Ok(vec![Driver::ClusterAutoscaler]),
        "builtin" => Ok(vec![Driver::Builtin]),
        "sleep" if real => Ok(vec![Driver::Sleep]),
        "sleep" => bail!("DRIVER=sleep plays on real machines only: add MACHINES=real"),
        other => bail!("DRIVER={other}: use cluster-autoscaler, builtin, sleep or both"),
    }
}

fn machines() -> Result<Machines> {
    match std::env::var("MACHINES").unwrap_or_default().as_str() {
        "" | "simulated" => Ok(Machines::Simulated),
        "real" => Ok(Machines::Real),
        other => bail!("MACHINES={other}: use simulated or real"),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let bin = operator_binary(std::env::args().nth(1).as_deref())?;
    let keep = std::env::var("KEEP").is_ok_and(|v| !v.is_empty() && v != "0");
    let machines = machines()?;
    let drivers = drivers(machines)?;
    for (index, driver) in drivers.iter().enumerate() {
        let last = index + 1 == drivers.len();
        let world = match driver {
            Driver::ClusterAutoscaler => autoscaler_part(&bin, machines).await?,
            Driver::Builtin => builtin_part(&bin, machines).await?,
            Driver::Sleep => sleep_part(&bin).await?,
        };
        if keep && last {
            hold(world).await?;
        }
    }
    Ok(())
}

/// Part 1: the real cluster-autoscaler takes the pool 0 → 3 → 0.
async fn autoscaler_part(bin: &std::path::Path, machines: Machines) -> Result<World> {
    println!("homelab-autoscaler demo, part 1: the real cluster-autoscaler drives a pool of three");
    println!("{} through the operator's externalgrpc provider (mutual TLS)\n", what(machines));
    let mut world = World::start_for_autoscaler_with(bin, true, machines).await?;
    let ca = world.autoscaler(&AutoscalerSettings::default()).await?;
    println!("cluster-autoscaler running (its log: {})\n", ca.log_path().display());
    let outcome = world.autoscaler_scale_up_and_down(&ca, 3).await;
    println!("{}", world.summary());
    if let Err(error) = &outcome {
        eprintln!(
            "the demo did not go as expected: {error:#}\n--- cluster-autoscaler ---\n{}\n{}",
            ca.log_tail(30),
            world.plane.log_tails(20)
        );
    }
    outcome?;
    // cluster-autoscaler stays with the world while it is kept.
    world.keep_alongside(ca);
    Ok(world)
}

/// Part 2: the built-in demand scaler does the same without cluster-autoscaler.
async fn builtin_part(bin: &std::path::Path, machines: Machines) -> Result<World> {
    println!(
        "\nhomelab-autoscaler demo, part 2: the built-in demand scaler drives a pool of three {}, \
         no cluster-autoscaler\n",
        what(machines)
    );
    let mut world = World::start_on_machines(bin, true, machines).await?;
    let outcome = world.builtin_scale_up_and_down(3).await;
    println!("{}", world.summary());
    if let Err(error) = &outcome {
        eprintln!("the demo did not go as expected: {error:#}\n{}", world.plane.log_tails(20));
    }
    outcome?;
    Ok(world)
}

/// Part 3 (real machines): a machine that sleeps instead of powering off, its cold boot and its
/// resume side by side.
async fn sleep_part(bin: &std::path::Path) -> Result<World> {
    println!(
        "\nhomelab-autoscaler demo, part 3: a pool whose machines sleep (suspend to RAM) instead \
         of powering off; one machine booted cold, put to sleep, and woken, each scale-up split \
         by step\n"
    );
    let mut world = World::start_on_machines(bin, true, Machines::Real).await?;
    let outcome = world.builtin_sleep_and_wake().await;
    println!("{}", world.summary());
    if let Err(error) = &outcome {
        eprintln!("the demo did not go as expected: {error:#}\n{}", world.plane.log_tails(20));
    }
    outcome?;
    Ok(world)
}

fn what(machines: Machines) -> &'static str {
    match machines {
        Machines::Simulated => "simulated machines",
        Machines::Real => "real machines (a kubelet and containerd each; Wake-on-LAN on, SSH off)",
    }
}

/// Leaves the world running for a person until Ctrl-C.
async fn hold(world: World) -> Result<()> {
    println!("The cluster stays up until Ctrl-C. In another terminal:\n");
    println!("  export KUBECONFIG={}", world.plane.kubeconfig_path().display());
    println!("  kubectl get homelab -n homelab-autoscaler-system");
    println!("  kubectl scale deployment web -n default --replicas=2   # and watch the claims\n");
    println!("(kubectl is in {})", world.plane.kubectl_path().display());
    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
    println!("stopping");
    drop(world);
    Ok(())
}
