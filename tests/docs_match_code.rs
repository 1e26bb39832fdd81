//! The docs name only what the code has: every `homelab-autoscaler` flag they mention is in the
//! `--help` of the binary, every chart value path is in the chart's values schema, and every
//! `homelab_autoscaler_*` metric is one the operator registers. Each mismatch is reported with
//! its file and line.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Flags of other programs the docs mention, by program. A flag named on a line that runs
/// `homelab-autoscaler` must be the operator's own even when it is listed here.
const OTHER_PROGRAMS_FLAGS: &[(&str, &[&str])] = &[
    (
        "kubectl",
        &[
            "--server-side",
            "--type",
            "--overwrite",
            "--subresource",
            "--from-literal",
            "--from-file",
            "--field-selector",
            "--all",
            "--replicas",
            "--wait",
            "--show-managed-fields",
        ],
    ),
    (
        "helm",
        &["--set", "--install", "--create-namespace", "--reuse-values", "--strict", "--version"],
    ),
    ("gh", &["--owner"]),
    ("crane", &["--index", "--platform"]),
    ("dpkg", &["--add-architecture"]),
    ("systemd-inhibit", &["--list"]),
    (
        "cargo",
        &[
            "--bench",
            "--test",
            "--locked",
            "--all-targets",
            "--workspace",
            "--lib",
            "--no-run",
            "--nocapture",
            "--release",
            "--target",
        ],
    ),
    (
        "cluster-autoscaler",
        &[
            "--cloud-provider",
            "--cloud-config",
            "--max-node-provision-time",
            "--max-node-startup-time",
            "--scale-down-unneeded-time",
            "--scale-down-unready-time",
            "--scale-down-utilization-threshold",
            "--scale-down-gpu-utilization-threshold",
            "--ignore-daemonsets-utilization",
            "--startup-taint",
            "--expander",
            "--scan-interval",
        ],
    ),
    ("kube-controller-manager", &["--node-monitor-grace-period", "--node-monitor-period"]),
    ("kubelet", &["--register-with-taints", "--node-labels", "--hostname-override"]),
    ("kwok", &["--manage-nodes-with-annotation-selector", "--node-lease-duration-seconds"]),
    ("k3s", &["--kubelet-arg", "--node-taint", "--node-name"]),
    ("cert-manager", &["--enable-certificate-owner-ref"]),
    ("perf", &["--no-children", "--sort"]),
    ("heaptrack_print", &["--flamegraph-cost-type"]),
];

/// Backticked dotted names whose first part is a chart value but which are not chart values:
/// the `tls` settings of a slot's power driver (docs/power.md).
const NOT_CHART_VALUES: &[&str] = &["tls.caBundle", "tls.insecureSkipVerify"];

/// File name extensions: `tls.crt` or `admin.rs` names a file, not a chart value.
const FILE_EXTENSIONS: &[&str] =
    &["rs", "md", "yaml", "yml", "json", "toml", "sh", "crt", "key", "pem", "tar", "gz"];

/// The subcommands of the operator binary.
const SUBCOMMANDS: &[&str] = &["run", "simulate", "certs", "power", "manifests"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every Markdown file the check reads, with its lines.
fn documents() -> Vec<(String, Vec<String>)> {
    let mut paths = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a docs entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("a doc");
            let name = path.strip_prefix(repo()).unwrap_or(&path).display().to_string();
            (name, text.lines().map(str::to_string).collect())
        })
        .collect()
}

/// `--flag` tokens of `text` (a token starts after a character that is not part of a word).
fn flags_in(text: &str) -> Vec<String> {
    let mut flags = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("--") {
        let start = from + at;
        let before = text[..start].chars().next_back();
        let name: String = text[start + 2..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        let in_word = before.is_some_and(|c| c.is_alphanumeric() || c == '-');
        if !in_word && name.starts_with(|c: char| c.is_ascii_lowercase()) {
            flags.push(format!("--{}", name.trim_end_matches('-')));
        }
        from = start + 2 + name.len();
    }
    flags
}

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_homelab-autoscaler"))
        .args(args)
        .arg("--help")
        .output()
        .expect("run homelab-autoscaler --help");
    assert!(out.status.success(), "{args:?} --help: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

/// The subcommands a `--help` lists under `Commands:`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        // A wrapped description is indented further than the command names.
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// Every flag of the operator binary: the union over every subcommand's `--help`.
fn operator_flags() -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    let mut pending: Vec<Vec<String>> = vec![vec![]];
    while let Some(path) = pending.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(&args);
        flags.extend(flags_in(&text));
        for sub in subcommands(&text) {
            let mut deeper = path.clone();
            deeper.push(sub);
            pending.push(deeper);
        }
    }
    assert!(flags.contains("--admin-addr") && flags.contains("--slot"), "{flags:?}");
    flags
}

/// Whether `line` runs the operator binary (`homelab-autoscaler run ...`).
fn runs_the_operator(line: &str) -> bool {
    SUBCOMMANDS.iter().any(|sub| line.contains(&format!("homelab-autoscaler {sub}")))
}

#[test]
fn every_flag_in_the_docs_is_the_operators_or_a_listed_programs() {
    let ours = operator_flags();
    let theirs: BTreeSet<&str> =
        OTHER_PROGRAMS_FLAGS.iter().flat_map(|(_, flags)| flags.iter().copied()).collect();
    let mut mismatches = Vec::new();
    for (file, lines) in documents() {
        // A shell line that ends in `\` continues the command of the line before.
        let mut continues_operator = false;
        for (n, line) in lines.iter().enumerate() {
            let operator_line = runs_the_operator(line) || continues_operator;
            continues_operator = operator_line && line.trim_end().ends_with('\\');
            for flag in flags_in(line) {
                let known = ours.contains(&flag) || (!operator_line && theirs.contains(&*flag));
                if !known {
                    let whose = if operator_line { "homelab-autoscaler" } else { "any program" };
                    mismatches.push(format!("{file}:{}: {flag} is not a flag of {whose}", n + 1));
                }
            }
        }
    }
    assert!(mismatches.is_empty(), "flags the code does not have:\n{}", mismatches.join("\n"));
}

/// The dotted paths of every value the chart's schema describes.
fn schema_paths() -> BTreeSet<String> {
    fn walk(prefix: &str, node: &serde_json::Value, out: &mut BTreeSet<String>) {
        let Some(properties) = node.get("properties").and_then(|p| p.as_object()) else {
            return;
        };
        for (key, child) in properties {
            let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
            out.insert(path.clone());
            walk(&path, child, out);
        }
    }
    let path = repo().join("charts/homelab-autoscaler/values.schema.json");
    let text = std::fs::read_to_string(&path).expect("the chart's values.schema.json");
    let schema: serde_json::Value = serde_json::from_str(&text).expect("the schema is JSON");
    let mut paths = BTreeSet::new();
    walk("", &schema, &mut paths);
    paths
}

/// Chart value paths named on `line`: every `--set a.b=c`, and every backticked `a.b` (or
/// `a.b: x`, `a.b=x`) whose first part is a top-level chart value.
fn chart_values_in(line: &str, top_level: &BTreeSet<&str>) -> Vec<String> {
    let is_path = |s: &str| {
        !s.is_empty()
            && s.split('.').all(|part| {
                !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
    };
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("--set") {
        rest = &rest[at + 5..];
        let value = rest.trim_start_matches([' ', '=']);
        let path = value.split(['=', ' ', '`']).next().unwrap_or_default();
        if is_path(path) {
            found.push(path.to_string());
        }
    }
    for (i, quoted) in line.split('`').enumerate() {
        if i % 2 == 0 {
            continue;
        }
        let path = quoted.split([':', '=', ' ']).next().unwrap_or_default();
        let first = path.split('.').next().unwrap_or_default();
        let last = path.rsplit('.').next().unwrap_or_default();
        if path.contains('.')
            && !FILE_EXTENSIONS.contains(&last)
            && is_path(path)
            && (top_level.contains(first) || misspells_one_of(first, top_level))
            && !NOT_CHART_VALUES.contains(&path)
        {
            found.push(path.to_string());
        }
    }
    found
}

/// `word` is not a top-level chart value but is a typing slip away from one (`clusterAutoscalr`,
/// `energie`): a path under it is meant as a chart value and is checked as one.
fn misspells_one_of(word: &str, top_level: &BTreeSet<&str>) -> bool {
    let word = word.to_ascii_lowercase();
    top_level.iter().any(|key| {
        let key = key.to_ascii_lowercase();
        let allowed = if key.len() <= 5 { 1 } else { 2 };
        let distance = edit_distance(&word, &key);
        (1..=allowed).contains(&distance)
    })
}

/// Edit distance counting insertions, deletions, substitutions and swaps of neighbours as one
/// slip each (optimal string alignment).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

#[test]
fn every_chart_value_in_the_docs_is_in_the_charts_schema() {
    let paths = schema_paths();
    let top_level: BTreeSet<&str> =
        paths.iter().filter(|p| !p.contains('.')).map(|p| &**p).collect();
    assert!(top_level.contains("tls") && top_level.contains("clusterAutoscaler"), "{top_level:?}");
    let mut mismatches = Vec::new();
    let mut checked = 0;
    for (file, lines) in documents() {
        for (n, line) in lines.iter().enumerate() {
            for value in chart_values_in(line, &top_level) {
                checked += 1;
                if !paths.contains(&value) {
                    mismatches.push(format!("{file}:{}: {value} is not a chart value", n + 1));
                }
            }
        }
    }
    assert!(checked >= 10, "the check found only {checked} chart values in the docs");
    assert!(
        mismatches.is_empty(),
        "chart values the chart does not have:\n{}",
        mismatches.join("\n")
    );
}

/// The metric families the operator registers, as the Prometheus text format names them.
fn registered_metrics() -> BTreeSet<String> {
    use homelab_autoscaler::telemetry as t;
    // A family without a series is not rendered: give every one a series first.
    let s = Duration::from_secs(1);
    t::claim_moved("docs", "Booting", "Failed", Some("DeadlineExceeded"));
    t::boot_committed("docs", 1);
    t::claim_ready("docs", Some(s), Some(s));
    t::boot_stages("docs", Some(s), s);
    t::webhook_answered("docs", s, Some(("Invalid", &["schema"])));
    t::grpc_answered("NodeGroups", "OK", s);
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
    runtime.block_on(t::reconcile("docs", async { Ok::<(), ()>(()) })).expect("a reconcile");
    t::set_leader(true);
    t::set_caches_synced(true);
    t::scaler_decided("docs", 1, 1, "None");
    t::group_observed("docs", [("ready", 1)], [("ready", 1)]);
    let sample = t::SavingsSample {
        seconds_on: 1.0,
        seconds_off: 1.0,
        cost: 1.0,
        always_on_cost: 2.0,
        saved: 1.0,
        energy_used_kwh: 1.0,
        energy_saved_kwh: 1.0,
        energy_cost: 1.0,
        energy_saved_cost: 1.0,
    };
    t::savings_reported("docs", &sample);
    t::slot_draw_read("docs", "m1", 1.0);
    t::slot_power_off_held("docs", "m1", 1.0);
    let power = homelab_autoscaler::api::GroupPowerStatus {
        charge_percent: Some(1.0),
        runtime_seconds: Some(1),
        pool_watts: Some(1.0),
        ..Default::default()
    };
    t::ups_read("docs", &power);
    let (_, text) = t::render(None);
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .map(|(name, _)| name.to_string())
        .collect()
}

#[test]
fn every_metric_in_the_docs_is_registered() {
    let registered = registered_metrics();
    assert!(registered.len() >= 20, "{registered:?}");
    let mut mismatches = Vec::new();
    for (file, lines) in documents() {
        for (n, line) in lines.iter().enumerate() {
            for (at, _) in line.match_indices("homelab_autoscaler_") {
                let name: String = line[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if name == "homelab_autoscaler_" {
                    continue; // the namespace itself
                }
                let family = ["", "_bucket", "_sum", "_count", "_created"]
                    .iter()
                    .filter_map(|suffix| name.strip_suffix(suffix))
                    .any(|family| registered.contains(family));
                if !family {
                    mismatches.push(format!("{file}:{}: {name} is not registered", n + 1));
                }
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "metrics the operator does not have:\n{}",
        mismatches.join("\n")
    );
}

#[test]
fn the_scanners_find_what_they_look_for() {
    assert_eq!(
        flags_in("run `--admin-addr=:8080`, --slot x, a--b, |---|, --set a.b=c, —-no"),
        ["--admin-addr", "--slot", "--set"]
    );
    let top: BTreeSet<&str> = ["tls", "admin", "clusterAutoscaler"].into();
    assert_eq!(
        chart_values_in(
            "`tls.mode`, `tls.crt`, `admin.rs`, `tls.caBundle`, `spec.power`, --set clusterAutoscaler.enabled=true",
            &top
        ),
        ["clusterAutoscaler.enabled", "tls.mode"]
    );
    // A misspelled top-level key is still read as a chart value, so the schema check refuses it;
    // words far from every key (`spec`, `status`) are not.
    assert_eq!(
        chart_values_in("`clusterAutoscalr.enabled`, `tsl.mode`, `status.draw`", &top),
        ["clusterAutoscalr.enabled", "tsl.mode"]
    );
    assert_eq!(edit_distance("energie", "energy"), 2);
    assert_eq!(edit_distance("tsl", "tls"), 1);
    assert!(runs_the_operator("homelab-autoscaler power status --slot rack-1"));
    assert!(!runs_the_operator("kubectl scale --replicas=0"));
}

/// Every text file a reader of the repository gets: sources, tests, docs, chart, examples.
fn repository_texts() -> Vec<(PathBuf, String)> {
    fn walk(dir: &std::path::Path, out: &mut Vec<(PathBuf, String)>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| {
                ["rs", "md", "yaml", "yml", "toml", "sh", "json", "tpl", "proto"]
                    .contains(&e.to_string_lossy().as_ref())
            }) && let Ok(text) = std::fs::read_to_string(&path)
            {
                out.push((path, text));
            }
        }
    }
    let root = repo();
    let mut texts = Vec::new();
    for dir in
        ["src", "tests", "docs", "charts", "examples", "benches", "webhooks", "crds", "proto"]
    {
        walk(&root.join(dir), &mut texts);
    }
    for file in ["README.md", "Cargo.toml", "Makefile", "Dockerfile", "build.rs"] {
        if let Ok(text) = std::fs::read_to_string(root.join(file)) {
            texts.push((root.join(file), text));
        }
    }
    texts
}

/// A citation of a design document that is not in the repository: the notes, the seed and the
/// plan the project started from. A reader with only the repository cannot follow one.
fn outside_citations(text: &str) -> Vec<String> {
    // Built from parts, so this file does not cite what it looks for.
    let notes = ["NOTES", ".md"].concat();
    let patterns =
        [notes, ["seed", " §"].concat(), ["plan", " §"].concat(), ["seeds", "/"].concat()];
    let mut found: Vec<String> =
        patterns.iter().filter(|p| text.contains(p.as_str())).cloned().collect();
    let numbered = ["NOTES", " "].concat();
    for (at, _) in text.match_indices(&numbered) {
        if text[at + numbered.len()..].starts_with(|c: char| c.is_ascii_digit()) {
            found.push(text[at..(at + numbered.len() + 2).min(text.len())].to_owned());
        }
    }
    found
}

#[test]
fn nothing_cites_a_document_outside_the_repository() {
    let texts = repository_texts();
    assert!(texts.len() > 100, "the scan found only {} files", texts.len());
    let cited: Vec<String> = texts
        .iter()
        .flat_map(|(path, text)| {
            outside_citations(text).into_iter().map(move |c| format!("{}: {c}", path.display()))
        })
        .collect();
    assert!(cited.is_empty(), "cite docs/decisions.md instead: {cited:?}");
    assert_eq!(outside_citations(&["see ", "NOTES", " 13"].concat()).len(), 1);
    assert_eq!(outside_citations(&["plan", " §4.3"].concat()).len(), 1);
    assert!(outside_citations("docs/decisions.md, D5").is_empty());
}
