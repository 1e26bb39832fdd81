//! The target (docs/decisions.md, D8): how many machines the demand needs.
//! `ceil(demand / podsPerNode)`, clamped to `[1, maxNodes]` when there is work and 0 when there
//! is none. The lower bound of 1 keeps the zero-or-one behaviour exactly at `maxNodes == 1`.
//! `maxNodes` is never above the pool's slot count: a pool cannot run machines it does not have.
//!
//! The Group's `minSize` is not part of the target: it is a floor the decision keeps powered
//! (`floor`), as cluster-autoscaler keeps a group's min size, so the target stays the formula
//! above and its table.

use crate::api::BuiltinScaler;

/// `spec.builtin.podsPerNode` when unset or nonsensical.
pub const DEFAULT_PODS_PER_NODE: i32 = 8;

/// The ratio and the ceiling, resolved: a zero or negative value is never a surprise, it is the
/// default (pods per node) or nothing (max nodes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// How many pods of work one machine absorbs; at least 1.
    pub pods_per_node: i32,
    /// The most machines the scaler powers; between 0 and the slot count.
    pub max_nodes: i32,
}

impl Limits {
    /// Resolves the Group's settings against its slot count. Unset `maxNodes` is every slot.
    pub fn new(pods_per_node: i32, max_nodes: Option<i32>, slots: i32) -> Self {
        let slots = slots.max(0);
        Self {
            pods_per_node: if pods_per_node >= 1 { pods_per_node } else { DEFAULT_PODS_PER_NODE },
            max_nodes: max_nodes.unwrap_or(slots).clamp(0, slots),
        }
    }

    /// The limits of a Group's `spec.builtin`.
    pub fn of(builtin: &BuiltinScaler, slots: i32) -> Self {
        Self::new(builtin.pods_per_node, builtin.max_nodes, slots)
    }
}

/// The machines `demand` pods of work need: 0 without work, else `ceil(demand / podsPerNode)`
/// within `[1, maxNodes]`. A pool with no machine to offer (maxNodes 0) has target 0.
pub fn target(demand: i32, limits: &Limits) -> i32 {
    if demand <= 0 || limits.max_nodes < 1 {
        return 0;
    }
    let per_node = limits.pods_per_node.max(1);
    let nodes = demand / per_node + i32::from(demand % per_node != 0);
    nodes.clamp(1, limits.max_nodes)
}

/// The machines the builtin driver keeps powered whatever the demand: `minSize`, within the
/// slots there are.
pub fn floor(min_size: i32, slots: i32) -> i32 {
    min_size.clamp(0, slots.max(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plans_table() {
        // name, demand, podsPerNode, maxNodes, slots, target
        let table = [
            ("zero demand", 0, 8, Some(4), 10, 0),
            ("one pod at podsPerNode 8", 1, 8, Some(4), 10, 1),
            ("17 pods at podsPerNode 8", 17, 8, Some(4), 10, 3),
            ("16 pods fill two machines exactly", 16, 8, Some(4), 10, 2),
            ("100 pods at maxNodes 4", 100, 8, Some(4), 10, 4),
            ("maxNodes 1, zero demand: zero", 0, 8, Some(1), 10, 0),
            ("maxNodes 1, one pod: one", 1, 8, Some(1), 10, 1),
            ("maxNodes 1, 50 pods: still one", 50, 1, Some(1), 10, 1),
            ("podsPerNode 1: a machine per pod", 3, 1, Some(3), 3, 3),
            ("maxNodes above the slots is capped to them", 100, 1, Some(10), 3, 3),
            ("unset maxNodes is every slot", 100, 8, None, 5, 5),
            ("a pool without slots has nothing to offer", 5, 8, None, 0, 0),
        ];
        for (name, demand, per_node, max_nodes, slots, want) in table {
            let limits = Limits::new(per_node, max_nodes, slots);
            assert_eq!(target(demand, &limits), want, "{name}");
        }
    }

    #[test]
    fn zero_and_negative_settings_read_as_defaults() {
        assert_eq!(Limits::new(0, Some(3), 5), Limits { pods_per_node: 8, max_nodes: 3 });
        assert_eq!(Limits::new(-4, Some(-1), 5), Limits { pods_per_node: 8, max_nodes: 0 });
        assert_eq!(target(-7, &Limits::new(1, None, 3)), 0, "negative demand is no demand");
    }

    #[test]
    fn the_groups_defaults_resolve() {
        let limits = Limits::of(&BuiltinScaler::default(), 6);
        assert_eq!(limits, Limits { pods_per_node: DEFAULT_PODS_PER_NODE, max_nodes: 6 });
    }

    #[test]
    fn the_floor_is_min_size_within_the_slots() {
        assert_eq!(floor(0, 3), 0);
        assert_eq!(floor(2, 3), 2);
        assert_eq!(floor(5, 3), 3, "a minSize above the slots keeps every slot");
        assert_eq!(floor(-1, 3), 0);
    }
}
