//! The price a slot runs at: its own pricing, else what its declared draw costs at its group's
//! tariff, else its group's pricing. One rule for the choice of slot to boot (cheapest first),
//! the template it feeds, the price expander's answers and the savings report; it lives apart
//! so that none of those has to import another for it.

use crate::api::{GroupSpec, NodeSpec, Pricing};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EnergyTariff, PowerSpec, PowerWatts};

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
}
