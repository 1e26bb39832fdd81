//! Admission of a Group's schedule windows as a user meets it: manifests applied with kubectl
//! through the real operator binary's webhooks and the real kube-apiserver; each refusal names
//! the window and what to write instead (docs/api.md, "What is refused").

use anyhow::{Result, ensure};
use homelab_harness::e2e::{self, NAMESPACE, World};

/// `kubectl apply` of `manifest`: whether it succeeded, and what kubectl printed (both streams).
async fn apply(world: &World, manifest: &str) -> Result<(bool, String)> {
    let out = world.plane.kubectl_apply(NAMESPACE, manifest).await?;
    let printed =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.success(), printed))
}

/// The `workers` pool (builtin, three slots) with `schedules` as its schedule list.
fn workers(schedules: &str) -> String {
    format!(
        "apiVersion: infra.homecluster.dev/v2alpha1\nkind: Group\nmetadata:\n  name: workers\n\
         spec:\n  driver: builtin\n  schedules:\n{schedules}"
    )
}

/// Applies `schedules` and expects a refusal whose message holds every one of `wanted`.
async fn refused(world: &World, schedules: &str, wanted: &[&str]) -> Result<()> {
    let (ok, printed) = apply(world, &workers(schedules)).await?;
    ensure!(!ok, "applied, though it should be refused:\n{schedules}\n{printed}");
    for want in wanted {
        ensure!(printed.contains(want), "kubectl's refusal lacks {want:?}:\n{printed}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_windows_are_admitted_or_refused_with_the_way_forward() {
    let bin = e2e::operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler")))
        .expect("operator binary");
    let world = World::start(&bin, false).await.expect("start the world");
    let _logs = world.plane.logs_on_failure();
    let outcome = async {
        // mini-1, mini-2 and big-1 in the pool `workers`.
        world.apply_example("pool.yaml").await?;

        // Working hours on one machine and a night backup on another, in two zones.
        let (ok, printed) = apply(
            &world,
            &workers(
                "    - { days: Mon-Fri, from: \"08:00\", to: \"18:00\", timeZone: Europe/Berlin, minMachines: 1, slots: [mini-1] }\n\
                 \x20   - { days: daily, from: \"23:30\", to: \"02:00:30\", timeZone: America/New_York, minMachines: 2, slots: [mini-2, big-1] }\n",
            ),
        )
        .await?;
        ensure!(ok, "two disjoint windows are accepted: {printed}");

        refused(
            &world,
            "    - { days: Mon-Fry, from: \"8:00\", to: \"24:00\", timeZone: Europe/Berln, minMachines: 1 }\n",
            &[
                "spec.schedules[0].days: \"Mon-Fry\" is not a day list; write days as Mon",
                "spec.schedules[0].from: \"8:00\" is not a time of day; write HH:MM or HH:MM:SS",
                "spec.schedules[0].to: \"24:00\" is not a time of day",
                "spec.schedules[0].timeZone: \"Europe/Berln\" is not an IANA time zone; write a name such as Europe/Berlin",
            ],
        )
        .await?;

        // Two windows that meet on a Friday afternoon and share mini-1.
        refused(
            &world,
            "    - { days: Mon-Fri, from: \"08:00\", to: \"18:00\", timeZone: Europe/Berlin, minMachines: 1, slots: [mini-1] }\n\
             \x20   - { days: Fri, from: \"17:00\", to: \"20:00\", timeZone: Europe/Berlin, minMachines: 1 }\n",
            &[
                "spec.schedules[0] (Mon-Fri 08:00-18:00 Europe/Berlin) and spec.schedules[1] (Fri 17:00-20:00 Europe/Berlin) are both open at Fri",
                "make them one window, move one so they do not meet",
            ],
        )
        .await?;
        // The same times on slots of their own are fine, and so are windows that only touch.
        let (ok, printed) = apply(
            &world,
            &workers(
                "    - { days: Mon-Fri, from: \"08:00\", to: \"18:00\", timeZone: Europe/Berlin, minMachines: 1, slots: [mini-1] }\n\
                 \x20   - { days: Fri, from: \"17:00\", to: \"20:00\", timeZone: Europe/Berlin, minMachines: 1, slots: [big-1] }\n\
                 \x20   - { days: Mon-Fri, from: \"18:00\", to: \"08:00\", timeZone: Europe/Berlin, minMachines: 1, slots: [mini-1] }\n",
            ),
        )
        .await?;
        ensure!(ok, "windows on other slots, or that touch, are accepted: {printed}");

        refused(
            &world,
            "    - { days: daily, from: \"08:00\", to: \"09:00\", timeZone: UTC, minMachines: 2, slots: [mini-1] }\n",
            &["spec.schedules[0].minMachines is 2 but slots names 1 slot(s); lower minMachines or name more slots (minMachines: 1 at most)"],
        )
        .await?;
        refused(
            &world,
            "    - { days: daily, from: \"08:00\", to: \"09:00\", timeZone: UTC, minMachines: 4 }\n",
            &["spec.schedules[0].minMachines is 4 but the pool has 3 slot(s); lower minMachines or add slots labelled with the group (minMachines: 3 at most)"],
        )
        .await?;
        // The schema refuses a window that keeps no machine, before the webhook.
        refused(
            &world,
            "    - { days: daily, from: \"08:00\", to: \"09:00\", timeZone: UTC, minMachines: 0 }\n",
            &["minMachines", "greater than or equal to 1"],
        )
        .await?;
        Ok(())
    }
    .await;
    if let Err(error) = outcome {
        panic!("{error:#}\n--- operator ---\n{}", world.operator_log_tail(0, 40));
    }
}
