//! Slots and the events about them as the tests read them.

use homelab_autoscaler::api::Node;
use k8s_openapi::api::core::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams};

/// The slot's condition `type_`: whether it is `True`, and its message.
pub fn condition(slot: &Node, type_: &str) -> Option<(bool, String)> {
    let conditions = slot.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let c = conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status == "True", c.message.clone()))
}

/// The reason of the slot's condition `type_`.
pub fn condition_reason(slot: &Node, type_: &str) -> Option<String> {
    let conditions = slot.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    conditions.iter().find(|c| c.type_ == type_).map(|c| c.reason.clone())
}

/// What holds the slot's power-off (`status.powerOffHeldBy`), with its `PowerOffAllowed`
/// condition's reason and message; `None` while nothing holds it.
pub fn power_off_hold(slot: &Node) -> Option<(String, String, String)> {
    let by = slot.status.as_ref()?.power_off_held_by.clone()?;
    let (_, message) = condition(slot, "PowerOffAllowed")?;
    Some((by, condition_reason(slot, "PowerOffAllowed")?, message))
}

/// The slot's `NodeReporting` condition: whether its kubelet reports, and why not.
pub fn node_reporting(slot: &Node) -> Option<(bool, String)> {
    condition(slot, "NodeReporting")
}

/// The reasons of the events in `ns` about the object named `name`, oldest first.
pub async fn event_reasons(client: &Client, ns: &str, name: &str) -> kube::Result<Vec<String>> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let list =
        events.list(&ListParams::default().fields(&format!("involvedObject.name={name}"))).await?;
    Ok(list.items.into_iter().filter_map(|e| e.reason).collect())
}

/// How many times events of `reason` about the object named `name` in `ns` were published: a
/// repeated event is one object whose series counts its repeats.
pub async fn event_count(client: &Client, ns: &str, name: &str, reason: &str) -> kube::Result<i32> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let list =
        events.list(&ListParams::default().fields(&format!("involvedObject.name={name}"))).await?;
    Ok(list
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.series.and_then(|s| s.count).unwrap_or(1).max(e.count.unwrap_or(1)))
        .sum())
}
