//! Only the Lease holder moves claims. Losing the Lease stops the controllers at once; winning
//! it (again) starts them on the process's caches as they are (synced since the replica
//! started), every object reconciled once at the start of the term.

use std::sync::Arc;

use anyhow::Context as _;
use kube_lease_manager::LeaseManagerBuilder;
use tokio_util::sync::CancellationToken;

use super::RunArgs;
use super::admin::Readiness;
use crate::cache::Stores;
use crate::clock::SystemClock;
use crate::controller::{self, Clients, Context};
use crate::provider::Provider;

async fn run_controllers(
    clients: Clients,
    caches: &Stores,
    provider: &Provider,
    args: &RunArgs,
    ready: &Readiness,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let scaler = crate::scaler::ScalerConfig {
        interval: args.scaler_interval.into(),
        timeouts: args.timeouts(),
        ..crate::scaler::ScalerConfig::new(args.namespace.clone())
    };
    let scaler =
        crate::scaler::run_with(clients.api.clone(), provider.clone(), scaler, stop.clone());
    let (ctx, inputs) = Context::begin(
        caches.clone(),
        clients,
        args.timeouts(),
        super::machine_settings(args),
        crate::controller::PowerPods {
            image: args.power_image.clone(),
            priority_class: args.power_job_priority_class.clone(),
        },
        Arc::new(SystemClock),
    )
    .await
    .context("waiting for the caches")?;
    wait_for_provider(provider, &stop).await;
    ready.set(true);
    crate::telemetry::set_leader(true);
    tracing::info!("controllers running");
    tokio::join!(controller::run(ctx, inputs, stop), scaler);
    crate::telemetry::set_leader(false);
    ready.set(false);
    Ok(())
}

/// Waits until the caches have synced (or shutdown), logging each slow minute.
async fn wait_for_provider(provider: &Provider, shutdown: &CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            synced = provider.wait_synced(std::time::Duration::from_secs(60)) => match synced {
                Ok(()) => return,
                Err(error) => tracing::warn!(%error, "not ready: waiting for the caches"),
            },
        }
    }
}

pub async fn run_controllers_while_leader(
    clients: Clients,
    caches: Stores,
    provider: Provider,
    args: &RunArgs,
    ready: Readiness,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    if args.no_leader_election {
        return run_controllers(clients, &caches, &provider, args, &ready, shutdown).await;
    }
    let identity = std::env::var("POD_NAME")
        .unwrap_or_else(|_| format!("homelab-autoscaler-{}", std::process::id()));
    let manager = LeaseManagerBuilder::new(clients.api.clone(), &args.lease_name)
        .with_namespace(&args.namespace)
        .with_identity(identity)
        .with_duration(15)
        .with_grace(5)
        .build()
        .await
        .context("creating the leader-election Lease manager")?;
    let (mut leading, lease_task) = manager.watch().await;
    // Webhooks and gRPC serve in every replica: readiness waits for the caches they
    // answer from, not for the Lease.
    wait_for_provider(&provider, &shutdown).await;
    ready.set(true);
    loop {
        // Wait to lead.
        while !*leading.borrow_and_update() {
            tokio::select! {
                _ = shutdown.cancelled() => { drop(leading); let _ = lease_task.await; return Ok(()); }
                changed = leading.changed() => changed.context("the Lease manager stopped")?,
            }
        }
        tracing::info!("elected leader");
        let term = shutdown.child_token();
        let controllers =
            run_controllers(clients.clone(), &caches, &provider, args, &ready, term.clone());
        tokio::pin!(controllers);
        loop {
            tokio::select! {
                result = &mut controllers => { result?; break; }
                changed = leading.changed() => {
                    changed.context("the Lease manager stopped")?;
                    if !*leading.borrow_and_update() {
                        tracing::warn!("lost the Lease; stopping the controllers");
                        term.cancel();
                    }
                }
            }
        }
        wait_for_provider(&provider, &shutdown).await;
        ready.set(true);
        if shutdown.is_cancelled() {
            drop(leading);
            let _ = lease_task.await;
            return Ok(());
        }
    }
}
