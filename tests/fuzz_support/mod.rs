//! What the fuzz suites share: the case count and JSON strategies that start from a valid
//! object and break it where the rules look.

#![allow(dead_code)] // each fuzz binary uses its own part

use proptest::prelude::*;
use serde_json::Value;

/// Cases per property: `HOMELAB_FUZZ_CASES`, else `default` (what CI runs).
pub fn cases(default: u32) -> u32 {
    match std::env::var("HOMELAB_FUZZ_CASES") {
        Ok(n) => n.parse().unwrap_or_else(|_| panic!("HOMELAB_FUZZ_CASES={n:?} is not a number")),
        Err(_) => default,
    }
}

/// Strings the rules care about, and some they should not choke on.
const STRINGS: &[&str] = &[
    "",
    " ",
    "0",
    "-1",
    "1",
    "4",
    "500m",
    "16Gi",
    "1e3",
    "-0",
    "NaN",
    "1.5",
    "0x10",
    "0s",
    "-1s",
    "1s",
    "1.5h",
    "10m",
    "2m",
    "1h30m",
    "999999999999h",
    "5124095576030431h",
    "1h-5m",
    "2562047h",
    "9223372036854775807ns",
    "1µs",
    "1d",
    "h",
    "s1",
    "--1s",
    "+5m",
    "2026-12-01T00:00:00Z",
    "2026-12-01T00:13:00Z",
    "2026-11-30T00:00:00Z",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
    "1970-01-01T00:00:00Z",
    "2026-12-01T00:00:00+14:00",
    "2026-13-45T99:99:99Z",
    "not-a-time",
    "IncreaseSize",
    "Manual",
    "DeleteNodes",
    "increasesize",
    "pending",
    "booting",
    "ready",
    "failed",
    "completed",
    "Pending",
    "builtin",
    "cluster-autoscaler",
    "Fail",
    "NoSchedule",
    "NoExecute",
    "pool",
    "other-pool",
    "mini-1",
    "mini-2",
    "homelab://mini-1",
    "k3s://mini-1",
    "homelab://",
    "admin",
    "system:serviceaccount:homelab-autoscaler-system:homelab-autoscaler",
    "on",
    "off",
    "true",
    "UPDATE",
    "🙂",
    "\u{0}",
    "a/b",
    "../..",
];

/// Any JSON value, biased to the strings, numbers and shapes the rules read.
pub fn interesting_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop::sample::select(STRINGS).prop_map(|s| Value::String(s.to_string())),
        any::<i64>().prop_map(Value::from),
        prop::sample::select(vec![
            0i64,
            -1,
            1,
            2,
            3,
            4,
            i32::MAX as i64,
            i32::MIN as i64,
            i64::MAX,
            i64::MIN
        ])
        .prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "[ -~]{0,24}".prop_map(Value::String),
        (1usize..20_000).prop_map(|n| Value::String("x".repeat(n))),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    prop::sample::select(STRINGS).prop_map(str::to_string),
                    "[a-zA-Z]{1,8}"
                ],
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// One change to an object: set the field at a path to a value, or remove it.
#[derive(Clone, Debug)]
pub enum Change {
    Set(&'static str, Value),
    Remove(&'static str),
}

fn apply(object: &mut Value, change: &Change) {
    let (path, value) = match change {
        Change::Set(path, value) => (*path, Some(value.clone())),
        Change::Remove(path) => (*path, None),
    };
    let segments: Vec<&str> = path.split(':').collect();
    let Some((last, parents)) = segments.split_last() else { return };
    let mut at = object;
    for segment in parents {
        if !at.is_object() {
            *at = Value::Object(Default::default());
        }
        at = at
            .as_object_mut()
            .map(|o| o.entry(segment.to_string()).or_insert(Value::Object(Default::default())))
            .expect("an object");
    }
    if !at.is_object() {
        *at = Value::Object(Default::default());
    }
    let Some(map) = at.as_object_mut() else { return };
    match value {
        Some(value) => {
            map.insert(last.to_string(), value);
        }
        None => {
            map.remove(*last);
        }
    }
}

/// `base` with zero to four of its fields (among `paths`, `:`-separated) set to interesting
/// values or removed.
pub fn mutated(base: Value, paths: &'static [&'static str]) -> impl Strategy<Value = Value> {
    let change =
        (prop::sample::select(paths), interesting_value(), 0u8..5).prop_map(|(path, value, op)| {
            if op == 0 { Change::Remove(path) } else { Change::Set(path, value) }
        });
    prop::collection::vec(change, 0..5).prop_map(move |changes| {
        let mut object = base.clone();
        for change in &changes {
            apply(&mut object, change);
        }
        object
    })
}
