//! A slot's `nodeLabels` and `nodeTaints`, judged as the API server judges them on a Node
//! (apimachinery's `IsQualifiedName` and `IsValidLabelValue`, core's `validateNodeTaints`). The
//! node-registration webhook writes them onto the registering node; one the API server refuses
//! there would make it refuse every registration of the machine, so the slot is refused first.

use k8s_openapi::api::core::v1::Taint;

use super::verdict::Findings;

/// The taint effects a Node accepts.
pub const TAINT_EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

const NAME_MAX: usize = 63;
const PREFIX_MAX: usize = 253;

/// Why `key` is not a label or taint key, or `None` when it is one: an optional DNS subdomain
/// prefix and a slash, then a name of at most 63 characters.
pub fn key_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if name.contains('/') {
        return Some("has more than one '/'; a key is an optional prefix, '/', and a name".into());
    }
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Some("has an empty prefix before '/'".into());
        }
        if prefix.len() > PREFIX_MAX {
            return Some(format!("has a prefix longer than {PREFIX_MAX} characters"));
        }
        if !is_dns_subdomain(prefix) {
            return Some(format!(
                "has the prefix {prefix:?}, which is not a DNS subdomain (lower-case letters, \
                 digits, '-' and '.', starting and ending with a letter or digit, such as \
                 example.com)"
            ));
        }
    }
    if name.is_empty() {
        return Some("has an empty name".into());
    }
    name_problem(name)
}

/// Why `value` is not a label or taint value, or `None` when it is one: empty, or a name.
pub fn value_problem(value: &str) -> Option<String> {
    if value.is_empty() { None } else { name_problem(value) }
}

/// A name: at most 63 characters of letters, digits, '-', '_' and '.', starting and ending with
/// a letter or digit.
fn name_problem(name: &str) -> Option<String> {
    if name.len() > NAME_MAX {
        return Some(format!("is {} characters long; at most {NAME_MAX} are allowed", name.len()));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || "-_.".contains(*c))) {
        return Some(format!("contains {c:?}; only letters, digits, '-', '_' and '.' are allowed"));
    }
    let ends_alphanumeric = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !ends_alphanumeric(name.chars().next()) || !ends_alphanumeric(name.chars().last()) {
        return Some("must start and end with a letter or digit".into());
    }
    None
}

fn is_dns_subdomain(s: &str) -> bool {
    s.split('.').all(|label| {
        let edge =
            |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        edge(label.chars().next())
            && edge(label.chars().last())
            && label.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    })
}

/// Records every invalid label and taint of a slot, each naming its field and what to write.
pub fn check(
    labels: &std::collections::BTreeMap<String, String>,
    taints: &[Taint],
    findings: &mut Findings,
) {
    for (key, value) in labels {
        if let Some(problem) = key_problem(key) {
            findings.invalid(
                "node_label",
                format!(
                    "spec.nodeLabels: the key {key:?} {problem}; the API server refuses such a \
                     label on the machine's node, so its registration would fail. Use a key \
                     such as example.com/role"
                ),
            );
        }
        if let Some(problem) = value_problem(value) {
            findings.invalid(
                "node_label",
                format!(
                    "spec.nodeLabels.{key}: the value {value:?} {problem}; the API server \
                     refuses such a label on the machine's node, so its registration would \
                     fail. Use an empty value or one such as gpu-large"
                ),
            );
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, taint) in taints.iter().enumerate() {
        let field = format!("spec.nodeTaints[{i}]");
        if let Some(problem) = key_problem(&taint.key) {
            findings.invalid(
                "node_taint",
                format!(
                    "{field}.key: {:?} {problem}; the API server refuses such a taint on the \
                     machine's node, so its registration would fail. Use a key such as \
                     example.com/dedicated",
                    taint.key
                ),
            );
        }
        if let Some(value) = &taint.value
            && let Some(problem) = value_problem(value)
        {
            findings.invalid(
                "node_taint",
                format!(
                    "{field}.value: {value:?} {problem}; the API server refuses such a taint on \
                     the machine's node, so its registration would fail. Use an empty value or \
                     one such as gpu-large"
                ),
            );
        }
        if !TAINT_EFFECTS.contains(&taint.effect.as_str()) {
            findings.invalid(
                "node_taint",
                format!(
                    "{field}.effect: {:?} is not a taint effect; write exactly one of {} \
                     (the case matters)",
                    taint.effect,
                    TAINT_EFFECTS.join(", ")
                ),
            );
        }
        if !seen.insert((taint.key.as_str(), taint.effect.as_str())) {
            findings.invalid(
                "node_taint",
                format!(
                    "{field}: a taint with key {:?} and effect {:?} is declared twice; a node \
                     holds one taint per key and effect, so keep one of them",
                    taint.key, taint.effect
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_as_the_api_server_judges_them() {
        let long_name = "a".repeat(63);
        let too_long_name = "a".repeat(64);
        let long_prefix = format!("{}.io/x", "a".repeat(250));
        let too_long_prefix = format!("{}.io/x", "a".repeat(251));
        let table: &[(&str, bool)] = &[
            ("role", true),
            ("example.com/role", true),
            ("node-role.kubernetes.io/worker", true),
            ("a", true),
            ("A_b.C-9", true),
            (&long_name, true),
            (&long_prefix, true),
            ("", false),
            ("/role", false),
            ("example.com/", false),
            ("a/b/c", false),
            ("Example.com/role", false),
            ("example_com/role", false),
            ("-example.com/role", false),
            ("example..com/role", false),
            ("role ", false),
            ("has space", false),
            ("-role", false),
            ("role.", false),
            ("ro:le", false),
            (&too_long_name, false),
            (&too_long_prefix, false),
        ];
        for (key, valid) in table {
            assert_eq!(key_problem(key).is_none(), *valid, "{key:?}: {:?}", key_problem(key));
        }
    }

    #[test]
    fn values_as_the_api_server_judges_them() {
        let long = "v".repeat(63);
        let too_long = "v".repeat(64);
        let table: &[(&str, bool)] = &[
            ("", true),
            ("gpu", true),
            ("gpu-large_2.x", true),
            (&long, true),
            ("with space", false),
            ("example.com/x", false),
            ("_lead", false),
            ("trail-", false),
            ("é", false),
            (&too_long, false),
        ];
        for (value, valid) in table {
            assert_eq!(value_problem(value).is_none(), *valid, "{value:?}");
        }
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn messages(labels: &[(&str, &str)], taints: &[Taint]) -> Vec<String> {
        let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut findings = Findings::default();
        check(&labels, taints, &mut findings);
        findings.messages()
    }

    #[test]
    fn a_slot_s_marks_each_name_their_field_and_the_way_forward() {
        type Row<'a> = (&'a str, &'a [(&'a str, &'a str)], Vec<Taint>, &'a [&'a str]);
        let table: Vec<Row<'_>> = vec![
            (
                "valid marks",
                &[("example.com/role", "gpu"), ("empty", "")],
                vec![
                    taint("dedicated", Some("gpu"), "NoSchedule"),
                    taint("dedicated", None, "NoExecute"),
                    taint("soft", Some(""), "PreferNoSchedule"),
                ],
                &[],
            ),
            (
                "effect in the wrong case",
                &[],
                vec![taint("dedicated", Some("gpu"), "Noschedule")],
                &[
                    "spec.nodeTaints[0].effect: \"Noschedule\" is not a taint effect",
                    "exactly one of NoSchedule, PreferNoSchedule, NoExecute",
                ],
            ),
            (
                "empty effect",
                &[],
                vec![taint("dedicated", None, "")],
                &["spec.nodeTaints[0].effect: \"\" is not a taint effect"],
            ),
            (
                "taint value with a space",
                &[],
                vec![
                    taint("ok", None, "NoSchedule"),
                    taint("dedicated", Some("big gpu"), "NoSchedule"),
                ],
                &[
                    "spec.nodeTaints[1].value: \"big gpu\" contains ' '",
                    "registration would fail",
                    "Use an empty value",
                ],
            ),
            (
                "taint key with two slashes",
                &[],
                vec![taint("a/b/c", None, "NoSchedule")],
                &["spec.nodeTaints[0].key: \"a/b/c\" has more than one '/'"],
            ),
            (
                "the same key and effect twice",
                &[],
                vec![
                    taint("dedicated", Some("a"), "NoSchedule"),
                    taint("dedicated", Some("b"), "NoSchedule"),
                ],
                &[
                    "spec.nodeTaints[1]: a taint with key \"dedicated\" and effect \"NoSchedule\" is declared twice",
                ],
            ),
            (
                "label value with a space",
                &[("role", "big gpu")],
                vec![],
                &[
                    "spec.nodeLabels.role: the value \"big gpu\" contains ' '",
                    "registration would fail",
                ],
            ),
            (
                "label key with an upper-case prefix",
                &[("Example.com/role", "gpu")],
                vec![],
                &[
                    "spec.nodeLabels: the key \"Example.com/role\" has the prefix \"Example.com\", which is not a DNS subdomain",
                ],
            ),
        ];
        for (name, labels, taints, needles) in table {
            let messages = messages(labels, &taints);
            if needles.is_empty() {
                assert!(messages.is_empty(), "{name}: {messages:?}");
            }
            for needle in needles {
                assert!(
                    messages.iter().any(|m| m.contains(needle)),
                    "{name}: {needle:?} missing from {messages:?}"
                );
            }
        }
    }
}
