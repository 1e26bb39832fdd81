//! The price a slot runs at: its own pricing, else what its declared draw costs at its group's
//! tariff, else its group's pricing. One rule for the choice of slot to boot (cheapest first),
//! the template it feeds, the price expander's answers and the savings report; it lives apart
//! so that none of those has to import another for it.

use k8s_openapi::api::core::v1::PodSpec;

use crate::api::{GroupSpec, NodeSpec, Pricing};
use crate::placement::shape::requests;
use crate::quantity;

/// What a pod asks of a machine, for its price: CPU and memory requests in thousandths (of a
/// core, of a byte), as the scheduler sums them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodRequests {
    pub cpu: i128,
    pub memory: i128,
}

impl PodRequests {
    pub fn of(pod: &PodSpec) -> Self {
        let asked = requests(pod, |name| name == "cpu" || name == "memory");
        let amount = |name: &str| asked.get(name).copied().unwrap_or(0);
        Self { cpu: amount("cpu"), memory: amount("memory") }
    }
}

/// The pricing in force for a slot. A slot with `spec.power.watts` under a pool with
/// `spec.energy` and no pricing of its own runs at `whenOn` kW × the tariff, so the price
/// expander prefers the frugal machines; its pod rate is the pool's.
pub fn pricing_of(slot: &NodeSpec, group: &GroupSpec) -> Option<Pricing> {
    if let Some(own) = &slot.pricing {
        return Some(own.clone());
    }
    let watts = slot.power.as_ref().and_then(|p| p.watts.as_ref());
    if let (Some(watts), Some(tariff)) = (watts, &group.energy) {
        return Some(Pricing {
            hourly_rate: watts.when_on / 1000.0 * tariff.price_per_kwh,
            pod_rate: group.pricing.as_ref().map_or(0.0, |p| p.pod_rate),
        });
    }
    group.pricing.clone()
}

/// The hourly price of a pod with `requests` on `slot`: the declared pod rate, or, where none is
/// declared (0), the slot's hourly rate times the share of the machine the pod takes, the larger
/// of its CPU and memory shares of the slot's declared capacity (at most the whole machine).
/// cluster-autoscaler's price expander divides a machine's price by its pods' prices: with
/// every pod at 0 each option scored infinite and the expander picked at random. A slot that
/// declares neither CPU nor memory leaves the share unknown: 0.
pub fn pod_rate_of(slot: &NodeSpec, group: &GroupSpec, requests: PodRequests) -> Option<f64> {
    let pricing = pricing_of(slot, group)?;
    if pricing.pod_rate > 0.0 {
        return Some(pricing.pod_rate);
    }
    let share_of = |resource: &str, asked: i128| {
        let declared = slot.node_capacity.get(resource)?;
        let declared = quantity::parse(&declared.0).ok()?.0;
        (declared > 0).then(|| asked.max(0) as f64 / declared as f64)
    };
    let share = [share_of("cpu", requests.cpu), share_of("memory", requests.memory)]
        .into_iter()
        .flatten()
        .fold(0.0_f64, f64::max)
        .min(1.0);
    Some(pricing.hourly_rate * share)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EnergyTariff, PowerSpec, PowerWatts};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    #[test]
    fn own_pricing_then_watts_at_the_tariff_then_the_groups() {
        let mut group = crate::fixtures::group("pool").spec;
        group.pricing = Some(Pricing { hourly_rate: 9.0, pod_rate: 0.9 });
        let mut slot = crate::fixtures::slot("s", "pool").spec;
        slot.pricing = Some(Pricing { hourly_rate: 1.0, pod_rate: 0.1 });
        assert_eq!(pricing_of(&slot, &group), slot.pricing.clone(), "its own pricing wins");

        slot.pricing = None;
        assert_eq!(pricing_of(&slot, &group), group.pricing.clone(), "no watts: the group's");

        slot.power = Some(PowerSpec {
            watts: Some(PowerWatts { when_on: 95.0, when_off: Some(4.0) }),
            ..PowerSpec::default()
        });
        assert_eq!(pricing_of(&slot, &group), group.pricing.clone(), "watts without a tariff");

        group.energy = Some(EnergyTariff { price_per_kwh: 0.32, currency: Some("EUR".into()) });
        let derived = pricing_of(&slot, &group).unwrap();
        assert!((derived.hourly_rate - 0.0304).abs() < 1e-12, "{}", derived.hourly_rate);
        assert_eq!(derived.pod_rate, 0.9);

        group.pricing = None;
        assert_eq!(pricing_of(&slot, &group).unwrap().pod_rate, 0.0);
        slot.power = None;
        assert_eq!(pricing_of(&slot, &group), None);
    }

    #[test]
    fn a_pod_costs_its_rate_or_its_share_of_the_machine() {
        let group = crate::fixtures::group("pool").spec;
        let mut slot = crate::fixtures::slot("s", "pool").spec;
        let capacity = |cpu: Option<&str>, memory: Option<&str>| {
            let mut declared = std::collections::BTreeMap::new();
            for (name, amount) in [("cpu", cpu), ("memory", memory)] {
                if let Some(amount) = amount {
                    declared.insert(name.to_owned(), Quantity(amount.to_owned()));
                }
            }
            declared
        };
        let gib = 1024_i128 * 1024 * 1024 * 1000;
        let ask = |cpu: i128, memory: i128| PodRequests { cpu, memory };
        let table = [
            ("a declared pod rate wins", 0.5, Some("4"), Some("8Gi"), ask(1000, gib), 0.5),
            ("a quarter of the CPUs", 0.0, Some("4"), Some("8Gi"), ask(1000, gib), 0.25),
            ("memory is the larger share", 0.0, Some("4"), Some("8Gi"), ask(500, 4 * gib), 0.5),
            ("more than the machine costs the machine", 0.0, Some("4"), None, ask(8000, 0), 1.0),
            ("only memory declared", 0.0, None, Some("8Gi"), ask(1000, 2 * gib), 0.25),
            ("nothing declared: no share", 0.0, None, None, ask(1000, gib), 0.0),
            ("a pod that asks nothing", 0.0, Some("4"), Some("8Gi"), ask(0, 0), 0.0),
            ("a zero capacity is no share", 0.0, Some("0"), None, ask(1000, 0), 0.0),
        ];
        for (name, pod_rate, cpu, memory, requests, want) in table {
            slot.pricing = Some(Pricing { hourly_rate: 1.0, pod_rate });
            slot.node_capacity = capacity(cpu, memory);
            let got = pod_rate_of(&slot, &group, requests).unwrap();
            assert!((got - want).abs() < 1e-9, "{name}: {got} != {want}");
        }
        slot.pricing = None;
        assert_eq!(pod_rate_of(&slot, &group, ask(1000, gib)), None, "no pricing at all");
    }
}
