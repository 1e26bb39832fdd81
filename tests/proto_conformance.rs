//! proto/externalgrpc.proto is cluster-autoscaler's released wire contract, field for field:
//! compiled with protox next to every upstream release in the shared folder, it must agree with
//! each on everything both define, define everything the newest release defines, and use no
//! field number, enum value or RPC that neither the newest release nor the last Kubernetes-typed
//! one (whose legacy fields it still serves) defines the same way. A proposal that upstream has
//! not released cannot be caught by comparison (upstream does not define its number), so that
//! last rule is what catches it. The upstream folder is required: without it the test fails.

#[path = "proto_conformance/compare.rs"]
mod compare;
#[path = "proto_conformance/load.rs"]
mod load;

use load::{Contract, LEGACY, LoadError, NEWEST};

#[test]
fn our_contract_is_upstreams() {
    let dir = load::upstream_dir();
    let upstream = load::upstream(&dir).unwrap_or_else(|e| panic!("{e}"));
    let ours = load::ours().unwrap_or_else(|e| panic!("{e}"));

    let mut findings = Vec::new();
    for theirs in upstream.values() {
        findings.extend(compare::disagreements(&ours, theirs));
    }
    findings.extend(compare::missing(&ours, &upstream[NEWEST]));
    findings.extend(compare::private(&ours, &[&upstream[NEWEST], &upstream[LEGACY]]));
    assert!(
        findings.is_empty(),
        "proto/externalgrpc.proto departs from upstream's contract ({} compared, from {}):\n  {}",
        upstream.keys().cloned().collect::<Vec<_>>().join(", "),
        dir.display(),
        findings.join("\n  ")
    );
}

#[test]
fn a_missing_upstream_folder_fails_and_says_what_to_do() {
    let nowhere = tempfile::tempdir().expect("tempdir").path().join("no-such-folder");
    let error = load::upstream(&nowhere).err().expect("an error, never a skip");
    assert!(matches!(error, LoadError::NoUpstreamDir { .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains(&nowhere.display().to_string()), "{message}");
    assert!(message.contains(load::UPSTREAM_PROTOS_VAR), "{message}");

    let empty = tempfile::tempdir().expect("tempdir");
    let error = load::upstream(empty.path()).err().expect("an error, never a skip");
    assert!(
        matches!(error, LoadError::MissingRelease { version, .. } if version == NEWEST),
        "{error}"
    );
}

const HEADER: &str = r#"syntax = "proto3";
package clusterautoscaler.cloudprovider.v1.externalgrpc;
import "google/protobuf/timestamp.proto";
"#;

fn contract(label: &str, body: &str) -> Contract {
    load::compile(label, &format!("{HEADER}{body}")).unwrap_or_else(|e| panic!("{e}"))
}

/// A contract that imports the Kubernetes types, as releases up to 1.34 did.
fn legacy_contract(body: &str) -> Contract {
    let source = format!(
        "{HEADER}import \"k8s.io/api/core/v1/generated.proto\";\n\
         import \"k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto\";\n{body}"
    );
    load::compile("legacy", &source).unwrap_or_else(|e| panic!("{e}"))
}

const BASE: &str = r#"
message Instance { string id = 1; InstanceStatus status = 2; }
message InstanceStatus {
  enum InstanceState { unspecified = 0; instanceRunning = 1; }
  InstanceState instanceState = 1;
}
message NodeGroupsRequest {}
message NodeGroupsResponse { repeated string ids = 1; map<string, string> debug = 2; }
service CloudProvider { rpc NodeGroups(NodeGroupsRequest) returns (NodeGroupsResponse) {} }
"#;

/// The comparison itself: each changed copy of `BASE` must be found, and only what changed.
#[test]
fn disagreements_are_found() {
    let table: &[(&str, &str, &str)] = &[
        ("identical", BASE, ""),
        (
            "a field's type",
            &BASE.replace("string id = 1", "int64 id = 1"),
            "Instance.id = 1: type int64 here, string there",
        ),
        (
            "a field's name",
            &BASE.replace("string id = 1", "string name = 1"),
            "Instance.id = 1: named name here",
        ),
        (
            "a field's label",
            &BASE.replace("repeated string ids = 1", "string ids = 1"),
            "NodeGroupsResponse.ids = 1: singular here, repeated there",
        ),
        (
            "a map's value type",
            &BASE.replace("map<string, string> debug", "map<string, int32> debug"),
            "NodeGroupsResponse.debug = 2: type",
        ),
        (
            "a field's number",
            &BASE.replace("InstanceStatus status = 2", "InstanceStatus status = 3"),
            "Instance.status: number 3 here, 2 there",
        ),
        (
            "an enum value's name",
            &BASE.replace("instanceRunning = 1", "running = 1"),
            "enum InstanceState: 1 is running here, instanceRunning there",
        ),
        (
            "an RPC's response",
            &BASE.replace("returns (NodeGroupsResponse)", "returns (NodeGroupsRequest)"),
            "rpc NodeGroups: (clusterautoscaler.cloudprovider.v1.externalgrpc.NodeGroupsRequest) \
             returns (clusterautoscaler.cloudprovider.v1.externalgrpc.NodeGroupsRequest) here",
        ),
    ];
    let theirs = contract("theirs", BASE);
    for (name, body, want) in table {
        let found = compare::disagreements(&contract("ours", body), &theirs);
        if want.is_empty() {
            assert!(found.is_empty(), "{name}: {found:#?}");
        } else {
            assert_eq!(found.len(), 1, "{name}: {found:#?}");
            assert!(found[0].contains(want), "{name}: {:?} lacks {want:?}", found[0]);
        }
    }
}

/// Legacy fields are compared by their layout on the wire, not by the names of their types.
#[test]
fn legacy_layouts_are_compared_on_the_wire() {
    let theirs = legacy_contract(
        r#"message Options {
             k8s.io.apimachinery.pkg.apis.meta.v1.Duration unneeded = 3;
             k8s.io.apimachinery.pkg.apis.meta.v1.Time start = 4;
             k8s.io.api.core.v1.Node node = 5;
           }"#,
    );
    let table: &[(&str, &str, &str)] = &[
        (
            "the same layouts under our names, a Node as bytes",
            "message LegacyDuration { int64 duration = 1; }
             message Options { LegacyDuration unneeded = 3; google.protobuf.Timestamp start = 4;
                               bytes node = 5; }",
            "",
        ),
        (
            "a duration in another layout",
            "message LegacyDuration { int32 duration = 1; }
             message Options { LegacyDuration unneeded = 3; google.protobuf.Timestamp start = 4;
                               bytes node = 5; }",
            "Options.unneeded = 3: type clusterautoscaler.cloudprovider.v1.externalgrpc.LegacyDuration \
             here, k8s.io.apimachinery.pkg.apis.meta.v1.Duration there: field duration",
        ),
        (
            "google's Duration is not meta/v1's",
            "import \"google/protobuf/duration.proto\";
             message Options { google.protobuf.Duration unneeded = 3;
                               google.protobuf.Timestamp start = 4; bytes node = 5; }",
            "Options.unneeded = 3: type google.protobuf.Duration here",
        ),
        (
            "a string where a Node was",
            "message Options { google.protobuf.Timestamp start = 4; string node = 5; }",
            "Options.node = 5: type string here, k8s.io.api.core.v1.Node there",
        ),
    ];
    for (name, body, want) in table {
        let found = compare::disagreements(&contract("ours", body), &theirs);
        if want.is_empty() {
            assert!(found.is_empty(), "{name}: {found:#?}");
        } else {
            assert_eq!(found.len(), 1, "{name}: {found:#?}");
            assert!(found[0].contains(want), "{name}: {:?} lacks {want:?}", found[0]);
        }
    }
}

/// A number upstream never assigned is ours alone, whatever it means; so is a message that
/// stands for no upstream type.
#[test]
fn private_numbers_and_missing_definitions_are_found() {
    let newest = contract("newest", BASE);
    let legacy = legacy_contract(
        "message Instance { string id = 1; k8s.io.apimachinery.pkg.apis.meta.v1.Time at = 4; }",
    );
    let table: &[(&str, String, &[&str])] = &[
        ("upstream's own", BASE.to_owned(), &[]),
        (
            "a legacy field, upstream's in the legacy release",
            BASE.replace("string id = 1;", "string id = 1; google.protobuf.Timestamp at = 4;"),
            &[],
        ),
        (
            "a proposed field 11",
            BASE.replace("string id = 1;", "string id = 1; bool proposal = 11;"),
            &["Instance.proposal = 11 is defined by none of newest, legacy"],
        ),
        (
            "a legacy number with another meaning",
            BASE.replace("string id = 1;", "string id = 1; string at = 4;"),
            &["Instance.at = 4 is defined otherwise upstream (legacy: type string here, k8s.io.apimachinery.pkg.apis.meta.v1.Time there)"],
        ),
        (
            "an enum value of our own",
            BASE.replace("instanceRunning = 1;", "instanceRunning = 1; instanceFailed = 9;"),
            &["InstanceState.instanceFailed = 9 is defined by none of newest, legacy"],
        ),
        (
            "an RPC of our own",
            BASE.replace(
                "returns (NodeGroupsResponse) {}",
                "returns (NodeGroupsResponse) {} rpc Mine(NodeGroupsRequest) returns (NodeGroupsRequest) {}",
            ),
            &["rpc Mine is defined by none of newest, legacy"],
        ),
        (
            "a message of our own",
            format!("{BASE} message Mine {{ int32 x = 1; }}"),
            &["message Mine is not upstream's"],
        ),
    ];
    for (name, body, want) in table {
        let found = compare::private(&contract("ours", body), &[&newest, &legacy]);
        assert_eq!(found.len(), want.len(), "{name}: {found:#?}");
        for (got, want) in found.iter().zip(want.iter()) {
            assert!(got.contains(want), "{name}: {got:?} lacks {want:?}");
        }
    }

    let without_status = BASE.replace("InstanceStatus status = 2;", "");
    let found = compare::missing(&contract("ours", &without_status), &newest);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].contains("ours lacks Instance.status = 2"), "{found:?}");
}
