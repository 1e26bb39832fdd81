//! The shape of the house (the dependency rules in docs/architecture.md), checked on the source:
//! the built-in scaler and the simulator import nothing of the controllers, the caches import
//! nothing of the parts that read them, and no directory under `src/` holds modules that import
//! one another in a circle. A module's imports are the sibling modules its file (or, for a
//! directory module, its files) names through `super::` or `crate::<its directory>::` (tests and
//! doc links included).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

fn source_of(dir: &Path, file: &str) -> String {
    let path = dir.join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The sibling modules of `src/<dir>/` (files and directories with a `mod.rs`) each of them
/// names.
fn module_graph(dir: &str) -> Graph {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    let entries = std::fs::read_dir(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let modules: BTreeSet<String> = entries
        .map(|e| e.expect("directory entry").path())
        .filter_map(|entry| {
            let name = entry.file_name()?.to_string_lossy().into_owned();
            match name.strip_suffix(".rs") {
                Some(module) => (module != "mod").then(|| module.to_owned()),
                None => entry.join("mod.rs").is_file().then_some(name),
            }
        })
        .collect();
    let own_path = format!("crate::{}::", dir.replace('/', "::"));
    modules
        .iter()
        .map(|module| {
            let file = path.join(format!("{module}.rs"));
            let files = if file.is_file() { vec![file] } else { rust_files(&path.join(module)) };
            let source: String = files
                .iter()
                .map(|f| std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{f:?}: {e}")))
                .collect();
            let named = named_modules(&source, &own_path);
            let imports = modules.iter().filter(|m| *m != module && named.contains(*m)).cloned();
            (module.clone(), imports.collect())
        })
        .collect()
}

/// Every directory under `src/` that holds modules, as a path below `src/` (`controller/slot`).
fn module_directories() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut dirs: Vec<String> = rust_files(&src)
        .into_iter()
        .filter(|file| file.file_name().is_some_and(|n| n == "mod.rs"))
        .filter_map(|file| {
            let dir = file.parent()?.strip_prefix(&src).ok()?.to_string_lossy().into_owned();
            Some(dir)
        })
        .collect();
    dirs.sort();
    dirs
}

/// Every first path segment after `super::`, `super::super::` or `own_path`
/// (`crate::provider::`), including each one of a `super::{a::x, b}` group.
fn named_modules(source: &str, own_path: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for prefix in ["super::", own_path] {
        for (at, _) in source.match_indices(prefix) {
            let mut rest = &source[at + prefix.len()..];
            while let Some(deeper) = rest.strip_prefix("super::") {
                rest = deeper;
            }
            let segments = match rest.strip_prefix('{') {
                Some(group) => group[..group.find('}').unwrap_or(group.len())].split(',').collect(),
                None => vec![rest],
            };
            for segment in segments {
                let name: String = segment
                    .trim_start()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    named.insert(name);
                }
            }
        }
    }
    named
}

/// A cycle of the graph, as the modules along it, if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// The `.rs` files under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, &mut files);
    files
}

/// The files of `src/<dir>/` (recursively) that name `crate::<module>`.
fn files_naming(dir: &str, module: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    let files = rust_files(&root);
    let needle = format!("crate::{module}");
    files
        .into_iter()
        .filter(|path| {
            let source = std::fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            source.match_indices(&needle).any(|(at, _)| {
                // `crate::controller`, not `crate::controllers_of_something`
                !source[at + needle.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
            })
        })
        .map(|path| path.display().to_string())
        .collect()
}

#[test]
fn the_scaler_and_the_simulator_import_nothing_of_the_controllers() {
    for dir in ["scaler", "simulator"] {
        let files = files_naming(dir, "controller");
        assert!(
            files.is_empty(),
            "src/{dir} must act through the provider (or, for the simulator, on its own), not \
             through the controllers; these files import crate::controller: {files:?}"
        );
    }
}

#[test]
fn no_directory_under_src_holds_modules_that_import_each_other_in_a_circle() {
    let dirs = module_directories();
    for expected in ["provider", "scaler", "placement", "controller/slot", "tls"] {
        assert!(dirs.iter().any(|d| d == expected), "{expected} not among {dirs:?}");
    }
    let provider = module_graph("provider");
    assert!(provider.contains_key("slot_choice") && provider.contains_key("pricing"));
    assert!(module_graph("controller").contains_key("slot"), "directory modules are scanned");
    let circles: Vec<String> = dirs
        .iter()
        .filter_map(|dir| {
            find_cycle(&module_graph(dir)).map(|cycle| format!("src/{dir}: {}", cycle.join(" -> ")))
        })
        .collect();
    assert!(
        circles.is_empty(),
        "modules import one another in a circle; move what both need below them (a module of \
         its own, or crate::api for shared names):\n{}",
        circles.join("\n")
    );
}

/// The parts that read the caches, and those above them: `src/cache/` must name none of them.
const ABOVE_THE_CACHES: [&str; 7] =
    ["provider", "controller", "webhook", "operator", "grpc", "scaler", "simulator"];

#[test]
fn the_caches_import_nothing_of_their_readers() {
    for module in ABOVE_THE_CACHES {
        let files = files_naming("cache", module);
        assert!(
            files.is_empty(),
            "src/cache sits below the provider, the webhooks and the controllers, which all read \
             it; these files import crate::{module}: {files:?}"
        );
    }
    let graph = module_graph("cache");
    assert!(graph.contains_key("feed") && graph.contains_key("index"), "{graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        panic!("the caches' modules import one another in a circle: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_readers_reach_the_caches_through_the_one_module() {
    // No second stack of watches: the provider, the controllers and the webhooks name the
    // shared caches, and none of them starts a reflector of its own.
    for dir in ["provider", "controller", "webhook"] {
        assert!(!files_naming(dir, "cache").is_empty(), "src/{dir} does not read crate::cache");
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
        for file in rust_files(&root) {
            let source = std::fs::read_to_string(&file).expect("source");
            assert!(
                !source.contains("reflector::store(") && !source.contains("watcher("),
                "{} starts a watch of its own; read crate::cache instead",
                file.display()
            );
        }
    }
}

#[test]
fn the_scan_finds_imports_and_cycles() {
    let named = named_modules(
        "use super::error::E;\nuse super::{Caller, groups::G, slot_choice};\n\
         use super::super::template::tests::t;\nlet x = crate::provider::pricing::f();",
        "crate::provider::",
    );
    for module in ["error", "Caller", "groups", "slot_choice", "template", "pricing"] {
        assert!(named.contains(module), "{module} not found in {named:?}");
    }
    let nested =
        named_modules("use crate::controller::slot::drain::D;", "crate::controller::slot::");
    assert!(nested.contains("drain"), "{nested:?}");

    let graph = |edges: &[(&str, &str)]| {
        let mut g = Graph::new();
        for (from, to) in edges {
            g.entry(from.to_string()).or_default().insert(to.to_string());
            g.entry(to.to_string()).or_default();
        }
        g
    };
    let circle = graph(&[("pricing", "template"), ("template", "choice"), ("choice", "pricing")]);
    let cycle = find_cycle(&circle).expect("the circle is found");
    assert_eq!(cycle.first(), cycle.last(), "{cycle:?}");
    assert_eq!(cycle.len(), 4, "{cycle:?}");
    let tree = graph(&[("pricing", "template"), ("template", "choice"), ("pricing", "choice")]);
    assert_eq!(find_cycle(&tree), None);
}

#[test]
fn the_pure_model_records_no_telemetry() {
    // Metrics are recorded by the parts that act (controllers, webhooks, the gRPC server, the
    // scaler's loop); the model they consult stays free of them.
    for dir in ["api", "phase", "claim"] {
        let files = files_naming(dir, "telemetry");
        assert!(files.is_empty(), "src/{dir} is pure and must not record metrics: {files:?}");
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for file in ["savings.rs", "scaler/decide.rs", "scaler/demand.rs", "scaler/target.rs"] {
        let source = source_of(&root, file);
        assert!(
            !source.contains("crate::telemetry"),
            "src/{file} is pure and must not record metrics"
        );
    }
}

/// Every `.rs` file under `src/<path>` (a directory, recursively, or one file), with the code it
/// ships: the source before its `#[cfg(test)]` module, without comment lines.
fn shipped_sources(path: &str) -> Vec<(String, String)> {
    fn walk(path: &Path, out: &mut Vec<std::path::PathBuf>) {
        if path.is_file() {
            out.push(path.to_owned());
            return;
        }
        let entries = std::fs::read_dir(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() || path.extension().is_some_and(|e| e == "rs") {
                walk(&path, out);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&root.join(path), &mut files);
    assert!(!files.is_empty(), "src/{path} has no source");
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let source = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
            let shipped: String = source
                .split("#[cfg(test)]")
                .next()
                .unwrap_or_default()
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            let name = file.strip_prefix(&root).unwrap_or(&file).display().to_string();
            (name, shipped)
        })
        .collect()
}

/// The files under each of `paths` whose shipped source contains any of `needles`, with the
/// needle found.
fn offenders(paths: &[&str], needles: &[&str]) -> Vec<String> {
    paths
        .iter()
        .flat_map(|path| shipped_sources(path))
        .filter_map(|(file, source)| {
            needles.iter().find(|n| source.contains(**n)).map(|n| format!("src/{file}: {n}"))
        })
        .collect()
}

/// The pure model: decisions made on data alone, with table tests and no cluster.
const PURE: &[&str] = &[
    "phase",
    "claim",
    "schedule",
    "machine.rs",
    "job_outcome.rs",
    "node_declaration",
    "savings.rs",
    "scaler/demand.rs",
    "scaler/target.rs",
    "scaler/decide.rs",
    "scaler/pool_view.rs",
    "controller/schedule/plan.rs",
];

#[test]
fn the_api_types_import_nothing_else_of_this_crate() {
    let found: Vec<String> = shipped_sources("api")
        .into_iter()
        .filter(|(_, source)| {
            source.match_indices("crate::").any(|(at, _)| !source[at..].starts_with("crate::api"))
        })
        .map(|(file, _)| file)
        .collect();
    assert!(found.is_empty(), "src/api must import nothing else of this crate: {found:?}");
}

#[test]
fn the_pure_model_performs_no_io_and_holds_no_client() {
    let found = offenders(
        PURE,
        &[
            ".await",
            "kube::Client",
            "Api<",
            "tokio::",
            "reqwest",
            "std::fs",
            "std::net",
            "crate::controller::",
            "crate::provider",
            "crate::webhook",
            "crate::operator",
            "crate::grpc",
            "crate::telemetry",
        ],
    );
    assert!(found.is_empty(), "the pure model must not reach the world: {found:?}");
}

#[test]
fn admission_only_reads_and_judges() {
    let found = offenders(
        &["webhook"],
        &[".create(", ".patch(", ".patch_status(", ".replace(", ".delete(", "FieldManager"],
    );
    assert!(found.is_empty(), "admission writes nothing; it answers with a verdict: {found:?}");
}

#[test]
fn the_grpc_layer_only_translates() {
    let found = offenders(
        &["grpc"],
        &["crate::controller", "crate::scaler", "crate::webhook", "Api<", "kube::Client"],
    );
    assert!(
        found.is_empty(),
        "src/grpc carries provider calls over the wire and holds no rules or reads: {found:?}"
    );
}

#[test]
fn only_the_chokepoint_writes_a_claim_phase() {
    let found: Vec<String> = offenders(&[""], &["\"phase\":"])
        .into_iter()
        .filter(|f| !f.starts_with("src/controller/claim/chokepoint.rs"))
        .collect();
    assert!(
        found.is_empty(),
        "a claim's phase is written only by src/controller/claim/chokepoint.rs: {found:?}"
    );
}

#[test]
fn each_writer_writes_under_its_own_field_manager_from_its_own_module() {
    // Which field manager each part of the operator may write under: `managedFields` then
    // names the part of the code that set a field.
    let owners: &[(&str, &[&str])] = &[
        ("ClaimController", &["controller/claim/"]),
        ("SlotController", &["controller/slot/"]),
        ("GroupController", &["controller/group.rs"]),
        ("ScheduleController", &["controller/schedule/"]),
        ("Scaler", &["scaler/"]),
        ("Provider", &["provider/"]),
        ("Cli", &["pin_cli.rs", "power/"]),
        ("Simulator", &["simulator/"]),
        ("Certificates", &["tls/", "operator/"]),
    ];
    let mut misplaced = Vec::new();
    for (file, source) in shipped_sources("") {
        if file == "field_manager.rs" {
            continue;
        }
        for (writer, places) in owners {
            let used = source.match_indices(&format!("FieldManager::{writer}")).any(|(at, n)| {
                let rest = &source[at + n.len()..];
                !rest.starts_with(|c: char| c.is_alphanumeric())
            });
            if used && !places.iter().any(|p| file.starts_with(p)) {
                misplaced.push(format!("src/{file} writes as {writer}"));
            }
        }
    }
    assert!(misplaced.is_empty(), "{misplaced:?}");
}

#[test]
fn metric_names_live_in_the_telemetry_module() {
    let found: Vec<String> = offenders(&[""], &["\"homelab_autoscaler_"])
        .into_iter()
        .filter(|f| !f.starts_with("src/telemetry/"))
        .collect();
    assert!(found.is_empty(), "name metrics in src/telemetry/metrics.rs: {found:?}");
}
