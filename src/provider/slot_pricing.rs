//! The price a slot runs at: its own pricing, else its group's. One rule for the choice of slot
//! to boot (cheapest first), the template it feeds, and the price expander's answers; it lives
//! apart so that none of those has to import another for it.

use crate::api::Pricing;

/// The pricing in force for a slot: its own, else its group's.
pub fn pricing_of<'a>(
    slot: Option<&'a Pricing>,
    group: Option<&'a Pricing>,
) -> Option<&'a Pricing> {
    slot.or(group)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slots_pricing_wins_over_the_groups() {
        let slot = Pricing { hourly_rate: 1.0, pod_rate: 0.1 };
        let group = Pricing { hourly_rate: 9.0, pod_rate: 0.9 };
        assert_eq!(pricing_of(Some(&slot), Some(&group)), Some(&slot));
        assert_eq!(pricing_of(None, Some(&group)), Some(&group));
        assert_eq!(pricing_of(None, None), None);
    }
}
