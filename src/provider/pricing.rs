//! Prices for cluster-autoscaler's price expander: a node costs its hourly rate for every hour
//! of the window, a pod its pod rate, or its share of the machine where no pod rate is declared
//! (slot_pricing.rs). A slot's own pricing wins over its group's.

use std::collections::BTreeMap;

use jiff::Timestamp;

use crate::api::{LABEL_GROUP, Pricing};

use super::error::ProviderError;
use super::groups::GroupSnapshot;
use super::node_lookup::NodeRef;
use super::slot_pricing::{PodRequests, pod_rate_of, pricing_of};
use super::template::representative;
use super::{Caller, Provider};

/// The window a price is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PriceWindow {
    pub start: Timestamp,
    pub end: Timestamp,
}

impl PriceWindow {
    /// The window's length in hours; a window that ends before it starts is refused.
    pub fn hours(&self) -> Result<f64, ProviderError> {
        if self.end < self.start {
            return Err(ProviderError::InvalidWindow { start: self.start, end: self.end });
        }
        let seconds = self.end.duration_since(self.start).as_secs_f64();
        Ok(seconds / 3600.0)
    }
}

/// Where a pod is, or would be, placed: enough to find the machine whose pod rate applies, and
/// what the pod asks of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodPlacement {
    /// `spec.nodeName` of a scheduled pod.
    pub node_name: Option<String>,
    /// `spec.nodeSelector`, which may name a group by its node label.
    pub node_selector: BTreeMap<String, String>,
    /// Its CPU and memory requests.
    pub requests: PodRequests,
}

/// A rate per hour over a window. No pricing declared costs nothing.
pub fn price_over(rate_per_hour: Option<f64>, window: PriceWindow) -> Result<f64, ProviderError> {
    Ok(rate_per_hour.unwrap_or(0.0) * window.hours()?)
}

impl Provider {
    /// PricingNodePrice: a real node by providerID or name, or a template node by the group
    /// label it carries (priced as the slot the template was built from).
    #[tracing::instrument(skip_all, fields(node = %node.display_name()))]
    pub fn node_price(
        &self,
        caller: &Caller,
        node: &NodeRef,
        window: PriceWindow,
    ) -> Result<f64, ProviderError> {
        window.hours()?; // a bad window is refused before anything is looked up
        price_over(self.node_hourly_rate(caller, node)?, window)
    }

    fn node_hourly_rate(
        &self,
        caller: &Caller,
        node: &NodeRef,
    ) -> Result<Option<f64>, ProviderError> {
        if let Some((snapshot, slot)) = self.resolve_node(caller, node)? {
            return Ok(slot_rate(&snapshot, &slot, |p| p.hourly_rate));
        }
        if let Some(group) = node.labels.get(LABEL_GROUP) {
            let snapshot = self.snapshot(caller, group)?;
            return Ok(representative_rate(&snapshot, |p| p.hourly_rate));
        }
        Err(ProviderError::UnknownNode { node: node.display_name().to_owned() })
    }

    /// PricingPodPrice: the pod's rate on the machine it runs on, else its cheapest rate in the
    /// group its node selector names, else in any group the caller scales.
    #[tracing::instrument(skip_all)]
    pub fn pod_price(
        &self,
        caller: &Caller,
        pod: &PodPlacement,
        window: PriceWindow,
    ) -> Result<f64, ProviderError> {
        window.hours()?;
        price_over(self.pod_rate(caller, pod)?, window)
    }

    fn pod_rate(&self, caller: &Caller, pod: &PodPlacement) -> Result<Option<f64>, ProviderError> {
        if let Some(node_name) = pod.node_name.as_deref().filter(|n| !n.is_empty()) {
            let node = NodeRef { name: node_name.to_owned(), ..NodeRef::default() };
            if let Some((snapshot, slot)) = self.resolve_node(caller, &node)? {
                return Ok(match snapshot.slot(&slot) {
                    Some(state) => {
                        pod_rate_of(&state.slot.spec, &snapshot.group.spec, pod.requests)
                    }
                    None => group_pod_rate(&snapshot),
                });
            }
        }
        if let Some(group) = pod.node_selector.get(LABEL_GROUP) {
            let snapshot = self.snapshot(caller, group)?;
            return Ok(cheapest_pod_rate(&snapshot, pod.requests));
        }
        let mut best: Option<f64> = None;
        for snapshot in self.snapshots(caller.driver)? {
            best = min_rate(best, cheapest_pod_rate(&snapshot, pod.requests));
        }
        Ok(best)
    }
}

/// The rate of one slot of a group.
fn slot_rate(snapshot: &GroupSnapshot, slot: &str, rate: impl Fn(&Pricing) -> f64) -> Option<f64> {
    match snapshot.slot(slot) {
        Some(state) => pricing_of(&state.slot.spec, &snapshot.group.spec).as_ref().map(rate),
        None => snapshot.group.spec.pricing.as_ref().map(rate),
    }
}

/// The rate of the slot a template of the group is built from.
fn representative_rate(snapshot: &GroupSnapshot, rate: impl Fn(&Pricing) -> f64) -> Option<f64> {
    match representative(snapshot) {
        Some(state) => pricing_of(&state.slot.spec, &snapshot.group.spec).as_ref().map(rate),
        None => snapshot.group.spec.pricing.as_ref().map(rate),
    }
}

/// The lowest rate of a pod asking `requests` over a group's slots.
fn cheapest_pod_rate(snapshot: &GroupSnapshot, requests: PodRequests) -> Option<f64> {
    if snapshot.slots.is_empty() {
        return group_pod_rate(snapshot);
    }
    snapshot
        .slots
        .iter()
        .map(|s| pod_rate_of(&s.slot.spec, &snapshot.group.spec, requests))
        .fold(None, min_rate)
}

/// The group's own pod rate, for a pod priced where no slot of it is known.
fn group_pod_rate(snapshot: &GroupSnapshot) -> Option<f64> {
    snapshot.group.spec.pricing.as_ref().map(|p| p.pod_rate)
}

fn min_rate(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(start: &str, end: &str) -> PriceWindow {
        PriceWindow { start: start.parse().unwrap(), end: end.parse().unwrap() }
    }

    #[test]
    fn price_table() {
        let table = [
            ("one hour", Some(0.5), window("2026-03-04T09:00:00Z", "2026-03-04T10:00:00Z"), 0.5),
            (
                "ninety minutes",
                Some(2.0),
                window("2026-03-04T09:00:00Z", "2026-03-04T10:30:00Z"),
                3.0,
            ),
            (
                "an empty window",
                Some(2.0),
                window("2026-03-04T09:00:00Z", "2026-03-04T09:00:00Z"),
                0.0,
            ),
            ("no pricing", None, window("2026-03-04T09:00:00Z", "2026-03-04T10:00:00Z"), 0.0),
        ];
        for (name, rate, w, want) in table {
            let got = price_over(rate, w).unwrap();
            assert!((got - want).abs() < 1e-9, "{name}: {got} != {want}");
        }
    }

    #[test]
    fn a_window_that_ends_first_is_refused() {
        let err = price_over(Some(1.0), window("2026-03-04T10:00:00Z", "2026-03-04T09:00:00Z"));
        assert!(matches!(err, Err(ProviderError::InvalidWindow { .. })));
    }

    #[test]
    fn the_cheapest_pod_rate_of_a_group_covers_slots_without_pricing() {
        use super::super::groups::tests::{group, slot};
        use std::collections::HashSet;
        let mut priced = (*slot("a", "pool")).clone();
        priced.spec.pricing = Some(Pricing { hourly_rate: 0.2, pod_rate: 0.02 });
        let mut g = (*group("pool", 0)).clone();
        g.spec.pricing = Some(Pricing { hourly_rate: 1.0, pod_rate: 0.01 });
        let snap = GroupSnapshot::build(
            std::sync::Arc::new(g),
            &[std::sync::Arc::new(priced), slot("b", "pool")],
            &[],
            &HashSet::new(),
        );
        assert_eq!(cheapest_pod_rate(&snap, PodRequests::default()), Some(0.01));
    }
}
