//! Finding and compiling the contracts: ours (`proto/externalgrpc.proto`) and upstream's
//! released ones (`externalgrpc-<version>.proto` in the shared upstream folder).
//!
//! Upstream 1.34.1 and older import Kubernetes' own `generated.proto` files, which are not in the
//! shared folder. They are stood in for by stubs that declare the messages that contract uses:
//! meta/v1 `Time` and `Duration` with their real field layout (the layout is what the
//! comparison checks our `Timestamp` and `LegacyDuration` against), and core/v1 `Node` and `Pod`
//! as opaque messages, which our contract carries as their encoded bytes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};
use protox::prost_reflect::DescriptorPool;

/// The variable that points the test at another folder of upstream protos.
pub const UPSTREAM_PROTOS_VAR: &str = "HOMELAB_UPSTREAM_PROTOS";
/// The release whose contract ours is, field for field.
pub const NEWEST: &str = "1.36.1";
/// The last release with the Kubernetes-typed fields that ours still declares.
pub const LEGACY: &str = "1.34.1";

/// A stand-in for a Kubernetes `generated.proto`: its import path, its package, and its
/// messages, each with its fields in proto2 syntax or `None` for an opaque message.
struct Stub {
    import: &'static str,
    package: &'static str,
    messages: &'static [(&'static str, Option<&'static str>)],
}

/// The layouts are those of k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto (also in the
/// `k8s-pb` crate's `apimachinery::pkg::apis::meta::v1::{Time, Duration}`).
const STUBS: &[Stub] = &[
    Stub {
        import: "k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto",
        package: "k8s.io.apimachinery.pkg.apis.meta.v1",
        messages: &[
            ("Time", Some("optional int64 seconds = 1; optional int32 nanos = 2;")),
            ("Duration", Some("optional int64 duration = 1;")),
        ],
    },
    Stub {
        import: "k8s.io/api/core/v1/generated.proto",
        package: "k8s.io.api.core.v1",
        messages: &[("Node", None), ("Pod", None)],
    },
];

/// The name the contract under test is compiled as.
const CONTRACT_FILE: &str = "externalgrpc.proto";

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "the upstream protos folder {dir} cannot be read ({source}). It holds cluster-autoscaler's \
         released contracts (externalgrpc-<version>.proto) and is expected at \
         ../shared/upstream/cluster-autoscaler/protos beside the repository; set \
         {UPSTREAM_PROTOS_VAR} to another folder that holds them. This test never skips."
    )]
    NoUpstreamDir { dir: PathBuf, source: std::io::Error },

    #[error(
        "the upstream protos folder {dir} has no externalgrpc-{version}.proto, which this test \
         compares against (found: {found:?})"
    )]
    MissingRelease { dir: PathBuf, version: &'static str, found: Vec<String> },

    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },

    #[error("compiling {label}: {source}")]
    Compile { label: String, source: Box<protox::Error> },
}

/// One compiled contract.
pub struct Contract {
    /// What it is, in messages: `ours` or `upstream 1.36.1`.
    pub label: String,
    pub pool: DescriptorPool,
    /// Full names of the Kubernetes messages it embeds whose encoding travels opaque.
    pub opaque: BTreeSet<String>,
}

/// Where the upstream protos are: the variable, else `../shared/...` beside the repository.
pub fn upstream_dir() -> PathBuf {
    match std::env::var_os(UPSTREAM_PROTOS_VAR) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/upstream/cluster-autoscaler/protos"),
    }
}

/// Every `externalgrpc-<version>.proto` of `dir`, by version; [`NEWEST`] and [`LEGACY`] must be
/// among them.
pub fn upstream_files(dir: &Path) -> Result<BTreeMap<String, PathBuf>, LoadError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|source| LoadError::NoUpstreamDir { dir: dir.to_owned(), source })?;
    let mut files = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(|source| LoadError::Read { path: dir.to_owned(), source })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(version) =
            name.strip_prefix("externalgrpc-").and_then(|rest| rest.strip_suffix(".proto"))
        {
            files.insert(version.to_owned(), entry.path());
        }
    }
    for version in [NEWEST, LEGACY] {
        if !files.contains_key(version) {
            return Err(LoadError::MissingRelease {
                dir: dir.to_owned(),
                version,
                found: files.keys().cloned().collect(),
            });
        }
    }
    Ok(files)
}

/// Every upstream release in `dir`, compiled, by version.
pub fn upstream(dir: &Path) -> Result<BTreeMap<String, Contract>, LoadError> {
    upstream_files(dir)?
        .into_iter()
        .map(|(version, path)| {
            let source = read(&path)?;
            Ok((version.clone(), compile(&format!("upstream {version}"), &source)?))
        })
        .collect()
}

/// Our contract, compiled.
pub fn ours() -> Result<Contract, LoadError> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/externalgrpc.proto");
    compile("ours", &read(&path)?)
}

fn read(path: &Path) -> Result<String, LoadError> {
    std::fs::read_to_string(path)
        .map_err(|source| LoadError::Read { path: path.to_owned(), source })
}

/// Compiles a contract from its source, with the Kubernetes stubs it imports.
pub fn compile(label: &str, source: &str) -> Result<Contract, LoadError> {
    let compile_error = |source: protox::Error| LoadError::Compile {
        label: label.to_owned(),
        source: source.into(),
    };
    let mut files = Sources::default();
    files.0.insert(CONTRACT_FILE.to_owned(), source.to_owned());
    let mut opaque = BTreeSet::new();
    for stub in STUBS.iter().filter(|s| source.contains(&format!("import \"{}\"", s.import))) {
        files.0.insert(stub.import.to_owned(), stub_source(stub));
        for (name, layout) in stub.messages {
            if layout.is_none() {
                opaque.insert(format!("{}.{name}", stub.package));
            }
        }
    }
    let mut resolver = ChainFileResolver::new();
    resolver.add(files);
    resolver.add(GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.open_file(CONTRACT_FILE).map_err(compile_error)?;
    Ok(Contract { label: label.to_owned(), pool: compiler.descriptor_pool(), opaque })
}

fn stub_source(stub: &Stub) -> String {
    let mut out = format!("syntax = \"proto2\";\npackage {};\n", stub.package);
    for (name, layout) in stub.messages {
        out.push_str(&format!("message {name} {{ {} }}\n", layout.unwrap_or_default()));
    }
    out
}

/// Files served from memory, by import name.
#[derive(Default)]
struct Sources(BTreeMap<String, String>);

impl FileResolver for Sources {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        match self.0.get(name) {
            Some(source) => File::from_source(name, source),
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}
